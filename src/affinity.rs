//! Binding the calling thread to exactly one CPU, reading the binding back, and restoring it.
//!
//! Everything here acts on the *calling thread* (`sched_{get,set}affinity` with pid 0), never
//! on the whole process. A [`Binding`] is therefore `!Send`: it must be dropped on the thread
//! it bound, which is also where it restores the previous mask. Probes bind dedicated
//! `std::thread`s, never a tokio pool thread (the mask would stick to the pooled thread after
//! the task ends); [`probe_bindable`] follows the same rule and spawns its own scan thread.
//!
//! Masks are nix's `CpuSet`, i.e. glibc's fixed 1024-bit `cpu_set_t`; CPU ids at or beyond
//! [`max_cpus`] cannot be named and are reported as a failed bind.

use std::marker::PhantomData;

use nix::errno::Errno;
use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, sched_yield, CpuSet};
use nix::unistd::Pid;

/// Why reading or changing the calling thread's CPU affinity failed.
#[derive(Debug, thiserror::Error)]
pub enum AffinityError {
    /// `sched_getaffinity` on the calling thread failed.
    #[error("reading the calling thread's cpu affinity failed: {0}")]
    Get(#[source] Errno),
    /// `sched_setaffinity` refused the one-CPU mask (EINVAL for a CPU outside the cpuset or
    /// offline; also returned for a CPU id beyond what a mask can hold).
    #[error("binding to cpu {cpu} failed: {source}")]
    Set {
        cpu: u32,
        #[source]
        source: Errno,
    },
    /// The syscall succeeded but the thread is not bound to exactly `{cpu}`: `got` is the
    /// mask read back, or (when the mask was right but `sched_getcpu` disagreed) the one CPU
    /// the thread actually ran on.
    #[error("binding to cpu {cpu} did not land: read back {got:?}")]
    NotLanded { cpu: u32, got: Vec<u32> },
    /// Putting the saved mask back failed; the thread may still be bound to `cpu`.
    #[error("restoring the affinity mask after binding to cpu {cpu} failed: {source}")]
    Restore {
        cpu: u32,
        #[source]
        source: Errno,
    },
}

/// Pin the calling thread to the set `cpus` (nothing for none), for good: threads it starts
/// afterwards inherit the mask (a fabric rail's streams, a rank process and its library's
/// threads).
pub fn pin_this_thread(cpus: &[u32]) -> nix::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c as usize)?;
    }
    // pid 0: the calling thread (sched_setaffinity(2)).
    sched_setaffinity(Pid::from_raw(0), &set)
}

/// How many CPU ids an affinity mask can name (1024 with glibc's `cpu_set_t`).
pub fn max_cpus() -> usize {
    CpuSet::count()
}

/// The CPU ids set in `set`, ascending.
fn cpus_of(set: &CpuSet) -> Vec<u32> {
    (0..CpuSet::count())
        .filter(|&i| set.is_set(i).unwrap_or(false))
        .filter_map(|i| u32::try_from(i).ok())
        .collect()
}

fn get_mask() -> Result<CpuSet, AffinityError> {
    sched_getaffinity(Pid::from_raw(0)).map_err(AffinityError::Get)
}

/// The calling thread's affinity mask as CPU ids, ascending.
pub fn current_cpus() -> Result<Vec<u32>, AffinityError> {
    Ok(cpus_of(&get_mask()?))
}

/// The calling thread bound to one CPU. Dropping it puts back the mask the thread had before
/// [`bind_exactly`] (a failure to do so is logged at `warn`); [`Binding::restore`] does the
/// same and reports the error instead. Not `Send`: the mask belongs to the thread that bound.
#[derive(Debug)]
#[must_use = "dropping the Binding restores the previous affinity mask immediately"]
pub struct Binding {
    cpu: u32,
    previous: CpuSet,
    restored: bool,
    /// Makes the type `!Send` and `!Sync`: restoring acts on the dropping thread.
    _thread_bound: PhantomData<*const ()>,
}

