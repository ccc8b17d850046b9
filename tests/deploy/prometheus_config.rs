//! `deploy/prometheus/prometheus.yml`: `promtool check config`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use crate::prometheus_rule::rule_files;
use crate::tools::{read, require_tool, root, run};
use crate::yaml::{at, seq, text, yaml_documents};

#[test]
pub(crate) fn prometheus_example_config_passes_promtool() {
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
