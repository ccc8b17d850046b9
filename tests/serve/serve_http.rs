//! The HTTP server of the real `chd serve` binary against real clients: gzip on request
//! (curl `--compressed`, and raw curl whose body the test inflates), `Accept-Encoding`
//! refusals, the header timeout (a half-sent request head is closed, and so is an idle
//! keep-alive connection), and the connection cap (the longest-idle connection makes room;
//! `/healthz` answers through a flood of half-open connections).

use crate::chd_process;
use crate::golden;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::chd_process::{Chd, Metrics};

/// `chd serve --no-probe` on the `infiniband` collector fixture tree (host backend): every
/// value is fixed except timings and the server's own connection counters.
fn serve(extra: &[&str]) -> (tempfile::TempDir, Chd) {
    chd_process::serve_collector_tree("infiniband", extra)
}

/// A scrape with what changes from one scrape to the next masked: timings (as the golden
/// files mask them) and the server's connection counters.
fn comparable(body: &str) -> String {
    golden::normalise_scrape(&[], body)
        .lines()
        .filter(|l| !l.starts_with("chd_http_connections"))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn curl(args: &[&str]) -> std::process::Output {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--fail"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl is required for this test (apt-get install curl): {e}"));
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Response headers curl wrote with `--dump-header -`, lowercased names.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn metrics_are_gzipped_for_clients_that_ask() {
    let (_dir, chd) = serve(&[]);
    let url = format!("http://{}/metrics", chd.addr);
    let plain = chd.scrape();
    assert!(plain.contains("chd_http_connection_limit 64\n"), "{plain}");

    // curl --compressed sends Accept-Encoding and inflates what comes back: the same text as a
    // plain scrape taken just before or just after it (a scheduler tick between two scrapes
    // may move a counter).
    let decoded = curl(&["--compressed", &url]);
    let decoded = comparable(&String::from_utf8(decoded.stdout).unwrap());
    let after = chd.scrape();
    assert!(
        decoded == comparable(&plain) || decoded == comparable(&after),
        "gzipped:\n{decoded}\nplain before:\n{plain}\nplain after:\n{after}"
    );

    // Raw: the bytes on the wire are gzip, with the headers that say so.
    let dir = tempfile::tempdir().unwrap();
    let body_path = dir.path().join("body");
    let raw = curl(&[
        "--header",
        "Accept-Encoding: gzip",
        "--dump-header",
        "-",
        "--output",
        body_path.to_str().unwrap(),
        &url,
    ]);
    let head = String::from_utf8(raw.stdout).unwrap();
    assert_eq!(header(&head, "content-encoding"), Some("gzip"), "{head}");
    assert!(
        header(&head, "vary")
            .unwrap_or("")
            .contains("Accept-Encoding"),
        "{head}"
    );
    assert!(header(&head, "content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let wire = std::fs::read(&body_path).unwrap();
    assert_eq!(
        header(&head, "content-length").map(|v| v.parse::<usize>().unwrap()),
        Some(wire.len())
    );
    assert!(
        wire.len() * 3 < plain.len(),
        "{} gzipped vs {} plain",
        wire.len(),
        plain.len()
    );
    let mut inflated = String::new();
    flate2::read::GzDecoder::new(&wire[..])
        .read_to_string(&mut inflated)
        .expect("a gzip body");
    // As above: the same text as a plain scrape before or after it (a tick may fall between).
    let later = chd.scrape();
    assert!(
        [&plain, &after, &later]
            .iter()
            .any(|p| comparable(&inflated) == comparable(p)),
        "gzipped:\n{inflated}\nplain before:\n{plain}\nplain after:\n{later}"
    );
}

#[test]
fn accept_encoding_refusals_are_honoured() {
    let (_dir, chd) = serve(&[]);
    let url = format!("http://{}/metrics", chd.addr);
    for (accept, coding) in [
        ("gzip;q=0", None),
        ("identity", None),
        ("br, zstd", None),
        ("gzip;q=0.5, identity;q=1", None),
        ("*", Some("gzip")),
        ("identity;q=0, gzip;q=0.1", Some("gzip")),
    ] {
        let out = curl(&[
            "--header",
            &format!("Accept-Encoding: {accept}"),
            "--dump-header",
            "-",
            "--output",
            "/dev/null",
            &url,
        ]);
        let head = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            header(&head, "content-encoding"),
            coding,
            "{accept}: {head}"
        );
    }
    // Neither coding acceptable: 406, not a body the client refused.
    let out = Command::new("curl")
        .args([
            "--silent",
            "--output",
            "/dev/null",
            "--write-out",
            "%{http_code}",
        ])
        .args(["--header", "Accept-Encoding: *;q=0", &url])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "406");
    // Tiny bodies stay plain even when gzip is welcome.
    let out = curl(&[
        "--header",
        "Accept-Encoding: gzip",
        "--dump-header",
        "-",
        &format!("http://{}/healthz", chd.addr),
    ]);
    let head = String::from_utf8(out.stdout).unwrap();
    assert_eq!(header(&head, "content-encoding"), None, "{head}");
    assert!(head.ends_with("ok\n"), "{head}");
}

