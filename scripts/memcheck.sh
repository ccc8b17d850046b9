#!/usr/bin/env bash
# chd's FFI under valgrind memcheck (issue 14, part 5): the debug chd binary against the fake
# runtime (tests/fake-runtime, one library playing libcudart, NVML, libascendcl, NCCL and
# HCCL) for every command that calls into a vendor library:
#   chd probe h2d (CUDA), chd probe pair (CUDA + NCCL), chd probe h2d and pair (ACL + HCCL),
#   chd topology (CUDA + NVML), the error paths (a failing ACL device, failing NCCL
#   collectives, a hung CUDA device whose cell times out), and chd serve (a copy window and a pair window, /metrics scraped plain and
#   gzip, then SIGTERM).
# A run fails on any invalid read or write, use of uninitialised memory, invalid free, or
# definitely lost block (valgrind --error-exitcode), and when chd itself exits non-zero.
# AddressSanitizer would need a nightly toolchain, which CI does not have.
#
# Suppressions (scripts/memcheck.supp) cover only what is not chd's: see the comments there.
# Before the runs, two canaries (a C program that leaks and one that reads past a buffer)
# must fail under the same options, so a run that passes means something.
#
# Needs valgrind (scripts/test.sh installs it) and a debug build (`cargo build --workspace`;
# this script runs it first). About 3 minutes here; each run is bounded by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "scripts/memcheck.sh: $*" >&2
  exit 1
}

command -v valgrind >/dev/null 2>&1 || fail "valgrind is needed (apt-get install valgrind)"
command -v curl >/dev/null 2>&1 || fail "curl is needed (apt-get install curl)"
command -v cc >/dev/null 2>&1 || fail "a C compiler is needed for the canaries (apt-get install gcc)"

cargo build --quiet --locked --workspace
chd=$PWD/target/debug/chd
lib=$PWD/target/debug/libchd_fake_runtime.so
if [ ! -x "$chd" ] || [ ! -f "$lib" ]; then fail "no $chd or $lib after cargo build"; fi

work=$(mktemp -d)
serve_pid=
cleanup() {
  if [ -n "$serve_pid" ]; then kill -KILL "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# 99: an error valgrind found (any other non-zero status is chd's own).
vg=(valgrind --error-exitcode=99 --leak-check=full --show-leak-kinds=definite
  --errors-for-leak-kinds=definite --track-origins=yes --keep-debuginfo=yes
  --suppressions=scripts/memcheck.supp --quiet)

# The first two CPUs this process may use (pair probes need two).
cpus=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:2])))')
[[ $cpus == *,* ]] || fail "needs two CPUs, has $cpus"

cuda=(--backend cuda --cuda-runtime "$lib" --nvml "$lib")
acl=(--backend acl --acl-runtime "$lib")
probe=(--cpus "$cpus" --sizes 1MiB --warmup 1 --iterations 2 --repeats 1 --no-progress-bar)
export CHD_FAKE_DEVICE_COUNT=2

failed=()
start_all=$(date +%s)

# Run NAME EXPECTED COMMAND...: under valgrind, log in $work/NAME.log, one line of result;
# EXPECTED is chd's own exit status (1 when cells fail on purpose).
check() {
  local name=$1 expected=$2 status=0 start
  shift 2
  start=$(date +%s)
  timeout 600 "${vg[@]}" --log-file="$work/$name.valgrind" "$@" >"$work/$name.log" 2>&1 || status=$?
  report "$name" "$status" "$start" "$expected"
}

report() {
  local name=$1 status=$2 start=$3 expected=${4:-0} errors
  errors=$(grep -c '^==[0-9]*== [A-Z]' "$work/$name.valgrind" 2>/dev/null || true)
  if [ "$status" -eq "$expected" ]; then
    echo "memcheck: $name: clean in $(($(date +%s) - start)) s"
  else
    echo "memcheck: $name: FAILED (status $status, $errors valgrind lines) in $(($(date +%s) - start)) s"
    echo "--- valgrind ($name)"
    cat "$work/$name.valgrind"
    echo "--- output ($name)"
    tail -40 "$work/$name.log"
    failed+=("$name")
  fi
}

