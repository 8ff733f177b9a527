#!/usr/bin/env bash
# Device: the server's prompt cache reuses a shared prefix, resident and offloaded (`device.sh prompt-cache`).
#
# The server's prompt cache on the device (CUDA), resident and offloaded: a request whose prompt
# shares a long prefix with its slot's last one must reuse it (`timings.cache_n` > 0, `prompt_n`
# only the rest), and should answer what the same request answers on another slot with
# `cache_prompt: false` (greedy). On CUDA the reused run evaluates only the suffix, a pass of
# another shape than the full prompt's, so its logits may differ in the last bits (as
# llama-server's do); the check reports where the two texts part rather than failing on it.
# From the repo root with dist/ carried (scripts/pack-device.sh):
#
#   scripts/device-prompt-cache.sh "$OUT"      # BUDGETS (default resident,8GiB)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-prompt-cache.sh OUTDIR}"
mkdir -p "$OUTDIR"
M=$(scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m) || exit 1
rc=0
for budget in $(echo "${BUDGETS:-resident,8GiB}" | tr ',' ' '); do
  args=(-m "$M" --port 18080 -np 2 -c 8192)
  [ "$budget" != resident ] && args+=(--gpu-mem "$budget")
  scripts/device-run.sh exec pocketmoe-serve "${args[@]}" > "$OUTDIR/serve-$budget.log" 2>&1 &
  pid=$!
  python3 - "$budget" <<'PY' | tee -a "$OUTDIR/prompt-cache.txt" || rc=1
import json, sys, time, urllib.request
budget, url = sys.argv[1], "http://127.0.0.1:18080"
for _ in range(300):
    try:
        urllib.request.urlopen(url + "/health", timeout=2); break
    except Exception:
        time.sleep(1)
else:
    print(f"{budget}: the server never became healthy"); sys.exit(1)
def completion(prompt, slot, cache):
    body = {"prompt": prompt, "n_predict": 32, "temperature": 0, "id_slot": slot,
            "cache_prompt": cache}
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))
prefix = " ".join(f"item {i} is {i * 7 % 13} and" for i in range(150))
a, b = prefix + " the first question", prefix + " another, different question"
completion(a, 0, True)
warm = completion(b, 0, True)
cold = completion(b, 1, False)
tw, tc = warm["timings"], cold["timings"]
same = warm["content"] == cold["content"]
part = next((i for i, (x, y) in enumerate(zip(warm["content"], cold["content"])) if x != y), None)
print(f"{budget}: reused {tw['cache_n']} of {tw['cache_n'] + tw['prompt_n']} prompt tokens "
      f"(prompt {tw['prompt_ms']:.1f} ms vs {tc['prompt_ms']:.1f} ms without the cache; cold cache_n "
      f"{tc['cache_n']}); texts {'identical' if same else f'part at character {part}'}")
if tw["cache_n"] <= 0 or tc["cache_n"] != 0:
    print(f"{budget}: FAILED: the prefix was not reused, or cache_prompt=false reused"); sys.exit(1)
PY
  pkill -x pocketmoe-serve 2>/dev/null; kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; sleep 2
done
exit "$rc"
