#!/usr/bin/env bash
# Aggregate generation throughput of pocketmoe-serve at 1, 4 and 16 concurrent streams, on the
# device machine (packed CUDA build, see scripts/device-run.sh), with plain curl:
#
#   scripts/device-serve-bench.sh MODEL.gguf OUTDIR [extra pocketmoe-serve args, e.g. --gpu-mem 12GiB]
#
# Each stream asks /v1/completions for 128 tokens (greedy). Prints, per concurrency, the wall
# time, the completion tokens the server reported, and their ratio (aggregate tok/s).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
MODEL="${1:?usage: $0 MODEL OUTDIR [serve args]}"; OUTDIR="${2:?}"; shift 2
mkdir -p "$OUTDIR"
PORT=8077
scripts/device-run.sh exec pocketmoe-serve --model "$MODEL" --gpu 0 --port $PORT --parallel 16 \
  --ctx 1024 "$@" > "$OUTDIR/serve.log" 2>&1 &
for _ in $(seq 600); do
  curl -sf "localhost:$PORT/health" > /dev/null && break
  sleep 0.5
done
curl -sf "localhost:$PORT/health" > /dev/null || { echo "server did not come up"; tail -20 "$OUTDIR/serve.log"; exit 1; }
name=$(basename "$MODEL" .gguf)
body='{"model":"'"$name"'","prompt":"Once upon a time, in a land far away,","max_tokens":128,"temperature":0}'
# Warm-up.
curl -s "localhost:$PORT/v1/completions" -H 'content-type: application/json' -d "$body" > /dev/null
# The loop runs in a subshell (it is piped to tee): it exits 1 when any request failed or came
# back without completion tokens, after every level has run.
(
rc=0
for n in 1 4 16; do
  start=$(date +%s.%N)
  pids=()
  for i in $(seq "$n"); do
    curl -s "localhost:$PORT/v1/completions" -H 'content-type: application/json' -d "$body" \
      > "$OUTDIR/r$n-$i.json" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  end=$(date +%s.%N)
  cat "$OUTDIR"/r$n-*.json | grep -o '"completion_tokens":[0-9]*' | cut -d: -f2 |
    awk -v n="$n" -v t="$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" \
      '{s+=$1} END{printf "%d streams: %d tokens in %.2f s = %.1f tok/s\n", n, s, t, s/t}'
  ok=$(grep -l '"completion_tokens":[1-9]' "$OUTDIR"/r$n-*.json | wc -l)
  [ "$ok" = "$n" ] || { echo "$n streams: FAILED, $ok of $n requests returned tokens"; rc=1; }
done
exit $rc
) | tee "$OUTDIR/serve-bench.txt"
rc=${PIPESTATUS[0]}
curl -s "localhost:$PORT/metrics" | grep -v '^#' | head -40 > "$OUTDIR/metrics.txt"
pkill -INT -f 'pocketmoe-serve --model'; wait 2>/dev/null
exit "$rc"
