#!/usr/bin/env bash
# One device call: GPU tests (kernels, hierarchy, engine) + resolver benchmark + the
# SGLang HiSparse peer, side by side. Run on the H200 with `.peer` carried (see
# bench/README.md); results land in $OUT. Knobs (environment): PEER=0 skips the peer
# (compare with its last committed run), TESTS_S / STATE_S / BENCH_S cap the test, CUDA
# state-machine and bench phases (0 skips the bench), FIRST_TESTS runs those test files first,
# DHISPARSE_GIT_SHA names the commit in the JSON (the device copy has no .git), TRACE=1
# adds the phase trace (TRACE_S caps it).
set -u -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:${PYTHONPATH:-}
PEER=${PEER:-1} TESTS_S=${TESTS_S:-200} BENCH_S=${BENCH_S:-110} STATE_S=${STATE_S:-60}
mkdir -p /tmp/site
if [ "$PEER" = 1 ]; then
(python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
   .peer/whl/apache_tvm_ffi*.whl .peer/whl/msgspec*.whl \
 && cd /tmp/site && python3 -m zipfile -e "$OLDPWD"/.peer/whl/sglang-0.5.23*.whl .) \
  > "$OUT/peer_install.log" 2>&1 &
fi
# at most 8 files come back from $OUT: the GPU's name heads the test log
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/pytest_gpu.log" 2>&1
timeout "$TESTS_S" python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning \
  ${FIRST_TESTS:-} tests/kernels tests/engine/test_gpu.py tests/hierarchy -m gpu \
  --ignore tests/hierarchy/test_state_machine.py --durations 15 -rfE \
  2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -25
# the hypothesis state machine on CUDA last, under its own cap (slow: one sync per check)
timeout "$STATE_S" python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning \
  tests/hierarchy/test_state_machine.py -m gpu 2>&1 | tee -a "$OUT/pytest_gpu.log" | tail -4
wait
[ "$BENCH_S" != 0 ] && timeout "$BENCH_S" python3 -m bench.bench_resolver --out "$OUT/resolver_h200.json" --reps 20 --wall-reps 5 \
  2>&1 | tee "$OUT/bench.log" | tail -30
if [ "$PEER" = 1 ]; then
timeout 100 python3 .peer/sglang-hisparse/bench_peer_hisparse.py --configs 2048:4096 --reps 10 \
  --wall-reps 3 --no-skip-io --deadline-s 80 --out "$OUT/peer_hisparse.json" > "$OUT/peer.log" 2>&1
tail -3 "$OUT/peer.log"
fi
if [ "${TRACE:-0}" = 1 ]; then  # phase trace + launch floors (bench/resolver/trace.py)
timeout "${TRACE_S:-80}" python3 -m bench.resolver.trace --out "$OUT/trace.json" 2>&1 | grep -v Warning | tail -6
fi
