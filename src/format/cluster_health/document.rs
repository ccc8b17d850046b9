//! One ClusterHealthDetect results document (`{"meta": {...}, "metrics": [...]}`): which files
//! of a run directory to read, reading them streaming (row by row into a [`Sink`], through
//! [`PythonFloats`] since Python's `json.dumps` may write `NaN` and `Infinity`, which JSON
//! does not have), and the descriptive facts of `meta`.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::python_floats::PythonFloats;
use super::row::Row;
use super::{Error, PARTIAL_FILE, RESULTS_FILE};
use crate::topology::cpulist;

/// A results document read: its `meta` (its rows went to a [`Sink`]).
#[derive(Debug, Clone)]
pub(super) struct Document {
    pub path: PathBuf,
    pub meta: Value,
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

/// What takes a document's rows as they stream past: its `meta` first, then each row of
/// `metrics` with its index.
pub(super) trait Sink {
    fn meta(&mut self, path: &Path, meta: &Value);
    fn row(&mut self, index: usize, row: Row);
}

/// Where the top level's `metrics` stands while the document streams.
enum Metrics {
    Absent,
    /// Its rows went to the sink.
    Streamed,
    /// Rows read before `meta` (a document whose keys are not sorted), given to the sink
    /// once `meta` is known.
    Held(Vec<Row>),
    /// Not an array: what it is.
    Not(&'static str),
}

/// The document being read: what the top level held so far.
struct Top<'a> {
    path: &'a Path,
    sink: &'a mut dyn Sink,
    /// `meta` (an object; `null` reads as an empty one), or `Err` when it is something else.
    meta: Option<Result<Value, ()>>,
    meta_given: bool,
    metrics: Metrics,
    /// Set when the top level is not an object.
    not_an_object: bool,
}

impl Top<'_> {
    /// Give the sink `meta` once, when it is an object.
    fn give_meta(&mut self) -> bool {
        match &self.meta {
            Some(Ok(meta)) => {
                if !self.meta_given {
                    self.sink.meta(self.path, meta);
                    self.meta_given = true;
                }
                true
            }
            _ => false,
        }
    }
}

/// A top-level key: `meta`, `metrics` or another.
#[derive(Clone, Copy, PartialEq)]
enum TopKey {
    Meta,
    Metrics,
    Other,
}

/// Reads a [`TopKey`].
struct TopKeys;

