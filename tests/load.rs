//! Load with probes running (issue 14, part 4): 50 concurrent keep-alive scrapers against a
//! `chd serve` that probes the fake runtime, at the seed's matrix shape as far as a small
//! machine allows.
//!
//! This file is a test binary of its own, not a module of a suite (tests/serve/ and the
//! others): each case saturates the machine's CPUs for a minute or more on purpose, and what
//! it measures (the probe threads' sleep, the scrapes' outcome) is about that load alone. In
//! a suite the harness would run other tests beside it, which would add to the load it
//! measures and take the load into their own timings.
//!
//! The node: the seed's 640-CPU A3 topology (8 NUMA nodes, `support/sysfs_builder.rs`) with
//! the fake runtime's 16 devices two per NUMA node, and a state file holding the seed's whole
//! matrix, 640 CPUs x 16 devices x 3 sizes = 30,720 cells of five samples, so every scrape
//! encodes all of it. chd can bind only to the CPUs this machine has, so the live windows
//! probe those CPUs x 16 fake devices x 3 sizes (the process's affinity, written as the
//! tree's `Cpus_allowed_list`); every cell they record changes the store's generation, so the
//! cached encoding is thrown away and rebuilt again and again while the scrapers run.
//!
//! Two cases, one `chd serve` each: `exposition.cells = true` (every scrape carries the
//! 30,720 cell series) and `false`, which is what the default `auto` resolves to at the
//! seed's 30,720 planned cells (`tests/serve/series_budget.rs`); here the planned matrix is only
//! the live CPUs' cells, which `auto` would export, so the case names the seed's answer.
//! Each case runs unloaded windows first, then 50 scrapers (half plain, half gzip) until
//! enough work is done under load, however long a busy machine takes for it: [`LOADED_WINDOWS`]
//! windows started and ended under load, and [`CELLS_ON_SCRAPES`] scrapes (cells off: 10,000
//! scrapes after the warm-up, for the memory reading). Nothing waits for a span of wall
//! time; hang guards ([`STALL`]: no scrape or no window ending for that long; [`HANG_GUARD`] in
//! all) fail with what was missing. Then it stops chd with SIGTERM and asserts:
//! - zero failed scrapes: every response is a 200 whose body decodes (gzip) and parses as the
//!   Prometheus text format line by line, carrying the whole matrix (30,720 cell series with
//!   cells on, none with cells off, every NUMA segment aggregate either way) ([`Checker`]);
//! - the probe is not blocked: windows keep ending under load, each measuring cells without
//!   an error; the probe threads sleep (wait on a lock) at most [`MAX_PROBE_ASLEEP`] of their
//!   lives (`/proc/PID/task/TID/schedstat`: waiting for a CPU is not sleeping; read between
//!   two clock readings close together, so a sampler descheduled on a busy machine does not
//!   stretch a life); every sample of the run, unloaded and loaded, is its cell's planted rate
//!   within [`RATE_TOLERANCE`], and every cell measured both unloaded and loaded has the same
//!   value within 1 % (the fake times copies on a virtual clock, so nothing can slow the timed
//!   region itself; a difference would be a sample recorded wrong);
//! - flat memory (cells off, which serves the most scrapes): the VmRSS floor 10,000 scrapes
//!   after the warm-up is at most [`RSS_GROWTH_BOUND`] above the one at the warm-up.
//!
//! Latency is reported, never asserted: `cargo test --test load -- --nocapture` prints the
//! scrapes, p50/p99 per coding, RSS, window durations, cells per window and the probe
//! threads' time, loaded and unloaded side by side (the figures of BENCHMARKS.md). CI cost
//! on the 2-CPU development VM: about 45 s a case, ~15 s of it setup and unloaded windows,
//! ~30 s of load (its windows; cells off's 15,000 scrapes took 30 s there); 240 s for both
//! with seven busy loops beside it (load 18), where every window measured 3 to 6 cells: a
//! busy machine takes longer, and does not fail for being slow.

#[path = "support/chd_process.rs"]
mod chd_process;
#[path = "support/fake_runtime.rs"]
mod fake;
#[path = "support/sysfs_builder.rs"]
mod sysfs_builder;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chd::runtime::Direction;
use chd::store::{persist, unix_now, CellKey, Sample, Store};
use chd_process::{allowed_cpus, Chd, Metrics};

