#!/usr/bin/env bash
# One device call for the serving experiments (issue 8): the GPU tests that guard the
# engine's CUDA path, the resolver's phase trace (bench/resolver/trace.py), then the
# h200 sweep (services/decode/gpu_bench/sweep.py) with what is left of the call.
# Knobs (environment): ONLY (sweep point-name prefixes, default "warm,serve"), SWEEP_S,
# TESTS_S, TRACE=0 skips the trace, DHISPARSE_GIT_SHA names the commit (no .git there).
set -u -o pipefail
export PYTHONUNBUFFERED=1
ONLY=${ONLY:-warm,serve} SWEEP_S=${SWEEP_S:-330} TESTS_S=${TESTS_S:-150} TRACE=${TRACE:-1}
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
if [ "$TESTS_S" != 0 ]; then
timeout "$TESTS_S" python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning \
  tests/engine/test_gpu.py tests/kernels tests/hierarchy -m gpu 2>&1 | tee "$OUT/pytest_gpu.log" | tail -6
fi
if [ "$TRACE" = 1 ]; then
timeout 90 python3 -m bench.resolver.trace --out "$OUT/trace.json" 2>&1 | tail -8
fi
timeout $((SWEEP_S + 40)) python3 -m services.decode.gpu_bench.sweep --out "$OUT" --budget-s "$SWEEP_S" \
  --fused --only "$ONLY" ${SWEEP_ARGS:-} 2>&1 | grep -v "^USDT" | tee "$OUT/sweep.log" | tail -60