# Canaries: the options must catch a definite leak and an invalid read.
cat >"$work/leak.c" <<'EOF'
#include <stdlib.h>
int main(void) { volatile char *p = malloc(64); p[0] = 1; p = 0; return 0; }
EOF
cat >"$work/overread.c" <<'EOF'
#include <stdlib.h>
int main(void) { volatile char *p = malloc(8); int c = p[8]; free((void *)p); return c == 7; }
EOF
for canary in leak overread; do
  cc -O0 -g -o "$work/$canary" "$work/$canary.c"
  status=0
  "${vg[@]}" --log-file="$work/$canary.valgrind" "$work/$canary" || status=$?
  [ "$status" -eq 99 ] || fail "the $canary canary passed memcheck (status $status): the options catch nothing"
done
echo "memcheck: canaries: a leak and an invalid read fail as they should"

check probe-h2d-cuda 0 "$chd" probe h2d "${probe[@]}" --out "$work/h2d-cuda" "${cuda[@]}"
check probe-pair-nccl 0 "$chd" probe pair --pair 0,1 "${probe[@]}" --out "$work/pair-nccl" \
  "${cuda[@]}" --nccl "$lib" --collective nccl
check probe-h2d-acl 0 "$chd" probe h2d "${probe[@]}" --out "$work/h2d-acl" "${acl[@]}"
check probe-pair-hccl 0 "$chd" probe pair --pair 0,1 "${probe[@]}" --out "$work/pair-hccl" \
  "${acl[@]}" --hccl "$lib" --collective hccl
check topology 0 "$chd" topology "${cuda[@]}"
# The error paths read the vendor's message strings (aclGetRecentErrMsg, ncclGetLastError).
CHD_FAKE_FAIL_DEVICES=1 check probe-h2d-acl-failing 1 "$chd" probe h2d "${probe[@]}" \
  --out "$work/h2d-acl-failing" "${acl[@]}"
CHD_FAKE_PAIR_FAIL=1 check probe-pair-nccl-failing 1 "$chd" probe pair --pair 0,1 "${probe[@]}" \
  --out "$work/pair-nccl-failing" "${cuda[@]}" --nccl "$lib" --collective nccl
# A hung device (issue 25): its first cell times out after probe.cell_timeout (10 s) and
# keeps its memory (never freed under the DMA), its second is refused as quarantined.
CHD_FAKE_HANG_DEVICES=1 check probe-h2d-cuda-hung 1 "$chd" probe h2d "${probe[@]}" \
  --out "$work/h2d-cuda-hung" "${cuda[@]}"

# chd serve: the first window right at start (copies, then the pair), two scrapes, SIGTERM.
name=serve
start=$(date +%s)
mkdir -p "$work/state"
"${vg[@]}" --log-file="$work/$name.valgrind" "$chd" serve --listen 127.0.0.1:0 \
  --state-dir "$work/state" --interval 1h --cpu-busy-threshold 1 --cpus "$cpus" --sizes 1 \
  --warmup 1 --iterations 2 --pair 0,1 --pair-size 1 --nccl "$lib" --collective nccl \
  "${cuda[@]}" >"$work/$name.log" 2>&1 &
serve_pid=$!
deadline=$(($(date +%s) + 300))
until grep -q 'probe window done' "$work/$name.log"; do
  if ! kill -0 "$serve_pid" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
    tail -40 "$work/$name.log" >&2
    fail "chd serve under valgrind finished no window within 300 s"
  fi
  sleep 1
done
addr=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$work/$name.log" | head -1)
curl -sf -o "$work/plain.prom" "http://$addr/metrics" || fail "plain scrape of chd serve failed"
curl -sf --compressed -o "$work/gzip.prom" "http://$addr/metrics" || fail "gzip scrape of chd serve failed"
grep -q '^chd_pair_bandwidth_bytes_per_second{' "$work/plain.prom" ||
  fail "the serve window measured no pair cell"
kill -TERM "$serve_pid"
status=0
timeout 120 tail --pid="$serve_pid" -f /dev/null || fail "chd serve did not stop within 120 s of SIGTERM"
wait "$serve_pid" || status=$?
serve_pid=
report "$name" "$status" "$start"

echo "memcheck: ${#failed[@]} of 9 runs failed, $(($(date +%s) - start_all)) s in all"
[ ${#failed[@]} -eq 0 ] || fail "errors in: ${failed[*]}"
