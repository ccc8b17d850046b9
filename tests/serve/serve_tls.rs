//! TLS and basic auth of the real `chd serve` binary from a web config file
//! (`--web.config.file`, exporter-toolkit's format), against curl and a certificate the test
//! makes: 401 without or with wrong credentials, 200 with them, plain HTTP to the TLS port
//! fails, client certificates required and verified, a silent client loses its slot at the
//! header timeout, `min_version`/`max_version`/`cipher_suites` decide the handshake, the
//! file is re-read when it changes, and a file chd cannot honour is
//! refused at startup naming the key. The same file is given to Debian's
//! `prometheus-node-exporter`, which must accept and refuse the same credentials.

use crate::chd_process;

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::chd_process::{Chd, Metrics};
use crate::tls::{bcrypt_hash, curl, status, write, Pki};

/// `chd serve --no-probe` (host backend) with `--web.config.file FILE` and `extra`.
fn serve(web_config: &Path, extra: &[&str]) -> (tempfile::TempDir, Chd) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--no-probe",
        "--backend",
        "host",
        "--web.config.file",
        web_config.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let chd = Chd::serve(dir.path(), &args);
    (dir, chd)
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://localhost:{}{path}", addr.port())
}

/// `/metrics` over TLS with `extra` curl arguments (credentials), parsed; the scrape must
/// succeed.
fn scrape_tls(pki: &Pki, addr: SocketAddr, extra: &[&str]) -> Metrics {
    let mut args = trust(pki, addr);
    args.extend(extra.iter().map(|a| a.to_string()));
    args.push(url(addr, "/metrics"));
    let out = curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Metrics::parse(&String::from_utf8_lossy(&out.stdout))
}

/// curl's TLS arguments: trust the test CA, resolve localhost to 127.0.0.1.
fn trust(pki: &Pki, addr: SocketAddr) -> Vec<String> {
    vec![
        "--cacert".into(),
        pki.ca.to_str().unwrap().into(),
        "--resolve".into(),
        format!("localhost:{}:127.0.0.1", addr.port()),
    ]
}

fn get(pki: &Pki, addr: SocketAddr, path: &str, extra: &[&str]) -> Option<u16> {
    let mut args = trust(pki, addr);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(url(addr, path));
    status(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn tls_and_users(pki: &Pki, users: &[(&str, &str)]) -> String {
    let mut y = format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
        pki.server_cert.file_name().unwrap().to_str().unwrap(),
        pki.server_key.file_name().unwrap().to_str().unwrap(),
    );
    if !users.is_empty() {
        y.push_str("basic_auth_users:\n");
        for (user, password) in users {
            y.push_str(&format!("  {user}: {}\n", bcrypt_hash(password)));
        }
    }
    y
}

#[test]
fn basic_auth_over_tls_answers_401_without_or_with_wrong_credentials_and_200_with() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // Relative certificate paths are relative to the web config's directory.
    let web = write(
        dir.path(),
        "web.yml",
        &tls_and_users(&pki, &[("alice", "s3cret")]),
    );
    let (_state, chd) = serve(&web, &[]);
    let a = chd.addr;

    for path in ["/metrics", "/healthz", "/", "/matrix"] {
        assert_eq!(
            get(&pki, a, path, &[]),
            Some(401),
            "{path} without credentials"
        );
        assert_eq!(
            get(&pki, a, path, &["-u", "alice:wrong"]),
            Some(401),
            "{path} with a wrong password"
        );
        assert_eq!(
            get(&pki, a, path, &["-u", "mallory:s3cret"]),
            Some(401),
            "{path} as an unknown user"
        );
        assert_eq!(
            get(&pki, a, path, &["-u", "alice:s3cret"]),
            Some(200),
            "{path} with the right password"
        );
    }

    let mut args = trust(&pki, a);
    args.extend(["-D".into(), "-".into(), "-o".into(), "/dev/null".into()]);
    args.push(url(a, "/metrics"));
    let head = curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let head = String::from_utf8_lossy(&head.stdout).to_lowercase();
    assert!(head.contains("www-authenticate: basic"), "{head}");

    let m = scrape_tls(&pki, a, &["-u", "alice:s3cret"]);
    assert_eq!(m.value("chd_http_connection_limit", &[]), 64.0);
}

