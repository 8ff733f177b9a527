#!/usr/bin/env python3
"""Downloads one file of a PyPI project to OUT, checked against the index's sha256, with python3's
standard library only (a bare Debian python3 has no pip). The file's address comes from PyPI's
simple index in its JSON form.

    scripts/pypi-download.py PROJECT FILENAME OUT
"""
import hashlib, json, sys, urllib.request

project, filename, out = sys.argv[1:4]
req = urllib.request.Request(f"https://pypi.org/simple/{project}/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=120))["files"]
entry = next(f for f in files if f["filename"] == filename)
h = hashlib.sha256()
with urllib.request.urlopen(entry["url"], timeout=600) as r, open(out, "wb") as f:
    while chunk := r.read(1 << 20):
        h.update(chunk)
        f.write(chunk)
if h.hexdigest() != entry["hashes"]["sha256"]:
    sys.exit(f"{out}: sha256 {h.hexdigest()}, PyPI says {entry['hashes']['sha256']}")
