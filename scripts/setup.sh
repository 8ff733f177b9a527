#!/usr/bin/env bash
# The one set-up step: installs what building and testing needs (apt-get), or names it.
#
# The one set-up step (idempotent): installs what building and testing PocketMoE needs, when it
# is missing, through apt-get (Debian 12 / Ubuntu), as root or through sudo. Called by the
# README's two commands (scripts/demo.sh, scripts/test.sh) and by .ci/run; quiet when everything
# is there. Where it cannot install (no apt-get, not root and no sudo) it stops with one line
# naming the packages to install.
#
#   scripts/setup.sh            # build + tests: Rust, cmake, C/C++, libclang, python3-venv, Chromium
#   scripts/setup.sh --build    # only what the build and the demo need (no Chromium, no venv)
#
# Rust: the machine's rustup toolchain where there is one; on a bare Debian, Debian's own Rust
# (rustc-web & co. from bookworm-security, >= 1.88 as the locked crates need).
set -euo pipefail
what=tests
[ "${1:-}" = --build ] && what=build
[ -d "${HOME:-/root}/.cargo/bin" ] && export PATH="${HOME:-/root}/.cargo/bin:$PATH"
need=()
command -v cargo >/dev/null || need+=(rustc-web cargo-web rustfmt-web rust-web-clippy)
# cmake (and make) builds the bundled llama.cpp with a C/C++ compiler; libclang is bindgen's
# parser; nm (binutils) checks the binary in CI; ca-certificates for crates.io and PyPI (https).
command -v cmake >/dev/null || need+=(cmake)
command -v make >/dev/null || need+=(make)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v nm >/dev/null || need+=(binutils)
ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v clang >/dev/null || need+=(clang)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
# The demo and scripts/fetch-fixtures.sh fetch from PyPI with python3's standard library.
command -v python3 >/dev/null || need+=(python3)
if [ "$what" = tests ]; then
  # The server tests drive pocketmoe-serve with the openai Python client, in a venv they create.
  python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)
  # tests/web_ui.rs drives the built-in chat page in headless Chromium (CDP over a pipe);
  # POCKETMOE_SKIP_BROWSER=1 skips it (with a SKIPPED line) where Chromium cannot be had.
  if [ "${POCKETMOE_SKIP_BROWSER:-}" != 1 ] && [ -z "${POCKETMOE_CHROMIUM:-}" ]; then
    command -v chromium >/dev/null || need+=(chromium)
  fi
fi
[ ${#need[@]} -eq 0 ] && exit 0
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n); else sudo=(none); fi
fi
if ! command -v apt-get >/dev/null || [ "${sudo[0]:-}" = none ]; then
  why=$(command -v apt-get >/dev/null && echo "not root and no sudo" || echo "no apt-get")
  echo "SETUP: missing ${need[*]} ($why): install them (Debian/Ubuntu package names), then run this again" >&2
  exit 1
fi
echo "== setup: installing ${need[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq || { echo "SETUP: apt-get update failed" >&2; exit 1; }
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" </dev/null \
  || { echo "SETUP: apt-get install ${need[*]} failed" >&2; exit 1; }
