#!/usr/bin/env bash
# One device call (session 6): stock llama-bench builds in the background while the followed
# direct-decode path is diagnosed (it crashed with an illegal memory access on the 30B model);
# then the hard-routing (skew 0) and resident rows of the standard matrix with stock beside them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
start=$(date +%s)
rc=0   # every step runs even after another failed; any failure makes the exit status 1
(scripts/device-stock-llama.sh > "$OUTDIR/stock.log" 2>&1) &
build=$!
MODEL=/tmp/pmoe-models/qwen3-30b-a3b-q4_k_m.gguf
[ -s "$MODEL" ] || { mkdir -p /tmp/pmoe-models; scripts/device-run.sh pocketmoe synth --arch qwen3moe \
  --preset qwen3-30b-a3b --quant q4_k_m -o "$MODEL" > /dev/null 2>&1 || { echo "synth FAILED" >> "$OUTDIR/diag.log"; rc=1; }; }
for v in "POCKETMOE_MBOX_PRED=0" "POCKETMOE_FOLLOW_LATE=1" "CUDA_LAUNCH_BLOCKING=1" ; do
  echo "== follow + $v" >> "$OUTDIR/diag.log"
  env POCKETMOE_DIRECT=1 POCKETMOE_STOP_EVERY=0 POCKETMOE_ADMIT=prefetch "$v" timeout 60 \
    scripts/device-run.sh exec pocketmoe bench -m "$MODEL" --gpu 0 --gpu-mem 12GiB -p 0 -n 32 \
    --reps 1 --no-baseline 2>&1 | grep -aE "tg32|stops|error|Error|panick|function" | cut -c1-400 >> "$OUTDIR/diag.log"
  # The bench's status (timeout's 124 included), not grep's.
  r=${PIPESTATUS[0]}; [ "$r" = 0 ] || { echo "FAILED, rc=$r" >> "$OUTDIR/diag.log"; rc=1; }
done
wait $build || { echo "stock build FAILED (see stock.log)" >> "$OUTDIR/diag.log"; rc=1; }
echo "stock built at $(( $(date +%s) - start )) s" >> "$OUTDIR/diag.log"
left=$(( 585 - ($(date +%s) - start) ))
BUDGETS=${BUDGETS:-8GiB,resident} SKEW=0 PROMPTS=0 DEPTHS=0 REPS=3 DEADLINE=$left \
  scripts/device-bench.sh "$OUTDIR/b" > /dev/null 2>&1 || { echo "device-bench FAILED, rc=$?" >> "$OUTDIR/diag.log"; rc=1; }
cat "$OUTDIR/diag.log"; cat "$OUTDIR/b/bench.md" 2>/dev/null | head -30
exit "$rc"
