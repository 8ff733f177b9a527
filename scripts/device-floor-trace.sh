#!/usr/bin/env bash
# Device: resident decode kernel by kernel (CUPTI traces), ours beside libllama (`device.sh floor-trace`).
#
# Issue 30, the resident decode floor, kernel by kernel: traces (tools/kernel-trace, CUPTI) of
# resident tg128 on the synthetic Qwen3-30B-A3B q4_k_m: ours in a fresh process beside the
# in-process libllama baseline (its child process), ours after a pp512, and ours fresh with CUDA
# graphs off; then the per-step summaries side by side. From the repo root, dist/ carried
# (scripts/pack-device.sh and tools/kernel-trace/build.sh).
#   scripts/device-floor-trace.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-floor-trace.sh OUTDIR}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
M=$(scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m 2>/dev/null) || exit 1
rc=0
t() { # LABEL ENV... -- BENCH-ARGS...
  local label=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" KTRACE_OUT="$OUTDIR/$label-%p.csv" scripts/device-run.sh exec bash tools/kernel-trace/run.sh \
    pocketmoe bench -m "$M" --gpu 0 --reps 3 -n 128 "$@" >"$OUTDIR/$label.md" 2>"$OUTDIR/$label.log" \
    || { echo "$label FAILED"; rc=1; }
  echo "$label: $(grep -E '^\| resident' "$OUTDIR/$label.md" | tr -s ' ' | cut -c1-200 | tr '\n' ' ')"
}
t fresh -- -p 0
t after -- -p 512 --no-baseline
t nographs POCKETMOE_CUDA_GRAPHS=0 -- -p 0 --no-baseline
ls -la "$OUTDIR"
python3 tools/kernel-trace/summarise.py --top 40 "$OUTDIR"/fresh-*.csv "$OUTDIR"/after-*.csv "$OUTDIR"/nographs-*.csv \
  > "$OUTDIR/summary.txt" 2>&1 || rc=1
cat "$OUTDIR/summary.txt"
xz -T0 "$OUTDIR"/*.csv
exit $rc
