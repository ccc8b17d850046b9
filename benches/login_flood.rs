//! Valid scrapes under a wrong-password flood (issue 30): starts the real binary
//! (`chd serve --no-probe`) with basic auth at bcrypt cost 10 over plain HTTP, and measures
//! one keep-alive scraper's valid `/metrics` latencies unloaded and while 30 clients loop a
//! wrong password: all from 127.0.0.1 repeating the same one (the reproduction), and
//! each from its own loopback address with a new one every time (no cache helps). With
//! `CHD_BENCH_BEFORE=/path/to/an/older/chd` the same rounds run against that binary too,
//! interleaved with this one's, so the two are measured side by side on the same machine.
//! Prints one `login_flood:` line per binary and case.
//!
//! Run: `cargo bench --bench login_flood` (about a minute; two with CHD_BENCH_BEFORE).

#[path = "../tests/support/login_flood.rs"]
mod login_flood;

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use login_flood::{basic, summary, timed_scrapes, web_config, Attack, Flood};

const CLIENTS: usize = 30;
const COST: u32 = 10;

struct Server {
    name: String,
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(name: &str, binary: &str, web: &std::path::Path) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(binary)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-probe",
            "--backend",
            "host",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .arg("--web.config.file")
        .arg(web)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {binary}: {e}"));
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
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
        .recv_timeout(Duration::from_secs(60))
        .expect("chd serve listening")
        .parse()
        .unwrap();
    Server {
        name: name.to_string(),
        child,
        addr,
        _dir: dir,
    }
}

fn report(server: &Server, case: &str, scrapes: &[(Duration, u16)], extra: &str) {
    let times: Vec<Duration> = scrapes.iter().map(|(t, _)| *t).collect();
    let (median, p99, max) = summary(&times);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "login_flood: binary={} case={case} n={} median_ms={:.3} p99_ms={:.3} max_ms={:.3} \
         over_1s={} not_200={}{extra}",
        server.name,
        scrapes.len(),
        ms(median),
        ms(p99),
        ms(max),
        times
            .iter()
            .filter(|t| **t > Duration::from_secs(1))
            .count(),
        scrapes.iter().filter(|(_, s)| *s != 200).count(),
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, web_config(&[("alice", "s3cret")], COST)).unwrap();
    let mut servers = vec![start("this", env!("CARGO_BIN_EXE_chd"), &web)];
    if let Ok(before) = std::env::var("CHD_BENCH_BEFORE") {
        servers.push(start("before", &before, &web));
    }
    let auth = basic("alice", "s3cret");
    for s in &servers {
        // The first login pays its bcrypt.
        timed_scrapes(s.addr, &auth, 1, Duration::from_secs(60));
    }
    let rounds: usize = std::env::var("CHD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        for s in &servers {
            let unloaded = timed_scrapes(s.addr, &auth, 100, Duration::from_secs(30));
            report(s, "unloaded", &unloaded, &format!(" round={round}"));
            for (case, attack) in [
                ("same_password_one_address", Attack::SamePassword),
                ("fresh_passwords_30_addresses", Attack::FreshPasswords),
            ] {
                let flood = Flood::start(s.addr, CLIENTS, "alice", attack);
                std::thread::sleep(Duration::from_secs(1));
                let loaded = timed_scrapes(s.addr, &auth, 40, Duration::from_secs(60));
                let answers: Vec<String> = flood
                    .stop()
                    .into_iter()
                    .map(|(status, n)| format!("{status}:{n}"))
                    .collect();
                report(
                    s,
                    case,
                    &loaded,
                    &format!(" round={round} flood={}", answers.join(",")),
                );
                // Let the queued checks drain before the next case.
                std::thread::sleep(Duration::from_secs(3));
            }
        }
    }
}
