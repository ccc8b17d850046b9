//! Test support for the rules and dashboards: runs `promtool`, starts a real `prometheus`
//! server on a free loopback port (temp dir for config, rules and TSDB; killed on drop),
//! queries its HTTP API, and reads the Grafana dashboards' PromQL.
//!
//! Both tools come from Debian's `prometheus` package (scripts/test.sh installs it); a test
//! that needs one fails with a message saying so, it never skips.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Run `tool ARGS`; panics with an install hint when the tool is missing.
pub fn run_tool<I, S>(tool: &str, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(tool)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "`{tool}` is required for this test and could not be run: {e}\n\
                 install Debian's `prometheus` package (apt-get install prometheus), \
                 which brings both `prometheus` and `promtool`; scripts/test.sh does it"
            )
        })
}

/// Run `promtool ARGS` and panic with its whole output unless it succeeds.
pub fn promtool_ok<I, S>(args: I, what: &str) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<S> = args.into_iter().collect();
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let out = run_tool("promtool", &args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what}: `promtool {}` failed ({}):\n{text}",
        shown.join(" "),
        out.status
    );
    text
}

/// Files in `dir` whose name ends in `.yml`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(OsStr::to_str) == Some("yml"))
        .collect();
    files.sort();
    files
}

/// The shipped rule files: `alerts/*.yml`.
pub fn rule_files() -> Vec<PathBuf> {
    let files = yaml_files(&repo().join("alerts"));
    assert!(!files.is_empty(), "no rule files in alerts/");
    files
}

/// `alerts/chd.rules.yml`, the file with every alert and recording rule.
pub fn rules_path() -> PathBuf {
    repo().join("alerts/chd.rules.yml")
}

/// Alert names defined in a rule file (`- alert: Name`), in order, duplicates kept.
pub fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Recording rule names defined in a rule file (`- record: name`).
pub fn record_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record:"))
        .map(|n| n.trim().to_string())
        .collect()
}

