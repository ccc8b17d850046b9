//! ClusterHealthDetect's metric rows in chd's vocabulary.
//!
//! - `core_h2d_matrix` rows: `host_cpu`, `device_id` (or `device: "npu:3"`), `size_mb` (MiB),
//!   `gbps` (decimal GB/s), `direction` (`host_to_device` -> `h2d`, `device_to_host` ->
//!   `d2h`), `pinned` (`true` -> `pinned`, `false` -> `pageable`), `status` (`ok`, `error`,
//!   `skip`), `operation` (`copy`, `bind_cpu`), `repeat`.
//! - `core_pair_d2d_matrix` rows: `rank0_cpu`, `rank1_cpu`, `size_mb`, `alg_gbps` (per-rank
//!   bytes / time: at two ranks nccl-tests' bus bandwidth), `device_pair` (`[0, 5]`; error
//!   rows leave it to `meta.device_pair`), `rank`, `repeat`, `operation` (`all_gather`,
//!   `bind_cpu`).
//!
//! Each `repeat` is one more sample of a cell. An error row is a failed sample, never zero
//! bandwidth; one without a device or size (a failed bind happens before any device) fails
//! every device and size the recording lists, and takes the host memory its matrix's
//! measured rows used. With `RECORD_RANKS=all` a pair run records
//! every cell once per rank: those rows are one sample (rank 0's value; a failure on either
//! rank fails it). Rows that cannot be placed in a matrix are rejected with a reason;
//! rows of other tests are only counted.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::document::{cpu, uint, uint_list, Sink};
use super::row::Row;
use super::{Failure, FailureKind, MatrixKind, RecordedSample, Rejected};

/// What the rows of a recording come to.
#[derive(Debug, Default)]
pub(super) struct Interpreted {
    pub samples: Vec<RecordedSample>,
    pub rejected: Vec<Rejected>,
    pub other_tests: BTreeMap<String, usize>,
    pub devices: Vec<String>,
    pub notes: Vec<String>,
}

/// What `meta` says about the whole run, used to fill what error rows leave out.
#[derive(Debug, Default)]
struct RunFacts {
    device_ids: Vec<String>,
    sizes_bytes: Vec<u64>,
    device_pair: Option<String>,
}

impl RunFacts {
    fn of(meta: &Value) -> RunFacts {
        RunFacts {
            device_ids: uint_list(meta.get("device_ids"))
                .unwrap_or_default()
                .iter()
                .map(u64::to_string)
                .collect(),
            sizes_bytes: meta
                .get("sizes_mb")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|v| mib(Some(v))).collect())
                .unwrap_or_default(),
            device_pair: device_pair(meta.get("device_pair")),
        }
    }
}

/// A row read, before missing devices and sizes are filled in.
#[derive(Debug)]
struct Pending {
    facts: usize,
    sample: RecordedSample,
    device_known: bool,
    size_known: bool,
    repeat: Option<u64>,
    rank: Option<u64>,
    /// Index of the row in its document's `metrics`.
    row: usize,
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn float(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// MiB -> bytes (`size_mb` is MiB: the tool allocates `size_mb * 1024 * 1024` bytes).
fn mib(v: Option<&Value>) -> Option<u64> {
    float(v)
        .filter(|m| m.is_finite() && *m > 0.0)
        .map(|m| (m * f64::from(1u32 << 20)).round() as u64)
}

/// `[5, 0]`, `"0,5"`, `"0-5"` or `"(0, 5)"` -> `"0,5"`.
fn device_pair(v: Option<&Value>) -> Option<String> {
    let mut ids: Vec<u64> = match v? {
        Value::Array(items) => items.iter().map(|i| uint(Some(i))).collect::<Option<_>>()?,
        Value::String(s) => s
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().ok())
            .collect::<Option<_>>()?,
        _ => return None,
    };
    ids.sort_unstable();
    (ids.len() == 2 && ids[0] != ids[1]).then(|| format!("{},{}", ids[0], ids[1]))
}

/// `device_id`, else the device of `device: "npu:3"`.
fn device_id(row: &Row) -> Option<String> {
    if let Some(id) = uint(row.get("device_id")) {
        return Some(id.to_string());
    }
    let device = text(row.get("device"))?;
    match device.split_once(':') {
        Some((_, index)) if index.parse::<u64>().is_ok() => Some(index.to_string()),
        Some(_) => None,
        None => Some(device),
    }
}

fn direction(row: &Row) -> Result<String, String> {
    match row.get("direction").and_then(Value::as_str) {
        None => Ok("h2d".into()),
        Some("host_to_device" | "h2d" | "H2D") => Ok("h2d".into()),
        Some("device_to_host" | "d2h" | "D2H") => Ok("d2h".into()),
        Some(other) => Err(format!(
            "direction {other:?} is not host_to_device or device_to_host"
        )),
    }
}

fn host_memory(row: &Row) -> String {
    match row.get("pinned").and_then(Value::as_bool) {
        Some(true) => "pinned".into(),
        Some(false) => "pageable".into(),
        None => text(row.get("host_memory"))
            .or_else(|| text(row.get("memory")))
            .unwrap_or_else(|| "unspecified".into()),
    }
}

fn load(row: &Row) -> String {
    text(row.get("profile"))
        .or_else(|| text(row.get("load_profile")))
        .or_else(|| text(row.get("load")))
        .unwrap_or_else(|| "idle".into())
}

/// `ok` or `error` (else the row is rejected).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Status {
    Ok,
    Error,
}