/// Concurrent scrapers (the figure); odd ones ask for gzip.
const SCRAPERS: usize = 50;
/// Windows that start and end under load (the one in progress when the load starts is not
/// counted) before the load stops.
const LOADED_WINDOWS: usize = 5;
/// Scrapes under load with cells on (cells off runs to [`WARMUP_SCRAPES`] + [`RSS_SCRAPES`]).
const CELLS_ON_SCRAPES: usize = 3_000;
/// Hang guard: the test fails when no scrape completes, or no window ends, for this long.
const STALL: Duration = Duration::from_secs(120);
/// Hang guard: the most the load (or the unloaded windows before it) may take in all.
const HANG_GUARD: Duration = Duration::from_secs(15 * 60);
/// Most relative difference between a sample and the rate the fake plants for its cell.
const RATE_TOLERANCE: f64 = 0.005;
/// A schedstat reading counts only when the clock readings around it are at most this far
/// apart (the sampler was not descheduled in between).
const SAMPLE_SKEW: Duration = Duration::from_millis(1);
/// Scrapes over which memory must stay flat, after the warm-up (cells off keeps scraping
/// until it has them).
const RSS_SCRAPES: usize = 10_000;
/// Scrapes after which the warm-up RSS is read: every scraper connected, both codings'
/// snapshots built and re-built a few times.
const WARMUP_SCRAPES: usize = 5_000;
/// Most VmRSS growth between the warm-up reading and the one [`RSS_SCRAPES`] later (both
/// floors, see the load loop). A leak of anything per scrape shows far above it: the
/// smallest body (cells off, gzip) is about 25 KB, so one leaked body per scrape is 250 MB
/// over the 10,000 scrapes, and even a leaked 4 KiB request buffer is 40 MiB. What
/// legitimately comes and goes is bounded: malloc arenas of chd's dozen threads settling
/// (each keeps the peak of the work that ran on it: a store copy per encoding, one per
/// state save) and the few store samples each window adds. Measured here: +13 MiB over
/// 10,000 scrapes at 200 scrapes/s, the same per minute when a client five times as fast
/// drove it, so it follows the windows, not the scrapes.
const RSS_GROWTH_BOUND: u64 = 32 << 20;
/// VmRSS readings are the lowest of this span (see the load loop).
const FLOOR_SPAN: Duration = Duration::from_secs(8);
/// Unloaded windows before the load (the first one, which also pins its buffers for the
/// first time, is counted apart from the comparison).
const UNLOADED_WINDOWS: usize = 3;
/// Most of their lives the probe threads may spend asleep under load. A probe thread
/// copies, times and records without waiting for anything (the fake's copies are
/// synchronous): unloaded it sleeps under 1 % of its life, and under load what it may wait
/// for is the store's write lock between cells, held by a scrape only while it copies the
/// store (1-5 % here). Before scrapes copied the store it waited for whole encodings (9 %
/// with cells off, debug build); a probe held up behind the scrapes themselves would sleep
/// most of its window. Waiting for a CPU is not sleeping: the scrapers and chd share two
/// cores, so the probe runs slower under load, and that is reported, not asserted.
const MAX_PROBE_ASLEEP: f64 = 0.15;
/// The seed's matrix.
const SEED_CPUS: u32 = 640;
const DEVICES: u32 = 16;
const SIZES_MIB: [u64; 3] = [4, 16, 64];
const SEED_CELLS: usize = (SEED_CPUS * DEVICES) as usize * SIZES_MIB.len();
/// NUMA-segment aggregates of the seed: (device, size, NUMA node) x (min, median, max).
const SEGMENT_SERIES: usize = DEVICES as usize * SIZES_MIB.len() * 8 * 3;
const CELL_FAMILY: &str = "chd_h2d_bandwidth_bytes_per_second{";
const SEGMENT_FAMILY: &str = "chd_h2d_segment_bandwidth_bytes_per_second{";

/// The cases share the machine's two CPUs: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------------------
// The node

/// The fake's PCI address of device `d` (`CHD_FAKE_PCI_BUS_IDS` default, fake README).
fn fake_bdf(d: u32) -> String {
    format!("0000:{:02x}:00.0", 0x10 + d)
}

/// The A3 tree with this process's real CPUs allowed, and the fake's 16 devices on NUMA
/// nodes `d / 2` (two per node, as the seed's GPUs). Returns (sys, proc, live CPUs).
fn node_tree(root: &Path) -> (PathBuf, PathBuf, Vec<u32>) {
    let live = allowed_cpus();
    assert!(
        live.iter().all(|&c| c < SEED_CPUS),
        "CPU ids {live:?} beyond the seed's 640"
    );
    let mut machine = sysfs_builder::a3();
    machine.allowed = Some(live.clone());
    let (sys, proc) = machine.write(root).expect("write the A3 tree");
    // A node without netdevs (the netdev collector reads this at every scrape).
    std::fs::create_dir_all(proc.join("net")).unwrap();
    std::fs::write(
        proc.join("net/dev"),
        "Inter-|   Receive                                                |  Transmit\n \
         face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n",
    )
    .unwrap();
    for d in 0..DEVICES {
        let dir = sys.join("bus/pci/devices").join(fake_bdf(d));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("numa_node"), format!("{}\n", d / 2)).unwrap();
    }
    (sys, proc, live)
}

