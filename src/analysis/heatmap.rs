//! One heatmap model for every renderer (PNG, SVG, workbook), whether the cells come from a
//! report's dataset or the live store: row and column labels, NUMA groups, cells in GB/s,
//! and the top of the colour scale. Rows are CPUs by NUMA node; columns are devices (core x
//! device) or rank 1's CPUs (core pair); a peer copy matrix has source devices as rows and
//! destination devices as columns.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::cell::{Cell, NumaMap};
use crate::topology::natural::sort_natural;

/// One cell as drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum HeatCell {
    /// Not measured.
    Empty,
    /// Median in decimal GB/s, over `samples` samples.
    Value { gbps: f64, samples: usize },
    /// Every sample failed; the last error.
    Failed { error: String },
}

impl HeatCell {
    /// How `cell` is drawn: its value, else its last failure, else nothing.
    pub fn of(cell: &Cell) -> HeatCell {
        match cell.value {
            Some(v) => HeatCell::Value {
                gbps: v / 1e9,
                samples: cell.samples,
            },
            None if cell.failed > 0 => HeatCell::Failed {
                error: cell.last_error.as_deref().unwrap_or_default().to_string(),
            },
            None => HeatCell::Empty,
        }
    }
}

/// A run of consecutive rows (or columns) on one NUMA node.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub start: usize,
    /// Exclusive.
    pub end: usize,
    pub label: String,
}

/// A matrix ready to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    pub title: String,
    /// What a row is (`CPU`, `rank 0 CPU`).
    pub row_word: String,
    /// What a column is (`device`, `rank 1 CPU`).
    pub col_word: String,
    pub rows: Vec<String>,
    pub cols: Vec<String>,
    /// Row-major, `rows.len() * cols.len()`.
    pub cells: Vec<HeatCell>,
    pub row_groups: Vec<Group>,
    pub col_groups: Vec<Group>,
    /// Top of the colour scale, GB/s.
    pub max: f64,
    /// Side of the square of original cells one cell stands for (1 unless downsampled).
    pub block: usize,
}

/// Rows and columns a map shows besides those of its cells.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Axes {
    /// CPUs to show as rows (and as rank 1's columns) even without a cell.
    pub cpus: Vec<u32>,
    /// Devices to show first, in this order; the cells' other devices follow in natural
    /// order.
    pub devices: Vec<String>,
}

/// CPUs ordered by NUMA node (unknown last), then id, with the node groups.
pub fn order_cpus(cpus: impl IntoIterator<Item = u32>, numa: &NumaMap) -> (Vec<u32>, Vec<Group>) {
    let mut cpus: Vec<u32> = cpus.into_iter().collect();
    cpus.sort_by_key(|c| (numa.get(c).copied().unwrap_or(u32::MAX), *c));
    cpus.dedup();
    let mut groups: Vec<Group> = Vec::new();
    for (i, c) in cpus.iter().enumerate() {
        let label = match numa.get(c) {
            Some(n) => format!("NUMA {n}"),
            None => "NUMA ?".to_string(),
        };
        match groups.last_mut() {
            Some(g) if g.label == label => g.end = i + 1,
            _ => groups.push(Group {
                start: i,
                end: i + 1,
                label,
            }),
        }
    }
    (cpus, groups)
}

fn positions<T: Ord + Copy>(items: &[T]) -> BTreeMap<T, usize> {
    items.iter().enumerate().map(|(i, x)| (*x, i)).collect()
}

impl Heatmap {
    /// An empty map of `rows` x `cols`.
    pub fn new(
        title: String,
        row_word: &str,
        col_word: &str,
        rows: Vec<String>,
        cols: Vec<String>,
    ) -> Heatmap {
        let n = rows.len() * cols.len();
        Heatmap {
            title,
            row_word: row_word.into(),
            col_word: col_word.into(),
            rows,
            cols,
            cells: vec![HeatCell::Empty; n],
            row_groups: Vec::new(),
            col_groups: Vec::new(),
            max: 1.0,
            block: 1,
        }
    }

