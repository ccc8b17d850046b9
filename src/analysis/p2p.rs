//! The ordered device x device peer copy matrix (`chd probe p2p`): each pair's value next to
//! the median of its PCIe path class (`PIX` ... `SYS`, as `nvidia-smi topo -m` names them),
//! the per-class medians, and the pairs below [`SLOW_PAIR_RATIO`] x their class median (a
//! slow pair is a placement fact: the copies between those two devices are slower than the
//! topology promises). Cells are labelled `SRC>DST`.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::cell::Cell;
use crate::stats;
use crate::topology::natural::natural_key;
use crate::topology::pci_path::PathClass;

/// A pair below this fraction of its path class's median is slow.
pub const SLOW_PAIR_RATIO: f64 = 0.7;

/// The cell label of the ordered pair `src` -> `dst`.
pub fn pair_label(src: &str, dst: &str) -> String {
    format!("{src}>{dst}")
}

/// The source and destination devices of a `SRC>DST` label.
pub fn split_label(label: &str) -> Option<(&str, &str)> {
    label
        .split_once('>')
        .filter(|(s, d)| !s.is_empty() && !d.is_empty())
}

/// One ordered pair.
#[derive(Debug, Clone, PartialEq)]
pub struct P2pPair {
    pub src: String,
    pub dst: String,
    /// Its path class's name (`unknown` when the run did not say).
    pub class: String,
    /// How its copies went (`copy`, `copy-staged`), when known.
    pub method: Option<String>,
    /// Median bytes per second; `None` when every sample failed.
    pub value: Option<f64>,
    /// Successful and failed samples.
    pub samples: usize,
    pub failed: usize,
    pub last_error: Option<String>,
    /// Value over its class's median.
    pub ratio: Option<f64>,
}

impl P2pPair {
    pub fn label(&self) -> String {
        pair_label(&self.src, &self.dst)
    }

    pub fn is_slow(&self) -> bool {
        self.ratio.is_some_and(|r| r < SLOW_PAIR_RATIO)
    }
}

/// One path class's pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSummary {
    pub class: String,
    pub pairs: usize,
    pub measured: usize,
    /// Median of the measured pairs' values, bytes per second.
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// The matrix's pairs and classes.
#[derive(Debug, Clone, PartialEq)]
pub struct P2pMatrix {
    /// In natural order of source, then destination.
    pub pairs: Vec<P2pPair>,
    /// Nearest class first (PIX, PXB, PHB, NODE, SYS, then anything else).
    pub classes: Vec<ClassSummary>,
}

fn class_rank(class: &str) -> (usize, String) {
    let rank = class
        .parse::<PathClass>()
        .map(|c| PathClass::ALL.iter().position(|x| *x == c).unwrap_or(0))
        .unwrap_or(PathClass::ALL.len());
    (rank, class.to_string())
}

impl P2pMatrix {
    /// The matrix of `cells` (labelled `SRC>DST`; others are ignored), with each pair's class
    /// from `classes` and method from `methods` (both keyed by label).
    pub fn of<'a, C: Borrow<Cell<'a>>>(
        cells: &[C],
        classes: &BTreeMap<String, String>,
        methods: &BTreeMap<String, String>,
    ) -> P2pMatrix {
        let mut pairs: Vec<P2pPair> = cells
            .iter()
            .map(Borrow::borrow)
            .filter_map(|c| {
                let (src, dst) = split_label(c.device)?;
                Some(P2pPair {
                    src: src.to_string(),
                    dst: dst.to_string(),
                    class: classes
                        .get(c.device)
                        .cloned()
                        .unwrap_or_else(|| PathClass::Unknown.as_str().to_string()),
                    method: methods.get(c.device).cloned(),
                    value: c.value,
                    samples: c.samples,
                    failed: c.failed,
                    last_error: c.last_error.as_deref().map(str::to_string),
                    ratio: None,
                })
            })
            .collect();
        pairs.sort_by(|a, b| {
            (natural_key(&a.src), natural_key(&a.dst))
                .cmp(&(natural_key(&b.src), natural_key(&b.dst)))
        });
        let mut by_class: BTreeMap<(usize, String), Vec<&P2pPair>> = BTreeMap::new();
        for p in &pairs {
            by_class.entry(class_rank(&p.class)).or_default().push(p);
        }
        let summaries: Vec<ClassSummary> = by_class
            .into_iter()
            .map(|((_, class), members)| {
                let values: Vec<f64> = members.iter().filter_map(|p| p.value).collect();
                ClassSummary {
                    class,
                    pairs: members.len(),
                    measured: values.len(),
                    median: stats::median(&values),
                    min: values.iter().copied().reduce(f64::min),
                    max: values.iter().copied().reduce(f64::max),
                }
            })
            .collect();
        for p in &mut pairs {
            let median = summaries
                .iter()
                .find(|c| c.class == p.class)
                .and_then(|c| c.median);
            p.ratio = match (p.value, median) {
                (Some(v), Some(m)) if m > 0.0 => Some(v / m),
                _ => None,
            };
        }
        P2pMatrix {
            pairs,
            classes: summaries,
        }
    }

