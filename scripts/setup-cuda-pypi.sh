#!/usr/bin/env bash
# Installs a CUDA 13.0 compiler toolchain from PyPI wheels into a venv.
#
# Installs a complete CUDA 13.0 compiler toolchain from PyPI wheels into a venv, for machines
# without a system CUDA toolkit (ours). Prints the environment to source afterwards.
#
#   scripts/setup-cuda-pypi.sh            # installs into ~/.cache/pocketmoe-cuda (idempotent)
#   source <(scripts/setup-cuda-pypi.sh --env)
#
# The wheels lack two things a normal toolkit has, and this script / the build work around both:
#   - no static cuBLAS (libcublas_static.a): ggml is built as shared libraries and links cuBLAS
#     dynamically (LLAMA_BUILD_SHARED_LIBS=1);
#   - no libcuda.so stub: ggml is built with GGML_CUDA_NO_VMM (feature `cuda-no-vmm`), so nothing
#     links the driver API at build time; the driver is found at run time.
set -euo pipefail
VENV="${POCKETMOE_CUDA_VENV:-$HOME/.cache/pocketmoe-cuda}"
PY="$VENV/bin/python"

cuda_root() { "$PY" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))'; }

print_env() {
  local root; root="$(cuda_root)"
  echo "export CUDA_PATH=$root"
  echo "export CUDA_HOME=$root"
  echo "export CUDACXX=$root/bin/nvcc"
  echo "export PATH=$root/bin:$VENV/bin:\$PATH"
  echo "export LIBRARY_PATH=$root/lib:\${LIBRARY_PATH:-}"
  echo "export LD_LIBRARY_PATH=$root/lib:\${LD_LIBRARY_PATH:-}"
}

if [ "${1:-}" = "--env" ]; then print_env; exit 0; fi

if [ ! -x "$PY" ]; then python3 -m venv "$VENV"; fi
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q cmake \
  nvidia-cuda-nvcc==13.0.88 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-crt==13.0.*' \
  'nvidia-nvvm==13.0.*' 'nvidia-cuda-cccl==13.0.*' 'nvidia-cublas==13.0.*'

ROOT="$(cuda_root)"
# CMake's FindCUDAToolkit and find_cuda_helper look in lib64; the wheels use lib.
[ -e "$ROOT/lib64" ] || ln -s lib "$ROOT/lib64"
# Unversioned names for the linker (wheels ship only libfoo.so.13).
for f in "$ROOT"/lib/lib*.so.*; do
  base="${f%%.so.*}.so"
  [ -e "$base" ] || ln -s "$(basename "$f")" "$base"
done
"$ROOT/bin/nvcc" --version | tail -n 2
echo "CUDA toolkit ready under $ROOT; environment: source <($0 --env)"
