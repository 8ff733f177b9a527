#!/usr/bin/env bash
# Device: pocketmoe-serve against stock llama-server, same GGUF and sitting (`device.sh serve-compare`).
#
# pocketmoe-serve against stock llama-server on the device machine (issue 17 item 10), same GGUF
# (the synthetic Qwen3-30B-A3B shape, q4_k_m), same machine, same sitting, in two device calls
# that must follow each other while the machine is warm (/tmp holds the builds and models):
#
#   scripts/device-serve-compare.sh prep  "$OUT"   # builds llama-server (bg), synthesises the
#       models, checks the zero-config start (no flags), measures our 8 GiB server's VRAM and
#       finds llama-server's best fitting --n-cpu-moe for the same VRAM
#   scripts/device-serve-compare.sh bench "$OUT"   # `pocketmoe serve-bench` on each server
#
# Both servers: 16 slots of 1,024 tokens (ours --parallel 16 --ctx 1024; llama-server -np 16
# -c 16384), default threads, greedy. Load: `pocketmoe serve-bench --concurrency 1,4,16
# --requests 3 --max-tokens 128 --prompt-words 200` (every prompt distinct, so no prefix cache
# helps; one warm-up request first). VRAM is the server process's, from nvidia-smi.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PHASE="${1:?usage: $0 prep|bench OUTDIR}"; OUTDIR="${2:?}"; mkdir -p "$OUTDIR"; OUTDIR=$(cd "$OUTDIR" && pwd)
ST=/tmp/serve-compare; mkdir -p "$ST" /tmp/pmoe-models
M=/tmp/pmoe-models/qwen3-30b-a3b-q4_k_m.gguf
M0=/tmp/pmoe-models/qwen3-30b-a3b-q4_k_m-skew0.gguf
RUN=scripts/device-run.sh
start=$(date +%s)
t() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUTDIR/compare.log"; }

