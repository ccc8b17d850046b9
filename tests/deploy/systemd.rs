//! `deploy/systemd/`: `systemd-analyze verify` (with and without the Ascend drop-in), the
//! hardening settings chd depends on, and the unit's command line parsed by the real binary.

use std::path::Path;
use std::process::Command;

use crate::tools::{chd_bin, read, require_tool, root, run, temp_dir};

/// `key=value` lines of a unit file (comments and section headers skipped), in order.
pub(crate) fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter(|l| !l.starts_with('['))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("unit line without `=`: {l}"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

pub(crate) fn unit_values(settings: &[(String, String)], k: &str) -> Vec<String> {
    settings
        .iter()
        .filter(|(key, _)| key == k)
        .map(|(_, v)| v.clone())
        .collect()
}

pub(crate) const UNIT_BINARY: &str = "/usr/local/bin/chd";

/// The unit with ExecStart pointed at the binary under test (verify needs it to exist).
pub(crate) fn unit_for_verify() -> String {
    let unit = read(&root().join("deploy/systemd/chd.service"));
    let exec_start = format!("ExecStart={UNIT_BINARY} ");
    assert_eq!(
        unit.matches(&exec_start).count(),
        1,
        "chd.service must have exactly one `{exec_start}...` line"
    );
    unit.replace(&exec_start, &format!("ExecStart={} ", chd_bin()))
}

pub(crate) fn systemd_analyze_verify(unit_dir: &Path) {
    let analyze = require_tool(
        "systemd-analyze",
        "`apt-get install -y systemd` (Debian package systemd)",
    );
    let ran = run(Command::new(analyze)
        .arg("verify")
        .arg("--man=no")
        .arg(unit_dir.join("chd.service"))
        .env("SYSTEMD_LOG_COLOR", "0"))
    .expect_success();
    // verify reports unknown keys, bad values and the like as warnings with status 0.
    let noise = format!("{}{}", ran.stdout, ran.stderr);
    assert!(
        noise.trim().is_empty(),
        "systemd-analyze verify is not clean for {}:\n{noise}",
        unit_dir.display()
    );
}

#[test]
pub(crate) fn systemd_unit_passes_systemd_analyze_verify() {
    let dir = temp_dir();
    std::fs::write(dir.path().join("chd.service"), unit_for_verify()).unwrap();
    systemd_analyze_verify(dir.path());

    // With the Ascend drop-in installed as documented.
    let dropin = dir.path().join("chd.service.d");
    std::fs::create_dir(&dropin).unwrap();
    std::fs::copy(
        root().join("deploy/systemd/ascend.conf"),
        dropin.join("ascend.conf"),
    )
    .unwrap();
    systemd_analyze_verify(dir.path());

    // And the TLS and basic auth drop-in.
    std::fs::copy(
        root().join("deploy/systemd/web-config.conf"),
        dropin.join("web-config.conf"),
    )
    .unwrap();
    systemd_analyze_verify(dir.path());
}

#[test]
pub(crate) fn systemd_analyze_verify_catches_mistakes() {
    // The check above is only worth something if verify complains about a broken unit.
    let dir = temp_dir();
    let broken = unit_for_verify().replace("ProtectSystem=strict", "ProtectSystm=strict");
    std::fs::write(dir.path().join("chd.service"), broken).unwrap();
    let analyze = require_tool(
        "systemd-analyze",
        "`apt-get install -y systemd` (Debian package systemd)",
    );
    let ran = run(Command::new(analyze)
        .arg("verify")
        .arg("--man=no")
        .arg(dir.path().join("chd.service")));
    assert!(
        format!("{}{}", ran.stdout, ran.stderr).contains("ProtectSystm"),
        "systemd-analyze verify did not report an unknown key:\n{}{}",
        ran.stdout,
        ran.stderr
    );
}

#[test]
pub(crate) fn systemd_unit_is_hardened_without_breaking_probes() {
    let s = unit_settings(&read(&root().join("deploy/systemd/chd.service")));
    let one = |k: &str| {
        let v = unit_values(&s, k);
        assert_eq!(v.len(), 1, "chd.service: expected one {k}=, got {v:?}");
        v[0].clone()
    };
    for (k, v) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "chd"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("DevicePolicy", "closed"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("Restart", "on-failure"),
    ] {
        assert_eq!(one(k), v, "chd.service: {k}");
    }
    let devices = unit_values(&s, "DeviceAllow");
    for d in ["char-nvidia* rw", "char-davinci* rw"] {
        assert!(devices.iter().any(|x| x == d), "DeviceAllow={d} missing");
    }
    let filters = unit_values(&s, "SystemCallFilter");
    assert!(
        filters.iter().any(|f| f == "@system-service"),
        "SystemCallFilter=@system-service missing: {filters:?}"
    );
    // @resources (sched_setaffinity, mbind, move_pages) must stay allowed.
    assert!(
        !filters
            .iter()
            .any(|f| f.starts_with('~') && f.contains("@resources")),
        "probes bind threads and place memory: @resources must not be denied"
    );
    // Settings that would break chd: hidden device nodes, hidden /proc/stat, a pinned cpuset.
    for (k, bad) in [
        ("PrivateDevices", "yes"),
        ("ProcSubset", "pid"),
        ("PrivateNetwork", "yes"),
    ] {
        assert!(
            !unit_values(&s, k).iter().any(|v| v == bad),
            "chd.service must not set {k}={bad}"
        );
    }
    for k in ["CPUAffinity", "AllowedCPUs", "NUMAPolicy", "CPUQuota"] {
        assert!(
            unit_values(&s, k).is_empty(),
            "chd.service must not set {k}=: chd probes every CPU of its cpuset"
        );
    }
    let stop = one("TimeoutStopSec");
    let secs: f64 = humantime::parse_duration(&stop)
        .unwrap_or_else(|e| panic!("TimeoutStopSec={stop}: {e}"))
        .as_secs_f64();
    assert!(
        secs >= 30.0,
        "TimeoutStopSec={stop} does not cover one slow cell"
    );
}

#[test]
pub(crate) fn systemd_unit_command_line_is_accepted_by_chd() {
    let s = unit_settings(&read(&root().join("deploy/systemd/chd.service")));
    let exec = unit_values(&s, "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart=: {exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(words[0], UNIT_BINARY);
    let example = root().join("deploy/chd.example.toml");
    let args: Vec<String> = words[1..]
        .iter()
        .filter(|w| !w.starts_with('$'))
        .map(|w| {
            if *w == "/etc/chd/chd.toml" {
                example.to_str().unwrap().to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    assert!(
        args.iter().any(|a| a == example.to_str().unwrap()),
        "ExecStart must read /etc/chd/chd.toml: {exec:?}"
    );
    let ran = run(Command::new(chd_bin()).args(&args).arg("--print-config")).expect_success();
    assert!(
        ran.stdout.contains("state_dir = \"/var/lib/chd\""),
        "{}",
        ran.stdout
    );

    // The environment file is KEY=VALUE lines and comments only.
    let variable = regex::Regex::new("^[A-Za-z_][A-Za-z0-9_]*$").unwrap();
    for line in read(&root().join("deploy/systemd/chd.env")).lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, _) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("chd.env: not KEY=VALUE: {line}"));
        assert!(variable.is_match(k), "chd.env: bad variable name {k:?}");
    }
}
