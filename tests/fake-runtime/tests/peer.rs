//! Peer copies (the `copy` fallback of the pair probe) and the peer-access rule:
//! `cudaMemcpyPeerAsync` and `cudaMemcpyAsync`/`aclrtMemcpyAsync` device-to-device across
//! devices cross the pair link (`CHD_FAKE_PAIR_GBPS`) only once the issuing device has peer
//! access to the other one; without it CUDA stages the copy through host memory
//! (`CHD_FAKE_STAGED_GBPS`) and ACL refuses it (CANN: enable peer access before copying
//! between devices). `CHD_FAKE_NO_PEER` pairs answer 0 to `*CanAccessPeer` and cannot enable
//! it. Same-device device-to-device runs at the device's `CHD_FAKE_D2D_GBPS` rate (not its
//! `CHD_FAKE_H2D_GBPS` one).

mod common;

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks::*;
use common::{assert_close, expected_ms, pattern, AclRank, CudaRank};

const MIB32: usize = 32 << 20;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::setup(&[
        ("CHD_FAKE_DEVICE_COUNT", "4"),
        ("CHD_FAKE_PAIR_GBPS", "20"),
        ("CHD_FAKE_STAGED_GBPS", "3"),
        ("CHD_FAKE_NO_PEER", "0,3"),
        ("CHD_FAKE_H2D_GBPS", "58.9;1=12.3"),
        ("CHD_FAKE_D2D_GBPS", "400;1=150"),
    ])
}

/// Times `op` on `stream` with a pair of CUDA events.
fn cuda_ms(stream: *mut c_void, op: impl FnOnce() -> i32) -> f32 {
    let (mut e0, mut e1, mut ms) = (null_mut(), null_mut(), -1.0);
    // SAFETY: valid out-pointers; live stream.
    unsafe {
        assert_eq!(cudaEventCreate(&mut e0), 0);
        assert_eq!(cudaEventCreate(&mut e1), 0);
        assert_eq!(cudaEventRecord(e0, stream), 0);
        assert_eq!(op(), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(e1, stream), 0);
        assert_eq!(cudaEventElapsedTime(&mut ms, e0, e1), 0);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    ms
}

/// Times one ACL copy of `len` bytes `src` -> `dst` (kind 3) on `stream`, or returns its error.
fn acl_ms(stream: *mut c_void, dst: *mut c_void, src: *mut c_void, len: usize) -> Result<f32, i32> {
    let (mut e0, mut e1, mut ms) = (null_mut(), null_mut(), -1.0);
    // SAFETY: valid out-pointers; live stream and device buffers of `len` bytes.
    unsafe {
        assert_eq!(aclrtCreateEvent(&mut e0), 0);
        assert_eq!(aclrtCreateEvent(&mut e1), 0);
        assert_eq!(aclrtRecordEvent(e0, stream), 0);
        let rc = aclrtMemcpyAsync(dst, len, src, len, 3, stream);
        assert_eq!(aclrtRecordEvent(e1, stream), 0);
        assert_eq!(aclrtEventElapsedTime(&mut ms, e0, e1), 0);
        aclrtDestroyEvent(e0);
        aclrtDestroyEvent(e1);
        if rc == ACL_SUCCESS {
            Ok(ms)
        } else {
            Err(rc)
        }
    }
}

fn acl_recent_error() -> String {
    // SAFETY: returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(aclGetRecentErrMsg()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn cuda_peer_copies_are_host_staged_until_peer_access_is_enabled() {
    let _g = setup();
    let a = CudaRank::new(0, MIB32, 1, 1);
    let b = CudaRank::new(1, MIB32, 1, 2);
    let peer_copy = |stream| {
        // SAFETY: `a.recv` and `b.send` are MIB32-byte device buffers and `stream` one of the
        // ranks' streams, all live until the ranks drop at the end of the test.
        cuda_ms(stream, || unsafe {
            cudaMemcpyPeerAsync(a.recv, 0, b.send, 1, MIB32, stream)
        })
    };
    // No peer access: staged through host memory, the bytes still arrive.
    assert_close(peer_copy(a.stream), expected_ms(MIB32, 3.0));
    assert_eq!(a.recv_bytes(), pattern(MIB32, 2));

    // Device 0 may access device 1: a copy issued on device 0 crosses the link, one issued on
    // device 1 (which reads/writes device 0's memory) is still staged.
    let enabled = chd_fake_peer_access_enabled();
    // SAFETY: plain values.
    unsafe {
        assert_eq!(cudaSetDevice(0), 0);
        assert_eq!(cudaDeviceEnablePeerAccess(1, 0), CUDA_SUCCESS);
    }
    assert_eq!(chd_fake_peer_access_enabled(), enabled + 1);
    let (c0, c1) = (chd_fake_copies(0), chd_fake_copies(1));
    assert_close(peer_copy(a.stream), expected_ms(MIB32, 20.0));
    // A peer copy counts for both devices.
    assert_eq!((chd_fake_copies(0), chd_fake_copies(1)), (c0 + 1, c1 + 1));
    assert_close(peer_copy(b.stream), expected_ms(MIB32, 3.0));

    // Both ways: every cross-device copy crosses the link.
    // SAFETY: plain values.
    unsafe {
        assert_eq!(cudaSetDevice(1), 0);
        assert_eq!(cudaDeviceEnablePeerAccess(0, 0), CUDA_SUCCESS);
    }
    assert_close(peer_copy(b.stream), expected_ms(MIB32, 20.0));
    // cudaMemcpyAsync device-to-device (kind 3) and default (kind 4) across devices.
    // SAFETY: every buffer is a MIB32-byte device buffer of a
    // rank and `b.stream` its stream, all live until the ranks drop at the end of the test.
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyAsync(
            b.recv,
            a.send,
            MIB32,
            CUDA_MEMCPY_DEVICE_TO_DEVICE,
            b.stream,
        )
    });
    assert_close(ms, expected_ms(MIB32, 20.0));
    assert_eq!(b.recv_bytes(), pattern(MIB32, 1));
    // SAFETY: as above.
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyAsync(b.recv, a.send, MIB32, CUDA_MEMCPY_DEFAULT, b.stream)
    });
    assert_close(ms, expected_ms(MIB32, 20.0));
    // Same device: the device's own rate, peer access or not.
    // SAFETY: as above.
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyAsync(
            b.recv,
            b.send,
            MIB32,
            CUDA_MEMCPY_DEVICE_TO_DEVICE,
            b.stream,
        )
    });
    assert_close(ms, expected_ms(MIB32, 150.0));
    // SAFETY: as above.
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyPeerAsync(b.recv, 1, b.send, 1, MIB32, b.stream)
    });
    assert_close(ms, expected_ms(MIB32, 150.0));

    // Disabled again: staged again.
    common::cuda_peer_access(0, 1, false);
    assert_eq!(chd_fake_peer_access_enabled(), enabled);
    assert_close(peer_copy(a.stream), expected_ms(MIB32, 3.0));

    // SAFETY: live buffers; deliberately wrong device arguments.
    unsafe {
        assert_eq!(
            cudaMemcpyPeerAsync(a.recv, 1, b.send, 1, 16, a.stream),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cudaMemcpyPeerAsync(a.recv, 0, b.send, 9, 16, a.stream),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!(cudaSetDevice(2), 0);
        assert_eq!(cudaMemcpyPeer(a.recv, 0, b.send, 1, 4096), CUDA_SUCCESS);
    }
}