impl Binding {
    /// The CPU the thread is bound to.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// The mask that will be restored, as CPU ids, ascending.
    pub fn previous_cpus(&self) -> Vec<u32> {
        cpus_of(&self.previous)
    }

    /// Restore the previous mask now, reporting a failure instead of logging it.
    pub fn restore(mut self) -> Result<(), AffinityError> {
        self.restore_inner()
    }

    fn restore_inner(&mut self) -> Result<(), AffinityError> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        sched_setaffinity(Pid::from_raw(0), &self.previous).map_err(|source| {
            AffinityError::Restore {
                cpu: self.cpu,
                source,
            }
        })
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        if let Err(e) = self.restore_inner() {
            tracing::warn!(cpu = self.cpu, error = %e, "could not restore the affinity mask");
        }
    }
}

/// The CPU the calling thread is running on right now.
fn running_cpu() -> Option<u32> {
    sched_getcpu().ok().and_then(|c| u32::try_from(c).ok())
}

/// Bind the calling thread to exactly `cpu`, verify it by reading the mask back and by
/// `sched_getcpu`, and return a guard that restores the previous mask. On any failure the
/// previous mask is already restored when the error is returned.
pub fn bind_exactly(cpu: u32) -> Result<Binding, AffinityError> {
    let previous = get_mask()?;
    let mut want = CpuSet::new();
    let idx = usize::try_from(cpu).map_err(|_| AffinityError::Set {
        cpu,
        source: Errno::EINVAL,
    })?;
    want.set(idx)
        .map_err(|source| AffinityError::Set { cpu, source })?;
    // Guard first, so every error path below restores `previous` on drop.
    let mut binding = Binding {
        cpu,
        previous,
        restored: false,
        _thread_bound: PhantomData,
    };
    if let Err(source) = sched_setaffinity(Pid::from_raw(0), &want) {
        // Nothing changed; no need to restore.
        binding.restored = true;
        return Err(AffinityError::Set { cpu, source });
    }
    let got = cpus_of(&get_mask()?);
    if got != [cpu] {
        return Err(AffinityError::NotLanded { cpu, got });
    }
    // The kernel migrates the caller before sched_setaffinity returns; give the scheduler one
    // chance if it has not yet.
    let mut on = running_cpu();
    if on != Some(cpu) {
        let _ = sched_yield();
        on = running_cpu();
    }
    if on != Some(cpu) {
        return Err(AffinityError::NotLanded {
            cpu,
            got: on.into_iter().collect(),
        });
    }
    Ok(binding)
}

