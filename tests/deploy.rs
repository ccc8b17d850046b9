//! Deployment files, checked with the tools that consume them:
//! - `deploy/systemd/`: `systemd-analyze verify` (with and without the Ascend drop-in), the
//!   hardening settings chd depends on, and the unit's command line parsed by the real binary;
//! - `deploy/kubernetes/`: every kustomization built with `kubectl kustomize`, the built-in
//!   kinds validated against Kubernetes' OpenAPI schemas by `kubernetes-validate --strict`, the
//!   Prometheus Operator kinds (no schema there) checked field by field here, the DaemonSet's
//!   arguments parsed by the real binary with the ConfigMap's chd.toml;
//! - the PrometheusRule, regenerated from `alerts/` and compared byte for byte
//!   (`CHD_REGENERATE=1`, or `deploy/kubernetes/gen-prometheusrule.sh`, rewrites it), and its
//!   groups checked by `promtool check rules`;
//! - `deploy/prometheus/prometheus.yml`: `promtool check config`;
//! - the `dist` build profile.
//!
//! Tools (scripts/test.sh installs them; a missing one fails its test with the command that
//! installs it): `systemd-analyze` (Debian package `systemd`), `promtool` (Debian package
//! `prometheus`), `kubectl` (for `kubectl kustomize`), `kubernetes-validate` (PyPI).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize;
use serde_yaml::{Mapping, Value};

// ---------------------------------------------------------------------------------------
// Helpers: paths, tools, processes, YAML.

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_chd")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A tool the test cannot run without: its path, or a failure that says how to install it.
fn require_tool(name: &str, install: &str) -> PathBuf {
    which(name).unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH, and tests/deploy.rs needs it. Install it: {install} \
             (scripts/test.sh installs every test tool)."
        )
    })
}

const KUBERNETES_VALIDATE_INSTALL: &str = "pip install kubernetes-validate==1.37.0";

/// `kubernetes-validate` as a command: the script pip installs, else the module.
fn kubernetes_validate() -> Command {
    if let Some(exe) = which("kubernetes-validate") {
        return Command::new(exe);
    }
    for python in ["python3", "python"] {
        if let Some(py) = which(python) {
            let probe = Command::new(&py)
                .args(["-c", "import kubernetes_validate"])
                .output();
            if probe.is_ok_and(|o| o.status.success()) {
                let mut cmd = Command::new(py);
                cmd.args(["-m", "kubernetes_validate"]);
                return cmd;
            }
        }
    }
    panic!(
        "`kubernetes-validate` is neither on PATH nor an importable Python module, and \
         tests/deploy.rs needs it. Install it with `{KUBERNETES_VALIDATE_INSTALL}` \
         (scripts/test.sh installs every test tool)."
    )
}

struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
    what: String,
}

impl Ran {
    fn expect_success(self) -> Ran {
        assert!(
            self.success,
            "{} failed:\n--- stdout\n{}\n--- stderr\n{}",
            self.what, self.stdout, self.stderr
        );
        self
    }
}

fn run(cmd: &mut Command) -> Ran {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    Ran {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        what,
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("deploy-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

/// Every YAML document of `text` that is not empty.
fn yaml_documents(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: not valid YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn key(v: &Value, k: &str) -> Option<Value> {
    v.as_mapping().and_then(|m| m.get(k)).cloned()
}

/// The value at a dotted path (`spec.template.spec`); `what` names the object in failures.
fn at(v: &Value, path: &str, what: &str) -> Value {
    let mut cur = v.clone();
    for part in path.split('.') {
        cur = key(&cur, part).unwrap_or_else(|| panic!("{what}: `{path}` is missing"));
    }
    cur
}

fn text(v: &Value, what: &str) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
        .to_string()
}

fn seq(v: &Value, what: &str) -> Vec<Value> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("{what}: expected a list, got {v:?}"))
        .clone()
}

fn string_map(v: &Value, what: &str) -> BTreeMap<String, String> {
    let m = v
        .as_mapping()
        .unwrap_or_else(|| panic!("{what}: expected a mapping, got {v:?}"));
    m.iter()
        .map(|(k, v)| {
            (
                text(k, what),
                v.as_str()
                    .unwrap_or_else(|| panic!("{what}: value of {k:?} must be a string: {v:?}"))
                    .to_string(),
            )
        })
        .collect()
}

/// Fails when `v` has a key outside `allowed` or lacks one of `required`: the structural
/// check for kinds whose schema the validator does not bundle. `allowed` lists the fields of
/// the Prometheus Operator's v1 API that these manifests may use; a typo is a failure.
fn check_keys(v: &Value, what: &str, allowed: &[&str], required: &[&str]) {
    let m = v
        .as_mapping()
        .unwrap_or_else(|| panic!("{what}: expected a mapping, got {v:?}"));
    for k in m.keys() {
        let k = text(k, what);
        assert!(
            allowed.contains(&k.as_str()),
            "{what}: unknown field `{k}` (known: {allowed:?})"
        );
    }
    for r in required {
        assert!(
            m.contains_key(*r),
            "{what}: required field `{r}` is missing"
        );
    }
}

fn is_prometheus_duration(s: &str) -> bool {
    // Prometheus' model.ParseDuration: units in descending order, each at most once.
    regex::Regex::new(
        r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$",
    )
    .unwrap()
    .is_match(s)
        && !s.is_empty()
}

fn duration_seconds(s: &str) -> f64 {
    let re = regex::Regex::new(r"([0-9]+)(ms|y|w|d|h|m|s)").unwrap();
    re.captures_iter(s)
        .map(|c| {
            let n: f64 = c[1].parse().unwrap();
            n * match &c[2] {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                "d" => 86400.0,
                "w" => 604800.0,
                _ => 31536000.0,
            }
        })
        .sum()
}

/// Relative path from `from` to `to` (kustomize refuses absolute paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let to = to.canonicalize().unwrap();
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..f.len() {
        rel.push("..");
    }
    for c in &t[common..] {
        rel.push(c.as_os_str());
    }
    rel
}