impl<'de> DeserializeSeed<'de> for TopKeys {
    type Value = TopKey;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<TopKey, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for TopKeys {
    type Value = TopKey;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<TopKey, E> {
        Ok(match key {
            "meta" => TopKey::Meta,
            "metrics" => TopKey::Metrics,
            _ => TopKey::Other,
        })
    }
}

/// The scalar visits of a visitor that takes any value: each hands `$on` the visitor and
/// the name of the kind it met (for the message about a value of the wrong kind).
macro_rules! kinds {
    ($ty:ty, $on:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<$ty, E> {
            Ok($on(self, "null"))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<$ty, E> {
            Ok($on(self, "a boolean"))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<$ty, E> {
            Ok($on(self, "a number"))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$ty, E> {
            Ok($on(self, "a number"))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<$ty, E> {
            Ok($on(self, "a number"))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<$ty, E> {
            Ok($on(self, "a string"))
        }
    };
}

impl<'de> DeserializeSeed<'de> for &mut Top<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &mut Top<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a results document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(TopKeys)? {
            match key {
                TopKey::Meta => {
                    self.meta = Some(match map.next_value::<Value>()? {
                        Value::Null => Ok(Value::Object(Default::default())),
                        m @ Value::Object(_) => Ok(m),
                        _ => Err(()),
                    })
                }
                TopKey::Metrics => map.next_value_seed(MetricsSeed(&mut *self))?,
                TopKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.not_an_object = true;
        Ok(())
    }

    kinds!((), |top: &mut Top, _| top.not_an_object = true);
}

/// The value of the top level's `metrics`.
struct MetricsSeed<'t, 'a>(&'t mut Top<'a>);

impl<'de> DeserializeSeed<'de> for MetricsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MetricsSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the metrics array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let top = self.0;
        if top.meta.is_none() {
            let mut held = Vec::new();
            while let Some(row) = seq.next_element::<Row>()? {
                held.push(row);
            }
            top.metrics = Metrics::Held(held);
            return Ok(());
        }
        if top.give_meta() {
            let mut index = 0;
            while let Some(row) = seq.next_element::<Row>()? {
                top.sink.row(index, row);
                index += 1;
            }
        } else {
            // `meta` is not an object: the document is refused, its rows only read past.
            while seq.next_element::<IgnoredAny>()?.is_some() {}
        }
        top.metrics = Metrics::Streamed;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.0.metrics = Metrics::Not("an object");
        Ok(())
    }

    kinds!((), |s: MetricsSeed, kind| s.0.metrics = Metrics::Not(kind));
}

/// Read one document from `reader` (`path` names it in messages), its rows going to `sink`.
fn from_reader(reader: impl Read, path: &Path, sink: &mut dyn Sink) -> Result<Document, Error> {
    let mut top = Top {
        path,
        sink,
        meta: None,
        meta_given: false,
        metrics: Metrics::Absent,
        not_an_object: false,
    };
    let reader = std::io::BufReader::with_capacity(64 * 1024, PythonFloats::new(reader));
    let mut de = serde_json::Deserializer::from_reader(reader);
    let parsed = (&mut top).deserialize(&mut de).and_then(|()| de.end());
    if let Err(e) = parsed {
        return Err(if e.is_io() {
            Error::Io {
                path: path.to_path_buf(),
                source: e.into(),
            }
        } else {
            Error::Json {
                path: path.to_path_buf(),
                error: e,
            }
        });
    }
    let shape = |problem: String| Error::Shape {
        path: path.to_path_buf(),
        problem,
    };
    if top.not_an_object {
        return Err(shape("the top level is not an object".into()));
    }
    let held = match std::mem::replace(&mut top.metrics, Metrics::Streamed) {
        Metrics::Absent => return Err(shape("no \"metrics\" array".into())),
        Metrics::Not(kind) => {
            return Err(shape(format!(
                "no \"metrics\" array (\"metrics\" is {kind})"
            )))
        }
        Metrics::Streamed => Vec::new(),
        Metrics::Held(rows) => rows,
    };
    let meta = top
        .meta
        .take()
        .unwrap_or_else(|| Ok(Value::Object(Default::default())));
    let Ok(meta) = meta else {
        return Err(shape("\"meta\" is not an object".into()));
    };
    if !top.meta_given {
        top.sink.meta(path, &meta);
        for (index, row) in held.into_iter().enumerate() {
            top.sink.row(index, row);
        }
    }
    Ok(Document {
        path: path.to_path_buf(),
        meta,
    })
}

/// Parse the text of one document.
pub(super) fn parse(text: &str, path: &Path, sink: &mut dyn Sink) -> Result<Document, Error> {
    from_reader(text.as_bytes(), path, sink)
}

/// Read one document, streaming: the file is never held whole, only the row being read.
pub(super) fn read(path: &Path, sink: &mut dyn Sink) -> Result<Document, Error> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_reader(file, path, sink)
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

    /// Keeps what a document gives a sink.
    #[derive(Default)]
    struct Kept {
        meta: Vec<Value>,
        rows: Vec<(usize, Row)>,
    }

    impl Sink for Kept {
        fn meta(&mut self, _: &Path, meta: &Value) {
            self.meta.push(meta.clone());
        }
        fn row(&mut self, index: usize, row: Row) {
            self.rows.push((index, row));
        }
    }

    fn parse_kept(text: &str) -> Result<Kept, Error> {
        let mut kept = Kept::default();
        parse(text, Path::new("x.json"), &mut kept)?;
        Ok(kept)
    }

    #[test]
    fn python_nan_and_infinity_read_as_null_and_strings_keep_them() {
        let kept = parse_kept(
            r#"{"meta": {"a": NaN, "b": -Infinity, "c": "NaN Infinity \" NaN"},
                "metrics": [{"gbps": Infinity, "error": "gbps=-Infinity, NaN", "size_mb": -1},
                            {"gbps": NaN}]}"#,
        )
        .unwrap();
        assert_eq!(kept.meta.len(), 1);
        let meta = &kept.meta[0];
        assert_eq!(meta["a"], Value::Null);
        assert_eq!(meta["b"], Value::Null);
        assert_eq!(meta["c"], "NaN Infinity \" NaN");
        let (i, row) = &kept.rows[0];
        assert_eq!(*i, 0);
        assert_eq!(row.get("gbps"), Some(&Value::Null));
        assert_eq!(row.get("error"), Some(&Value::from("gbps=-Infinity, NaN")));
        assert_eq!(row.get("size_mb"), Some(&Value::from(-1)));
        assert_eq!(kept.rows[1].1.get("gbps"), Some(&Value::Null));
    }

    #[test]
    fn rows_before_meta_wait_for_it() {
        let kept =
            parse_kept(r#"{"metrics": [{"test": "a"}, {"test": "b"}], "meta": {"x": 1}}"#).unwrap();
        assert_eq!(kept.meta, vec![serde_json::json!({"x": 1})]);
        let tests: Vec<_> = kept
            .rows
            .iter()
            .map(|(i, r)| (*i, r.get("test").cloned()))
            .collect();
        assert_eq!(tests, vec![(0, Some("a".into())), (1, Some("b".into()))]);
    }

    #[test]
    fn a_truncated_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.json");
        std::fs::write(
            &path,
            "{\n  \"meta\": {},\n  \"metrics\": [\n    {\n      \"gbps\": 1.5,\n",
        )
        .unwrap();
        let e = read(&path, &mut Kept::default()).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: not JSON: EOF while parsing", path.display())),
            "{e}"
        );
        let e = read(&dir.path().join("none.json"), &mut Kept::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot read ") && e.contains("none.json"),
            "{e}"
        );
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
        let e = |t: &str| parse(t, p, &mut Kept::default()).unwrap_err().to_string();
        assert!(e("[]").contains("top level is not an object"));
        assert!(e("{}").contains("no \"metrics\" array"));
        assert!(e(r#"{"metrics": {}}"#).contains("no \"metrics\" array (\"metrics\" is an object)"));
        assert!(e(r#"{"metrics": [], "meta": 3}"#).contains("\"meta\" is not an object"));
        assert!(e(r#"{"metrics": null}"#).contains("(\"metrics\" is null)"));
        assert!(e(r#"{"metrics": "x", "meta": {}}"#).contains("(\"metrics\" is a string)"));
        assert!(e("3").contains("top level is not an object"));
        assert!(e(r#"{"metrics": [], "x": 1} 2"#).contains("not JSON: trailing characters"));
        assert!(e("[1").contains("not JSON"));
    }
}
