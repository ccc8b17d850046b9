//! In-process pair probes over the fake runtime, for tests that read the fake's hooks
//! (live communicators, enabled peer access) in the same process as chd's probe.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chd::runtime::pair::{CommState, Holdings, PairParams, PairProbe};
use chd::runtime::select::{self, BackendChoice, CollectiveChoice, RuntimeConfig};
use chd::topology::{Roots, Topology};

use crate::fake;

/// The fake reads its environment once per process: set `vars` before anything loads it,
/// and take the process-wide lock (the fake's counters are global).
pub fn setup(vars: &[(&str, &str)]) -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    fake::fake_runtime_with(vars);
    guard
}

/// A pair probe: backend `cuda` or `acl`, collective `nccl`, `hccl` or `copy`.
pub fn probe(backend: &str, collective: &str) -> Arc<dyn PairProbe> {
    let lib = fake::fake_runtime().clone();
    let cfg = RuntimeConfig {
        backend: backend.parse::<BackendChoice>().unwrap(),
        cuda_runtime: Some(lib.clone()),
        acl_runtime: Some(lib.clone()),
        nvml: Some(lib.clone()),
        collective: collective.parse::<CollectiveChoice>().unwrap(),
        nccl: Some(lib.clone()),
        hccl: Some(lib),
        ..RuntimeConfig::default()
    };
    let roots = Roots::default();
    let topology = Topology::read(&roots).unwrap();
    let opened = select::open(&cfg, &roots, &topology).unwrap();
    select::open_pair_probe(&cfg, &opened).unwrap().0
}

/// One of the fake's `uint64_t hook(void)` counters.
pub fn hook(symbol: &str) -> u64 {
    // SAFETY: the fake exports these hooks as `extern "C" fn() -> u64`.
    unsafe {
        let l = libloading::Library::new(fake::fake_runtime()).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            l.get(symbol.as_bytes()).unwrap();
        f()
    }
}

/// Two CPUs this process may use (the same one twice on a one-CPU machine).
pub fn cpus() -> [u32; 2] {
    let t = Topology::read(&Roots::default()).unwrap();
    let ids: Vec<u32> = t.allowed_cpus().map(|c| c.id).collect();
    [ids[0], *ids.get(1).unwrap_or(&ids[0])]
}

pub fn params(timeout: Duration) -> PairParams {
    PairParams {
        bytes_per_rank: 4 << 20,
        warmup: 1,
        iterations: 2,
        timeout,
    }
}

/// Communicators the probe counts in `state`.
pub fn held(h: &Holdings, state: CommState) -> usize {
    h.communicators
        .iter()
        .find(|(s, _)| *s == state)
        .map_or(0, |(_, n)| *n)
}

/// Poll `f` until it holds or `limit` passes.
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + limit;
    while !f() {
        assert!(
            std::time::Instant::now() < until,
            "not within {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
