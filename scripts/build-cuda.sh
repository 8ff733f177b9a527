#!/usr/bin/env bash
# Builds PocketMoE with CUDA on this machine (no system CUDA needed: the PyPI toolkit from
# scripts/setup-cuda-pypi.sh), binaries and test executables, into a persistent target dir.
#
#   scripts/build-cuda.sh                 # sm_90 (the H200), ~21 min cold on 2 cores, seconds warm
#   CMAKE_CUDA_ARCHITECTURES="86;90" scripts/build-cuda.sh
#
# Then scripts/pack-device.sh packs what the device needs into dist/.
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
