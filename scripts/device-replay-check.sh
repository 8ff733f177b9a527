#!/usr/bin/env bash
# Device: CUDA-graph replay gives what direct execution gives, every arch (`device.sh replay`).
#
# Checks on the device machine that CUDA-graph replay computes exactly what direct execution
# does: for every architecture's tiny preset (and MODELS="path ..." if given), resident and
# offloaded (a budget of the resident floor + 1/4 of the routed experts, so the expert cache
# misses and stages), greedy-decodes 48 tokens with `POCKETMOE_TRACE` (per-step argmax and logit
# checksums) under each setting of CONFIGS and compares every trace with the one that has graphs
# off. Run from the repo root with dist/ carried, after scripts/pack-device.sh:
#
#   scripts/device-replay-check.sh "$OUT"
#   CONFIGS="GGML_CUDA_PDL=0 GGML_CUDA_PDL=1" ARCHS="qwen3moe" scripts/device-replay-check.sh "$OUT"
#
# Exit status 1 when a trace differs or a run fails (its last lines are printed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:?usage: scripts/device-replay-check.sh OUTDIR}"
mkdir -p "$OUTDIR" /tmp/pmoe-models
CONFIGS="${CONFIGS:-default GGML_CUDA_PDL=1 GGML_CUDA_PDL=0}"
ARCHS="${ARCHS:-qwen3moe qwen2moe gpt-oss deepseek2 deepseek32 deepseek4 llama glm4moe minimax-m2 olmoe}"
rc=0
models=()
for arch in $ARCHS; do
  m=/tmp/pmoe-models/$arch-tiny.gguf
  if [ ! -s "$m" ]; then
    scripts/device-run.sh pocketmoe synth --arch "$arch" --preset tiny -o "$m" >"$OUTDIR/synth.$arch.log" 2>&1 \
      || { echo "$arch: synth FAILED"; tail -5 "$OUTDIR/synth.$arch.log"; rc=1; continue; }
  fi
  models+=("$m")
done
# shellcheck disable=SC2206
models+=(${MODELS:-})

# The smallest budget that holds the resident parts (the engine names it when refusing 1 byte),
# plus a quarter of the file: some expert slots, far fewer than the experts.
offload_budget() {
  local need
  need=$(scripts/device-run.sh pocketmoe run -m "$1" --gpu 0 --gpu-mem 1 -p x -n 1 2>&1 \
    | grep -o '([0-9]* B:' | head -1 | tr -dc 0-9)
  [ -n "$need" ] || return 1
  echo $(( need + $(stat -c %s "$1") / 4 ))
}

# one_run TRACE ENV... -- ARGS...: one greedy run; fails loudly.
one_run() {
  local trace=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if ! env "${envs[@]}" POCKETMOE_TRACE="$trace" scripts/device-run.sh pocketmoe run "$@" \
      -p "The quick brown fox jumps over" -n 48 --temp 0 >"$trace.log" 2>&1 || [ ! -s "$trace" ]; then
    echo "  run FAILED: $*"; tail -5 "$trace.log"; return 1
  fi
}

for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  for mode in resident offload; do
    args=(-m "$m" --gpu 0)
    if [ "$mode" = offload ]; then
      b=$(offload_budget "$m") || { echo "$name: no resident floor reported"; rc=1; continue; }
      args+=(--gpu-mem "$b")
    fi
    base="$OUTDIR/trace.$name.$mode.graphs-off.txt"
    one_run "$base" POCKETMOE_CUDA_GRAPHS=0 -- "${args[@]}" || { rc=1; continue; }
    for cfg in $CONFIGS; do
      tag=${cfg//=/-}
      t="$OUTDIR/trace.$name.$mode.$tag.txt"
      envs=(); [ "$cfg" = default ] || envs=("$cfg")
      one_run "$t" "${envs[@]}" -- "${args[@]}" || { rc=1; continue; }
      if cmp -s "$base" "$t"; then
        echo "$name $mode $cfg: identical to graphs off ($(wc -l < "$t") trace lines)"
      else
        echo "$name $mode $cfg: DIFFERS from graphs off"; diff "$base" "$t" | head -4; rc=1
      fi
    done
  done
done
exit $rc
