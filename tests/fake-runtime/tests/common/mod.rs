//! Shared helpers for the integration tests: each test binary is its own process, so each
//! sets its `CHD_FAKE_*` environment once, before the first call into the fake runtime reads
//! it, and serializes its tests because the counters and registries are process-global.

#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

use std::sync::{Mutex, MutexGuard, Once};

/// Sets `vars` (once per process) and takes the process-wide test lock.
pub fn setup(vars: &[(&str, &str)]) -> MutexGuard<'static, ()> {
    static ENV: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    ENV.call_once(|| {
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
    });
    guard
}

/// Expected milliseconds for `bytes` at `gbps` GB/s.
pub fn expected_ms(bytes: usize, gbps: f64) -> f64 {
    bytes as f64 / (gbps * 1e9) * 1e3
}

/// Asserts `got` is within 1% of `want`.
pub fn assert_close(got: f32, want: f64) {
    let rel = (f64::from(got) - want).abs() / want;
    assert!(
        rel < 0.01,
        "got {got} ms, want {want} ms (off by {:.3}%)",
        rel * 100.0
    );
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
