//! ClusterHealthDetect's `affinity.json`: `{"created_at", "summary", "cpus": [...]}`, one
//! record per present CPU (`affinity.py:CpuRecord`): whether it is online, allowed by the
//! cpuset and bindable, its NUMA node, socket, core and thread siblings. Unknown values are
//! `null`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::Error;

/// One CPU as the tool saw it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RecordedCpu {
    pub cpu: u32,
    #[serde(default)]
    pub online: Option<bool>,
    #[serde(default)]
    pub allowed: Option<bool>,
    /// `None` when the tool did not check.
    #[serde(default)]
    pub bindable: Option<bool>,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default)]
    pub socket_id: Option<u32>,
    #[serde(default)]
    pub core_id: Option<u32>,
    #[serde(default)]
    pub thread_siblings: Vec<u32>,
    /// Why binding failed, in the tool's words.
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Deserialize)]
struct AffinityFile {
    cpus: Vec<RecordedCpu>,
}

/// Parse the text of an `affinity.json`.
pub(super) fn parse(text: &str, path: &Path) -> Result<Vec<RecordedCpu>, Error> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|error| Error::Json {
        path: path.to_path_buf(),
        error,
    })?;
    let file: AffinityFile = serde_json::from_value(value).map_err(|e| Error::Shape {
        path: path.to_path_buf(),
        problem: format!("not ClusterHealthDetect's affinity.json ({e})"),
    })?;
    Ok(file.cpus)
}

/// Read an `affinity.json`.
pub(super) fn read(path: &Path) -> Result<Vec<RecordedCpu>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// Add the CPUs whose NUMA node only `affinity.json` knows.
pub(super) fn merge_numa(nodes: &mut BTreeMap<u32, Vec<u32>>, cpus: &[RecordedCpu]) {
    let known: std::collections::BTreeSet<u32> = nodes.values().flatten().copied().collect();
    for c in cpus {
        if let (Some(node), false) = (c.numa_node, known.contains(&c.cpu)) {
            let list = nodes.entry(node).or_default();
            list.push(c.cpu);
            list.sort_unstable();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_with_nulls_and_fill_missing_numa_nodes() {
        let text = r#"{"created_at": "2026-07-08T03:00:00+00:00", "summary": {},
          "cpus": [
            {"allowed": true, "bindable": true, "core_id": 0, "cpu": 0, "numa_node": 0,
             "online": true, "reason": null, "socket_id": 0, "thread_siblings": [0, 1]},
            {"allowed": false, "bindable": false, "core_id": null, "cpu": 5, "numa_node": 1,
             "online": true, "reason": "OSError(22, 'Invalid argument')", "socket_id": null,
             "thread_siblings": []}]}"#;
        let cpus = parse(text, Path::new("affinity.json")).unwrap();
        assert_eq!(cpus[0].thread_siblings, vec![0, 1]);
        assert_eq!(cpus[1].bindable, Some(false));
        assert_eq!(cpus[1].socket_id, None);
        let mut nodes = BTreeMap::from([(0, vec![0])]);
        merge_numa(&mut nodes, &cpus);
        assert_eq!(nodes, BTreeMap::from([(0, vec![0]), (1, vec![5])]));
    }

    #[test]
    fn another_shape_is_refused_by_name() {
        let e = parse(r#"[{"cpu": 0, "bindable": true}]"#, Path::new("a.json")).unwrap_err();
        assert!(
            e.to_string()
                .contains("not ClusterHealthDetect's affinity.json"),
            "{e}"
        );
    }
}
