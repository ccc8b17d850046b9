//! `--url https://...` of `chd advise`, `chd check` and `chd ledger` against a real `chd
//! serve` whose web config asks for TLS, a client certificate from the test CA
//! (RequireAndVerifyClientCert) and basic auth: with the right CA, certificate and password
//! (from `--password-file` or `CHD_PASSWORD`) each gives what it gives from the recording the
//! node replays; each missing or wrong piece is an error naming it (issue 28).

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::chd_process::{run_chd, text, Chd};
use crate::tls::{bcrypt_hash, write, Pki};

fn recording() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/advise/results.json")
}

/// A node replaying the advise fixture behind TLS, verified client certificates and the user
/// alice (password s3cret).
struct Node {
    dir: tempfile::TempDir,
    pki: Pki,
    chd: Chd,
    password_file: PathBuf,
}

impl Node {
    fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path());
        let web = write(
            dir.path(),
            "web.yml",
            &format!(
                "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
                 client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n\
                 basic_auth_users:\n  alice: {}\n",
                bcrypt_hash("s3cret")
            ),
        );
        let password_file = write(dir.path(), "password", "s3cret\n");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let chd = Chd::serve(
            &state,
            &[
                "--replay",
                recording().to_str().unwrap(),
                "--web.config.file",
                web.to_str().unwrap(),
            ],
        );
        Node {
            dir,
            pki,
            chd,
            password_file,
        }
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.chd.addr.port())
    }

    /// Every flag the node asks for, as strings.
    fn all_flags(&self) -> Vec<String> {
        [
            "--url",
            &self.url("https"),
            "--ca-file",
            self.pki.ca.to_str().unwrap(),
            "--cert-file",
            self.pki.client_cert.to_str().unwrap(),
            "--key-file",
            self.pki.client_key.to_str().unwrap(),
            "--user",
            "alice",
        ]
        .map(String::from)
        .to_vec()
    }

    /// [`Node::all_flags`] with `--password-file`.
    fn with_password_file(&self) -> Vec<String> {
        let mut flags = self.all_flags();
        flags.push("--password-file".into());
        flags.push(self.password_file.to_str().unwrap().into());
        flags
    }
}

/// `chd VERB FLAGS...` with `env`.
fn chd(verb: &str, flags: &[String], env: &[(&str, &str)]) -> Output {
    let mut args = vec![verb];
    args.extend(flags.iter().map(String::as_str));
    run_chd(&args, env)
}

/// `flags` without the flag `name` and its value.
fn without(flags: &[String], name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = flags.iter();
    while let Some(f) = it.next() {
        if f == name {
            it.next();
        } else {
            out.push(f.clone());
        }
    }
    out
}

/// `flags` with `name`'s value replaced by `value`.
fn with(flags: &[String], name: &str, value: &str) -> Vec<String> {
    let mut out = without(flags, name);
    out.push(name.into());
    out.push(value.into());
    out
}

fn assert_fails_saying(out: &Output, code: i32, says: &[&str], what: &str) {
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: {err}{}",
        text(&out.stdout)
    );
    for s in says {
        assert!(err.contains(s), "{what}: no {s:?} in: {err}");
    }
}

#[test]
fn advise_check_and_ledger_read_a_node_behind_tls_client_certificates_and_basic_auth() {
    let node = Node::start();
    let rec = recording();
    let rec = rec.to_str().unwrap();

    // advise: the same text as from the recording, with the password from a file or the
    // environment.
    let expected = run_chd(&["advise", "--replay", rec], &[]);
    assert!(expected.status.success(), "{}", text(&expected.stderr));
    assert!(text(&expected.stdout).contains("numactl"));
    let out = chd("advise", &node.with_password_file(), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&expected.stdout));
    let out = chd("advise", &node.all_flags(), &[("CHD_PASSWORD", "s3cret")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&expected.stdout));

    // check: the node's held verdict line and its exit code.
    let out = chd("check", &node.with_password_file(), &[]);
    let line = text(&out.stdout);
    assert!(line.starts_with("CHD "), "{line}{}", text(&out.stderr));
    assert!(!line.starts_with("CHD UNKNOWN"), "{line}");
    let code = out.status.code().unwrap();
    assert!((0..=2).contains(&code), "{line}");
    let verdict_exit = match line.split_whitespace().nth(1) {
        Some("OK") => 0,
        Some("DEGRADED") => 1,
        Some("FAILED") => 2,
        other => panic!("{other:?}: {line}"),
    };
    assert_eq!(code, verdict_exit, "{line}");

    // ledger: the served document, written as it came, and a ledger.
    let file = node.dir.path().join("ledger.json");
    let mut flags = node.with_password_file();
    flags.extend(["--out".into(), file.to_str().unwrap().into()]);
    let out = chd("ledger", &flags, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let saved = std::fs::read_to_string(&file).unwrap();
    let ledger = chd::format::calibration::parse("ledger.json", &saved).unwrap();
    assert_eq!(ledger.node.host, "gpu-node-3");
    let printed = chd("ledger", &node.with_password_file(), &[]);
    assert!(printed.status.success(), "{}", text(&printed.stderr));
    assert_eq!(
        text(&printed.stdout),
        saved,
        "stdout and --out: one document"
    );
    // A page that is not a ledger is refused, and nothing is written.
    let healthz = format!("{}/healthz", node.url("https"));
    let refused_file = node.dir.path().join("refused.json");
    let mut flags = with(&node.with_password_file(), "--url", &healthz);
    flags.extend(["--out".into(), refused_file.to_str().unwrap().into()]);
    let out = chd("ledger", &flags, &[]);
    assert_fails_saying(&out, 1, &[healthz.as_str()], "ledger --url of /healthz");
    assert!(!refused_file.exists());
    // And what advise reads from that file is what it read from the node.
    let out = run_chd(&["advise", "--ledger", file.to_str().unwrap()], &[]);
    assert_eq!(text(&out.stdout), text(&expected.stdout));
}