fn status(row: &Row) -> Result<Status, String> {
    let Some(s) = row.get("status").and_then(Value::as_str) else {
        return Err("no status".into());
    };
    let lower = s.to_ascii_lowercase();
    match lower.as_str() {
        "ok" => Ok(Status::Ok),
        // The tool writes `error`; hand-made recordings put the message in it too.
        _ if lower.starts_with("error") || lower.starts_with("fail") => Ok(Status::Error),
        "skip" | "skipped" => Err(format!(
            "skipped by the tool: {}",
            text(row.get("reason")).unwrap_or_else(|| "no reason given".into())
        )),
        _ => Err(format!("unknown status {s:?}")),
    }
}

/// A failed row's message: `error (bind_cpu): requested [5], actual [0, 1]`.
fn failure(row: &Row, collective: bool) -> Failure {
    let operation = text(row.get("operation"));
    let kind = match operation.as_deref() {
        Some("bind_cpu") => FailureKind::Bind,
        Some("all_gather") => FailureKind::Collective,
        _ if collective => FailureKind::Collective,
        _ => FailureKind::Copy,
    };
    let status = text(row.get("status")).unwrap_or_else(|| "error".into());
    let why = text(row.get("error"))
        .or_else(|| text(row.get("message")))
        .or_else(|| text(row.get("reason")));
    let head = match &operation {
        Some(op) => format!("{status} ({op})"),
        None => status,
    };
    Failure {
        kind,
        message: match why {
            Some(w) => format!("{head}: {w}"),
            None => head,
        },
    }
}

/// The bandwidth of an ok row, bytes per second.
fn bandwidth(row: &Row, field: &str) -> Result<f64, String> {
    let value = row.get(field).or_else(|| row.get("gbps"));
    match float(value) {
        // GB/s to bytes/s; a value that overflows there (1e300 GB/s) is no bandwidth either.
        Some(g) if g > 0.0 && (g * 1e9).is_finite() => Ok(g * 1e9),
        Some(g) if g > 0.0 && g.is_finite() => {
            Err(format!("{field} is out of range (bytes/s would overflow)"))
        }
        Some(_) => Err(format!("{field} is not a positive number")),
        None if value.is_some_and(|v| !v.is_null()) => Err(format!("{field} is not a number")),
        None if value.is_some() => Err(format!("{field} is null (NaN or Infinity)")),
        None => Err(format!("status ok but no {field}")),
    }
}

