#!/usr/bin/env bash
# Device: checks a change kept behaviour and speed: CUDA tests, serving, decode (`device.sh verify`).
#
# One device call that checks a change did not alter behaviour or speed on the H200:
#  1. the CUDA test executables named in TESTS (default: parity, offload, batch, graph_order),
#  2. with SERVE=1: pocketmoe-serve at 8 GiB under 1, 4 and 16 concurrent streams
#     (`pocketmoe serve-bench`, as in scripts/device-serve-compare.sh), with the expert cache's
#     figures per level (serve.md, ours-8GiB.json, ours-8GiB.metrics);
#  3. single-stream decode, resident and at 8 GiB (`pocketmoe bench -p 0 -n 128 --reps 3
#     --no-baseline`, calibrated routing), to set beside earlier sittings' figures.
# SKIP_BENCH=1 skips 3. Output under OUTDIR: tests.log, tests-summary.log, bench.md, verify.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: $0 OUTDIR}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
start=$(date +%s)
t() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUTDIR/verify.log"; }
RUN=scripts/device-run.sh
M=/tmp/pmoe-models/qwen3-30b-a3b-q4_k_m.gguf
mkdir -p /tmp/pmoe-models
$RUN pocketmoe --version > /dev/null || exit 1   # unpacks the build once, before two users race
rc=0   # every step runs even after another failed; any failure makes the exit status 1
# The subshell exits with the tests' status, for `wait` below.
(TESTS="${TESTS:-parity offload batch graph_order}" $RUN tests > "$OUTDIR/tests.log" 2>&1; r=$?; echo "tests rc=$r" >> "$OUTDIR/tests.log"; exit $r) &
tests=$!
if [ -s "$M" ] || $RUN pocketmoe synth --arch qwen3moe --preset qwen3-30b-a3b --quant q4_k_m -o "$M" > /dev/null 2>&1; then
  t "model ready"
else t "synth FAILED"; rc=1; fi
wait $tests || rc=1; t "$(tail -1 "$OUTDIR/tests.log")"
grep -E "^test |test result|slots:|cosine|FAILED|panicked" "$OUTDIR/tests.log" | tail -80 > "$OUTDIR/tests-summary.log"
# Serving and decode need the model (synth writes it whole or not at all).
[ -s "$M" ] || exit 1
PMOE=/tmp/pmoe
if [ "${SERVE:-0}" = 1 ]; then
  env LD_LIBRARY_PATH="$PMOE/lib:/usr/local/cuda/lib64" "$PMOE/bin/pocketmoe-serve" -m "$M" --port 8200 \
    --parallel 16 --ctx 1024 --gpu-mem 8GiB > "$OUTDIR/ours-8GiB.log" 2>&1 &
  pid=$!
  for _ in $(seq 360); do curl -sf localhost:8200/health > /dev/null && break; sleep 0.5; done
  if curl -sf localhost:8200/health > /dev/null; then t "server up"; else t "server did not come up"; rc=1; fi
  env LD_LIBRARY_PATH="$PMOE/lib:/usr/local/cuda/lib64" timeout 240 "$PMOE/bin/pocketmoe" serve-bench \
    --url http://127.0.0.1:8200 --label ours-8GiB --concurrency 1,4,16 --requests 3 --max-tokens 128 \
    --prompt-words 200 --metrics --json "$OUTDIR/ours-8GiB.json" 2>&1 | tee "$OUTDIR/serve.md"
  r=${PIPESTATUS[0]}; [ "$r" = 0 ] || { t "serve-bench FAILED, rc=$r"; rc=1; }   # timeout's 124 included
  echo "VRAM $(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | sort -n | tail -1) MiB" | tee -a "$OUTDIR/serve.md"
  curl -s localhost:8200/metrics | grep -v '^#' > "$OUTDIR/ours-8GiB.metrics"
  kill -INT $pid; wait $pid 2>/dev/null
  t "serve-bench done"
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit "$rc"
left=$(( ${LIMIT:-570} - ($(date +%s) - start) ))
$RUN exec timeout "$left" pocketmoe bench -m "$M" --gpu 0 --gpu-mem resident,8GiB -p 0 -n 128 \
  --reps 3 --no-baseline > "$OUTDIR/bench.md" 2> "$OUTDIR/bench.log"
r=$?; t "bench rc=$r"; [ "$r" = 0 ] || rc=1
cat "$OUTDIR/bench.md"
exit "$rc"
