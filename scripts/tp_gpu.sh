#!/usr/bin/env bash
# Tensor parallelism (docs/TP.md) on a multi-GPU host (nvidia-h200-x2/-x4/-x8), in one call: the TP GPU tests, then the
# 8B random bf16 runs at TP = 1, 2 (4, 8 where the host has them): bits across sizes and modes, throughput, batch-1
# latency, the all-reduce routes alone. Results (tp.json, tp.png, logs) under $OUT. NVLink multicast stays off (the
# template's NCCL_NVLS_ENABLE=0). Usage: bash scripts/tp_gpu.sh [tests] [bench] [quick]
set -uo pipefail
. scripts/device_env.sh || exit 1
OUT=${OUT:-out}
mkdir -p "$OUT"
eval "$(python3 -m samebits env --shell)"
export NCCL_NVLS_ENABLE=0
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
sizes=$(python3 -c "print(','.join(str(t) for t in (1, 2, 4, 8) if t <= $gpus))")
steps=${*:-tests bench}
for step in $steps; do
  echo "=== $step ($(date +%T), $gpus GPUs, TP $sizes)"
  case $step in
    tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests/distributed 2>&1 | tee "$OUT/tp_gpu_tests.log" | tail -20 ;;
    bench) python3 -m samebits.benchmarks.tp --device cuda --shape 8b --tp "$sizes" --requests 64 --collectives \
             --out "$OUT" 2>&1 | tee "$OUT/tp_bench.log" | tail -40 ;;
    quick) python3 -m samebits.benchmarks.tp --device cuda --shape 1b --tp "$sizes" --requests 16 --output 8,32 \
             --modes invariant,deterministic,fast --out "$OUT/quick" 2>&1 | tee "$OUT/tp_quick.log" | tail -40 ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
