//! The jsonnet mixin (mixin/) as the source of the shipped rules and dashboards (issue 29):
//! the committed alerts/chd.rules.yml and dashboards/*.json are exactly what it renders
//! (`scripts/gen-mixin.py --check`, PyPI's jsonnet, installed by scripts/test.sh), it renders
//! valid rules with other fleet group labels, and the rules pass the checks of `mixtool lint`
//! (mixtool itself is a Go program these machines cannot install; its alert checks are
//! copied here from monitoring-mixins/mixtool's pkg/mixer/lint.go), plus the annotations the
//! mixin conventions ask for: a runbook_url to an existing section of docs/runbook.md and a
//! dashboard_url to a shipped dashboard.

#[path = "support/prometheus.rs"]
mod prometheus;

use std::collections::BTreeSet;
use std::process::Command;

use prometheus::{dashboards, promtool_ok, repo, rules_path};
use serde_yaml::Value;

/// `python3 scripts/gen-mixin.py ARGS`: (success, stdout, stderr).
fn gen_mixin(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("python3")
        .arg(repo().join("scripts/gen-mixin.py"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("python3 is required to render the mixin: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn generated_rules_and_dashboards_are_up_to_date() {
    let (ok, stdout, stderr) = gen_mixin(&["--check"]);
    assert!(
        ok,
        "alerts/chd.rules.yml or dashboards/ differ from what mixin/ renders.\n\
         Run scripts/gen-mixin.py to regenerate them (it also regenerates the PrometheusRule), \
         and commit the result.\n{stdout}{stderr}"
    );
}

#[test]
fn the_mixin_renders_valid_rules_with_other_group_labels() {
    let (ok, rules, stderr) = gen_mixin(&["--rules-with", "{ groupLabels: ['cluster', 'pool'] }"]);
    assert!(ok, "{stderr}");
    // Every fleet aggregation and every node join carries both labels.
    assert!(
        rules.contains("quantile by (cluster, pool, name, size_bytes, direction)"),
        "{rules}"
    );
    assert!(
        rules.contains("on (cluster, pool, job, instance, device)"),
        "{rules}"
    );
    assert!(!rules.contains("by (job, instance)"), "{rules}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.rules.yml");
    std::fs::write(&path, &rules).unwrap();
    promtool_ok(
        [
            std::ffi::OsStr::new("check"),
            "rules".as_ref(),
            path.as_os_str(),
        ],
        "rules rendered with groupLabels cluster, pool",
    );
}

fn rules() -> Value {
    let text = std::fs::read_to_string(rules_path()).unwrap();
    serde_yaml::from_str(&text).expect("alerts/chd.rules.yml is YAML")
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// mixtool lint: alert-group-rule-count, alert-group-name-length, alert-name-camelcase,
/// alert-name-length, alert-severity-rule, alert-description-missing-rule,
/// alert-description-templating, alert-summary-missing-rule, alert-summary-templating,
/// alert-summary-style.
#[test]
fn alerts_pass_mixtool_lint_checks() {
    let camel = regex::Regex::new(r"^([A-Z]+[a-z0-9]+)+$").unwrap();
    let template = regex::Regex::new(r"\{\{.+\}\}").unwrap();
    let sentence = regex::Regex::new(r"^[A-Z].+\.$").unwrap();
    let mut errors = Vec::new();
    let mut alerts = 0;
    for group in rules()["groups"].as_sequence().unwrap() {
        let name = str_of(group, "name").unwrap();
        let rules = group["rules"].as_sequence().unwrap();
        if rules.len() > 20 {
            errors.push(format!(
                "[alert-group-rule-count] group {name} has {} rules",
                rules.len()
            ));
        }
        if name.len() > 40 {
            errors.push(format!("[alert-group-name-length] group {name}"));
        }
        for rule in rules {
            let Some(alert) = str_of(rule, "alert") else {
                continue;
            };
            alerts += 1;
            if !camel.is_match(alert) {
                errors.push(format!("[alert-name-camelcase] {alert}"));
            }
            if alert.len() > 40 {
                errors.push(format!("[alert-name-length] {alert}"));
            }
            let severity = str_of(&rule["labels"], "severity").unwrap_or_default();
            if !["warning", "critical", "info"].contains(&severity) {
                errors.push(format!("[alert-severity-rule] {alert}: {severity:?}"));
            }
            let annotations = &rule["annotations"];
            match str_of(annotations, "description") {
                None => errors.push(format!("[alert-description-missing-rule] {alert}")),
                Some(d) if !template.is_match(d) => {
                    errors.push(format!("[alert-description-templating] {alert}: {d}"))
                }
                Some(_) => {}
            }
            match str_of(annotations, "summary") {
                None => errors.push(format!("[alert-summary-missing-rule] {alert}")),
                Some(s) => {
                    if template.is_match(s) {
                        errors.push(format!("[alert-summary-templating] {alert}: {s}"));
                    }
                    if !sentence.is_match(s) {
                        errors.push(format!("[alert-summary-style] {alert}: {s}"));
                    }
                }
            }
        }
    }
    assert!(alerts > 20, "only {alerts} alerts found");
    assert!(errors.is_empty(), "mixtool lint:\n{}", errors.join("\n"));
}

/// Every alert's runbook_url ends in `#<alertname in lower case>` and docs/runbook.md has
/// that section (`## <AlertName>`); every section is an alert's; every dashboard_url opens a
/// shipped dashboard.
#[test]
fn every_alert_links_its_runbook_section_and_a_dashboard() {
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).expect("docs/runbook.md");
    let sections: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter(|h| h.starts_with("Chd"))
        .map(|h| h.trim().to_string())
        .collect();
    let uids: BTreeSet<String> = dashboards()
        .iter()
        .map(|(_, d)| d["uid"].as_str().unwrap().to_string())
        .collect();
    let mut alerts = BTreeSet::new();
    for group in rules()["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(alert) = str_of(rule, "alert") else {
                continue;
            };
            alerts.insert(alert.to_string());
            let url = str_of(&rule["annotations"], "runbook_url").unwrap_or_default();
            assert!(
                url.ends_with(&format!("runbook.md#{}", alert.to_lowercase())),
                "{alert}: runbook_url {url:?}"
            );
            let dashboard = str_of(&rule["annotations"], "dashboard_url").unwrap_or_default();
            let uid = dashboard
                .split("/d/")
                .nth(1)
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_default();
            assert!(uids.contains(uid), "{alert}: dashboard_url {dashboard:?}");
        }
    }
    let missing: Vec<_> = alerts.difference(&sections).collect();
    assert!(
        missing.is_empty(),
        "docs/runbook.md has no section for {missing:?}"
    );
    let extra: Vec<_> = sections.difference(&alerts).collect();
    assert!(
        extra.is_empty(),
        "docs/runbook.md sections for no alert: {extra:?}"
    );
}
