#!/usr/bin/env bash
# Checks chd's real CUDA path on this machine's NVIDIA GPUs against a reference measured in the
# same run, on the same CPUs, with CUDA events, by an independent CUDA program
# (scripts/gpu-check/h2d_ref.cu): H2D and D2H, pinned and pageable, at 128 KiB, 4 MiB, 64 MiB and
# 256 MiB (the small sizes, where one copy is shorter than one enqueue call, check that chd's
# timed region excludes the host's enqueue time as the reference's does), a sample of CPUs (2 per
# NUMA node) x every GPU, and each GPU's same-device copy (chd probe d2d); with two
# or more GPUs also the peer-copy pair path, every ordered pair's peer copy (chd probe p2p)
# and NCCL's allgather (shown without a reference). Prints one table, a row per path, GPU,
# size and memory: chd's and the reference's median GB/s and their ratio. Exits 1 when a row's
# median ratio is off 1 by more than TOLERANCE (5 %), a cell failed or a row is missing. Then a
# short size sweep (chd probe sweep, SWEEP_FROM..SWEEP_TO) and the basic validation table (chd
# probe basics: matmul TFLOPS, H2D, D2D, allgather) are printed without a reference; either
# failing fails the check. Every step runs under a timeout and the whole check under
# TIME_LIMIT (270 s).
#
#   scripts/gpu-check.sh                    # on a machine with NVIDIA GPUs and their driver
#   scripts/gpu-check.sh --bundle [DIR]     # on a machine with cargo and PyPI, no GPU needed:
#                                           # prepare DIR (target/gpu-check-bundle) for one
#                                           # without cargo, nvcc or network (see below);
#                                           # with CHD_BIN set, bundles that chd instead
#   GPU_CHECK_FAKE=1 scripts/gpu-check.sh   # dry run on the fake CUDA runtime
#                                           # (tests/runtime/gpu_check.rs)
#
# On the GPU machine it takes, in this order:
#   chd        $CHD_BIN, else $GPU_CHECK_BUNDLE/chd, else `cargo build --profile dist --offline`
#   reference  built by nvcc ($NVCC, else on PATH, else /usr/local/cuda/bin/nvcc), else the
#              prebuilt $GPU_CHECK_BUNDLE/h2d_ref
#   libcudart  for chd: $CUDA_RUNTIME, else $GPU_CHECK_BUNDLE/libcudart.so.13, else the
#              toolkit's beside nvcc, else chd's own search (libcudart.so, .so.13, .so.12)
#   libnccl    for the allgather row: $NCCL, else the dynamic loader's, else a pip-installed one
# A bundle (8.4 MB chd built with the dist profile, the reference built here by the pinned
# PyPI nvcc 13.0.88 with the static CUDA 13.0.96 runtime, which needs a driver for CUDA 13.0
# or later, 1 MB, and libcudart.so.13, 0.7 MB) travels in the device tool's `carry`:
#   scripts/gpu-check.sh --bundle       # here, then on the GPU machine:
#   run(command="GPU_CHECK_OUT=$OUT scripts/gpu-check.sh", carry=["target/gpu-check-bundle"])
#
# Environment: CPUS (chd --cpus selection, default per-node:2), SIZES (KiB, MiB or GiB, a bare
# number is MiB; default 128KiB,4MiB,64MiB,256MiB),
# SAMPLES (default 3), ITERATIONS (10), WARMUP (2), TOLERANCE (0.05), PAIR_CPUS (per-node:1),
# PAIR_SIZE (MiB, 64), SWEEP_FROM / SWEEP_TO (128KiB / 256MiB), BASICS_SIZE (MiB, 64),
# MATRIX_SIDE (4096), TIME_LIMIT (s, 270), GPU_CHECK_OUT (a folder: gets the table and a
# tarball of chd's CSVs, the reference's output and every log), GPU_CHECK_BUNDLE
# (target/gpu-check-bundle).
# Fake mode (GPU_CHECK_FAKE=1): GPUs and libraries are the fake runtime's
# (GPU_CHECK_FAKE_LIB, default target/debug/libchd_fake_runtime.so; CHD_FAKE_DEVICE_COUNT,
# default 2); the reference must be built by nvcc (with -cudart shared, and runs on the fake
# through a libcudart symlink); GPU_CHECK_REF_ENV="VAR=VALUE ..." sets variables for the
# reference only, to show that the check notices a disagreement.
set -euo pipefail
cd "$(dirname "$0")/.."

