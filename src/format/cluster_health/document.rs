//! One ClusterHealthDetect results document (`{"meta": {...}, "metrics": [...]}`): which files
//! of a run directory to read, reading them (Python's `json.dumps` may write `NaN` and
//! `Infinity`, which JSON does not have), and the descriptive facts of `meta`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Error, PARTIAL_FILE, RESULTS_FILE};
use crate::topology::cpulist;

/// A parsed results document.
#[derive(Debug, Clone)]
pub(super) struct Document {
    pub path: PathBuf,
    pub meta: Value,
    pub metrics: Vec<Value>,
}

/// The files of a run directory to read, and whether they are partial checkpoints.
#[derive(Debug)]
pub(super) struct Chosen {
    pub files: Vec<PathBuf>,
    pub partial: bool,
}

/// `rank_00001.json` -> 1 (`partial`: `rank_00001_partial.json`).
fn rank_file(name: &str, partial: bool) -> Option<u32> {
    let rest = name.strip_prefix("rank_")?;
    let digits = if partial {
        rest.strip_suffix("_partial.json")?
    } else {
        rest.strip_suffix(".json")?
    };
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The per-rank files of `dir`, by rank.
fn rank_files(dir: &Path, partial: bool) -> Result<Vec<PathBuf>, Error> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            let rank = rank_file(name.to_str()?, partial)?;
            Some((rank, e.path()))
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// Prefer the final `results.json`, then the final per-rank files, then the checkpoints.
pub(super) fn choose(dir: &Path) -> Result<Chosen, Error> {
    let results = dir.join(RESULTS_FILE);
    if results.is_file() {
        return Ok(Chosen {
            files: vec![results],
            partial: false,
        });
    }
    let ranks = rank_files(dir, false)?;
    if !ranks.is_empty() {
        return Ok(Chosen {
            files: ranks,
            partial: false,
        });
    }
    let partial = dir.join(PARTIAL_FILE);
    if partial.is_file() {
        return Ok(Chosen {
            files: vec![partial],
            partial: true,
        });
    }
    let ranks = rank_files(dir, true)?;
    if !ranks.is_empty() {
        return Ok(Chosen {
            files: ranks,
            partial: true,
        });
    }
    Err(Error::NoRecording(dir.to_path_buf()))
}

/// Replace the bare `NaN`, `Infinity` and `-Infinity` Python writes with `null`, leaving
/// strings alone.
fn python_floats_to_null(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        } else if let Some(token) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t))
        {
            out.push_str("null");
            rest = &rest[token.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.into()
}

/// Parse the text of one document.
pub(super) fn parse(text: &str, path: &Path) -> Result<Document, Error> {
    let root: Value =
        serde_json::from_str(&python_floats_to_null(text)).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })?;
    let shape = |problem: &str| Error::Shape {
        path: path.to_path_buf(),
        problem: problem.into(),
    };
    let Value::Object(mut root) = root else {
        return Err(shape("the top level is not an object"));
    };
    let metrics = match root.remove("metrics") {
        Some(Value::Array(rows)) => rows,
        Some(other) => {
            return Err(shape(&format!(
                "no \"metrics\" array (\"metrics\" is {})",
                json_kind(&other)
            )))
        }
        None => return Err(shape("no \"metrics\" array")),
    };
    let meta = match root.remove("meta") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(m @ Value::Object(_)) => m,
        Some(_) => return Err(shape("\"meta\" is not an object")),
    };
    Ok(Document {
        path: path.to_path_buf(),
        meta,
        metrics,
    })
}

/// `a number`, `an object`, ... for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Read and parse one document.
pub(super) fn read(path: &Path) -> Result<Document, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// A non-negative integer, also from `3.0` or `"3"`.
pub(super) fn uint(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A CPU id.
pub(super) fn cpu(v: Option<&Value>) -> Option<u32> {
    uint(v).and_then(|c| u32::try_from(c).ok())
}

/// A list of integers (`[0, 1, 2]`), or `None` if it is not one.
pub(super) fn uint_list(v: Option<&Value>) -> Option<Vec<u64>> {
    v?.as_array()?.iter().map(|i| uint(Some(i))).collect()
}

/// How far a partial checkpoint got, from its `meta`.
pub(super) fn progress(path: &Path, meta: &Value) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = |k: &str| match meta.get(k) {
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => None,
    };
    let mut parts = Vec::new();
    if let Some(c) = text("last_completed_cpu") {
        parts.push(format!("last completed CPU {c}"));
    }
    if let Some(n) = text("completed_pairs_per_rank") {
        parts.push(format!("{n} CPU pairs done per rank"));
    }
    match (text("last_rank0_cpu"), text("last_rank1_cpu")) {
        (Some(a), Some(b)) => parts.push(format!("last CPU pair {a} x {b}")),
        _ => {
            if let Some(p) = text("last_pair") {
                parts.push(format!("last CPU pair {p}"));
            }
        }
    }
    if let Some(t) = text("updated_at") {
        parts.push(format!("updated {t}"));
    }
    if parts.is_empty() {
        format!("only the partial checkpoint {name} exists: the run did not finish")
    } else {
        format!(
            "only the partial checkpoint {name} exists: the run did not finish ({})",
            parts.join(", ")
        )
    }
}

