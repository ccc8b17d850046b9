//! The idle gate: is the node quiet enough to probe? Reads `/proc/stat` and chd's own
//! `/proc/self/stat` and computes the CPU utilization of everything except chd itself over an
//! interval, so chd's own probing never closes its own gate; and asks the device telemetry
//! whether any device is busy.
//!
//! The gate fails closed: an input it cannot read ([`Closed::Unreadable`]) keeps it shut
//! exactly like a busy node, since probing through a training job is what it exists to
//! prevent.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use procfs::process::Stat;
use procfs::{FromBufReadSI, FromRead};

use crate::runtime::telemetry::DeviceTelemetry;

/// Why the gate is shut.
#[derive(Debug, Clone, PartialEq)]
pub enum Closed {
    /// Others' CPU utilization is above the threshold.
    CpuBusy,
    /// This device is above its threshold or runs someone else's process.
    DeviceBusy(String),
    /// An input of the gate could not be read: why.
    Unreadable(String),
}

impl Closed {
    /// The `outcome` of `chd_idle_windows_total` for a tick the gate kept shut.
    pub fn outcome(&self) -> &'static str {
        match self {
            Closed::CpuBusy => "cpu_busy",
            Closed::DeviceBusy(_) => "device_busy",
            Closed::Unreadable(_) => "gate_error",
        }
    }
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::CpuBusy => f.write_str("CPUs busy"),
            Closed::DeviceBusy(device) => write!(f, "device {device} busy"),
            Closed::Unreadable(why) => write!(f, "idle gate input unreadable: {why}"),
        }
    }
}

/// The device half of the gate: shut when a device is busy, or when the telemetry cannot say
/// whether one is (its utilization, or its process list, where the source reads them, could
/// not be read). A backend without any telemetry source (`none`: the host backend, or CUDA
/// without NVML, which `chd serve` says at start) has no device half, and a source without a
/// query (ACL before CANN 7 has no utilization) is judged on what it does read. A device the
/// source reports lost (fallen off the bus) runs nothing, so it neither shuts the gate nor
/// counts as unreadable: the other devices go on being measured while its cells fail.
pub fn check_devices(telemetry: &dyn DeviceTelemetry, threshold: f64) -> Result<(), Closed> {
    let mut samples = telemetry.sample();
    samples.retain(|s| {
        if s.lost {
            tracing::debug!(device = %s.device, source = telemetry.source(), "device lost: not gated; its cells fail until it is back");
        }
        !s.lost
    });
    if let Some(unread) = samples.iter().find(|s| {
        (telemetry.reports_utilization() && s.utilization.is_none())
            || (telemetry.reports_processes() && s.foreign_processes.is_none())
    }) {
        let what = if telemetry.reports_utilization() && unread.utilization.is_none() {
            "utilization"
        } else {
            "compute processes"
        };
        return Err(Closed::Unreadable(format!(
            "device {}: {} {what} could not be read",
            unread.device,
            telemetry.source()
        )));
    }
    match samples.into_iter().find(|s| s.is_busy(threshold)) {
        Some(busy) => Err(Closed::DeviceBusy(busy.device)),
        None => Ok(()),
    }
}

/// Cumulative CPU time counters, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// All CPUs' time, every state.
    pub total: u64,
    /// All CPUs' non-idle time.
    pub busy: u64,
    /// This process's user + system time.
    pub own: u64,
}

/// Why the gate could not read the counters.
#[derive(Debug, thiserror::Error)]
#[error("cannot read CPU times from {path}: {detail}")]
pub struct GateError {
    pub path: PathBuf,
    pub detail: String,
}

/// Reads CPU times under a procfs root.
#[derive(Debug, Clone)]
pub struct CpuGate {
    procfs: PathBuf,
    threshold: f64,
}

impl CpuGate {
    /// A gate that closes when others' utilization exceeds `threshold` (0..1; 1 = never).
    pub fn new(procfs: &Path, threshold: f64) -> CpuGate {
        CpuGate {
            procfs: procfs.to_path_buf(),
            threshold,
        }
    }

