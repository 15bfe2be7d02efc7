#!/usr/bin/env bash
# The GPU proof in one call (device machine: image python, PYTHONPATH=., no install except carried wheels).
# Usage: bash scripts/gpu_proof.sh [tests|probe|kernels|attention|e2e|server ...]; results under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=.:/tmp/site
fi
eval "$(python3 -m samebits env --shell)"
steps=${*:-tests probe kernels attention e2e}
for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    tests) make test-gpu PYTEST_ARGS="-p no:cacheprovider" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    probe) python3 -m samebits probe --device cuda --full --json "$OUT/probe.h200.json" --plot "$OUT/probe.h200.png" ;;
    kernels) python3 benchmarks/kernels.py --out "$OUT" ;;
    attention) python3 benchmarks/attention.py --out "$OUT" ;;
    e2e) python3 benchmarks/e2e.py --out "$OUT" ;;
    e2e-quick) python3 benchmarks/e2e.py --out "$OUT" --quick --requests 64 --skip-hf ;;
    server) python3 benchmarks/server.py --out "$OUT" ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