// ---------------------------------------------------------------------------------------
// systemd

/// `key=value` lines of a unit file (comments and section headers skipped), in order.
fn unit_settings(text: &str) -> Vec<(String, String)> {
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

fn unit_values(settings: &[(String, String)], k: &str) -> Vec<String> {
    settings
        .iter()
        .filter(|(key, _)| key == k)
        .map(|(_, v)| v.clone())
        .collect()
}

const UNIT_BINARY: &str = "/usr/local/bin/chd";

/// The unit with ExecStart pointed at the binary under test (verify needs it to exist).
fn unit_for_verify() -> String {
    let unit = read(&root().join("deploy/systemd/chd.service"));
    let exec_start = format!("ExecStart={UNIT_BINARY} ");
    assert_eq!(
        unit.matches(&exec_start).count(),
        1,
        "chd.service must have exactly one `{exec_start}...` line"
    );
    unit.replace(&exec_start, &format!("ExecStart={} ", chd_bin()))
}

fn systemd_analyze_verify(unit_dir: &Path) {
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
fn systemd_unit_passes_systemd_analyze_verify() {
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
}

#[test]
fn systemd_analyze_verify_catches_mistakes() {
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
fn systemd_unit_is_hardened_without_breaking_probes() {
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
fn systemd_unit_command_line_is_accepted_by_chd() {
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

// ---------------------------------------------------------------------------------------
// Kubernetes

const K8S: &str = "deploy/kubernetes";

fn kustomize(dir: &Path) -> Vec<Value> {
    let kubectl = require_tool("kubectl", "the `kubectl` package, for `kubectl kustomize`");
    let ran = run(Command::new(kubectl).arg("kustomize").arg(dir)).expect_success();
    yaml_documents(&ran.stdout, &format!("kubectl kustomize {}", dir.display()))
}

/// Kustomizations built once per test run: the base, the Ascend overlay, and the base with
/// the PodMonitor component (an overlay made in a temp dir, as a user would write it).
fn builds() -> &'static Vec<(String, Vec<Value>)> {
    static BUILDS: OnceLock<Vec<(String, Vec<Value>)>> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let base = root().join(K8S).join("base");
        let overlay = temp_dir().keep();
        let kustomization = format!(
            "resources:\n  - {}\ncomponents:\n  - {}\n",
            relative(&overlay, &base).display(),
            relative(&overlay, &root().join(K8S).join("components/podmonitor")).display()
        );
        std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
        let built = vec![
            ("base".to_string(), kustomize(&base)),
            (
                "overlays/ascend".to_string(),
                kustomize(&root().join(K8S).join("overlays/ascend")),
            ),
            (
                "base + components/podmonitor".to_string(),
                kustomize(&overlay),
            ),
        ];
        let _ = std::fs::remove_dir_all(&overlay);
        built
    })
}

fn kind(doc: &Value) -> String {
    text(&at(doc, "kind", "manifest"), "kind")
}

fn name(doc: &Value) -> String {
    text(&at(doc, "metadata.name", "manifest"), "metadata.name")
}

fn find<'a>(docs: &'a [Value], k: &str) -> Option<&'a Value> {
    docs.iter().find(|d| kind(d) == k)
}

fn only<'a>(docs: &'a [Value], k: &str, build: &str) -> &'a Value {
    let all: Vec<&Value> = docs.iter().filter(|d| kind(d) == k).collect();
    assert_eq!(all.len(), 1, "{build}: expected one {k}, got {}", all.len());
    all[0]
}

fn is_operator_kind(doc: &Value) -> bool {
    text(&at(doc, "apiVersion", "manifest"), "apiVersion").starts_with("monitoring.coreos.com/")
}

/// Kubernetes versions the built-in kinds are validated against: an old still-deployed one
/// and the newest the pinned kubernetes-validate bundles.
const KUBERNETES_VERSIONS: &[&str] = &["1.27.0", "1.37.0"];

