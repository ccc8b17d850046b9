#!/usr/bin/env bash
# Runs what `cargo test --locked --workspace` runs (every workspace package's unit tests,
# doctests and integration-test binaries), with the test binaries side by side. cargo runs
# its test binaries one after another, and most suites spend much of their time waiting (on a
# chd serve's windows, Prometheus, slurmd, child processes), so here they run CHD_TEST_JOBS
# at a time (default: one per CPU this process may use), the longest first; each one's output
# goes to its own log, printed whole, in the order below, once all have finished (a line says
# when each one ends). tests/load.rs runs last and alone: it saturates the CPUs on purpose and
# measures under that load only (its doc comment).
#
# Every test target comes from `cargo metadata`, so a new suite runs without a change here;
# every invocation selects with --workspace, so features resolve as for the build before it
# and nothing is rebuilt. A failing binary does not stop the others: the script fails at the
# end, naming each one that failed. Arguments after `--` go to every test binary.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "scripts/test-suites.sh: $*" >&2
  exit 1
}

parallel=${CHD_TEST_JOBS:-$(nproc)}
[[ $parallel =~ ^[1-9][0-9]*$ ]] || fail "CHD_TEST_JOBS must be a count of 1 or more, not '$parallel'"
harness=()
if [ "${1:-}" = -- ]; then
  shift
  harness=(-- "$@")
elif [ $# -gt 0 ]; then
  fail "unexpected arguments: $* (test binary arguments go after --)"
fi

# The alone suite, and the longest suites (about 45, 35, 35, 30, 25 s here), to start first.
alone=load
longest=(serve faults rules fleet runtime probe_cli)

# "package test-target" for every integration-test target of the workspace.
targets=$(cargo metadata --locked --format-version 1 --no-deps | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
for p in meta["packages"]:
    if p["id"] in members:
        for t in p["targets"]:
            if "test" in t["kind"]:
                print(p["name"], t["name"])
')
[ -n "$targets" ] || fail "cargo metadata lists no test targets"
dupes=$(awk '{print $2}' <<<"$targets" | sort | uniq -d)
[ -z "$dupes" ] || fail "test targets of the same name in two packages (--workspace --test would run both): $dupes"
grep -q " $alone\$" <<<"$targets" || fail "no test target '$alone' (tests/$alone.rs), which must run alone"

# The jobs, each a name and its cargo test selection: chd's suites one a job, the longest
# first; another package's integration tests one job per package; the unit tests; the
# doctests.
names=()
selections=()
add_job() {
  names+=("$1")
  selections+=("$2")
}
for suite in "${longest[@]}"; do
  if grep -q "^chd $suite\$" <<<"$targets"; then add_job "$suite" "--test $suite"; fi
done
while read -r package target; do
  [ "$package" = chd ] || continue
  [ "$target" = "$alone" ] && continue
  [[ " ${longest[*]} " == *" $target "* ]] && continue
  add_job "$target" "--test $target"
done <<<"$targets"
while read -r package; do
  add_job "$package" "$(awk -v p="$package" '$1 == p {printf " --test %s", $2}' <<<"$targets" | cut -c2-)"
done < <(awk '$1 != "chd" {print $1}' <<<"$targets" | sort -u)
add_job unit-tests "--lib --bins"
add_job doctests "--doc"

# Build every test target first: the jobs then only run them (nothing waits on the build lock).
cargo test --locked --workspace --no-run --quiet

logs=$(mktemp -d)
cleanup() {
  # Our own background jobs, by their pids (an interrupted run).
  local pids
  pids=$(jobs -pr)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086 # one pid a word
    kill -TERM $pids 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  rm -rf "$logs"
}
trap cleanup EXIT

echo "scripts/test-suites.sh: ${#names[@]} test jobs, $parallel at a time, then $alone alone"
start_all=$(date +%s)
for i in "${!names[@]}"; do
  while (($(jobs -pr | wc -l) >= parallel)); do wait -n || true; done
  (
    name=${names[$i]}
    start=$(date +%s)
    status=0
    # shellcheck disable=SC2086 # the selection is words
    cargo test --locked --workspace ${selections[$i]} "${harness[@]}" >"$logs/$i.log" 2>&1 || status=$?
    echo "$status" >"$logs/$i.status"
    echo "scripts/test-suites.sh: $name ended (status $status) in $(($(date +%s) - start)) s"
  ) &
done
wait

failed=()
for i in "${!names[@]}"; do
  echo "=== cargo test --locked --workspace ${selections[$i]}"
  cat "$logs/$i.log"
  status=$(cat "$logs/$i.status" 2>/dev/null || echo none)
  [ "$status" = 0 ] || failed+=("${names[$i]} (status $status)")
done
echo "scripts/test-suites.sh: ${#names[@]} test jobs in $(($(date +%s) - start_all)) s, ${#failed[@]} failed"

echo "=== cargo test --locked --workspace --test $alone (alone)"
start=$(date +%s)
status=0
cargo test --locked --workspace --test "$alone" "${harness[@]}" || status=$?
echo "scripts/test-suites.sh: $alone ended (status $status) in $(($(date +%s) - start)) s"
[ "$status" = 0 ] || failed+=("$alone (status $status)")

if ((${#failed[@]})); then
  fail "failed: $(IFS=,; echo "${failed[*]}")"
fi
