#!/usr/bin/env bash
# Issue 30, the offloaded step kernel by kernel: CUPTI traces (tools/kernel-trace) of tg64 on the
# synthetic Qwen3-30B-A3B q4_k_m (calibrated routing) resident, at 12 GiB and at 8 GiB, ours
# only, then the per-step summaries side by side (kernels, copies, GPU idle gaps). From the repo
# root, dist/ carried (scripts/pack-device.sh and tools/kernel-trace/build.sh).
#   scripts/device-offload-trace.sh "$OUT"           # LABEL=ENV... pairs in VARIANTS add traces
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-offload-trace.sh OUTDIR}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
M=$(scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m ${SKEW:-} 2>/dev/null) || exit 1
rc=0
t() { # LABEL BUDGET [ENV...]
  local label=$1 budget=$2; shift 2
  local mem=(); [ "$budget" = resident ] || mem=(--gpu-mem "$budget")
  env POCKETMOE_STEP_PROFILE=1 "$@" KTRACE_OUT="$OUTDIR/$label-%p.csv" scripts/device-run.sh exec bash tools/kernel-trace/run.sh \
    pocketmoe bench -m "$M" --gpu 0 "${mem[@]}" --no-baseline --reps 2 -p 0 -n 64 >"$OUTDIR/$label.md" 2>"$OUTDIR/$label.log" \
    || { echo "$label FAILED"; tail -5 "$OUTDIR/$label.log"; rc=1; }
  echo "$label: $(grep -E '^\| ' "$OUTDIR/$label.md" | tail -1 | tr -s ' ' | cut -c1-220)"
}
t resident resident
t g12 12GiB
t g8 8GiB
for v in ${VARIANTS:-}; do  # e.g. VARIANTS="nog12=12GiB:POCKETMOE_CUDA_GRAPHS=0"
  label=${v%%=*}; rest=${v#*=}; budget=${rest%%:*}; envs=${rest#*:}; [ "$envs" = "$rest" ] && envs=
  t "$label" "$budget" ${envs//,/ }
done
csvs=(); for l in resident g12 g8; do csvs+=("$OUTDIR"/$l-*.csv); done
for v in ${VARIANTS:-}; do csvs+=("$OUTDIR/${v%%=*}"-*.csv); done
python3 tools/kernel-trace/summarise.py --last 60 --top 45 "${csvs[@]}" > "$OUTDIR/summary.txt" 2>&1 || rc=1
cat "$OUTDIR/summary.txt"
xz -T0 "$OUTDIR"/*.csv
exit $rc
