//! The ledger's records of the kinds beside the core x device and core-pair matrices: the
//! same-device copies (`analysis::d2d`), the peer copy matrix with its path classes
//! (`analysis::p2p`), the size curves with their plateau and dips (`analysis::sweep`) and the
//! basic validation table (`analysis::basics`), with the d2d and p2p findings. Converted,
//! never computed here.

use std::collections::BTreeMap;

use crate::analysis::basics::BasicsTable;
use crate::analysis::d2d::D2dDevices;
use crate::analysis::p2p::P2pMatrix;
use crate::analysis::sweep::{Curve, DIP_RATIO, PLATEAU_BAND};
use crate::format::calibration as doc;

fn gbps(v: f64) -> f64 {
    v / 1e9
}

/// Same-device copies, one entry per size, sizes ascending.
pub fn d2d(by_size: &BTreeMap<u64, D2dDevices>) -> Vec<doc::D2dSize> {
    by_size
        .iter()
        .map(|(&size_bytes, a)| doc::D2dSize {
            size_bytes,
            typical_gbps: a.typical.map(gbps),
            devices: a
                .devices
                .iter()
                .map(|d| doc::D2dDevice {
                    device: d.device.clone(),
                    gbps: d.value.map(gbps),
                    samples: d.samples as u64,
                    failed: d.failed as u64,
                    ratio: d.ratio,
                })
                .collect(),
        })
        .collect()
}

/// The devices below the slow same-device ratio, by size.
pub fn slow_d2d(by_size: &BTreeMap<u64, D2dDevices>) -> Vec<doc::SlowD2dDevice> {
    by_size
        .iter()
        .flat_map(|(&size_bytes, a)| {
            a.slow().into_iter().map(move |d| doc::SlowD2dDevice {
                size_bytes,
                device: d.device.clone(),
                ratio: d.ratio.unwrap_or_default(),
            })
        })
        .collect()
}

/// The peer copy matrix.
pub fn p2p(m: &P2pMatrix) -> doc::P2p {
    doc::P2p {
        pairs: m
            .pairs
            .iter()
            .map(|p| doc::P2pPair {
                src: p.src.clone(),
                dst: p.dst.clone(),
                path: p.class.clone(),
                method: p.method.clone(),
                gbps: p.value.map(gbps),
                samples: p.samples as u64,
                failed: p.failed as u64,
                ratio: p.ratio,
            })
            .collect(),
        classes: m
            .classes
            .iter()
            .map(|c| doc::P2pClass {
                path: c.class.clone(),
                pairs: c.pairs as u64,
                measured: c.measured as u64,
                median_gbps: c.median.map(gbps),
                min_gbps: c.min.map(gbps),
                max_gbps: c.max.map(gbps),
            })
            .collect(),
    }
}

/// The pairs below the slow ratio of their class, slowest first.
pub fn slow_p2p(m: &P2pMatrix) -> Vec<doc::SlowP2pPair> {
    m.slow_pairs()
        .into_iter()
        .map(|p| doc::SlowP2pPair {
            src: p.src.clone(),
            dst: p.dst.clone(),
            path: p.class.clone(),
            ratio: p.ratio.unwrap_or_default(),
        })
        .collect()
}

/// The size curves, in the order `analysis::sweep::curves` gives them.
pub fn sweeps(curves: &[Curve]) -> Vec<doc::SweepCurve> {
    curves
        .iter()
        .map(|c| doc::SweepCurve {
            op: c.op.clone(),
            device: c.device.clone(),
            setting: c.setting.clone(),
            max_gbps: c.max.map(gbps),
            plateau_bytes: c.plateau,
            plateau_scatter: c.plateau_scatter(),
            plateau_band: PLATEAU_BAND,
            dip_ratio: DIP_RATIO,
            points: c
                .points
                .iter()
                .map(|p| doc::SweepPoint {
                    size_bytes: p.size_bytes,
                    gbps: p.median.map(gbps),
                    spread: p.spread,
                    samples: p.samples as u64,
                    failed: p.failed as u64,
                    dip: p.dip,
                    remeasure: p.remeasure,
                    unsupported: p.unsupported,
                    last_error: p.last_error.clone(),
                })
                .collect(),
        })
        .collect()
}

/// The basic validation table, each row's values in its measurement's own unit.
pub fn basics(t: &BasicsTable) -> doc::Basics {
    doc::Basics {
        rows: t
            .rows
            .iter()
            .map(|r| {
                let value = |d: &crate::analysis::basics::DeviceValue| doc::BasicsValue {
                    device: d.device.clone(),
                    value: r.op.scaled(d.value),
                };
                doc::BasicsRow {
                    measurement: r.op.as_str().to_string(),
                    unit: r.op.unit().to_string(),
                    load: r.load.clone(),
                    slowest: r.min.as_ref().map(value),
                    fastest: r.max.as_ref().map(value),
                    slowest_over_fastest: r.spread(),
                    weak: r.weak().is_some(),
                    measured: r.measured as u64,
                    failed: r
                        .failed
                        .iter()
                        .map(|(device, error)| doc::BasicsFailure {
                            device: device.clone(),
                            error: error.clone(),
                        })
                        .collect(),
                }
            })
            .collect(),
        unavailable: t
            .unavailable
            .iter()
            .map(|(op, why)| doc::BasicsUnavailable {
                measurement: op.as_str().to_string(),
                why: why.clone(),
            })
            .collect(),
    }
}