# Messages go to the script's own stderr (fd 3), also from steps whose output is redirected.
exec 3>&2
die() { echo "gpu-check: $*" >&3; exit 1; }

CPUS=${CPUS:-per-node:2}
SIZES=${SIZES:-128KiB,4MiB,64MiB,256MiB}
SAMPLES=${SAMPLES:-3}
ITERATIONS=${ITERATIONS:-10}
WARMUP=${WARMUP:-2}
TOLERANCE=${TOLERANCE:-0.05}
PAIR_CPUS=${PAIR_CPUS:-per-node:1}
PAIR_SIZE=${PAIR_SIZE:-64}
SWEEP_FROM=${SWEEP_FROM:-128KiB}
SWEEP_TO=${SWEEP_TO:-256MiB}
BASICS_SIZE=${BASICS_SIZE:-64}
MATRIX_SIDE=${MATRIX_SIDE:-4096}
TIME_LIMIT=${TIME_LIMIT:-270}
BUNDLE=${GPU_CHECK_BUNDLE:-target/gpu-check-bundle}
FAKE=${GPU_CHECK_FAKE:-}

# A digest of the sources a bundle is built from, to tell a stale bundle.
source_digest() {
  find src Cargo.toml Cargo.lock scripts/gpu-check -type f -print0 | sort -z | xargs -0 sha256sum \
    | sha256sum | cut -c1-16
}

# nvcc's options for the reference: the PyPI toolkit keeps its libraries in lib/, not lib64/.
nvcc_lib_flags() {
  local top
  top=$(dirname "$(dirname "$1")")
  [ -d "$top/lib" ] && printf '%s\n' "-L$top/lib"
  return 0
}

# Build the reference: build_ref NVCC OUT [NVCC OPTIONS...].
build_ref() {
  local nvcc=$1 out=$2
  shift 2
  local flags
  mapfile -t flags < <(nvcc_lib_flags "$nvcc")
  "$nvcc" -O2 "${flags[@]}" "$@" -o "$out" scripts/gpu-check/h2d_ref.cu -lpthread
}

if [ "${1:-}" = --bundle ]; then
  dir=${2:-$BUNDLE}
  mkdir -p "$dir"
  if [ -n "${CHD_BIN:-}" ]; then
    cp "$CHD_BIN" "$dir/chd"
  else
    echo "gpu-check: building chd (cargo build --profile dist: minutes)"
    cargo build --locked --quiet --profile dist -p chd
    cp target/dist/chd "$dir/chd"
  fi
  build_ref "$(scripts/real-libs.sh path nvcc)" "$dir/h2d_ref"
  cp "$(scripts/real-libs.sh path cudart13)" "$dir/libcudart.so.13"
  {
    echo "sources $(source_digest)"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "reference built by $(scripts/real-libs.sh describe nvcc) with the static $(scripts/real-libs.sh describe cudart13)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  } > "$dir/BUILD"
  echo "gpu-check: bundle in $dir ($(du -sh "$dir" | cut -f1)):"
  ls -l "$dir"
  echo "on the GPU machine: GPU_CHECK_OUT=\$OUT scripts/gpu-check.sh, carrying $dir"
  exit 0
fi
[ $# -eq 0 ] || die "unknown arguments $*: see the comment at the top of $0"

start=$(date +%s)
deadline=$((start + TIME_LIMIT))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Run a step under a timeout: step LIMIT WHAT CMD... It gets LIMIT seconds or what is left of
# TIME_LIMIT; with 5 s or less left it is skipped (125). A step that timed out (124) or was
# skipped fails the check, and the table still shows what was measured.
out_of_time=
step() {
  local limit=$1 what=$2 left rc=0
  shift 2
  # What is left, less the 5 s a step gets to exit after SIGTERM before SIGKILL.
  left=$((deadline - $(date +%s) - 5))
  if [ "$left" -le 5 ]; then
    echo "gpu-check: out of time (TIME_LIMIT=${TIME_LIMIT}s): skipped $what" >&3
    out_of_time=1
    return 125
  fi
  [ "$limit" -lt "$left" ] || limit=$left
  timeout -k 5 "$limit" "$@" || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "gpu-check: $what timed out after ${limit}s" >&3
    out_of_time=1
  fi
  return "$rc"
}

# After a failed step: failed RC WHAT LOG prints the end of its log, unless it was skipped or
# timed out (step said so already).
failed() {
  case $1 in
    124 | 125 | 137) ;;
    *)
      echo "gpu-check: $2 failed (exit $1):" >&3
      grep -v 'no version information' "$3" | tail -5 >&3 || true
      ;;
  esac
}