/// NUMA node -> CPUs from `meta.affinity_summary.numa_nodes` (`"unknown"` is left out).
pub(super) fn numa_nodes(meta: &Value) -> BTreeMap<u32, Vec<u32>> {
    let mut out = BTreeMap::new();
    let Some(nodes) = meta
        .pointer("/affinity_summary/numa_nodes")
        .and_then(Value::as_object)
    else {
        return out;
    };
    for (id, node) in nodes {
        let Ok(id) = id.trim().parse::<u32>() else {
            continue;
        };
        let cpus: Vec<u32> = node
            .get("cpus")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|c| cpu(Some(c))).collect())
            .unwrap_or_default();
        out.insert(id, cpus);
    }
    out
}

/// A scalar as text.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A list of CPUs as a count and a cpulist: `640 (0-639)`.
fn cpus_text(v: &Value) -> Option<String> {
    let ids: Vec<u32> = uint_list(Some(v))?
        .into_iter()
        .filter_map(|c| u32::try_from(c).ok())
        .collect();
    Some(format!("{} ({})", ids.len(), cpulist::format(&ids)))
}

/// What a report header shows of `meta`: the tool's known keys in words, then any other
/// scalar keys as they are. Bulky diagnostics (`env`, `torch_stack`, `npu_smi_head`,
/// `affinity_summary`) contribute only their headline facts.
pub(super) fn facts(meta: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let Some(obj) = meta.as_object() else {
        return out;
    };
    let host = meta
        .pointer("/affinity_summary/host")
        .or_else(|| meta.pointer("/rank_info/host"))
        .and_then(scalar);
    if let Some(h) = host {
        out.push(("host".into(), h));
    }
    let known: &[(&str, &str)] = &[
        ("device_kind", "device kind"),
        ("created_at", "started"),
        ("finished_at", "finished"),
        ("updated_at", "checkpoint written"),
    ];
    for (key, label) in known {
        if let Some(v) = obj.get(*key).and_then(scalar) {
            out.push(((*label).into(), v));
        }
    }
    if let Some(ids) = uint_list(obj.get("device_ids")) {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        out.push(("devices".into(), ids.join(", ")));
    }
    if let Some(pair) = uint_list(obj.get("device_pair")) {
        let pair: Vec<String> = pair.iter().map(u64::to_string).collect();
        out.push(("device pair".into(), pair.join(",")));
    }
    for (key, label) in [
        ("cpu_ids", "cpus"),
        ("rank0_cpus", "rank 0 cpus"),
        ("rank1_cpus", "rank 1 cpus"),
    ] {
        if let Some(t) = obj.get(key).and_then(cpus_text) {
            out.push((label.into(), t));
        }
    }
    if let Some(sizes) = obj.get("sizes_mb").and_then(Value::as_array) {
        let sizes: Vec<String> = sizes.iter().filter_map(scalar).collect();
        out.push(("sizes".into(), format!("{} MiB", sizes.join(", "))));
    }
    if let Some(r) = obj.get("record_ranks").and_then(scalar) {
        out.push(("recorded ranks".into(), r));
    }
    let versions: Vec<String> = ["torch_version", "torch_npu_version", "cuda_version"]
        .iter()
        .filter_map(|k| {
            let v = meta
                .pointer(&format!("/torch_stack/{k}"))
                .and_then(scalar)?;
            Some(format!("{} {v}", k.trim_end_matches("_version")))
        })
        .collect();
    if !versions.is_empty() {
        out.push(("torch".into(), versions.join(", ")));
    }
    if let Some(argv) = obj.get("argv").and_then(Value::as_array) {
        let argv: Vec<String> = argv.iter().filter_map(scalar).collect();
        out.push(("command".into(), argv.join(" ")));
    }
    const HANDLED: &[&str] = &[
        "device_kind",
        "created_at",
        "finished_at",
        "updated_at",
        "device_ids",
        "device_pair",
        "cpu_ids",
        "rank0_cpus",
        "rank1_cpus",
        "sizes_mb",
        "record_ranks",
        "argv",
        "partial",
        "last_completed_cpu",
        "completed_pairs_per_rank",
        "last_rank0_cpu",
        "last_rank1_cpu",
        "last_pair",
    ];
    for (k, v) in obj {
        if HANDLED.contains(&k.as_str()) {
            continue;
        }
        if let Some(t) = scalar(v) {
            out.push((k.clone(), t));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_nan_and_infinity_become_null_outside_strings() {
        let text = r#"{"a": NaN, "b": -Infinity, "c": "NaN Infinity \" NaN", "d": [Infinity]}"#;
        let v: Value = serde_json::from_str(&python_floats_to_null(text)).unwrap();
        assert_eq!(v["a"], Value::Null);
        assert_eq!(v["b"], Value::Null);
        assert_eq!(v["c"], "NaN Infinity \" NaN");
        assert_eq!(v["d"][0], Value::Null);
    }

    #[test]
    fn rank_file_names() {
        assert_eq!(rank_file("rank_00001.json", false), Some(1));
        assert_eq!(rank_file("rank_00001_partial.json", false), None);
        assert_eq!(rank_file("rank_00001_partial.json", true), Some(1));
        assert_eq!(rank_file("rank_.json", false), None);
        assert_eq!(rank_file("results.json", false), None);
    }

    #[test]
    fn shapes_that_are_not_results_are_named() {
        let p = Path::new("x.json");
        let e = |t: &str| parse(t, p).unwrap_err().to_string();
        assert!(e("[]").contains("top level is not an object"));
        assert!(e("{}").contains("no \"metrics\" array"));
        assert!(e(r#"{"metrics": {}}"#).contains("no \"metrics\" array (\"metrics\" is an object)"));
        assert!(e(r#"{"metrics": [], "meta": 3}"#).contains("\"meta\" is not an object"));
        assert!(e("[1").contains("not JSON"));
    }
}
