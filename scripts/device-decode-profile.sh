#!/usr/bin/env bash
# Device: nsys summaries of offloaded and resident decode, CUDA graphs on/off (`device.sh profile`).
#
# Where offloaded decode's time goes, on the device machine (the H200): nsys kernel/API/memcpy
# summaries of `pocketmoe run` decoding at a budget and fully resident, and tg128 with ggml-cuda's
# CUDA graphs on and off. From the repo root with dist/ carried (model as scripts/device-bench.sh).
#
#   scripts/device-decode-profile.sh "$OUT"    # BUDGET (default 12GiB)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-decode-profile.sh OUTDIR}"
mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
MODEL=/tmp/pmoe-models/qwen3-30b-a3b-q4_k_m.gguf
[ -s "$MODEL" ] || { mkdir -p /tmp/pmoe-models; scripts/device-run.sh pocketmoe synth --arch qwen3moe \
  --preset qwen3-30b-a3b --quant q4_k_m -o "$MODEL" > /dev/null 2>&1 || exit 1; }
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
rc=0   # every step runs even after another failed; any failure makes the exit status 1
# The profile is this script's point: without nsys the bench rows still run, but the exit is 1.
[ -n "$NSYS" ] || { echo "nsys not found: no profile taken (FAILED)" >&2; rc=1; }
for mem in "${BUDGET:-12GiB}" resident; do
  flag=(--gpu-mem "$mem"); [ "$mem" = resident ] && flag=()
  if [ -n "$NSYS" ]; then
    scripts/device-run.sh exec "$NSYS" profile -o "/tmp/prof-$mem" --force-overwrite true \
      pocketmoe run -m "$MODEL" --gpu 0 "${flag[@]}" --ctx 512 -p "hello" -n 64 --temp 0 -v \
      > "$OUTDIR/run-$mem.log" 2>&1 || { echo "nsys profile ($mem) FAILED, rc=$?: see run-$mem.log"; rc=1; }
    scripts/device-run.sh exec "$NSYS" stats -q --report cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum \
      --format csv -o "$OUTDIR/stats-$mem" "/tmp/prof-$mem.nsys-rep" > /dev/null 2>&1 \
      || { echo "nsys stats ($mem) FAILED, rc=$?"; rc=1; }
    ls "$OUTDIR"
  fi
  for g in 0 1; do
    echo "== $mem GGML_CUDA_DISABLE_GRAPHS=$g"
    # ggml-cuda reads only whether the variable is set.
    if [ "$g" = 1 ]; then export GGML_CUDA_DISABLE_GRAPHS=1; else unset GGML_CUDA_DISABLE_GRAPHS; fi
    scripts/device-run.sh exec pocketmoe bench -m "$MODEL" --gpu 0 \
      --gpu-mem "$mem" -p 0 -n 128 --reps 3 --no-baseline 2>&1 | grep -E "tg128|graph stops" | cut -c1-300
    # The bench's own status (grep finding nothing is not a failure of it).
    r=${PIPESTATUS[0]}; [ "$r" = 0 ] || { echo "bench ($mem, graphs off=$g) FAILED, rc=$r"; rc=1; }
  done
  unset GGML_CUDA_DISABLE_GRAPHS
done
exit "$rc"
