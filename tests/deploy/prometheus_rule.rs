//! The PrometheusRule, regenerated from `alerts/` and compared byte for byte
//! (`CHD_REGENERATE=1`, or `deploy/kubernetes/gen-prometheusrule.sh`, rewrites it), and its
//! groups checked by `promtool check rules`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::{Mapping, Value};

use crate::tools::{read, require_tool, root, run, temp_dir};
use crate::yaml::{at, check_keys, key, seq, text, yaml_documents};

pub(crate) const PROMETHEUS_RULE: &str = "deploy/kubernetes/base/prometheusrule.yaml";

/// The rule files the PrometheusRule is made of: every top-level `*.yml`/`*.yaml` of `dir`
/// whose document has a `groups` key (promtool unit-test files, with `rule_files`/`tests`,
/// and files in subdirectories are not rule files), in file-name order.
pub(crate) fn rule_files(dir: &Path) -> Vec<PathBuf> {
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
pub(crate) fn stringify_values(v: &mut Value) {
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
pub(crate) fn generate_prometheus_rule(alerts_dir: &Path, shown: &str) -> String {
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
         # tests/deploy/prometheus_rule.rs fails when this file and the rule files differ.\n{}",
        serde_yaml::to_string(&Value::Mapping(doc)).unwrap()
    )
}

#[test]
pub(crate) fn prometheus_rule_is_generated_from_alerts() {
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
pub(crate) fn rule_generator_merges_rule_files_in_order_and_skips_tests() {
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
