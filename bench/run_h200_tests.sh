#!/usr/bin/env bash
# The GPU tests in parts that each fit one device call (10 minutes). PART (required):
#   resolver  the fused resolver against the reference (test_fused_resolver.py's
#             matches_reference and long_histories cases)
#   kernels   every other tests/kernels GPU test
#   rest      the engine, hierarchy and kvstore GPU tests, then the CUDA state machine; the
#             kvstore's needs grpcio >= 1.85.1, installed from the wheels carried in
#             .peer/grpc (carry [".peer"]; bench/README.md "Resolver")
#   all       the three in one call, one log (since 21774e2 the reference side of the
#             kernel tests runs on the CPU: resolver 104 s + kernels 127 s on the H200,
#             against 298 + 385 s at 4f94883; rest took 42 s there)
# Log: $OUT/h200_tests_<DHISPARSE_GIT_SHA>_<PART>.log (the GPU's name first). TESTS_S caps
# each part (default 560 s; with all, 280 s for resolver and kernels each); STATE_S the
# state machine in "rest" (default 60 s).
set -u -o pipefail
export PYTHONUNBUFFERED=1
PART=${PART:?PART=resolver|kernels|rest|all}
LOG="$OUT/h200_tests_${DHISPARSE_GIT_SHA:-HEAD}_${PART}.log"
PYTEST=(python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning
        -m gpu -rfE --durations 10)
RESOLVER="matches_reference or long_histories"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$LOG" 2>&1
resolver() {
  timeout "${TESTS_S:-$1}" "${PYTEST[@]}" tests/kernels/test_fused_resolver.py -k "$RESOLVER" \
    >> "$LOG" 2>&1
}
kernels() {
  timeout "${TESTS_S:-$1}" "${PYTEST[@]}" tests/kernels -k "not ($RESOLVER)" >> "$LOG" 2>&1
}
rest() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/grpc .peer/grpc/*.whl >> "$LOG" 2>&1
  PYTHONPATH=/tmp/grpc${PYTHONPATH:+:$PYTHONPATH} timeout "${TESTS_S:-$1}" "${PYTEST[@]}" \
    tests/engine/test_gpu.py tests/hierarchy tests/kvstore/test_gpu.py \
    --ignore tests/hierarchy/test_state_machine.py >> "$LOG" 2>&1
  timeout "${STATE_S:-60}" "${PYTEST[@]}" tests/hierarchy/test_state_machine.py >> "$LOG" 2>&1
}
case "$PART" in
  resolver) resolver 560 ;;
  kernels) kernels 560 ;;
  rest) rest 560 ;;
  all) resolver 280; kernels 280; rest 120 ;;
  *)
    echo "PART=$PART: expected resolver, kernels, rest or all" | tee -a "$LOG" >&2
    exit 2 ;;
esac
grep -E "passed|failed|error" "$LOG" | tail -8
