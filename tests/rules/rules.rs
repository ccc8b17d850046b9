//! The alerting and recording rules of alerts/ as tested code: `promtool check rules` is
//! clean, the `promtool test rules` unit tests in alerts/tests/ pass, every alert of the
//! contract (docs/METRICS.md) is defined under its exact name and has a test where it fires
//! and one where it must stay silent, and the rules only read contract metrics.

use crate::prometheus;

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::prometheus::{
    alert_names, contract, is_known_metric, metric_names, promtool_ok, record_names, repo,
    rule_files, rules_path, yaml_files,
};

fn rule_tests() -> Vec<PathBuf> {
    let files = yaml_files(&repo().join("alerts/tests"));
    assert!(!files.is_empty(), "no promtool tests in alerts/tests/");
    files
}

#[test]
fn promtool_check_rules_is_clean() {
    let mut args = vec!["check".into(), "rules".into()];
    args.extend(rule_files().into_iter().map(PathBuf::into_os_string));
    let out = promtool_ok(&args, "rule files");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    let mut args = vec!["test".into(), "rules".into()];
    args.extend(rule_tests().into_iter().map(PathBuf::into_os_string));
    let out = promtool_ok(&args, "rule unit tests");
    assert!(!out.contains("FAILED"), "{out}");
}

#[test]
fn every_contract_alert_is_defined_and_nothing_else() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let defined: BTreeSet<String> = alert_names(&rules).into_iter().collect();
    let contract = contract();
    assert_eq!(
        defined, contract.alerts,
        "alerts/chd.rules.yml and the alert table of docs/METRICS.md disagree"
    );
    // Every alert carries the labels and annotations the runbooks rely on (tests/rules/mixin.rs
    // checks their style and that each runbook_url has its section in docs/runbook.md).
    for block in rules.split("- alert:").skip(1) {
        let name = block.lines().next().unwrap().trim();
        for key in [
            "severity:",
            "summary:",
            "description:",
            "runbook_url:",
            "dashboard_url:",
        ] {
            assert!(block.contains(key), "alert {name} lacks {key}");
        }
    }
}

/// Each alert has a test case in which it fires (`exp_alerts:` with entries) and one that
/// expects silence (`exp_alerts: []`).
#[test]
fn every_alert_has_a_firing_and_a_silent_test_case() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for file in rule_tests() {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = line.trim().strip_prefix("alertname:") else {
                continue;
            };
            let name = name.trim().to_string();
            let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
            match next {
                "exp_alerts: []" => silent.insert(name),
                "exp_alerts:" => fires.insert(name),
                other => panic!(
                    "{}: unexpected line after alertname: {other}",
                    file.display()
                ),
            };
        }
    }
    for alert in alert_names(&rules) {
        assert!(
            fires.contains(&alert),
            "no promtool test where {alert} fires"
        );
        assert!(
            silent.contains(&alert),
            "no promtool test where {alert} stays silent"
        );
    }
}

#[test]
fn rules_read_only_contract_metrics() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let records: BTreeSet<String> = record_names(&rules).into_iter().collect();
    let contract = contract();
    let mut unknown = BTreeSet::new();
    for line in rules.lines().filter(|l| !l.trim_start().starts_with('#')) {
        // Annotations mention metrics in prose; only check expressions and records.
        let key = line.trim_start();
        if ["summary:", "description:", "runbook_url:", "dashboard_url:"]
            .iter()
            .any(|k| key.starts_with(k))
        {
            continue;
        }
        for name in metric_names(line) {
            if !is_known_metric(&name, &contract, &records) {
                unknown.insert(name);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "rules read metrics that docs/METRICS.md does not define: {unknown:?}"
    );
}

#[test]
fn short_for_copy_rewrites_every_for() {
    let rules = std::fs::read_to_string(rules_path()).unwrap();
    let short = prometheus::rules_with_for(&rules, "0s");
    let fors: Vec<&str> = short
        .lines()
        .filter(|l| l.trim_start().starts_with("for:"))
        .collect();
    assert!(!fors.is_empty());
    assert!(fors.iter().all(|l| l.trim() == "for: 0s"), "{fors:?}");
    assert_eq!(alert_names(&short), alert_names(&rules));
}
