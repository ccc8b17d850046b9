#!/usr/bin/env bash
# chd's benchmarks in one table (issue 13 part 5), measured side by side in one run so the
# ratios mean something on a shared, noisy machine. Bounded: about 5 minutes after the
# release build. Prints the table to stdout and writes it to target/bench/table.md (copy it
# into BENCHMARKS.md with the machine and the date when it changes).
#
#   scripts/bench.sh            # everything
#   BENCH_QUICK=1 scripts/bench.sh   # fewer samples (a smoke run of the script itself)
#
# What it measures:
#   1. scrape: a 640 CPU x 16 device x 3 size store (30,720 cells), with cells and without
#      (benches/scrape.rs): GET /metrics over HTTP to the real server in process, plain and
#      gzip, served from the per-window cache (what chd serve runs) and, interleaved in the
#      same rounds, encoded afresh at every scrape (before the cache; also what the first
#      scrape after a probe window pays): median time, bytes, series, and the ratio; the same
#      for the /api/v1/calibration ledger of that store (kept per generation vs built per
#      request, in process, 15 interleaved rounds). Plus
#      (benches/connections.rs) RSS and /healthz under 10,000 half-open connections, and
#      (benches/login_flood.rs) valid scrapes with basic auth at bcrypt cost 10, unloaded and
#      while 30 clients loop wrong passwords, and their ratio.
#   2. collectors over HTTP: chd serve --no-probe and Debian's prometheus-node-exporter on the
#      same fixture tree (tests/fixtures/collectors/roce-dual-rail), their counter collectors
#      only (chd: rdma, numa, netdev, pcie; node_exporter: infiniband, netdev, meminfo_numa),
#      N scrapes each, interleaved: median time and the ratio.
#   3. host copy: chd probe h2d --backend host on CPU 0 (64 MiB, node 0) against a plain C
#      memcpy loop built here, on the same CPU, same size, in the same run: GB/s and ratio.
#   4. idle CPU: chd serve --no-probe for 20 s, scraped every 5 s: CPU time used, as % of a core.
#   5. probe throughput: windows over the fake runtime's cost model (benches/probe_throughput.rs),
#      per-cell pinning vs grouped cells: cells per second of probe budget, the simulated time
#      to cover 30,720 cells at the default 3.3 % duty, and the ratio.
#   6. recordings: chd report on a 640 x 640 ClusterHealthDetect pair recording (409,600 rows)
#      and chd serve --replay of a 640 x 16 x 3 H2D recording (30,720 rows), both written by
#      scripts/gen-recording.py (once per version of that script, kept in target/bench):
#      peak RSS and time of the report, RSS of the replaying server once it listens.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=${BENCH_QUICK:-}
scrapes=$([ -n "$quick" ] && echo 30 || echo 200)
idle_s=$([ -n "$quick" ] && echo 5 || echo 20)
out=target/bench
mkdir -p "$out"

missing=()
command -v prometheus-node-exporter >/dev/null 2>&1 || missing+=(prometheus-node-exporter)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
[ -x /usr/bin/time ] || missing+=(time)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "scripts/bench.sh: needs ${missing[*]} (apt-get install -y ${missing[*]}); run as root or install sudo" >&2
    exit 1
  fi
  echo "scripts/bench.sh: installing ${missing[*]}" >&2
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cargo build --release --locked --quiet
chd=target/release/chd
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# The median of the numbers on stdin.
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) {print "nan"} else if (NR%2) {print v[(NR+1)/2]} else {print (v[NR/2]+v[NR/2+1])/2}}'; }

# Start `chd serve` with "$@" on a free port; sets $chd_pid and $chd_url.
start_chd() {
  local log="$out/chd-$1.log"
  shift
  : >"$log"
  "$chd" serve --listen 127.0.0.1:0 --state-dir "$(mktemp -d)" "$@" >"$log" 2>&1 &
  chd_pid=$!
  pids+=("$chd_pid")
  for _ in $(seq 100); do
    addr=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$log" | head -1)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "scripts/bench.sh: chd did not start, see $log" >&2; exit 1; }
  chd_url="http://$addr/metrics"
}

rows=()
row() { rows+=("| $1 | $2 | $3 |"); }

# 1. Scraping the matrix (benches/scrape.rs: criterion in process, then HTTP rounds).
echo "scripts/bench.sh: scrape (benches/scrape.rs)" >&2
measure=$([ -n "$quick" ] && echo 1 || echo 3)
CHD_BENCH_HTTP_ROUNDS=$([ -n "$quick" ] && echo 20 || echo 100) \
  cargo bench --locked --quiet --bench scrape -- --warm-up-time 1 --measurement-time "$measure" \
  --noplot >"$out/scrape.txt" 2>&1
