#!/usr/bin/env bash
# Device: several GPUs (issue 26), ours beside stock llama-bench, in one call (`device.sh multi OUT`).
#
# On a machine with two or more GPUs (run's kind nvidia-h200-x2 or x4), from the repo root with
# dist/ carried (scripts/pack-device.sh with TESTS including multi_device; dist/stock for stock):
#
#   scripts/device.sh build-stock        # first call: stock llama-bench (~6 min, kept while warm)
#   scripts/device.sh multi "$OUT"       # second call: this script
#
# 1. tests/multi_device on CUDA (the layer split on logical devices, the tensor split on GPUs 0
#    and 1 against GPU 0 alone), under a timeout;
# 2. resident decode and prefill of the model (default Qwen3-30B-A3B q4_k_m; ARCH, PRESET, QUANT
#    as device-bench.sh) on GPUS (default 0,1): ours with -sm layer and -sm tensor
#    (`pocketmoe bench --gpu GPUS --split-mode ... --no-baseline`), ours on the first GPU alone,
#    and stock llama-bench on the same GPUs with -sm layer and -sm tensor (-fa 1, which its
#    tensor split needs), all pp512 + tg128, REPS (default 3) repetitions;
# 3. with OFFLOAD_BUDGET (e.g. 8GiB: issue 26's "2 GPUs at 8 GiB each vs one at 16"), offloaded
#    decode (tg128): ours with each GPU held to the budget, -sm layer (each GPU caches its
#    blocks' experts) and -sm expert (each caches a share of every layer's experts), and ours on
#    the first GPU alone at twice the budget (OFFLOAD_ONE, default 16GiB).
# Writes OUT/tests.log, OUT/ours-*.md/json, OUT/stock-*.md and OUT/multi.log; prints the tables.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-multi.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG="$OUTDIR/multi.log"
start=$(date +%s)
left() { echo $(( ${DEADLINE:-580} - ($(date +%s) - start) )); }
GPUS="${GPUS:-0,1}"
REPS="${REPS:-3}"
n=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs visible: $n; using $GPUS" | tee "$LOG"
[ "$n" -ge 2 ] || { echo "device-multi: needs two or more GPUs (run kind nvidia-h200-x2)" | tee -a "$LOG"; exit 1; }
rc=0
timeout 200 env TESTS=multi_device scripts/device-run.sh tests > "$OUTDIR/tests.log" 2>&1 \
  || { rc=1; echo "multi_device tests FAILED" | tee -a "$LOG"; }
grep -E "^test |^test result|panicked" "$OUTDIR/tests.log" | tee -a "$LOG"
MODEL=$(scripts/device-model.sh "${ARCH:-qwen3moe}" "${PRESET:-qwen3-30b-a3b}" "${QUANT:-q4_k_m}") || exit 1
echo "model ready at $(( $(date +%s) - start )) s: $MODEL" | tee -a "$LOG"
ours() { # NAME GPUS [BENCH ARGS...]
  local name=$1 gpus=$2; shift 2
  timeout "$(left)" scripts/device-run.sh exec pocketmoe bench -m "$MODEL" --gpu "$gpus" \
    -p "${PP:-512}" -n 128 --reps "$REPS" --no-baseline --json "$OUTDIR/ours-$name.json" "$@" \
    > "$OUTDIR/ours-$name.md" 2>> "$LOG" || { rc=1; echo "ours $name FAILED" | tee -a "$LOG"; }
  echo "== ours $name"; cat "$OUTDIR/ours-$name.md"
}
ours layer "$GPUS" --split-mode layer
ours tensor "$GPUS" --split-mode tensor
ours one-gpu "${GPUS%%,*}"
if [ -n "${OFFLOAD_BUDGET:-}" ]; then
  for sm in layer expert; do
    PP=0 ours "offload-$sm" "$GPUS" --split-mode "$sm" --gpu-mem "$OFFLOAD_BUDGET"
  done
  PP=0 ours offload-one-gpu "${GPUS%%,*}" --gpu-mem "${OFFLOAD_ONE:-16GiB}"
fi
if [ "${STOCK:-1}" != 0 ] && [ -s dist/stock/llama.cpp.tar.xz ]; then
  LLAMA_BENCH=$(scripts/device-stock-llama.sh 2>> "$LOG" | tail -1) || exit 1
  for sm in layer tensor; do
    CUDA_VISIBLE_DEVICES="$GPUS" timeout "$(left)" "$LLAMA_BENCH" -m "$MODEL" -ngl 99 -fa 1 \
      -sm "$sm" -p 512 -n 128 -r "$REPS" -o md > "$OUTDIR/stock-$sm.md" 2>> "$LOG" \
      || { rc=1; echo "stock -sm $sm FAILED" | tee -a "$LOG"; }
    echo "== stock llama-bench -sm $sm"; cat "$OUTDIR/stock-$sm.md"
  done
fi
exit $rc
