#!/usr/bin/env bash
# Fetches the tests' fixtures (real vocab GGUFs, chat templates) from PyPI into target/fixtures.
#
# Fetches test fixtures from registry packages (nothing is committed): the vocab-only GGUFs of
# real tokenizers (with llama.cpp's tokenizer test vectors, *.inp/*.out) and the real chat
# templates (models/templates/*.jinja) that the llama-cpp-python sdist on PyPI ships under
# vendor/llama.cpp/models/. Idempotent; prints the fixture folder.
#
#   scripts/fetch-fixtures.sh [DEST]     # default: target/fixtures
#
# Layout: DEST/vocab/ggml-vocab-*.gguf{,.inp,.out}, DEST/templates/*.jinja; each folder has a
# .complete-VERSION marker once fully extracted.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-${POCKETMOE_FIXTURES:-target/fixtures}}"
VERSION=0.3.36
if [ -f "$DEST/vocab/.complete-$VERSION" ] && [ -f "$DEST/templates/.complete-$VERSION" ]; then
  echo "$DEST"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/pypi-download.py llama-cpp-python "llama_cpp_python-$VERSION.tar.gz" \
  "$tmp/llama_cpp_python-$VERSION.tar.gz" >&2
models="llama_cpp_python-$VERSION/vendor/llama.cpp/models"
tar -xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp" --wildcards \
  "*/vendor/llama.cpp/models/ggml-vocab-*" "*/vendor/llama.cpp/models/templates/*.jinja"
mkdir -p "$DEST/vocab" "$DEST/templates"
cp "$tmp/$models"/ggml-vocab-* "$DEST/vocab/"
touch "$DEST/vocab/.complete-$VERSION"
cp "$tmp/$models"/templates/*.jinja "$DEST/templates/"
touch "$DEST/templates/.complete-$VERSION"
echo "$DEST"