fig() { sed -n "s/^scrape: $1=\([0-9]*\).*/\1/p" "$out/scrape.txt" | head -1; }
http() { # median ms and bytes of the HTTP case $1 ("cached cells_on gzip", ...)
  sed -n "s/^scrape: http $1 median_ms=\([0-9.]*\) p99_ms=[0-9.]* bytes=\([0-9]*\)$/\1 \2/p" "$out/scrape.txt" | head -1
}
for cells in on off; do
  for coding in identity gzip; do
    read -r ms bytes <<<"$(http "cached cells_$cells $coding")"
    read -r before _ <<<"$(http "uncached cells_$cells $coding")"
    if [ -z "$ms" ] || [ -z "$before" ]; then
      echo "scripts/bench.sh: no http figures in $out/scrape.txt" >&2
      exit 1
    fi
    target=$([ "$cells" = on ] && echo 5 || echo 2)
    note="$bytes bytes"
    [ "$coding" = gzip ] && [ "$cells" = on ] && note="$note on the wire (target < 400 KB)"
    [ "$coding" = identity ] && note="$note, $(fig "prometheus_text$([ "$cells" = off ] && echo _no_cells) series") series"
    row "scrape over HTTP, cells $cells, $coding, cached (median)" "$ms ms" "$note; target < $target ms"
    row "scrape over HTTP, cells $cells, $coding, encoded per scrape (median)" "$before ms" \
      "$(awk -v a="$before" -v b="$ms" 'BEGIN {printf "%.0f", a/b}') x the cached time, same rounds"
  done
done
read -r ledger_cached ledger_rebuilt ledger_bytes ledger_ratio <<<"$(sed -n \
  's/^scrape: ledger cached_ms=\([0-9.]*\) rebuilt_ms=\([0-9.]*\) bytes=\([0-9]*\) ratio=\([0-9]*\)$/\1 \2 \3 \4/p' \
  "$out/scrape.txt" | head -1)"
if [ -z "$ledger_cached" ]; then
  echo "scripts/bench.sh: no ledger figures in $out/scrape.txt" >&2
  exit 1
fi
row "/api/v1/calibration, kept per store generation (median)" "$ledger_cached ms" \
  "$ledger_bytes bytes, same store; target < 5 ms"
row "/api/v1/calibration, built per request (median)" "$ledger_rebuilt ms" \
  "$ledger_ratio x the kept page's time, same rounds"
read -r fabric_cached fabric_files fabric_bytes <<<"$(sed -n \
  's/^scrape: ledger with fabric cached_ms=\([0-9.]*\) files=\([0-9]*\) bytes=\([0-9]*\)$/\1 \2 \3/p' \
  "$out/scrape.txt")"
if [ -z "$fabric_cached" ]; then
  echo "scripts/bench.sh: no ledger-with-fabric figures in $out/scrape.txt" >&2
  exit 1
fi
row "/api/v1/calibration with fabric results, kept (median)" "$fabric_cached ms" \
  "$fabric_files result files listed per request (15 peers x 8 runs), $fabric_bytes bytes"
row "RSS after building the store and registry" "$(($(fig rss_after_build_kib) / 1024)) MiB" \
  "benches/scrape.rs process"

# 2. Counter collectors: chd vs node_exporter on one fixture tree, over HTTP.
echo "scripts/bench.sh: collectors vs node_exporter ($scrapes scrapes each)" >&2
tree=tests/fixtures/collectors/roce-dual-rail
start_chd collectors --no-probe --backend host --sysfs-root "$tree/sys" --procfs-root "$tree/proc"
ne_port=$((20000 + RANDOM % 20000))
prometheus-node-exporter --web.listen-address="127.0.0.1:$ne_port" \
  --path.sysfs="$tree/sys" --path.procfs="$tree/proc" --collector.disable-defaults \
  --collector.infiniband --collector.netdev --collector.meminfo_numa \
  >"$out/node_exporter.log" 2>&1 &
pids+=("$!")
ne_url="http://127.0.0.1:$ne_port/metrics"
for _ in $(seq 100); do curl -fs -o /dev/null "$ne_url" && break; sleep 0.1; done
: >"$out/chd-times" && : >"$out/ne-times"
for _ in $(seq "$scrapes"); do
  curl -fs -o /dev/null -w '%{time_total}\n' "$chd_url" >>"$out/chd-times"
  curl -fs -o /dev/null -w '%{time_total}\n' "$ne_url" >>"$out/ne-times"
