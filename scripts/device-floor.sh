#!/usr/bin/env bash
# Issue 30's floor guard in one device call (< 10 min): stock llama-bench built from the same
# tree (scripts/device-stock-llama.sh), then resident tg128 beside it for Qwen3-30B-A3B q4_k_m
# (after a pp512 in the same process) and GPT-OSS-20B mxfp4 (tg128 alone: a fresh process), each
# through scripts/device-bench.sh and its floor check (FLOOR, default 0.95x stock). Ours runs with
# POCKETMOE_STEP_PROFILE=1: the host time per step by phase lands in each bench.log.
#   scripts/device-floor.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR="${1:?usage: scripts/device-floor.sh OUTDIR}"; mkdir -p "$OUTDIR"
start=$(date +%s)
export POCKETMOE_STEP_PROFILE=1 BUDGETS=resident DEPTHS=0 REPS="${REPS:-3}"
rc=0
PROMPTS=512 DEADLINE=440 scripts/device-bench.sh "$OUTDIR/qwen3-pp512-tg128" || rc=1
left=$(( 585 - ($(date +%s) - start) ))
ARCH=gpt-oss PRESET=gpt-oss-20b QUANT=mxfp4 PROMPTS=0 DEADLINE=$left \
  scripts/device-bench.sh "$OUTDIR/gpt-oss-20b-tg128" || rc=1
grep -h "step profile\|^floor" "$OUTDIR"/*/bench.log
exit $rc