/// Read until the peer closes; `true` when it did within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 65536];
    let start = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(e) => panic!("read: {e}"),
        }
        if start.elapsed() > limit {
            return false;
        }
    }
}

#[test]
fn half_sent_headers_and_idle_keep_alive_are_closed_after_the_header_timeout() {
    let (_dir, chd) = serve(&["--header-timeout", "1s"]);
    let mut half = TcpStream::connect(chd.addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: chd\r\nAccept: ")
        .unwrap();
    let mut silent = TcpStream::connect(chd.addr).unwrap();
    // A keep-alive connection that got its answer and then says nothing.
    let mut idle = TcpStream::connect(chd.addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: chd\r\n\r\n")
        .unwrap();
    let mut answer = [0u8; 512];
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let n = idle.read(&mut answer).unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    // Well under the test's 20 s allowance, far over the 1 s timeout.
    for (what, s) in [
        ("half header", &mut half),
        ("silent", &mut silent),
        ("idle keep-alive", &mut idle),
    ] {
        assert!(
            closed_within(s, Duration::from_secs(20)),
            "{what} connection still open"
        );
    }
    // A closed connection's slot is freed when its task ends, just after the close.
    let m = chd.wait_for(Duration::from_secs(10), "only the scrape open", |m| {
        m.value("chd_http_connections", &[]) == 1.0
    });
    assert_eq!(
        m.value(
            "chd_http_connections_dropped_total",
            &[("reason", "header_timeout")]
        ),
        3.0
    );
}

#[test]
fn at_the_cap_the_longest_idle_connection_makes_room() {
    let (_dir, chd) = serve(&["--max-connections", "2"]);
    let mut first = TcpStream::connect(chd.addr).unwrap();
    first.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut second = TcpStream::connect(chd.addr).unwrap();
    second.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // A third client is served: the first (idle longest) is closed for it, the second is not.
    let m = Metrics::parse(&chd.scrape());
    assert!(
        closed_within(&mut first, Duration::from_secs(10)),
        "first still open"
    );
    assert!(
        !closed_within(&mut second, Duration::from_millis(500)),
        "second was closed"
    );
    assert_eq!(
        m.value("chd_http_connections", &[]),
        2.0,
        "never more than the cap"
    );
    assert_eq!(m.value("chd_http_connection_limit", &[]), 2.0);
    assert_eq!(
        m.value(
            "chd_http_connections_dropped_total",
            &[("reason", "evicted")]
        ),
        1.0
    );
    assert_eq!(m.value("chd_http_connections_accepted_total", &[]), 3.0);
}

#[test]
fn healthz_answers_through_a_flood_of_half_open_connections() {
    let (_dir, chd) = serve(&["--max-connections", "16"]);
    let mut flood = Vec::new();
    for i in 0..600 {
        let mut s = TcpStream::connect(chd.addr).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ");
        flood.push(s);
        if i % 100 == 99 {
            let (status, _, body) = chd.get("/healthz", None);
            assert_eq!(
                (status, body.as_str()),
                (200, "ok\n"),
                "after {} half-open",
                i + 1
            );
        }
    }
    let m = Metrics::parse(&chd.scrape());
    assert!(m.value("chd_http_connections", &[]) <= 16.0);
    assert!(
        m.value(
            "chd_http_connections_dropped_total",
            &[("reason", "evicted")]
        ) >= 600.0 - 16.0
    );
}
