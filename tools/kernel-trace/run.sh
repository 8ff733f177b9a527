#!/usr/bin/env bash
# Runs CMD... with the kernel tracer injected (built by tools/kernel-trace/build.sh into dist/ktrace,
# dist/ carried to the device). Traces go to $KTRACE_OUT (default ./ktrace-%p.csv, %p the pid).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
d=/tmp/ktrace; mkdir -p "$d"
[ -s "$d/libcupti.so.13" ] || xz -dc "$here/dist/ktrace/libcupti.so.13.xz" > "$d/libcupti.so.13"
cp "$here/dist/ktrace/libktrace.so" "$d/"
export CUDA_INJECTION64_PATH="$d/libktrace.so"
exec "$@"
