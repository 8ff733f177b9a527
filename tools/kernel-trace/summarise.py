#!/usr/bin/env python3
"""Per-decode-step summary of kernel traces from tools/kernel-trace (trace.c's CSV).

A step ends when the logits come back to the host: the device-to-host copy of the size most
common among copies of at least 64 KiB (n_vocab x 4 bytes; --logits-bytes to name it). The last
--last steps of each trace are summarised: wall time per step, GPU busy time (union of kernel
intervals), kernel count, then kernels and runtime API calls by name, per step. With several
traces the tables are side by side, first trace first.

    python3 tools/kernel-trace/summarise.py [--last 128] [--top 25] A.csv [B.csv ...]
"""
import argparse
import collections
import csv
import re
import sys


def short(name):
    # Drop template and parameter lists: "void mul_mat_q<(ggml_type)12, 64, false>(...)" -> mul_mat_q<12,64,false>
    n = re.sub(r"^void ", "", name)
    n = re.sub(r"\(ggml_type\)", "", n)
    n = re.sub(r"\(.*$", "", n) if "<" not in n.split("(")[0] else n.split(">(")[0] + ">"
    return n[:90]


def load(path, logits_bytes, last):
    kern, copies, api, cmdline = [], [], [], ""
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0].startswith("#"):
                cmdline = ",".join(row)[1:].strip()
                continue
            t, s, e = row[0], int(row[1]), int(row[2])
            if t == "k":
                kern.append((s, e, short(row[5])))
            elif t == "m":
                copies.append((s, e, int(row[4]), int(row[5])))
            elif t in "rd":
                api.append((s, e, row[5]))
    dtoh = [c for c in copies if c[2] == 2]
    if logits_bytes is None:
        sizes = collections.Counter(c[3] for c in dtoh if c[3] >= 65536)
        if not sizes:
            sys.exit(f"{path}: no device-to-host copy of 64 KiB or more (the logits): name --logits-bytes")
        logits_bytes = sizes.most_common(1)[0][0]
    ends = sorted(c[1] for c in dtoh if c[3] == logits_bytes)
    if len(ends) < last + 1:
        sys.exit(f"{path}: {len(ends)} logits copies, fewer than --last {last} + 1")
    ends = ends[-(last + 1):]
    lo, hi = ends[0], ends[-1]
    kern = sorted(k for k in kern if lo < k[0] and k[1] <= hi)
    copies = [c for c in copies if lo < c[0] and c[1] <= hi]
    api = [a for a in api if lo < a[0] and a[1] <= hi]
    # GPU busy: union of kernel intervals (several streams may overlap).
    busy, cur_s, cur_e = 0, None, None
    gaps = []  # GPU idle intervals between kernels (ns)
    # Idle time by the kernels on either side of the gap (what the GPU waited to start, after
    # what): a gated step's waits show as gaps before its gathers, flag or experts kernels.
    before = collections.defaultdict(lambda: [0, 0])
    prev_name = None
    for s, e, n in kern:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append(s - cur_e)
                b = before[f"{prev_name} -> {n}"]
                b[0] += 1
                b[1] += s - cur_e
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
        if e >= cur_e:
            prev_name = n
    if cur_e is not None:
        busy += cur_e - cur_s
    ks = collections.defaultdict(lambda: [0, 0])
    for s, e, n in kern:
        ks[n][0] += 1
        ks[n][1] += e - s
    apis = collections.defaultdict(lambda: [0, 0])
    for s, e, n in api:
        apis[n][0] += 1
        apis[n][1] += e - s
    cp = collections.defaultdict(lambda: [0, 0, 0])  # kind -> count, bytes, ns
    for s, e, kind, nbytes in copies:
        cp[kind][0] += 1
        cp[kind][1] += nbytes
        cp[kind][2] += e - s
    return {
        "copies": cp,
        "gaps": gaps,
        "path": path,
        "cmdline": cmdline,
        "steps": last,
        "logits_bytes": logits_bytes,
        "wall_us": (hi - lo) / 1e3 / last,
        "busy_us": busy / 1e3 / last,
        "kern_us": sum(v[1] for v in ks.values()) / 1e3 / last,
        "n_kern": len(kern) / last,
        "kernels": ks,
        "before": before,
        "api": apis,
    }


def table(title, traces, key, top):
    names = collections.Counter()
    for t in traces:
        for n, (c, d) in t[key].items():
            names[n] = max(names[n], d)
    print(f"\n{title} (per step: count, us)")
    head = "".join(f"{'#' + str(i):>8}{'us':>9}" for i in range(len(traces)))
    print(f"{'name':<92}{head}")
    for n, _ in names.most_common(top):
        cells = ""
        for t in traces:
            c, d = t[key].get(n, (0, 0))
            cells += f"{c / t['steps']:>8.1f}{d / 1e3 / t['steps']:>9.1f}"
        print(f"{n:<92}{cells}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--last", type=int, default=128, help="steps summarised, from the end")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--logits-bytes", type=int)
    a = ap.parse_args()
    ts = [load(p, a.logits_bytes, a.last) for p in a.traces]
    for i, t in enumerate(ts):
        print(
            f"#{i} {t['path']} ({t['cmdline'][:160]}): {t['steps']} steps (logits {t['logits_bytes']} B): "
            f"wall {t['wall_us']:.1f} us/step ({1e6 / t['wall_us']:.1f} tok/s), GPU busy {t['busy_us']:.1f}, "
            f"kernel sum {t['kern_us']:.1f}, {t['n_kern']:.1f} kernels/step, idle {t['wall_us'] - t['busy_us']:.1f}"
        )
    kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
    for i, t in enumerate(ts):
        n = t["steps"]
        cps = ", ".join(
            f"{kinds.get(k, k)} {c / n:.1f} x, {b / n / 1e6:.2f} MB, {d / n / 1e3:.1f} us"
            for k, (c, b, d) in sorted(t["copies"].items())
        )
        g = t["gaps"]
        bins = [(0, 5), (5, 20), (20, 50), (50, 200), (200, 10**9)]
        gs = ", ".join(
            f"{lo}-{hi if hi < 10**9 else 'inf'} us: {sum(1 for x in g if lo * 1e3 <= x < hi * 1e3) / n:.1f} x "
            f"{sum(x for x in g if lo * 1e3 <= x < hi * 1e3) / n / 1e3:.0f} us"
            for lo, hi in bins
        )
        print(f"#{i} copies per step: {cps or 'none'}")
        print(f"#{i} GPU idle gaps per step: {gs}")
    table("kernels", ts, "kernels", a.top)
    table("GPU idle by the kernels around it (previous -> next)", ts, "before", a.top)
    table("runtime API", ts, "api", a.top)


if __name__ == "__main__":
    main()
