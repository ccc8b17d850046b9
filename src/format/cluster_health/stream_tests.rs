//! The streaming reader against the whole-document reader it replaced: the same
//! `Recording` from large generated recordings (`scripts/gen-recording.py`, in the tool's
//! exact shape, `NaN` and `Infinity` included) and from every fixture, and the same samples
//! from the rank merge.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::document::{Document, Sink};
use super::row::Row;
use super::rows::{merge_ranks, Interpreter};
use super::*;

/// The reader before streaming, kept as the reference: the whole text, copied with the
/// Python floats turned to `null`, parsed into one `Value`, its rows handed over after.
fn read_whole(path: &Path) -> Result<Recording, Error> {
    let text = std::fs::read_to_string(path).unwrap();
    let root: Value = serde_json::from_str(&python_floats_to_null(&text)).unwrap();
    let meta = match root.get("meta") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(m) => m.clone(),
    };
    let mut rows = Interpreter::default();
    rows.meta(path, &meta);
    for (i, row) in root["metrics"].as_array().unwrap().iter().enumerate() {
        rows.row(i, serde_json::from_value::<Row>(row.clone()).unwrap());
    }
    let doc = Document {
        path: path.to_path_buf(),
        meta,
    };
    super::from_documents(&[doc], false, rows)
}

/// The copy the old reader made of the text (its code, unchanged).
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

/// The key of one pair sample across ranks: pair, CPUs, size, load, repeat.
type SampleKey = (String, u32, Option<u32>, u64, String, Option<u64>);

/// A sample in output order, or the place of a pair sample's ranks.
enum Slot {
    Sample(RecordedSample),
    Ranks(SampleKey),
}

/// Fold the per-rank copies of one pair sample into one. Returns the samples and how many
/// were folded from more than one rank.
fn old_merge_ranks(
    rows: Vec<(RecordedSample, Option<u64>, Option<u64>)>,
) -> (Vec<RecordedSample>, usize) {
    let mut slots = Vec::with_capacity(rows.len());
    let mut groups: HashMap<SampleKey, BTreeMap<Option<u64>, Vec<RecordedSample>>> = HashMap::new();
    for (sample, repeat, rank) in rows {
        if sample.matrix != MatrixKind::Pair {
            slots.push(Slot::Sample(sample));
            continue;
        }
        let key = (
            sample.device.clone(),
            sample.cpu,
            sample.peer_cpu,
            sample.size_bytes,
            sample.load.clone(),
            repeat,
        );
        let group = groups.entry(key.clone()).or_default();
        if group.is_empty() {
            slots.push(Slot::Ranks(key));
        }
        group.entry(rank).or_default().push(sample);
    }
    let mut merged = 0;
    let mut out = Vec::with_capacity(slots.len());
    for slot in slots {
        let key = match slot {
            Slot::Sample(s) => {
                out.push(s);
                continue;
            }
            Slot::Ranks(key) => key,
        };
        let by_rank = groups.remove(&key).unwrap_or_default();
        if by_rank.len() < 2 {
            out.extend(by_rank.into_values().flatten());
            continue;
        }
        // The i-th row of each rank is the i-th sample.
        let n = by_rank.values().map(Vec::len).max().unwrap_or(0);
        for i in 0..n {
            let copies: Vec<(Option<u64>, &RecordedSample)> = by_rank
                .iter()
                .filter_map(|(rank, list)| list.get(i).map(|s| (*rank, s)))
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
    }
    (out, merged)
}

/// Write a recording with the generator (python3 is required, as for scripts/bench.sh).
fn generate(dir: &Path, args: &[&str]) -> PathBuf {
    let path = dir.join(format!("{}.json", args.join("_").replace(['-', ','], "")));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gen-recording.py");
    let status = Command::new("python3")
        .arg(&script)
        .args(args)
        .arg(&path)
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run python3 {} ({e}): install python3",
                script.display()
            )
        });
    assert!(status.success(), "{} {args:?}: {status}", script.display());
    path
}

#[test]
fn generated_recordings_read_the_same_streaming_as_whole() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["pair", "--cpus", "72", "--numa", "4"][..],
        &[
            "h2d",
            "--cpus",
            "64",
            "--devices",
            "8",
            "--sizes",
            "16,64",
            "--numa",
            "2",
        ][..],
    ] {
        let path = generate(dir.path(), args);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(": NaN,") && text.contains(": Infinity,"),
            "{args:?}"
        );
        assert!(
            text.len() > 4 << 16,
            "more than a few read chunks: {}",
            text.len()
        );
        let streamed = read(&path).unwrap();
        assert_eq!(streamed, read_whole(&path).unwrap(), "{args:?}");
        assert!(
            !streamed.rejected.is_empty(),
            "the NaN and Infinity rows are rejected"
        );
        assert!(
            streamed.samples.iter().any(|s| s.outcome.is_err()),
            "failed rows"
        );
    }
}

#[test]
fn every_fixture_file_reads_the_same_streaming_as_whole() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cluster-health");
    let mut n = 0;
    for run in std::fs::read_dir(&root).unwrap() {
        let run = run.unwrap().path();
        if !run.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(run).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".json") || name == AFFINITY_FILE {
                continue;
            }
            // One document, without the affinity.json beside it (read_whole has no merge).
            let text = std::fs::read_to_string(&path).unwrap();
            let streamed = parse(&text, &path.display().to_string()).map_err(|e| e.to_string());
            let whole = read_whole(&path).map_err(|e| e.to_string());
            assert_eq!(streamed, whole, "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 10, "{n} fixture files");
}

fn sample(cpu: u32, peer: u32, outcome: Result<f64, &str>) -> RecordedSample {
    RecordedSample {
        matrix: MatrixKind::Pair,
        load: "idle".into(),
        cpu,
        peer_cpu: Some(peer),
        device: "0,5".into(),
        size_bytes: 8 << 20,
        direction: "allgather".into(),
        host_memory: "unspecified".into(),
        outcome: outcome.map_err(|m| Failure {
            kind: FailureKind::Collective,
            message: m.into(),
        }),
    }
}

#[test]
fn the_rank_merge_gives_what_it_gave_before() {
    let h2d = RecordedSample {
        matrix: MatrixKind::H2d,
        peer_cpu: None,
        device: "1".into(),
        ..sample(0, 0, Ok(1.0))
    };
    // Ranks 0 and 1 of some cells (in either order), a cell recorded twice by rank 0, a
    // cell of one rank only, a failure on rank 1, H2D samples in between.
    let rows = vec![
        (sample(0, 1, Ok(10.0)), Some(0), Some(0)),
        (h2d.clone(), Some(0), None),
        (sample(0, 1, Ok(9.9)), Some(0), Some(1)),
        (sample(0, 2, Ok(11.0)), Some(0), Some(1)),
        (sample(0, 2, Ok(11.1)), Some(0), Some(0)),
        (sample(1, 2, Ok(12.0)), Some(0), Some(0)),
        (sample(1, 2, Ok(12.5)), Some(0), Some(0)),
        (sample(1, 3, Ok(13.0)), Some(0), Some(0)),
        (
            sample(1, 3, Err("error (all_gather): timeout")),
            Some(0),
            Some(1),
        ),
        (h2d, Some(1), None),
        (sample(2, 3, Ok(14.0)), None, None),
        (sample(0, 1, Ok(10.5)), Some(1), Some(0)),
    ];
    let (new, merged) = merge_ranks(rows.clone());
    let (old, old_merged) = old_merge_ranks(rows);
    assert_eq!(new, old);
    assert_eq!(merged, old_merged);
    assert_eq!(merged, 3);
}
