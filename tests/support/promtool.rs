//! `promtool check metrics`: the Prometheus project's own linter on a scrape. It fails the test
//! with the linter's words, or with how to install it when it is missing (never skips; CI
//! installs Debian's `prometheus` package, see .ci/run). `PROMTOOL` names another binary.

use std::io::Write;
use std::process::{Command, Stdio};

/// Check `body` (a scrape of `what`): promtool must accept it without a single complaint.
pub fn check_metrics(what: &str, body: &str) {
    let promtool = std::env::var_os("PROMTOOL").unwrap_or_else(|| "promtool".into());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {promtool:?} ({e}): install Debian's `prometheus` package \
                 (it brings /usr/bin/promtool) or set PROMTOOL to its path"
            )
        });
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(body.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "promtool check metrics complained about the {what} scrape:\n{stdout}{stderr}\n--- scrape ---\n{body}"
    );
}
