//! Which timing method a run's event-timed samples used, for the report's header: how each
//! cell's timed region was held (`runtime::stream_latch::TimingMethod`), with what the method
//! means and how many samples used it.

use std::collections::BTreeMap;

use crate::format::run_dir::SampleRecord;
use crate::runtime::stream_latch::TimingMethod;

/// The `timing` row of the header, if any sample says how it was timed.
pub fn meta_row(records: &[SampleRecord]) -> Option<(String, String)> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        if let Some(t) = &r.timing {
            *counts.entry(t.as_str()).or_default() += 1;
        }
    }
    if counts.is_empty() {
        return None;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(method, n)| {
            let samples = if *n == 1 { "sample" } else { "samples" };
            match method.parse::<TimingMethod>() {
                Ok(m) => format!("{method}: {} ({n} {samples})", m.describe()),
                Err(_) => format!("{method} ({n} {samples})"),
            }
        })
        .collect();
    Some(("timing".to_string(), parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::run_dir::{MatrixKind, SlotRecord};

    fn record(timing: Option<&str>) -> SampleRecord {
        SampleRecord {
            slot: SlotRecord {
                matrix: MatrixKind::Sweep,
                load: "idle".into(),
                pass: 0,
                cpu: 0,
                peer_cpu: None,
                device: "0".into(),
                size_bytes: 1,
                direction: "h2d".into(),
                host_memory: "pinned".into(),
            }
            .try_into()
            .unwrap(),
            bytes_per_second: Some(1.0),
            error: None,
            reason: None,
            timing: timing.map(String::from),
            at: 0.0,
        }
    }

    #[test]
    fn methods_are_counted_and_explained_and_absent_without_any() {
        assert_eq!(meta_row(&[record(None)]), None);
        let (key, value) = meta_row(&[
            record(Some("latch-wait-value")),
            record(Some("warmup-ahead")),
            record(Some("latch-wait-value")),
            record(None),
        ])
        .unwrap();
        assert_eq!(key, "timing");
        assert!(
            value.starts_with("latch-wait-value: the stream waited on a host flag"),
            "{value}"
        );
        assert!(
            value.contains("(2 samples); warmup-ahead: warm-ups queued"),
            "{value}"
        );
        assert!(value.ends_with("(1 sample)"), "{value}");
    }
}