#[test]
fn plain_http_to_the_tls_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let web = write(dir.path(), "web.yml", &tls_and_users(&pki, &[]));
    let (_state, chd) = serve(&web, &[]);
    let plain = format!("http://127.0.0.1:{}/metrics", chd.addr.port());
    assert_eq!(status(&[&plain]), None, "plain HTTP got an answer");
    // Without users, TLS alone serves every request.
    let m = scrape_tls(&pki, chd.addr, &[]);
    assert_eq!(
        m.value(
            "chd_http_connections_dropped_total",
            &[("reason", "tls_handshake")]
        ),
        1.0,
        "the plain HTTP request is a failed handshake"
    );
}

#[test]
fn required_client_certificates_are_verified_against_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut y = tls_and_users(&pki, &[]);
    y.push_str("  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n");
    let web = write(dir.path(), "web.yml", &y);
    let (_state, chd) = serve(&web, &[]);
    let (cert, key) = (
        pki.client_cert.to_str().unwrap(),
        pki.client_key.to_str().unwrap(),
    );
    let (sc, sk) = (
        pki.stranger_cert.to_str().unwrap(),
        pki.stranger_key.to_str().unwrap(),
    );
    assert_eq!(get(&pki, chd.addr, "/metrics", &[]), None, "no client cert");
    assert_eq!(
        get(&pki, chd.addr, "/metrics", &["--cert", sc, "--key", sk]),
        None,
        "a client cert from a CA the server does not trust"
    );
    assert_eq!(
        get(&pki, chd.addr, "/metrics", &["--cert", cert, "--key", key]),
        Some(200)
    );
}

/// Whether the peer closes `s` within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    let start = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
        if start.elapsed() > limit {
            return false;
        }
    }
}

#[test]
fn a_client_that_never_handshakes_loses_its_slot_at_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let web = write(dir.path(), "web.yml", &tls_and_users(&pki, &[]));
    let (_state, chd) = serve(&web, &["--header-timeout", "1s", "--max-connections", "2"]);
    // A TCP health check (connect, close) is the client's doing: not a dropped connection.
    drop(TcpStream::connect(chd.addr).unwrap());
    let mut silent = TcpStream::connect(chd.addr).unwrap();
    // Far over the 1 s timeout, well under the allowance.
    assert!(
        closed_within(&mut silent, Duration::from_secs(20)),
        "a connection without a TLS handshake stayed open"
    );
    let m = scrape_tls(&pki, chd.addr, &[]);
    assert_eq!(
        m.value(
            "chd_http_connections_dropped_total",
            &[("reason", "tls_handshake")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "chd_http_connections_dropped_total",
            &[("reason", "header_timeout")]
        ),
        0.0
    );
}

#[test]
fn a_changed_web_config_applies_to_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let web = write(
        dir.path(),
        "web.yml",
        &tls_and_users(&pki, &[("alice", "old")]),
    );
    let (_state, chd) = serve(&web, &[]);
    assert_eq!(
        get(&pki, chd.addr, "/metrics", &["-u", "alice:old"]),
        Some(200)
    );
    // Replaced as a Kubernetes Secret volume or an editor replaces it: a new file renamed over.
    let next = write(
        dir.path(),
        "web.yml.new",
        &tls_and_users(&pki, &[("alice", "new")]),
    );
    std::fs::rename(next, &web).unwrap();
    assert_eq!(
        get(&pki, chd.addr, "/metrics", &["-u", "alice:old"]),
        Some(401)
    );
    assert_eq!(
        get(&pki, chd.addr, "/metrics", &["-u", "alice:new"]),
        Some(200)
    );
    // A broken file is not applied: the config in force stays.
    let broken = write(
        dir.path(),
        "web.yml.new",
        "basic_auth_users:\n  alice: nohash\n",
    );
    std::fs::rename(broken, &web).unwrap();
    assert_eq!(
        get(&pki, chd.addr, "/metrics", &["-u", "alice:new"]),
        Some(200)
    );
    chd.wait_for_log("web config not reloaded", Duration::from_secs(10));
    assert!(
        chd.log().contains("basic_auth_users.alice"),
        "{}",
        chd.log()
    );
}

