#!/usr/bin/env bash
# Checks on the device machine that CUDA-graph replay computes exactly what direct execution
# does: for each architecture's tiny preset (llama = mixtral's tiny MoE), and MODELS="path ..."
# if given, greedy-decodes 48 tokens with `POCKETMOE_TRACE` (per-step argmax and logit checksums) under each setting of
# CONFIGS and compares every trace with the one that has graphs off. Run from the repo root with
# dist/ carried, after scripts/pack-device.sh:
#
#   scripts/device-replay-check.sh "$OUT"
#   CONFIGS="GGML_CUDA_PDL=0 GGML_CUDA_PDL=1" scripts/device-replay-check.sh "$OUT"
#
# Exit status 1 when a trace differs (the first differing lines are printed).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:?usage: scripts/device-replay-check.sh OUTDIR}"
mkdir -p "$OUTDIR" /tmp/pmoe-models
CONFIGS="${CONFIGS:-default GGML_CUDA_PDL=1 GGML_CUDA_PDL=0}"
models=()
for arch in qwen3moe gpt-oss deepseek2 llama; do
  m=/tmp/pmoe-models/$arch-tiny.gguf
  [ -s "$m" ] || scripts/device-run.sh pocketmoe synth --arch "$arch" --preset tiny -o "$m" >/dev/null 2>&1
  models+=("$m")
done
# shellcheck disable=SC2206
models+=(${MODELS:-})
rc=0
for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  base="$OUTDIR/trace.$name.graphs-off.txt"
  POCKETMOE_CUDA_GRAPHS=0 POCKETMOE_TRACE="$base" scripts/device-run.sh pocketmoe run -m "$m" \
    --gpu 0 -p "The quick brown fox jumps over" -n 48 --temp 0 >/dev/null 2>&1
  for cfg in $CONFIGS; do
    tag=${cfg//=/-}
    t="$OUTDIR/trace.$name.$tag.txt"
    # shellcheck disable=SC2086
    env $([ "$cfg" = default ] || echo "$cfg") POCKETMOE_TRACE="$t" scripts/device-run.sh pocketmoe run \
      -m "$m" --gpu 0 -p "The quick brown fox jumps over" -n 48 --temp 0 >/dev/null 2>&1
    if cmp -s "$base" "$t"; then
      echo "$name $cfg: identical to graphs off"
    else
      echo "$name $cfg: DIFFERS from graphs off"; diff "$base" "$t" | head -4; rc=1
    fi
  done
done
exit $rc
