#!/usr/bin/env bash
# The GPU tests in parts that each fit one device call (10 minutes; the whole tests/kernels
# set took more than 470 s at 6007846). PART (required):
#   resolver  the fused resolver against the reference (test_fused_resolver.py's
#             matches_reference and long_histories cases)
#   kernels   every other tests/kernels GPU test
#   rest      the engine, hierarchy and kvstore GPU tests, then the CUDA state machine; the
#             kvstore's needs grpcio >= 1.85.1, installed from the wheels carried in
#             .peer/grpc (carry [".peer"]; bench/README.md "Resolver")
# Log: $OUT/h200_tests_<DHISPARSE_GIT_SHA>_<PART>.log (the GPU's name first). TESTS_S caps
# the part (default 560 s); STATE_S the state machine in "rest" (default 60 s).
set -u -o pipefail
export PYTHONUNBUFFERED=1
PART=${PART:?PART=resolver|kernels|rest}
LOG="$OUT/h200_tests_${DHISPARSE_GIT_SHA:-HEAD}_${PART}.log"
PYTEST=(python3 -m pytest -q -p no:cacheprovider --timeout 120 -W ignore::DeprecationWarning
        -m gpu -rfE --durations 10)
RESOLVER="matches_reference or long_histories"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$LOG" 2>&1
case "$PART" in
  resolver)
    timeout "${TESTS_S:-560}" "${PYTEST[@]}" tests/kernels/test_fused_resolver.py -k "$RESOLVER" \
      >> "$LOG" 2>&1 ;;
  kernels)
    timeout "${TESTS_S:-560}" "${PYTEST[@]}" tests/kernels -k "not ($RESOLVER)" >> "$LOG" 2>&1 ;;
  rest)
    python3 -m pip install -q --no-index --no-deps --target /tmp/grpc .peer/grpc/*.whl >> "$LOG" 2>&1
    PYTHONPATH=/tmp/grpc${PYTHONPATH:+:$PYTHONPATH} timeout "${TESTS_S:-560}" "${PYTEST[@]}" \
      tests/engine/test_gpu.py tests/hierarchy tests/kvstore/test_gpu.py \
      --ignore tests/hierarchy/test_state_machine.py >> "$LOG" 2>&1
    timeout "${STATE_S:-60}" "${PYTEST[@]}" tests/hierarchy/test_state_machine.py >> "$LOG" 2>&1 ;;
  *)
    echo "PART=$PART: expected resolver, kernels or rest" | tee -a "$LOG" >&2
    exit 2 ;;
esac
tail -4 "$LOG"
