#!/usr/bin/env bash
# Builds PocketMoE with CUDA here (PyPI toolkit, no system CUDA) into a persistent target dir.
#
# Builds PocketMoE with CUDA on this machine (no system CUDA needed: the PyPI toolkit from
# scripts/setup-cuda-pypi.sh), binaries and test executables, into a persistent target dir.
#
#   scripts/build-cuda.sh                 # sm_90 (the H200), ~21 min cold on 2 cores, seconds warm
#   CMAKE_CUDA_ARCHITECTURES="86;90" scripts/build-cuda.sh
#
#   CPU_VARIANT=haswell scripts/build-cuda.sh   # CPU kernels for another host (default below)
#
# Then scripts/pack-device.sh packs what the device needs into dist/.
#
# CPU kernels: llama-cpp-sys-4 compiles one ggml-cpu with every GGML_AVX*/AMX option OFF and passes
# no GGML_* option through; the ISA reaches it as C/C++ flags (through the cc crate into its CMake
# build), and ggml picks its kernels by the compiler's __AVX512F__ / __AMX_INT8__ ... macros. This
# build is for the device, a Sapphire Rapids host, so it uses the ISA of ggml's own
# `sapphirerapids` variant (the one a GGML_CPU_ALL_VARIANTS build of llama.cpp picks there at run
# time: AVX-512 F/VBMI/VNNI/BF16 + AMX tile/int8) less AMX, which is ggml's `zen4` set (the name
# `pocketmoe self-check` prints; it refuses to run on a host without these instructions).
#
# No AMX: with -mamx-* ggml-cpu adds its AMX buffer type first among the extra (repack) buffer
# types, and on the device every CPU-only engine with repacked weights, ours and libllama's in
# our test binaries, died of SIGILL at the first AMX `tilezero` (scripts/probe/sigill-where.c
# named it; Firecracker guest, kernel 6.18, 2026-12-02). AMX serves only MUL_MAT (never the
# experts' MUL_MAT_ID), and at the offload settings stock's AVX2 module was as fast as its AMX
# one (docs/bench-h200.md), so the AVX-512 kernels lose nothing we measure.
#
# CMake options that llama-cpp-sys-4 does not forward (it takes only LLAMA_*) go in a toolchain
# file, which the cmake crate passes from $CMAKE_TOOLCHAIN_FILE and CMake reads before ggml's own
# defaults: the CUDA architectures (else ggml builds six of them) and GGML_CUDA_NO_VMM (the PyPI
# wheels have no libcuda.so stub to link the driver API against; the driver is found at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
# cmake, C/C++, libclang (bindgen): a fresh machine has none of them (2026-12-06: the build died
# in llama-cpp-sys-4's bindgen, "Unable to find libclang").
scripts/setup.sh --build
if [ -z "${CUDA_PATH:-}" ] || [ ! -x "${CUDA_PATH}/bin/nvcc" ]; then
  scripts/setup-cuda-pypi.sh >/dev/null
  # shellcheck disable=SC1090
  source <(scripts/setup-cuda-pypi.sh --env)
fi
export CARGO_TARGET_DIR="${POCKETMOE_CUDA_TARGET:-$HOME/.cache/pocketmoe-target-cuda}"
mkdir -p "$CARGO_TARGET_DIR"
# extra-kernels reads the architectures from here (ggml-cuda from the toolchain file below).
export CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}"
# The PyPI toolkit has no static cuBLAS: build ggml/llama as shared libraries.
export LLAMA_BUILD_SHARED_LIBS=1
isa="-march=x86-64-v3"
case "${CPU_VARIANT:-sapphirerapids}" in
  haswell) ;;
  icelake) isa="$isa -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw -mavx512vbmi -mavx512vnni" ;;
  sapphirerapids)
    isa="$isa -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw -mavx512vbmi -mavx512vnni"
    isa="$isa -mavx512bf16" ;;
  *) echo "CPU_VARIANT must be haswell, icelake or sapphirerapids" >&2; exit 2 ;;
esac
export CFLAGS_x86_64_unknown_linux_gnu="$isa" CXXFLAGS_x86_64_unknown_linux_gnu="$isa"
# llama-cpp-sys-4 keeps its CMake build in a cache keyed by crate features, not C flags, and skips
# configuring when a CMakeCache.txt exists, and cargo does not rerun its build script when C flags
# change: an ISA change would never reach ggml-cpu. Drop a cache configured with other flags and
# the crate's build-script state (ninja then rebuilds only what the flags change).
for c in "$CARGO_TARGET_DIR"/llama-cmake-cache/*/build/CMakeCache.txt; do
  [ -f "$c" ] || continue
  if [ "$(sed -n 's/^CMAKE_C_FLAGS:STRING=.*-march=/-march=/p' "$c")" != "$isa" ]; then
    echo "ISA changed to '$isa': reconfiguring $c" >&2
    rm -f "$c"
    cargo clean --release -p llama-cpp-sys-4
  fi
done
tc="$CARGO_TARGET_DIR/pocketmoe-cuda-toolchain.cmake"
cat > "$tc.new" <<EOT
set(CMAKE_CUDA_ARCHITECTURES "$CMAKE_CUDA_ARCHITECTURES")
set(GGML_CUDA_NO_VMM ON CACHE BOOL "no libcuda stub in the PyPI toolkit" FORCE)
EOT
if cmp -s "$tc.new" "$tc"; then rm "$tc.new"; else mv "$tc.new" "$tc"; fi
export CMAKE_TOOLCHAIN_FILE="$tc"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$(date +%s)
cargo build --release --features cuda --bins
cargo test --release --features cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' > "$CARGO_TARGET_DIR/release/test-executables.txt"
echo "built in $(( $(date +%s) - start )) s; test executables:"
cat "$CARGO_TARGET_DIR/release/test-executables.txt"
