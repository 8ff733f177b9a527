#!/usr/bin/env bash
# Session 7's device call (kept for the commands docs/bench-h200.md cites): the CUDA offload and
# batch tests, pocketmoe-serve at 8 GiB under 1/4/16 streams, then single-stream decode resident
# and at 8 GiB (SKIP_BENCH=1 skips the last). Now scripts/device-verify.sh with SERVE=1.
TESTS="${TESTS:-offload batch}" SERVE=1 exec "$(dirname "$0")/device-verify.sh" "$@"
