#!/usr/bin/env bash
# The GPU proof in one call (device machine: image python, samebits and carried wheels by scripts/device_env.sh).
# Usage: bash scripts/gpu_proof.sh [tests|tests-kernels|tests-others|tests-ids|probe|kernels|attention|variants|variants-prefill|e2e|server|server-process|steps|steps-tile|steps-norm|steps-gluon|mixed|rl|tp1|
#   tests-fp8-kernels|tests-fp8-models|tests-structured|tests-train|tests-spec|spec-quick|spec|fp8|fp8-sweep|e2e-fp8|steps-fp8|moe-tests|e2e-qwen3moe|e2e-mixtral|fairness ...];
# results under $OUT. With no step named it runs tests probe kernels attention e2e (~25 min): name the steps.
# tests-kernels and tests-others are the two halves of tests, each under one call's 10 minutes with a cold Triton cache.
# tests-ids runs the GPU tests named in scripts/_gpu_test_ids.txt (untracked, it travels: a run's tail after a time limit).
# variants needs scripts/_attention_before.py (untracked, it travels): git show main:samebits/kernels/triton/attention.py;
# VARIANTS_ONLY=prefill,... picks the probe's parts, VARIANTS_ROUNDS=3 times each case three times, VARIANTS_COLD=1
# times decode again with its KV read from HBM.
# E2E_ARGS (e.g. --skip-hf) go to the e2e step. steps-tile: STEPS_TILE="OLD_ROW NEW_ROW", steps-norm and steps-gluon: STEPS_BATCHES (scripts/steps_ab.py).
set -uo pipefail
. scripts/device_env.sh || exit 1
OUT=${OUT:-out}
mkdir -p "$OUT"
eval "$(python3 -m samebits env --shell)"
# Triton's compiled kernels from an earlier call, if carried (cp the last call's $OUT/triton-cache.tgz.* into
# .triton-cache/, which .git/info/exclude ignores, and name .triton-cache in carry): its keys hash each kernel's source,
# options and compiler, so a changed kernel compiles afresh and nothing stale is used. Saved again at the end, in
# 15 MiB parts (a file back from $OUT may hold 16 MiB), at most 3 of them.
export TRITON_CACHE_DIR=/tmp/triton-cache
mkdir -p "$TRITON_CACHE_DIR"
ls .triton-cache/triton-cache.tgz.* >/dev/null 2>&1 && cat .triton-cache/triton-cache.tgz.* | tar -xz -C "$TRITON_CACHE_DIR"
save_cache() {
  rm -f "$OUT"/triton-cache.tgz.*
  tar -cz -C "$TRITON_CACHE_DIR" . 2>/dev/null | split -b 15M -d -a 2 - "$OUT/triton-cache.tgz."
  local parts; parts=$(ls "$OUT"/triton-cache.tgz.* 2>/dev/null | wc -l)
  echo "triton cache: $parts part(s) of at most 15 MiB"
  [ "$parts" -le 3 ] || { echo "triton cache over 45 MiB: not kept"; rm -f "$OUT"/triton-cache.tgz.*; }
}
trap save_cache EXIT
# samebits check against our own server on the 8B random shape; the report lands in $OUT/check.h200.MODE.*
check_endpoint() {
  python3 -m samebits.benchmarks.serve_random --random-shape 8b --mode "$1" --port 8000 > "$OUT/serve.$1.log" 2>&1 &
  local pid=$!
  for _ in $(seq 180); do curl -sf http://127.0.0.1:8000/health >/dev/null && break; sleep 1; done
  python3 -m samebits.check http://127.0.0.1:8000 --model bench --concurrency 1,4,16,64,128 \
    --trials 3 --max-tokens 32 --json "$OUT/check.h200.$1.json" --html "$OUT/check.h200.$1.html"
  echo "check $1 exit $?"
  kill "$pid"; wait "$pid" 2>/dev/null
}
steps=${*:-tests probe kernels attention e2e}
for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    tests) make test-gpu PYTEST_ARGS="-p no:cacheprovider --durations=20" 2>&1 | tee "$OUT/gpu_tests.log" | tail -60 ;;
    tests-kernels) make test-gpu PYTEST_ARGS="-p no:cacheprovider --durations=20 --ignore=tests/engine --ignore=tests/server \
      --ignore=tests/probe --ignore=tests/check --ignore=tests/lint --ignore=tests/bench --ignore=tests/models --ignore=tests/rl --ignore=tests/distributed" 2>&1 \
      | tee "$OUT/gpu_tests_kernels.log" | tail -40 ;;
    tests-others) make test-gpu PYTEST_ARGS="-p no:cacheprovider --durations=20 --ignore=tests/kernels" 2>&1 \
      | tee "$OUT/gpu_tests_others.log" | tail -40 ;;
    tests-fp8-kernels) python3 -m pytest -q -p no:cacheprovider -m gpu --durations=20 tests/kernels/test_vendor_fp8.py \
      tests/kernels/triton/test_fp8_gpu.py 2>&1 | tee "$OUT/gpu_tests_fp8_kernels.log" | tail -40 ;;
    tests-fp8-models) python3 -m pytest -q -p no:cacheprovider -m gpu --durations=20 tests/models/test_fp8.py \
      tests/engine/test_fp8_invariance.py 2>&1 | tee "$OUT/gpu_tests_fp8_models.log" | tail -40 ;;
    tests-structured) python3 -m pytest -q -p no:cacheprovider -m gpu --durations=10 tests/structured 2>&1 \
      | tee "$OUT/gpu_tests_structured.log" | tail -40 ;;
    tests-train) python3 -m pytest -q -p no:cacheprovider -m gpu --durations=20 tests/rl tests/kernels/triton/test_grads.py \
      tests/kernels/triton/test_attention_bwd_gpu.py 2>&1 | tee "$OUT/gpu_tests_train.log" | tail -40 ;;
    tests-spec) python3 -m pytest -q -p no:cacheprovider -m gpu --durations=10 tests/engine/spec_decode \
      tests/kernels/triton/test_attention_gpu.py -k "spec_decode or verify" 2>&1 | tee "$OUT/gpu_tests_spec.log" | tail -40 ;;
    tests-ids) python3 -m pytest -q -p no:cacheprovider --durations=10 $(cat scripts/_gpu_test_ids.txt) 2>&1 \
      | tee "$OUT/gpu_tests_ids.log" | tail -40 ;;
    probe) python3 -m samebits probe --device cuda --full --json "$OUT/probe.h200.json" --plot "$OUT/probe.h200.png" ;;
    kernels) python3 -m samebits.benchmarks.kernels --out "$OUT" ;;
    attention) python3 -m samebits.benchmarks.attention --out "$OUT" ;;
    variants) python3 scripts/attention_variants_probe.py "$OUT" scripts/_attention_before.py ${VARIANTS_ONLY:+--only "$VARIANTS_ONLY"} \
      ${VARIANTS_ROUNDS:+--rounds "$VARIANTS_ROUNDS"} ${VARIANTS_COLD:+--cold} ;;
    variants-prefill) python3 scripts/attention_variants_probe.py "$OUT" scripts/_attention_before.py --only prefill,family ;;
    e2e) python3 -m samebits.benchmarks.e2e --out "$OUT" --warm ${E2E_ARGS:-} ;;
    e2e-fp8) python3 -m samebits.benchmarks.e2e --out "$OUT" --warm --skip-hf --modes deterministic/dynamic,fast/dynamic \
      --quantization none,fp8 ;;
    fp8) python3 -m samebits.benchmarks.fp8 --out "$OUT" ;;
    fp8-sweep) python3 -m samebits.benchmarks.fp8 --out "$OUT/sweep" --quick --sweep ;;
    spec-quick) python3 -m samebits.benchmarks.spec --out "$OUT/spec-quick" --quick ;;
    spec) python3 -m samebits.benchmarks.spec --out "$OUT/spec" ;;
    steps-fp8) python3 -m samebits.benchmarks.steps --out "$OUT" --batches 1,64,256 --quantization fp8 ;;
    e2e-quick) python3 -m samebits.benchmarks.e2e --out "$OUT" --quick --requests 64 --skip-hf ;;
    moe-tests) python3 -m pytest -q -p no:cacheprovider -p no:randomly --durations=20 tests/kernels/triton/test_moe_gpu.py \
      tests/kernels/triton/test_moe.py tests/engine/test_moe.py 2>&1 | tee "$OUT/gpu_tests_moe.log" | tail -40 ;;
    e2e-qwen3moe) python3 -m samebits.benchmarks.e2e --out "$OUT/qwen3moe" --shape qwen3-30b-a3b --quick --requests 64 \
      --modes fast/dynamic,deterministic/dynamic ${E2E_ARGS:-} ;;
    e2e-mixtral) python3 -m samebits.benchmarks.e2e --out "$OUT/mixtral" --shape mixtral-8x7b --quick --requests 64 \
      --modes fast/dynamic,deterministic/dynamic ${E2E_ARGS:-} ;;
    server) python3 -m samebits.benchmarks.server --random-shape 8b --solo-budget-s 60 --out "$OUT" ;;
    server-process) python3 -m samebits.benchmarks.server --random-shape 8b --solo-budget-s 30 --engine-process --skip-offline \
      --out "$OUT/process" ;;
    steps) python3 -m samebits.benchmarks.steps --out "$OUT" ;;
    steps256) python3 -m samebits.benchmarks.steps --out "$OUT" --batches 256 ;;
    steps-tile) timeout 420 python3 scripts/steps_ab.py "$OUT" tile ${STEPS_TILE:?old and new matmul rows} ;;
    steps-norm) timeout 480 python3 scripts/steps_ab.py "$OUT" norm --batches "${STEPS_BATCHES:-1,64}" ;;
    steps-gluon) timeout 480 python3 scripts/steps_ab.py "$OUT" gluon --batches "${STEPS_BATCHES:-1}" ;;
    steps1) python3 -m samebits.benchmarks.steps --out "$OUT" --batches 1 ;;
    mixed) python3 -m samebits.benchmarks.mixed --out "$OUT" ;;
    fairness) python3 -m samebits.benchmarks.fairness --shape 8b --out "$OUT/fairness" ;;
    rl) python3 -m samebits.benchmarks.rl --out "$OUT" ;;
    tp1) python3 -m samebits.benchmarks.tp --device cuda --shape 8b --tp 1 --modes deterministic,invariant --graphs --out "$OUT" ;;
    check) for mode in deterministic fast; do check_endpoint "$mode"; done ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