/// Start `chd serve --web.config.file FILE`, expect it to exit with an error; its stderr.
fn refused(web: &Path) -> String {
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(chd_process::chd_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-probe",
            "--backend",
            "host",
        ])
        .arg("--state-dir")
        .arg(state.path())
        .arg("--web.config.file")
        .arg(web)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("chd accepted {}", std::fs::read_to_string(web).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn web_configs_chd_cannot_honour_are_refused_at_startup_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let tls = tls_and_users(&pki, &[]);
    let cases: Vec<(String, &str)> = vec![
        (format!("{tls}  certfile: x\n"), "certfile"),
        ("basic_auth:\n  alice: x\n".into(), "basic_auth"),
        (format!("{tls}  min_version: TLS10\n"), "tls_server_config.min_version"),
        (
            format!("{tls}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]\n"),
            "tls_server_config.cipher_suites",
        ),
        (
            format!("{tls}  curve_preferences: [CurveP521]\n"),
            "tls_server_config.curve_preferences",
        ),
        (
            format!("{tls}  client_auth_type: RequireAnyClientCert\n"),
            "tls_server_config.client_auth_type",
        ),
        (
            format!("{tls}  client_ca_file: ca.crt\n"),
            "tls_server_config.client_ca_file",
        ),
        (
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_allowed_sans: [prometheus]\n  client_ca_file: ca.crt\n"),
            "tls_server_config.client_allowed_sans",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n".into(),
            "tls_server_config.key_file",
        ),
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n".into(),
            "tls_server_config.cert_file",
        ),
        ("http_server_config:\n  http2: true\n".into(), "http_server_config.http2"),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: always\n".into(),
            "http_server_config.headers.X-Frame-Options",
        ),
        ("basic_auth_users:\n  alice: hunter2\n".into(), "basic_auth_users.alice"),
        ("rate_limit:\n  interval: 1s\n  burst: 5\n".into(), "rate_limit"),
    ];
    for (i, (yaml, key)) in cases.iter().enumerate() {
        let web = write(dir.path(), &format!("bad{i}.yml"), yaml);
        let err = refused(&web);
        assert!(
            err.contains(key) && err.contains(&format!("bad{i}.yml")),
            "the error for\n{yaml}\ndoes not name {key} and the file:\n{err}"
        );
    }
}

/// A `prometheus-node-exporter` on a free loopback port with `--web.config.file`, only the
/// loadavg collector on; killed on drop.
struct NodeExporter {
    child: Child,
    addr: SocketAddr,
}

