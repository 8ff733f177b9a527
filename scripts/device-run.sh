#!/usr/bin/env bash
# Device: unpacks the packed CUDA build and runs its tests, its CLI or a command (`device.sh tests|run`).
#
# Runs on the device machine (the H200), from the repo root of the copied working tree, with
# dist/ carried. Unpacks the CUDA build from scripts/pack-device.sh once into /tmp/pmoe, then:
#
#   scripts/device-run.sh tests [FILTER]        # every packed test executable (cargo test names);
#                                               # TESTS="ggml_smoke synth_llama" picks executables
#   scripts/device-run.sh pocketmoe ARGS...     # the CLI, e.g. `pocketmoe self-check`
#   scripts/device-run.sh exec CMD ARGS...      # anything, with the environment set
#
# Output is also written to $OUT/device-run.log when $OUT is set.
set -uo pipefail
ROOT=/tmp/pmoe
sum=$(cat dist/device.tar.xz.part* | md5sum | cut -d' ' -f1)
if [ ! -f "$ROOT/.sum" ] || [ "$(cat "$ROOT/.sum")" != "$sum" ]; then
  rm -rf "$ROOT" && mkdir -p /tmp && cat dist/device.tar.xz.part* | xz -d | tar -C /tmp -xf - || exit 1
  echo "$sum" > "$ROOT/.sum"
fi
export LD_LIBRARY_PATH="$ROOT/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="$ROOT/bin:$PATH"
log="${OUT:-/tmp}/device-run.log"
cmd="${1:-tests}"; shift || true
case "$cmd" in
  tests)
    (
      rc=0; ran=0
      for t in "$ROOT"/tests/*; do
        if [ -n "${TESTS:-}" ] && ! grep -qw "$(basename "$t")" <<<"$TESTS"; then continue; fi
        echo "== $(basename "$t")"
        ran=$((ran + 1))
        "$t" --test-threads=1 "$@" || { echo "== $(basename "$t") FAILED"; rc=1; }
      done
      # TESTS naming no packed executable would otherwise pass having run nothing.
      [ "$ran" -gt 0 ] || { echo "no test executable matches TESTS='${TESTS:-}'"; rc=1; }
      exit $rc
    ) 2>&1 | tee -a "$log"
    exit "${PIPESTATUS[0]}"
    ;;
  pocketmoe) pocketmoe "$@" 2>&1 | tee -a "$log"; exit "${PIPESTATUS[0]}" ;;
  exec) "$@" 2>&1 | tee -a "$log"; exit "${PIPESTATUS[0]}" ;;
  *) echo "usage: $0 tests [FILTER] | pocketmoe ARGS... | exec CMD..." >&2; exit 2 ;;
esac