#[test]
fn kubernetes_builtin_kinds_pass_schema_validation() {
    for (build, docs) in builds() {
        let core: Vec<&Value> = docs.iter().filter(|d| !is_operator_kind(d)).collect();
        let kinds: BTreeSet<String> = core.iter().map(|d| kind(d)).collect();
        for k in ["Namespace", "ConfigMap", "DaemonSet"] {
            assert!(kinds.contains(k), "{build}: no {k} in {kinds:?}");
        }
        let dir = temp_dir();
        let file = dir.path().join("manifests.yaml");
        let body: Vec<String> = core
            .iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect();
        std::fs::write(&file, body.join("---\n")).unwrap();
        let mut cmd = kubernetes_validate();
        cmd.arg("--strict").arg("--quiet");
        for v in KUBERNETES_VERSIONS {
            cmd.arg("-k").arg(v);
        }
        let ran = run(cmd.arg(&file));
        let report = format!("{}{}", ran.stdout, ran.stderr);
        assert!(
            ran.success && !report.contains("ERROR") && !report.contains("WARN"),
            "{build}: kubernetes-validate --strict failed (install: \
             {KUBERNETES_VALIDATE_INSTALL}):\n{report}"
        );
    }
}

#[test]
fn kubernetes_validate_rejects_a_misspelt_field() {
    // The check above is only worth something if strict validation rejects unknown fields.
    let (_, docs) = &builds()[0];
    let mut ds = only(docs, "DaemonSet", "base").clone();
    let spec = ds
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_mapping_mut)
        .unwrap();
    spec.insert("hostPid".into(), true.into());
    let dir = temp_dir();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, serde_yaml::to_string(&ds).unwrap()).unwrap();
    let ran = run(kubernetes_validate()
        .arg("--strict")
        .arg("--quiet")
        .arg(&file));
    assert!(
        !ran.success && ran.stdout.contains("hostPid"),
        "kubernetes-validate accepted an unknown field:\n{}{}",
        ran.stdout,
        ran.stderr
    );
}

const METADATA_KEYS: &[&str] = &["name", "namespace", "labels", "annotations"];
const RELABEL_KEYS: &[&str] = &[
    "sourceLabels",
    "separator",
    "targetLabel",
    "regex",
    "modulus",
    "replacement",
    "action",
];
const RELABEL_ACTIONS: &[&str] = &[
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
];
const SCRAPE_ENDPOINT_KEYS: &[&str] = &[
    "port",
    "portNumber",
    "targetPort",
    "path",
    "scheme",
    "params",
    "interval",
    "scrapeTimeout",
    "tlsConfig",
    "bearerTokenSecret",
    "authorization",
    "basicAuth",
    "oauth2",
    "honorLabels",
    "honorTimestamps",
    "trackTimestampsStaleness",
    "metricRelabelings",
    "relabelings",
    "proxyUrl",
    "noProxy",
    "proxyFromEnvironment",
    "proxyConnectHeader",
    "followRedirects",
    "enableHttp2",
    "filterRunning",
];
const MONITOR_SPEC_KEYS: &[&str] = &[
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
    "endpoints",
    "podMetricsEndpoints",
    "selector",
    "selectorMechanism",
    "namespaceSelector",
    "sampleLimit",
    "targetLimit",
    "labelLimit",
    "labelNameLengthLimit",
    "labelValueLengthLimit",
    "keepDroppedTargets",
    "attachMetadata",
    "scrapeClass",
    "scrapeProtocols",
    "fallbackScrapeProtocol",
    "bodySizeLimit",
];

fn check_metadata(doc: &Value, what: &str) {
    check_keys(&at(doc, "metadata", what), what, METADATA_KEYS, &["name"]);
    check_keys(
        doc,
        what,
        &["apiVersion", "kind", "metadata", "spec"],
        &["apiVersion", "kind", "metadata", "spec"],
    );
    assert_eq!(
        at(doc, "metadata.namespace", what).as_str(),
        Some("chd"),
        "{what}: namespace"
    );
}

fn check_relabelings(v: &Value, what: &str) -> Vec<Value> {
    let rules = seq(v, what);
    for (i, r) in rules.iter().enumerate() {
        let w = format!("{what}[{i}]");
        check_keys(r, &w, RELABEL_KEYS, &[]);
        let action = key(r, "action")
            .map(|a| text(&a, &w).to_lowercase())
            .unwrap_or_else(|| "replace".into());
        assert!(
            RELABEL_ACTIONS.contains(&action.as_str()),
            "{w}: unknown action {action}"
        );
        if let Some(re) = key(r, "regex") {
            let re = text(&re, &w);
            regex::Regex::new(&format!("^(?:{re})$"))
                .unwrap_or_else(|e| panic!("{w}: regex {re:?}: {e}"));
        }
        if let Some(sl) = key(r, "sourceLabels") {
            for l in seq(&sl, &w) {
                text(&l, &w);
            }
        }
        if action == "replace" {
            assert!(
                key(r, "targetLabel").is_some(),
                "{w}: replace needs targetLabel"
            );
        }
    }
    rules
}

