#!/usr/bin/env bash
# Builds the kernel tracer (trace.c) into dist/ktrace/ with the CUPTI library it needs, from the
# PyPI wheels (nvidia-cuda-cupti; cuda.h from scripts/setup-cuda-pypi.sh's toolkit). On the
# device, with dist/ carried (CUPTI travels xz-compressed: the carry limit is 64 MiB):
#   KTRACE_OUT=$OUT/t-%p.csv tools/kernel-trace/run.sh CMD...
#   python3 tools/kernel-trace/summarise.py $OUT/t-*.csv
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="$HOME/.cache/pocketmoe-cupti"
if [ ! -f "$cache/nvidia/cu13/lib/libcupti.so.13" ]; then
  mkdir -p "$cache"
  python3 -m pip download -q --no-deps -d "$cache" 'nvidia-cuda-cupti==13.0.*'
  (cd "$cache" && python3 -m zipfile -e nvidia_cuda_cupti-*.whl .)
fi
scripts/setup-cuda-pypi.sh >/dev/null
cuda_h=$(find "$HOME/.cache/pocketmoe-cuda" -path '*cu13/include/cuda.h' | head -1)
[ -n "$cuda_h" ] || { echo "no cuda.h from scripts/setup-cuda-pypi.sh" >&2; exit 1; }
mkdir -p dist/ktrace
xz -T0 -6 -c "$cache/nvidia/cu13/lib/libcupti.so.13" > dist/ktrace/libcupti.so.13.xz
gcc -O2 -Wall -Werror -shared -fPIC -I "$cache/nvidia/cu13/include" -I "$(dirname "$cuda_h")" \
  -o dist/ktrace/libktrace.so tools/kernel-trace/trace.c \
  -L "$cache/nvidia/cu13/lib" -l:libcupti.so.13 -lpthread -Wl,-rpath,'$ORIGIN'
ls -l dist/ktrace