# ---- GPUs ----
if [ -n "$FAKE" ]; then
  fake_lib=${GPU_CHECK_FAKE_LIB:-target/debug/libchd_fake_runtime.so}
  [ -f "$fake_lib" ] || die "fake mode: $fake_lib is missing (cargo build -p chd-fake-runtime)"
  fake_lib=$(realpath "$fake_lib")
  export CHD_FAKE_DEVICE_COUNT=${CHD_FAKE_DEVICE_COUNT:-2}
  for ((i = 0; i < CHD_FAKE_DEVICE_COUNT; i++)); do
    echo "$i, Fake H200 (GPU_CHECK_FAKE), 0000:1A:00.0, fake, -, -"
  done > "$work/gpus"
else
  command -v nvidia-smi >/dev/null || die "no nvidia-smi: this check needs an NVIDIA GPU and its driver"
  step 20 nvidia-smi nvidia-smi \
    --query-gpu=index,name,pci.bus_id,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader > "$work/gpus" || die "nvidia-smi failed"
fi
ngpu=$(grep -c . "$work/gpus" || true)
[ "$ngpu" -ge 1 ] || die "no GPU listed"
sed 's/^/gpu: /' "$work/gpus"

# ---- chd ----
chd=
if [ -n "${CHD_BIN:-}" ]; then
  chd=$CHD_BIN
elif [ -x "$BUNDLE/chd" ]; then
  chd=$BUNDLE/chd
  echo "chd: prebuilt in $BUNDLE: $(paste -sd';' "$BUNDLE/BUILD" 2>/dev/null || echo 'no BUILD file')"
  if [ -f "$BUNDLE/BUILD" ] && [ "$(sed -n 's/^sources //p' "$BUNDLE/BUILD")" != "$(source_digest)" ]; then
    echo "gpu-check: WARNING: $BUNDLE was built from other sources than these: rebuild it (scripts/gpu-check.sh --bundle)" >&2
  fi
elif command -v cargo >/dev/null; then
  step 200 "cargo build" cargo build --profile dist --offline --quiet -p chd \
    || die "cargo build --offline failed; build a bundle where cargo can fetch crates (scripts/gpu-check.sh --bundle) and carry it, or set CHD_BIN"
  chd=target/dist/chd
else
  die "no chd: set CHD_BIN, or carry a bundle made by 'scripts/gpu-check.sh --bundle' to $BUNDLE (this machine has no cargo)"
fi
[ -x "$chd" ] || die "chd binary $chd is missing or not executable"
echo "chd: $chd ($("$chd" --version))"