/// The structural check of a ServiceMonitor's or PodMonitor's scrape endpoints.
fn check_scrape_endpoints(v: &Value, what: &str) -> Vec<Value> {
    let eps = seq(v, what);
    assert!(!eps.is_empty(), "{what}: no endpoints");
    for (i, ep) in eps.iter().enumerate() {
        let w = format!("{what}[{i}]");
        check_keys(ep, &w, SCRAPE_ENDPOINT_KEYS, &[]);
        let interval = key(ep, "interval").map(|d| text(&d, &w));
        let timeout = key(ep, "scrapeTimeout").map(|d| text(&d, &w));
        for d in interval.iter().chain(timeout.iter()) {
            assert!(is_prometheus_duration(d), "{w}: bad duration {d:?}");
        }
        if let (Some(i), Some(t)) = (&interval, &timeout) {
            assert!(
                duration_seconds(t) <= duration_seconds(i),
                "{w}: scrapeTimeout {t} exceeds interval {i}"
            );
        }
        let relabel = check_relabelings(
            &key(ep, "relabelings").unwrap_or_else(|| panic!("{w}: no relabelings")),
            &format!("{w}.relabelings"),
        );
        // instance = the node's name, not pod IP:port.
        assert!(
            relabel.iter().any(|r| {
                key(r, "targetLabel").and_then(|t| t.as_str().map(str::to_owned))
                    == Some("instance".into())
                    && key(r, "sourceLabels")
                        == Some(Value::Sequence(vec![
                            "__meta_kubernetes_pod_node_name".into()
                        ]))
            }),
            "{w}: no relabelling sets instance from __meta_kubernetes_pod_node_name"
        );
        assert_eq!(
            key(ep, "port").and_then(|p| p.as_str().map(str::to_owned)),
            Some("metrics".into()),
            "{w}: port"
        );
    }
    eps
}

fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>, what: &str) -> bool {
    check_keys(selector, what, &["matchLabels", "matchExpressions"], &[]);
    assert!(
        key(selector, "matchExpressions").is_none(),
        "{what}: matchExpressions not expected"
    );
    let want = string_map(&at(selector, "matchLabels", what), what);
    assert!(
        !want.is_empty(),
        "{what}: empty selector selects everything"
    );
    want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

struct Pod {
    labels: BTreeMap<String, String>,
    spec: Value,
}

fn pod_template(docs: &[Value], build: &str) -> Pod {
    let ds = only(docs, "DaemonSet", build);
    let tpl = at(ds, "spec.template", build);
    Pod {
        labels: string_map(&at(&tpl, "metadata.labels", build), build),
        spec: at(&tpl, "spec", build),
    }
}

fn main_container(pod: &Pod, build: &str) -> Value {
    let containers = seq(&at(&pod.spec, "containers", build), build);
    containers
        .into_iter()
        .find(|c| key(c, "name").and_then(|n| n.as_str().map(str::to_owned)) == Some("chd".into()))
        .unwrap_or_else(|| panic!("{build}: no container named chd"))
}

fn container_port_names(c: &Value, what: &str) -> BTreeMap<String, i64> {
    seq(&at(c, "ports", what), what)
        .iter()
        .map(|p| {
            (
                text(&at(p, "name", what), what),
                at(p, "containerPort", what).as_i64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn prometheus_operator_kinds_are_well_formed_and_select_the_pods() {
    for (build, docs) in builds() {
        let pod = pod_template(docs, build);
        let ports = container_port_names(&main_container(&pod, build), build);
        assert_eq!(ports.get("metrics"), Some(&9863), "{build}: port metrics");

        let service_monitor = find(docs, "ServiceMonitor");
        let pod_monitor = find(docs, "PodMonitor");
        assert!(
            service_monitor.is_some() != pod_monitor.is_some(),
            "{build}: exactly one of ServiceMonitor and PodMonitor (both would scrape twice)"
        );
        if let Some(sm) = service_monitor {
            let what = format!("{build}: ServiceMonitor");
            check_metadata(sm, &what);
            let spec = at(sm, "spec", &what);
            check_keys(&spec, &what, MONITOR_SPEC_KEYS, &["selector", "endpoints"]);
            check_scrape_endpoints(&at(&spec, "endpoints", &what), &format!("{what}.endpoints"));
            assert_eq!(
                key(&spec, "jobLabel").and_then(|j| j.as_str().map(str::to_owned)),
                Some("app.kubernetes.io/name".into()),
                "{what}: jobLabel (job=\"chd\" is what ChdExporterDown matches)"
            );
            // The Service it selects is headless, selects the pods, and names the port.
            let svc = only(docs, "Service", build);
            let svc_what = format!("{build}: Service");
            let svc_labels = string_map(&at(svc, "metadata.labels", &svc_what), &svc_what);
            assert!(selector_matches(
                &at(&spec, "selector", &what),
                &svc_labels,
                &what
            ));
            assert_eq!(
                at(svc, "spec.clusterIP", &svc_what).as_str(),
                Some("None"),
                "{svc_what}: headless"
            );
            let svc_selector = string_map(&at(svc, "spec.selector", &svc_what), &svc_what);
            assert!(svc_selector
                .iter()
                .all(|(k, v)| pod.labels.get(k) == Some(v)));
            assert_eq!(
                svc_labels.get("app.kubernetes.io/name").map(String::as_str),
                Some("chd"),
                "{svc_what}: the job label ServiceMonitor takes"
            );
            let svc_ports = seq(&at(svc, "spec.ports", &svc_what), &svc_what);
            assert!(
                svc_ports.iter().any(|p| {
                    key(p, "name") == Some("metrics".into())
                        && key(p, "port") == Some(9863.into())
                        && key(p, "targetPort") == Some("metrics".into())
                }),
                "{svc_what}: port 9863 named metrics -> container port metrics"
            );
        }
        if let Some(pm) = pod_monitor {
            let what = format!("{build}: PodMonitor");
            check_metadata(pm, &what);
            let spec = at(pm, "spec", &what);
            check_keys(
                &spec,
                &what,
                MONITOR_SPEC_KEYS,
                &["selector", "podMetricsEndpoints"],
            );
            check_scrape_endpoints(
                &at(&spec, "podMetricsEndpoints", &what),
                &format!("{what}.podMetricsEndpoints"),
            );
            assert!(selector_matches(
                &at(&spec, "selector", &what),
                &pod.labels,
                &what
            ));
            assert!(
                find(docs, "Service").is_none(),
                "{build}: the headless Service is only for the ServiceMonitor"
            );
        }

        let rule = only(docs, "PrometheusRule", build);
        check_prometheus_rule_shape(rule, &format!("{build}: PrometheusRule"));
    }
}

fn check_prometheus_rule_shape(rule: &Value, what: &str) {
    check_metadata(rule, what);
    let spec = at(rule, "spec", what);
    check_keys(&spec, what, &["groups"], &["groups"]);
    let mut names = BTreeSet::new();
    for (i, g) in seq(&at(&spec, "groups", what), what).iter().enumerate() {
        let w = format!("{what}.groups[{i}]");
        check_keys(
            g,
            &w,
            &[
                "name",
                "interval",
                "rules",
                "labels",
                "limit",
                "query_offset",
                "partial_response_strategy",
            ],
            &["name", "rules"],
        );
        let n = text(&at(g, "name", &w), &w);
        assert!(names.insert(n.clone()), "{what}: group {n} twice");
        if let Some(d) = key(g, "interval") {
            assert!(is_prometheus_duration(&text(&d, &w)), "{w}: interval");
        }
        for (j, r) in seq(&at(g, "rules", &w), &w).iter().enumerate() {
            let rw = format!("{w}.rules[{j}]");
            check_keys(
                r,
                &rw,
                &[
                    "record",
                    "alert",
                    "expr",
                    "for",
                    "keep_firing_for",
                    "labels",
                    "annotations",
                ],
                &["expr"],
            );
            assert!(
                key(r, "record").is_some() != key(r, "alert").is_some(),
                "{rw}: exactly one of record and alert"
            );
            text(&at(r, "expr", &rw), &rw);
            for d in ["for", "keep_firing_for"] {
                if let Some(v) = key(r, d) {
                    assert!(is_prometheus_duration(&text(&v, &rw)), "{rw}: {d}");
                }
            }
            // The CRD types labels and annotations as map[string]string.
            for m in ["labels", "annotations"] {
                if let Some(v) = key(r, m) {
                    string_map(&v, &format!("{rw}.{m}"));
                }
            }
        }
    }
}

#[test]
fn daemonset_runs_chd_unprivileged_on_every_accelerator_node() {
    for (build, docs) in builds() {
        let what = build.as_str();
        let pod = pod_template(docs, build);
        let spec = &pod.spec;
        let flag = |k: &str| key(spec, k).and_then(|v| v.as_bool()).unwrap_or(false);
        assert!(!flag("hostPID"), "{what}: hostPID");
        assert!(!flag("hostIPC"), "{what}: hostIPC");
        assert!(
            !flag("automountServiceAccountToken")
                && key(spec, "automountServiceAccountToken").is_some(),
            "{what}: chd needs no API token"
        );
        // Accelerator nodes only.
        let selector = string_map(&at(spec, "nodeSelector", what), what);
        assert!(
            selector.contains_key("nvidia.com/gpu.present") != selector.contains_key("accelerator"),
            "{what}: nodeSelector must pick NVIDIA or Ascend nodes: {selector:?}"
        );
        // Pod: non-root, RuntimeDefault seccomp.
        let psc = at(spec, "securityContext", what);
        assert_eq!(key(&psc, "runAsNonRoot"), Some(true.into()), "{what}");
        assert_ne!(key(&psc, "runAsUser"), Some(0.into()), "{what}");
        assert_eq!(
            at(&psc, "seccompProfile.type", what).as_str(),
            Some("RuntimeDefault"),
            "{what}"
        );

        let c = main_container(&pod, build);
        let csc = at(&c, "securityContext", what);
        assert_eq!(
            key(&csc, "readOnlyRootFilesystem"),
            Some(true.into()),
            "{what}"
        );
        assert_eq!(
            key(&csc, "allowPrivilegeEscalation"),
            Some(false.into()),
            "{what}"
        );
        assert_ne!(key(&csc, "privileged"), Some(true.into()), "{what}");
        assert_eq!(
            at(&csc, "capabilities.drop", what),
            Value::Sequence(vec!["ALL".into()]),
            "{what}: drop ALL"
        );
        assert!(
            key(&at(&csc, "capabilities", what), "add").is_none(),
            "{what}: chd needs no capability"
        );
        for init in key(spec, "initContainers")
            .map(|v| seq(&v, what))
            .unwrap_or_default()
        {
            let add = key(&at(&init, "securityContext.capabilities", what), "add");
            assert!(
                add.is_none() || add == Some(Value::Sequence(vec!["CHOWN".into()])),
                "{what}: an init container may add CHOWN at most: {add:?}"
            );
        }

        // Resources: requests, a memory limit, no CPU limit, no accelerator taken from jobs.
        let res = at(&c, "resources", what);
        let requests = at(&res, "requests", what);
        assert!(key(&requests, "cpu").is_some() && key(&requests, "memory").is_some());
        let limits = key(&res, "limits").unwrap_or(Value::Mapping(Mapping::new()));
        assert!(
            key(&limits, "cpu").is_none(),
            "{what}: no CPU limit (throttling)"
        );
        for m in [&requests, &limits] {
            for k in m.as_mapping().unwrap().keys() {
                let k = text(k, what);
                assert!(
                    k == "cpu" || k == "memory" || k == "ephemeral-storage",
                    "{what}: resource {k} would take accelerators from training jobs"
                );
            }
        }

        // Probes on /healthz.
        for p in ["livenessProbe", "readinessProbe"] {
            let probe = at(&c, p, what);
            assert_eq!(at(&probe, "httpGet.path", what).as_str(), Some("/healthz"));
            assert_eq!(at(&probe, "httpGet.port", what).as_str(), Some("metrics"));
        }

        // Volumes: /sys and /proc of the host, read-only, where the flags point; the state
        // directory on the host; the config map.
        let volumes: BTreeMap<String, Value> = seq(&at(spec, "volumes", what), what)
            .into_iter()
            .map(|v| (text(&at(&v, "name", what), what), v))
            .collect();
        let mounts: BTreeMap<String, Value> = seq(&at(&c, "volumeMounts", what), what)
            .into_iter()
            .map(|m| (text(&at(&m, "mountPath", what), what), m))
            .collect();
        let args: Vec<String> = seq(&at(&c, "args", what), what)
            .iter()
            .map(|a| text(a, what))
            .collect();
        let arg = |flag: &str| -> String {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{flag}=")))
                .unwrap_or_else(|| panic!("{what}: no {flag}= argument in {args:?}"))
                .to_string()
        };
        let host_path_at = |mount: &str| -> (String, bool) {
            let m = mounts
                .get(mount)
                .unwrap_or_else(|| panic!("{what}: nothing mounted at {mount}"));
            let vol = &volumes[&text(&at(m, "name", what), what)];
            (
                text(&at(vol, "hostPath.path", what), what),
                key(m, "readOnly") == Some(true.into()),
            )
        };
        assert_eq!(host_path_at(&arg("--sysfs-root")), ("/sys".into(), true));
        assert_eq!(host_path_at(&arg("--procfs-root")), ("/proc".into(), true));
        assert_eq!(
            host_path_at(&arg("--state-dir")),
            ("/var/lib/chd".into(), false)
        );
        let config_path = PathBuf::from(arg("--config"));
        let config_mount = &mounts[config_path.parent().unwrap().to_str().unwrap()];
        let config_volume = &volumes[&text(&at(config_mount, "name", what), what)];
        let config_map_name = text(&at(config_volume, "configMap.name", what), what);
        let config_map = docs
            .iter()
            .find(|d| kind(d) == "ConfigMap" && name(d) == config_map_name)
            .unwrap_or_else(|| panic!("{what}: no ConfigMap {config_map_name}"));
        let file_name = config_path.file_name().unwrap().to_str().unwrap();
        let toml = key(&at(config_map, "data", what), file_name)
            .map(|t| text(&t, what))
            .unwrap_or_else(|| panic!("{what}: ConfigMap {config_map_name} has no {file_name}"));

        // The real binary accepts the container's arguments with the ConfigMap's file.
        let dir = temp_dir();
        let local_config = dir.path().join("chd.toml");
        std::fs::write(&local_config, toml).unwrap();
        let local_args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("--config=") {
                    format!("--config={}", local_config.display())
                } else {
                    a.clone()
                }
            })
            .collect();
        let ran = run(Command::new(chd_bin())
            .args(&local_args)
            .arg("--print-config"))
        .expect_success();
        for line in [
            "sysfs = \"/host/sys\"",
            "procfs = \"/host/proc\"",
            "state_dir = \"/var/lib/chd\"",
            "listen = \"0.0.0.0:9863\"",
        ] {
            assert!(
                ran.stdout.contains(line),
                "{what}: {line} not in\n{}",
                ran.stdout
            );
        }
    }
}

#[test]
fn base_kustomization_lists_every_manifest() {
    let base = root().join(K8S).join("base");
    let k = &yaml_documents(
        &read(&base.join("kustomization.yaml")),
        "kustomization.yaml",
    )[0];
    let listed: BTreeSet<String> = seq(&at(k, "resources", "kustomization"), "resources")
        .iter()
        .map(|r| text(r, "resources"))
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, on_disk,
        "base/kustomization.yaml resources vs files"
    );
}

// ---------------------------------------------------------------------------------------
// PrometheusRule generated from alerts/

const PROMETHEUS_RULE: &str = "deploy/kubernetes/base/prometheusrule.yaml";

/// The rule files the PrometheusRule is made of: every top-level `*.yml`/`*.yaml` of `dir`
/// whose document has a `groups` key (promtool unit-test files, with `rule_files`/`tests`,
/// and files in subdirectories are not rule files), in file-name order.
fn rule_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    files.retain(|p| {
        p.is_file() && matches!(p.extension().and_then(OsStr::to_str), Some("yml" | "yaml"))
    });
    files.sort();
    files.retain(|p| {
        let docs = yaml_documents(&read(p), &p.display().to_string());
        docs.len() == 1 && key(&docs[0], "groups").is_some()
    });
    files
}

/// Label and annotation values as the CRD types them (strings), the way Prometheus reads a
/// scalar into a string field.
fn stringify_values(v: &mut Value) {
    if let Some(m) = v.as_mapping_mut() {
        for (_, val) in m.iter_mut() {
            let s = match &*val {
                Value::String(_) => continue,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => panic!("label or annotation value is not a scalar: {other:?}"),
            };
            *val = Value::String(s);
        }
    }
}

/// The PrometheusRule text for the rule files of `alerts_dir` (`shown` is how the header
/// names that directory).
fn generate_prometheus_rule(alerts_dir: &Path, shown: &str) -> String {
    let files = rule_files(alerts_dir);
    let mut groups = Vec::new();
    for f in &files {
        let doc = yaml_documents(&read(f), &f.display().to_string()).remove(0);
        let mut file_groups = seq(&at(&doc, "groups", &f.display().to_string()), "groups");
        for g in &mut file_groups {
            if let Some(rules) = g.get_mut("rules").and_then(Value::as_sequence_mut) {
                for r in rules {
                    for k in ["labels", "annotations"] {
                        if let Some(m) = r.get_mut(k) {
                            stringify_values(m);
                        }
                    }
                }
            }
        }
        groups.extend(file_groups);
    }
    let sources = if files.is_empty() {
        format!("{shown}/ (no rule files there yet)")
    } else {
        files
            .iter()
            .map(|f| format!("{shown}/{}", f.file_name().unwrap().to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut labels = Mapping::new();
    labels.insert("app.kubernetes.io/name".into(), "chd".into());
    let mut metadata = Mapping::new();
    metadata.insert("name".into(), "chd".into());
    metadata.insert("labels".into(), Value::Mapping(labels));
    let mut spec = Mapping::new();
    spec.insert("groups".into(), Value::Sequence(groups));
    let mut doc = Mapping::new();
    doc.insert("apiVersion".into(), "monitoring.coreos.com/v1".into());
    doc.insert("kind".into(), "PrometheusRule".into());
    doc.insert("metadata".into(), Value::Mapping(metadata));
    doc.insert("spec".into(), Value::Mapping(spec));
    format!(
        "# GENERATED from {sources} by deploy/kubernetes/gen-prometheusrule.sh: do not edit.\n\
         # tests/deploy.rs fails when this file and the rule files differ.\n{}",
        serde_yaml::to_string(&Value::Mapping(doc)).unwrap()
    )
}

#[test]
fn prometheus_rule_is_generated_from_alerts() {
    let expected = generate_prometheus_rule(&root().join("alerts"), "alerts");
    let path = root().join(PROMETHEUS_RULE);
    if std::env::var_os("CHD_REGENERATE").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expected).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let actual = read(&path);
    assert!(
        actual == expected,
        "{PROMETHEUS_RULE} differs from alerts/: run deploy/kubernetes/gen-prometheusrule.sh \
         and commit the result.\n--- expected\n{expected}\n--- actual\n{actual}"
    );

    // Its groups are valid Prometheus rules, and the same rules as in alerts/.
    let rule = &yaml_documents(&actual, PROMETHEUS_RULE)[0];
    let groups = at(rule, "spec.groups", PROMETHEUS_RULE);
    let mut from_alerts = Vec::new();
    for f in rule_files(&root().join("alerts")) {
        let doc = yaml_documents(&read(&f), "rule file").remove(0);
        from_alerts.extend(seq(&at(&doc, "groups", "rule file"), "groups"));
    }
    assert_eq!(
        seq(&groups, "groups").len(),
        from_alerts.len(),
        "group count differs from alerts/"
    );
    let dir = temp_dir();
    let file = dir.path().join("prometheusrule-groups.yml");
    let mut doc = Mapping::new();
    doc.insert("groups".into(), groups);
    std::fs::write(&file, serde_yaml::to_string(&Value::Mapping(doc)).unwrap()).unwrap();
    let promtool = require_tool(
        "promtool",
        "`apt-get install -y prometheus` (Debian package prometheus)",
    );
    run(Command::new(promtool).arg("check").arg("rules").arg(&file)).expect_success();
}

#[test]
fn rule_generator_merges_rule_files_in_order_and_skips_tests() {
    let dir = temp_dir();
    let alerts = dir.path();
    std::fs::write(
        alerts.join("b.rules.yml"),
        "groups:\n  - name: b\n    rules:\n      - alert: B\n        expr: |\n          up == 0\n        \
         for: 5m\n        labels:\n          severity: warning\n          priority: 2\n",
    )
    .unwrap();
    std::fs::write(
        alerts.join("a.yaml"),
        "# a comment\ngroups:\n- name: a\n  rules:\n  - record: job:up:sum\n    expr: sum by (job) (up)\n",
    )
    .unwrap();
    std::fs::write(
        alerts.join("a.test.yml"),
        "rule_files: [a.yaml]\ntests: []\n",
    )
    .unwrap();
    std::fs::write(alerts.join("README.md"), "# not yaml: rules\n").unwrap();
    std::fs::create_dir(alerts.join("tests")).unwrap();
    std::fs::write(alerts.join("tests/c.yml"), "groups: []\n").unwrap();

    let generated = generate_prometheus_rule(alerts, "alerts");
    assert!(
        generated.starts_with("# GENERATED from alerts/a.yaml, alerts/b.rules.yml by"),
        "{generated}"
    );
    let doc = &yaml_documents(&generated, "generated")[0];
    check_keys(
        doc,
        "generated",
        &["apiVersion", "kind", "metadata", "spec"],
        &[],
    );
    let groups = seq(&at(doc, "spec.groups", "generated"), "groups");
    let names: Vec<String> = groups
        .iter()
        .map(|g| text(&at(g, "name", "group"), "name"))
        .collect();
    assert_eq!(names, ["a", "b"]);
    let b = &seq(&at(&groups[1], "rules", "b"), "rules")[0];
    assert_eq!(at(b, "expr", "b").as_str(), Some("up == 0\n"));
    assert_eq!(at(b, "labels.priority", "b").as_str(), Some("2"));
    // Same input, same bytes.
    assert_eq!(generated, generate_prometheus_rule(alerts, "alerts"));

    // No rule files at all: an empty group list.
    let empty = temp_dir();
    let generated = generate_prometheus_rule(empty.path(), "alerts");
    let doc = &yaml_documents(&generated, "generated")[0];
    assert_eq!(seq(&at(doc, "spec.groups", "generated"), "groups").len(), 0);
}

// ---------------------------------------------------------------------------------------
// Prometheus

#[test]
fn prometheus_example_config_passes_promtool() {
    let promtool = require_tool(
        "promtool",
        "`apt-get install -y prometheus` (Debian package prometheus)",
    );
    let dir = root().join("deploy/prometheus");
    run(Command::new(promtool)
        .arg("check")
        .arg("config")
        .arg("prometheus.yml")
        .current_dir(&dir))
    .expect_success();

    // Its rule_files globs load exactly the rule files the PrometheusRule is made of.
    let config = &yaml_documents(&read(&dir.join("prometheus.yml")), "prometheus.yml")[0];
    let mut loaded = BTreeSet::new();
    for pattern in seq(&at(config, "rule_files", "prometheus.yml"), "rule_files") {
        let pattern = dir.join(text(&pattern, "rule_files"));
        let parent = pattern.parent().unwrap().canonicalize().unwrap();
        let glob = pattern.file_name().unwrap().to_str().unwrap();
        let re = regex::Regex::new(&format!(
            "^{}$",
            regex::escape(glob).replace(r"\*", "[^/]*")
        ))
        .unwrap();
        for e in std::fs::read_dir(&parent).unwrap() {
            let e = e.unwrap();
            if e.path().is_file() && re.is_match(&e.file_name().to_string_lossy()) {
                loaded.insert(e.path());
            }
        }
    }
    let rule_files: BTreeSet<PathBuf> = rule_files(&root().join("alerts"))
        .into_iter()
        .map(|p| p.canonicalize().unwrap())
        .collect();
    assert_eq!(
        loaded, rule_files,
        "deploy/prometheus/prometheus.yml rule_files vs alerts/ rule files"
    );
}

// ---------------------------------------------------------------------------------------
// Release profile

#[test]
fn dist_profile_is_lto_stripped_and_keeps_unwinding() {
    let cargo: toml::Table = read(&root().join("Cargo.toml")).parse().unwrap();
    let dist = cargo["profile"]["dist"].as_table().expect("[profile.dist]");
    assert_eq!(dist["inherits"].as_str(), Some("release"));
    assert!(
        matches!(
            dist.get("lto").and_then(|v| v.as_str()),
            Some("fat" | "thin")
        ) || dist.get("lto").and_then(|v| v.as_bool()) == Some(true),
        "dist: lto"
    );
    assert_eq!(dist["codegen-units"].as_integer(), Some(1));
    assert!(
        dist["strip"].as_bool() == Some(true) || dist["strip"].as_str() == Some("symbols"),
        "dist: strip"
    );
    // chd catches panics of collectors and probes; abort would turn one into an exit.
    let panic = dist
        .get("panic")
        .or_else(|| cargo["profile"]["release"].get("panic"));
    assert!(
        panic.is_none() || panic.and_then(|p| p.as_str()) == Some("unwind"),
        "dist must unwind: {panic:?}"
    );
}
