#!/usr/bin/env python3
"""Summary of a per-stop trace (`POCKETMOE_STOP_TRACE=FILE`, src/experts/offload/trace.rs).

Where a decode step's host time goes, stop by stop (host clock, means per stop, us), over the
last --last steps of each run in the file (a run: one engine; bench runs one per budget):

- wait -> routed: the host waits for the routing (the GPU's work up to the router, its read);
- routed -> decided: the stop's host logic (prefetch plan, hit flag read, cache, CPU/PCIe split);
- decided -> done: the calls that queue its copies, control words and gate (and a CPU join);
- done -> next wait: between stops (gated: queueing the next stops' pieces, ggml-cuda's launch).

    python3 tools/stop-trace.py [--last 100] TRACE.csv
"""
import argparse
import collections
import csv
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--last", type=int, default=100, help="steps summarised per run, from the end")
    a = ap.parse_args()
    runs = collections.defaultdict(list)
    with open(a.trace, newline="") as f:
        for r in csv.DictReader(f):
            runs[r["run"]].append(r)
    for run, rows in runs.items():
        steps = sorted({int(r["step"]) for r in rows})
        keep = set(steps[-a.last:])
        rows = [r for r in rows if int(r["step"]) in keep]
        f = lambda r, k: float(r[k])
        cols = collections.defaultdict(list)
        kinds = collections.Counter(r["kind"] for r in rows)
        for i, r in enumerate(rows):
            cols["wait -> routed"].append(f(r, "routed") - f(r, "wait"))
            if f(r, "decided") > 0:
                cols["routed -> decided"].append(f(r, "decided") - f(r, "routed"))
                cols["decided -> done"].append(f(r, "done") - f(r, "decided"))
            else:
                cols["routed -> done (no decided)"].append(f(r, "done") - f(r, "routed"))
            nxt = rows[i + 1] if i + 1 < len(rows) else None
            if nxt is not None and nxt["step"] == r["step"]:
                cols["done -> next wait"].append(f(nxt, "wait") - f(r, "done"))
            cols["misses"].append(f(r, "misses"))
            cols["to the CPU"].append(f(r, "cpu"))
            cols["passed (fast)"].append(f(r, "fast"))
        by_step = collections.defaultdict(list)
        for r in rows:
            by_step[r["step"]].append(r)
        spans = [f(s[-1], "done") - f(s[0], "wait") for s in by_step.values()]
        starts = sorted(f(s[0], "wait") for s in by_step.values())
        period = statistics.median(b - a_ for a_, b in zip(starts, starts[1:])) if len(starts) > 1 else 0
        print(
            f"run {run}: {len(keep)} steps, {len(rows) / max(1, len(keep)):.1f} stops a step "
            f"({dict(kinds)}); step period (median) {period:.0f} us, first wait -> last done {statistics.mean(spans):.0f} us"
        )
        for k, v in cols.items():
            print(f"  {k:<28} mean {statistics.mean(v):8.1f}  median {statistics.median(v):8.1f}  sum/step {sum(v) / len(keep):9.1f}")
        # Table form: stops the GPU passed on its own against those that took the host's path.
        for name, fast in (("passed on the GPU", "1"), ("took the host's path", "0")):
            rs = [r for r in rows if r["fast"] == fast and f(r, "decided") > 0]
            if rs and len(rs) < len(rows):
                logic = statistics.median(f(r, "decided") - f(r, "routed") for r in rs)
                calls = statistics.median(f(r, "done") - f(r, "decided") for r in rs)
                print(f"  {name}: {len(rs) / len(keep):.1f} a step, median routed -> decided {logic:.1f}, decided -> done {calls:.1f}")
        ordered = sorted(by_step, key=int)
        tails = [f(by_step[b][0], "wait") - f(by_step[a][-1], "done") for a, b in zip(ordered, ordered[1:])]
        if tails:
            print(f"  last stop done -> next step's first wait: median {statistics.median(tails):.1f}")


if __name__ == "__main__":
    main()
