#!/usr/bin/env bash
# One device call: GPU tests (kernels, hierarchy, engine) + resolver benchmark + the
# SGLang HiSparse peer, side by side. Run on the H200 with `.peer` carried (see
# bench/README.md); results land in $OUT. Knobs (environment): PEER=0 skips the peer on its
# own pool (compare with its last committed run), TESTS_S / STATE_S / BENCH_S cap the test, CUDA
# state-machine and bench phases (0 skips the phase), FIRST_TESTS runs those test files first,
# DHISPARSE_GIT_SHA names the commit in the JSON (the device copy has no .git), TRACE=1
# adds the phase trace (TRACE_S caps it), DHISPARSE_BENCH_HOST picks our host pool
# (bench/resolver/pool.py; shm = a kvstore segment by default here), PEER_SHM=1 runs the peer a second time on a kvstore segment,
# CONTRAST=<pool> re-runs our copy-bound cases on that pool in the same call, BENCH_ARGS adds
# arguments to the benchmark (e.g. --profiles hit100,miss2 --no-copy-sweep).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:${PYTHONPATH:-}
# our host pool: a kvstore segment unless told otherwise (bench/README.md "Host memory")
export DHISPARSE_BENCH_HOST=${DHISPARSE_BENCH_HOST:-shm}
PEER=${PEER:-1} TESTS_S=${TESTS_S:-200} BENCH_S=${BENCH_S:-110} STATE_S=${STATE_S:-60}
mkdir -p /tmp/site
if [ "$PEER" = 1 ] || [ "${PEER_SHM:-0}" = 1 ]; then  # the peer's wheels (either run)
(python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
   .peer/whl/apache_tvm_ffi*.whl .peer/whl/msgspec*.whl \
 && cd /tmp/site && python3 -m zipfile -e "$OLDPWD"/.peer/whl/sglang-0.5.23*.whl .) \
  > "$OUT/peer_install.log" 2>&1 &
fi
# at most 8 files come back from $OUT: the GPU's name heads the test log
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/pytest_gpu.log" 2>&1
if [ "$TESTS_S" != 0 ]; then
timeout "$TESTS_S" python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning \
  ${FIRST_TESTS:-} tests/kernels tests/engine/test_gpu.py tests/hierarchy -m gpu \
  --ignore tests/hierarchy/test_state_machine.py --durations 15 -rfE \
  2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -25
# the hypothesis state machine on CUDA last, under its own cap (slow: one sync per check);
# STATE_S=0 skips it (timeout 0 would mean no cap)
[ "$STATE_S" != 0 ] && timeout "$STATE_S" python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning \
  tests/hierarchy/test_state_machine.py -m gpu 2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -4
fi
wait
[ "$BENCH_S" != 0 ] && timeout "$BENCH_S" python3 -m bench.bench_resolver --out "$OUT/resolver_h200.json" --reps 20 --wall-reps 5 \
  ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -30
PEER_ARGS="--configs 2048:4096 --reps 10 --wall-reps 3 --no-skip-io --deadline-s 80"
if [ "$PEER" = 1 ]; then
timeout 100 python3 .peer/sglang-hisparse/bench_peer_hisparse.py $PEER_ARGS \
  --out "$OUT/peer_hisparse.json" > "$OUT/peer.log" 2>&1
tail -3 "$OUT/peer.log"
fi
if [ "${PEER_SHM:-0}" = 1 ]; then  # the peer again, its host pool in a kvstore segment
timeout 100 python3 -m bench.resolver.peer_on_segment .peer/sglang-hisparse/bench_peer_hisparse.py \
  $PEER_ARGS --out "$OUT/peer_hisparse_shm.json" > "$OUT/peer_shm.log" 2>&1
tail -2 "$OUT/peer_shm.log"
fi
if [ -n "${CONTRAST:-}" ]; then  # copy-bound cases again on another host pool (same call)
DHISPARSE_BENCH_HOST=$CONTRAST timeout 90 python3 -m bench.bench_resolver --out "$OUT/resolver_$CONTRAST.json" \
  --items 656,1152 --configs 2048:4096 --batches 1,32,160 --profiles cold,miss20 --reps 10 \
  --wall-reps 2 --no-blocks-sweep --no-copy-sweep 2>&1 | grep -E "^ (656|1152) " | tail -12
fi
if [ "${TRACE:-0}" = 1 ]; then  # phase trace + launch floors (bench/resolver/trace.py)
timeout "${TRACE_S:-80}" python3 -m bench.resolver.trace --out "$OUT/trace.json" 2>&1 | grep -v Warning | tail -6
fi