done
chd_ms=$(median <"$out/chd-times" | awk '{print $1*1000}')
ne_ms=$(median <"$out/ne-times" | awk '{print $1*1000}')
chd_series=$(curl -fs "$chd_url" | grep -vc '^#')
ne_series=$(curl -fs "$ne_url" | grep -vc '^#')
row "collectors scrape over HTTP, chd (median)" "$chd_ms ms" "$chd_series series"
row "collectors scrape over HTTP, node_exporter 1.5 (median)" "$ne_ms ms" "$ne_series series"
row "chd / node_exporter scrape time" "$(awk -v a="$chd_ms" -v b="$ne_ms" 'BEGIN {printf "%.2f", a/b}')" \
  "same tree, interleaved"

# 2b. 10,000 half-open connections against the default connection cap.
echo "scripts/bench.sh: 10,000 half-open connections" >&2
cargo bench --locked --quiet --bench connections >"$out/connections.txt" 2>&1
conn() { sed -n "s/^connections: .*$1=\([0-9.]*\).*/\1/p" "$out/connections.txt" | head -1; }
row "RSS with 10,000 half-open connections" "$(($(conn rss_with_open_kib) / 1024)) MiB" \
  "$(($(conn rss_before_kib) / 1024)) MiB before, $(($(conn rss_after_close_kib) / 1024)) MiB after they close (targets < 64, < 40)"
row "/healthz during the flood" "$(sed -n 's/^connections: healthz_ok=\([0-9/]*\).*/\1/p' "$out/connections.txt")" \
  "slowest $(conn slowest_ms) ms"

# 2c. Valid scrapes while 30 clients loop wrong passwords (basic auth at bcrypt cost 10).
echo "scripts/bench.sh: valid scrapes under a wrong-password flood" >&2
CHD_BENCH_ROUNDS=1 cargo bench --locked --quiet --bench login_flood >"$out/login_flood.txt" 2>&1
flood() { # median ms, max ms and scrapes over 1 s of case $1
  sed -n "s/^login_flood: binary=this case=$1 n=[0-9]* median_ms=\([0-9.]*\) p99_ms=[0-9.]* max_ms=\([0-9.]*\) over_1s=\([0-9]*\).*/\1 \2 \3/p" \
    "$out/login_flood.txt" | head -1
}
read -r base _ _ <<<"$(flood unloaded)"
[ -n "$base" ] || { echo "scripts/bench.sh: no figures in $out/login_flood.txt" >&2; exit 1; }
row "valid scrape, basic auth, unloaded (median)" "$base ms" "cached credentials, keep-alive"
for c in same_password_one_address fresh_passwords_30_addresses; do
  read -r ms max over <<<"$(flood "$c")"
  row "valid scrape, 30 clients looping wrong passwords, ${c//_/ } (median)" "$ms ms" \
    "$(awk -v a="$ms" -v b="$base" 'BEGIN {printf "%.1f", a/b}') x unloaded; slowest $max ms, $over over 1 s (target: none)"
done

# 4. Idle CPU of the exporter between windows (the collectors server from step 2).
echo "scripts/bench.sh: idle CPU (${idle_s} s)" >&2
ticks() { awk '{print $14 + $15}' "/proc/$chd_pid/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks)
for _ in $(seq $((idle_s / 5))); do sleep 5; curl -fs -o /dev/null "$chd_url"; done
t1=$(ticks)
# One clock tick is the resolution: 0 ticks reads "under" one tick's share.
row "idle exporter CPU, scraped every 5 s" \
  "$(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$idle_s" 'BEGIN {
      if (d == 0) printf "< %.3f %%", 100/hz/s; else printf "%.3f %%", 100*d/hz/s }')" \
  "$((t1 - t0)) ticks of 1/$hz s in $idle_s s; target < 0.1 % of a core"

# 3. Host backend copy against a reference memcpy on the same CPU.
echo "scripts/bench.sh: host copy vs memcpy" >&2
cat >"$out/memcpy.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* 64 MiB memcpy between two first-touched buffers, best of N timed copies, in bytes/s. */
int main(int argc, char **argv) {
  size_t n = (size_t)64 << 20;
  int reps = argc > 1 ? atoi(argv[1]) : 10;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  double best = 0;
  for (int r = 0; r < reps; r++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memcpy(b, a, n);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (n / s > best) best = n / s;
    a[r % n] = (char)r;
  }
  printf("%.0f\n", best + (b[n - 1] == 99 ? 1 : 0));
  return 0;
}
C
cc -O2 -o "$out/memcpy" "$out/memcpy.c"
ref=$(taskset -c 0 "$out/memcpy" 10)
host=$("$chd" probe h2d --backend host --cpus 0 --devices numa0 --sizes 64 --repeats 3 \
  --format json 2>/dev/null | awk -F': ' '/bytes_per_second/ {gsub(/,/, "", $2); print $2}' | median)
