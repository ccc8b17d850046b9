#!/usr/bin/env bash
# Fetches the real NVIDIA libraries that chd's tests load (pinned PyPI wheels, checked against
# their sha256) into a cache outside the repository, and says where they are. Nothing here
# needs a GPU: without one the libraries load and answer with their own errors.
#
#   scripts/real-libs.sh fetch [NAME...]   # fetch NAMEs (default: all); what scripts/test.sh runs
#   scripts/real-libs.sh path NAME         # fetch NAME if needed, print its absolute path
#   scripts/real-libs.sh describe NAME     # print the pinned package of NAME (PACKAGE==VERSION)
#   scripts/real-libs.sh list              # NAME, package, path, whether it is fetched
#
# NAMEs: cudart12 (libcudart.so.12), nccl (libnccl.so.2), cublas (libcublas.so.12, with the
# libcublasLt.so.12 beside it that it links), cudart13 (libcudart.so.13), nvcc (the CUDA 13.0
# compiler driver with its nvvm, headers and static runtime: builds scripts/gpu-check/h2d_ref.cu
# without a GPU). cudart13 and nvcc share one folder.
#
# Cache: $CHD_TEST_LIBS, else ${XDG_CACHE_HOME:-$HOME/.cache}/chd-test-libs, one folder per
# group (<package>-<version>). A group is installed with `pip install --no-deps
# --require-hashes --target` into a temporary folder and renamed into place once complete,
# under a lock, so concurrent callers (parallel tests) fetch it once. A failed fetch exits 1
# with pip's reason: the tests that need these libraries fail, they are never skipped.
#
# Sizes and times measured on the 2-core development machine (download, then install):
#   cudart12 3.4 MB / 9.5 MB installed, 1 s; nccl 336 MB / 469 MB, 4 s + 6 s;
#   cublas 555 MB / 817 MB, 7 s + 8 s; cuda13 (nvcc) 97 MB / 253 MB, 4 s.
set -euo pipefail

die() { echo "real-libs: $*" >&2; exit 1; }

root=${CHD_TEST_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/chd-test-libs}
names=(cudart12 nccl cublas cudart13 nvcc)

# The group (cache folder) holding NAME.
group_of() {
  case $1 in
    cudart12) echo nvidia-cuda-runtime-cu12-12.9.79 ;;
    nccl) echo nvidia-nccl-cu12-2.32.3 ;;
    cublas) echo nvidia-cublas-cu12-12.9.3.13 ;;
    cudart13 | nvcc) echo nvidia-cuda-nvcc-13.0.88 ;;
    *) die "unknown library ${1@Q}: expected one of ${names[*]}" ;;
  esac
}

# NAME's file inside its group folder.
file_of() {
  case $1 in
    cudart12) echo nvidia/cuda_runtime/lib/libcudart.so.12 ;;
    nccl) echo nvidia/nccl/lib/libnccl.so.2 ;;
    cublas) echo nvidia/cublas/lib/libcublas.so.12 ;;
    cudart13) echo nvidia/cu13/lib/libcudart.so.13 ;;
    nvcc) echo nvidia/cu13/bin/nvcc ;;
  esac
}

# The pinned package NAME comes from.
package_of() {
  case $1 in
    cudart12) echo nvidia-cuda-runtime-cu12==12.9.79 ;;
    nccl) echo nvidia-nccl-cu12==2.32.3 ;;
    cublas) echo nvidia-cublas-cu12==12.9.3.13 ;;
    cudart13) echo nvidia-cuda-runtime==13.0.96 ;;
    nvcc) echo nvidia-cuda-nvcc==13.0.88 ;;
  esac
}

# pip requirements (with the x86_64 wheels' sha256) of a group.
requirements_of() {
  case $1 in
    nvidia-cuda-runtime-cu12-12.9.79)
      echo "nvidia-cuda-runtime-cu12==12.9.79 --hash=sha256:25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3" ;;
    nvidia-nccl-cu12-2.32.3)
      echo "nvidia-nccl-cu12==2.32.3 --hash=sha256:bb94b2348e4861d5e8aa00b36c3d12d9bdf9c6369b82cbb723de0b582280a21c" ;;
    nvidia-cublas-cu12-12.9.3.13)
      echo "nvidia-cublas-cu12==12.9.3.13 --hash=sha256:d7d51055f161b317c7105ddaae90e71eda059026074ffef93cf7cde2886bfe72" ;;
    nvidia-cuda-nvcc-13.0.88)
      echo "nvidia-cuda-nvcc==13.0.88 --hash=sha256:56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"
      echo "nvidia-nvvm==13.0.88 --hash=sha256:c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"
      echo "nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"
      echo "nvidia-cuda-crt==13.0.88 --hash=sha256:2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4" ;;
  esac
}

# Install GROUP into the cache unless it is complete there.
fetch_group() {
  local group=$1 dir="$root/$1"
  [ -f "$dir/.complete" ] && return 0
  [ "$(uname -m)" = x86_64 ] || die "the pinned wheels are x86_64 only; this machine is $(uname -m)"
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock -w 1800 9 || die "waited 30 minutes for $root/.lock"
  if [ ! -f "$dir/.complete" ]; then
    local tmp req start log
    tmp=$(mktemp -d "$root/.fetch-$group.XXXXXX")
    req="$tmp.requirements.txt"
    log="$tmp.log"
    requirements_of "$group" > "$req"
    start=$(date +%s)
    echo "real-libs: fetching $(cut -d' ' -f1 "$req" | paste -sd' ') into $dir" >&2
    if ! timeout 1800 python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --no-deps --no-compile --only-binary=:all: --require-hashes --target "$tmp" -r "$req" \
        > "$log" 2>&1; then
      local why
      why=$(grep -v '^WARNING: Running pip as' "$log" | tail -5)
      rm -rf "$tmp" "$req" "$log"
      die "could not fetch $(requirements_of "$group" | cut -d' ' -f1 | paste -sd' ') from PyPI: ${why:-pip failed}
real-libs: the tests that load the real NVIDIA libraries need PyPI (or a filled cache in $root)"
    fi
    rm -rf "$dir"
    mv "$tmp" "$dir"
    rm -f "$req" "$log"
    touch "$dir/.complete"
    echo "real-libs: $group: $(du -sh "$dir" | cut -f1) in $(($(date +%s) - start)) s" >&2
  fi
  exec 9>&-
}

# Absolute path of NAME, fetching its group first.
path_of() {
  local group
  group=$(group_of "$1")
  fetch_group "$group"
  local p
  p="$root/$group/$(file_of "$1")"
  [ -e "$p" ] || die "$(package_of "$1") is installed in $root/$group but has no $(file_of "$1")"
  echo "$p"
}

case ${1:-} in
  fetch)
    shift
    (($#)) || set -- "${names[@]}"
    for n in "$@"; do path_of "$n" > /dev/null; done
    ;;
  path)
    [ $# -eq 2 ] || die "usage: $0 path NAME"
    path_of "$2"
    ;;
  describe)
    [ $# -eq 2 ] || die "usage: $0 describe NAME"
    group_of "$2" > /dev/null
    package_of "$2"
    ;;
  list)
    for n in "${names[@]}"; do
      g=$(group_of "$n")
      state=missing
      [ -f "$root/$g/.complete" ] && state=fetched
      printf '%-9s %-36s %-8s %s\n' "$n" "$(package_of "$n")" "$state" "$root/$g/$(file_of "$n")"
    done
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
