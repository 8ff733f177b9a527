#!/usr/bin/env bash
# Device: prints the path of a synthetic model, synthesising it once (`device.sh model`).
#
# The device scripts' synthetic model: prints the path of /tmp/pmoe-models/PRESET-QUANT[-skewS].gguf,
# synthesising it first (through scripts/device-run.sh) when it is not there yet.
#   M=$(scripts/device-model.sh ARCH PRESET QUANT [SKEW]) || exit 1
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
arch=${1:?usage: scripts/device-model.sh ARCH PRESET QUANT [SKEW]} preset=${2:?} quant=${3:?} skew=${4:-}
m="/tmp/pmoe-models/$preset-$quant${skew:+-skew$skew}.gguf"
if [ ! -s "$m" ]; then
  mkdir -p /tmp/pmoe-models
  scripts/device-run.sh pocketmoe synth --arch "$arch" --preset "$preset" --quant "$quant" \
    ${skew:+--routing-skew "$skew"} -o "$m" >&2 || exit 1
fi
echo "$m"