vram() { nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | sort -n | tail -1; }
wait_up() { # port, seconds, pid
  for _ in $(seq $(( $2 * 2 ))); do
    curl -sf "localhost:$1/health" > /dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
stop() { kill -INT "$1" 2>/dev/null; for _ in $(seq 40); do kill -0 "$1" 2>/dev/null || return; sleep 0.25; done; kill -9 "$1" 2>/dev/null; }
# The servers run directly (not under device-run.sh's pipe) so that PID is the server itself.
$RUN pocketmoe --version > /dev/null || exit 1   # unpacks the build into /tmp/pmoe
PMOE=/tmp/pmoe
rc=0   # every step runs even after another failed; any failure makes the exit status 1
command -v nvidia-smi > /dev/null || { echo "no nvidia-smi: cannot measure VRAM" >&2; exit 1; }
ours() { # port model log [args]; sets PID
  local port=$1 model=$2 log=$3; shift 3
  LD_LIBRARY_PATH="$PMOE/lib:/usr/local/cuda/lib64" "$PMOE/bin/pocketmoe-serve" -m "$model" \
    --port "$port" --parallel 16 --ctx 1024 "$@" > "$log" 2>&1 &
  PID=$!
}
# Ours with 16 slots and no --ctx: the context the server picks itself (the model's trained
# context where it fits), to show that a large context does not slow concurrent decode.
# shellcheck disable=SC2317  # called as $kind in the bench phase
oursauto() { # port model log [args]; sets PID
  local port=$1 model=$2 log=$3; shift 3
  LD_LIBRARY_PATH="$PMOE/lib:/usr/local/cuda/lib64" "$PMOE/bin/pocketmoe-serve" -m "$model" \
    --port "$port" --parallel 16 "$@" > "$log" 2>&1 &
  PID=$!
}
stock() { # port model log [args]; sets PID
  local port=$1 model=$2 log=$3; shift 3
  "$(cat "$ST/llama-server")" -m "$model" --port "$port" -np 16 -c 16384 "$@" > "$log" 2>&1 &
  PID=$!
}

case "$PHASE" in
prep)
  (scripts/device-stock-server.sh > "$OUTDIR/stock-build.log" 2>&1 && tail -1 "$OUTDIR/stock-build.log" > "$ST/llama-server") &
  build=$!
  # The CUDA offload and batch tests meanwhile (TESTS="" skips them).
  # The subshell exits with the tests' status, for `wait` below.
  (TESTS="${TESTS-offload batch}"; r=0
   if [ -n "$TESTS" ]; then TESTS="$TESTS" $RUN tests > "$OUTDIR/tests.log" 2>&1; r=$?; echo "tests rc=$r" >> "$OUTDIR/tests.log"
   else echo "tests skipped (TESTS empty)" >> "$OUTDIR/tests.log"; fi; exit $r) &
  tests=$!
  [ -s "$M" ] || $RUN pocketmoe synth --arch qwen3moe --preset qwen3-30b-a3b --quant q4_k_m -o "$M" > /dev/null 2>&1 \
    || { t "synth $M FAILED"; rc=1; }
  [ -s "$M0" ] || $RUN pocketmoe synth --arch qwen3moe --preset qwen3-30b-a3b --quant q4_k_m --routing-skew 0 -o "$M0" > /dev/null 2>&1 \
    || { t "synth $M0 FAILED"; rc=1; }
  t "models: $(ls -la "$M" "$M0" | awk '{print $5}' | tr '\n' ' ')"
  # Zero-config: no flags but the model (default port 8000).
  LD_LIBRARY_PATH="$PMOE/lib:/usr/local/cuda/lib64" "$PMOE/bin/pocketmoe-serve" -m "$M" \
    > "$OUTDIR/zero-config.log" 2>&1 &
  pid=$!
  if wait_up 8000 180 $pid; then
    t "zero-config: up, VRAM $(vram) MiB"
    curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \
      -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":16}' > "$OUTDIR/zero-config-reply.json"
    curl -s localhost:8000/props > "$OUTDIR/zero-config-props.json"
    t "zero-config: $(grep -m1 '^context' "$OUTDIR/zero-config.log")"
  else t "zero-config: did not come up"; rc=1; fi
  stop $pid; wait $pid 2>/dev/null
  # Our 8 GiB server: its real VRAM is the target llama-server has to fit.
  ours 8081 "$M" "$OUTDIR/ours-8g-probe.log" --gpu-mem 8GiB; pid=$PID
  if wait_up 8081 180 "$pid"; then
    curl -s localhost:8081/v1/completions -H 'content-type: application/json' \
      -d '{"prompt":"Hello","max_tokens":8}' > /dev/null
    echo "$(vram)" > "$ST/ours-vram"; t "ours 8GiB: VRAM $(cat "$ST/ours-vram") MiB"
  else t "ours 8GiB did not come up"; echo 8192 > "$ST/ours-vram"; rc=1; fi
  stop "$pid"; wait "$pid" 2>/dev/null
  wait $tests || rc=1; t "$(tail -1 "$OUTDIR/tests.log")"
  grep -E "^test |test result|slots:|cosine" "$OUTDIR/tests.log" | tail -60 > "$OUTDIR/tests-summary.log"
  wait $build || { t "llama-server build failed"; tail -20 "$OUTDIR/stock-build.log"; exit 1; }
  t "llama-server: $(cat "$ST/llama-server")"
  # Best fitting --n-cpu-moe: the fewest layers' experts on the CPU with VRAM <= ours, <= 8 GiB.
  target=$(( $(cat "$ST/ours-vram") > 8192 ? $(cat "$ST/ours-vram") : 8192 ))
  probe() { local pid; stock 8082 "$M" "$OUTDIR/stock-fit-$1.log" -ngl 99 --n-cpu-moe "$1"; pid=$PID
    if wait_up 8082 120 "$pid"; then
      curl -s localhost:8082/v1/completions -H 'content-type: application/json' -d '{"prompt":"Hello","max_tokens":8}' > /dev/null
      V=$(vram); else V=999999; fi; stop "$pid"; wait "$pid" 2>/dev/null; }
  n=34; per=$(( $(stat -c %s "$M") / 48 / 1048576 ))
  declare -A seen
  for _ in 1 2 3 4 5; do
    [ -n "${seen[$n]:-}" ] && break
    probe $n; v=$V; seen[$n]=$v; t "llama-server --n-cpu-moe $n: VRAM $v MiB (target $target)"
    if [ "$v" -gt "$target" ]; then n=$(( n + ( (v - target) + per - 1 ) / per ));
    else n=$(( n - 1 )); fi
  done
  best=48; for k in "${!seen[@]}"; do [ "${seen[$k]}" -le "$target" ] && [ "$k" -lt "$best" ] && best=$k; done
  echo "$best" > "$ST/ncpumoe"; t "best fitting --n-cpu-moe: $best"
  exit "$rc"
  ;;
