//! CPU burner threads for the `cpu:N` load profile. Each thread streams a STREAM-style triad
//! (`a = b + s * c`) over three arrays larger than a core's cache share, so it pulls memory
//! bandwidth the way a data loader does, and after every chunk runs a multiply-add polynomial
//! over the freshly written data in registers, so it also keeps the FP units busy (not a hash
//! loop). Work is done in chunks of a few hundred microseconds; between chunks a thread checks
//! the stop flag and, when floating, moves off the CPU the probe is using.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use super::LoadError;
use crate::affinity;

/// f64 words per array: 3 arrays x 8 MiB per thread.
const WORDS: usize = 1 << 20;
/// Words per chunk (256 KiB per array).
const CHUNK: usize = 32 * 1024;

/// Where one burner runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Bound to exactly this CPU.
    Pinned(u32),
    /// Free over these CPUs, minus the one being probed.
    Floating(Vec<u32>),
}

/// Choose placements: `pin` if given (round-robin), else the allowed CPUs that are not probed
/// (round-robin), else every allowed CPU minus the probed one at any moment.
pub fn placements(
    threads: usize,
    pin: Option<&[u32]>,
    allowed: &[u32],
    probed: &[u32],
) -> Vec<Placement> {
    let free: Vec<u32> = match pin {
        Some(list) => list.to_vec(),
        None => allowed
            .iter()
            .copied()
            .filter(|c| !probed.contains(c))
            .collect(),
    };
    (0..threads)
        .map(|i| {
            if free.is_empty() {
                Placement::Floating(allowed.to_vec())
            } else {
                Placement::Pinned(free[i % free.len()])
            }
        })
        .collect()
}

/// Running burner threads; stop them with [`Burners::stop`] (or drop).
pub struct Burners {
    stop: Arc<AtomicBool>,
    avoid: Arc<AtomicI64>,
    chunks: Arc<AtomicU64>,
    handles: Vec<JoinHandle<()>>,
    placements: Vec<Placement>,
}

impl Burners {
    /// Start one thread per placement.
    pub fn start(placements: Vec<Placement>) -> Result<Burners, LoadError> {
        let mut burners = Burners {
            stop: Arc::new(AtomicBool::new(false)),
            avoid: Arc::new(AtomicI64::new(-1)),
            chunks: Arc::new(AtomicU64::new(0)),
            handles: Vec::new(),
            placements: placements.clone(),
        };
        for (i, placement) in placements.into_iter().enumerate() {
            let stop = burners.stop.clone();
            let avoid = burners.avoid.clone();
            let chunks = burners.chunks.clone();
            let handle = std::thread::Builder::new()
                .name(format!("chd-burn-{i}"))
                .spawn(move || burn(placement, &stop, &avoid, &chunks))
                .map_err(LoadError::Spawn)?;
            burners.handles.push(handle);
        }
        Ok(burners)
    }

    /// Tell floating burners which CPU the probe is about to use.
    pub fn avoid(&self, cpu: u32) {
        self.avoid.store(i64::from(cpu), Ordering::Relaxed);
    }

