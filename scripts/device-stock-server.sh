#!/usr/bin/env bash
# Device: builds stock llama-server and prints a wrapper's path (`device.sh build-stock-server`).
#
# On the device machine: builds stock llama-server from dist/stock/llama-server.tar.xz
# (scripts/stock-llama-server-tarball.sh) with llama.cpp's own CUDA release options, into
# /tmp/stock-server (reused while the machine stays warm), and prints a wrapper's path on its last
# line (the wrapper runs it with its own libraries only: device-run.sh puts ours on
# LD_LIBRARY_PATH). ~6 min cold with 16 cores.
#
# CUDA=0: the CPU release build instead (every CPU variant, no CUDA), into ROOT (default
# /tmp/stock-server-cpu): stock llama-server for a machine without a GPU (~25 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CUDA:-1}" = 0 ]; then
  cuda=(-DGGML_CUDA=OFF); ROOT="${ROOT:-/tmp/stock-server-cpu}"
else
  cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); ROOT="${ROOT:-/tmp/stock-server}"
fi
BIN="$ROOT/build/bin/llama-server"
WRAP="$ROOT/llama-server"
sum=$(md5sum dist/stock/llama-server.tar.xz | cut -d' ' -f1)
wrap() {
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s:/usr/local/cuda/lib64 exec %s "$@"\n' "$ROOT/build/bin" "$BIN" > "$WRAP"
  chmod 755 "$WRAP"; echo "$WRAP"
}
if [ -x "$BIN" ] && [ "$(cat "$ROOT/.sum" 2>/dev/null)" = "$sum" ]; then
  echo "stock llama-server: reusing $BIN" >&2; wrap; exit 0
fi
rm -rf "$ROOT" && mkdir -p "$ROOT"
tar -C "$ROOT" -xJf dist/stock/llama-server.tar.xz
export PATH="/usr/local/cuda/bin:$PATH"
start=$(date +%s)
cmake -S "$ROOT/llama.cpp" -B "$ROOT/build" -G Ninja "${cuda[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$ROOT/cmake.log" 2>&1 \
  || { tail -30 "$ROOT/cmake.log" >&2; exit 1; }
ninja -C "$ROOT/build" -j"$(nproc)" llama-server >"$ROOT/ninja.log" 2>&1 || { tail -30 "$ROOT/ninja.log" >&2; exit 1; }
# (ggml depends on every backend module with GGML_BACKEND_DL: CUDA and the CPU variants come along.)
[ "${CUDA:-1}" = 0 ] || ls "$ROOT"/build/bin/libggml-cuda.so >/dev/null || { echo "no libggml-cuda.so was built" >&2; exit 1; }
echo "$sum" > "$ROOT/.sum"
echo "stock llama-server built in $(( $(date +%s) - start )) s; modules: $(ls "$ROOT/build/bin" | grep -c '^libggml-')" >&2
wrap
