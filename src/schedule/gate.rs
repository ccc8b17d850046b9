//! The idle gate: is the node quiet enough to probe? Reads `/proc/stat` and chd's own
//! `/proc/self/stat` and computes the CPU utilization of everything except chd itself over an
//! interval, so chd's own probing never closes its own gate.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use procfs::process::Stat;
use procfs::{FromBufReadSI, FromRead};

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