/// The rules with every `for:` set to `duration`: the copy a short end-to-end test loads.
pub fn rules_with_for(rules: &str, duration: &str) -> String {
    let mut out = String::with_capacity(rules.len());
    for line in rules.lines() {
        match line.split_once("for:") {
            Some((indent, _)) if indent.trim().is_empty() => {
                out.push_str(indent);
                out.push_str("for: ");
                out.push_str(duration);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The metric and alert contract, docs/METRICS.md.
pub struct Contract {
    /// Every metric name the contract defines (`..._received_total` shorthands expanded).
    pub metrics: BTreeSet<String>,
    /// The alert names of the contract's alert table.
    pub alerts: BTreeSet<String>,
}

/// Parse docs/METRICS.md: backticked `chd_*` names in table rows, and the first column of
/// the rows under "## Alerts".
pub fn contract() -> Contract {
    let path = repo().join("docs/METRICS.md");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut metrics = BTreeSet::new();
    let mut alerts = BTreeSet::new();
    let mut in_alerts = false;
    for line in text.lines() {
        if line.starts_with("## ") {
            in_alerts = line.trim() == "## Alerts" || line.starts_with("## Alerts ");
            continue;
        }
        if !line.starts_with('|') {
            continue;
        }
        let cells: Vec<&str> = line.split('|').collect();
        let Some(first) = cells.get(1) else { continue };
        if in_alerts {
            if let Some(name) = first
                .trim()
                .strip_prefix('`')
                .and_then(|n| n.strip_suffix('`'))
            {
                alerts.insert(name.to_string());
            }
            continue;
        }
        let mut previous: Option<String> = None;
        for name in first.split('`').skip(1).step_by(2) {
            if name.starts_with("chd_") {
                metrics.insert(name.to_string());
                previous = Some(name.to_string());
            } else if let (Some(tail), Some(prev)) = (name.strip_prefix("..."), &previous) {
                // `chd_a_b_c_total` / `..._d_total`: any prefix of the previous name.
                for (i, _) in prev.match_indices('_') {
                    metrics.insert(format!("{}{tail}", &prev[..i]));
                }
            }
        }
    }
    assert!(
        !metrics.is_empty() && !alerts.is_empty(),
        "could not parse {}",
        path.display()
    );
    Contract { metrics, alerts }
}

/// Names in `expr` that look like chd metrics or recording rules (`chd_*`, `level:chd_*:op`).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"[a-zA-Z_:][a-zA-Z0-9_:]*").unwrap();
    let strip_strings = regex::Regex::new(r#""[^"]*""#).unwrap();
    let expr = strip_strings.replace_all(expr, "\"\"");
    re.find_iter(&expr)
        .map(|m| m.as_str().to_string())
        .filter(|n| n.starts_with("chd_") || (n.contains(":chd_") && n.matches(':').count() == 2))
        .collect()
}

/// Whether a metric name used in PromQL is one the contract (or a rule file) defines:
/// histogram series are `<name>_bucket`, `_sum`, `_count` of a contract name.
pub fn is_known_metric(name: &str, contract: &Contract, records: &BTreeSet<String>) -> bool {
    if contract.metrics.contains(name) || records.contains(name) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|base| contract.metrics.contains(base))
    })
}

/// A free TCP port on 127.0.0.1 (bound, read, released: the caller retries on a race).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Minimal HTTP/1.0 GET (so the reply is never chunked); returns (status, body).
pub fn http_get(addr: SocketAddr, path_and_query: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET {path_and_query} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// Percent-encode a query parameter value.
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// One alert as `/api/v1/alerts` reports it.
#[derive(Debug, Clone)]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub state: String,
    pub value: String,
}

impl Alert {
    pub fn name(&self) -> &str {
        self.labels
            .get("alertname")
            .map(String::as_str)
            .unwrap_or("")
    }

    /// Whether every `(label, value)` of `want` is among the alert's labels.
    pub fn has(&self, want: &[(&str, &str)]) -> bool {
        want.iter()
            .all(|(k, v)| self.labels.get(*k).map(String::as_str) == Some(*v))
    }
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A running Prometheus server with its own temp dir; killed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Write `files` (name, content) and `prometheus.yml` = `config` into a temp dir and start
    /// `prometheus` on a free loopback port; waits until `/-/ready` answers. Retries with
    /// another port when the chosen one was taken in the meantime.
    pub fn start(config: &str, files: &[(&str, String)]) -> Prometheus {
        let version = run_tool("prometheus", ["--version"]);
        assert!(version.status.success(), "`prometheus --version` failed");
        let mut last_log = String::new();
        for _attempt in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            for (name, content) in files {
                std::fs::write(dir.path().join(name), content).expect("write prometheus file");
            }
            let config_path = dir.path().join("prometheus.yml");
            std::fs::write(&config_path, config).expect("write prometheus.yml");
            let port = free_port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=info")
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "`prometheus` is required for this test and could not be started: \
                         {e}\ninstall Debian's `prometheus` package (apt-get install prometheus)"
                    )
                });
            let log = Arc::new(Mutex::new(String::new()));
            let stderr = child.stderr.take().expect("stderr piped");
            let thread_log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let mut l = thread_log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
            let mut prometheus = Prometheus {
                child,
                addr,
                log,
                _dir: dir,
            };
            let start = Instant::now();
            loop {
                if let Ok((200, _)) = http_get(addr, "/-/ready") {
                    return prometheus;
                }
                if let Ok(Some(status)) = prometheus.child.try_wait() {
                    std::thread::sleep(Duration::from_millis(50));
                    last_log = prometheus.log();
                    if last_log.contains("address already in use") {
                        break; // another port
                    }
                    panic!("prometheus exited ({status}) before it was ready; log:\n{last_log}");
                }
                if start.elapsed() > Duration::from_secs(30) {
                    panic!(
                        "prometheus was not ready within 30 s; log:\n{}",
                        prometheus.log()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("prometheus found no free port in 5 tries; last log:\n{last_log}");
    }

    /// Everything Prometheus logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// GET an API path and return the parsed `data` of a `"status": "success"` reply, or the
    /// reason it failed.
    pub fn api(&self, path_and_query: &str) -> Result<Value, String> {
        let (status, body) = http_get(self.addr, path_and_query)
            .map_err(|e| format!("GET {path_and_query}: {e}"))?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET {path_and_query}: HTTP {status}, not JSON ({e}): {body}"))?;
        if v["status"] != "success" {
            return Err(format!("GET {path_and_query}: HTTP {status}: {body}"));
        }
        Ok(v["data"].clone())
    }

    /// Instant query; the `result` array.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", urlencode(expr)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Active (pending and firing) alerts.
    pub fn alerts(&self) -> Vec<Alert> {
        let data = self
            .api("/api/v1/alerts")
            .unwrap_or_else(|e| panic!("{e}\nprometheus log:\n{}", self.log()));
        data["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|a| Alert {
                        labels: string_map(&a["labels"]),
                        annotations: string_map(&a["annotations"]),
                        state: a["state"].as_str().unwrap_or_default().to_string(),
                        value: a["value"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Firing alerts only.
    pub fn firing(&self) -> Vec<Alert> {
        self.alerts()
            .into_iter()
            .filter(|a| a.state == "firing")
            .collect()
    }

    /// Scrape targets' health: (job, instance, health, last error).
    pub fn targets(&self) -> Vec<(String, String, String, String)> {
        let data = self.api("/api/v1/targets").unwrap_or_default();
        data["activeTargets"]
            .as_array()
            .map(|t| {
                t.iter()
                    .map(|t| {
                        let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                        (
                            t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                            t["labels"]["instance"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            s("health"),
                            s("lastError"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One PromQL expression of a dashboard: a panel target or a variable's metric selector.
#[derive(Debug, Clone)]
pub struct DashboardQuery {
    pub dashboard: String,
    /// Panel title and refId, or `variable NAME`.
    pub source: String,
    /// As written in the JSON, variables and all.
    pub expr: String,
}

/// Every `dashboards/*.json`, parsed, sorted by file name.
pub fn dashboards() -> Vec<(PathBuf, Value)> {
    let dir = repo().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(OsStr::to_str) == Some("json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no dashboards in {}", dir.display());
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()));
            (p, v)
        })
        .collect()
}

/// Every panel of a dashboard, rows' nested panels included (row panels themselves too).
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The text of a query variable's query (string or `{ "query": ... }` object).
pub fn variable_query(var: &Value) -> Option<String> {
    match &var["query"] {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("query").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// The metric selector of `label_values(SELECTOR, label)`; `None` for other variable queries
/// (`label_values(label)`, `label_names()`, ...).
pub fn label_values_selector(query: &str) -> Option<String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let mut depth = 0i32;
    let mut split = None;
    for (i, c) in inner.char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            ',' if depth == 0 => split = Some(i),
            _ => {}
        }
    }
    split.map(|i| inner[..i].trim().to_string())
}

/// Every PromQL expression of a dashboard: panel targets and `label_values` selectors.
pub fn dashboard_queries(file: &Path, dashboard: &Value) -> Vec<DashboardQuery> {
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(DashboardQuery {
                    dashboard: name.clone(),
                    source: format!(
                        "panel {:?} target {}",
                        p["title"].as_str().unwrap_or_default(),
                        t["refId"].as_str().unwrap_or_default()
                    ),
                    expr: expr.to_string(),
                });
            }
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        if let Some(selector) = variable_query(v).as_deref().and_then(label_values_selector) {
            out.push(DashboardQuery {
                dashboard: name.clone(),
                source: format!("variable {}", v["name"].as_str().unwrap_or_default()),
                expr: selector,
            });
        }
    }
    out
}

/// The URL a panel's link to chd's `/matrix` page opens for a node whose `instance` label is
/// `instance` and whose chd listens on `port`: the `chd_host` variable's regex applied to the
/// instance as Grafana applies it (the first capture group), then the link's variables
/// substituted. Panics when the dashboard lacks the variable or the panel a `/matrix` link.
pub fn matrix_link(dashboard: &Value, panel: &Value, instance: &str, port: &str) -> String {
    let var = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "chd_host")
        .expect("a chd_host variable");
    let pattern = var["regex"].as_str().expect("chd_host has a regex");
    let pattern = pattern
        .strip_prefix('/')
        .and_then(|p| p.strip_suffix('/'))
        .unwrap_or_else(|| panic!("chd_host regex {pattern:?} is not /.../"));
    let host = regex::Regex::new(pattern)
        .unwrap_or_else(|e| panic!("chd_host regex {pattern:?}: {e}"))
        .captures(instance)
        .and_then(|c| c.get(1))
        .unwrap_or_else(|| panic!("chd_host regex {pattern:?} does not match {instance:?}"))
        .as_str()
        .to_string();
    let url = panel["links"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["url"].as_str())
        .find(|u| u.ends_with("/matrix"))
        .unwrap_or_else(|| panic!("panel {:?} has no /matrix link", panel["title"]));
    substitute(url, &[("chd_host", &host), ("chd_port", port)]).unwrap()
}

/// Grafana's built-in interval variables as a test pins them, then the caller's values.
pub fn substitute(expr: &str, vars: &[(&str, &str)]) -> Result<String, String> {
    let builtins = [
        ("__rate_interval", "1m"),
        ("__interval", "15s"),
        ("__range", "1h"),
    ];
    let re = regex::Regex::new(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)").unwrap();
    let mut missing = Vec::new();
    let out = re.replace_all(expr, |c: &regex::Captures| {
        let name = c
            .get(1)
            .or_else(|| c.get(2))
            .or_else(|| c.get(3))
            .unwrap()
            .as_str();
        match builtins.iter().chain(vars).find(|(n, _)| *n == name) {
            Some((_, v)) => v.to_string(),
            None => {
                missing.push(name.to_string());
                String::new()
            }
        }
    });
    if missing.is_empty() {
        Ok(out.into_owned())
    } else {
        Err(format!("unknown variables {missing:?} in {expr}"))
    }
}

/// Check PromQL expressions with `promtool check rules`, each wrapped as a recording rule in
/// a temp file; panics naming the failing expressions.
pub fn promtool_check_exprs(exprs: &[(String, String)]) {
    let dir = tempfile::tempdir().unwrap();
    let mut file = String::from("groups:\n  - name: dashboard_expressions\n    rules:\n");
    for (i, (_, expr)) in exprs.iter().enumerate() {
        let quoted = serde_json::to_string(expr).unwrap(); // a JSON string is a YAML string
        file.push_str(&format!(
            "      - record: dashboard:expr_{i}:check\n        expr: {quoted}\n"
        ));
    }
    let path = dir.path().join("dashboard-exprs.yml");
    std::fs::write(&path, &file).unwrap();
    let out = run_tool(
        "promtool",
        [OsStr::new("check"), OsStr::new("rules"), path.as_os_str()],
    );
    if !out.status.success() {
        let listing: Vec<String> = exprs
            .iter()
            .enumerate()
            .map(|(i, (source, expr))| {
                format!("  rule {i} = dashboard:expr_{i}:check: {source}\n      {expr}")
            })
            .collect();
        panic!(
            "promtool rejects dashboard expressions:\n{}{}\nwhere:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            listing.join("\n")
        );
    }
}