/// For each CPU in `cpus`, whether a thread can be bound to exactly it. The scan runs on a
/// freshly spawned thread that restores its mask after each CPU and ends after the scan, so
/// the caller's thread is never bound. Results are in input order. If the scan thread cannot
/// be spawned or panics, every CPU is reported as not bindable (and a warning is logged).
pub fn probe_bindable(cpus: &[u32]) -> Vec<(u32, bool)> {
    let list = cpus.to_vec();
    let scan = std::thread::Builder::new()
        .name("chd-affinity-scan".into())
        .spawn(move || {
            list.into_iter()
                .map(|cpu| match bind_exactly(cpu) {
                    Ok(binding) => match binding.restore() {
                        Ok(()) => (cpu, true),
                        Err(e) => {
                            tracing::warn!(cpu, error = %e, "affinity scan could not restore");
                            (cpu, true)
                        }
                    },
                    Err(e) => {
                        tracing::debug!(cpu, error = %e, "cpu not bindable");
                        (cpu, false)
                    }
                })
                .collect::<Vec<_>>()
        });
    let joined = match scan {
        Ok(handle) => handle
            .join()
            .map_err(|_| "scan thread panicked".to_string()),
        Err(e) => Err(format!("cannot spawn scan thread: {e}")),
    };
    match joined {
        Ok(results) => results,
        Err(why) => {
            tracing::warn!(reason = %why, "affinity scan failed");
            cpus.iter().map(|&c| (c, false)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `f` on a fresh thread so a failing test cannot leave the test harness thread bound.
    fn on_fresh_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("test thread panicked")
    }

    #[test]
    fn current_cpus_is_ascending_and_nonempty() {
        let cpus = current_cpus().expect("getaffinity");
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn binds_to_each_allowed_cpu_and_reads_back() {
        on_fresh_thread(|| {
            let before = current_cpus().unwrap();
            for &cpu in &before {
                let b = bind_exactly(cpu).unwrap_or_else(|e| panic!("bind {cpu}: {e}"));
                assert_eq!(b.cpu(), cpu);
                assert_eq!(current_cpus().unwrap(), vec![cpu]);
                assert_eq!(running_cpu(), Some(cpu));
                assert_eq!(b.previous_cpus(), before);
                drop(b);
                assert_eq!(current_cpus().unwrap(), before);
            }
        });
    }

    #[test]
    fn binding_outside_the_mask_fails_and_restores() {
        on_fresh_thread(|| {
            let before = current_cpus().unwrap();
            let max = *before.last().unwrap();
            for cpu in [max + 1, 1023, 1024, u32::MAX] {
                if before.contains(&cpu) {
                    continue;
                }
                let err = bind_exactly(cpu).expect_err("bind outside the mask must fail");
                assert!(err.to_string().contains(&cpu.to_string()), "{err}");
                assert!(
                    matches!(
                        err,
                        AffinityError::Set { cpu: c, .. } | AffinityError::NotLanded { cpu: c, .. }
                            if c == cpu
                    ),
                    "{err:?}"
                );
                assert_eq!(current_cpus().unwrap(), before);
            }
        });
    }

    #[test]
    fn drop_and_restore_put_back_the_exact_mask() {
        on_fresh_thread(|| {
            let all = current_cpus().unwrap();
            // Start from a narrowed, non-trivial mask when there is room for one, so restoring
            // "everything" by accident would be caught.
            let start: Vec<u32> = if all.len() > 2 {
                all[..all.len() - 1].to_vec()
            } else {
                all.clone()
            };
            let mut set = CpuSet::new();
            for &c in &start {
                set.set(c as usize).unwrap();
            }
            sched_setaffinity(Pid::from_raw(0), &set).unwrap();
            let target = *start.last().unwrap();

            let b = bind_exactly(target).unwrap();
            assert_eq!(current_cpus().unwrap(), vec![target]);
            drop(b);
            assert_eq!(current_cpus().unwrap(), start);

            let b = bind_exactly(start[0]).unwrap();
            b.restore().unwrap();
            assert_eq!(current_cpus().unwrap(), start);
        });
    }

    #[test]
    fn probe_bindable_reports_in_order_and_leaves_caller_alone() {
        let before = current_cpus().unwrap();
        let mut ask: Vec<u32> = before.iter().rev().copied().collect();
        ask.push(1023);
        ask.push(before.last().unwrap() + 1);
        let got = probe_bindable(&ask);
        assert_eq!(current_cpus().unwrap(), before);
        assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), ask);
        for (cpu, ok) in got {
            assert_eq!(ok, before.contains(&cpu), "cpu {cpu}");
        }
        assert!(probe_bindable(&[]).is_empty());
    }

    #[test]
    fn a_bound_thread_reads_back_its_cpus() {
        let allowed = current_cpus().unwrap();
        let one = vec![allowed[allowed.len() - 1]];
        let got = std::thread::spawn({
            let one = one.clone();
            move || {
                pin_this_thread(&one).unwrap();
                current_cpus().unwrap()
            }
        })
        .join()
        .unwrap();
        assert_eq!(got, one);
        assert_eq!(
            current_cpus().unwrap(),
            allowed,
            "only the spawned thread moved"
        );
    }
}
