#!/usr/bin/env bash
# chd's FFI under valgrind memcheck (issue 14, part 5): the debug chd binary against the fake
# runtime (tests/fake-runtime, one library playing libcudart, NVML, libascendcl, NCCL and
# HCCL) for every command that calls into a vendor library:
#   chd probe h2d (CUDA), chd probe pair (CUDA + NCCL), chd probe h2d and pair (ACL + HCCL),
#   chd topology (CUDA + NVML), the error paths (a failing ACL device, failing NCCL
#   collectives, a hung CUDA device whose cell times out), and chd serve (a copy window and a
#   pair window, /metrics scraped plain and gzip, then SIGTERM).
# A run fails on any invalid read or write, use of uninitialised memory, invalid free, or
# definitely lost block (valgrind --error-exitcode), and when chd itself exits non-zero.
# AddressSanitizer would need a nightly toolchain, which CI does not have.
#
# Suppressions (scripts/memcheck.supp) cover only what is not chd's: see the comments there.
# Before the runs, two canaries (a C program that leaks and one that reads past a buffer)
# must fail under the same options, so a run that passes means something.
#
# Needs valgrind (scripts/test.sh installs it) and a debug build (`cargo build --workspace`;
# this script runs it first). The runs go side by side, one per CPU (CHD_MEMCHECK_JOBS=N
# sets how many); each is bounded by `timeout`.
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
cleanup() {
  # Our own background cases (each stops its own chd serve as it exits), by their pids.
  local pids
  pids=$(jobs -pr)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086 # one pid a word
    kill -TERM $pids 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# 99: an error valgrind found (any other non-zero status is chd's own).
vg=(valgrind --error-exitcode=99 --leak-check=full --show-leak-kinds=definite
  --errors-for-leak-kinds=definite --track-origins=yes --keep-debuginfo=yes
  --suppressions=scripts/memcheck.supp --quiet)

# The CPUs this process may use; the first two go to every probe (pair probes need two).
read -ra allowed_cpus <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
((${#allowed_cpus[@]} >= 2)) || fail "needs two CPUs, has ${allowed_cpus[*]}"
cpus=${allowed_cpus[0]},${allowed_cpus[1]}
# The cases run side by side, CHD_MEMCHECK_JOBS at a time (default: one per CPU this process
# may use, so 2 on the 2-core CI machine): valgrind runs a program's threads one at a time, so
# a case keeps about one CPU busy, and each case gets about the CPU it had when they ran one
# after the other. Each case keeps its own logs and result lines; once all have finished the
# results are printed in the order of `order`, as when they ran one after the other.
parallel=${CHD_MEMCHECK_JOBS:-${#allowed_cpus[@]}}
[[ $parallel =~ ^[1-9][0-9]*$ ]] || fail "CHD_MEMCHECK_JOBS must be a count of 1 or more, not '$parallel'"

cuda=(--backend cuda --cuda-runtime "$lib" --nvml "$lib")
acl=(--backend acl --acl-runtime "$lib")
probe=(--cpus "$cpus" --sizes 1MiB --warmup 1 --iterations 2 --repeats 1 --no-progress-bar)
export CHD_FAKE_DEVICE_COUNT=2

order=(probe-h2d-cuda probe-pair-nccl probe-h2d-acl probe-pair-hccl topology probe-h2d-acl-failing
  probe-pair-nccl-failing probe-h2d-cuda-hung serve)
cases=()
start_all=$(date +%s)

# in_background NAME COMMAND...: COMMAND (a function below) in a subshell in the background,
# once fewer than $parallel cases run; what it prints goes to $work/NAME.result, its exit
# status to $work/NAME.status (the case passed when that is 0). Environment assignments before
# `in_background` reach the case's commands (bash exports them to a function's commands).
in_background() {
  local name=$1
  shift
  cases+=("$name")
  while (($(jobs -pr | wc -l) >= parallel)); do wait -n || true; done
  (
    status=0
    ("$@") >"$work/$name.result" 2>&1 || status=$?
    echo "$status" >"$work/$name.status"
  ) &
}

# check NAME EXPECTED COMMAND...: under valgrind, log in $work/NAME.log, one line of result;
# EXPECTED is chd's own exit status (1 when cells fail on purpose). Non-zero when it failed.
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
    return 1
  fi
}

# chd serve: the first window right at start (copies, then the pair), two scrapes, SIGTERM.
# Runs in a subshell of its own: a failure prints a FAILED line with the reason and the end of
# chd's output and exits it, and the EXIT trap stops this case's chd serve by its pid.
serve_case() {
  local name=serve start serve_pid status=0 deadline addr
  start=$(date +%s)
  mkdir -p "$work/state"
  "${vg[@]}" --log-file="$work/$name.valgrind" "$chd" serve --listen 127.0.0.1:0 \
    --state-dir "$work/state" --interval 1h --cpu-busy-threshold 1 --cpus "$cpus" --sizes 1 \
    --warmup 1 --iterations 2 --pair 0,1 --pair-size 1 --nccl "$lib" --collective nccl \
    "${cuda[@]}" >"$work/$name.log" 2>&1 &
  serve_pid=$!
  # shellcheck disable=SC2064 # this case's own chd serve, by the pid known now
  trap "kill -KILL $serve_pid 2>/dev/null || true" EXIT
  deadline=$(($(date +%s) + 300))
  until grep -q 'probe window done' "$work/$name.log"; do
    if ! kill -0 "$serve_pid" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
      serve_failed "$start" "chd serve under valgrind finished no window within 300 s"
    fi
    sleep 1
  done
  addr=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$work/$name.log" | head -1)
  curl -sf -o "$work/plain.prom" "http://$addr/metrics" ||
    serve_failed "$start" "plain scrape of chd serve failed"
  curl -sf --compressed -o "$work/gzip.prom" "http://$addr/metrics" ||
    serve_failed "$start" "gzip scrape of chd serve failed"
  grep -q '^chd_pair_bandwidth_bytes_per_second{' "$work/plain.prom" ||
    serve_failed "$start" "the serve window measured no pair cell"
  kill -TERM "$serve_pid"
  timeout 120 tail --pid="$serve_pid" -f /dev/null ||
    serve_failed "$start" "chd serve did not stop within 120 s of SIGTERM"
  wait "$serve_pid" || status=$?
  trap - EXIT
  report "$name" "$status" "$start"
}

# serve_failed START REASON: the serve case's FAILED lines, then the end of its subshell.
serve_failed() {
  echo "memcheck: serve: FAILED ($2) in $(($(date +%s) - $1)) s"
  echo "--- output (serve)"
  tail -40 "$work/serve.log"
  exit 1
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
echo "memcheck: ${#order[@]} runs, $parallel at a time"

# The longest cases first (each one's time alone here: about 45, 45, 30, 30, 25 s; the rest
# 5-20 s), so the last to start are short ones.
# A hung device (issue 25): its first cell times out after probe.cell_timeout (10 s) and
# keeps its memory (never freed under the DMA), its second is refused as quarantined.
CHD_FAKE_HANG_DEVICES=1 in_background probe-h2d-cuda-hung check probe-h2d-cuda-hung 1 "$chd" \
  probe h2d "${probe[@]}" --out "$work/h2d-cuda-hung" "${cuda[@]}"
# The error paths read the vendor's message strings (aclGetRecentErrMsg, ncclGetLastError).
CHD_FAKE_PAIR_FAIL=1 in_background probe-pair-nccl-failing check probe-pair-nccl-failing 1 \
  "$chd" probe pair --pair 0,1 "${probe[@]}" --out "$work/pair-nccl-failing" "${cuda[@]}" \
  --nccl "$lib" --collective nccl
in_background probe-pair-nccl check probe-pair-nccl 0 "$chd" probe pair --pair 0,1 \
  "${probe[@]}" --out "$work/pair-nccl" "${cuda[@]}" --nccl "$lib" --collective nccl
in_background probe-h2d-acl check probe-h2d-acl 0 "$chd" probe h2d "${probe[@]}" \
  --out "$work/h2d-acl" "${acl[@]}"
in_background serve serve_case
in_background probe-h2d-cuda check probe-h2d-cuda 0 "$chd" probe h2d "${probe[@]}" \
  --out "$work/h2d-cuda" "${cuda[@]}"
in_background probe-pair-hccl check probe-pair-hccl 0 "$chd" probe pair --pair 0,1 \
  "${probe[@]}" --out "$work/pair-hccl" "${acl[@]}" --hccl "$lib" --collective hccl
CHD_FAKE_FAIL_DEVICES=1 in_background probe-h2d-acl-failing check probe-h2d-acl-failing 1 \
  "$chd" probe h2d "${probe[@]}" --out "$work/h2d-acl-failing" "${acl[@]}"
in_background topology check topology 0 "$chd" topology "${cuda[@]}"
wait
[ "$(printf '%s\n' "${cases[@]}" | sort)" = "$(printf '%s\n' "${order[@]}" | sort)" ] ||
  fail "the cases started (${cases[*]}) are not the cases of order (${order[*]})"

failed=()
for name in "${order[@]}"; do
  cat "$work/$name.result"
  status=$(cat "$work/$name.status" 2>/dev/null || echo none)
  if [ "$status" != 0 ]; then
    grep -q "^memcheck: $name: FAILED" "$work/$name.result" ||
      echo "memcheck: $name: FAILED (the case ended with status $status)"
    failed+=("$name")
  fi
done
echo "memcheck: ${#failed[@]} of ${#order[@]} runs failed, $(($(date +%s) - start_all)) s in all"
[ ${#failed[@]} -eq 0 ] || fail "errors in: ${failed[*]}"
