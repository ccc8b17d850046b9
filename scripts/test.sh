#!/usr/bin/env bash
# Runs every test of chd: formatting, lints, unit, integration and end-to-end tests.
# Installs what the tests need first (promtool from Debian's `prometheus` package).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "scripts/test.sh: needs ${missing[*]} (apt-get install -y ${missing[*]}); run as root or install sudo" >&2
    exit 1
  fi
  echo "scripts/test.sh: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
promtool --version | head -1

cargo fmt --all --check
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo build --locked --workspace
cargo test --locked --workspace