/// The seed's matrix, every cell with five samples from the last hour (device 0 the slow
/// column, as on the seed and in the fake's rates below), and a bindable verdict per CPU.
fn seed_store() -> Store {
    let now = unix_now();
    let mut store = Store::default();
    for cpu in 0..SEED_CPUS {
        for device in 0..DEVICES {
            for mib in SIZES_MIB {
                let level = if device == 0 { 1.23e10 } else { 5.89e10 };
                let key = CellKey {
                    cpu,
                    device: device.to_string(),
                    size_bytes: mib << 20,
                    direction: Direction::H2d,
                };
                for i in 0..5u32 {
                    let jitter = f64::from((cpu * 7 + device * 3 + i) % 11) * 1e-3;
                    let sample = Sample {
                        bytes_per_second: level * (1.0 - jitter),
                        at: now - 600.0 * f64::from(5 - i),
                    };
                    store.record_sample(key.clone(), sample, 5);
                }
            }
        }
    }
    let verdicts: Vec<(u32, bool)> = (0..SEED_CPUS).map(|c| (c, true)).collect();
    store.record_bindable(&verdicts, now - 60.0);
    store.record_success("h2d", now - 60.0);
    store.record_success("affinity", now - 60.0);
    store.set_cpu_numa((0..SEED_CPUS).map(|c| (c, c / 80)).collect());
    assert_eq!(store.h2d().len(), SEED_CELLS);
    store
}

// ---------------------------------------------------------------------------------------
// The scrapers

/// One keep-alive HTTP/1.1 connection.
struct Connection {
    reader: BufReader<TcpStream>,
}

impl Connection {
    fn open(addr: SocketAddr) -> std::io::Result<Connection> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            reader: BufReader::with_capacity(64 << 10, stream),
        })
    }

    /// GET /metrics, asking for gzip or not; returns the body as sent and whether the
    /// server will close the connection.
    fn scrape(&mut self, gzip: bool) -> Result<(Vec<u8>, bool), String> {
        let accept = if gzip {
            "Accept-Encoding: gzip\r\n"
        } else {
            ""
        };
        write!(
            self.reader.get_mut(),
            "GET /metrics HTTP/1.1\r\nHost: chd\r\n{accept}\r\n"
        )
        .map_err(|e| format!("send: {e}"))?;
        let mut line = String::new();
        let mut read_line = |line: &mut String| {
            line.clear();
            match self.reader.read_line(line) {
                Ok(0) => Err("connection closed mid-response".to_string()),
                Ok(_) => Ok(()),
                Err(e) => Err(format!("receive: {e}")),
            }
        };
        read_line(&mut line)?;
        if line.split_whitespace().nth(1) != Some("200") {
            return Err(format!("status line {:?}", line.trim_end()));
        }
        let mut length = None;
        let mut encoding = String::new();
        let mut close = false;
        loop {
            read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                return Err(format!("header line {header:?}"));
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "content-encoding" => encoding = value.to_string(),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        if encoding != if gzip { "gzip" } else { "" } {
            return Err(format!("gzip {gzip}, Content-Encoding {encoding:?}"));
        }
        let length = length.ok_or("no Content-Length")?;
        let mut body = vec![0; length];
        self.reader
            .read_exact(&mut body)
            .map_err(|e| format!("body of {length} bytes: {e}"))?;
        Ok((body, close))
    }
}

/// The text of a gzip body.
fn gunzip(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut text = Vec::with_capacity(body.len() * 12);
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut text)
        .map_err(|e| format!("gzip body: {e}"))?;
    Ok(text)
}

/// Check text line by line: every line a `# HELP`/`# TYPE` comment or a sample
/// `name{labels} value` whose value is a number. Returns the cell and segment series seen.
fn check_lines(text: &str) -> Result<(usize, usize), String> {
    let (mut cell_series, mut segment_series) = (0, 0);
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            if !(comment.starts_with("HELP ") || comment.starts_with("TYPE ")) {
                return Err(format!("comment line {line:?}"));
            }
            continue;
        }
        let bad = || format!("sample line {line:?}");
        let (series, value) = line.rsplit_once(' ').ok_or_else(bad)?;
        value.parse::<f64>().map_err(|_| bad())?;
        let name = match series.split_once('{') {
            Some((name, labels)) if labels.ends_with("\"}") && labels.contains("=\"") => name,
            Some(_) => return Err(bad()),
            None => series,
        };
        let valid = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
        if name.is_empty() || name.as_bytes()[0].is_ascii_digit() || !name.bytes().all(valid) {
            return Err(bad());
        }
        if line.starts_with(CELL_FAMILY) {
            cell_series += 1;
        } else if line.starts_with(SEGMENT_FAMILY) {
            segment_series += 1;
        }
    }
    Ok((cell_series, segment_series))
}

/// Checks scrapes. A scrape is the live part (counters, collectors, coverage: new at every
/// scrape) followed by the store's part, which is the same text for every scrape of one
/// store generation; the scrapers share the store parts already checked line by line, and a
/// store part byte-identical to one of them (a `memcmp`) is not parsed again. So every byte
/// of every response is parsed or equal to parsed bytes, at a cost a debug build keeps up
/// with under 50 scrapers.
struct Checker {
    cells: bool,
    checked: Mutex<Vec<Arc<Vec<u8>>>>,
}

impl Checker {
    fn new(cells: bool) -> Checker {
        Checker {
            cells,
            checked: Mutex::new(Vec::new()),
        }
    }

