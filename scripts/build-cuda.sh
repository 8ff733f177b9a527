#!/usr/bin/env bash
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
# CPU kernels: llama-cpp-sys-2 compiles one ggml-cpu, statically, for the Rust target
# (x86-64-v3 = AVX2 by default). This build is for the device, a Sapphire Rapids host, so it adds
# the ISA of ggml's own `sapphirerapids` variant (the one a GGML_CPU_ALL_VARIANTS build of
# llama.cpp picks there at run time: AVX-512 F/VBMI/VNNI/BF16 + AMX tile/int8) through the GGML_*
# CMake options that llama-cpp-sys-2 passes through from the environment. `pocketmoe self-check`
# prints the variant, and refuses to run on a host without these instructions.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CUDA_PATH:-}" ] || [ ! -x "${CUDA_PATH}/bin/nvcc" ]; then
  scripts/setup-cuda-pypi.sh >/dev/null
  # shellcheck disable=SC1090
  source <(scripts/setup-cuda-pypi.sh --env)
fi
export CARGO_TARGET_DIR="${POCKETMOE_CUDA_TARGET:-$HOME/.cache/pocketmoe-target-cuda}"
export CMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}"
# The PyPI toolkit has no static cuBLAS: build ggml/llama as shared libraries.
export LLAMA_BUILD_SHARED_LIBS=1
case "${CPU_VARIANT:-sapphirerapids}" in
  haswell) ;;
  icelake) export GGML_AVX512=ON GGML_AVX512_VBMI=ON GGML_AVX512_VNNI=ON ;;
  sapphirerapids)
    export GGML_AVX512=ON GGML_AVX512_VBMI=ON GGML_AVX512_VNNI=ON GGML_AVX512_BF16=ON \
      GGML_AMX_TILE=ON GGML_AMX_INT8=ON ;;
  *) echo "CPU_VARIANT must be haswell, icelake or sapphirerapids" >&2; exit 2 ;;
esac
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
