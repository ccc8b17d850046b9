//! Device columns against physics: each column's median over the payload bandwidth of the
//! device's PCIe link ([`crate::topology::pci_link`]), the `chd_h2d_link_efficiency_ratio`
//! of the exposition, the `/matrix` page and the report. A healthy copy reaches 0.8-0.9 of
//! its link; a node whose every device is equally slow has column ratios near 1 and low
//! efficiencies.
//!
//! A device with a column above its link's payload is not judged against the link at all
//! (no efficiency, so `ChdH2DBelowLink` cannot page it): on Ascend, H2D and D2H may go over
//! the HCCS plane rather than PCIe alone (the path is not PCIe-bound); on CUDA such a column
//! is a measurement fault ([`super::limits`] flags its samples implausible). [`above_link`]
//! names those devices for the report.

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

fn every_efficiency(
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

/// Every device column of `matrices` whose device has a link in `links` with a known payload,
/// by (device, size, direction); none of a device with a column above its link's payload
/// (see the module's doc).
pub fn link_efficiencies(
    matrices: &BTreeMap<MatrixKey, H2dMatrix>,
    links: &BTreeMap<String, Link>,
) -> Vec<LinkEfficiency> {
    let all = every_efficiency(matrices, links);
    let above: Vec<String> = above_link_of(&all).map(|e| e.device.clone()).collect();
    all.into_iter()
        .filter(|e| !above.contains(&e.device))
        .collect()
}

fn above_link_of(all: &[LinkEfficiency]) -> impl Iterator<Item = &LinkEfficiency> {
    let mut seen: Vec<&str> = Vec::new();
    all.iter().filter(move |e| {
        let first = e.ratio > 1.0 && !seen.contains(&e.device.as_str());
        if first {
            seen.push(&e.device);
        }
        first
    })
}

/// Per device with a column above its link's payload, its highest such column (ratio above
/// 1): the devices the link does not bound.
pub fn above_link(
    matrices: &BTreeMap<MatrixKey, H2dMatrix>,
    links: &BTreeMap<String, Link>,
) -> Vec<LinkEfficiency> {
    let all = every_efficiency(matrices, links);
    let devices: Vec<String> = above_link_of(&all).map(|e| e.device.clone()).collect();
    devices
        .iter()
        .filter_map(|d| {
            all.iter()
                .filter(|e| &e.device == d)
                .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
                .cloned()
        })
        .collect()
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
        assert!(above_link(&matrices, &links).is_empty());
    }

    #[test]
    fn a_device_above_its_link_is_not_judged_against_it() {
        // An Ascend device whose H2D (over HCCS) reads 50 GB/s on a Gen4 x16 link (31.5 GB/s
        // of payload) while its D2H, at 12 GB/s, would look below its link.
        let cell = |device, gbps: f64| Cell {
            cpu: 0,
            peer_cpu: None,
            device,
            value: Some(gbps * 1e9),
            samples: 1,
            failed: 0,
            last_error: None,
            sampled_at: None,
        };
        let mut matrices = BTreeMap::new();
        let size = 64 << 20;
        matrices.insert(
            (size, Direction::H2d),
            H2dMatrix::of(&[cell("0", 50.0), cell("1", 25.0)], &NumaMap::new()),
        );
        matrices.insert(
            (size, Direction::D2h),
            H2dMatrix::of(&[cell("0", 12.0), cell("1", 25.0)], &NumaMap::new()),
        );
        let gen4 = LinkState {
            width: 16,
            transfers_per_second: 16_000_000_000,
        };
        let link = Link {
            current: gen4,
            max: gen4,
        };
        let links = BTreeMap::from([("0".to_string(), link), ("1".to_string(), link)]);
        let judged = link_efficiencies(&matrices, &links);
        assert!(judged.iter().all(|e| e.device == "1"), "{judged:?}");
        assert_eq!(judged.len(), 2);
        let above = above_link(&matrices, &links);
        assert_eq!(above.len(), 1);
        assert_eq!(
            (above[0].device.as_str(), above[0].direction),
            ("0", Direction::H2d)
        );
        assert!((above[0].ratio - 50.0 / 31.507_692_307).abs() < 1e-6);
    }
}
