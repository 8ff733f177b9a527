#!/usr/bin/env bash
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
# The sdist's address from PyPI's simple index (JSON form), fetched with the standard library only
# (a bare Debian python3 has no pip), and checked against the index's sha256.
python3 - "$VERSION" "$tmp" >&2 <<'PY'
import hashlib, json, sys, urllib.request
ver, out = sys.argv[1], sys.argv[2]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=120))["files"]
sdist = next(f for f in files if f["filename"] == f"llama_cpp_python-{ver}.tar.gz")
name = f"{out}/{sdist['filename']}"
h = hashlib.sha256()
with urllib.request.urlopen(sdist["url"], timeout=600) as r, open(name, "wb") as f:
    while chunk := r.read(1 << 20):
        h.update(chunk)
        f.write(chunk)
if h.hexdigest() != sdist["hashes"]["sha256"]:
    sys.exit(f"{name}: sha256 {h.hexdigest()}, PyPI says {sdist['hashes']['sha256']}")
PY
models="llama_cpp_python-$VERSION/vendor/llama.cpp/models"
tar -xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp" --wildcards \
  "*/vendor/llama.cpp/models/ggml-vocab-*" "*/vendor/llama.cpp/models/templates/*.jinja"
mkdir -p "$DEST/vocab" "$DEST/templates"
cp "$tmp/$models"/ggml-vocab-* "$DEST/vocab/"
touch "$DEST/vocab/.complete-$VERSION"
cp "$tmp/$models"/templates/*.jinja "$DEST/templates/"
touch "$DEST/templates/.complete-$VERSION"
echo "$DEST"
