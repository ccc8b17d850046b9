//! The ordered peer copy cell of `chd probe p2p` (`Backend::measure_peer_copy`) in-process
//! against the fake runtime, CUDA and ACL: the rate of the ordered pair (`CHD_FAKE_P2P_GBPS`),
//! the method (`copy` over the link, `copy-staged` where CUDA stages a pair without peer
//! access), ACL's refusal of such a pair as an error naming it, and nothing left behind on any
//! path: device and pinned allocations, peer access enabled by the cell.

use crate::fake;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use chd::runtime::acl::AclBackend;
use chd::runtime::cuda::CudaBackend;
use chd::runtime::{Backend, DeviceCopyParams};

fn setup() -> (&'static Path, MutexGuard<'static, ()>) {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let lib = fake::fake_runtime_with(&[
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_PAIR_GBPS", "20"),
        ("CHD_FAKE_STAGED_GBPS", "4"),
        ("CHD_FAKE_P2P_GBPS", "3>1=5"),
        ("CHD_FAKE_NO_PEER", "0,3"),
        ("CHD_FAKE_FAIL_DEVICES", "2"),
        ("CHD_FAKE_FAIL_AFTER", "3"),
    ]);
    (lib, guard)
}

fn hook(symbol: &str) -> u64 {
    let (lib, _) = (fake::fake_runtime(), ());
    // SAFETY: the fake exports these hooks as `extern "C" fn() -> u64`.
    unsafe {
        let l = libloading::Library::new(lib).unwrap();
        let f: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            l.get(symbol.as_bytes()).unwrap();
        f()
    }
}

/// What the process holds in the fake: device and pinned allocations, peer access.
fn held() -> [u64; 3] {
    [
        hook("chd_fake_live_device_allocations"),
        hook("chd_fake_live_pinned_allocations"),
        hook("chd_fake_peer_access_enabled"),
    ]
}

const PARAMS: DeviceCopyParams = DeviceCopyParams {
    size_bytes: 4 << 20,
    warmup: 1,
    iterations: 3,
};

fn gbps(backend: &dyn Backend, src: &str, dst: &str) -> (f64, &'static str) {
    gbps_leaving(backend, src, dst, 0)
}

/// As [`gbps`], the cell leaving `directions` of peer access enabled (ACL: CANN enables it
/// per device and cannot say whether it already was, so chd never disables it).
fn gbps_leaving(
    backend: &dyn Backend,
    src: &str,
    dst: &str,
    directions: u64,
) -> (f64, &'static str) {
    let before = held();
    let got = backend.measure_peer_copy(src, dst, &PARAMS).unwrap();
    let want = [before[0], before[1], before[2] + directions];
    assert_eq!(held(), want, "{src}>{dst} left something behind");
    (got.bytes_per_second / 1e9, got.method)
}

fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() < 0.005 * want,
        "got {got} GB/s, want {want}"
    );
}

#[test]
fn cuda_peer_copies_are_ordered_and_staged_where_refused() {
    alone!(cuda_peer_copies_are_ordered_and_staged_where_refused);
    let (lib, _g) = setup();
    let backend = CudaBackend::open(Some(lib), Path::new("/sys")).unwrap();
    let (rate, method) = gbps(&backend, "0", "1");
    close(rate, 20.0);
    assert_eq!(method, "copy");
    // The slow ordered pair; its reverse is not slow.
    close(gbps(&backend, "3", "1").0, 5.0);
    close(gbps(&backend, "1", "3").0, 20.0);
    // No peer access between 0 and 3: CUDA stages it, and says so.
    let (rate, method) = gbps(&backend, "3", "0");
    close(rate, 4.0);
    assert_eq!(method, "copy-staged");
    // A device failing in the middle of the timed copies costs the cell, nothing is left.
    let before = held();
    let err = backend.measure_peer_copy("1", "2", &PARAMS).unwrap_err();
    assert_eq!(err.reason(), "copy", "{err}");
    assert_eq!(held(), before);
    for (src, dst) in [("0", "0"), ("0", "9")] {
        let err = backend.measure_peer_copy(src, dst, &PARAMS).unwrap_err();
        assert_eq!(err.reason(), "unknown_device", "{err}");
    }
}

#[test]
fn acl_refuses_a_pair_without_peer_access_and_names_it() {
    alone!(acl_refuses_a_pair_without_peer_access_and_names_it);
    let (lib, _g) = setup();
    let backend = AclBackend::open(Some(lib), Path::new("/sys")).unwrap();
    // Both directions stay enabled.
    let (rate, method) = gbps_leaving(&backend, "1", "0", 2);
    close(rate, 20.0);
    assert_eq!(method, "copy");
    let before = held();
    let err = backend.measure_peer_copy("0", "3", &PARAMS).unwrap_err();
    assert_eq!(err.reason(), "unsupported", "{err}");
    let text = err.to_string();
    assert!(
        text.contains("device 0 -> device 3: peer access refused"),
        "{text}"
    );
    assert_eq!(held(), before);
}
