//! Peer copies (the `copy` fallback of the pair probe): `cudaMemcpyPeerAsync`,
//! `cudaMemcpyAsync`/`aclrtMemcpyAsync` device-to-device across devices run at the
//! `CHD_FAKE_PAIR_GBPS` rate, same-device device-to-device at the device's
//! `CHD_FAKE_H2D_GBPS` rate; peer-access queries and bookkeeping.

mod common;

use std::ffi::c_void;
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
        ("CHD_FAKE_H2D_GBPS", "58.9;1=12.3"),
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

#[test]
fn cuda_peer_copies_run_at_the_pair_rate() {
    let _g = setup();
    let a = CudaRank::new(0, MIB32, 1, 1);
    let b = CudaRank::new(1, MIB32, 1, 2);
    let (c0, c1) = (chd_fake_copies(0), chd_fake_copies(1));
    // SAFETY (all closures): live device buffers of MIB32 bytes, live streams.
    let ms = cuda_ms(a.stream, || unsafe {
        cudaMemcpyPeerAsync(a.recv, 0, b.send, 1, MIB32, a.stream)
    });
    assert_close(ms, expected_ms(MIB32, 20.0));
    // A peer copy counts for both devices.
    assert_eq!((chd_fake_copies(0), chd_fake_copies(1)), (c0 + 1, c1 + 1));
    assert_eq!(a.recv_bytes(), pattern(MIB32, 2));
    // cudaMemcpyAsync device-to-device (kind 3) and default (kind 4) across devices.
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
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyAsync(b.recv, a.send, MIB32, CUDA_MEMCPY_DEFAULT, b.stream)
    });
    assert_close(ms, expected_ms(MIB32, 20.0));
    // Same device: the device's own rate.
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyAsync(
            b.recv,
            b.send,
            MIB32,
            CUDA_MEMCPY_DEVICE_TO_DEVICE,
            b.stream,
        )
    });
    assert_close(ms, expected_ms(MIB32, 12.3));
    let ms = cuda_ms(b.stream, || unsafe {
        cudaMemcpyPeerAsync(b.recv, 1, b.send, 1, MIB32, b.stream)
    });
    assert_close(ms, expected_ms(MIB32, 12.3));

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
        let name = std::ffi::CStr::from_ptr(cudaGetErrorName(704))
            .to_str()
            .unwrap();
        assert_eq!(name, "cudaErrorPeerAccessAlreadyEnabled");
    }
}

#[test]
fn acl_peer_copies_and_access() {
    let _g = setup();
    let a = AclRank::new(2, MIB32, 1, 5);
    let b = AclRank::new(1, MIB32, 1, 6);
    let (mut e0, mut e1) = (null_mut(), null_mut());
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(aclrtCreateEvent(&mut e0), 0);
        assert_eq!(aclrtCreateEvent(&mut e1), 0);
    }
    let time = |stream, dst, src| {
        let mut ms = -1.0;
        // SAFETY: live events/stream/buffers.
        unsafe {
            assert_eq!(aclrtRecordEvent(e0, stream), 0);
            assert_eq!(aclrtMemcpyAsync(dst, MIB32, src, MIB32, 3, stream), 0);
            assert_eq!(aclrtRecordEvent(e1, stream), 0);
            assert_eq!(aclrtSynchronizeEvent(e1), 0);
            assert_eq!(aclrtEventElapsedTime(&mut ms, e0, e1), 0);
        }
        ms
    };
    assert_close(time(a.stream, a.recv, b.send), expected_ms(MIB32, 20.0));
    assert_eq!(a.recv_bytes(), pattern(MIB32, 6));
    assert_close(time(b.stream, b.recv, b.send), expected_ms(MIB32, 12.3));
    let mut can = -1;
    // SAFETY: live events; valid out-pointers.
    unsafe {
        aclrtDestroyEvent(e0);
        aclrtDestroyEvent(e1);
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