    /// Core x device: rows the cells' CPUs and `axes.cpus` by NUMA node, columns
    /// `axes.devices` then the cells' other devices.
    pub fn h2d<'a, C: Borrow<Cell<'a>>>(
        title: String,
        cells: &[C],
        numa: &NumaMap,
        axes: &Axes,
    ) -> Heatmap {
        let cells: Vec<&Cell> = cells.iter().map(Borrow::borrow).collect();
        let (cpus, groups) = order_cpus(
            axes.cpus.iter().copied().chain(cells.iter().map(|c| c.cpu)),
            numa,
        );
        let mut others: Vec<&str> = cells
            .iter()
            .map(|c| c.device)
            .filter(|d| !axes.devices.iter().any(|a| a == d))
            .collect();
        sort_natural(&mut others);
        others.dedup();
        let devices: Vec<&str> = axes
            .devices
            .iter()
            .map(String::as_str)
            .chain(others)
            .collect();
        let mut h = Heatmap::new(
            title,
            "CPU",
            "device",
            cpus.iter().map(u32::to_string).collect(),
            devices.iter().map(|d| d.to_string()).collect(),
        );
        h.row_groups = groups;
        let (row, col) = (positions(&cpus), positions(&devices));
        for c in cells {
            if let (Some(r), Some(k)) = (row.get(&c.cpu), col.get(c.device)) {
                h.cells[r * devices.len() + k] = HeatCell::of(c);
            }
        }
        h.rescale();
        h
    }

    /// Rank 0 CPU x rank 1 CPU of one pair, both by NUMA node, each with the cells' CPUs and
    /// `axes.cpus`.
    pub fn pair<'a, C: Borrow<Cell<'a>>>(
        title: String,
        cells: &[C],
        numa: &NumaMap,
        axes: &Axes,
    ) -> Heatmap {
        let cells: Vec<&Cell> = cells.iter().map(Borrow::borrow).collect();
        let extra = || axes.cpus.iter().copied();
        let (r0, g0) = order_cpus(extra().chain(cells.iter().map(|c| c.cpu)), numa);
        let (r1, g1) = order_cpus(extra().chain(cells.iter().filter_map(|c| c.peer_cpu)), numa);
        let mut h = Heatmap::new(
            title,
            "rank 0 CPU",
            "rank 1 CPU",
            r0.iter().map(u32::to_string).collect(),
            r1.iter().map(u32::to_string).collect(),
        );
        h.row_groups = g0;
        h.col_groups = g1;
        let (row, col) = (positions(&r0), positions(&r1));
        for c in cells {
            let Some(peer) = c.peer_cpu else { continue };
            if let (Some(r), Some(k)) = (row.get(&c.cpu), col.get(&peer)) {
                h.cells[r * r1.len() + k] = HeatCell::of(c);
            }
        }
        h.rescale();
        h
    }

    /// Source device x destination device of an ordered peer copy matrix (cells labelled
    /// `SRC>DST`), both in natural order of the devices the cells name, plus `devices`.
    pub fn p2p<'a, C: Borrow<Cell<'a>>>(title: String, cells: &[C], devices: &[String]) -> Heatmap {
        let cells: Vec<&Cell> = cells.iter().map(Borrow::borrow).collect();
        let mut names: Vec<&str> = devices.iter().map(String::as_str).collect();
        for c in &cells {
            if let Some((s, d)) = super::p2p::split_label(c.device) {
                names.extend([s, d]);
            }
        }
        sort_natural(&mut names);
        names.dedup();
        let mut h = Heatmap::new(
            title,
            "source device",
            "destination device",
            names.iter().map(|d| d.to_string()).collect(),
            names.iter().map(|d| d.to_string()).collect(),
        );
        let at: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, d)| (*d, i)).collect();
        for c in cells {
            let Some((s, d)) = super::p2p::split_label(c.device) else {
                continue;
            };
            if let (Some(r), Some(k)) = (at.get(s), at.get(d)) {
                h.cells[r * names.len() + k] = HeatCell::of(c);
            }
        }
        h.rescale();
        h
    }

    /// The cell at row `r`, column `c`.
    pub fn get(&self, r: usize, c: usize) -> &HeatCell {
        &self.cells[r * self.cols.len() + c]
    }

    /// Set the scale's top from the values.
    pub fn rescale(&mut self) {
        let max = self
            .cells
            .iter()
            .filter_map(|c| match c {
                HeatCell::Value { gbps, .. } => Some(*gbps),
                _ => None,
            })
            .fold(0.0f64, f64::max);
        self.max = nice_ceiling(max);
    }

    /// Cells with a value.
    pub fn measured(&self) -> usize {
        self.cells
            .iter()
            .filter(|c| matches!(c, HeatCell::Value { .. }))
            .count()
    }

    /// Tooltip text for a cell.
    pub fn describe(&self, r: usize, c: usize) -> String {
        let head = format!(
            "{} {} \u{2192} {} {}",
            self.row_word, self.rows[r], self.col_word, self.cols[c]
        );
        let group = self
            .row_groups
            .iter()
            .find(|g| (g.start..g.end).contains(&r))
            .map(|g| format!(" ({})", g.label))
            .unwrap_or_default();
        match self.get(r, c) {
            HeatCell::Value { gbps, samples } if self.block > 1 => {
                format!("{head}{group}: {gbps:.2} GB/s, median of {samples} cells")
            }
            HeatCell::Value { gbps, samples } => {
                format!("{head}{group}: {gbps:.2} GB/s, median of {samples} samples")
            }
            HeatCell::Failed { error } => format!("{head}{group}: failed: {error}"),
            HeatCell::Empty => format!("{head}{group}: not measured"),
        }
    }
}