impl NodeExporter {
    fn start(web: &Path) -> NodeExporter {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!("--web.config.file={}", web.display()))
            .args(["--collector.disable-defaults", "--collector.loadavg"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "prometheus-node-exporter is required for this test: {e}\n\
                     apt-get install prometheus-node-exporter (scripts/test.sh does it)"
                )
            });
        let mut ne = NodeExporter { child, addr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            if let Some(status) = ne.child.try_wait().unwrap() {
                panic!("node_exporter exited with {status} before listening");
            }
            assert!(Instant::now() < deadline, "node_exporter did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        ne
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn one_web_config_serves_chd_and_node_exporter_alike() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut y = tls_and_users(&pki, &[("prometheus", "scrape-me"), ("grafana", "other")]);
    y = y.replace(
        "basic_auth_users:",
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  \
         min_version: TLS12\n  cipher_suites:\n    - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\n    \
         - TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384\n  prefer_server_cipher_suites: true\n  \
         curve_preferences: [X25519, CurveP256]\nhttp_server_config:\n  http2: false\n  \
         headers:\n    X-Content-Type-Options: nosniff\nbasic_auth_users:",
    );
    let web = write(dir.path(), "web.yml", &y);
    let (_state, chd) = serve(&web, &[]);
    let node = NodeExporter::start(&web);
    let (cert, key) = (
        pki.client_cert.to_str().unwrap(),
        pki.client_key.to_str().unwrap(),
    );
    let with_cert = ["--cert", cert, "--key", key];
    let cases: [(&str, &[&str]); 6] = [
        ("no client certificate", &["-u", "prometheus:scrape-me"]),
        ("no credentials", &[]),
        ("a wrong password", &["-u", "prometheus:scrape-you"]),
        ("another user's password", &["-u", "grafana:scrape-me"]),
        ("the right password", &["-u", "prometheus:scrape-me"]),
        ("the other user", &["-u", "grafana:other"]),
    ];
    let mut answers = Vec::new();
    for (i, (what, args)) in cases.iter().enumerate() {
        let mut args = args.to_vec();
        if i > 0 {
            args.extend_from_slice(&with_cert);
        }
        let c = get(&pki, chd.addr, "/metrics", &args);
        let n = get(&pki, node.addr, "/metrics", &args);
        assert_eq!(c, n, "{what}: chd answered {c:?}, node_exporter {n:?}");
        answers.push(c);
    }
    assert_eq!(
        answers,
        [None, Some(401), Some(401), Some(401), Some(200), Some(200)]
    );
    // Both add the configured header.
    for addr in [chd.addr, node.addr] {
        let mut args = trust(&pki, addr);
        args.extend(with_cert.iter().map(|s| s.to_string()));
        args.extend([
            "-u".into(),
            "prometheus:scrape-me".into(),
            "-D".into(),
            "-".into(),
        ]);
        args.extend(["-o".into(), "/dev/null".into(), url(addr, "/metrics")]);
        let head = curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let head = String::from_utf8_lossy(&head.stdout).to_lowercase();
        assert!(
            head.contains("x-content-type-options: nosniff"),
            "{addr}: {head}"
        );
    }
}

#[test]
fn chd_and_node_exporter_both_refuse_an_unknown_key() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let web = write(
        dir.path(),
        "web.yml",
        &format!("{}  cert_path: x\n", tls_and_users(&pki, &[])),
    );
    assert!(refused(&web).contains("cert_path"));
    let out = Command::new("prometheus-node-exporter")
        .arg("--web.listen-address=127.0.0.1:0")
        .arg(format!("--web.config.file={}", web.display()))
        .args(["--collector.disable-defaults", "--collector.loadavg"])
        .output()
        .expect("prometheus-node-exporter (apt-get install prometheus-node-exporter)");
    assert!(
        !out.status.success(),
        "node_exporter accepted an unknown key"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cert_path"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn min_version_and_cipher_suites_take_effect_in_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // TLS 1.3 only: a client capped at TLS 1.2 cannot connect.
    let web = write(
        dir.path(),
        "tls13.yml",
        &format!("{}  min_version: TLS13\n", tls_and_users(&pki, &[])),
    );
    let (_s1, chd) = serve(&web, &[]);
    assert_eq!(get(&pki, chd.addr, "/healthz", &["--tls-max", "1.2"]), None);
    assert_eq!(get(&pki, chd.addr, "/healthz", &["--tlsv1.3"]), Some(200));
    // One TLS 1.2 suite: a TLS 1.2 client offering only another one cannot connect.
    let web = write(
        dir.path(),
        "suite.yml",
        &format!(
            "{}  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n",
            tls_and_users(&pki, &[])
        ),
    );
    let (_s2, chd) = serve(&web, &[]);
    let only = |suite: &str| {
        get(
            &pki,
            chd.addr,
            "/healthz",
            &["--tls-max", "1.2", "--ciphers", suite],
        )
    };
    assert_eq!(only("ECDHE-ECDSA-AES128-GCM-SHA256"), Some(200));
    assert_eq!(only("ECDHE-ECDSA-AES256-GCM-SHA384"), None);
    // max_version TLS12: a TLS 1.3-only client cannot connect.
    assert_eq!(get(&pki, chd.addr, "/healthz", &["--tlsv1.3"]), None);
}