    /// Chunks of work done so far, over all threads.
    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Relaxed)
    }

    /// Where the threads run, for logs: `pinned to 2,3` or `floating over 0-3`.
    pub fn describe(&self) -> String {
        let pinned: Vec<u32> = self
            .placements
            .iter()
            .filter_map(|p| match p {
                Placement::Pinned(c) => Some(*c),
                Placement::Floating(_) => None,
            })
            .collect();
        let floating = self.placements.len() - pinned.len();
        let mut parts = Vec::new();
        if !pinned.is_empty() {
            let mut ids = pinned.clone();
            ids.sort_unstable();
            ids.dedup();
            parts.push(format!(
                "{} pinned to CPUs {}",
                pinned.len(),
                crate::topology::cpulist::format(&ids)
            ));
        }
        if floating > 0 {
            parts.push(format!(
                "{floating} floating over the allowed CPUs except the one being probed"
            ));
        }
        format!(
            "{} burner threads: {}",
            self.placements.len(),
            parts.join(", ")
        )
    }

    /// Stop and join every thread; returns the chunks of work done.
    pub fn stop(mut self) -> u64 {
        self.shutdown();
        self.chunks()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for handle in self.handles.drain(..) {
            if handle.join().is_err() {
                tracing::warn!("a load thread panicked");
            }
        }
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn set_mask(cpus: &[u32], except: Option<u32>) {
    let mut set = CpuSet::new();
    let mut any = false;
    for &c in cpus {
        if Some(c) != except && set.set(c as usize).is_ok() {
            any = true;
        }
    }
    if any {
        if let Err(e) = sched_setaffinity(Pid::from_raw(0), &set) {
            tracing::debug!("load thread could not change its mask: {e}");
        }
    }
}

fn burn(placement: Placement, stop: &AtomicBool, avoid: &AtomicI64, chunks: &AtomicU64) {
    let _binding = match &placement {
        Placement::Pinned(cpu) => match affinity::bind_exactly(*cpu) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!("load thread runs unpinned: {e}");
                None
            }
        },
        Placement::Floating(cpus) => {
            set_mask(cpus, None);
            None
        }
    };
    // First-touched here, after binding: the arrays live on this thread's NUMA node.
    let mut a = vec![0.0f64; WORDS];
    let b: Vec<f64> = (0..WORDS).map(|i| (i % 1024) as f64 * 1e-3).collect();
    let c: Vec<f64> = (0..WORDS).map(|i| 1.0 + (i % 7) as f64 * 1e-4).collect();
    let mut avoiding = -1i64;
    let mut scale = 1.000_001f64;
    let mut offset = 0usize;
    while !stop.load(Ordering::Relaxed) {
        if let Placement::Floating(cpus) = &placement {
            let want = avoid.load(Ordering::Relaxed);
            if want != avoiding {
                avoiding = want;
                set_mask(cpus, u32::try_from(want).ok());
            }
        }
        let end = offset + CHUNK;
        // Memory: the triad streams 3 x 256 KiB.
        for ((x, y), z) in a[offset..end]
            .iter_mut()
            .zip(&b[offset..end])
            .zip(&c[offset..end])
        {
            *x = y + scale * z;
        }
        // Compute: a multiply-add polynomial per element, eight independent lanes.
        let mut acc = [0.0f64; 8];
        for block in a[offset..end].chunks_exact(8) {
            for (lane, &x) in acc.iter_mut().zip(block) {
                *lane = (((*lane * x + 0.5) * x + 0.25) * x + 0.125) * 0.5;
            }
        }
        scale = 1.0 + std::hint::black_box(acc.iter().sum::<f64>()).fract() * 1e-6;
        offset = if end >= WORDS { 0 } else { end };
        chunks.fetch_add(1, Ordering::Relaxed);
    }
    std::hint::black_box(&a);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burners_avoid_probed_cpus_when_they_can() {
        let p = placements(3, None, &[0, 1, 2, 3], &[0, 1]);
        assert_eq!(
            p,
            vec![
                Placement::Pinned(2),
                Placement::Pinned(3),
                Placement::Pinned(2)
            ]
        );
        let p = placements(2, None, &[0, 1], &[0, 1]);
        assert_eq!(p, vec![Placement::Floating(vec![0, 1]); 2]);
        let p = placements(2, Some(&[1]), &[0, 1], &[0, 1]);
        assert_eq!(p, vec![Placement::Pinned(1); 2]);
    }

    #[test]
    fn burners_do_work_and_stop() {
        let allowed = affinity::current_cpus().unwrap();
        let burners = Burners::start(placements(1, None, &allowed, &allowed)).unwrap();
        burners.avoid(allowed[0]);
        let start = std::time::Instant::now();
        while burners.chunks() < 3 && start.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let done = burners.stop();
        assert!(done >= 3, "only {done} chunks in 20 s");
    }
}
