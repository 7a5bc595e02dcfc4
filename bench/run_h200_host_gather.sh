#!/usr/bin/env bash
# One device call: sparse host-row gathers per host allocation (bench/bench_host_gather.py),
# then the resolver's copy-heavy cases on a register pool and a transparent-huge-page pool.
# Knobs: TESTS (pytest targets run first, GPU marker), RES_ITEMS / RES_BATCHES / RES_PROFILES.
set -u -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/pytest_gpu.log" 2>&1
if [ -n "${TESTS:-}" ]; then
  timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider --timeout 120 \
    -W ignore::DeprecationWarning $TESTS -m gpu -rfE 2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -5
fi
timeout "${GATHER_S:-200}" python3 -m bench.bench_host_gather --out "$OUT/host_gather_h200.json" \
  2>&1 | tee "$OUT/host_gather.log" | grep -v Warning
for mode in ${RES_MODES:-register thp}; do
  DHISPARSE_BENCH_HOST=$mode timeout "${RES_S:-120}" python3 -m bench.bench_resolver \
    --out "$OUT/resolver_$mode.json" --items "${RES_ITEMS:-656,1152}" --configs 2048:4096 \
    --batches "${RES_BATCHES:-1,32,160}" --profiles "${RES_PROFILES:-miss20,cold}" --reps 10 \
    --wall-reps 2 --no-blocks-sweep --no-copy-sweep 2>&1 | tee "$OUT/resolver_$mode.log" | tail -14
done
