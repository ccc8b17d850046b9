#!/usr/bin/env bash
# Runs every test of chd: formatting, lints, unit, integration and end-to-end tests (the
# parsers' fuzz properties included, as proptest cases on stable: tests/parsers). With
# CHD_FUZZ_SECONDS=N it then runs every cargo-fuzz target for N seconds (scripts/fuzz.sh,
# which needs a nightly toolchain; CI's machine has only stable Rust and cannot fetch one).
# Installs what the tests need first: promtool from Debian's `prometheus` package, shellcheck,
# curl and prometheus-node-exporter (tests/serve/serve_tls.rs), valgrind (scripts/memcheck.sh),
# python's jsonschema (tests/fleet/ledger.rs), python's jsonnet (tests/rules/mixin.rs),
# Slurm's slurmctld, slurmd, slurm-client and munge (tests/fleet/slurm.rs),
# and the real NVIDIA libraries (pinned PyPI wheels, cached outside the repository by
# scripts/real-libs.sh; about 1 GB the first time, 30 s here).
# The integration tests are a few binaries, one per suite (tests/<suite>/main.rs, a module per
# former test file; docs/ARCHITECTURE.md, "Tests"): `cargo test --test serve serve_tls::` runs
# one module of one suite.
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
# tests/serve/serve_tls.rs: curl talks TLS to chd and node_exporter, which reads the same web
# config.
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v prometheus-node-exporter >/dev/null 2>&1 || missing+=(prometheus-node-exporter)
# tests/faults/faults_state.rs: the state directory is a tmpfs in a private mount namespace.
command -v unshare >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v mount >/dev/null 2>&1 || missing+=(mount)
# scripts/memcheck.sh: chd's FFI under valgrind memcheck (its canaries are built with cc).
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
# tests/fleet/slurm.rs: a real one-node Slurm 22.05 (Debian's daemons, client tools and munge) runs
# chd check --slurm as its HealthCheckProgram. About 10 s to install here.
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
command -v scontrol >/dev/null 2>&1 || missing+=(slurm-client)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || missing+=(munge)
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
# tests/fleet/ledger.rs validates the calibration ledger against docs/calibration.schema.json (Draft
# 2020-12) with python's jsonschema, this version.
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("jsonschema"))' 2>/dev/null)" != 4.26.0 ]; then
  echo "scripts/test.sh: installing jsonschema 4.26.0 from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check 'jsonschema==4.26.0'
fi
# tests/rules/mixin.rs renders the jsonnet mixin (mixin/) with scripts/gen-mixin.py, which uses
# PyPI's jsonnet (the C++ implementation's bindings, a manylinux wheel: about 1 s to install
# here).
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("jsonnet"))' 2>/dev/null)" != 0.22.0 ]; then
  echo "scripts/test.sh: installing jsonnet 0.22.0 from PyPI"
  start=$(date +%s)
  python3 -m pip install --quiet --disable-pip-version-check 'jsonnet==0.22.0'
  echo "scripts/test.sh: jsonnet installed in $(($(date +%s) - start)) s"
fi
command -v kubectl >/dev/null 2>&1 || {
  echo "scripts/test.sh: kubectl is needed for 'kubectl kustomize' (https://kubernetes.io/docs/tasks/tools/)" >&2
  exit 1
}

# tests/runtime/real_libs.rs and tests/runtime/gpu_check.rs load these (and fail, never skip,
# without them).
start=$(date +%s)
./scripts/real-libs.sh fetch
echo "scripts/test.sh: real NVIDIA libraries ready in $(($(date +%s) - start)) s"

# CI builds once from a clean checkout: incremental caches would only take disk.
export CARGO_INCREMENTAL=0
cargo fmt --all --check
cargo fmt --manifest-path fuzz/Cargo.toml --check
cargo clippy --locked --workspace --all-targets -- -D warnings
# The API docs build without a broken or private intra-doc link.
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
cargo build --locked --workspace
# What `cargo test --locked --workspace` runs, the test binaries side by side (one per CPU;
# CHD_TEST_JOBS=1 runs them one after another), tests/load.rs last and alone.
./scripts/test-suites.sh

# chd's FFI under valgrind against the fake runtime (probes, topology, a serve window): no
# invalid access, uninitialised read or definite leak. Its runs go side by side, one per CPU
# (about a minute on 2 CPUs).
./scripts/memcheck.sh

# Bounded fuzzing of every parser of untrusted text (fuzz/README.md); a crash fails the run.
if [ -n "${CHD_FUZZ_SECONDS:-}" ]; then
  ./scripts/fuzz.sh "$CHD_FUZZ_SECONDS"
else
  echo "scripts/test.sh: cargo-fuzz targets not run (set CHD_FUZZ_SECONDS=N with a nightly toolchain," \
    "or run scripts/fuzz.sh); their properties ran above as proptest cases (tests/parsers)"
fi
