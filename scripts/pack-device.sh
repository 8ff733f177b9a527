#!/usr/bin/env bash
# Packs the CUDA build as dist/device.tar.xz pieces for the device machine.
#
# Packs the CUDA build (scripts/build-cuda.sh) for the device machine: binaries, test executables
# and the stripped shared ggml/llama libraries, as dist/device.tar.xz split into 15 MiB pieces
# (dist/ is git-ignored; name it in the device tool's `carry`). Prints the packed size.
# TESTS="offload parity" packs only those test executables (TESTS="" none): the whole pack with
# every test is near the device tool's 64 MiB limit on what one call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${POCKETMOE_CUDA_TARGET:-$HOME/.cache/pocketmoe-target-cuda}/release"
stage=$(mktemp -d)
mkdir -p "$stage/pmoe/bin" "$stage/pmoe/lib" "$stage/pmoe/tests"
cp "$T/pocketmoe" "$T/pocketmoe-serve" "$stage/pmoe/bin/"
while read -r exe; do
  [ -n "$exe" ] || continue
  name=$(basename "$exe"); name=${name%-*}
  if [ -n "${TESTS+set}" ] && ! grep -qw "$name" <<<"$TESTS"; then continue; fi
  cp "$exe" "$stage/pmoe/tests/$name"
done < "$T/test-executables.txt"
# The one ggml/llama build that llama-cpp-sys-4 made (shared: LLAMA_BUILD_SHARED_LIBS=1), which
# its build script links into the profile directory.
libdir=$T
[ -e "$libdir/libggml-base.so.0" ] || { echo "no libggml-base.so.0 in $libdir: run scripts/build-cuda.sh" >&2; exit 1; }
# Only the sonames the binaries ask for (libggml.so.0, ...), one real file each.
for f in "$libdir"/lib*.so.[0-9]; do
  case "$(basename "$f")" in libllama-common*) continue ;; esac  # nothing of ours links it
  cp -L "$f" "$stage/pmoe/lib/"
done
strip --strip-unneeded "$stage"/pmoe/bin/* "$stage"/pmoe/tests/* "$stage"/pmoe/lib/* 2>/dev/null || true
mkdir -p dist && rm -f dist/device.tar.xz*   # dist/stock/ (the opponent's source) stays
tar -C "$stage" -cf - pmoe | xz -T0 -6 > dist/device.tar.xz
(cd dist && split -b 15M -d device.tar.xz device.tar.xz.part && rm device.tar.xz)
rm -rf "$stage"
du -cb dist/* | tail -1 | awk '{printf "packed: %.1f MiB in dist/\n", $1/1048576}'
ls -l dist
