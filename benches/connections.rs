//! Memory of `chd serve` under a flood of half-open connections (issue 13, part 3): starts
//! the real binary (`chd serve --no-probe` on this machine, or `--replay $CHD_BENCH_REPLAY`),
//! opens `CHD_BENCH_CONNECTIONS` (default 10,000) TCP connections that each send half a
//! request head and then nothing, asks `/healthz` every 500 connections, and prints one
//! `connections:` line per figure: chd's VmRSS before, with all of them open, and after they
//! close; its VmHWM (peak); how many `/healthz` answered and the slowest; and chd's own
//! `chd_http_*` counters.
//!
//! Run: `cargo bench --bench connections` (under a minute). Extra `chd serve` flags after
//! `--`, e.g. `cargo bench --bench connections -- --max-connections 1000`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `VmRSS` or `VmHWM` of `pid`, KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// GET `path` with `Connection: close`; the body, or why not.
fn get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: chd\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    raw.split_once("\r\n\r\n")
        .filter(|(head, _)| head.starts_with("HTTP/1.1 200"))
        .map(|(_, body)| body.to_string())
        .ok_or_else(|| format!("not a 200: {raw:.80}"))
}

fn start(extra: &[String]) -> (Child, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chd"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match std::env::var_os("CHD_BENCH_REPLAY") {
        Some(path) => cmd.arg("--replay").arg(path),
        None => cmd.arg("--no-probe"),
    };
    let mut child = cmd.args(extra).spawn().expect("spawn chd serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let _ = tx.send(rest.trim().to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(600))
        .expect("chd serve listening")
        .parse()
        .unwrap();
    (child, addr, dir)
}

fn main() {
    let extra: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let count: usize = std::env::var("CHD_BENCH_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (mut child, addr, _dir) = start(&extra);
    let pid = child.id();
    get(addr, "/metrics").expect("first scrape");
    println!("connections: rss_before_kib={}", status_kib(pid, "VmRSS:"));

    let mut open = Vec::with_capacity(count);
    let (mut healthy, mut asked, mut slowest) = (0, 0, Duration::ZERO);
    let start = Instant::now();
    for i in 0..count {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: chd\r\nAccept: ");
                open.push(s);
            }
            Err(e) => println!("connections: connect {i} failed: {e}"),
        }
        if i % 500 == 499 {
            asked += 1;
            let t = Instant::now();
            match get(addr, "/healthz") {
                Ok(body) if body == "ok\n" => healthy += 1,
                Ok(body) => println!("connections: /healthz said {body:?}"),
                Err(e) => println!("connections: /healthz after {} failed: {e}", i + 1),
            }
            slowest = slowest.max(t.elapsed());
        }
    }
    let opened = open.len();
    std::thread::sleep(Duration::from_millis(500));
    println!(
        "connections: opened={opened} in {:.1}s; rss_with_open_kib={}",
        start.elapsed().as_secs_f64(),
        status_kib(pid, "VmRSS:")
    );
    println!(
        "connections: healthz_ok={healthy}/{asked} slowest_ms={:.1}",
        slowest.as_secs_f64() * 1e3
    );
    let metrics = get(addr, "/metrics").unwrap_or_default();
    for line in metrics.lines().filter(|l| l.starts_with("chd_http_")) {
        println!("connections: {line}");
    }
    drop(open);
    std::thread::sleep(Duration::from_secs(2));
    get(addr, "/metrics").expect("scrape after the flood");
    println!(
        "connections: rss_after_close_kib={} hwm_kib={}",
        status_kib(pid, "VmRSS:"),
        status_kib(pid, "VmHWM:")
    );
    let _ = child.kill();
    let _ = child.wait();
}