    /// Check one scrape's text: its lines, and the matrix all there (30,720 cell series with
    /// cells on, none with cells off, every NUMA segment aggregate either way).
    fn check(&self, text: &[u8]) -> Result<(), String> {
        if !text.ends_with(b"\n") {
            return Err("body does not end with a newline".into());
        }
        let text = std::str::from_utf8(text).map_err(|e| format!("not UTF-8: {e}"))?;
        // The store's part begins with its first family, the matrix's.
        let first = if self.cells {
            CELL_FAMILY
        } else {
            SEGMENT_FAMILY
        };
        let first = format!("# HELP {}", first.trim_end_matches('{'));
        let split = text
            .find(&format!("\n{first} "))
            .ok_or_else(|| format!("no {first} family"))?;
        let (live, store) = text.split_at(split + 1);
        let (cells, segments) = check_lines(live)?;
        if cells + segments > 0 {
            return Err("matrix series in the live part".into());
        }
        let known = self.checked.lock().unwrap().clone();
        if known.iter().any(|k| k.as_slice() == store.as_bytes()) {
            return Ok(());
        }
        let (cell_series, segment_series) = check_lines(store)?;
        let want_cells = if self.cells { SEED_CELLS } else { 0 };
        if cell_series != want_cells || segment_series != SEGMENT_SERIES {
            return Err(format!(
                "{cell_series} cell series (want {want_cells}), {segment_series} segment \
                 series (want {SEGMENT_SERIES})"
            ));
        }
        let mut checked = self.checked.lock().unwrap();
        checked.push(Arc::new(store.as_bytes().to_vec()));
        // The last few generations are what scrapes in flight still carry.
        if checked.len() > 8 {
            checked.remove(0);
        }
        Ok(())
    }
}

/// What one scraper saw.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    /// Time spent decoding gzip and checking the text (the client's own cost).
    decode: Duration,
    check: Duration,
    failures: usize,
    /// The first few failures, for the message.
    examples: Vec<String>,
}

/// Scrape over one keep-alive connection (reopened only after the server closed it, or
/// after a failure) until `stop`.
fn scraper(
    addr: SocketAddr,
    gzip: bool,
    checker: &Checker,
    stop: &AtomicBool,
    done: &AtomicUsize,
) -> Tally {
    let mut tally = Tally::default();
    let mut connection: Option<Connection> = None;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let result = match connection.take() {
            Some(c) => Ok(c),
            None => Connection::open(addr).map_err(|e| format!("connect: {e}")),
        }
        .and_then(|mut c| {
            let (body, close) = c.scrape(gzip)?;
            let latency = started.elapsed();
            if !close {
                connection = Some(c);
            }
            let t = Instant::now();
            let text = if gzip { gunzip(&body)? } else { body };
            tally.decode += t.elapsed();
            let t = Instant::now();
            let checked = checker.check(&text);
            tally.check += t.elapsed();
            checked.map(|()| latency)
        });
        match result {
            Ok(latency) => tally.latencies.push(latency),
            Err(e) => {
                tally.failures += 1;
                if tally.examples.len() < 5 {
                    tally.examples.push(e);
                }
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    tally
}

/// `q` quantile of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// A number field of `/proc/PID/status` (`VmRSS:` in kB, `Threads:`).
fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("chd status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} line"))
}

