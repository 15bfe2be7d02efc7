#!/usr/bin/env bash
# The CPU proof on another machine's CPU (e.g. the GPU machine's Intel host; image python, scripts/device_env.sh,
# carried wheels), CUDA hidden. Usage: bash scripts/cpu_proof.sh [suite|route|known|demo ...]; results under $OUT.
# CORES (default 2, as CI) pins the run to that many cores and threads; MARK selects the suite (default "not gpu").
set -uo pipefail
. scripts/device_env.sh || exit 1
export CUDA_VISIBLE_DEVICES=
OUT=${OUT:-out}
CORES=${CORES:-2}
mkdir -p "$OUT"
export OMP_NUM_THREADS=$CORES
pin="taskset -c 0-$((CORES - 1))"
grep -m1 'model name' /proc/cpuinfo
python3 -c "import torch; from samebits.kernels.cpu import mkl; print(torch.__version__, torch.backends.cpu.get_cpu_capability(), 'MKL CNR entry points:', mkl.available())"
steps=${*:-suite route}
for step in $steps; do
  echo "=== $step ($(date +%T), $CORES cores)"
  case $step in
    suite) $pin python3 -m pytest -q -m "${MARK:-not gpu}" -p no:cacheprovider --timeout=900 tests 2>&1 | tee "$OUT/cpu_suite.$CORES.log" | tail -25 ;;
    route) $pin python3 -m samebits.benchmarks.cpu_route --out "$OUT" --label "intel.$CORES" ;;
    known) $pin python3 -m pytest -q -p no:cacheprovider tests/models/test_known_answer.py 2>&1 | tail -5 ;;
    demo) $pin python3 -m samebits.benchmarks.cpu_route --out "$OUT" --label "intel-demo.$CORES" --demo ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