#[test]
fn each_missing_or_wrong_piece_is_an_error_naming_it() {
    let node = Node::start();
    let good = node.with_password_file();
    let wrong = write(node.dir.path(), "wrong", "guess\n");

    // Wrong password: 401, for every verb; check says UNKNOWN (exit 3).
    let flags = with(&good, "--password-file", wrong.to_str().unwrap());
    let out = chd("advise", &flags, &[]);
    assert_fails_saying(&out, 2, &["401", "wrong user or password"], "advise");
    let out = chd("ledger", &flags, &[]);
    assert_fails_saying(&out, 1, &["401"], "ledger");
    let out = chd("check", &flags, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).starts_with("CHD UNKNOWN - ") && text(&out.stdout).contains("401"),
        "{}",
        text(&out.stdout)
    );
    let out = chd("advise", &node.all_flags(), &[("CHD_PASSWORD", "guess")]);
    assert_fails_saying(&out, 2, &["401"], "CHD_PASSWORD wrong");
    // No credentials at all: 401, saying how to give them.
    let no_user = without(&without(&good, "--password-file"), "--user");
    let out = chd("advise", &no_user, &[]);
    assert_fails_saying(&out, 2, &["401", "--user"], "no credentials");
    // --user without a password.
    let out = chd("advise", &without(&good, "--password-file"), &[]);
    assert_fails_saying(&out, 2, &["no password", "CHD_PASSWORD"], "no password");

    // No client certificate: the server ends the handshake.
    let no_cert = without(&without(&good, "--cert-file"), "--key-file");
    let out = chd("advise", &no_cert, &[]);
    assert_fails_saying(
        &out,
        2,
        &["handshake", "requires a client certificate", "--cert-file"],
        "no client certificate",
    );
    // One from a CA the server does not trust.
    let stranger = with(
        &with(
            &good,
            "--cert-file",
            node.pki.stranger_cert.to_str().unwrap(),
        ),
        "--key-file",
        node.pki.stranger_key.to_str().unwrap(),
    );
    let out = chd("advise", &stranger, &[]);
    assert_fails_saying(
        &out,
        2,
        &["handshake", "refused the client certificate"],
        "a stranger's client certificate",
    );

    // No --ca-file: the test CA is none of the Mozilla roots.
    let out = chd("advise", &without(&good, "--ca-file"), &[]);
    assert_fails_saying(&out, 2, &["not trusted", "--ca-file"], "no --ca-file");

    // http:// to the TLS port.
    let plain = with(
        &without(
            &without(&without(&no_cert, "--ca-file"), "--user"),
            "--password-file",
        ),
        "--url",
        &node.url("http"),
    );
    let out = chd("advise", &plain, &[]);
    assert_fails_saying(&out, 2, &["try https://"], "http:// to a TLS node");

    // A key without its certificate, or TLS flags without --url: clap's usage errors.
    let out = chd("advise", &without(&good, "--cert-file"), &[]);
    assert_fails_saying(&out, 2, &["--cert-file"], "--key-file alone");
    let out = run_chd(
        &[
            "advise",
            "--replay",
            recording().to_str().unwrap(),
            "--ca-file",
            "ca.crt",
        ],
        &[],
    );
    assert_fails_saying(&out, 2, &["--url"], "--ca-file without --url");
}
