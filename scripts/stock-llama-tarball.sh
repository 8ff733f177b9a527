#!/usr/bin/env bash
# Packs the stock llama.cpp source of our pin (llama-cpp-sys-4 0.11.0) for the device.
#
# The opponent's source: the llama.cpp tree of the crates.io package llama-cpp-sys-4 0.11.0
# (ggml 0.28, tools/llama-bench complete), trimmed of the GPU backends other than CUDA, packed as
# dist/stock/llama.cpp.tar.xz (~4 MiB) for the device machine, which has no network. Nothing of it
# is committed; this script fetches it from crates.io again on any machine.
#
#   scripts/stock-llama-tarball.sh            # then carry dist/ to the device
#   scripts/device-stock-llama.sh             # (on the device) builds stock llama-bench from it
set -euo pipefail
cd "$(dirname "$0")/.."
VER="${STOCK_SYS4_VERSION:-0.11.0}"
out=dist/stock/llama.cpp.tar.xz
[ -s "$out" ] && [ "$(cat dist/stock/version 2>/dev/null)" = "$VER" ] && { echo "$out (cached)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -sSfL -o "$tmp/sys4.crate" \
  "https://static.crates.io/crates/llama-cpp-sys-4/llama-cpp-sys-4-$VER.crate"
tar -C "$tmp" -xzf "$tmp/sys4.crate"
src="$tmp/llama-cpp-sys-4-$VER/llama.cpp"
[ -f "$src/tools/llama-bench/llama-bench.cpp" ] || { echo "no tools/llama-bench in $VER" >&2; exit 1; }
# shellcheck source=scripts/stock-common.sh
source scripts/stock-common.sh
pack_trimmed "$src" "$out"
echo "$VER" > dist/stock/version
du -h "$out"
