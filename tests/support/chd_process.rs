//! Test harness: runs the real `chd` binary, scrapes it over plain HTTP/1.1, parses the
//! Prometheus text it serves, and stops it with a real signal.
#![allow(dead_code)]

#[path = "promtool.rs"]
mod promtool;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Path of the binary cargo built for the integration tests.
pub fn chd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_chd")
}

/// Run `chd ARGS...` to completion with extra environment variables (logging at `warn`).
pub fn run_chd(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(chd_bin())
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run chd")
}

/// The CPUs this process, and a chd it starts, may run on: online and in the affinity
/// mask, ascending, as chd's topology reads them.
pub fn allowed_cpus() -> Vec<u32> {
    chd::topology::Topology::read(&chd::topology::Roots::default())
        .expect("live topology")
        .allowed_cpus()
        .map(|c| c.id)
        .collect()
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running `chd serve`.
pub struct Chd {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Chd {
    /// Start `chd serve --listen 127.0.0.1:0 --state-dir DIR ARGS...` and wait until it listens.
    pub fn serve(state_dir: &Path, args: &[&str]) -> Chd {
        Chd::serve_env(state_dir, args, &[])
    }

    /// [`Chd::serve`] with extra environment variables (e.g. the fake runtime's settings).
    pub fn serve_env(state_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Chd {
        let mut command = Command::new(chd_bin());
        command.envs(env.iter().copied());
        Chd::spawn(command, state_dir, args)
    }

    /// `command` (the chd binary, or a wrapper that ends by exec'ing the arguments it is
    /// given, which follow) with `serve --listen 127.0.0.1:0 --state-dir DIR ARGS...`
    /// appended; waits until chd listens. The child's pid is chd's once the wrapper execs.
    pub fn spawn(mut command: Command, state_dir: &Path, args: &[&str]) -> Chd {
        if !command.get_envs().any(|(k, _)| k == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        let mut child = command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(state_dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn chd serve");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send(rest.trim().to_string());
                }
                let mut l = thread_log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("listen address"),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "chd serve did not start listening within 30 s; log:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        Chd { child, addr, log }
    }

    /// The process id of the running chd (for `/proc/PID/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything chd logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Wait until chd has logged a line containing `needle`; panics after `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.log().contains(needle) {
            if start.elapsed() > timeout {
                panic!(
                    "chd did not log {needle:?} within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET `path`; returns (status, headers lowercased, body).
    pub fn get(&self, path: &str, accept: Option<&str>) -> (u16, BTreeMap<String, String>, String) {
        http_get(self.addr, path, accept)
    }

    /// GET /metrics in the default format; panics unless 200.
    pub fn scrape(&self) -> String {
        let (status, _, body) = self.get("/metrics", None);
        assert_eq!(status, 200, "scrape failed: {body}\nlog:\n{}", self.log());
        body
    }

    /// Scrape until `ready` holds for the parsed metrics, or panic after `timeout`.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Metrics) -> bool,
    ) -> Metrics {
        let start = Instant::now();
        loop {
            let m = Metrics::parse(&self.scrape());
            if ready(&m) {
                return m;
            }
            if start.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Send SIGTERM and wait for the exit.
    pub fn terminate(mut self) -> (ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("send SIGTERM");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for chd") {
                // Let the log reader drain.
                std::thread::sleep(Duration::from_millis(50));
                return (status, self.log());
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                panic!(
                    "chd did not stop within 30 s of SIGTERM; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Chd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal HTTP/1.1 GET with `Connection: close`.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> (u16, BTreeMap<String, String>, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// One sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed Prometheus text exposition (samples only).
#[derive(Debug, Clone, Default)]
pub struct Metrics(pub Vec<Series>);

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| p.split_once("=\""))
                .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
                .collect();
            out.push(Series {
                name: name.to_string(),
                labels,
                value: value.parse().unwrap_or(f64::NAN),
            });
        }
        Metrics(out)
    }

    /// Series named `name` whose labels include every pair of `want`.
    pub fn find(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Series> {
        self.0
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                want.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The single value of `name{want}`; panics if absent or ambiguous.
    pub fn value(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        let found = self.find(name, want);
        assert_eq!(
            found.len(),
            1,
            "expected one {name}{want:?}, found {found:?}"
        );
        found[0].value
    }
}

/// `chd serve --no-probe --backend host` on the collector fixture tree `tree`
/// (`tests/fixtures/collectors/<tree>/{sys,proc}`) with `extra` flags; the state directory
/// lives as long as the returned guard.
pub fn serve_collector_tree(tree: &str, extra: &[&str]) -> (tempfile::TempDir, Chd) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors")
        .join(tree);
    serve_tree(&root, extra)
}

/// `chd serve --backend host --no-probe` over the machine `root` (`<root>/sys`,
/// `<root>/proc`) with `extra` flags; the state directory lives as long as the returned guard.
pub fn serve_tree(root: &Path, extra: &[&str]) -> (tempfile::TempDir, Chd) {
    let dir = tempfile::tempdir().unwrap();
    let (sys, proc) = (root.join("sys"), root.join("proc"));
    let mut args = vec![
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--procfs-root",
        proc.to_str().unwrap(),
        "--no-probe",
        "--backend",
        "host",
    ];
    args.extend_from_slice(extra);
    let chd = Chd::serve(dir.path(), &args);
    (dir, chd)
}

/// Run `promtool check metrics` on `body` (see `promtool.rs`).
pub fn promtool_check_metrics(body: &str) {
    promtool::check_metrics("chd", body);
}