/// VmRSS of `pid` in bytes.
fn rss(pid: u32) -> u64 {
    status_field(pid, "VmRSS:") << 10
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

// ---------------------------------------------------------------------------------------
// The probe's side

/// One "probe window done" line of chd's log.
#[derive(Debug, Clone, Copy)]
struct Window {
    measured: u64,
    errors: u64,
    elapsed_ms: u64,
}

fn windows(log: &str) -> Vec<Window> {
    let field = |line: &str, name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    log.lines()
        .filter(|l| l.contains("probe window done"))
        .map(|l| Window {
            measured: field(l, "measured"),
            errors: field(l, "errors"),
            elapsed_ms: field(l, "elapsed_ms"),
        })
        .collect()
}

/// (sum, count) of `chd_probe_duration_seconds{probe="h2d"}` now.
fn probe_duration(chd: &Chd) -> (f64, f64) {
    let m = Metrics::parse(&chd.scrape());
    let h2d = [("probe", "h2d")];
    (
        m.value("chd_probe_duration_seconds_sum", &h2d),
        m.value("chd_probe_duration_seconds_count", &h2d),
    )
}

/// Scheduler statistics of chd's probe threads (`chd-probe`, one per window) over their
/// lives, from `/proc/PID/task/TID/schedstat` sampled every 20 ms: nanoseconds on a CPU,
/// runnable but waiting for one, and asleep (the rest: waiting on a lock or a blocking call).
/// A life is the time between a thread's first and last readings, each read between two
/// clock readings at most [`SAMPLE_SKEW`] apart: a sampler descheduled between a reading and
/// its clock (on a busy machine, for as long as the other threads' turns take) would add
/// that time to the life, and count it asleep.
#[derive(Debug, Default, Clone, Copy)]
struct ThreadTimes {
    threads: usize,
    running: f64,
    runnable: f64,
    asleep: f64,
}

impl ThreadTimes {
    fn asleep_share(&self) -> f64 {
        self.asleep / (self.running + self.runnable + self.asleep).max(1.0)
    }

    fn describe(&self) -> String {
        let life = (self.running + self.runnable + self.asleep).max(1.0);
        format!(
            "{} threads: {:.0} % on a CPU, {:.0} % waiting for one, {:.1} % asleep",
            self.threads,
            100.0 * self.running / life,
            100.0 * self.runnable / life,
            100.0 * self.asleep / life
        )
    }
}

/// One schedstat reading: when (unix seconds, for which part of the run; and the monotonic
/// clock, for the life), ns on a CPU, ns waiting for one.
#[derive(Debug, Clone, Copy)]
struct Reading {
    unix: f64,
    at: Instant,
    running: u64,
    runnable: u64,
}

/// The readings of each probe thread seen.
type Schedstats = BTreeMap<u32, Vec<Reading>>;

fn sample_probe_threads(pid: u32, stop: &AtomicBool) -> Schedstats {
    let mut seen = Schedstats::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let path = task.path();
                let is_probe = std::fs::read_to_string(path.join("comm"))
                    .is_ok_and(|c| c.trim_end() == "chd-probe");
                if !is_probe {
                    continue;
                }
                let before = Instant::now();
                let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
                let after = Instant::now();
                if after - before > SAMPLE_SKEW {
                    continue;
                }
                let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
                let (Some(Some(running)), Some(Some(runnable))) = (fields.next(), fields.next())
                else {
                    continue;
                };
                let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                seen.entry(tid).or_default().push(Reading {
                    unix: unix_now(),
                    at: before + (after - before) / 2,
                    running,
                    runnable,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    seen
}

/// The probe threads that started in `from..to`.
fn probe_threads(seen: &Schedstats, from: f64, to: f64) -> ThreadTimes {
    let mut t = ThreadTimes::default();
    for samples in seen.values() {
        let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
            continue;
        };
        if !(from..to).contains(&first.unix) || samples.len() < 2 {
            continue;
        }
        let life = (last.at - first.at).as_nanos() as f64;
        let running = (last.running - first.running) as f64;
        let runnable = (last.runnable - first.runnable) as f64;
        t.threads += 1;
        t.running += running;
        t.runnable += runnable;
        t.asleep += (life - running - runnable).max(0.0);
    }
    t
}

/// The median of the samples of each live cell recorded in `from..to` (unix seconds).
fn cell_medians(store: &Store, live: &[u32], from: f64, to: f64) -> BTreeMap<CellKey, f64> {
    store
        .h2d()
        .iter()
        .filter(|(k, _)| live.contains(&k.cpu))
        .filter_map(|(k, cell)| {
            let values: Vec<f64> = cell
                .samples
                .iter()
                .filter(|s| (from..to).contains(&s.at))
                .map(|s| s.bytes_per_second)
                .collect();
            Some((k.clone(), chd::stats::median(&values)?))
        })
        .collect()
}

fn window_summary(ws: &[Window]) -> String {
    if ws.is_empty() {
        return "none".into();
    }
    let cells: u64 = ws.iter().map(|w| w.measured).sum();
    let ms: u64 = ws.iter().map(|w| w.elapsed_ms).sum();
    format!(
        "{} windows, {:.1} cells/window, {:.0} ms/window, {:.1} ms/cell",
        ws.len(),
        cells as f64 / ws.len() as f64,
        ms as f64 / ws.len() as f64,
        ms as f64 / cells.max(1) as f64
    )
}

// ---------------------------------------------------------------------------------------
// A case

fn run_case(cells: bool) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let case = if cells {
        "cells on"
    } else {
        "cells off (auto at the seed's shape)"
    };
    let lib = fake::fake_runtime_path();
    let tree = tempfile::tempdir().unwrap();
    let (sys, proc, live) = node_tree(tree.path());
    let state = tempfile::tempdir().unwrap();
    let t = Instant::now();
    persist::save(state.path(), &seed_store(), unix_now()).expect("plant the seed's state");
    eprintln!("tree and state in {:?}", t.elapsed());

    // A slow CPU x device cell on the last live CPU, so the values have a pattern to keep.
    let slow = format!("3@{}=20", live.last().unwrap());
    let sizes = SIZES_MIB.map(|m| m.to_string()).join(",");
    let setup = Instant::now();
    let serve_from = unix_now();
    let chd = Chd::serve_env(
        state.path(),
        &[
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--procfs-root",
            proc.to_str().unwrap(),
            // The default 2 s budget, a window every 3 s.
            "--interval",
            "3s",
            // The scrapers load the CPUs: the gate would (rightly) stop probing.
            "--cpu-busy-threshold",
            "1",
            "--sizes",
            &sizes,
            // Every sample of the run stays in state.json for the comparison.
            "--samples",
            "200",
            "--cells",
            if cells { "true" } else { "false" },
            // The whole budget to the copy cells, as the comparison of unloaded and loaded
            // cells needs (the same-device and peer copies would take an eighth of it and are
            // not compared).
            "--d2d-size",
            "0",
            "--p2p-size",
            "0",
            "--backend",
            "cuda",
            "--cuda-runtime",
            lib,
            "--nvml",
            lib,
        ],
        &[
            // glibc raises its mmap threshold (up to 32 MiB) whenever a large block is freed,
            // after which blocks that size come from a thread's arena and stay there when
            // freed: the state save's 16 MiB JSON buffer, freed on whichever pool thread ran
            // it, then adds 16 MiB of VmRSS per thread it has run on, once, whatever the
            // scrapes do. Keeping the threshold at glibc's default start (128 KiB) returns
            // every large block when it is freed, so VmRSS shows what chd keeps.
            ("MALLOC_MMAP_THRESHOLD_", "131072"),
            ("CHD_FAKE_DEVICE_COUNT", "16"),
            ("CHD_FAKE_H2D_GBPS", "58.9;0=12.3"),
            ("CHD_FAKE_SLOW_CPUS", &slow),
        ],
    );
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pid, stop) = (chd.pid(), sampling.clone());
        std::thread::spawn(move || sample_probe_threads(pid, &stop))
    };
    chd.wait_for_log("restored state", STALL);
    let restored = chd.log();
    assert!(
        restored.contains(&format!("cells={SEED_CELLS} dropped=0")),
        "the seed's matrix must survive the restore whole: {restored}"
    );

    // Unloaded windows: however long they take, as long as they keep ending.
    let unloaded_since = Instant::now();
    let mut last_window = (0, Instant::now());
    loop {
        let ended = windows(&chd.log()).len();
        if ended >= UNLOADED_WINDOWS {
            break;
        }
        if ended > last_window.0 {
            last_window = (ended, Instant::now());
        }
        assert!(
            last_window.1.elapsed() < STALL && unloaded_since.elapsed() < HANG_GUARD,
            "{ended} of {UNLOADED_WINDOWS} unloaded windows ended after {:.0?}, none in the \
             last {:.0?} (hang guard {STALL:?} without one, {HANG_GUARD:?} in all): {}",
            unloaded_since.elapsed(),
            last_window.1.elapsed(),
            chd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let setup_time = setup.elapsed();
    let (unloaded_sum, unloaded_count) = probe_duration(&chd);
    let unloaded_windows = windows(&chd.log());
    let loaded_from = unix_now();
    let checker = Arc::new(Checker::new(cells));
    checker
        .check(chd.scrape().as_bytes())
        .expect("an unloaded scrape");

    // The load.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let addr = chd.addr;
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|i| {
            let (stop, done, checker) = (stop.clone(), done.clone(), checker.clone());
            std::thread::spawn(move || scraper(addr, i % 2 == 1, &checker, &stop, &done))
        })
        .collect();
    let started = Instant::now();
    let pid = chd.pid();
    // VmRSS every 100 ms with the scrapes done then. A window holds the fake's "device"
    // memory, which is host memory in chd's process (64 MiB per device buffer), and a pinned
    // buffer: a reading is the floor of the last FLOOR_SPAN, which always spans time between
    // windows, so it is what chd keeps, not what a window holds for its cells.
    let rss_before = rss(pid);
    let mut readings: Vec<(Instant, usize, u64)> = Vec::new();
    let floor = |readings: &[(Instant, usize, u64)]| {
        let (now, _, _) = *readings.last().unwrap();
        readings
            .iter()
            .rev()
            .take_while(|(t, _, _)| now.duration_since(*t) <= FLOOR_SPAN)
            .map(|r| r.2)
            .min()
            .unwrap()
    };
    let mut rss_warm: Option<(usize, u64)> = None;
    let mut rss_at_target: Option<(usize, u64)> = None;
    let mut curve: Vec<(usize, u64)> = Vec::new();
    // The load runs until its work is done: LOADED_WINDOWS windows that began under load
    // (after the one in progress now, which ends first), and its scrapes.
    let want_scrapes = if cells {
        CELLS_ON_SCRAPES
    } else {
        WARMUP_SCRAPES + RSS_SCRAPES
    };
    let windows_before = unloaded_windows.len() + 1;
    let mut last_scrape = (0, Instant::now());
    let mut last_window = (windows(&chd.log()).len(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let n = done.load(Ordering::Relaxed);
        readings.push((Instant::now(), n, rss(pid)));
        let ended = windows(&chd.log()).len();
        let loaded_windows = ended.saturating_sub(windows_before);
        if n > last_scrape.0 {
            last_scrape = (n, Instant::now());
        }
        if ended > last_window.0 {
            last_window = (ended, Instant::now());
        }
        let elapsed = started.elapsed();
        if last_scrape.1.elapsed() >= STALL
            || last_window.1.elapsed() >= STALL
            || elapsed >= HANG_GUARD
        {
            stop.store(true, Ordering::Relaxed);
            panic!(
                "{case}: after {elapsed:.0?} of load, {n} of {want_scrapes} scrapes and \
                 {loaded_windows} of {LOADED_WINDOWS} loaded windows; the last scrape {:.0?} \
                 ago, the last window's end {:.0?} ago (hang guards: {STALL:?} without either, \
                 {HANG_GUARD:?} in all):\n{}",
                last_scrape.1.elapsed(),
                last_window.1.elapsed(),
                chd.log()
            );
        }
        if elapsed >= FLOOR_SPAN {
            let f = floor(&readings);
            if curve.last().is_none_or(|&(m, _)| n >= m + 1000) {
                curve.push((n, f));
            }
            match rss_warm {
                None if n >= WARMUP_SCRAPES => rss_warm = Some((n, f)),
                Some((wn, _)) if rss_at_target.is_none() && n >= wn + RSS_SCRAPES => {
                    rss_at_target = Some((n, f));
                }
                _ => {}
            }
        }
        // Cells off also needs its memory reading 10,000 scrapes after the warm-up one.
        let memory_read = cells || rss_at_target.is_some();
        if n >= want_scrapes && loaded_windows >= LOADED_WINDOWS && memory_read {
            break;
        }
    }
    let rss_max = readings.iter().map(|r| r.2).max().unwrap_or(0);
    let threads = status_field(pid, "Threads:");
    stop.store(true, Ordering::Relaxed);
    let tallies: Vec<(bool, Tally)> = scrapers
        .into_iter()
        .enumerate()
        .map(|(i, t)| (i % 2 == 1, t.join().expect("scraper thread")))
        .collect();
    let load_time = started.elapsed();
    let loaded_to = unix_now();
    let (loaded_sum, loaded_count) = probe_duration(&chd);
    let all_windows = windows(&chd.log());
    sampling.store(true, Ordering::Relaxed);
    let schedstats = sampler.join().expect("sampler thread");
    let (status, log) = chd.terminate();
    assert!(status.success(), "chd exit {status}: {log}");

    // Report.
    let total: usize = tallies
        .iter()
        .map(|(_, t)| t.latencies.len() + t.failures)
        .sum();
    let failures: usize = tallies.iter().map(|(_, t)| t.failures).sum();
    println!("== load, {case}: {SCRAPERS} scrapers for {load_time:.1?} (setup and unloaded windows {setup_time:.1?})");
    println!(
        "   {total} scrapes ({:.0}/s), {failures} failed",
        total as f64 / load_time.as_secs_f64()
    );
    for gzip in [false, true] {
        let mut l: Vec<Duration> = tallies
            .iter()
            .filter(|(g, _)| *g == gzip)
            .flat_map(|(_, t)| t.latencies.iter().copied())
            .collect();
        l.sort_unstable();
        println!(
            "   {:<5} {} scrapes: p50 {}, p99 {}, max {}",
            if gzip { "gzip" } else { "plain" },
            l.len(),
            ms(quantile(&l, 0.5)),
            ms(quantile(&l, 0.99)),
            ms(quantile(&l, 1.0))
        );
    }
    println!(
        "   VmRSS before the load {}; floors by scrapes: {}; {} at most; {threads} threads",
        mib(rss_before),
        curve
            .iter()
            .map(|(n, r)| format!("{n}: {}", mib(*r)))
            .collect::<Vec<_>>()
            .join(", "),
        mib(rss_max)
    );
    let decode: Duration = tallies.iter().map(|(_, t)| t.decode).sum();
    let check: Duration = tallies.iter().map(|(_, t)| t.check).sum();
    println!("   client: gunzip {decode:.1?}, checks {check:.1?} in all");
    if let (Some((wn, wr)), Some((tn, tr))) = (rss_warm, rss_at_target) {
        println!(
            "   VmRSS floor {} after {wn} scrapes (warm-up), {} after {tn}",
            mib(wr),
            mib(tr)
        );
    }
    // Windows: the first (warm-up) apart; a window ending during the load started before
    // it if it is the first to end then.
    let first_loaded = unloaded_windows.len() + 1;
    let loaded_windows = &all_windows[first_loaded.min(all_windows.len())..];
    let loaded_windows: Vec<Window> = loaded_windows.to_vec();
    let duration_unloaded = unloaded_sum / unloaded_count;
    let duration_loaded = (loaded_sum - unloaded_sum) / (loaded_count - unloaded_count).max(1.0);
    println!(
        "   probe unloaded: {} (window 1 apart: {} cells in {} ms); chd_probe_duration_seconds mean {:.2} s",
        window_summary(&unloaded_windows[1..]),
        unloaded_windows[0].measured,
        unloaded_windows[0].elapsed_ms,
        duration_unloaded
    );
    println!(
        "   probe loaded:   {}; chd_probe_duration_seconds mean {:.2} s",
        window_summary(&loaded_windows),
        duration_loaded
    );

    let threads_unloaded = probe_threads(&schedstats, serve_from, loaded_from);
    let threads_loaded = probe_threads(&schedstats, loaded_from, loaded_to);
    println!("   probe threads unloaded: {}", threads_unloaded.describe());
    println!("   probe threads loaded:   {}", threads_loaded.describe());

    // The probe's results, unloaded against loaded, from the state chd saved at SIGTERM.
    let saved = match persist::load(state.path(), unix_now()) {
        persist::Loaded::Restored(store) => store,
        other => panic!("state after the run: {other:?}"),
    };
    let before = cell_medians(&saved, &live, serve_from, loaded_from);
    let during = cell_medians(&saved, &live, loaded_from, loaded_to);
    let mut compared = 0;
    let mut worst: f64 = 0.0;
    let mut by_device: BTreeMap<(String, u64), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (key, &v0) in &before {
        let Some(&v1) = during.get(key) else { continue };
        compared += 1;
        let diff = (v1 / v0 - 1.0).abs();
        worst = worst.max(diff);
        assert!(
            diff <= 0.01,
            "cell {key:?}: {v0:.4e} B/s unloaded, {v1:.4e} loaded"
        );
        let e = by_device
            .entry((key.device.clone(), key.size_bytes))
            .or_default();
        e.0.push(v0);
        e.1.push(v1);
    }
    let med = |v: &[f64]| chd::stats::median(v).unwrap_or(f64::NAN) / 1e9;
    for ((device, size), (v0, v1)) in by_device
        .iter()
        .filter(|((d, _), _)| d == "0" || d == "1" || d == "3")
    {
        println!(
            "   device {device:>2} {:>2} MiB: {:.2} GB/s unloaded, {:.2} GB/s loaded ({} cells)",
            size >> 20,
            med(v0),
            med(v1),
            v0.len()
        );
    }
    println!(
        "   {compared} cells measured unloaded ({}) and loaded ({}): largest difference {:.3} %",
        before.len(),
        during.len(),
        worst * 100.0
    );
    // Every sample of the run, unloaded and loaded, against the rate the fake plants for its
    // cell: device 0 the slow column, device 3 slow from the last live CPU.
    let slow_cpu = *live.last().unwrap();
    let planted = |key: &CellKey| match key.device.as_str() {
        "0" => 12.3e9,
        "3" if key.cpu == slow_cpu => 20e9,
        _ => 58.9e9,
    };
    let (mut run_samples, mut loaded_samples, mut worst_planted) = (0, 0, 0f64);
    for (key, cell) in saved.h2d().iter().filter(|(k, _)| live.contains(&k.cpu)) {
        for sample in cell
            .samples
            .iter()
            .filter(|s| (serve_from..loaded_to).contains(&s.at))
        {
            let off = (sample.bytes_per_second / planted(key) - 1.0).abs();
            worst_planted = worst_planted.max(off);
            assert!(
                off <= RATE_TOLERANCE,
                "cell {key:?}: a sample of {:.4e} B/s at {} ({}), planted {:.4e}",
                sample.bytes_per_second,
                sample.at,
                if sample.at < loaded_from {
                    "unloaded"
                } else {
                    "loaded"
                },
                planted(key)
            );
            run_samples += 1;
            if sample.at >= loaded_from {
                loaded_samples += 1;
            }
        }
    }
    println!(
        "   {run_samples} samples of the run ({loaded_samples} under load) against the planted \
         rates: largest difference {:.3} %",
        worst_planted * 100.0
    );

    // Assertions.
    let examples: Vec<&String> = tallies
        .iter()
        .flat_map(|(_, t)| &t.examples)
        .take(5)
        .collect();
    assert_eq!(failures, 0, "failed scrapes, e.g. {examples:?}");
    assert!(
        total >= want_scrapes,
        "only {total} scrapes (want {want_scrapes})"
    );
    // The first window to end under load started before it: LOADED_WINDOWS more.
    assert!(
        loaded_windows.len() >= LOADED_WINDOWS,
        "windows must keep ending under load: {all_windows:?}\n{log}"
    );
    for w in unloaded_windows.iter().chain(&loaded_windows) {
        assert!(w.measured > 0 && w.errors == 0, "window {w:?}\n{log}");
    }
    assert!(loaded_samples > 0, "no cell measured under load");
    // A share of no thread's life would prove nothing.
    assert!(
        threads_loaded.threads >= LOADED_WINDOWS,
        "probe threads read under load: {}",
        threads_loaded.describe()
    );
    let asleep = threads_loaded.asleep_share();
    assert!(
        asleep <= MAX_PROBE_ASLEEP,
        "the probe threads slept {:.1} % of their time under load (bound {:.0} %): {}",
        asleep * 100.0,
        MAX_PROBE_ASLEEP * 100.0,
        threads_loaded.describe()
    );
    if !cells {
        let (Some((wn, wr)), Some((tn, tr))) = (rss_warm, rss_at_target) else {
            panic!("only {total} scrapes in {load_time:?}; the RSS check needs {RSS_SCRAPES}");
        };
        assert!(
            tr <= wr + RSS_GROWTH_BOUND,
            "VmRSS grew from {} after {wn} scrapes to {} after {tn} (bound +{})",
            mib(wr),
            mib(tr),
            mib(RSS_GROWTH_BOUND)
        );
    }
}

#[test]
fn fifty_scrapers_with_every_cell_exported_while_probing() {
    run_case(true);
}

#[test]
fn fifty_scrapers_on_the_default_exposition_while_probing_with_flat_memory() {
    run_case(false);
}