    /// Read the counters now.
    pub fn sample(&self) -> Result<CpuTimes, GateError> {
        let stat_path = self.procfs.join("stat");
        let err = |path: &Path, detail: String| GateError {
            path: path.to_path_buf(),
            detail,
        };
        let file = File::open(&stat_path).map_err(|e| err(&stat_path, e.to_string()))?;
        let stats =
            procfs::KernelStats::from_buf_read(BufReader::new(file), procfs::current_system_info())
                .map_err(|e| err(&stat_path, e.to_string()))?;
        let t = &stats.total;
        // guest time is already included in user time. Counters that do not fit a u64
        // summed are corrupt, not a reading (a panic in debug builds, garbage in release).
        let sum = |counters: &[u64]| {
            counters
                .iter()
                .try_fold(0u64, |sum, &c| sum.checked_add(c))
                .ok_or_else(|| err(&stat_path, "CPU time counters overflow 64 bits".into()))
        };
        let idle = sum(&[t.idle, t.iowait.unwrap_or(0)])?;
        let total = sum(&[
            t.user,
            t.nice,
            t.system,
            t.idle,
            t.iowait.unwrap_or(0),
            t.irq.unwrap_or(0),
            t.softirq.unwrap_or(0),
            t.steal.unwrap_or(0),
        ])?;
        let self_stat = self.procfs.join("self/stat");
        let own = Stat::from_file(&self_stat)
            .map_err(|e| err(&self_stat, e.to_string()))
            .and_then(|s| {
                s.utime
                    .checked_add(s.stime)
                    .ok_or_else(|| err(&self_stat, "utime + stime overflow 64 bits".into()))
            })?;
        Ok(CpuTimes {
            total,
            busy: total.saturating_sub(idle),
            own,
        })
    }

    /// Whether others' utilization between two samples keeps the gate open. No elapsed
    /// time (or a frozen fixture) reads as idle.
    pub fn is_open(&self, before: &CpuTimes, after: &CpuTimes) -> bool {
        match others_utilization(before, after) {
            Some(u) => self.threshold >= 1.0 || u <= self.threshold,
            None => true,
        }
    }

    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    /// The CPU half of the gate at a tick: `now`'s reading against `previous` (`None` when
    /// that one could not be read). `first`: the first tick after start, which probes
    /// whatever the load (there is no interval to measure yet) but still needs a reading.
    /// A threshold of 1 disables the CPU half, and with it the need for its inputs.
    pub fn check(
        &self,
        first: bool,
        previous: Option<&CpuTimes>,
        now: &Result<CpuTimes, GateError>,
    ) -> Result<(), Closed> {
        if self.threshold >= 1.0 {
            return Ok(());
        }
        let now = now
            .as_ref()
            .map_err(|e| Closed::Unreadable(e.to_string()))?;
        if first {
            return Ok(());
        }
        let Some(previous) = previous else {
            return Err(Closed::Unreadable(
                "no earlier CPU reading to measure the interval from (the last one failed)".into(),
            ));
        };
        if self.is_open(previous, now) {
            Ok(())
        } else {
            Err(Closed::CpuBusy)
        }
    }
}

