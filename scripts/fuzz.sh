#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/) for SECONDS_PER_TARGET seconds (default
# 60) and prints one line per target: executions, corpus size, result. Fails when a target
# crashes (its input is kept under fuzz/artifacts/TARGET/; make it a regression test by
# copying it to fuzz/regressions/TARGET/ once fixed) or cannot run.
#
# Needs a nightly toolchain and cargo-fuzz; installs both when missing (rustup toolchain
# install nightly --profile minimal; cargo install cargo-fuzz --locked), and fails with a
# clear message when it cannot. Seeds come from fuzz/seeds.txt; everything a run finds is
# kept in fuzz/corpus/TARGET/ (ignored by git) for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi

fail() {
  echo "scripts/fuzz.sh: $*" >&2
  exit 1
}

command -v rustup >/dev/null 2>&1 || fail "rustup is needed to install a nightly toolchain (https://rustup.rs)"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "scripts/fuzz.sh: installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal >/dev/null ||
    fail "cannot install the nightly toolchain (rustup toolchain install nightly --profile minimal)"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "scripts/fuzz.sh: installing cargo-fuzz"
  cargo install cargo-fuzz --locked >/dev/null 2>&1 ||
    fail "cannot install cargo-fuzz (cargo install cargo-fuzz --locked)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One seed directory per target from fuzz/seeds.txt (FILE, DIR or FILE+FILE joined by NUL).
while read -r target path; do
  [[ -z $target || $target == \#* ]] && continue
  mkdir -p "$work/seeds/$target"
  if [[ -d $path ]]; then
    cp "$path"/* "$work/seeds/$target/"
  else
    IFS=+ read -r -a parts <<<"$path"
    out="$work/seeds/$target/$(echo "$path" | tr '/+' '__')"
    cat "${parts[0]}" >"$out"
    for more in "${parts[@]:1}"; do
      printf '\0' >>"$out"
      cat "$more" >>"$out"
    done
  fi
done <fuzz/seeds.txt

start=$(date +%s)
cargo +nightly fuzz build >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2
  fail "cargo +nightly fuzz build failed"
}
echo "scripts/fuzz.sh: targets built in $(($(date +%s) - start)) s; ${seconds} s per target"

failed=()
for source in fuzz/fuzz_targets/*.rs; do
  target=$(basename "$source" .rs)
  [[ -d $work/seeds/$target ]] || fail "fuzz/seeds.txt lists no seed for $target"
  corpus=fuzz/corpus/$target
  mkdir -p "$corpus" "fuzz/artifacts/$target"
  dirs=("$corpus" "$work/seeds/$target")
  [[ -d fuzz/regressions/$target ]] && dirs+=("fuzz/regressions/$target")
  log=$work/$target.log
  set +e
  cargo +nightly fuzz run "$target" "${dirs[@]}" -- \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  units=$(find "$corpus" -type f | wc -l)
  if ((rc == 0)); then
    printf '%-18s %10s executions in %s s, corpus %s inputs: ok\n' "$target" "${execs:-?}" "$seconds" "$units"
  else
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    printf '%-18s %10s executions: CRASH (exit %s) %s\n' "$target" "${execs:-?}" "$rc" "${artifact:-}"
    grep -m1 -A12 -E "panicked|ERROR: libFuzzer|ERROR: AddressSanitizer" "$log" | sed 's/^/    /' || tail -20 "$log"
    failed+=("$target")
  fi
done

if ((${#failed[@]})); then
  fail "crashed: ${failed[*]}"
fi
