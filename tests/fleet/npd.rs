//! Issue 27 part 2: `deploy/kubernetes/components/npd/`, chd's verdict as the node condition
//! `ChdCalibrationFailed` through node-problem-detector's custom plugin monitor. The monitor
//! config is validated against the schema of the Go structs NPD v0.8.19 decodes it into
//! (tests/fixtures/npd/custom-plugin-monitor.schema.json) and the checks of its `Validate()`;
//! the plugin is then run the way NPD runs it (pkg/custompluginmonitor/plugin/plugin.go:
//! `rule.Path` with `rule.Args`, its own process group, stdout read and trimmed, cut at
//! `max_output_length`, exit 0 OK, 1 NonOK, else Unknown) against a `chd serve --replay` of a
//! failed, then a healthy recording, then none, and the condition follows as NPD's
//! `generateStatus` sets it: True, back to False with the default reason, Unknown.

use crate::json_schema;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::chd_process::{chd_bin, Chd};
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const COMPONENT: &str = "deploy/kubernetes/components/npd";
/// Where the DaemonSet's chd serve listens: the plugin's `--url`.
const CHD_URL: &str = "http://127.0.0.1:9863";

fn monitor() -> Value {
    let path = repo().join(COMPONENT).join("chd-plugin-monitor.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A Go `time.ParseDuration` string of the forms the config uses (`60s`, `1m30s`, `500ms`).
fn go_duration(text: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or_else(|| panic!("{text}: no unit"));
        let n: f64 = rest[..digits].parse().unwrap();
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let secs = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            other => panic!("{text}: unit {other:?}"),
        };
        total += Duration::from_secs_f64(n * secs);
        rest = &rest[unit..];
    }
    total
}

