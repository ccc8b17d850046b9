#!/usr/bin/env bash
# Runs every test of chd: formatting, lints, unit, integration and end-to-end tests, then
# every fuzz target for CHD_FUZZ_SECONDS (10) seconds each (scripts/fuzz.sh, which installs
# nightly and cargo-fuzz when missing and fails when it cannot).
# Installs what the tests need first: promtool from Debian's `prometheus` package, shellcheck,
# and the real NVIDIA libraries (pinned PyPI wheels, cached outside the repository by
# scripts/real-libs.sh; about 1 GB the first time, 30 s here).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
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

# Kubernetes manifests are validated offline against bundled schemas.
if ! command -v kubernetes-validate >/dev/null 2>&1 && ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "scripts/test.sh: installing kubernetes-validate from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
fi
command -v kubectl >/dev/null 2>&1 || {
  echo "scripts/test.sh: kubectl is needed for 'kubectl kustomize' (https://kubernetes.io/docs/tasks/tools/)" >&2
  exit 1
}

# tests/real_libs.rs and tests/gpu_check.rs load these (and fail, never skip, without them).
start=$(date +%s)
./scripts/real-libs.sh fetch
echo "scripts/test.sh: real NVIDIA libraries ready in $(($(date +%s) - start)) s"

cargo fmt --all --check
cargo fmt --manifest-path fuzz/Cargo.toml --check
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo build --locked --workspace
cargo test --locked --workspace

# Bounded fuzzing of every parser of untrusted text (fuzz/README.md); a crash fails the run.
./scripts/fuzz.sh "${CHD_FUZZ_SECONDS:-10}"
