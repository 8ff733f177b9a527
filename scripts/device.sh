#!/usr/bin/env bash
# The device machine's (H200) one entry point: `scripts/device.sh SUBCOMMAND ARGS...` runs one job.
#
# Run from the repo root of the copied working tree with dist/ carried (scripts/pack-device.sh;
# dist/stock/*.tar.xz from scripts/stock-llama-tarball.sh and stock-llama-server-tarball.sh for
# the stock builds). Each subcommand is one of the scripts below (their headers say the details
# and the environment variables they take); a failure prints "device.sh SUBCOMMAND: FAILED" with
# the exit status and exits with it. OUT is the device tool's output folder.
#
#   build-stock                  stock llama-bench of the same llama.cpp tree (device-stock-llama.sh)
#   build-stock-server           stock llama-server (device-stock-server.sh)
#   bench OUT                    the bench matrix beside stock llama-bench (device-bench.sh)
#   floor OUT                    resident tg128 floor guard: Qwen3-30B-A3B and GPT-OSS-20B vs stock
#   rows OUT                     issue 30's decode rows beside stock (uniform, calibrated, GPT-OSS-20B)
#   tests [FILTER]               the packed CUDA test executables, TESTS="a b" picks (device-run.sh)
#   verify OUT                   tests + (SERVE=1) serving + decode figures (device-verify.sh)
#   serve-compare prep|bench OUT pocketmoe-serve vs stock llama-server (device-serve-compare.sh)
#   replay OUT                   CUDA-graph replay = direct execution (device-replay-check.sh)
#   tree-checks OUT              the GPU checks of a llama.cpp pin move (device-tree-checks.sh)
#   prompt-cache OUT             the server's prompt cache, resident and offloaded (device-prompt-cache.sh)
#   decode-ab OUT                A/B of the offloaded decode paths, ours only (device-decode-ab.sh)
#   gated OUT                    gated decode on CUDA: its tests under a timeout, then the A/B
#   auto OUT                     Gated::Auto's duel against each of its arms, uniform and calibrated
#   table OUT                    table form (POCKETMOE_TABLE=1): CUDA tests as built, in table form, without ggml fusion; the A/B (PARTS, FLAVOURS)
#   multi OUT                    several GPUs: multi_device tests, -sm layer/tensor vs stock (device-multi.sh)
#   floor-trace OUT              resident decode kernel by kernel, CUPTI (device-floor-trace.sh)
#   profile OUT                  nsys summaries of offloaded and resident decode (device-decode-profile.sh)
#   stops OUT                    where a cache-hit step's time goes: per-stop traces and kernel traces, gated forms vs resident
#   model ARCH PRESET QUANT [SKEW]  path of the synthetic model, made once (device-model.sh)
#   hang-probe OUT CMD...        CMD under a watchdog: its threads' states should it hang (device-hang-probe.sh)
#   sitting OUT                  stock built beside the offload tests, then the decode A/B and the floor beside stock
#   table-hang OUT               table form at uniform routing under the watchdog: as built, capture guard off, with eager loading, with no PDL
#   prefetch OUT                 where PCIe is the busy channel: gated and the hook path at fixed slack setpoints and with the setpoint's outer loop (the default), the hook path at two prefetch shares; uniform routing, GPT-OSS-20B at 4 GiB
#   run pocketmoe|exec ARGS...   the packed build's CLI or any command in its environment (device-run.sh)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
sub="${1:-}"
[ -n "$sub" ] || usage
shift
case "$sub" in
  build-stock) cmd=(scripts/device-stock-llama.sh "$@") ;;
  build-stock-server) cmd=(scripts/device-stock-server.sh "$@") ;;
  bench) cmd=(scripts/device-bench.sh "$@") ;;
  floor)
    # Issue 30's floor guard in one device call (< 10 min): resident tg128 beside stock
    # llama-bench of the same tree for Qwen3-30B-A3B q4_k_m (after a pp512 in the same process)
    # and GPT-OSS-20B mxfp4 (tg128 alone: a fresh process), each through device-bench.sh and its
    # floor check (FLOOR, default 0.95x stock). Ours runs with POCKETMOE_STEP_PROFILE=1: the host
    # time per step by phase lands in each bench.log.
    floor() {
      local out="${1:?usage: scripts/device.sh floor OUT}" start rc=0 left
      mkdir -p "$out"; start=$(date +%s)
      export POCKETMOE_STEP_PROFILE=1 BUDGETS=resident DEPTHS=0 REPS="${REPS:-3}"
      PROMPTS=512 DEADLINE=440 scripts/device-bench.sh "$out/qwen3-pp512-tg128" || rc=1
      left=$(( 585 - ($(date +%s) - start) ))
      ARCH=gpt-oss PRESET=gpt-oss-20b QUANT=mxfp4 PROMPTS=0 DEADLINE=$left \
        scripts/device-bench.sh "$out/gpt-oss-20b-tg128" || rc=1
      grep -h "step profile\|^floor" "$out"/*/bench.log
      return $rc
    }
    cmd=(floor "$@") ;;
  rows)
    # Issue 30's decode rows beside stock in one device call (< 10 min; stock llama-bench of the
    # same tree already built in this warm machine, e.g. by `sitting`): Qwen3-30B-A3B q4_k_m at
    # uniform routing (SKEW=0) and calibrated, 12 and 8 GiB, then GPT-OSS-20B mxfp4 at 8 and
    # 4 GiB; tg128 at depth 0, REPS (3). Prints each row (budget, ours, llama.cpp, ratio, its
    # setting, in-process / stock) and each duel's decision (the offload summary's lines).
    rows() {
      local out="${1:?usage: scripts/device.sh rows OUT}" start rc=0 x
      mkdir -p "$out"; start=$(date +%s)
      export PROMPTS=0 DEPTHS=0 REPS="${REPS:-3}"
      SKEW=0 BUDGETS=12GiB,8GiB DEADLINE=200 scripts/device-bench.sh "$out/uniform" > "$out/uniform.log" 2>&1 || rc=1
      BUDGETS=12GiB,8GiB DEADLINE=$(( 380 - ($(date +%s) - start) )) \
        scripts/device-bench.sh "$out/calibrated" > "$out/calibrated.log" 2>&1 || rc=1
      ARCH=gpt-oss PRESET=gpt-oss-20b QUANT=mxfp4 BUDGETS=8GiB,4GiB DEADLINE=$(( 570 - ($(date +%s) - start) )) \
        scripts/device-bench.sh "$out/gpt-oss-20b" > "$out/gpt-oss-20b.log" 2>&1 || rc=1
      for x in uniform calibrated gpt-oss-20b; do
        echo "== $x"
        grep -h "^| [0-9].*tg128" "$out/$x/bench.md" | cut -d'|' -f2-8
        grep -ah "^duel (" "$out/$x/bench.log" | cut -c1-300
      done
      echo "rows: $(( $(date +%s) - start )) s"
      return $rc
    }
    cmd=(rows "$@") ;;
  gated)
    # Gated decode (docs/design.md §4.4a) in one device call (< 10 min): the offload and batch
    # tests, whose gated cases run it on CUDA, under a timeout (a hang there is a host
    # synchronisation behind a closed gate), then the A/B against the eval-callback path at
    # 12 and 8 GiB (VARIANTS, BUDGETS, REPS, SKEW as device-decode-ab.sh takes them).
    gated() {
      local out="${1:?usage: scripts/device.sh gated OUT}" start rc=0 t
      mkdir -p "$out"; start=$(date +%s)
      TESTS="offload batch" timeout 300 scripts/device-run.sh tests > "$out/tests.log" 2>&1
      t=$?
      [ "$t" = 0 ] || { rc=1; echo "gated: tests FAILED (exit $t; 124: timed out)" | tee -a "$out/tests.log"; }
      grep -E "^test result|FAILED|panicked|gated" "$out/tests.log"
      VARIANTS="${VARIANTS:-GATED=1 GATED=0 GATED=1 GATED=0}" BUDGETS="${BUDGETS:-12GiB,8GiB}" \
        timeout $(( 585 - ($(date +%s) - start) )) scripts/device-decode-ab.sh "$out/ab" || rc=1
      return $rc
    }
    cmd=(gated "$@") ;;
  auto)
    # Gated::Auto's measured choice (experts::offload::duel) in one device call (< 10 min,
    # ours only): at uniform routing (SKEW=0) and calibrated, 12 and 8 GiB, auto against each
    # arm it chooses between forced (the hook path, gated, the hook path at half the prefetch
    # budget, gated in table form), and auto with table form as a fourth arm
    # (POCKETMOE_TABLE=auto), the duel's decisions in the log (debug).
    auto() {
      local out="${1:?usage: scripts/device.sh auto OUT}" rc=0
      mkdir -p "$out"
      export RUST_LOG="${RUST_LOG:-pocketmoe=info,pocketmoe::experts::offload::duel=debug}"
      local v="GATED=auto GATED=auto+TABLE=auto GATED=0 GATED=1 GATED=0+PREFETCH_SCALE=0.5 GATED=1+TABLE=1"
      SKEW=0 VARIANTS="$v" BUDGETS=12GiB,8GiB timeout 290 scripts/device-decode-ab.sh "$out/skew0" || rc=1
      VARIANTS="$v" BUDGETS=12GiB,8GiB timeout 290 scripts/device-decode-ab.sh "$out/calibrated" || rc=1
      grep -h "decode of\|^## \|tg128 " "$out"/*/ab.log "$out"/*/ab.md | grep -v "^|" 
      return $rc
    }
    cmd=(auto "$@") ;;
  table)
    # Table form (docs/design.md §4.4b, opt-in) in one device call (< 10 min, ours only): the
    # offload and batch tests as built (the default path), then with POCKETMOE_TABLE=1 (Auto
    # too runs in table form), then that with ggml-cuda's fusion off on both sides
    # (GGML_CUDA_DISABLE_FUSION=1: if only the second fails, the cosines are fused sums taken in
    # another order, not a fault), each under a timeout; then gated in table form against
    # itself with prefetched experts counted resident only once landed (TABLE_PREFETCH=landed,
    # the first build's way), control form and the hook path, calibrated, 12 and 8 GiB.
    table() {
      local out="${1:?usage: scripts/device.sh table OUT}" start rc=0 t f
      mkdir -p "$out"; start=$(date +%s)
      # PARTS (default "tests ab": both may not fit one call's 10 minutes on a fresh machine,
      # whose first A/B synthesises the model; PARTS=tests then PARTS=ab splits them).
      # FLAVOURS of the tests, each run in turn (default "default table nofusion"): default, as
      # built (control form unless a test asks for table form); table, Auto in table form too;
      # nofusion, the same without ggml-cuda's fusion; landed, table form with prefetched
      # experts resident only once landed (POCKETMOE_TABLE_PREFETCH=landed); ahead0, table form
      # with no piece queued ahead of its stop (POCKETMOE_GATED_AHEAD=0: if only this passes,
      # device-side order, not the kernels); graphs0, table form without ggml-cuda's CUDA graphs;
      # kernel, table form with its lookup as one kernel of ours (POCKETMOE_TABLE_KERNEL=1), and
      # ggml_smoke's test of that kernel beside the others.
      local parts="${PARTS:-tests ab}"
      for f in ${FLAVOURS:-default table nofusion}; do
        [[ " $parts " == *" tests "* ]] || break
        case "$f" in
          table) export POCKETMOE_TABLE=1 ;;
          nofusion) export POCKETMOE_TABLE=1 GGML_CUDA_DISABLE_FUSION=1 ;;
          landed) export POCKETMOE_TABLE=1 POCKETMOE_TABLE_PREFETCH=landed ;;
          ahead0) export POCKETMOE_TABLE=1 POCKETMOE_GATED_AHEAD=0 ;;
          graphs0) export POCKETMOE_TABLE=1 POCKETMOE_CUDA_GRAPHS=0 ;;
          kernel) export POCKETMOE_TABLE=1 POCKETMOE_TABLE_KERNEL=1 ;;
        esac
        local tests="offload batch"; [ "$f" = kernel ] && tests="offload batch ggml_smoke"
        TESTS="$tests" timeout 150 scripts/device-run.sh tests > "$out/tests-$f.log" 2>&1
        t=$?
        unset GGML_CUDA_DISABLE_FUSION POCKETMOE_TABLE POCKETMOE_TABLE_PREFETCH POCKETMOE_GATED_AHEAD POCKETMOE_CUDA_GRAPHS POCKETMOE_TABLE_KERNEL
        [ "$t" = 0 ] || { rc=1; echo "table: tests ($f) FAILED (exit $t; 124: timed out)"; }
        grep -E "^test result|FAILED|panicked|cosine|slots:" "$out/tests-$f.log" | cut -c1-300
      done
      [[ " $parts " == *" ab "* ]] || return $rc
      VARIANTS="${VARIANTS:-GATED=1+TABLE=1 GATED=1+TABLE=1+TABLE_PREFETCH=landed GATED=1 GATED=0}" BUDGETS="${BUDGETS:-12GiB,8GiB}" \
        timeout $(( 585 - ($(date +%s) - start) )) scripts/device-decode-ab.sh "$out/ab" || rc=1
      grep -h "tg128 \|offload:\|^duel (" "$out/ab/ab.log" "$out/ab/ab.md" | cut -c1-400
      return $rc
    }
    cmd=(table "$@") ;;
  sitting)
    # One device call (< 10 min) for a change to the gated step: stock llama-bench built in the
    # background (scripts/device-stock-llama.sh) while the offload tests run (TEST_ENV: their
    # switches, e.g. POCKETMOE_TABLE=1) and the model is synthesised; then, the build done and
    # the CPUs quiet, the decode A/B (VARIANTS, BUDGETS, SKEW as device-decode-ab.sh takes them;
    # default table form against control form at 12 GiB, uniform routing) and the resident floor
    # beside stock (tg128, 3 reps, device-bench.sh's floor check).
    sitting() {
      local out="${1:?usage: scripts/device.sh sitting OUT}" start rc=0 bpid t
      mkdir -p "$out"; start=$(date +%s)
      scripts/device-stock-llama.sh > "$out/stock-build.log" 2>&1 &
      bpid=$!
      # shellcheck disable=SC2086
      env ${TEST_ENV:-} TESTS="${TESTS:-offload}" timeout "${TEST_LIMIT:-200}" scripts/device-run.sh tests \
        > "$out/tests.log" 2>&1
      t=$?
      [ "$t" = 0 ] || { rc=1; echo "sitting: tests FAILED (exit $t; 124: timed out)"; }
      grep -E "^test |^test result|form\)|panicked" "$out/tests.log" | cut -c1-500
      scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m "${SKEW-0}" > /dev/null 2>> "$out/model.log"
      wait "$bpid" || { rc=1; echo "sitting: stock build FAILED"; tail -5 "$out/stock-build.log"; }
      echo "tests, model and stock ready at $(( $(date +%s) - start )) s"
      VARIANTS="${VARIANTS:-GATED=1+TABLE=1 GATED=1}" BUDGETS="${BUDGETS:-12GiB}" SKEW="${SKEW-0}" \
        REPS="${REPS:-3}" timeout $(( 470 - ($(date +%s) - start) )) scripts/device-decode-ab.sh "$out/ab" || rc=1
      grep -h "tg128 \|offload:\|^duel (" "$out/ab/ab.log" "$out/ab/ab.md" | cut -c1-400
      SKEW="${SKEW-0}" BUDGETS=resident PROMPTS=0 DEPTHS=0 REPS=3 \
        timeout $(( 585 - ($(date +%s) - start) )) scripts/device-bench.sh "$out/floor" || rc=1
      grep -h "^floor\|tg128" "$out/floor/bench.log" "$out/floor/bench.md" | cut -c1-300
      return $rc
    }
    cmd=(sitting "$@") ;;
  table-hang)
    # Table form's uniform-routing hang (bench-h200 "2026-12-06 (later)") in one device call
    # (< 10 min, ours only): Qwen3-30B-A3B q4_k_m at SKEW (default 0), 12 GiB, table form forced,
    # tg32, each variant under device-hang-probe.sh (LIMIT s, default 60; every thread's stack
    # into its hang.log on a hang, src/stackdump.rs). Variants (HANG_VARIANTS, ';'-separated
    # environment settings, empty: as built): as built (the capture guard on: no piece queued
    # ahead while ggml-cuda may capture); the guard off (POCKETMOE_CAPTURE_GUARD=0: the build
    # that hung); the guard off with CUDA_MODULE_LOADING=EAGER (with lazy loading a kernel's
    # first load may synchronise the context, which the CUDA guide warns deadlocks where a
    # kernel waits on work the host has yet to issue: our gates); the guard off with
    # GGML_CUDA_PDL=0. Whichever finishes, and the stack of the first that hangs, names the call.
    table_hang() {
      local out="${1:?usage: scripts/device.sh table-hang OUT}" m v d rc=0 t
      mkdir -p "$out"
      m=$(scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m "${SKEW:-0}") || return 1
      local variants="${HANG_VARIANTS-;POCKETMOE_CAPTURE_GUARD=0;POCKETMOE_CAPTURE_GUARD=0 CUDA_MODULE_LOADING=EAGER;POCKETMOE_CAPTURE_GUARD=0 GGML_CUDA_PDL=0}"
      local IFS=';'
      for v in $variants; do
        d=$(tr -c 'A-Za-z0-9_\n' '-' <<<"${v:-built}")
        echo "== table form, ${v:-as built}"
        IFS=' '
        # shellcheck disable=SC2086
        env POCKETMOE_GATED=1 POCKETMOE_TABLE=1 RUST_LOG="${RUST_LOG:-warn}" $v \
          LIMIT="${LIMIT:-60}" scripts/device-hang-probe.sh "$out/$d" \
          scripts/device-run.sh exec pocketmoe bench -m "$m" --gpu 0 --gpu-mem 12GiB -p 0 -n 32 \
          --reps 1 --no-baseline
        t=$?
        IFS=';'
        [ "$t" = 0 ] || rc=1
        echo "exit $t (124: hung)"
        grep -E "tg32|hit|^== thread|ggml|cuda|pocketmoe::" "$out/$d/hang.log" | head -80
      done
      return $rc
    }
    cmd=(table_hang "$@") ;;
  prefetch)
    # How the misses should split between PCIe and the CPU where the cache misses (issue 30's
    # uniform rows; docs/bench-h200.md "2026-12-07 (third)") in one device call (< 10 min, ours
    # only): the offload tests, then on Qwen3-30B-A3B q4_k_m at uniform routing, 12 and 8 GiB,
    # gated with the slack setpoint fixed at 20 us (as before 48087df), with its outer loop (the
    # default) and fixed at -40 and -100 us (SLACK_TARGET_US), the hook path (GATED=0) at
    # PREFETCH_SCALE 0.5 (the duel's arm), 0.25, and 0.5 at -40 us; then on GPT-OSS-20B mxfp4 at
    # 4 GiB the hook path at half prefetch at 20 us and with the loop, and at 0.25. Each run's
    # summary says how busy each channel was ("busy over the steps' time") and the setpoint.
    prefetch() {
      local out="${1:?usage: scripts/device.sh prefetch OUT}" start rc=0 t left
      mkdir -p "$out"; start=$(date +%s)
      TESTS="${TESTS:-offload}" timeout 120 scripts/device-run.sh tests > "$out/tests.log" 2>&1
      t=$?
      [ "$t" = 0 ] || { rc=1; echo "prefetch: tests FAILED (exit $t; 124: timed out)"; }
      grep -E "^test result|panicked" "$out/tests.log" | cut -c1-300
      local hook="GATED=0+PREFETCH_SCALE=0.5 GATED=0+PREFETCH_SCALE=0.25 GATED=0+PREFETCH_SCALE=0.5+SLACK_TARGET_US=-40"
      # The most telling first: a deadline may cut the last.
      left=$(( 420 - ($(date +%s) - start) ))
      SKEW=0 VARIANTS="GATED=1+SLACK_TARGET_US=20 GATED=1 GATED=1+SLACK_TARGET_US=-40 $hook GATED=1+SLACK_TARGET_US=-100" BUDGETS=12GiB,8GiB \
        timeout "$left" scripts/device-decode-ab.sh "$out/qwen3-skew0" > /dev/null 2>&1 || rc=1
      left=$(( 585 - ($(date +%s) - start) ))
      ARCH=gpt-oss PRESET=gpt-oss-20b QUANT=mxfp4 VARIANTS="GATED=0+PREFETCH_SCALE=0.5+SLACK_TARGET_US=20 GATED=0+PREFETCH_SCALE=0.5 GATED=0+PREFETCH_SCALE=0.25" BUDGETS=4GiB \
        timeout "$left" scripts/device-decode-ab.sh "$out/gpt-oss-20b" > /dev/null 2>&1 || rc=1
      sed 's/\x1b\[[0-9;]*m//g' "$out"/*/ab.md | grep -E "^## |tg128  |busy over" | cut -c1-300
      return $rc
    }
    cmd=(prefetch "$@") ;;
  stops)
    # Where an offloaded decode step's time goes where the cache hits (issue 30: >= 75% of
    # resident), in one device call (< 10 min, ours only), Qwen3-30B-A3B q4_k_m, calibrated
    # routing, at BUDGET (12GiB): for each form (STOP_FORMS, default table form and control
    # form, gated) the per-stop trace (POCKETMOE_STOP_TRACE, tools/stop-trace.py: the host's
    # wait for the routing, its logic, its queueing calls, the time between stops), then CUPTI
    # kernel traces of tg64 resident and in each form (tools/kernel-trace, dist/ktrace carried:
    # GPU busy, idle gaps by the kernels around them, API calls per step). CUPTI slows the
    # host's CUDA calls 2-3x, which makes a gated step host-bound: read the kernel traces for the
    # GPU's own work per step, the per-stop trace (untraced runs) for where the step waits.
    stops() {
      local out="${1:?usage: scripts/device.sh stops OUT}" m f d rc=0 csvs=()
      mkdir -p "$out"; out=$(cd "$out" && pwd)
      m=$(scripts/device-model.sh qwen3moe qwen3-30b-a3b q4_k_m "${SKEW:-}") || return 1
      local forms="${STOP_FORMS:-GATED=1+TABLE=1 GATED=1}"
      # A form's switches as the environment takes them: GATED=1+TABLE=1 -> POCKETMOE_GATED=1 ...
      vars_of() { local a; for a in ${1//+/ }; do printf 'POCKETMOE_%s\n' "$a"; done; }
      for f in $forms; do
        d=${f//[=+]/_}
        # shellcheck disable=SC2046
        env POCKETMOE_STEP_PROFILE=1 POCKETMOE_STOP_TRACE="$out/stops-$d.csv" $(vars_of "$f") \
          scripts/device-run.sh exec pocketmoe bench -m "$m" --gpu 0 --gpu-mem "${BUDGET:-12GiB}" \
          -p 0 -n 128 --reps 2 --no-baseline > "$out/stops-$d.md" 2> "$out/stops-$d.log" || rc=1
        echo "== $f: $(grep -E 'tg128' "$out/stops-$d.md" | tail -1 | tr -s ' ' | cut -c1-200)"
        grep -ah "step profile\|^duel (\|offload:" "$out/stops-$d.log" | cut -c1-420
        python3 tools/stop-trace.py --last 200 "$out/stops-$d.csv" || rc=1
      done
      for f in resident $forms; do
        d=${f//[=+]/_}
        local mem=(--gpu-mem "${BUDGET:-12GiB}") envs=()
        # shellcheck disable=SC2207
        [ "$f" = resident ] && mem=() || envs=($(vars_of "$f"))
        env "${envs[@]}" KTRACE_OUT="$out/k-$d-%p.csv" scripts/device-run.sh exec bash tools/kernel-trace/run.sh \
          pocketmoe bench -m "$m" --gpu 0 "${mem[@]}" --no-baseline --reps 2 -p 0 -n 64 \
          > "$out/k-$d.md" 2> "$out/k-$d.log" || { echo "trace $f FAILED"; rc=1; }
        csvs+=("$out/k-$d"-*.csv)
      done
      python3 tools/kernel-trace/summarise.py --last 60 --top 30 "${csvs[@]}" > "$out/kernels.txt" 2>&1 || rc=1
      cat "$out/kernels.txt"
      # One archive of the traces and logs: the device tool brings back only a few files a call.
      (cd "$out" && tar czf traces.tgz --remove-files ./*.csv ./*.log ./*.md)
      return $rc
    }
    cmd=(stops "$@") ;;
  multi) cmd=(scripts/device-multi.sh "$@") ;;
  tests) cmd=(scripts/device-run.sh tests "$@") ;;
  verify) cmd=(scripts/device-verify.sh "$@") ;;
  serve-compare) cmd=(scripts/device-serve-compare.sh "$@") ;;
  replay) cmd=(scripts/device-replay-check.sh "$@") ;;
  tree-checks) cmd=(scripts/device-tree-checks.sh "$@") ;;
  prompt-cache) cmd=(scripts/device-prompt-cache.sh "$@") ;;
  decode-ab) cmd=(scripts/device-decode-ab.sh "$@") ;;
  floor-trace) cmd=(scripts/device-floor-trace.sh "$@") ;;
  profile) cmd=(scripts/device-decode-profile.sh "$@") ;;
  model) cmd=(scripts/device-model.sh "$@") ;;
  hang-probe) cmd=(scripts/device-hang-probe.sh "$@") ;;
  run) cmd=(scripts/device-run.sh "$@") ;;
  -h|--help|help) usage ;;
  *) echo "device.sh: unknown subcommand '$sub'" >&2; usage ;;
esac
"${cmd[@]}"
rc=$?
[ "$rc" = 0 ] || echo "device.sh $sub: FAILED (exit $rc)" >&2
exit "$rc"
