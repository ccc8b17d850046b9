//! The one rule for a first sample too slow to believe at once (the seed's first device
//! after a fresh pinned buffer read slow in one order and fine in another): a sample below
//! [`SUSPECT_RATIO`] x the node's typical cell of its group (the H2D cells of one size and
//! direction, the cells of one device pair) is suspect, unless the cell's own history is as
//! slow already; a suspect counts only when a re-measurement later in the window, in another
//! order, is slow too. The windows of `schedule` hold suspects back; the rule is here, once.

use std::collections::BTreeMap;

use crate::stats;

/// A sample below this share of its group's typical cell is slow.
pub const SUSPECT_RATIO: f64 = 0.5;

/// A group's typical cell needs this many measured cells (fewer: no sample is suspect).
pub const MIN_CELLS: usize = 3;

/// The typical cell value of each group: the median of its measured cells' medians, for the
/// groups with at least [`MIN_CELLS`] cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Typical<G>(BTreeMap<G, f64>);

impl<G> Default for Typical<G> {
    fn default() -> Self {
        Typical(BTreeMap::new())
    }
}

impl<G: Ord> Typical<G> {
    /// The typical cells of `medians` (each measured cell's group and median).
    pub fn of(medians: impl IntoIterator<Item = (G, f64)>) -> Typical<G> {
        let mut values: BTreeMap<G, Vec<f64>> = BTreeMap::new();
        for (group, median) in medians {
            values.entry(group).or_default().push(median);
        }
        Typical(
            values
                .into_iter()
                .filter(|(_, v)| v.len() >= MIN_CELLS)
                .filter_map(|(g, v)| Some((g, stats::median(&v)?)))
                .collect(),
        )
    }

    /// Whether `value` is slow against its group's typical cell (no typical cell: never).
    pub fn is_slow(&self, group: &G, value: f64) -> bool {
        self.0
            .get(group)
            .is_some_and(|typical| value < SUSPECT_RATIO * typical)
    }

    /// Slow against the group, and not what the cell has already shown (`history`: its
    /// median so far; a cell whose history is slow needs no new confirmation).
    pub fn is_suspect(&self, group: &G, value: f64, history: Option<f64>) -> bool {
        self.is_slow(group, value) && history.is_none_or(|h| value < SUSPECT_RATIO * h)
    }

    /// The typical cell of `group`.
    pub fn of_group(&self, group: &G) -> Option<f64> {
        self.0.get(group).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_first_sample_is_suspect_unless_the_cell_was_slow_before() {
        let t = Typical::of([
            ("a", 10.0),
            ("a", 11.0),
            ("a", 12.0),
            ("b", 1.0),
            ("b", 1.0),
        ]);
        assert_eq!(t.of_group(&"a"), Some(11.0));
        // Two cells are not enough for a typical cell.
        assert_eq!(t.of_group(&"b"), None);
        assert!(!t.is_slow(&"b", 0.01));
        assert!(t.is_slow(&"a", 5.4));
        assert!(!t.is_slow(&"a", 5.5));
        assert!(t.is_suspect(&"a", 5.0, None));
        assert!(t.is_suspect(&"a", 5.0, Some(11.0)));
        // A cell slow already: its slow sample is believed at once.
        assert!(!t.is_suspect(&"a", 5.0, Some(6.0)));
        assert!(!t.is_suspect(&"a", 9.0, None));
    }
}
