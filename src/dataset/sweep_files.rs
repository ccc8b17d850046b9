//! Size-sweep files ([`crate::format::size_sweep`]), one or several, as one [`Dataset`] of
//! size-curve points, so `chd report` draws them as a `chd probe sweep` run's curves and
//! compares one operation's curves under different settings.
//!
//! Operations: `h2d` -> `h2d`, `d2d_same_device` -> `d2d`, `hccl_all_gather` -> `allgather`.
//! The CSV's series name both the operation and the setting: `hccl_default` is allgather
//! with `HCCL_BUFFSIZE unset`, `hccl_buff_<MB>` allgather with `HCCL_BUFFSIZE=<MB>` (the
//! public report's naming); another series is an operation of that name. A point is one
//! sample (the mean over its `iters`).

use std::path::Path;

use super::workbook::UNRECORDED_CPU;
use super::{CellIndex, Dataset, SampleView};
use crate::format::cluster_health::Rejected;
use crate::format::run_dir::MatrixKind;
use crate::format::size_sweep::SweepFile;

/// (operation, setting) in chd's words.
fn operation(op: &str, setting: &str) -> (String, String) {
    let op_name = match op {
        "d2d_same_device" => "d2d",
        "hccl_all_gather" => "allgather",
        other => other,
    };
    if setting.is_empty() {
        if op == "hccl_default" {
            return ("allgather".into(), "HCCL_BUFFSIZE unset".into());
        }
        if let Some(mb) = op.strip_prefix("hccl_buff_") {
            return ("allgather".into(), format!("HCCL_BUFFSIZE={mb}"));
        }
        return (op_name.into(), "idle".into());
    }
    (op_name.into(), setting.into())
}

/// One dataset of every point of `files` (path, its file).
pub fn dataset(files: &[(&Path, SweepFile)]) -> Dataset {
    let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    let mut ds = Dataset {
        source: format!("size sweep {}", names.join(" + ")),
        ..Dataset::default()
    };
    let mut index = CellIndex::default();
    let mut cpus: Vec<u32> = Vec::new();
    for (path, file) in files {
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(note) = &file.note {
            ds.meta.push((format!("note ({name})"), note.clone()));
        }
        if let Some(first) = file.bad.first() {
            ds.rejected.push(Rejected {
                reason: format!("{name}: {}", first.why),
                count: file.bad.len(),
                first: format!("{name} {}", first.at),
            });
        }
        for p in &file.points {
            let (op, setting) = operation(&p.operation, &p.setting);
            let cpu = p.cpus.first().copied().unwrap_or(UNRECORDED_CPU);
            if cpu != UNRECORDED_CPU && !cpus.contains(&cpu) {
                cpus.push(cpu);
            }
            let device = p
                .device
                .map(|d| d.to_string())
                .unwrap_or_else(|| "not recorded".into());
            ds.add_sample(
                &mut index,
                &SampleView {
                    kind: MatrixKind::Sweep,
                    load: &setting,
                    cpu,
                    peer_cpu: None,
                    device: &device,
                    size_bytes: p.size_bytes,
                    direction: &op,
                    host_memory: "unspecified",
                    outcome: Ok(p.gbps * 1e9),
                },
            );
        }
    }
    let points: usize = files.iter().map(|(_, f)| f.points.len()).sum();
    ds.meta.push(("files".into(), names.join(", ")));
    ds.meta.push((
        "points".into(),
        format!("{points} (each the mean over its iterations: one sample)"),
    ));
    if let Some(summary) = crate::format::cluster_health::rejected_summary(&ds.rejected) {
        ds.meta.push(("rows not used".into(), summary));
    }
    ds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_series_name_the_operation_and_the_setting() {
        assert_eq!(
            operation("hccl_buff_32", ""),
            ("allgather".into(), "HCCL_BUFFSIZE=32".into())
        );
        assert_eq!(
            operation("hccl_default", ""),
            ("allgather".into(), "HCCL_BUFFSIZE unset".into())
        );
        assert_eq!(
            operation("d2d_same_device", ""),
            ("d2d".into(), "idle".into())
        );
        assert_eq!(
            operation("hccl_all_gather", "HCCL_BUFFSIZE=200"),
            ("allgather".into(), "HCCL_BUFFSIZE=200".into())
        );
    }
}