#[test]
fn the_monitor_config_is_what_npd_accepts() {
    let path = repo().join(COMPONENT).join("chd-plugin-monitor.json");
    let schema = repo().join("tests/fixtures/npd/custom-plugin-monitor.schema.json");
    json_schema::validate(&schema, &[&path]).unwrap_or_else(|e| panic!("{e}"));

    // A misspelt key is caught (Go's decoder would silently drop it).
    let mut bad = monitor();
    bad["pluginConfig"]["max_ouput_length"] = 80.into();
    let dir = tempfile::tempdir().unwrap();
    let bad_path = dir.path().join("bad.json");
    std::fs::write(&bad_path, bad.to_string()).unwrap();
    let err = json_schema::validate(&schema, &[&bad_path]).unwrap_err();
    assert!(err.contains("max_ouput_length"), "{err}");

    // CustomPluginConfig.Validate() (types/config.go), after ApplyConfiguration's defaults.
    let m = monitor();
    let global = &m["pluginConfig"];
    let timeout = go_duration(global["timeout"].as_str().unwrap_or("5s"));
    assert!(go_duration(global["invoke_interval"].as_str().unwrap_or("30s")) > Duration::ZERO);
    let conditions: Vec<&str> = m["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(conditions, ["ChdCalibrationFailed"]);
    for rule in m["rules"].as_array().unwrap() {
        if let Some(t) = rule["timeout"].as_str() {
            assert!(
                go_duration(t) <= timeout,
                "rule timeout {t} above the global {timeout:?}"
            );
        }
        if rule["type"] == "permanent" {
            let c = rule["condition"].as_str().unwrap();
            assert!(
                conditions.contains(&c),
                "permanent rule's {c} has no default condition"
            );
        }
    }
}

#[test]
fn the_plugin_path_is_where_the_daemonset_puts_chd() {
    let m = monitor();
    let rule = &m["rules"][0];
    let ds: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join(COMPONENT).join("daemonset.yaml")).unwrap(),
    )
    .unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let copy: Vec<&str> = pod["initContainers"][0]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(copy[0], "cp");
    assert_eq!(copy[2], rule["path"].as_str().unwrap(), "{copy:?}");
    // The image puts chd where the init container copies it from.
    let dockerfile = std::fs::read_to_string(repo().join("deploy/kubernetes/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("COPY --from=build /out/chd {}", copy[1])),
        "the Dockerfile does not install chd at {}",
        copy[1]
    );
    let npd = &pod["containers"][0];
    let flag = format!(
        "--config.custom-plugin-monitor=/config/{}",
        "chd-plugin-monitor.json"
    );
    assert!(
        npd["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|a| a.as_str() == Some(&flag)),
        "{npd:?}"
    );
    // Host network: 127.0.0.1:9863 is the node's chd serve.
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
}

/// What NPD's plugin.go `run` returns for one invocation: (status, message).
fn run_like_npd(
    path: &str,
    args: &[String],
    timeout: Duration,
    max_output: usize,
) -> (i32, String) {
    let mut child = Command::new(path)
        .args(args)
        // util.Exec: a process group of its own (so a timeout kills the plugin's children).
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < timeout,
            "the plugin ran past its timeout {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = stdout.trim();
    // chd fits its message itself: NPD's byte cut (which can split a character) never bites.
    assert!(
        output.len() <= max_output,
        "{} bytes: {output}",
        output.len()
    );
    (status.code().unwrap_or(-1), output.to_string())
}

#[derive(Debug, Clone, PartialEq)]
struct Condition {
    status: &'static str,
    reason: String,
    message: String,
}

/// custom_plugin_monitor.go `generateStatus` for a permanent rule, with
/// enable_message_change_based_condition_update as configured.
fn next(c: &Condition, exit: i32, message: &str, m: &Value) -> Condition {
    let default = &m["conditions"][0];
    let rule_reason = m["rules"][0]["reason"].as_str().unwrap().to_string();
    let status = match exit {
        0 => "False",
        1 => "True",
        _ => "Unknown",
    };
    let by_message = m["pluginConfig"]["enable_message_change_based_condition_update"] == true;
    let default_reason = default["reason"].as_str().unwrap().to_string();
    let default_message = default["message"].as_str().unwrap().to_string();
    if c.status != status && status != "True" {
        let message = if status == "False" {
            default_message
        } else {
            message.to_string()
        };
        return Condition {
            status,
            reason: default_reason,
            message,
        };
    }
    if c.status != "True" && status == "True"
        || (status == "True" && (c.reason != rule_reason || by_message && c.message != message))
    {
        return Condition {
            status,
            reason: rule_reason,
            message: message.to_string(),
        };
    }
    c.clone()
}

fn serve_replay(recording: &Path) -> (tempfile::TempDir, Chd) {
    let state = tempfile::tempdir().unwrap();
    let chd = Chd::serve(state.path(), &["--replay", recording.to_str().unwrap()]);
    (state, chd)
}

#[test]
fn npd_runs_chd_check_and_the_condition_sets_and_clears() {
    let m = monitor();
    let rule = &m["rules"][0];
    let max_output = m["pluginConfig"]["max_output_length"].as_u64().unwrap() as usize;
    let timeout = go_duration(rule["timeout"].as_str().unwrap());
    // The rule's arguments as NPD passes them, the port of the test's chd serve put in.
    let args = |url: &str| -> Vec<String> {
        let args: Vec<String> = rule["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert!(args.contains(&CHD_URL.to_string()), "{args:?}");
        let at = args
            .iter()
            .position(|a| a == "--npd-max-output")
            .expect("--npd-max-output");
        assert_eq!(
            args[at + 1],
            max_output.to_string(),
            "max_output_length and chd's limit differ"
        );
        args.into_iter()
            .map(|a| if a == CHD_URL { url.to_string() } else { a })
            .collect()
    };
    let initial = Condition {
        status: "False",
        reason: m["conditions"][0]["reason"].as_str().unwrap().into(),
        message: m["conditions"][0]["message"].as_str().unwrap().into(),
    };

    let failed = repo().join("tests/fixtures/replay/results-npu-node.json");
    let (_state, chd) = serve_replay(&failed);
    let url = format!("http://{}", chd.addr);
    let (exit, message) = run_like_npd(chd_bin(), &args(&url), timeout, max_output);
    assert_eq!(exit, 1, "{message}");
    assert_eq!(
        message,
        "device 0 slow column (0.22 x the typical device); pair 0,3: CPU 6 as rank 0 slow (0.30 x the pair median)"
    );
    let c = next(&initial, exit, &message, &m);
    assert_eq!((c.status, c.reason.as_str()), ("True", "ChdVerdictFailed"));
    drop(chd);

    let healthy = repo().join("tests/fixtures/cluster-health/h2d-v1");
    let (_state, chd) = serve_replay(&healthy);
    let url = format!("http://{}", chd.addr);
    let (exit, message) = run_like_npd(chd_bin(), &args(&url), timeout, max_output);
    assert_eq!((exit, message.as_str()), (0, "ok: no findings"));
    let recovered = next(&c, exit, &message, &m);
    assert_eq!(recovered, initial, "the condition clears on recovery");
    drop(chd);

    // chd serve gone: Unknown, saying why.
    let (exit, message) = run_like_npd(chd_bin(), &args(&url), timeout, max_output);
    assert_eq!(exit, 2, "{message}");
    assert!(
        message.starts_with(&format!("unknown: {url}: connection refused")),
        "{message}"
    );
    let unknown = next(&recovered, exit, &message, &m);
    assert_eq!(unknown.status, "Unknown");
}