    /// Pairs below [`SLOW_PAIR_RATIO`] x their class median, slowest ratio first.
    pub fn slow_pairs(&self) -> Vec<&P2pPair> {
        let mut slow: Vec<&P2pPair> = self.pairs.iter().filter(|p| p.is_slow()).collect();
        slow.sort_by(|a, b| {
            a.ratio
                .partial_cmp(&b.ratio)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        slow
    }

    /// Pairs with failed samples.
    pub fn failed_pairs(&self) -> Vec<&P2pPair> {
        self.pairs.iter().filter(|p| p.failed > 0).collect()
    }

    /// The class summary named `class`.
    pub fn class(&self, class: &str) -> Option<&ClassSummary> {
        self.classes.iter().find(|c| c.class == class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_slow_pairs() {
        let labels = ["0>1", "1>0", "2>1", "1>2", "0>2", "2>0", "0>3", "3>0", "x"];
        let values = [20.0, 20.0, 3.0, 19.0, 21.0, 20.0, 6.0, 6.5, 1.0];
        let cells: Vec<Cell> = labels
            .iter()
            .zip(values)
            .map(|(l, v)| Cell::test(0, l, Some(v)))
            .chain([Cell::test(0, "3>1", None)])
            .collect();
        let mut classes: BTreeMap<String, String> = ["0>1", "1>0", "2>1", "1>2", "0>2", "2>0"]
            .iter()
            .map(|l| (l.to_string(), "PIX".to_string()))
            .collect();
        for l in ["0>3", "3>0", "3>1"] {
            classes.insert(l.into(), "SYS".into());
        }
        let methods = BTreeMap::from([("3>0".to_string(), "copy-staged".to_string())]);
        let m = P2pMatrix::of(&cells, &classes, &methods);
        assert_eq!(m.pairs.len(), 9, "the label without '>' is not a pair");
        assert_eq!(m.pairs[0].label(), "0>1");
        let names: Vec<&str> = m.classes.iter().map(|c| c.class.as_str()).collect();
        assert_eq!(names, ["PIX", "SYS"]);
        let pix = m.class("PIX").unwrap();
        assert_eq!((pix.pairs, pix.measured), (6, 6));
        assert_eq!(pix.median, Some(20.0e9));
        let sys = m.class("SYS").unwrap();
        assert_eq!((sys.pairs, sys.measured), (3, 2));
        assert_eq!(sys.median, Some(6.25e9));
        let slow: Vec<String> = m.slow_pairs().iter().map(|p| p.label()).collect();
        assert_eq!(slow, ["2>1"]);
        assert_eq!(m.failed_pairs()[0].label(), "3>1");
        let staged = m.pairs.iter().find(|p| p.label() == "3>0").unwrap();
        assert_eq!(staged.method.as_deref(), Some("copy-staged"));
        assert_eq!(split_label("10>2"), Some(("10", "2")));
        assert_eq!(split_label(">2"), None);
    }
}