# ---- the reference ----
nvcc=${NVCC:-$(command -v nvcc || true)}
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
ref_env=()
if [ -n "$nvcc" ]; then
  [ -x "$nvcc" ] || die "nvcc $nvcc is not executable"
  mapfile -t flags < <(nvcc_lib_flags "$nvcc")
  if [ -n "$FAKE" ]; then
    # Linked against libcudart.so, run on the fake through a symlink of the same soname.
    mkdir -p "$work/link" "$work/fake"
    top=$(dirname "$(dirname "$nvcc")")
    for so in "$top"/lib/libcudart.so.* "$top"/lib64/libcudart.so.*; do
      if [ -e "$so" ]; then ln -sf "$so" "$work/link/libcudart.so"; fi
    done
    for soname in libcudart.so.11.0 libcudart.so.12 libcudart.so.13; do
      ln -sf "$fake_lib" "$work/fake/$soname"
    done
    flags+=(-cudart shared "-L$work/link")
    ref_env=(env "LD_LIBRARY_PATH=$work/fake")
    read -r -a extra <<< "${GPU_CHECK_REF_ENV:-}"
    ref_env+=("${extra[@]}")
  fi
  echo "reference: building scripts/gpu-check/h2d_ref.cu with $nvcc ($("$nvcc" --version | tail -1))"
  if step 90 nvcc "$nvcc" -O2 "${flags[@]}" -o "$work/h2d_ref" scripts/gpu-check/h2d_ref.cu -lpthread \
      > "$work/nvcc.log" 2>&1; then
    ref=$work/h2d_ref
  elif [ -z "$FAKE" ] && [ -x "$BUNDLE/h2d_ref" ]; then
    tail -5 "$work/nvcc.log" >&2
    ref=$BUNDLE/h2d_ref
    echo "gpu-check: nvcc could not build the reference (above); using the prebuilt $ref" >&2
  else
    cat "$work/nvcc.log" >&2
    die "nvcc could not build the reference"
  fi
elif [ -z "$FAKE" ] && [ -x "$BUNDLE/h2d_ref" ]; then
  ref=$BUNDLE/h2d_ref
  echo "reference: prebuilt $ref"
elif [ -n "$FAKE" ]; then
  die "no nvcc to build the reference (looked at \$NVCC, PATH, /usr/local/cuda/bin/nvcc): fake mode builds it with nvcc, e.g. NVCC=\$(scripts/real-libs.sh path nvcc)"
else
  die "no nvcc to build the reference (looked at \$NVCC, PATH, /usr/local/cuda/bin/nvcc) and no prebuilt $BUNDLE/h2d_ref: install the CUDA toolkit, set NVCC, or carry a bundle (scripts/gpu-check.sh --bundle)"
fi

# ---- chd's libraries ----
runtime_args=()
pair_nccl_args=()
if [ -n "$FAKE" ]; then
  runtime_args=(--backend cuda --cuda-runtime "$fake_lib" --nvml "$fake_lib")
  pair_nccl_args=(--nccl "$fake_lib")
else
  cudart=${CUDA_RUNTIME:-}
  [ -n "$cudart" ] || { [ -e "$BUNDLE/libcudart.so.13" ] && cudart=$BUNDLE/libcudart.so.13; } || true
  if [ -z "$cudart" ] && [ -n "$nvcc" ]; then
    top=$(dirname "$(dirname "$nvcc")")
    for so in "$top"/lib64/libcudart.so.[0-9]* "$top"/lib/libcudart.so.[0-9]*; do
      if [ -e "$so" ] && [ -z "$cudart" ]; then cudart=$so; fi
    done
  fi
  runtime_args=(--backend cuda)
  [ -z "$cudart" ] || runtime_args+=(--cuda-runtime "$(realpath "$cudart")")
  nccl=${NCCL:-}
  if [ -z "$nccl" ] && ! ldconfig -p 2>/dev/null | grep 'libnccl\.so\.2 ' >/dev/null; then
    # pip's nvidia-nccl-cu* wheels (the torch image has one) keep it in nvidia/nccl/lib.
    nccl=$(timeout 20 python3 - 2>/dev/null <<'EOF' || true
import glob, os, nvidia
print(next((f for p in nvidia.__path__ for f in glob.glob(os.path.join(p, "nccl", "lib", "libnccl.so.2"))), ""))
EOF
    )
    [ -n "$nccl" ] || nccl=none
  fi
  [ "$nccl" = none ] || [ -z "$nccl" ] || pair_nccl_args=(--nccl "$nccl")
