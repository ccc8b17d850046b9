//! One heatmap, independent of how it is drawn (PNG, SVG, spreadsheet): row and column
//! labels, NUMA groups, cells in GB/s, and the colour scale all renderers share (viridis from
//! 0 to a rounded maximum: dark = slow, yellow = fast; failed cells red, unmeasured grey).

use std::collections::BTreeMap;

use super::analysis::natural_key;
use super::dataset::CellResult;

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

/// CPUs ordered by NUMA node (unknown last), then id, with the node groups.
pub fn order_cpus(
    cpus: impl IntoIterator<Item = u32>,
    numa: &BTreeMap<u32, u32>,
) -> (Vec<u32>, Vec<Group>) {
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

fn cell_of(c: &CellResult) -> HeatCell {
    match c.value() {
        Some(v) => HeatCell::Value {
            gbps: v / 1e9,
            samples: c.samples.len(),
        },
        None if !c.errors.is_empty() => HeatCell::Failed {
            error: c.errors.last().cloned().unwrap_or_default(),
        },
        None => HeatCell::Empty,
    }
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

    /// Core x device: rows CPUs by NUMA node, columns devices.
    pub fn h2d(title: String, cells: &[&CellResult], numa: &BTreeMap<u32, u32>) -> Heatmap {
        let (cpus, groups) = order_cpus(cells.iter().map(|c| c.cpu), numa);
        let mut devices: Vec<&str> = cells.iter().map(|c| c.device.as_str()).collect();
        devices.sort_by_key(|d| natural_key(d));
        devices.dedup();
        let mut h = Heatmap::new(
            title,
            "CPU",
            "device",
            cpus.iter().map(u32::to_string).collect(),
            devices.iter().map(|d| d.to_string()).collect(),
        );
        h.row_groups = groups;
        let row: BTreeMap<u32, usize> = cpus.iter().enumerate().map(|(i, c)| (*c, i)).collect();
        let col: BTreeMap<&str, usize> = devices.iter().enumerate().map(|(i, d)| (*d, i)).collect();
        for c in cells {
            let i = row[&c.cpu] * h.cols.len() + col[c.device.as_str()];
            h.cells[i] = cell_of(c);
        }
        h.rescale();
        h
    }

    /// Rank 0 CPU x rank 1 CPU of one pair, both by NUMA node.
    pub fn pair(title: String, cells: &[&CellResult], numa: &BTreeMap<u32, u32>) -> Heatmap {
        let (r0, g0) = order_cpus(cells.iter().map(|c| c.cpu), numa);
        let (r1, g1) = order_cpus(cells.iter().filter_map(|c| c.peer_cpu), numa);
        let mut h = Heatmap::new(
            title,
            "rank 0 CPU",
            "rank 1 CPU",
            r0.iter().map(u32::to_string).collect(),
            r1.iter().map(u32::to_string).collect(),
        );
        h.row_groups = g0;
        h.col_groups = g1;
        let row: BTreeMap<u32, usize> = r0.iter().enumerate().map(|(i, c)| (*c, i)).collect();
        let col: BTreeMap<u32, usize> = r1.iter().enumerate().map(|(i, c)| (*c, i)).collect();
        for c in cells {
            if let Some(peer) = c.peer_cpu {
                h.cells[row[&c.cpu] * h.cols.len() + col[&peer]] = cell_of(c);
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

/// Viridis, sampled at 9 points.
const VIRIDIS: [(u8, u8, u8); 9] = [
    (68, 1, 84),
    (71, 44, 122),
    (59, 81, 139),
    (44, 113, 142),
    (33, 144, 141),
    (39, 173, 129),
    (92, 200, 99),
    (170, 220, 50),
    (253, 231, 37),
];

/// Failed cells.
pub const FAILED: (u8, u8, u8) = (215, 25, 28);
/// Unmeasured cells.
pub const EMPTY: (u8, u8, u8) = (225, 225, 225);

/// Colour of `gbps` on a scale from 0 to `max`.
pub fn colour(gbps: f64, max: f64) -> (u8, u8, u8) {
    let t = if max > 0.0 {
        (gbps / max).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let pos = t * (VIRIDIS.len() - 1) as f64;
    let i = (pos.floor() as usize).min(VIRIDIS.len() - 2);
    let f = pos - i as f64;
    let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * f).round() as u8;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    (mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Colour of a cell.
pub fn cell_colour(cell: &HeatCell, max: f64) -> (u8, u8, u8) {
    match cell {
        HeatCell::Value { gbps, .. } => colour(*gbps, max),
        HeatCell::Failed { .. } => FAILED,
        HeatCell::Empty => EMPTY,
    }
}

/// `#rrggbb`.
pub fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn colours_run_dark_to_yellow() {
        assert_eq!(colour(0.0, 10.0), VIRIDIS[0]);
        assert_eq!(colour(10.0, 10.0), VIRIDIS[8]);
        assert_eq!(colour(99.0, 10.0), VIRIDIS[8]);
        assert_eq!(hex(colour(5.0, 10.0)), "#21908d");
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
        let numa: BTreeMap<u32, u32> = (0..6).map(|c| (c, c % 2)).collect();
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
}
