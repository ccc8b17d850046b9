//! Device columns against physics: each column's median over the payload bandwidth of the
//! device's PCIe link ([`crate::topology::pci_link`]), the `chd_h2d_link_efficiency_ratio`
//! of the exposition, the `/matrix` page and the report. A healthy copy reaches 0.8-0.9 of
//! its link; a node whose every device is equally slow has column ratios near 1 and low
//! efficiencies.

use std::collections::BTreeMap;

use super::h2d::H2dMatrix;
use super::live::MatrixKey;
use crate::topology::pci_link::Link;
use crate::vocab::Direction;

/// One device column over its link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkEfficiency {
    pub device: String,
    pub size_bytes: u64,
    pub direction: Direction,
    /// Column median / payload of the link's current state.
    pub ratio: f64,
}

/// A column median over the payload of `link`'s current state; `None` when its payload is
/// unknown.
pub fn efficiency(median: f64, link: &Link) -> Option<f64> {
    Some(median / link.current.payload_bytes_per_second()?)
}

/// Every device column of `matrices` whose device has a link in `links` with a known payload,
/// by (device, size, direction).
pub fn link_efficiencies(
    matrices: &BTreeMap<MatrixKey, H2dMatrix>,
    links: &BTreeMap<String, Link>,
) -> Vec<LinkEfficiency> {
    let mut out: Vec<LinkEfficiency> = matrices
        .iter()
        .flat_map(|(&(size_bytes, direction), matrix)| {
            matrix.devices.iter().filter_map(move |col| {
                let ratio = efficiency(col.summary.median, links.get(&col.device)?)?;
                Some(LinkEfficiency {
                    device: col.device.clone(),
                    size_bytes,
                    direction,
                    ratio,
                })
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.device, a.size_bytes, a.direction).cmp(&(&b.device, b.size_bytes, b.direction))
    });
    out
}

/// The efficiency a table shows beside a device: its largest size, h2d preferred (as the
/// measured NUMA node picks its matrix).
pub fn headline<'a>(
    efficiencies: &'a [LinkEfficiency],
    device: &str,
) -> Option<&'a LinkEfficiency> {
    efficiencies
        .iter()
        .filter(|e| e.device == device)
        .max_by_key(|e| (e.size_bytes, e.direction == Direction::H2d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Cell, NumaMap};
    use crate::topology::pci_link::LinkState;

    fn gen5(width: u32) -> Link {
        let state = |width| LinkState {
            width,
            transfers_per_second: 32_000_000_000,
        };
        Link {
            current: state(width),
            max: state(16),
        }
    }

    #[test]
    fn column_median_over_the_current_links_payload() {
        let cell = |cpu, device, gbps: f64| Cell {
            cpu,
            peer_cpu: None,
            device,
            value: Some(gbps * 1e9),
            samples: 1,
            failed: 0,
            last_error: None,
            sampled_at: None,
        };
        let cells = [
            cell(0, "0", 50.0),
            cell(1, "0", 52.0),
            cell(2, "0", 54.0),
            cell(0, "1", 9.45),
            cell(0, "2", 40.0),
        ];
        let mut matrices = BTreeMap::new();
        for size in [64 << 20, 16 << 20] {
            matrices.insert(
                (size, Direction::H2d),
                H2dMatrix::of(&cells, &NumaMap::new()),
            );
        }
        matrices.insert(
            (64 << 20, Direction::D2h),
            H2dMatrix::of(&cells, &NumaMap::new()),
        );
        let links = BTreeMap::from([("0".to_string(), gen5(16)), ("1".to_string(), gen5(8))]);
        let all = link_efficiencies(&matrices, &links);
        // Device 2 has no link; devices 0 and 1 have one per matrix.
        assert_eq!(all.len(), 6);
        assert!(all.iter().all(|e| e.device != "2"));
        let top = headline(&all, "0").unwrap();
        assert_eq!((top.size_bytes, top.direction), (64 << 20, Direction::H2d));
        assert!(
            (top.ratio - 52.0 / 63.015_384_615).abs() < 1e-9,
            "{}",
            top.ratio
        );
        let x8 = headline(&all, "1").unwrap();
        assert!((x8.ratio - 0.3).abs() < 1e-3, "{}", x8.ratio);
        assert_eq!(headline(&all, "2"), None);
    }
}
