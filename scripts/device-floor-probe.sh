#!/usr/bin/env bash
# Issue 30's first clue, on the device: resident tg128 of the synthetic Qwen3-30B-A3B q4_k_m in a
# fresh process vs after a pp512 in the same process, with CUDA graphs on/off and micro-batch
# 512/2048, ours only (no baseline; stock is in scripts/device-bench.sh); then nsys API/kernel
# summaries of the fresh-process and after-prompt cases. From the repo root, dist/ carried.
#   scripts/device-floor-probe.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-floor-probe.sh OUTDIR}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
M=$(scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m 2>/dev/null) || exit 1
rc=0
b() { # LABEL ENV... -- ARGS...
  local label=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" scripts/device-run.sh pocketmoe bench -m "$M" --gpu 0 --no-baseline --reps 3 -n 128 "$@" \
    >"$OUTDIR/$label.md" 2>"$OUTDIR/$label.log" || { echo "$label FAILED"; rc=1; }
  echo "$label: $(grep -E '^\| resident' "$OUTDIR/$label.md" | awk -F'|' '{print $3 $4}' | tr '\n' ' ')"
}
b fresh -- -p 0
b fresh-graphs-off POCKETMOE_CUDA_GRAPHS=0 -- -p 0
b fresh-ub512 -- -p 0 --ubatch 512
b after-pp512 -- -p 512
b after-pp512-graphs-off POCKETMOE_CUDA_GRAPHS=0 -- -p 512
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
for p in 0 512; do
  [ -n "$NSYS" ] || break
  scripts/device-run.sh exec "$NSYS" profile -o "/tmp/floor-p$p" --force-overwrite true pocketmoe bench -m "$M" \
    --gpu 0 --no-baseline --reps 1 -n 64 -p "$p" >/dev/null 2>&1 || { echo "nsys p$p FAILED"; rc=1; }
  scripts/device-run.sh exec "$NSYS" stats -q --report cuda_api_sum,cuda_gpu_kern_sum --format csv \
    -o "$OUTDIR/nsys-p$p" "/tmp/floor-p$p.nsys-rep" >/dev/null 2>&1 || { echo "nsys stats p$p FAILED"; rc=1; }
done
for f in "$OUTDIR"/nsys-p*_cuda_api_sum.csv; do echo "== $f"; head -12 "$f" | cut -c1-160; done
exit $rc
