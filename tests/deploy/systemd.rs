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

/// Issue 30 item 10: chd binds its one port and nothing else (`SocketBindAllow`/`Deny`),
/// exchanges packets only with the allowed ranges (`IPAddressDeny=any`, narrowed further by
/// the documented drop-in `scrapers.conf`), and `systemd-analyze security` scores the unit
/// lower than the 1.7 it had without them.
#[test]
pub(crate) fn systemd_unit_binds_only_its_port_and_allows_only_listed_addresses() {
    let s = unit_settings(&read(&root().join("deploy/systemd/chd.service")));
    assert_eq!(unit_values(&s, "SocketBindDeny"), ["any"]);
    assert_eq!(unit_values(&s, "IPAddressDeny"), ["any"]);
    let allow = unit_values(&s, "IPAddressAllow").join(" ");
    assert!(allow.contains("localhost"), "IPAddressAllow={allow}");
    // The one port allowed is the one the shipped config listens on.
    let ran = run(Command::new(chd_bin())
        .args(["serve", "--config"])
        .arg(root().join("deploy/chd.example.toml"))
        .arg("--print-config"))
    .expect_success();
    let port = ran
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = \""))
        .and_then(|v| v.trim_end_matches('"').rsplit(':').next())
        .unwrap_or_else(|| panic!("no listen in\n{}", ran.stdout))
        .to_string();
    assert_eq!(unit_values(&s, "SocketBindAllow"), [format!("tcp:{port}")]);

    // The drop-in resets the allow list, then lists addresses: verify accepts it.
    let dropin = read(&root().join("deploy/systemd/scrapers.conf"));
    let d = unit_settings(&dropin);
    let allows = unit_values(&d, "IPAddressAllow");
    assert_eq!(
        allows.first().map(String::as_str),
        Some(""),
        "reset first: {allows:?}"
    );
    assert!(allows.len() > 1, "{allows:?}");
    let dir = temp_dir();
    std::fs::write(dir.path().join("chd.service"), unit_for_verify()).unwrap();
    std::fs::create_dir(dir.path().join("chd.service.d")).unwrap();
    std::fs::write(dir.path().join("chd.service.d/scrapers.conf"), dropin).unwrap();
    systemd_analyze_verify(dir.path());

    let analyze = require_tool(
        "systemd-analyze",
        "`apt-get install -y systemd` (Debian package systemd)",
    );
    let ran = run(Command::new(analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(dir.path().join("chd.service"))
        .env("SYSTEMD_LOG_COLOR", "0")
        .env("SYSTEMD_COLORS", "0"))
    .expect_success();
    let line = |needle: &str| {
        ran.stdout
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle} in\n{}", ran.stdout))
            .to_string()
    };
    assert!(
        !line("IPAddressDeny=").contains("does not define"),
        "{}",
        line("IPAddressDeny=")
    );
    let overall: f64 = line("Overall exposure level")
        .split(':')
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}", line("Overall exposure level")));
    assert!(overall <= 1.6, "exposure {overall} (1.7 before issue 30)");
}
