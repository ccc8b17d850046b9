//! The cost model: simulated time a probe spends, so a benchmark can tell what a calling
//! pattern costs on real hardware without it. A pinned host allocation costs
//! `CHD_FAKE_PIN_MS_PER_MIB` milliseconds per MiB (real runtimes page-lock and map every page:
//! tens of milliseconds for hundreds of MiB), slept in wall time too under
//! `CHD_FAKE_PIN_SLEEP=1`; a timed copy costs its virtual duration (`bytes / GB/s` at the
//! `CHD_FAKE_H2D_GBPS` / `CHD_FAKE_SLOW_CPUS` / pair / staged rate it runs at). Both add up
//! in one process-wide counter (`chd_fake_simulated_ns`), next to the count of pinned
//! allocations ever made (`chd_fake_pinned_allocations_total`) and of copies whose host side
//! was pinned for another device only (`chd_fake_unportable_pinned_copies`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config;

static SIMULATED_NS: AtomicU64 = AtomicU64::new(0);
static PINNED_TOTAL: AtomicU64 = AtomicU64::new(0);
static UNPORTABLE_COPIES: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds a pinned allocation of `bytes` costs.
pub fn pin_ns(bytes: usize, ms_per_mib: f64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20) * ms_per_mib * 1e6
}

fn add_ns(ns: f64) {
    if ns.is_finite() && ns > 0.0 {
        SIMULATED_NS.fetch_add(ns.round() as u64, Ordering::Relaxed);
    }
}

/// A pinned allocation of `bytes` was made: count it, charge (and maybe sleep) its cost.
pub fn charge_pin(bytes: usize) {
    PINNED_TOTAL.fetch_add(1, Ordering::Relaxed);
    let cfg = config::get();
    let ns = pin_ns(bytes, cfg.pin_ms_per_mib);
    add_ns(ns);
    if cfg.pin_sleep && ns > 0.0 {
        std::thread::sleep(std::time::Duration::from_nanos(ns.round() as u64));
    }
}

/// A timed copy took `ns` of virtual time.
pub fn charge_copy(ns: f64) {
    add_ns(ns);
}

/// A copy's host side was pinned for another device only.
pub fn count_unportable_copy() {
    UNPORTABLE_COPIES.fetch_add(1, Ordering::Relaxed);
}

pub fn simulated_ns() -> u64 {
    SIMULATED_NS.load(Ordering::Relaxed)
}

pub fn pinned_total() -> u64 {
    PINNED_TOTAL.load(Ordering::Relaxed)
}

pub fn unportable_copies() -> u64 {
    UNPORTABLE_COPIES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::pin_ns;

    #[test]
    fn pinning_costs_per_mib() {
        assert_eq!(pin_ns(64 << 20, 0.25), 16e6);
        assert_eq!(pin_ns(1 << 19, 1.0), 0.5e6);
        assert_eq!(pin_ns(64 << 20, 0.0), 0.0);
    }
}
