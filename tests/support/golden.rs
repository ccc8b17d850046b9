//! Golden files: a checked-in expected output, compared exactly, rewritten when
//! `CHD_UPDATE_GOLDEN=1` is set (tests/golden/README.md). [`normalise_scrape`] turns a
//! `/metrics` body into its golden form: the few values that change from run to run are
//! masked and each family's samples are put in a fixed order; everything else stays as
//! chd wrote it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Families whose sample values are timings or clock readings, different on every run:
/// the value is written as `NaN`, the series (name and labels) is kept.
pub const MASKED_VALUES: &[&str] = &[
    "chd_collector_duration_seconds",
    "chd_probe_last_success_timestamp_seconds",
];

/// `(family, label)` pairs whose label value changes with the build: written as `VERSION`.
pub const MASKED_LABELS: &[(&str, &str)] = &[("chd_build_info", "version")];

/// The environment variable that rewrites golden files instead of comparing them.
pub const UPDATE_VAR: &str = "CHD_UPDATE_GOLDEN";

/// The repository's `tests/golden/<name>`.
pub fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// The golden form of a Prometheus text exposition (version 0.0.4): `header` (one comment
/// line per entry) first, then the scrape with [`MASKED_VALUES`] and [`MASKED_LABELS`]
/// masked and the samples of each family sorted by their labels other than `le` (the
/// client library keeps a family's series in a hash map, so their order varies; a
/// histogram's buckets, `_sum` and `_count` keep the order chd wrote them in).
pub fn normalise_scrape(header: &[String], body: &str) -> String {
    let mut out: String = header.iter().map(|h| format!("# {h}\n")).collect();
    let mut samples: Vec<(String, String)> = Vec::new();
    let flush = |out: &mut String, samples: &mut Vec<(String, String)>| {
        samples.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, line) in samples.drain(..) {
            out.push_str(&line);
            out.push('\n');
        }
    };
    for line in body.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            flush(&mut out, &mut samples);
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let line = mask(line);
        samples.push((order_key(&line), line));
    }
    flush(&mut out, &mut samples);
    out
}

/// The family a sample line belongs to (its name, without a histogram suffix).
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// A sample line's labels without `le`: the sort key within its family.
fn order_key(line: &str) -> String {
    let labels = line
        .split_once('{')
        .and_then(|(_, rest)| rest.rsplit_once('}'))
        .map_or("", |(labels, _)| labels);
    labels
        .split("\",")
        .filter(|pair| !pair.starts_with("le=\""))
        .collect::<Vec<_>>()
        .join("\",")
}

fn mask(line: &str) -> String {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let mut line = line.to_string();
    for (fam, label) in MASKED_LABELS {
        if family(name) == *fam {
            let start = format!("{label}=\"");
            if let Some(at) = line.find(&start) {
                let from = at + start.len();
                let to = from + line[from..].find('"').expect("closing quote");
                line.replace_range(from..to, "VERSION");
            }
        }
    }
    if MASKED_VALUES.contains(&family(name)) {
        let (series, _) = line.rsplit_once(' ').expect("sample line has a value");
        line = format!("{series} NaN");
    }
    line
}

/// Compare `actual` with the golden file `name`, or rewrite the file when [`UPDATE_VAR`]
/// is `1`. On a mismatch the actual text is written under the test's temp dir and the
/// panic shows the lines that differ and the `diff -u` command to see them in context.
pub fn assert_golden(name: &str, actual: &str) {
    let path = golden_path(name);
    if std::env::var(UPDATE_VAR).as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("updated {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e}; create it with `{UPDATE_VAR}=1 cargo test` and review the diff",
            path.display()
        )
    });
    if expected == actual {
        return;
    }
    let got = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("golden")
        .join(name);
    std::fs::create_dir_all(got.parent().unwrap()).unwrap();
    std::fs::write(&got, actual).unwrap();
    panic!(
        "{} differs from this run's output:\n{}\nsee `diff -u {} {}`; if the change is \
         intended, rerun with {UPDATE_VAR}=1 and commit the golden file with the change",
        path.display(),
        line_diff(&expected, actual),
        path.display(),
        got.display()
    );
}

/// The lines only in `expected` (`-`) and only in `actual` (`+`), in order, at most 40.
fn line_diff(expected: &str, actual: &str) -> String {
    let count = |text: &str| {
        let mut m = std::collections::BTreeMap::<String, i64>::new();
        for l in text.lines() {
            *m.entry(l.to_string()).or_default() += 1;
        }
        m
    };
    let (e, a) = (count(expected), count(actual));
    let mut out = Vec::new();
    for l in expected.lines() {
        if e[l] > a.get(l).copied().unwrap_or(0) {
            out.push(format!("-{l}"));
        }
    }
    for l in actual.lines() {
        if a[l] > e.get(l).copied().unwrap_or(0) {
            out.push(format!("+{l}"));
        }
    }
    if out.is_empty() {
        out.push("(same lines, different order or line endings)".into());
    }
    let more = out.len().saturating_sub(40);
    out.truncate(40);
    if more > 0 {
        out.push(format!("... and {more} more"));
    }
    out.join("\n")
}