fn h2d_row(row: &Row) -> Result<Pending, String> {
    let status = status(row)?;
    let failed = (status == Status::Error).then(|| failure(row, false));
    let Some(host_cpu) = cpu(row.get("host_cpu")) else {
        return Err(match failed {
            Some(f) => format!("error row names no CPU: {}", f.message),
            None => "no host_cpu".into(),
        });
    };
    let device = device_id(row);
    if device.is_none() && failed.is_none() {
        return Err("no device_id".into());
    }
    let size = mib(row.get("size_mb"));
    if size.is_none() && failed.is_none() {
        return Err(match row.get("size_mb") {
            Some(_) => "size_mb is not a positive number".into(),
            None => "no size_mb".into(),
        });
    }
    let outcome = match failed {
        Some(f) => Err(f),
        None => Ok(bandwidth(row, "gbps")?),
    };
    Ok(Pending {
        facts: 0,
        device_known: device.is_some(),
        size_known: size.is_some(),
        sample: RecordedSample {
            matrix: MatrixKind::H2d,
            load: load(row),
            cpu: host_cpu,
            peer_cpu: None,
            device: device.unwrap_or_default(),
            size_bytes: size.unwrap_or(0),
            direction: direction(row)?,
            host_memory: host_memory(row),
            outcome,
        },
        repeat: uint(row.get("repeat")),
        rank: None,
        row: 0,
    })
}

fn pair_row(row: &Row, facts: &RunFacts) -> Result<Pending, String> {
    let status = status(row)?;
    let failed = (status == Status::Error).then(|| failure(row, true));
    let (Some(cpu0), Some(cpu1)) = (cpu(row.get("rank0_cpu")), cpu(row.get("rank1_cpu"))) else {
        return Err(match failed {
            Some(f) => format!("error row names no CPU pair: {}", f.message),
            None => "no rank0_cpu or rank1_cpu".into(),
        });
    };
    let pair = device_pair(row.get("device_pair"))
        .or_else(|| facts.device_pair.clone())
        .ok_or("no device_pair of two devices (neither in the row nor in meta)")?;
    if let Some(op) = text(row.get("operation")) {
        if op != "all_gather" && op != "bind_cpu" {
            return Err(format!("operation {op:?} is not all_gather"));
        }
    }
    let size = mib(row.get("size_mb"));
    if size.is_none() && row.get("size_mb").is_some_and(|v| !v.is_null()) {
        return Err("size_mb is not a positive number".into());
    }
    let outcome = match failed {
        Some(f) => Err(f),
        None => Ok(bandwidth(row, "alg_gbps")?),
    };
    // Pair rows of the oldest recordings carry no size at all: one pair matrix of unknown
    // size (0). Failed rows without a size fail every size of the run.
    let size_known = size.is_some() || outcome.is_ok();
    Ok(Pending {
        facts: 0,
        device_known: true,
        size_known,
        sample: RecordedSample {
            matrix: MatrixKind::Pair,
            load: load(row),
            cpu: cpu0,
            peer_cpu: Some(cpu1),
            device: pair,
            size_bytes: size.unwrap_or(0),
            direction: "allgather".into(),
            host_memory: "unspecified".into(),
            outcome,
        },
        repeat: uint(row.get("repeat")),
        rank: uint(row.get("rank")),
        row: 0,
    })
}

/// Counts rejected rows by reason.
#[derive(Default)]
struct Rejections(BTreeMap<String, (usize, String)>);

impl Rejections {
    fn add(&mut self, reason: String, location: impl FnOnce() -> String) {
        let e = self.0.entry(reason).or_insert_with(|| (0, location()));
        e.0 += 1;
    }