fi

# ---- H2D / D2H: chd, then the reference on the same cells ----
echo "chd: probing h2d,d2h x pinned,pageable (cpus $CPUS, sizes $SIZES, $SAMPLES samples per cell)"
chd_rc=0
step 100 "chd probe h2d" "$chd" probe h2d "${runtime_args[@]}" --cpus "$CPUS" --sizes "$SIZES" \
  --directions h2d,d2h --memory pinned,pageable --repeats "$SAMPLES" --iterations "$ITERATIONS" \
  --warmup "$WARMUP" --no-progress-bar --format csv > "$work/chd.csv" 2> "$work/chd.log" || chd_rc=$?
grep -E '^(backend|note):' "$work/chd.log" | sed 's/^/chd: /' || true
[ "$chd_rc" -eq 0 ] || failed "$chd_rc" "chd probe h2d" "$work/chd.log"

# chd's CSV (any matrix) as "path cpu device bytes memory bytes_per_second failed", by column name.
cells() {
  sed -E 's/"([0-9]+),([0-9]+)"/\1:\2/' "$1" | awk -F, '
    FNR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
      path = $col["direction"]; cpu = $col["cpu"]; dev = $col["device"]; mem = $col["host_memory"]
      if ($col["matrix"] == "pair") {
        cpu = cpu "," $col["peer_cpu"]; sub(":", ",", dev); mem = "device"
        if (path == "peer-copy") path = "p2p"
      }
      if ($col["matrix"] == "p2p") path = "peer"
      bps = $col["bytes_per_second"]; if (bps == "") bps = "-"
      print path, cpu, dev, $col["size_bytes"], mem, bps, $col["failed"]
    }'
}
cells "$work/chd.csv" > "$work/chd.cells" 2>/dev/null || true

awk -v it="$ITERATIONS" -v wu="$WARMUP" -v n="$SAMPLES" '
  { for (i = 0; i < n; i++) print $1, $2, $3, $4, $5, it, wu }' "$work/chd.cells" \
  | shuf > "$work/ref.in"
: > "$work/ref.out"
if [ -s "$work/ref.in" ]; then
  echo "reference: $(wc -l < "$work/ref.in") measurements"
  step 100 reference "${ref_env[@]}" "$ref" < "$work/ref.in" > "$work/ref.out" 2> "$work/ref.log" \
    || failed $? "the reference" "$work/ref.log"
  grep '^h2d_ref: CUDA' "$work/ref.log" | sed 's/^h2d_ref/reference/' || true
fi

# ---- same-device copies: chd probe d2d, then the reference on the same cells ----
echo "d2d: chd probe d2d (sizes $SIZES, $SAMPLES samples per cell)"
step 60 "chd probe d2d" "$chd" probe d2d "${runtime_args[@]}" --sizes "$SIZES" \
  --repeats "$SAMPLES" --iterations "$ITERATIONS" --warmup "$WARMUP" --no-progress-bar --format csv \
  > "$work/d2d.csv" 2> "$work/d2d.log" || failed $? "chd probe d2d" "$work/d2d.log"
cells "$work/d2d.csv" > "$work/d2d.cells" 2>/dev/null || true
awk -v it="$ITERATIONS" -v wu="$WARMUP" -v n="$SAMPLES" '
  { for (i = 0; i < n; i++) print "d2d", $2, $3, $4, it, wu }' "$work/d2d.cells" > "$work/d2d.in"
if [ -s "$work/d2d.in" ]; then
  step 60 "reference (d2d)" "${ref_env[@]}" "$ref" < "$work/d2d.in" >> "$work/ref.out" 2>> "$work/ref.log" \
    || failed $? "the reference (d2d)" "$work/ref.log"
