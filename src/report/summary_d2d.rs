//! The same-device copy (D2D) part of `summary.md`: per device its median GB/s, the CPU it
//! was measured from, its ratio to the node's typical device (as `chd_d2d_device_ratio`),
//! slow devices flagged, devices above their memory's limit flagged implausible (and left out
//! of the typical device); and the findings they give.

use std::fmt::Write;

use crate::analysis::{D2dDevices, NumaMap, SLOW_D2D_DEVICE_RATIO};
use crate::dataset::{Dataset, MatrixId};

fn gbps(v: f64) -> String {
    crate::vocab::Bandwidth::from_bytes_per_second(v).to_string()
}

/// The findings of one D2D matrix: each implausible device, each slow device, then the
/// devices that failed.
pub fn findings(title: &str, a: &D2dDevices) -> Vec<String> {
    let typical = a.typical.map(gbps).unwrap_or_default();
    let mut out: Vec<String> = a
        .implausible()
        .iter()
        .filter_map(|d| {
            let limit = d.implausible.as_ref()?;
            Some(format!(
                "device {} reads {} GB/s at same-device copies, above its path's limit of {} \
                 GB/s ({}): implausible, a measurement fault (a copy that stayed in a cache); \
                 left out of the typical device and the ratios ({title})",
                d.device,
                d.value.map(gbps).unwrap_or_default(),
                gbps(limit.bytes_per_second),
                limit.source
            ))
        })
        .collect();
    let implausible = out.len();
    if implausible > 0 {
        out.push(format!(
            "{implausible} of {} devices implausible at same-device copies ({title})",
            a.devices.len()
        ));
    }
    out.extend(a.slow().iter().map(|d| {
        format!(
            "device {} is slow at same-device copies: {:.2} x the typical device \
                 ({typical} GB/s), median {} GB/s ({title})",
            d.device,
            d.ratio.unwrap_or(f64::NAN),
            d.value.map(gbps).unwrap_or_default()
        )
    }));
    let failed = a.devices.iter().filter(|d| d.failed > 0).count();
    if failed > 0 {
        out.push(format!(
            "{failed} of {} devices had failed samples ({title}); see the D2D table",
            a.devices.len()
        ));
    }
    out
}

/// The section of one D2D matrix.
pub fn section(s: &mut String, ds: &Dataset, id: &MatrixId, numa: &NumaMap, a: &D2dDevices) {
    let measured = a.devices.iter().filter(|d| d.value.is_some()).count();
    let _ = writeln!(
        s,
        "## {}\n\n{measured} of {} devices measured, each from one CPU of its NUMA node. \
         Typical device (median over the devices): {} GB/s. Ratio = the device's median / \
         the typical device's (as `chd_d2d_device_ratio`); below {SLOW_D2D_DEVICE_RATIO} is \
         slow. A device above its path's limit (half its memory's bandwidth, or the run's \
         configured `[limits]`) is **implausible**, without a ratio and left out of the \
         typical device.\n\n| device | name | CPU | NUMA | samples | failed | median GB/s | ratio | |\n\
         |---|---|---|---|---|---|---|---|---|",
        Dataset::matrix_title(id),
        a.devices.len(),
        a.typical.map(gbps).unwrap_or_else(|| "-".into()),
    );
    for d in &a.devices {
        let name = ds
            .devices
            .iter()
            .find(|m| m.id == d.device)
            .map(|m| m.name.as_str())
            .unwrap_or("");
        let slow = d.ratio.is_some_and(|r| r < SLOW_D2D_DEVICE_RATIO);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            d.device,
            name.replace('|', "/"),
            d.cpu,
            numa.get(&d.cpu)
                .map(|n| n.to_string())
                .unwrap_or_else(|| "?".into()),
            d.samples,
            d.failed,
            d.value.map(gbps).unwrap_or_else(|| "-".into()),
            d.ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            match &d.implausible {
                Some(l) => format!("**implausible** (limit {} GB/s)", gbps(l.bytes_per_second)),
                None if slow => "**slow**".to_string(),
                None if d.value.is_none() => "**failed**".to_string(),
                None => String::new(),
            }
        );
    }
    s.push('\n');
}