fn merge_labels(labels: &[String], k: usize) -> Vec<String> {
    labels
        .chunks(k)
        .map(|c| match (c.first(), c.last()) {
            (Some(a), Some(b)) if c.len() > 1 => format!("{a}-{b}"),
            (Some(a), _) => a.clone(),
            _ => String::new(),
        })
        .collect()
}

fn merge_groups(groups: &[Group], k: usize) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for g in groups {
        let (start, end) = (g.start / k, g.end.div_ceil(k));
        match out.last_mut() {
            Some(last) if last.end > start => last.end = last.end.max(end),
            _ => out.push(Group {
                start,
                end,
                label: g.label.clone(),
            }),
        }
    }
    out
}

impl Heatmap {
    /// Merge k x k blocks of cells (the median of their values) so that at most `max_cells`
    /// cells remain: a 640 x 640 pair matrix becomes 160 x 160 blocks for a web page.
    pub fn downsample(&self, max_cells: usize) -> Heatmap {
        let mut k = 1;
        while self.rows.len().div_ceil(k) * self.cols.len().div_ceil(k) > max_cells.max(1) {
            k += 1;
        }
        if k == 1 {
            return self.clone();
        }
        let (rows, cols) = (merge_labels(&self.rows, k), merge_labels(&self.cols, k));
        let mut out = Heatmap::new(
            self.title.clone(),
            &self.row_word,
            &self.col_word,
            rows,
            cols,
        );
        out.row_groups = merge_groups(&self.row_groups, k);
        out.col_groups = merge_groups(&self.col_groups, k);
        out.block = k * self.block;
        for br in 0..out.rows.len() {
            for bc in 0..out.cols.len() {
                let mut values = Vec::new();
                let mut failed = None;
                for r in br * k..((br + 1) * k).min(self.rows.len()) {
                    for c in bc * k..((bc + 1) * k).min(self.cols.len()) {
                        match self.get(r, c) {
                            HeatCell::Value { gbps, .. } => values.push(*gbps),
                            HeatCell::Failed { error } => failed = Some(error.clone()),
                            HeatCell::Empty => {}
                        }
                    }
                }
                let n = out.cols.len();
                out.cells[br * n + bc] = match (crate::stats::median(&values), failed) {
                    (Some(gbps), _) => HeatCell::Value {
                        gbps,
                        samples: values.len(),
                    },
                    (None, Some(error)) => HeatCell::Failed { error },
                    (None, None) => HeatCell::Empty,
                };
            }
        }
        out.rescale();
        out
    }
}

/// The smallest of 1, 2, 2.5, 5 x 10^k at or above `v` (1 for nothing measured).
pub fn nice_ceiling(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let exp = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * exp >= v * (1.0 - 1e-12) {
            return m * exp;
        }
    }
    10.0 * exp
}