fi
cat "$work/d2d.cells" >> "$work/chd.cells"

# ---- the pair path, with two GPUs ----
if [ "$ngpu" -ge 2 ]; then
  echo "pair: $ngpu GPUs; chd probe pair --pair auto --collective copy (cpus $PAIR_CPUS, $PAIR_SIZE MiB)"
  pair_args=(probe pair "${runtime_args[@]}" --pair auto --cpus "$PAIR_CPUS" --sizes "$PAIR_SIZE"
    --repeats "$SAMPLES" --iterations "$ITERATIONS" --warmup "$WARMUP" --no-progress-bar --format csv)
  step 40 "chd probe pair (copy)" "$chd" "${pair_args[@]}" --collective copy \
    > "$work/pair.csv" 2> "$work/pair.log" || failed $? "chd probe pair --collective copy" "$work/pair.log"
  cells "$work/pair.csv" > "$work/pair.cells" 2>/dev/null || true
  awk -v it="$ITERATIONS" -v wu="$WARMUP" -v n="$SAMPLES" '
    { split($2, c, ","); split($3, d, ",")
      for (i = 0; i < n; i++) print "p2p", c[1], c[2], d[1], d[2], $4, it, wu }' \
    "$work/pair.cells" > "$work/pair.in"
  if [ -s "$work/pair.in" ]; then
    step 40 "reference (p2p)" "${ref_env[@]}" "$ref" < "$work/pair.in" >> "$work/ref.out" 2>> "$work/ref.log" \
      || failed $? "the reference (p2p)" "$work/ref.log"
  fi
  if [ "${nccl:-}" = none ]; then
    echo "pair: no libnccl.so.2 found (set NCCL=): no allgather row"
  else
    step 40 "chd probe pair (nccl)" "$chd" "${pair_args[@]}" --collective nccl "${pair_nccl_args[@]}" \
      > "$work/nccl.csv" 2> "$work/nccl.log" || failed $? "chd probe pair --collective nccl" "$work/nccl.log"
    cells "$work/nccl.csv" >> "$work/pair.cells" 2>/dev/null || true
  fi
  cat "$work/pair.cells" >> "$work/chd.cells"
  echo "p2p: chd probe p2p, every ordered pair of the $ngpu GPUs ($PAIR_SIZE MiB)"
  step 60 "chd probe p2p" "$chd" probe p2p "${runtime_args[@]}" --size "$PAIR_SIZE" \
    --repeats "$SAMPLES" --iterations "$ITERATIONS" --warmup "$WARMUP" --no-progress-bar --format csv \
    > "$work/p2p.csv" 2> "$work/p2p.log" || failed $? "chd probe p2p" "$work/p2p.log"
  cells "$work/p2p.csv" > "$work/p2p.cells" 2>/dev/null || true
  awk -v it="$ITERATIONS" -v wu="$WARMUP" -v n="$SAMPLES" '
    { split($3, d, ">"); for (i = 0; i < n; i++) print "peer", $2, d[1], d[2], $4, it, wu }' \
    "$work/p2p.cells" > "$work/p2p.in"
  if [ -s "$work/p2p.in" ]; then
    step 60 "reference (peer)" "${ref_env[@]}" "$ref" < "$work/p2p.in" >> "$work/ref.out" 2>> "$work/ref.log" \
      || failed $? "the reference (peer)" "$work/ref.log"
  fi
  cat "$work/p2p.cells" >> "$work/chd.cells"
else
  echo "pair: this machine has $ngpu GPU; the pair path needs two: no pair rows"
fi

