#!/usr/bin/env bash
# One device call: 20%-miss copies against row spacing (bench/resolver/spacing.py). For each
# request length in LENGTHS, the plain gather (bench.bench_host_gather, 32 / 160 regions of
# 410 rows) and the resolver (bench.bench_resolver, miss20, batch 32 / 160) read the same
# number of missed rows a request from a kvstore segment of that many rows a request; the
# missed rows lie LENGTH / 410 rows apart on average. ITEM: the row bytes (default 656).
# Out: $OUT/gather_<S>.json, $OUT/res_<S>.json, $OUT/spacing.log; merge them here with
#   python3 -m bench.resolver.spacing <the files' folder> bench/results/row_spacing_h200.json
set -u -o pipefail
export PYTHONUNBUFFERED=1 DHISPARSE_BENCH_HOST=shm
ITEM=${ITEM:-656}
LOG=$OUT/spacing.log
nvidia-smi --query-gpu=name,driver_version --format=csv > "$LOG" 2>&1
for S in ${LENGTHS:-200000 100000 50000 30000 20000 10000}; do
  echo "== $S rows a request $(date +%T)" >> "$LOG"
  # the gather's 4 pattern x grid runs take (reps + 1) x 410 fresh rows a region each: at
  # most 6 reps, fewer where the requests hold too few rows (it would wrap and read rows again)
  REPS=$(( S / (4 * 410) - 1 )); REPS=$(( REPS > 6 ? 6 : REPS ))
  timeout "${GATHER_S:-90}" python3 -m bench.bench_host_gather --out "$OUT/gather_$S.json" \
    --modes shm --row-bytes "$ITEM" --seq-len "$S" --regions 160 --patterns 32:410,160:410 \
    --grids 16,66 --reps "$REPS" 2>&1 | grep -v Warning >> "$LOG"
  # 13 calls a case: a 10K-row request holds 14 windows of 410 never-read rows
  timeout "${RES_S:-120}" python3 -m bench.bench_resolver --out "$OUT/res_$S.json" \
    --items "$ITEM" --configs 2048:4096 --batches 32,160 --profiles miss20 --seq-len "$S" \
    --reps 8 --warmup 3 --wall-reps 1 --no-blocks-sweep --no-copy-sweep 2>&1 \
    | grep -v Warning | tail -12 >> "$LOG"
done
echo "== end $(date +%T)" >> "$LOG"
