//! `CHD_FAKE_P2P_GBPS`: per ordered device pair link rates of peer copies, so a test can plant
//! cross-socket (SYS) pairs slower than same-switch (PIX) pairs and one slow pair. A rule
//! names the copy's source and destination devices (the data's direction, whichever stream
//! issues it); pairs without a rule keep the `CHD_FAKE_PAIR_GBPS` rate, and host-staged copies
//! (no peer access) keep `CHD_FAKE_STAGED_GBPS`.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use common::{assert_close, expected_ms, pattern, AclRank, CudaRank};

const MIB8: usize = 8 << 20;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "8"),
        ("CHD_FAKE_PAIR_GBPS", "20"),
        ("CHD_FAKE_STAGED_GBPS", "3"),
        ("CHD_FAKE_P2P_GBPS", "2>1=2.5;0-3>4-7=6;4-7>0-3=7"),
    ])
}

/// Milliseconds of one `cudaMemcpyPeerAsync` of `a.send` (device `a`) into `b.recv` on
/// `stream`.
fn cuda_peer_ms(dst: &CudaRank, src: &CudaRank, stream: *mut c_void) -> f32 {
    let (mut e0, mut e1, mut ms) = (null_mut(), null_mut(), -1.0);
    // SAFETY: valid out-pointers; live stream and device buffers of MIB8 bytes.
    unsafe {
        assert_eq!(cudaEventCreate(&mut e0), 0);
        assert_eq!(cudaEventCreate(&mut e1), 0);
        assert_eq!(cudaEventRecord(e0, stream), 0);
        assert_eq!(
            cudaMemcpyPeerAsync(dst.recv, dst.device, src.send, src.device, MIB8, stream),
            CUDA_SUCCESS
        );
        assert_eq!(cudaEventRecord(e1, stream), 0);
        assert_eq!(cudaEventElapsedTime(&mut ms, e0, e1), 0);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    ms
}

#[test]
fn cuda_peer_copies_run_at_their_ordered_pair_rate() {
    let _g = setup();
    let r: Vec<CudaRank> = (0..8)
        .map(|d| CudaRank::new(d, MIB8, 1, d as u8 + 1))
        .collect();
    for (a, b) in [(0, 1), (1, 2), (0, 5)] {
        common::cuda_peer_access(a, b, true);
    }
    // Same switch, no rule: the pair rate, both ways.
    assert_close(
        cuda_peer_ms(&r[1], &r[0], r[0].stream),
        expected_ms(MIB8, 20.0),
    );
    assert_close(
        cuda_peer_ms(&r[0], &r[1], r[1].stream),
        expected_ms(MIB8, 20.0),
    );
    // The slow ordered pair 2 -> 1, on either device's stream; 1 -> 2 is not slow.
    assert_close(
        cuda_peer_ms(&r[1], &r[2], r[2].stream),
        expected_ms(MIB8, 2.5),
    );
    assert_close(
        cuda_peer_ms(&r[1], &r[2], r[1].stream),
        expected_ms(MIB8, 2.5),
    );
    assert_close(
        cuda_peer_ms(&r[2], &r[1], r[1].stream),
        expected_ms(MIB8, 20.0),
    );
    assert_eq!(r[1].recv_bytes(), pattern(MIB8, 3));
    // Across the groups: each direction its own rate.
    assert_close(
        cuda_peer_ms(&r[5], &r[0], r[0].stream),
        expected_ms(MIB8, 6.0),
    );
    assert_close(
        cuda_peer_ms(&r[0], &r[5], r[5].stream),
        expected_ms(MIB8, 7.0),
    );
    // Without peer access a rule does not apply: host-staged.
    common::cuda_peer_access(0, 5, false);
    assert_close(
        cuda_peer_ms(&r[5], &r[0], r[0].stream),
        expected_ms(MIB8, 3.0),
    );
    for (a, b) in [(0, 1), (1, 2)] {
        common::cuda_peer_access(a, b, false);
    }
}

#[test]
fn acl_peer_copies_run_at_their_ordered_pair_rate() {
    let _g = setup();
    let src = AclRank::new(4, MIB8, 1, 9);
    let dst = AclRank::new(2, MIB8, 1, 1);
    common::acl_peer_access(4, 2, true);
    let (mut e0, mut e1, mut ms) = (null_mut(), null_mut(), -1.0);
    // SAFETY: valid out-pointers; live stream (device 4) and MIB8-byte device buffers.
    unsafe {
        assert_eq!(aclrtCreateEvent(&mut e0), 0);
        assert_eq!(aclrtCreateEvent(&mut e1), 0);
        assert_eq!(aclrtRecordEvent(e0, src.stream), 0);
        assert_eq!(
            aclrtMemcpyAsync(dst.recv, MIB8, src.send, MIB8, 3, src.stream),
            ACL_SUCCESS
        );
        assert_eq!(aclrtRecordEvent(e1, src.stream), 0);
        assert_eq!(aclrtEventElapsedTime(&mut ms, e0, e1), 0);
        aclrtDestroyEvent(e0);
        aclrtDestroyEvent(e1);
        assert_eq!(aclrtSynchronizeStream(src.stream), 0);
    }
    assert_close(ms, expected_ms(MIB8, 7.0));
    assert_eq!(dst.recv_bytes(), pattern(MIB8, 9));
    common::acl_peer_access(4, 2, false);
}