row "host copy, CPU 0 -> node 0, 64 MiB (chd probe h2d)" \
  "$(awk -v v="$host" 'BEGIN {printf "%.2f GB/s", v/1e9}')" "median of 3 samples"
row "reference memcpy, CPU 0, 64 MiB (C, -O2)" \
  "$(awk -v v="$ref" 'BEGIN {printf "%.2f GB/s", v/1e9}')" "best of 10"
row "chd host copy / memcpy" "$(awk -v a="$host" -v b="$ref" 'BEGIN {printf "%.2f", a/b}')" \
  "target within 10 %"

# 5. Probe throughput on the fake runtime's cost model (simulated time, not wall time).
echo "scripts/bench.sh: probe throughput (fake runtime cost model)" >&2
CHD_BENCH_ROUNDS=1 cargo bench --locked --quiet --bench probe_throughput >"$out/throughput.txt" 2>&1
for mode in per-cell grouped; do
  read -r cps hours < <(awk -v m="$mode" '$1 == m {print $7, $8}' "$out/throughput.txt")
  row "probe windows, $mode pinning (fake cost model)" "$cps cells/s" \
    "30,720 cells in $hours h at 3.3 % duty"
done
row "grouped / per-cell cells per second" \
  "$(sed -n 's/^grouped \/ per-cell cells per second of probe budget: \([0-9.]*x\).*/\1/p' "$out/throughput.txt")" \
  "target: 30,720 cells under 12 h"

# 6. Recordings read streaming: the report of a large pair recording, a replay of an H2D one.
echo "scripts/bench.sh: recordings (generate once, report, replay)" >&2
rec="$out/recordings"
mkdir -p "$rec"
gen_id=$(sha256sum scripts/gen-recording.py | cut -c1-12)
pair_rec="$rec/pair-640-$gen_id.json"
h2d_rec="$rec/h2d-640x16x3-$gen_id.json"
# Written once per version of the generator; a cut-short run leaves only a .tmp behind.
gen() { [ -s "$1" ] || { python3 scripts/gen-recording.py "${@:2}" "$1.tmp" && mv "$1.tmp" "$1"; }; }
gen "$pair_rec" pair --cpus 640
gen "$h2d_rec" h2d --cpus 640 --devices 16 --sizes 16,64,256
rm -rf "$rec/report"
/usr/bin/time -v "$chd" report "$pair_rec" --out "$rec/report" >"$rec/report.log" 2>"$rec/report.time"
peak_kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$rec/report.time")
wall_s=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$rec/report.time" |
  awk -F: '{s=0; for (i=1;i<=NF;i++) s=s*60+$i; printf "%.1f", s}')
row "report, 409,600-row pair recording: peak RSS / time" "$((peak_kib / 1024)) MiB / $wall_s s" \
  "$(($(stat -c %s "$pair_rec") / 1000000)) MB of JSON; target < 600 MB"
vm() { awk -v k="$1:" '$1 == k {print int($2 / 1024)}' "/proc/$chd_pid/status"; }
for cells in auto true; do
  start_chd "replay-$cells" --replay "$h2d_rec" --cells "$cells"
  sleep 1
  rss_load=$(vm VmRSS)
  hwm_load=$(vm VmHWM)
  # Scrapes as Prometheus sends them (gzip) and plain ones, each format once cached.
  for _ in $(seq 20); do
    curl -fs -o /dev/null --compressed "$chd_url"
    curl -fs -o /dev/null "$chd_url"
  done
  row "serve --replay, 30,720-cell H2D recording, cells $cells: RSS" \
    "$rss_load MiB after load, $(vm VmRSS) MiB after 40 scrapes" \
    "peak $hwm_load MiB while loading, $(vm VmHWM) MiB overall; target < 40 MiB"
  kill "$chd_pid" 2>/dev/null || true
done

{
  echo "| measure | value | notes |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
    "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "$(date -u +%Y-%m-%dT%H:%MZ); chd $(git rev-parse --short HEAD)."
} | tee "$out/table.md"