# ---- one table ----
nsizes=$(tr ',' '\n' <<< "$SIZES" | grep -c .)
expected_rows=$((ngpu * nsizes * 4))
expected_d2d=$((ngpu * nsizes))
expected_peer=$((ngpu * (ngpu - 1)))
verdict=0
expected_pair=0
[ "$ngpu" -lt 2 ] || expected_pair=1
awk -v tol="$TOLERANCE" -v expected="$expected_rows" -v expected_pair="$expected_pair" \
  -v expected_d2d="$expected_d2d" -v expected_peer="$expected_peer" '
  function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    if (n == 0) return ""
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
    return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  function range(list,    v, n, i, lo, hi) {
    n = split(list, v, " ")
    lo = hi = v[1]
    for (i = 2; i <= n; i++) { if (v[i] + 0 < lo + 0) lo = v[i]; if (v[i] + 0 > hi + 0) hi = v[i] }
    return sprintf("%.3f-%.3f", lo, hi)
  }
  FILENAME == ARGV[1] {            # reference: path cpu device bytes memory bps [peer|staged]
    key = $1 " " $2 " " $3 " " $4 " " $5
    ref[key] = ref[key] " " $6
    if (NF >= 7) note[$1 " " $3 " " $4 " " $5] = $7
    next
  }
  {                                # chd: path cpu device bytes memory bps failed
    key = $1 " " $2 " " $3 " " $4 " " $5
    g = $1 " " $3 " " $4 " " $5
    if (!(g in cells)) {
      rank = ($1 == "h2d") ? 1 : ($1 == "d2h") ? 2 : ($1 == "d2d") ? 3 : ($1 == "p2p") ? 4 : ($1 == "peer") ? 5 : 6
      order[++ngroups] = g
      sortkey[g] = sprintf("%d %8s %015d %d", rank, $3, $4, ($5 == "pinned") ? 1 : 2)
      path[g] = $1; gpu[g] = $3; mib[g] = sprintf("%g", $4 / 1048576); mem[g] = $5
    }
    cells[g]++
    if ($6 == "-" || $6 + 0 <= 0 || $7 + 0 > 0) { failed[g]++; next }
    chd[g] = chd[g] " " $6
    r = median(ref[key])
    if ($1 == "allgather") next  # no reference for NCCL
    if (r == "" || r + 0 <= 0) { missing[g]++; next }
    refs[g] = refs[g] " " r
    ratios[g] = ratios[g] " " ($6 / r)
  }
  END {
    for (i = 1; i <= ngroups; i++) for (j = i + 1; j <= ngroups; j++)
      if (sortkey[order[j]] < sortkey[order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
    printf "%-9s %-5s %5s %-8s %5s %9s %9s %7s %-13s %s\n", "path", "gpu", "MiB", "memory", "cells", "chd GB/s", "ref GB/s", "ratio", "ratio range", "verdict"
    bad = 0; hostrows = 0; pairrows = 0; d2drows = 0; peerrows = 0
    for (i = 1; i <= ngroups; i++) {
      g = order[i]
      if (path[g] == "h2d" || path[g] == "d2h") hostrows++
      if (path[g] == "p2p") pairrows++
      if (path[g] == "d2d") d2drows++
      if (path[g] == "peer") peerrows++
      c = median(chd[g])
      cs = (c == "") ? "-" : sprintf("%.2f", c / 1e9)
      if (path[g] == "allgather") {
        v = failed[g] ? "FAIL: " failed[g] " failed cells" : "no reference (NCCL)"
        if (failed[g]) bad = 1
        printf "%-9s %-5s %5s %-8s %5d %9s %9s %7s %-13s %s\n", path[g], gpu[g], mib[g], mem[g], cells[g], cs, "-", "-", "-", v
        continue
      }
      m = median(ratios[g]); r = median(refs[g])
      ok = (m != "" && m >= 1 - tol && m <= 1 + tol && !failed[g] && !missing[g])
      v = ok ? "ok" : "FAIL"
      if (failed[g]) v = v ": " failed[g] " chd cells failed"
      if (missing[g]) v = v ": " missing[g] " cells without reference"
      if (m != "" && (m < 1 - tol || m > 1 + tol)) v = v ": off by more than " tol * 100 "%"
      if (note[g] != "") v = v " (reference: " note[g] " access)"
      if (!ok) bad = 1
      printf "%-9s %-5s %5s %-8s %5d %9s %9s %7s %-13s %s\n", path[g], gpu[g], mib[g], mem[g], cells[g], cs,
        (r == "") ? "-" : sprintf("%.2f", r / 1e9), (m == "") ? "-" : sprintf("%.3f", m),
        (m == "") ? "-" : range(ratios[g]), v
    }
    if (expected_pair && !pairrows) { print "expected a p2p row (this machine has two or more GPUs), got none"; bad = 1 }
    if (hostrows != expected) { printf "expected %d h2d/d2h rows (GPUs x sizes x 2 directions x 2 memory kinds), got %d\n", expected, hostrows; bad = 1 }
    if (d2drows != expected_d2d) { printf "expected %d d2d rows (GPUs x sizes), got %d\n", expected_d2d, d2drows; bad = 1 }
    if (peerrows != expected_peer) { printf "expected %d peer rows (ordered GPU pairs), got %d\n", expected_peer, peerrows; bad = 1 }
    exit bad
  }' "$work/ref.out" "$work/chd.cells" > "$work/table.txt" || verdict=1
[ "$chd_rc" -eq 0 ] || verdict=1

# ---- a short size sweep and the basic validation table, without a reference ----
ops=h2d,d2h,d2d
[ "$ngpu" -lt 2 ] || [ "${nccl:-}" = none ] || ops=$ops,allgather
sweep_args=(probe sweep "${runtime_args[@]}" --from "$SWEEP_FROM" --to "$SWEEP_TO" --ops "$ops"
  --repeats "$SAMPLES" --iterations "$ITERATIONS" --warmup "$WARMUP" --no-progress-bar)
[ "$ngpu" -lt 2 ] || sweep_args+=("${pair_nccl_args[@]}")
step 60 "chd probe sweep" "$chd" "${sweep_args[@]}" > "$work/sweep.txt" 2> "$work/sweep.log" \
  || { failed $? "chd probe sweep" "$work/sweep.log"; verdict=1; }
basics_args=(probe basics "${runtime_args[@]}" --size "$BASICS_SIZE" --matrix-side "$MATRIX_SIDE"
  --repeats "$SAMPLES" --iterations "$ITERATIONS" --warmup "$WARMUP" --no-progress-bar)
[ "$ngpu" -lt 2 ] || basics_args+=("${pair_nccl_args[@]}")
step 60 "chd probe basics" "$chd" "${basics_args[@]}" > "$work/basics.txt" 2> "$work/basics.log" \
  || { failed $? "chd probe basics" "$work/basics.log"; verdict=1; }
[ -z "$out_of_time" ] || verdict=1
echo
cat "$work/table.txt"
echo
if [ -s "$work/sweep.txt" ]; then
  echo "size sweep (chd probe sweep, $SWEEP_FROM..$SWEEP_TO, no reference):"
  cat "$work/sweep.txt"
  echo
fi
if [ -s "$work/basics.txt" ]; then
  echo "basic validation (chd probe basics, no reference):"
  cat "$work/basics.txt"
  grep -h '^note: .* not measured' "$work/basics.log" || true
  echo
fi
if [ "$verdict" -eq 0 ]; then
  echo "gpu-check: PASS: every row within $(awk -v t="$TOLERANCE" 'BEGIN { print t * 100 }')% of the reference ($(($(date +%s) - start)) s)"
else
  echo "gpu-check: FAIL ($(($(date +%s) - start)) s)"
fi
if [ -n "${GPU_CHECK_OUT:-}" ]; then
  # Two files (the device tool brings back at most eight): the table, and everything else.
  mkdir -p "$GPU_CHECK_OUT"
  cp "$work/table.txt" "$GPU_CHECK_OUT/gpu-check-table.txt"
  tar -czf "$GPU_CHECK_OUT/gpu-check-files.tar.gz" -C "$work" --exclude=h2d_ref --exclude=fake --exclude=link .
fi
exit "$verdict"
