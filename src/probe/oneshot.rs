//! One-shot measurement of a list of copy cells (`chd probe h2d`): each cell is measured
//! `samples` times, every pass in a fresh random order (so an order artefact cannot repeat),
//! on a dedicated thread that binds to each cell's CPU; a cell's value is the median of its
//! samples. Progress is reported through a callback.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use serde::Serialize;

use crate::runtime::{Backend, CopyParams, HostMemory};
use crate::stats;
use crate::store::CellKey;
use crate::topology::Topology;

/// What to measure.
#[derive(Debug, Clone)]
pub struct OneShotSpec {
    pub cells: Vec<CellKey>,
    pub host_memories: Vec<HostMemory>,
    pub warmup: u32,
    pub iterations: u32,
    pub samples: usize,
}

/// One measured cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub cpu: u32,
    pub numa_node: Option<u32>,
    pub device: String,
    pub size_bytes: u64,
    pub direction: &'static str,
    pub host_memory: &'static str,
    /// Median of the successful samples, bytes per second.
    pub bytes_per_second: Option<f64>,
    pub samples: usize,
    /// The last error, when a sample failed.
    pub error: Option<String>,
}

/// A cell's successful values and its last error.
type Samples = (Vec<f64>, Option<String>);

/// Measure every cell of `spec` on a dedicated thread; `progress(done, total)` after each
/// measurement.
pub fn run(
    backend: &dyn Backend,
    topology: &Topology,
    spec: &OneShotSpec,
    progress: &mut (dyn FnMut(usize, usize) + Send),
) -> Vec<Row> {
    let mut cells: Vec<(CellKey, HostMemory)> = spec
        .cells
        .iter()
        .flat_map(|c| spec.host_memories.iter().map(move |m| (c.clone(), *m)))
        .collect();
    let total = cells.len() * spec.samples;
    let mut results: BTreeMap<(CellKey, &'static str), Samples> = BTreeMap::new();
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("chd-oneshot".into())
            .spawn_scoped(scope, || {
                let mut rng = rand::rng();
                let mut done = 0;
                for _ in 0..spec.samples {
                    cells.shuffle(&mut rng);
                    for (cell, memory) in &cells {
                        let params = CopyParams {
                            size_bytes: cell.size_bytes,
                            direction: cell.direction,
                            warmup: spec.warmup,
                            iterations: spec.iterations,
                            host_memory: *memory,
                        };
                        let outcome = super::h2d::measure_cell(
                            backend,
                            cell,
                            params.warmup,
                            params.iterations,
                            params.host_memory,
                        );
                        let entry = results.entry((cell.clone(), memory.as_str())).or_default();
                        match outcome {
                            Ok(v) => entry.0.push(v),
                            Err(e) => entry.1 = Some(e.to_string()),
                        }
                        done += 1;
                        progress(done, total);
                    }
                }
            });
        match handle {
            Ok(h) => {
                if h.join().is_err() {
                    tracing::error!("the probe thread panicked");
                }
            }
            Err(e) => tracing::error!("cannot start the probe thread: {e}"),
        }
    });
    results
        .into_iter()
        .map(|((cell, memory), (values, error))| Row {
            cpu: cell.cpu,
            numa_node: topology.cpu(cell.cpu).and_then(|c| c.numa_node),
            device: cell.device,
            size_bytes: cell.size_bytes,
            direction: cell.direction.as_str(),
            host_memory: memory,
            bytes_per_second: stats::median(&values),
            samples: values.len(),
            error,
        })
        .collect()
}

/// CSV with a header; bandwidth in bytes per second, empty when no sample succeeded.
pub fn to_csv(rows: &[Row]) -> String {
    let mut out = String::from(
        "cpu,numa_node,device,size_bytes,direction,host_memory,bytes_per_second,samples,error\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r.cpu,
            r.numa_node.map(|n| n.to_string()).unwrap_or_default(),
            r.device,
            r.size_bytes,
            r.direction,
            r.host_memory,
            r.bytes_per_second
                .map(|v| format!("{v:.0}"))
                .unwrap_or_default(),
            r.samples,
            r.error
                .as_deref()
                .map(|e| format!("\"{}\"", e.replace('"', "'")))
                .unwrap_or_default(),
        ));
    }
    out
}

/// A human table: one line per cell, decimal GB/s.
pub fn to_table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:>5} {:>4} {:>7} {:>9} {:>4} {:>8} {:>9}  {}\n",
        "cpu", "numa", "device", "size_MiB", "dir", "memory", "GB/s", "note"
    );
    for r in rows {
        let gbps = r
            .bytes_per_second
            .map(|v| format!("{:.2}", v / 1e9))
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{:>5} {:>4} {:>7} {:>9} {:>4} {:>8} {:>9}  {}\n",
            r.cpu,
            r.numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            r.device,
            r.size_bytes >> 20,
            r.direction,
            r.host_memory,
            gbps,
            r.error.as_deref().unwrap_or("")
        ));
    }
    out
}
