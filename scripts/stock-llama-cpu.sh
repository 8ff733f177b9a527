#!/usr/bin/env bash
# Builds stock llama-bench for the CPU alone, as llama.cpp builds its CPU releases (no native
# flags, every CPU variant as a module picked at run time: GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS),
# from the same tree as ours (dist/stock/llama.cpp.tar.xz, scripts/stock-llama-tarball.sh), into
# $ROOT (default /tmp/stock-llama-cpu), and prints the binary's path on its last line. For the CPU
# rows of issue 30 on a machine without a GPU (~25 min on 2 cores):
#
#   LLAMA_BENCH=$(scripts/stock-llama-cpu.sh | tail -1)
#   pocketmoe bench -m olmoe.gguf --threads 2 -p 0 -n 64 --reps 3 --llama-bench "$LLAMA_BENCH"
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${ROOT:-/tmp/stock-llama-cpu}"
BIN="$ROOT/build/bin/llama-bench"
[ -s dist/stock/llama.cpp.tar.xz ] || scripts/stock-llama-tarball.sh >&2
sum=$(md5sum dist/stock/llama.cpp.tar.xz | cut -d' ' -f1)
if [ -x "$BIN" ] && [ "$(cat "$ROOT/.sum" 2>/dev/null)" = "$sum" ]; then
  echo "stock llama-bench (CPU): reusing $BIN" >&2
  echo "$BIN"; exit 0
fi
rm -rf "$ROOT" && mkdir -p "$ROOT"
tar -C "$ROOT" -xJf dist/stock/llama.cpp.tar.xz
start=$(date +%s)
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$ROOT/llama.cpp" -B "$ROOT/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF >"$ROOT/cmake.log" 2>&1 || { tail -30 "$ROOT/cmake.log" >&2; exit 1; }
cmake --build "$ROOT/build" -j"$(nproc)" --target llama-bench >"$ROOT/build.log" 2>&1 \
  || { tail -30 "$ROOT/build.log" >&2; exit 1; }
echo "$sum" > "$ROOT/.sum"
echo "stock llama-bench (CPU) built in $(( $(date +%s) - start )) s; modules: $(ls "$ROOT/build/bin" | grep -c '^libggml-cpu')" >&2
echo "$BIN"
