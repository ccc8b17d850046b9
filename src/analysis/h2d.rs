//! The core x device matrix of one size and direction: its device columns, each with its
//! ratio to the node's typical device (column median / median of all column medians, as
//! `chd_h2d_device_ratio`), and its NUMA segments (one node's CPUs on one device), each with
//! its ratio to the device's best segment. Only cells with a value count; a cell with some
//! failed samples counts with the median of the others.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::cell::{Cell, NodeOf, NumaMap};
use super::failures::{failures, Failure};
use crate::stats::{self, Summary};
use crate::topology::natural::natural_key;

/// (NUMA node, device) of a segment.
type SegmentKey<'a> = (Option<u32>, &'a str);

/// One device column.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceColumn {
    pub device: String,
    pub summary: Summary,
    pub cells: usize,
    /// Column median / median of all column medians.
    pub ratio: Option<f64>,
}

/// The cells of one NUMA node's CPUs on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// `None` for CPUs of no known node.
    pub numa_node: Option<u32>,
    pub device: String,
    pub summary: Summary,
    pub cells: usize,
    /// Segment median / the median of the device's best segment (a device slow from half
    /// the CPUs would drag its column median halfway down and hide the slow half).
    pub ratio: Option<f64>,
}

/// One core x device matrix, analysed.
#[derive(Debug, Clone, PartialEq)]
pub struct H2dMatrix {
    /// Cells, measured or not.
    pub cells: usize,
    /// Cells with a value.
    pub measured: usize,
    pub overall: Option<Summary>,
    /// In natural order of the device.
    pub devices: Vec<DeviceColumn>,
    /// By NUMA node (unknown first), then device in natural order.
    pub segments: Vec<Segment>,
    pub failures: Vec<Failure>,
}

impl H2dMatrix {
    /// Analyse the cells of one matrix (`&[Cell]` or `&[&Cell]`).
    pub fn of<'a, C: Borrow<Cell<'a>>>(cells: &[C], numa: &NumaMap) -> H2dMatrix {
        // Device -> NUMA node -> values.
        let mut by_device: BTreeMap<&str, BTreeMap<Option<u32>, Vec<f64>>> = BTreeMap::new();
        let mut node_of = NodeOf::new(numa);
        let mut measured = 0;
        for c in cells {
            let c = c.borrow();
            measured += usize::from(c.value.is_some());
            // A NaN counts as measured but, as in [`Summary::of`], in no statistic.
            let Some(v) = c.value.filter(|v| !v.is_nan()) else {
                continue;
            };
            by_device
                .entry(c.device)
                .or_default()
                .entry(node_of.get(c.cpu))
                .or_default()
                .push(v);
        }
        // Each value is sorted once, in its segment; a column joins its sorted segments and
        // the matrix its sorted columns (the sort merges sorted runs in linear time).
        let mut all: Vec<f64> = Vec::with_capacity(cells.len());
        let mut columns: Vec<(&str, Summary, usize)> = Vec::with_capacity(by_device.len());
        let mut summaries: Vec<(SegmentKey, Summary, usize)> = Vec::new();
        for (device, by_node) in &mut by_device {
            let mut column: Vec<f64> = Vec::new();
            for (n, v) in by_node.iter_mut() {
                v.sort_by(f64::total_cmp);
                if let Some(summary) = Summary::of_sorted(v) {
                    summaries.push(((*n, device), summary, v.len()));
                }
                column.extend_from_slice(v);
            }
            column.sort_by(f64::total_cmp);
            if let Some(summary) = Summary::of_sorted(&column) {
                columns.push((device, summary, column.len()));
            }
            all.extend_from_slice(&column);
        }
        all.sort_by(f64::total_cmp);
        let medians: Vec<f64> = columns.iter().map(|c| c.1.median).collect();
        let typical = stats::median(&medians);
        let mut devices: Vec<DeviceColumn> = columns
            .into_iter()
            .map(|(device, summary, cells)| DeviceColumn {
                device: device.to_string(),
                summary,
                cells,
                ratio: typical.and_then(|t| stats::ratio(summary.median, t)),
            })
            .collect();
        devices.sort_by(|a, b| natural_key(&a.device).cmp(&natural_key(&b.device)));
        let mut best: BTreeMap<&str, f64> = BTreeMap::new();
        for ((_, d), s, _) in &summaries {
            let b = best.entry(d).or_insert(s.median);
            *b = b.max(s.median);
        }
        let mut segments: Vec<Segment> = summaries
            .into_iter()
            .map(|((numa_node, device), summary, cells)| Segment {
                numa_node,
                device: device.to_string(),
                summary,
                cells,
                ratio: stats::ratio(summary.median, best[device]),
            })
            .collect();
        segments.sort_by(|a, b| {
            (a.numa_node, natural_key(&a.device)).cmp(&(b.numa_node, natural_key(&b.device)))
        });
        H2dMatrix {
            cells: cells.len(),
            measured,
            overall: Summary::of_sorted(&all),
            devices,
            segments,
            failures: failures(cells),
        }
    }

    /// The column of `device`.
    pub fn column(&self, device: &str) -> Option<&DeviceColumn> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// The segments of `device`, by NUMA node (unknown first).
    pub fn segments_of<'m>(&'m self, device: &'m str) -> impl Iterator<Item = &'m Segment> + 'm {
        self.segments.iter().filter(move |s| s.device == device)
    }
}
