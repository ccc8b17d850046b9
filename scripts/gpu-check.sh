#!/usr/bin/env bash
# Checks chd's real CUDA path on this machine's NVIDIA GPUs against a reference measured in
# the same run by an independent CUDA C program (scripts/gpu-check/h2d_ref.cu, built with
# nvcc): a sample of bindable CPUs (2 per NUMA node) x every GPU x 64 and 256 MiB x h2d, d2h x
# pinned, pageable. Prints one table row per cell (chd, reference, ratio) and a verdict per
# size/direction/memory group: chd's median ratio must be within 5 % of 1. Exits non-zero
# otherwise. Takes 1-3 minutes.
#
#   scripts/gpu-check.sh                  # builds chd (cargo build --release --offline)
#   CHD_BIN=path/to/chd scripts/gpu-check.sh   # uses a chd built elsewhere
#
# Environment: CPUS (chd --cpus selection, default per-node:2), SIZES (MiB, default 64,256),
# SAMPLES (default 3), ITERATIONS (default 10), TOLERANCE (default 0.05).
set -euo pipefail
cd "$(dirname "$0")/.."

CPUS=${CPUS:-per-node:2}
SIZES=${SIZES:-64,256}
SAMPLES=${SAMPLES:-3}
ITERATIONS=${ITERATIONS:-10}
WARMUP=2
TOLERANCE=${TOLERANCE:-0.05}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

die() { echo "gpu-check: $*" >&2; exit 1; }

command -v nvidia-smi >/dev/null || die "no nvidia-smi: this check needs an NVIDIA GPU and driver"
nvidia-smi --query-gpu=index,name,pci.bus_id,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader \
  | sed 's/^/gpu: /'
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } || true
[ -n "$nvcc" ] || die "no nvcc (CUDA toolkit) for the reference program"

if [ -n "${CHD_BIN:-}" ]; then
  chd=$CHD_BIN
else
  cargo build --release --offline --quiet -p chd
  chd=target/release/chd
fi
[ -x "$chd" ] || die "chd binary $chd is missing"

"$nvcc" -O2 -o "$work/h2d_ref" scripts/gpu-check/h2d_ref.cu

start=$(date +%s)
echo "chd: probing (cpus $CPUS, sizes $SIZES MiB, $SAMPLES samples per cell)"
"$chd" probe h2d --backend cuda --cpus "$CPUS" --sizes "$SIZES" --directions h2d,d2h \
  --host-memory pinned,pageable --samples "$SAMPLES" --iterations "$ITERATIONS" \
  --warmup "$WARMUP" --format csv > "$work/chd.csv"

# The reference measures the same cells, each $SAMPLES times in a shuffled order.
tail -n +2 "$work/chd.csv" | awk -F, -v it="$ITERATIONS" -v wu="$WARMUP" -v n="$SAMPLES" '
  { for (i = 0; i < n; i++) print $1, $3, $4 / 1048576, $5, $6, it, wu }' \
  | shuf > "$work/ref.in"
echo "reference: $(wc -l < "$work/ref.in") measurements"
"$work/h2d_ref" < "$work/ref.in" > "$work/ref.out"

awk -v tol="$TOLERANCE" '
  FNR == NR {                       # reference: cpu device bytes dir mem bps
    key = $1 " " $2 " " $3 " " $4 " " $5
    ref[key] = ref[key] " " $6
    next
  }
  FNR == 1 { next }                 # chd csv header
  {
    split($0, f, ",")
    key = f[1] " " f[3] " " f[4] " " f[5] " " f[6]
    n = split(ref[key], v, " ")
    # median of the reference samples
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    r = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    if (f[7] == "" || r == "" || r == 0) { printf "%5s %4s %6s %5d %4s %9s  missing\n", f[1], f[2], f[3], f[4] / 1048576, f[5], f[6]; bad = 1; next }
    ratio = f[7] / r
    printf "%5s %4s %6s %5d %4s %9s %9.2f %9.2f %7.3f\n", f[1], f[2], f[3], f[4] / 1048576, f[5], f[6], f[7] / 1e9, r / 1e9, ratio
    g = f[4] / 1048576 " MiB " f[5] " " f[6]
    groups[g] = groups[g] " " ratio
  }
  BEGIN { printf "%5s %4s %6s %5s %4s %9s %9s %9s %7s\n", "cpu", "numa", "gpu", "MiB", "dir", "memory", "chd GB/s", "ref GB/s", "ratio" }
  END {
    print ""
    for (g in groups) {
      n = split(groups[g], v, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      ok = (m >= 1 - tol && m <= 1 + tol)
      printf "%-24s median ratio %.3f over %d cells  %s\n", g, m, n, ok ? "PASS" : "FAIL"
      if (!ok) bad = 1
    }
    exit bad
  }' "$work/ref.out" "$work/chd.csv" && verdict=0 || verdict=$?

# Core-pair probe: device 0 and its farthest peer, 2 CPUs per NUMA node for each rank, one
# sample per cell; a failed cell (or no collective at all) fails the check.
ngpu=$(nvidia-smi -L | grep -c '^GPU ' || true)
if [ "$ngpu" -ge 2 ]; then
  echo
  echo "pair: $ngpu GPUs; chd probe pair --pair auto (NCCL if found, else peer copies)"
  if "$chd" probe pair --backend cuda --pair auto --cpus per-node:2 --sizes 64 --repeats 1 \
      --format table > "$work/pair.txt" 2> "$work/pair.log"; then
    cat "$work/pair.txt"
    grep -E '^(note|pair probe|measuring)' "$work/pair.log" || true
  else
    cat "$work/pair.txt"
    echo "pair: chd probe pair failed; log:"
    tail -20 "$work/pair.log"
    verdict=1
  fi
else
  echo
  echo "pair: this machine has $ngpu GPU; the core-pair probe needs two: skipped"
fi

echo "took $(( $(date +%s) - start )) s after the build"
exit "$verdict"
