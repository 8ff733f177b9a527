#!/usr/bin/env bash
# Device: the GPU checks of a llama.cpp pin move in one call (`device.sh tree-checks`).
#
# The GPU checks of a llama.cpp pin move, in one device run of under 10 minutes, from the repo
# root with dist/ carried (scripts/pack-device.sh, scripts/stock-llama-tarball.sh):
#
#   scripts/device-tree-checks.sh "$OUT"
#
# - `pocketmoe self-check` (CPU variant, devices, quantised matvec on CUDA);
# - the CUDA test executables that compare with libllama or hold an invariant on the GPU
#   (TESTS overrides): parity (every arch, quantised mixes), parity_long (deepseek32/deepseek4
#   long prompts, DSA's n_kv_max bound), graph_order, offload, batch, vram_budget (device use
#   within --gpu-mem), ggml_smoke; run with --nocapture so the parity figures are in the log;
# - scripts/device-replay-check.sh: CUDA-graph replay bit-exact against graphs off, every arch,
#   resident and offloaded;
# - beside them, stock llama-bench from the same tree (scripts/device-stock-llama.sh), ready for
#   scripts/device-bench.sh while the machine stays warm.
# Writes OUTDIR/{self-check.txt,tests.log,replay.log,stock-build.log,summary.txt}; exits 1 when
# any step fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-tree-checks.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
start=$(date +%s)
rc=0
stock=
if [ -s dist/stock/llama.cpp.tar.xz ]; then
  (scripts/device-stock-llama.sh >"$OUTDIR/stock-build.log" 2>&1) &
  stock=$!
fi
step() { echo "$1: rc=$2 at $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/summary.txt"; [ "$2" = 0 ] || rc=1; }
scripts/device-run.sh pocketmoe self-check >"$OUTDIR/self-check.txt" 2>&1
step self-check $?
TESTS="${TESTS:-ggml_smoke graph_order parity parity_long offload batch vram_budget}" \
  timeout "${TESTS_TIMEOUT:-360}" scripts/device-run.sh tests --nocapture >"$OUTDIR/tests.log" 2>&1
step tests $?
timeout "${REPLAY_TIMEOUT:-150}" scripts/device-replay-check.sh "$OUTDIR/replay" >"$OUTDIR/replay.log" 2>&1
step replay $?
if [ -n "$stock" ]; then
  wait "$stock"
  step stock-build $?
fi
{
  echo "== failing tests"; grep -E "^test .*FAILED|^== .*FAILED|panicked" "$OUTDIR/tests.log" | head -20
  echo "== test results"; grep -E "^== |^test result" "$OUTDIR/tests.log"
  echo "== parity"; grep -E "min cosine|max \|dlogit\|" "$OUTDIR/tests.log" | head -60
  echo "== vram"; grep -E "budget .* MiB" "$OUTDIR/tests.log"
  echo "== replay"; cat "$OUTDIR/replay.log"
} >>"$OUTDIR/summary.txt"
cat "$OUTDIR/summary.txt"
exit "$rc"
