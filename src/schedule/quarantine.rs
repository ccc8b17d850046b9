//! Quarantined devices, as the windows see them: a device whose copy cell's device work did
//! not finish within `probe.cell_timeout` (a failing link, a wedged device) keeps that work and
//! its memory in the backend's stuck work (`runtime::stuck_work`: never freed under a DMA that
//! may still run) and gets no cells until the work finishes. Every window starts by asking
//! the stuck work again (what finished is released, its devices answer again), skips the cells
//! of the devices still quarantined (and the peer pairs with one of them), and ends by
//! exporting the quarantined devices and the leaked bytes (`chd_device_quarantined`,
//! `chd_leaked_memory_bytes`). The scheduler names them in the verdict.
//!
//! The bookkeeping itself lives with the stuck work in the backend, so a one-shot probe and a
//! window see the same quarantine; this module is the windows' few hooks into it.

use super::metrics::ProbeMetrics;
use crate::runtime::Backend;

/// At a window's start: release the stuck work that finished, export what is left.
pub fn window_start(backend: &dyn Backend, metrics: &ProbeMetrics) {
    backend.recheck_stuck();
    export(backend, metrics);
}

/// Whether a cell of `device` is skipped: the device is quarantined.
pub fn skips(backend: &dyn Backend, device: &str) -> bool {
    backend.stuck().devices.contains(device)
}

/// Export the quarantined devices and the memory leaked under their work.
pub fn export(backend: &dyn Backend, metrics: &ProbeMetrics) {
    let stuck = backend.stuck();
    metrics.quarantine(&stuck.devices, (stuck.device_bytes, stuck.host_bytes));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::stuck_work::StuckReport;
    use crate::runtime::{CopyParams, DeviceInfo, ProbeError};
    use std::sync::Mutex;

    /// A backend whose stuck work is scripted; `recheck_stuck` releases device "1".
    struct Stuck(Mutex<StuckReport>);

    impl Backend for Stuck {
        fn name(&self) -> &'static str {
            "stuck"
        }
        fn devices(&self) -> &[DeviceInfo] {
            &[]
        }
        fn measure_copy(&self, _: &str, _: &CopyParams) -> Result<f64, ProbeError> {
            unreachable!()
        }
        fn stuck(&self) -> StuckReport {
            self.0.lock().unwrap().clone()
        }
        fn recheck_stuck(&self) {
            let mut r = self.0.lock().unwrap();
            r.devices.remove("1");
            r.device_bytes = 64;
            r.host_bytes = 0;
        }
    }

    #[test]
    fn quarantine_follows_the_stuck_work_and_is_exported() {
        let backend = Stuck(Mutex::new(StuckReport {
            devices: ["1".to_string(), "3".to_string()].into(),
            device_bytes: 128,
            host_bytes: 8,
        }));
        let metrics = ProbeMetrics::default();
        export(&backend, &metrics);
        assert!(skips(&backend, "1") && skips(&backend, "3") && !skips(&backend, "0"));
        let q = |d: &str| {
            metrics
                .quarantined
                .get(&crate::schedule::metrics::DeviceLabels { device: d.into() })
                .map(|g| g.get())
        };
        assert_eq!((q("1"), q("3"), q("0")), (Some(1), Some(1), None));
        window_start(&backend, &metrics);
        assert!(!skips(&backend, "1") && skips(&backend, "3"));
        assert_eq!((q("1"), q("3")), (None, Some(1)), "released: no series");
        let leaked = |m: &str| {
            metrics
                .leaked_memory
                .get_or_create(&crate::schedule::metrics::MemoryLabels { memory: m.into() })
                .get()
        };
        assert_eq!((leaked("device"), leaked("host")), (64, 0));
    }
}