/// Utilization (0..1) of all CPUs by everything but this process between two samples.
pub fn others_utilization(before: &CpuTimes, after: &CpuTimes) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    if total == 0 {
        return None;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own);
    Some((busy.saturating_sub(own) as f64 / total as f64).clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::telemetry::DeviceSample;

    struct Telemetry {
        processes: bool,
        samples: Vec<DeviceSample>,
    }

    impl DeviceTelemetry for Telemetry {
        fn source(&self) -> &'static str {
            "nvml"
        }
        fn sample(&self) -> Vec<DeviceSample> {
            self.samples.clone()
        }
        fn reports_processes(&self) -> bool {
            self.processes
        }
    }

    fn device(id: &str, utilization: Option<f64>, processes: Option<u32>) -> DeviceSample {
        DeviceSample {
            device: id.into(),
            utilization,
            memory_used_bytes: None,
            foreign_processes: processes,
            lost: false,
            unseen_pids: Vec::new(),
        }
    }

    #[test]
    fn a_lost_device_neither_shuts_the_gate_nor_hides_a_busy_one() {
        let gate = |samples| {
            check_devices(
                &Telemetry {
                    processes: true,
                    samples,
                },
                0.1,
            )
        };
        let lost = DeviceSample {
            lost: true,
            ..device("1", None, None)
        };
        assert_eq!(
            gate(vec![device("0", Some(0.0), Some(0)), lost.clone()]),
            Ok(())
        );
        assert_eq!(
            gate(vec![lost, device("2", Some(0.9), Some(0))]),
            Err(Closed::DeviceBusy("2".into()))
        );
    }

    #[test]
    fn unreadable_device_inputs_shut_the_gate() {
        let gate = |processes, samples| check_devices(&Telemetry { processes, samples }, 0.1);
        assert_eq!(gate(true, vec![device("0", Some(0.0), Some(0))]), Ok(()));
        assert_eq!(
            gate(
                true,
                vec![
                    device("0", Some(0.0), Some(0)),
                    device("1", Some(0.5), Some(0))
                ]
            ),
            Err(Closed::DeviceBusy("1".into()))
        );
        let unread = gate(
            true,
            vec![device("0", Some(0.0), Some(0)), device("1", None, Some(0))],
        );
        assert_eq!(
            unread,
            Err(Closed::Unreadable(
                "device 1: nvml utilization could not be read".into()
            ))
        );
        assert_eq!(unread.unwrap_err().outcome(), "gate_error");
        // A busy device does not hide an unreadable one: the reason is the unreadable input.
        let both = gate(
            true,
            vec![device("0", Some(0.9), Some(0)), device("1", None, None)],
        );
        assert!(matches!(both, Err(Closed::Unreadable(_))));
        assert!(matches!(
            gate(true, vec![device("0", Some(0.0), None)]),
            Err(Closed::Unreadable(why)) if why.contains("compute processes")
        ));
        // A source that never reports processes (ACL) is judged on utilization alone.
        assert_eq!(gate(false, vec![device("0", Some(0.0), None)]), Ok(()));
        // No device to see: nothing to shut the gate for.
        assert_eq!(gate(true, vec![]), Ok(()));
    }

    #[test]
    fn unreadable_cpu_counters_shut_the_gate() {
        let gate = CpuGate::new(Path::new("/nonexistent"), 0.5);
        let failed = gate.sample();
        let Err(e) = &failed else {
            panic!("read /nonexistent/stat")
        };
        assert!(e.to_string().contains("/nonexistent/stat"), "{e}");
        // Even the first tick, which ignores the load, needs a reading.
        assert!(matches!(
            gate.check(true, None, &failed),
            Err(Closed::Unreadable(why)) if why.contains("/nonexistent/stat")
        ));
        let a = CpuTimes {
            total: 100,
            busy: 0,
            own: 0,
        };
        let b = CpuTimes {
            total: 200,
            busy: 90,
            own: 0,
        };
        assert_eq!(gate.check(true, None, &Ok(a)), Ok(()));
        // After a failed reading there is no interval to judge: still shut.
        assert!(matches!(
            gate.check(false, None, &Ok(b)),
            Err(Closed::Unreadable(_))
        ));
        assert_eq!(gate.check(false, Some(&a), &Ok(b)), Err(Closed::CpuBusy));
        assert_eq!(gate.check(false, Some(&a), &Ok(a)), Ok(()));
        // Disabled (threshold 1): nothing to read, nothing to shut.
        let disabled = CpuGate::new(Path::new("/nonexistent"), 1.0);
        assert_eq!(disabled.check(false, None, &disabled.sample()), Ok(()));
    }

    #[test]
    fn garbage_proc_stat_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("stat"), "cpu  not numbers\n").unwrap();
        std::fs::copy("/proc/self/stat", dir.path().join("self/stat")).unwrap();
        let e = CpuGate::new(dir.path(), 0.5).sample().unwrap_err();
        assert_eq!(e.path, dir.path().join("stat"));
    }

    #[test]
    fn own_time_is_subtracted() {
        let a = CpuTimes {
            total: 1000,
            busy: 100,
            own: 10,
        };
        let b = CpuTimes {
            total: 1200,
            busy: 200,
            own: 90,
        };
        // 100 busy ticks of which 80 are ours: 20 / 200.
        assert_eq!(others_utilization(&a, &b), Some(0.1));
    }

    #[test]
    fn no_elapsed_time_reads_as_idle() {
        let a = CpuTimes {
            total: 5,
            busy: 5,
            own: 0,
        };
        let gate = CpuGate::new(Path::new("/proc"), 0.5);
        assert_eq!(others_utilization(&a, &a), None);
        assert!(gate.is_open(&a, &a));
    }

    #[test]
    fn threshold_closes_the_gate() {
        let a = CpuTimes {
            total: 0,
            busy: 0,
            own: 0,
        };
        let b = CpuTimes {
            total: 100,
            busy: 80,
            own: 0,
        };
        assert!(!CpuGate::new(Path::new("/proc"), 0.5).is_open(&a, &b));
        assert!(CpuGate::new(Path::new("/proc"), 1.0).is_open(&a, &b));
    }

    /// Counters whose sum does not fit a u64 (found by `fuzz/fuzz_targets/proc_stat.rs`)
    /// are an error naming the file, not an overflow.
    #[test]
    fn counters_that_overflow_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::copy("/proc/self/stat", dir.path().join("self/stat")).unwrap();
        let stat = "cpu  0 0 2111676608941400731 16335067464768150885\ncpu0 0 0 0 0\n\
                    intr 0\nctxt 0\nbtime 1\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n";
        std::fs::write(dir.path().join("stat"), stat).unwrap();
        let err = CpuGate::new(dir.path(), 0.5).sample().unwrap_err();
        assert_eq!(err.path, dir.path().join("stat"));
        assert!(err.to_string().contains("overflow"), "{err}");
    }

    #[test]
    fn reads_the_live_proc() {
        let gate = CpuGate::new(Path::new("/proc"), 0.5);
        let s = gate.sample().expect("live /proc/stat");
        assert!(s.total > 0 && s.busy <= s.total);
    }
}