#[test]
fn cuda_peer_access() {
    let _g = setup();
    let mut can = -1;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(cudaDeviceCanAccessPeer(&mut can, 0, 1), CUDA_SUCCESS);
        assert_eq!(can, 1);
        assert_eq!(cudaDeviceCanAccessPeer(&mut can, 1, 1), CUDA_SUCCESS);
        assert_eq!(can, 0);
        assert_eq!(
            cudaDeviceCanAccessPeer(&mut can, 0, 4),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!(
            cudaDeviceCanAccessPeer(null_mut(), 0, 1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cudaSetDevice(3), 0);
        assert_eq!(cudaDeviceEnablePeerAccess(2, 0), CUDA_SUCCESS);
        assert_eq!(
            cudaDeviceEnablePeerAccess(2, 0),
            CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        );
        assert_eq!(cudaDeviceEnablePeerAccess(3, 0), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cudaDeviceEnablePeerAccess(1, 1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cudaDeviceDisablePeerAccess(2), CUDA_SUCCESS);
        assert_eq!(
            cudaDeviceDisablePeerAccess(2),
            CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
        );
        assert_eq!(cudaGetLastError(), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        let name = |rc| CStr::from_ptr(cudaGetErrorName(rc)).to_str().unwrap();
        assert_eq!(name(704), "cudaErrorPeerAccessAlreadyEnabled");
        assert_eq!(name(217), "cudaErrorPeerAccessUnsupported");
    }
}

#[test]
fn a_pair_without_peer_support_is_refused_and_stays_staged() {
    let _g = setup();
    let mut can = -1;
    let enabled = chd_fake_peer_access_enabled();
    // SAFETY: valid out-pointers; plain values.
    unsafe {
        for (d, p) in [(0, 3), (3, 0)] {
            assert_eq!(cudaDeviceCanAccessPeer(&mut can, d, p), CUDA_SUCCESS);
            assert_eq!(can, 0, "{d} -> {p}");
            assert_eq!(aclrtDeviceCanAccessPeer(&mut can, d, p), ACL_SUCCESS);
            assert_eq!(can, 0, "{d} -> {p}");
            assert_eq!(cudaSetDevice(d), 0);
            assert_eq!(
                cudaDeviceEnablePeerAccess(p, 0),
                CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
            );
            assert_eq!(aclrtSetDevice(d), 0);
            assert_eq!(
                aclrtDeviceEnablePeerAccess(p, 0),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT
            );
        }
        let text = CStr::from_ptr(cudaGetErrorString(217)).to_str().unwrap();
        assert_eq!(
            text,
            "peer access is not supported between these two devices"
        );
        // Other pairs are unaffected.
        assert_eq!(cudaDeviceCanAccessPeer(&mut can, 0, 2), CUDA_SUCCESS);
        assert_eq!(can, 1);
    }
    assert_eq!(chd_fake_peer_access_enabled(), enabled);
    let a = CudaRank::new(0, MIB32, 1, 1);
    let d = CudaRank::new(3, MIB32, 1, 4);
    // SAFETY: live device buffers of MIB32 bytes, live stream.
    let ms = cuda_ms(a.stream, || unsafe {
        cudaMemcpyPeerAsync(a.recv, 0, d.send, 3, MIB32, a.stream)
    });
    assert_close(ms, expected_ms(MIB32, 3.0));
    assert_eq!(a.recv_bytes(), pattern(MIB32, 4));
}

#[test]
fn acl_peer_copies_need_peer_access() {
    let _g = setup();
    let a = AclRank::new(2, MIB32, 1, 5);
    let b = AclRank::new(1, MIB32, 1, 6);
    let copies = (chd_fake_copies(1), chd_fake_copies(2));
    // Without peer access CANN refuses cross-device copies: nothing copied, nothing timed.
    assert_eq!(
        acl_ms(a.stream, a.recv, b.send, MIB32),
        Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    );
    let msg = acl_recent_error();
    assert!(
        msg.contains("peer access from device 2 to device 1 is not enabled"),
        "{msg}"
    );
    assert_eq!((chd_fake_copies(1), chd_fake_copies(2)), copies);
    assert!(a.recv_bytes().iter().all(|&x| x == 0));
    // Same device needs nothing.
    assert_close(
        acl_ms(b.stream, b.recv, b.send, MIB32).unwrap(),
        expected_ms(MIB32, 150.0),
    );

    common::acl_peer_access(1, 2, true);
    assert_close(
        acl_ms(a.stream, a.recv, b.send, MIB32).unwrap(),
        expected_ms(MIB32, 20.0),
    );
    assert_eq!(a.recv_bytes(), pattern(MIB32, 6));
    assert_close(
        acl_ms(b.stream, b.recv, a.send, MIB32).unwrap(),
        expected_ms(MIB32, 20.0),
    );
    common::acl_peer_access(1, 2, false);
    assert_eq!(
        acl_ms(b.stream, b.recv, a.send, MIB32),
        Err(ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    );
    // a's stream copied from b's buffer: synchronized before b frees it (b drops first).
    // SAFETY: a live stream.
    assert_eq!(unsafe { aclrtSynchronizeStream(a.stream) }, ACL_SUCCESS);
}

#[test]
fn acl_peer_access() {
    let _g = setup();
    let mut can = -1;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(aclrtDeviceCanAccessPeer(&mut can, 0, 1), ACL_SUCCESS);
        assert_eq!(can, 1);
        assert_eq!(aclrtDeviceCanAccessPeer(&mut can, 2, 2), ACL_SUCCESS);
        assert_eq!(can, 0);
        assert_eq!(
            aclrtDeviceCanAccessPeer(&mut can, 0, 8),
            ACL_ERROR_RT_INVALID_DEVICEID
        );
        assert_eq!(aclrtSetDevice(0), 0);
        assert_eq!(aclrtDeviceEnablePeerAccess(1, 0), ACL_SUCCESS);
        assert_eq!(aclrtDeviceEnablePeerAccess(1, 0), ACL_SUCCESS);
        assert_eq!(aclrtDeviceEnablePeerAccess(0, 0), ACL_ERROR_INVALID_PARAM);
        assert_eq!(aclrtDeviceEnablePeerAccess(1, 2), ACL_ERROR_INVALID_PARAM);
        assert_eq!(aclrtDeviceDisablePeerAccess(1), ACL_SUCCESS);
        assert_eq!(aclrtDeviceDisablePeerAccess(1), ACL_ERROR_INVALID_PARAM);
    }
}
