#!/usr/bin/env bash
# DeepSeek-V4 on the H200 (issue 14), in two device calls (the machine stays warm between them;
# /tmp keeps the build, the stock llama-bench and the model):
#
#   scripts/device-dsv4.sh prep  OUTDIR   # stock llama-bench build (background), the CUDA
#                                         # deepseek4 parity tests, the V4-Flash-shape file, a smoke run
#   scripts/device-dsv4.sh bench OUTDIR   # pocketmoe bench beside stock llama-bench: resident and
#                                         # at the per-block share of 24 GiB and 22 GiB
#
# The file: DeepSeek-V4-Flash's shape in the seed's quant mix (routed gate/up IQ2_XXS, down Q2_K,
# the rest Q8_0), BLOCKS (default 21) of its 43 blocks: the whole file is ~80 GiB and the device
# has a 64 GiB disk. The budgets scale with the blocks kept (BUDGETS, default 24 and 22 GiB times
# 21/43: each block gets the VRAM it would get in the whole model at those budgets).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
phase="${1:?usage: $0 prep|bench OUTDIR}"
OUTDIR="${2:?usage: $0 prep|bench OUTDIR}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
start=$(date +%s)
t() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUTDIR/dsv4.log"; }
RUN=scripts/device-run.sh
BLOCKS="${BLOCKS:-21}"
M=/tmp/pmoe-models/dsv4-flash-${BLOCKS}-seed.gguf
mkdir -p /tmp/pmoe-models
$RUN pocketmoe --version > /dev/null || exit 1
rc=0   # every step runs even after another failed; any failure makes the exit status 1
case "$phase" in
  prep)
    # The subshell exits with the build's status, for `wait` below.
    (scripts/device-stock-llama.sh > "$OUTDIR/stock-build.log" 2>&1; r=$?; echo "stock rc=$r" >> "$OUTDIR/stock-build.log"; exit $r) &
    stock=$!
    TESTS="parity_long parity" $RUN tests --ignored cuda > "$OUTDIR/tests.log" 2>&1
    r=$?; t "tests rc=$r"; [ "$r" = 0 ] || rc=1
    grep -E "^test |test result|cosine|FAILED|panicked" "$OUTDIR/tests.log" | tail -40
    [ -s "$M" ] || $RUN pocketmoe synth --arch deepseek4 --preset "deepseek-v4-flash:$BLOCKS" \
      --quant dsv4-seed -o "$M" 2>&1 | tail -8 | tee "$OUTDIR/synth.log" || { t "synth FAILED"; rc=1; }
    t "model ready: $(du -h "$M" | cut -f1)"
    # timeout's 124 counts as a failure like any other.
    $RUN exec timeout 150 pocketmoe bench -m "$M" --gpu 0 --gpu-mem resident -p 512 -n 32 --reps 1 \
      --no-baseline > "$OUTDIR/smoke.md" 2> "$OUTDIR/smoke.log"
    r=$?; t "smoke rc=$r"; [ "$r" = 0 ] || rc=1
    cat "$OUTDIR/smoke.md"; tail -5 "$OUTDIR/smoke.log"
    wait $stock || rc=1; t "$(tail -1 "$OUTDIR/stock-build.log")"
    ;;
  bench)
    # Stock llama-bench is what this phase compares with: no point going on without it.
    LB=$(scripts/device-stock-llama.sh 2>> "$OUTDIR/stock-build.log" | tail -1) \
      || { t "stock llama-bench build FAILED (see stock-build.log)"; exit 1; }
    BUDGETS="${BUDGETS:-resident,$(( 24 * 1024 * BLOCKS / 43 ))MiB,$(( 22 * 1024 * BLOCKS / 43 ))MiB}"
    t "budgets $BUDGETS; llama-bench $LB"
    left=$(( ${LIMIT:-560} - ($(date +%s) - start) ))
    $RUN exec timeout "$left" pocketmoe bench -m "$M" --gpu 0 --gpu-mem "$BUDGETS" \
      -p "${PP:-2048}" -n "${TG:-128}" --reps 3 --ubatch 2048 --llama-bench "$LB" \
      --json "$OUTDIR/bench.json" > "$OUTDIR/bench.md" 2> "$OUTDIR/bench.log"
    r=$?; t "bench rc=$r"; [ "$r" = 0 ] || rc=1
    cat "$OUTDIR/bench.md"; tail -5 "$OUTDIR/bench.log"
    ;;
  *) echo "usage: $0 prep|bench OUTDIR" >&2; exit 2 ;;
esac
exit "$rc"
