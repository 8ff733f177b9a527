#!/usr/bin/env bash
# Device: A/B of the offloaded decode paths (POCKETMOE_* switches), ours only (`device.sh decode-ab`).
#
# A/B of the offloaded decode paths on the device machine (the H200), ours only, same sitting:
# tg128 at each budget for each variant of the POCKETMOE_* switches (e.g. SLACK_CONTROL=0|1,
# CPU_SPIN=0|1, CUDA_GRAPHS=0|1). From the repo root with dist/ carried, like scripts/device-bench.sh
# (same model file, same synthesis):
#
#   scripts/device-decode-ab.sh "$OUT"   # BUDGETS (default 12GiB,8GiB), REPS (3), SKEW, DEPTHS (0),
#                                        # ARCH, PRESET, QUANT (as scripts/device-bench.sh),
#                                        # PROMPTS (0), VARIANTS (default "CUDA_GRAPHS=1 CUDA_GRAPHS=0"; one
#                                        # variant is VAR=value[+VAR=value...], POCKETMOE_ implied)
#
# Writes OUTDIR/ab.md (one table per variant), ab.log (with the offload statistics) and the JSON.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-decode-ab.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
start=$(date +%s)
MODEL=$(scripts/device-model.sh "${ARCH:-qwen3moe}" "${PRESET:-qwen3-30b-a3b}" "${QUANT:-q4_k_m}" \
  "${SKEW:-}" 2>> "$OUTDIR/ab.log") || exit 1
echo "synth done at $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/ab.log"
: > "$OUTDIR/ab.md"
rc=0   # every variant runs even after another failed; any failure makes the exit status 1
for v in ${VARIANTS:-CUDA_GRAPHS=1 CUDA_GRAPHS=0}; do
  vars=()
  for a in ${v//+/ }; do vars+=("POCKETMOE_$a"); done
  name="ab-${v//[=+]/_}"
  echo "## ${vars[*]}" | tee -a "$OUTDIR/ab.md" >> "$OUTDIR/ab.log"
  env "${vars[@]}" scripts/device-run.sh exec pocketmoe bench -m "$MODEL" --gpu 0 \
    --gpu-mem "${BUDGETS:-12GiB,8GiB}" -p "${PROMPTS:-0}" -n 128 --depth "${DEPTHS:-0}" \
    --reps "${REPS:-3}" --no-baseline --json "$OUTDIR/$name.json" \
    >> "$OUTDIR/ab.md" 2>> "$OUTDIR/ab.log" \
    || { r=$?; echo "$v: bench FAILED, rc=$r" | tee -a "$OUTDIR/ab.log"; rc=1; }
  echo "$v done at $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/ab.log"
done
cat "$OUTDIR/ab.md"
exit "$rc"
