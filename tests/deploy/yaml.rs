//! YAML helpers for the manifests and rule files: documents, dotted paths, typed values, the
//! structural key check for kinds without a bundled schema, Prometheus durations.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_yaml::Value;

/// Every YAML document of `text` that is not empty.
pub(crate) fn yaml_documents(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: not valid YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn key(v: &Value, k: &str) -> Option<Value> {
    v.as_mapping().and_then(|m| m.get(k)).cloned()
}

/// The value at a dotted path (`spec.template.spec`); `what` names the object in failures.
pub(crate) fn at(v: &Value, path: &str, what: &str) -> Value {
    let mut cur = v.clone();
    for part in path.split('.') {
        cur = key(&cur, part).unwrap_or_else(|| panic!("{what}: `{path}` is missing"));
    }
    cur
}

pub(crate) fn text(v: &Value, what: &str) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
        .to_string()
}

pub(crate) fn seq(v: &Value, what: &str) -> Vec<Value> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("{what}: expected a list, got {v:?}"))
        .clone()
}

pub(crate) fn string_map(v: &Value, what: &str) -> BTreeMap<String, String> {
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
pub(crate) fn check_keys(v: &Value, what: &str, allowed: &[&str], required: &[&str]) {
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

pub(crate) fn is_prometheus_duration(s: &str) -> bool {
    // Prometheus' model.ParseDuration: units in descending order, each at most once.
    regex::Regex::new(
        r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$",
    )
    .unwrap()
    .is_match(s)
        && !s.is_empty()
}

pub(crate) fn duration_seconds(s: &str) -> f64 {
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
