#!/usr/bin/env bash
# Device: the bench matrix, ours beside stock llama-bench, with the resident floor guard (`device.sh bench`).
#
# The standard bench matrix on the device machine (the H200), in one run of under 10 minutes:
# synthesises the Qwen3-30B-A3B shape in q4_k_m (default routing skew) and runs
# `pocketmoe bench` for both engines at: resident, --gpu-mem 12GiB, --gpu-mem 8GiB;
# pp512, pp4096, tg128 at depth 0 and 8192. Uses the packed CUDA build through
# scripts/device-run.sh (same unpacking and environment), from the repo root with dist/ carried:
#
#   scripts/device-bench.sh "$OUT"      # OUT = the device tool's output folder
#
# Writes OUTDIR/bench.md (the markdown tables), bench.json (rewritten after each budget, so a run
# cut short still leaves its figures), bench.png (the plot) and bench.log (progress, llama.cpp's
# settings search). REPS (default 3), BUDGETS (default resident,12GiB,8GiB), PRESET (default
# qwen3-30b-a3b; `tiny` for a dry run of the plumbing) and SKEW (synth --routing-skew; default the
# synth default, 0 = uniform routing), PROMPTS (default 512,4096) and DEPTHS (default 0,8192)
# override the matrix. ARCH (default qwen3moe) and QUANT (default q4_k_m) pick another model,
# e.g. ARCH=gpt-oss PRESET=gpt-oss-20b QUANT=mxfp4. EXTRA adds arguments to `pocketmoe bench`
# (e.g. EXTRA=--no-miss-balance; its label goes in the table's setting column).
#
# Stock llama.cpp beside it: with dist/stock/llama.cpp.tar.xz carried (scripts/stock-llama-tarball.sh),
# stock llama-bench is built first (scripts/device-stock-llama.sh, ~5.5 min, reused while the
# machine stays warm) and `pocketmoe bench --llama-bench` runs it at every setting the in-process
# search chose; the table then compares with the faster of the two and shows both. STOCK=0 skips it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-bench.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PRESET="${PRESET:-qwen3-30b-a3b}"
ARCH="${ARCH:-qwen3moe}"; QUANT="${QUANT:-q4_k_m}"
start=$(date +%s)
MODEL=$(scripts/device-model.sh "$ARCH" "$PRESET" "$QUANT" "${SKEW:-}") || exit 1
echo "synth done at $(( $(date +%s) - start )) s" | tee "$OUTDIR/bench.log"
LLAMA_BENCH=
if [ "${STOCK:-1}" != 0 ] && [ -s dist/stock/llama.cpp.tar.xz ]; then
  LLAMA_BENCH=$(scripts/device-stock-llama.sh 2> >(tee -a "$OUTDIR/bench.log" >&2) | tail -1) || exit 1
  echo "stock llama-bench ready at $(( $(date +%s) - start )) s: $LLAMA_BENCH" | tee -a "$OUTDIR/bench.log"
fi
# Through device-run.sh's `exec` for its environment; stdout (the table) goes to bench.md, stderr
# (progress) to the log. `timeout` keeps the whole run inside the device tool's 10 minutes.
scripts/device-run.sh exec bash -c '
  timeout "$6" pocketmoe bench -m "$1" --gpu 0 --gpu-mem "$3" \
    -p "${PROMPTS:-512,4096}" -n 128 --depth "${DEPTHS:-0,8192}" --reps "$4" \
    ${5:+--llama-bench "$5"} $7 --json "$2/bench.json" --plot "$2/bench.png" > "$2/bench.md"
' _ "$MODEL" "$OUTDIR" "${BUDGETS:-resident,12GiB,8GiB}" "${REPS:-3}" "$LLAMA_BENCH" \
  "$(( ${DEADLINE:-570} - ($(date +%s) - start) ))" "${EXTRA:-}" 2>&1 | tee -a "$OUTDIR/bench.log"
rc=${PIPESTATUS[0]}
cat "$OUTDIR/bench.md"
# The floor guard: every resident tg row against stock llama.cpp (the faster of in-process and
# stock llama-bench); below FLOOR (default 0.95) x stock is a failure (docs/bench-h200.md).
if [ -s "$OUTDIR/bench.json" ]; then
  python3 - "$OUTDIR/bench.json" "${FLOOR:-0.95}" <<'PY' | tee -a "$OUTDIR/bench.log" || rc=1
import json, sys
rep, floor = json.load(open(sys.argv[1])), float(sys.argv[2])
bad = 0
for r in rep["rows"]:
    if r["budget"] is not None or not r["test"].startswith("tg"):
        continue
    if r["ours_tok_s"] is None or r["llama_tok_s"] is None:
        print(f"floor: resident {r['test']} @ d{r['depth']}: no figure to compare"); bad = 1; continue
    ratio = r["ours_tok_s"] / r["llama_tok_s"]
    ok = ratio >= floor
    bad |= not ok
    print(f"floor: resident {r['test']} @ d{r['depth']}: ours {r['ours_tok_s']:.1f} vs llama.cpp "
          f"{r['llama_tok_s']:.1f} tok/s = {ratio:.3f}x {'ok' if ok else 'BELOW'} (floor {floor}x)")
sys.exit(bad)
PY
fi
echo "device-bench: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/bench.log"
exit "$rc"