bench)
  [ -s "$ST/llama-server" ] || { echo "run the prep phase first (in this warm sitting)"; exit 1; }
  nc=$(cat "$ST/ncpumoe")
  port=8100
  one() { # label kind model [args]; fails when the server does not come up or serve-bench fails
    local label=$1 kind=$2 model=$3; shift 3; port=$((port + 1))
    local pid; $kind $port "$model" "$OUTDIR/$label.log" "$@"; pid=$PID
    if ! wait_up $port 240 "$pid"; then t "$label did not come up"; tail -5 "$OUTDIR/$label.log"; stop "$pid"; return 1; fi
    t "$label up"
    local metrics=; [ "$kind" != stock ] && metrics=--metrics
    LD_LIBRARY_PATH="$PMOE/lib:/usr/local/cuda/lib64" timeout 200 "$PMOE/bin/pocketmoe" serve-bench --url "http://127.0.0.1:$port" --label "$label" \
      --concurrency 1,4,16 --requests 3 --max-tokens 128 --prompt-words 200 $metrics \
      --json "$OUTDIR/$label.json" 2>&1 | tee -a "$OUTDIR/table.md"
    local sb=${PIPESTATUS[0]}   # serve-bench's status (timeout's 124 included), not tee's
    [ "$sb" = 0 ] || t "$label: serve-bench FAILED, rc=$sb"
    t "$label: VRAM $(vram) MiB"; echo "VRAM $(vram) MiB" >> "$OUTDIR/table.md"
    [ "$kind" != stock ] && curl -s localhost:$port/metrics | grep -v '^#' > "$OUTDIR/$label.metrics"
    stop "$pid"; wait "$pid" 2>/dev/null
    return "$sb"
  }
  # ROWS picks and orders the rows (default: all); a row is skipped when less than 100 s of the
  # call's 600 s are left. A skipped, failed or unknown row makes the exit status 1.
  for row in ${ROWS:-ours-resident stock-resident ours-8GiB stock-8GiB ours-resident-autoctx ours-8GiB-skew0 stock-8GiB-skew0}; do
    [ $(( $(date +%s) - start )) -gt 500 ] && { t "skipped $row: out of time"; rc=1; continue; }
    case $row in
      ours-resident) one ours-resident ours "$M" ;;
      stock-resident) one stock-resident stock "$M" -ngl 99 ;;
      ours-8GiB) one ours-8GiB ours "$M" --gpu-mem 8GiB ;;
      stock-8GiB) one "stock-ncpumoe$nc" stock "$M" -ngl 99 --n-cpu-moe "$nc" ;;
      ours-resident-autoctx) one ours-resident-autoctx oursauto "$M" ;;
      ours-8GiB-skew0) one ours-8GiB-skew0 ours "$M0" --gpu-mem 8GiB ;;
      stock-8GiB-skew0) one "stock-ncpumoe$nc-skew0" stock "$M0" -ngl 99 --n-cpu-moe "$nc" ;;
      *) t "unknown row $row"; false ;;
    esac || rc=1
  done
  t "done"
  exit "$rc"
  ;;
*) echo "usage: $0 prep|bench OUTDIR" >&2; exit 2 ;;
esac