/// Legend ticks: 0 to `max` in 5 steps.
pub fn ticks(max: f64) -> Vec<f64> {
    (0..=5).map(|i| max * f64::from(i) / 5.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(cpu: u32, device: &str, gbps: Option<f64>) -> Cell<'_> {
        Cell::test(cpu, device, gbps)
    }

    #[test]
    fn p2p_rows_are_sources_and_columns_destinations() {
        let cells = [
            Cell::test(0, "0>1", Some(20.0)),
            Cell::test(0, "1>0", Some(10.0)),
            Cell::test(0, "10>0", None),
        ];
        let h = Heatmap::p2p("t".into(), &cells, &["2".to_string()]);
        assert_eq!(h.rows, ["0", "1", "2", "10"]);
        assert_eq!(h.cols, h.rows);
        assert!(matches!(h.get(0, 1), HeatCell::Value { gbps, .. } if *gbps == 20.0));
        assert!(matches!(h.get(1, 0), HeatCell::Value { gbps, .. } if *gbps == 10.0));
        assert!(matches!(h.get(3, 0), HeatCell::Failed { .. }));
        assert_eq!(h.get(0, 0), &HeatCell::Empty);
        assert_eq!(
            (h.row_word.as_str(), h.col_word.as_str()),
            ("source device", "destination device")
        );
    }

    #[test]
    fn scale_rounds_up_to_nice_numbers() {
        assert_eq!(nice_ceiling(58.9), 100.0);
        assert_eq!(nice_ceiling(21.3), 25.0);
        assert_eq!(nice_ceiling(13.7), 20.0);
        assert_eq!(nice_ceiling(5.0), 5.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(ticks(25.0), vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0]);
    }

    #[test]
    fn downsampling_takes_block_medians_and_keeps_groups() {
        let labels: Vec<String> = (0..8).map(|i| i.to_string()).collect();
        let mut map = Heatmap::new(
            "p".into(),
            "rank 0 CPU",
            "rank 1 CPU",
            labels.clone(),
            labels,
        );
        map.row_groups = vec![
            Group {
                start: 0,
                end: 4,
                label: "NUMA 0".into(),
            },
            Group {
                start: 4,
                end: 8,
                label: "NUMA 1".into(),
            },
        ];
        for (i, cell) in map.cells.iter_mut().enumerate() {
            *cell = HeatCell::Value {
                gbps: (i / 8) as f64,
                samples: 1,
            };
        }
        map.cells[0] = HeatCell::Empty;
        let small = map.downsample(16);
        assert_eq!((small.rows.len(), small.cols.len(), small.block), (4, 4, 2));
        assert_eq!(small.rows[1], "2-3");
        assert_eq!(
            small.get(0, 0),
            &HeatCell::Value {
                gbps: 1.0,
                samples: 3
            }
        );
        assert_eq!(small.row_groups[1].start, 2);
        assert!(small.describe(0, 0).contains("median of 3 cells"));
    }

    #[test]
    fn cpus_group_by_numa_node_even_when_interleaved() {
        let numa: NumaMap = (0..6).map(|c| (c, c % 2)).collect();
        let (cpus, groups) = order_cpus([5, 0, 1, 2, 3, 4, 7], &numa);
        assert_eq!(cpus, [0, 2, 4, 1, 3, 5, 7]);
        let spans: Vec<(usize, usize, &str)> = groups
            .iter()
            .map(|g| (g.start, g.end, g.label.as_str()))
            .collect();
        assert_eq!(
            spans,
            [(0, 3, "NUMA 0"), (3, 6, "NUMA 1"), (6, 7, "NUMA ?")]
        );
    }

    #[test]
    fn listed_devices_come_first_then_the_others_in_natural_order() {
        let numa: NumaMap = (0..4).map(|c| (c, c / 2)).collect();
        let cells = [
            cell(1, "10", Some(5.0)),
            cell(0, "2", Some(58.0)),
            cell(0, "b", None),
            cell(3, "numa10", Some(1.0)),
            cell(3, "numa2", Some(1.0)),
        ];
        let axes = Axes {
            cpus: vec![2],
            devices: vec!["b".into(), "a".into()],
        };
        let map = Heatmap::h2d("t".into(), &cells, &numa, &axes);
        assert_eq!(map.cols, ["b", "a", "2", "10", "numa2", "numa10"]);
        assert_eq!(map.rows, ["0", "1", "2", "3"]);
        assert_eq!(
            map.get(0, 0),
            &HeatCell::Failed {
                error: "copy failed".into()
            }
        );
        assert_eq!(map.get(2, 2), &HeatCell::Empty);
        assert_eq!(map.max, 100.0);
        assert_eq!(map.measured(), 4);
        let plain = Heatmap::h2d("t".into(), &cells, &numa, &Axes::default());
        assert_eq!(plain.cols, ["2", "10", "b", "numa2", "numa10"]);
        assert_eq!(plain.rows, ["0", "1", "3"]);
    }
}
