#!/usr/bin/env bash
# Device: builds stock llama-bench of the same llama.cpp tree and prints its path (`device.sh build-stock`).
#
# On the device machine: builds stock llama-bench from dist/stock/llama.cpp.tar.xz
# (scripts/stock-llama-tarball.sh) exactly as llama.cpp builds itself for CUDA releases, into
# /tmp/stock-llama (kept while the machine stays warm: a second call right after reuses it), and
# prints the binary's path on its last line. ~5.5 min cold with 16 cores.
#
#   LLAMA_BENCH=$(scripts/device-stock-llama.sh | tail -1)
#   pocketmoe bench ... --llama-bench "$LLAMA_BENCH"     # or POCKETMOE_LLAMA_BENCH=...
#
# CUDA=0: the CPU release build instead (every CPU variant, OpenMP, no CUDA), into ROOT (default
# /tmp/stock-llama-cpu): issue 30's CPU comparison on a machine without a GPU, stock llama-bench
# of the same tree beside `pocketmoe bench` (~12 min on the 2-core dev box).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CUDA:-1}" = 0 ]; then
  cuda=(-DGGML_CUDA=OFF); ROOT="${ROOT:-/tmp/stock-llama-cpu}"
else
  cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); ROOT="${ROOT:-/tmp/stock-llama}"
fi
BIN="$ROOT/build/bin/llama-bench"
# A wrapper that runs it with its own libraries only (device-run.sh puts our libggml/libllama on
# LD_LIBRARY_PATH, which would shadow stock's RUNPATH).
WRAP="$ROOT/llama-bench"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s:/usr/local/cuda/lib64 exec %s "$@"\n' "$ROOT/build/bin" "$BIN" > /tmp/stock-llama-wrapper
sum=$(md5sum dist/stock/llama.cpp.tar.xz | cut -d' ' -f1)
if [ -x "$BIN" ] && [ "$(cat "$ROOT/.sum" 2>/dev/null)" = "$sum" ]; then
  echo "stock llama-bench: reusing $BIN" >&2
  install -m 755 /tmp/stock-llama-wrapper "$WRAP"; echo "$WRAP"; exit 0
fi
rm -rf "$ROOT" && mkdir -p "$ROOT"
tar -C "$ROOT" -xJf dist/stock/llama.cpp.tar.xz
export PATH="/usr/local/cuda/bin:$PATH"
start=$(date +%s)
cmake -S "$ROOT/llama.cpp" -B "$ROOT/build" -G Ninja "${cuda[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$ROOT/cmake.log" 2>&1 \
  || { tail -30 "$ROOT/cmake.log" >&2; exit 1; }
# (ggml depends on every backend module with GGML_BACKEND_DL: CUDA and the CPU variants come along.)
ninja -C "$ROOT/build" -j"$(nproc)" llama-bench >"$ROOT/ninja.log" 2>&1 || { tail -30 "$ROOT/ninja.log" >&2; exit 1; }
echo "$sum" > "$ROOT/.sum"
echo "stock llama-bench built in $(( $(date +%s) - start )) s; modules: $(ls "$ROOT/build/bin" | grep -c '^libggml-')" >&2
install -m 755 /tmp/stock-llama-wrapper "$WRAP"; echo "$WRAP"