    fn into_sorted(self) -> Vec<Rejected> {
        let mut out: Vec<Rejected> = self
            .0
            .into_iter()
            .map(|(reason, (count, first))| Rejected {
                reason,
                count,
                first,
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
        out
    }
}

/// The ids in natural order (numeric ids first, in numeric order).
fn natural(ids: BTreeSet<String>) -> Vec<String> {
    let mut ids: Vec<String> = ids.into_iter().collect();
    crate::topology::natural::sort_natural(&mut ids);
    ids
}

/// Reads every document's rows, in order, as they stream past ([`Sink`]); what they come
/// to is [`Interpreter::finish`]'s.
#[derive(Default)]
pub(super) struct Interpreter {
    /// Per document, in the order read.
    facts: Vec<RunFacts>,
    files: Vec<String>,
    rejected: Rejections,
    other_tests: BTreeMap<String, usize>,
    pending: Vec<Pending>,
}

impl Sink for Interpreter {
    fn meta(&mut self, path: &std::path::Path, meta: &Value) {
        self.facts.push(RunFacts::of(meta));
        self.files.push(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
        );
    }

    fn row(&mut self, i: usize, row: Row) {
        let di = self.facts.len() - 1;
        let parsed = match row.get("test").and_then(Value::as_str) {
            Some("core_h2d_matrix") => h2d_row(&row),
            Some("core_pair_d2d_matrix") => pair_row(&row, &self.facts[di]),
            other => {
                let name = other.unwrap_or("(no test name)").to_string();
                *self.other_tests.entry(name).or_default() += 1;
                return;
            }
        };
        match parsed {
            Ok(mut p) => {
                p.facts = di;
                p.row = i;
                self.pending.push(p);
            }
            Err(reason) => {
                let file = &self.files[di];
                self.rejected.add(reason, || format!("{file} metrics[{i}]"));
            }
        }
    }
}

impl Interpreter {
    /// What the rows read come to.
    pub(super) fn finish(self) -> Interpreted {
        let Interpreter {
            facts,
            files,
            rejected,
            other_tests,
            pending,
        } = self;
        let location = |doc: usize, row: usize| format!("{} metrics[{row}]", files[doc]);
        interpret(facts, rejected, other_tests, pending, location)
    }
}

/// The rows read, with what the documents' `meta` says filled in.
fn interpret(
    facts: Vec<RunFacts>,
    mut rejected: Rejections,
    other_tests: BTreeMap<String, usize>,
    pending: Vec<Pending>,
    location: impl Fn(usize, usize) -> String,
) -> Interpreted {
    // What the rows name, for the rows that leave the device or size out.
    let mut seen_devices = BTreeSet::new();
    let mut seen_sizes: BTreeMap<MatrixKind, BTreeSet<u64>> = BTreeMap::new();
    for p in &pending {
        if p.device_known && p.sample.matrix == MatrixKind::H2d {
            seen_devices.insert(p.sample.device.clone());
        }
        if p.size_known {
            seen_sizes
                .entry(p.sample.matrix)
                .or_default()
                .insert(p.sample.size_bytes);
        }
    }
    let listed: BTreeSet<String> = facts.iter().flat_map(|f| f.device_ids.clone()).collect();
    let devices = if listed.is_empty() {
        natural(seen_devices.clone())
    } else {
        natural(listed.union(&seen_devices).cloned().collect())
    };

    let mut expanded = Vec::with_capacity(pending.len());
    for p in pending {
        if p.device_known && p.size_known {
            expanded.push((p.sample, p.repeat, p.rank));
            continue;
        }
        let f = &facts[p.facts];
        let device_choices = if p.device_known {
            vec![p.sample.device.clone()]
        } else if !f.device_ids.is_empty() {
            f.device_ids.clone()
        } else {
            natural(seen_devices.clone())
        };
        let size_choices: Vec<u64> = if p.size_known {
            vec![p.sample.size_bytes]
        } else if !f.sizes_bytes.is_empty() {
            f.sizes_bytes.clone()
        } else {
            seen_sizes
                .get(&p.sample.matrix)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default()
        };
        if device_choices.is_empty() {
            rejected.add(
                "a failed row without a device, and the recording names no device".into(),
                || location(p.facts, p.row),
            );
            continue;
        }
        if size_choices.is_empty() {
            rejected.add(
                "a failed row without size_mb, and the recording names no size".into(),
                || location(p.facts, p.row),
            );
            continue;
        }
        for device in &device_choices {
            for &size in &size_choices {
                let mut sample = p.sample.clone();
                sample.device = device.clone();
                sample.size_bytes = size;
                expanded.push((sample, p.repeat, p.rank));
            }
        }
    }

    // Failed rows say nothing of host memory: they belong to the run's matrix when every
    // measured row of that size and direction used the same kind.
    let mut memories: BTreeMap<(u64, String, String), BTreeSet<String>> = BTreeMap::new();
    for (s, _, _) in &expanded {
        if s.matrix == MatrixKind::H2d && s.outcome.is_ok() {
            memories
                .entry((s.size_bytes, s.direction.clone(), s.load.clone()))
                .or_default()
                .insert(s.host_memory.clone());
        }
    }
    for (s, _, _) in &mut expanded {
        if s.matrix == MatrixKind::H2d && s.outcome.is_err() && s.host_memory == "unspecified" {
            let key = (s.size_bytes, s.direction.clone(), s.load.clone());
            if let Some(kinds) = memories.get(&key).filter(|k| k.len() == 1) {
                s.host_memory = kinds.iter().next().cloned().unwrap_or_default();
            }
        }
    }
    let (samples, merged) = merge_ranks(expanded);
    let mut notes = Vec::new();
    if merged > 0 {
        notes.push(format!(
            "{merged} pair samples were recorded once per rank (RECORD_RANKS=all) and count \
             once each: rank 0's value, failed if either rank failed"
        ));
    }
    Interpreted {
        samples,
        rejected: rejected.into_sorted(),
        other_tests,
        devices,
        notes,
    }
}

/// Fold the per-rank copies of one pair sample (same pair, CPUs, size, load and repeat)
/// into one, in the place of its first row. Returns the samples and how many were folded
/// from more than one rank. Pair rows are ordered by key (positions only), so a recording
/// whose every pair sample is recorded once passes through unchanged.
pub(super) fn merge_ranks(
    rows: Vec<(RecordedSample, Option<u64>, Option<u64>)>,
) -> (Vec<RecordedSample>, usize) {
    let key = |i: u32| {
        let (s, repeat, _) = &rows[i as usize];
        (&s.device, s.cpu, s.peer_cpu, s.size_bytes, &s.load, *repeat)
    };
    let mut order: Vec<u32> = (0..rows.len() as u32)
        .filter(|&i| rows[i as usize].0.matrix == MatrixKind::Pair)
        .collect();
    // Stable: within a key, the rows stay in the order read.
    order.sort_by(|&a, &b| key(a).cmp(&key(b)));
    let groups: Vec<&[u32]> = order
        .chunk_by(|&a, &b| key(a) == key(b))
        .filter(|g| g.len() > 1)
        .collect();
    if groups.is_empty() {
        return (rows.into_iter().map(|(s, _, _)| s).collect(), 0);
    }
    let mut merged = 0;
    let mut folded: Vec<Vec<RecordedSample>> = Vec::with_capacity(groups.len());
    let mut lead: HashMap<u32, usize> = HashMap::with_capacity(groups.len());
    let mut absorbed = vec![false; rows.len()];
    for (gi, group) in groups.iter().enumerate() {
        lead.insert(group[0], gi);
        for &i in &group[1..] {
            absorbed[i as usize] = true;
        }
        let mut by_rank: BTreeMap<Option<u64>, Vec<&RecordedSample>> = BTreeMap::new();
        for &i in group.iter() {
            let (s, _, rank) = &rows[i as usize];
            by_rank.entry(*rank).or_default().push(s);
        }
        if by_rank.len() < 2 {
            folded.push(by_rank.into_values().flatten().cloned().collect());
            continue;
        }
        // The i-th row of each rank is the i-th sample.
        let n = by_rank.values().map(Vec::len).max().unwrap_or(0);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let copies: Vec<(Option<u64>, &RecordedSample)> = by_rank
                .iter()
                .filter_map(|(rank, list)| list.get(i).map(|s| (*rank, *s)))
                .collect();
            if copies.len() > 1 {
                merged += 1;
            }
            let sample = match copies.iter().find(|(_, s)| s.outcome.is_err()) {
                Some((rank, s)) => {
                    let mut s = (*s).clone();
                    if let (Some(r), Err(f)) = (rank, &mut s.outcome) {
                        f.message = format!("rank {r}: {}", f.message);
                    }
                    s
                }
                None => copies[0].1.clone(),
            };
            out.push(sample);
        }
        folded.push(out);
    }
    let mut out = Vec::with_capacity(rows.len());
    for (i, (sample, _, _)) in rows.into_iter().enumerate() {
        if absorbed[i] {
            continue;
        }
        match lead.get(&(i as u32)) {
            Some(&gi) => out.append(&mut folded[gi]),
            None => out.push(sample),
        }
    }
    (out, merged)
}
