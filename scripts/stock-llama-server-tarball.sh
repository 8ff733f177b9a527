#!/usr/bin/env bash
# Packs the stock llama-server source (llama-cpp-python 0.3.36's tree) for the device.
#
# The opponent's server: the llama.cpp tree vendored in the PyPI sdist llama-cpp-python==0.3.36
# (its tools/server is complete), trimmed to what building llama-server needs (no other GPU
# backends, models, docs, web UI sources, tests), packed as dist/stock/llama-server.tar.xz for the
# device machine, which has no network. Nothing of it is committed; this script fetches it again.
#
#   scripts/stock-llama-server-tarball.sh      # then carry dist/ to the device
#   scripts/device-stock-server.sh             # (on the device) builds stock llama-server
set -euo pipefail
cd "$(dirname "$0")/.."
VER="${STOCK_LCP_VERSION:-0.3.36}"
out=dist/stock/llama-server.tar.xz
[ -s "$out" ] && [ "$(cat dist/stock/server-version 2>/dev/null)" = "$VER" ] && { echo "$out (cached)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$tmp" \
  || { echo "pip download llama-cpp-python==$VER failed" >&2; exit 1; }
tar -C "$tmp" -xzf "$tmp/llama_cpp_python-$VER.tar.gz"
src="$tmp/llama_cpp_python-$VER/vendor/llama.cpp"
[ -f "$src/tools/server/server.cpp" ] || { echo "no tools/server in llama-cpp-python $VER" >&2; exit 1; }
# Not needed to build: model vocabularies, docs, test data, the web UI's npm sources (the build
# embeds an empty UI table without them: -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF).
rm -rf "$src/models" "$src/docs" "$src/benches" "$src/tools/server/tests" "$src/tools/server/bench" \
  "$src/.git"* "$src/media"
find "$src/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name '*.in' \
  ! -name sources.cmake -exec rm -rf {} +
# shellcheck source=scripts/stock-common.sh
source scripts/stock-common.sh
pack_trimmed "$src" "$out"
echo "$VER" > dist/stock/server-version
du -h "$out"
