#!/usr/bin/env bash
# A/B of the offloaded decode paths on the device machine (the H200), ours only, same sitting:
# tg128 at each budget for the stopping path (POCKETMOE_DIRECT=0) and direct decode with each
# admission mode (POCKETMOE_ADMIT=sync|async|off; see src/experts/direct.rs). From the repo root
# with dist/ carried, like scripts/device-bench.sh (same model file, same synthesis):
#
#   scripts/device-decode-ab.sh "$OUT"     # BUDGETS (default 12GiB,8GiB), REPS (3), SKEW,
#                                          # VARIANTS (default "DIRECT=0 ADMIT=sync ADMIT=async ADMIT=off")
#
# Writes OUTDIR/ab.md (one table per variant, with the offload statistics) and ab.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:?usage: scripts/device-decode-ab.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PRESET="${PRESET:-qwen3-30b-a3b}"
MODEL="/tmp/pmoe-models/$PRESET-q4_k_m${SKEW:+-skew$SKEW}.gguf"
start=$(date +%s)
if [ ! -s "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  scripts/device-run.sh pocketmoe synth --arch qwen3moe --preset "$PRESET" --quant q4_k_m \
    ${SKEW:+--routing-skew "$SKEW"} -o "$MODEL" >> "$OUTDIR/ab.log" 2>&1 || exit 1
fi
echo "synth done at $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/ab.log"
: > "$OUTDIR/ab.md"
for v in ${VARIANTS:-DIRECT=0 ADMIT=sync ADMIT=async ADMIT=off}; do
  echo "## POCKETMOE_$v" >> "$OUTDIR/ab.md"
  env "POCKETMOE_$v" scripts/device-run.sh exec pocketmoe bench -m "$MODEL" --gpu 0 \
    --gpu-mem "${BUDGETS:-12GiB,8GiB}" -p 0 -n 128 --reps "${REPS:-3}" --no-baseline \
    --json "$OUTDIR/ab-$v.json" >> "$OUTDIR/ab.md" 2>> "$OUTDIR/ab.log"
  echo "$v done at $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/ab.log"
done
cat "$OUTDIR/ab.md"
