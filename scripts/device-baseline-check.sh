#!/usr/bin/env bash
# Issue 13's culprit hunt, on the device machine: why `pocketmoe bench`'s in-process llama.cpp
# decoded 3-4x slower than stock llama-bench. One decode setting (tg128, the in-process search's
# choice at BUDGET, default 8GiB, micro-batch 512), each cause toggled alone, REPS repetitions:
#
#   in-process, no CPU thread pool (the old baseline: POCKETMOE_BASELINE_THREADPOOL=0)
#   in-process, thread pool attached as llama-bench does (the fix)
#   stock llama-bench, best CPU variant (sapphirerapids: AVX-512 + AMX), OpenMP
#   stock llama-bench, only the haswell (AVX2) CPU variant: what the ISA alone is worth
#
#   scripts/device-baseline-check.sh MODEL OUTDIR     # needs dist/ (our build + dist/stock)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
MODEL="${1:?usage: scripts/device-baseline-check.sh MODEL OUTDIR}"
OUTDIR="${2:?usage: scripts/device-baseline-check.sh MODEL OUTDIR}"
mkdir -p "$OUTDIR"
BUDGET="${BUDGET:-8GiB}"; REPS="${REPS:-3}"; T="${THREADS:-16}"
LLAMA_BENCH=$(scripts/device-stock-llama.sh | tail -1) || exit 1
log="$OUTDIR/baseline-check.log"
rc=0   # each row runs even after another failed; any failure makes the exit status 1
inproc() {
  scripts/device-run.sh exec env POCKETMOE_BASELINE_THREADPOOL="$1" pocketmoe bench -m "$MODEL" \
    --baseline-child --gpu 0 --gpu-mem "$BUDGET" -p 0 -n 128 --reps "$REPS" --threads "$T" \
    --ubatch 512 2>>"$log" | tail -1 > "$OUTDIR/inproc-threadpool$1.json"
  local run=$?
  [ "$run" = 0 ] || echo "in-process, threadpool=$1: bench FAILED, rc=$run (see $log)"
  python3 - "$OUTDIR/inproc-threadpool$1.json" "$1" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1])):
    for m in s["results"]:
        print(f"in-process, threadpool={sys.argv[2]}: {s['label']} {m['test']} {m['mean']:.1f} ± {m['std']:.1f} t/s ({s['status']})")
PY
  local py=$?
  return $(( run || py ))
}
inproc 0 | tee -a "$OUTDIR/summary.txt" || rc=1
inproc 1 | tee -a "$OUTDIR/summary.txt" || rc=1
# The setting the search chose, for stock.
ncmoe=$(python3 -c 'import json,sys; s=[x for x in json.load(open(sys.argv[1])) if x["status"]=="ran"]; print(s[0]["n_cpu_moe"])' "$OUTDIR/inproc-threadpool1.json") \
  || { echo "no in-process setting ran: no --n-cpu-moe for stock" | tee -a "$OUTDIR/summary.txt"; exit 1; }
stock() {
  local bin="$1" what="$2"
  "$bin" -m "$MODEL" -ngl 99 -sm none -mg 0 --n-cpu-moe "$ncmoe" -ub 512 -b 2048 -t "$T" \
    -r "$REPS" -p 0 -n 128 -o json 2>>"$log" > "$OUTDIR/stock-$what.json"
  local run=$?
  [ "$run" = 0 ] || echo "stock llama-bench ($what): FAILED, rc=$run (see $log)"
  python3 - "$OUTDIR/stock-$what.json" "$what" "$ncmoe" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"stock llama-bench ({sys.argv[2]}): --n-cpu-moe {sys.argv[3]} -ub 512 tg{r['n_gen']} {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} t/s; cpu {r.get('cpu_info','')}")
PY
  local py=$?
  return $(( run || py ))
}
stock "$LLAMA_BENCH" best-variant | tee -a "$OUTDIR/summary.txt" || rc=1
# A copy of the binaries with only the haswell CPU module: ggml loads the best variant it finds.
hw=/tmp/stock-llama/haswell-only
rm -rf "$hw" && mkdir -p "$hw" && cp -a /tmp/stock-llama/build/bin/. "$hw/"
find "$hw" -name 'libggml-cpu-*.so' ! -name 'libggml-cpu-haswell.so' -delete
ls "$hw" | grep cpu >> "$log"
stock "$hw/llama-bench" haswell-only | tee -a "$OUTDIR/summary.txt" || rc=1
cat "$OUTDIR/summary.txt"
exit "$rc"
