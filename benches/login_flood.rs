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

#[path = "../tests/support/chd_process.rs"]
mod chd_process;
#[path = "../tests/support/login_flood.rs"]
mod login_flood;

use std::process::Command;
use std::time::Duration;

use chd_process::Chd;
use login_flood::{basic, summary, timed_scrapes, web_config, Attack, Flood};

const CLIENTS: usize = 30;
const COST: u32 = 10;

/// A running `chd serve` and the binary's name in the report.
struct Server {
    name: String,
    chd: Chd,
    _state: tempfile::TempDir,
}

fn start(name: &str, binary: &str, web: &std::path::Path) -> Server {
    let state = tempfile::tempdir().unwrap();
    let args = [
        "--no-probe",
        "--backend",
        "host",
        "--web.config.file",
        web.to_str().unwrap(),
    ];
    let chd = Chd::spawn(Command::new(binary), state.path(), &args);
    Server {
        name: name.to_string(),
        chd,
        _state: state,
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
        timed_scrapes(s.chd.addr, &auth, 1, Duration::from_secs(60));
    }
    let rounds: usize = std::env::var("CHD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        for s in &servers {
            let unloaded = timed_scrapes(s.chd.addr, &auth, 100, Duration::from_secs(30));
            report(s, "unloaded", &unloaded, &format!(" round={round}"));
            for (case, attack) in [
                ("same_password_one_address", Attack::SamePassword),
                ("fresh_passwords_30_addresses", Attack::FreshPasswords),
            ] {
                let flood = Flood::start(s.chd.addr, CLIENTS, "alice", attack);
                std::thread::sleep(Duration::from_secs(1));
                let loaded = timed_scrapes(s.chd.addr, &auth, 40, Duration::from_secs(60));
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
