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

/// CPUs this thread may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity(0) fills it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Binds the calling thread to `cpu` and checks it now runs there.
pub fn bind_to(cpu: usize) {
    // SAFETY: as above; sched_setaffinity(0) binds only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0,
            "binding to CPU {cpu}"
        );
        assert_eq!(libc::sched_getcpu(), cpu as i32);
    }
}

/// nccl-tests' bus bandwidth of an allgather in GB/s: per-rank bytes x (n - 1) x iterations
/// / elapsed.
pub fn busbw_gbps(bytes_per_rank: usize, nranks: usize, iters: usize, ms: f32) -> f64 {
    (bytes_per_rank * (nranks - 1) * iters) as f64 / (f64::from(ms) * 1e-3) / 1e9
}

/// Asserts `got` equals `want` up to f32 rounding of the elapsed milliseconds.
pub fn assert_rate(got: f64, want: f64) {
    let rel = (got - want).abs() / want;
    assert!(rel < 1e-5, "got {got} GB/s, want {want} GB/s");
}

/// What every rank's receive buffer holds after an allgather of `pattern(bytes, seed_r)`.
pub fn gathered(bytes: usize, seeds: &[u8]) -> Vec<u8> {
    seeds.iter().flat_map(|&s| pattern(bytes, s)).collect()
}

/// One rank's CUDA resources on `device`: a send buffer filled with `pattern(bytes, seed)`, a
/// zeroed receive buffer of `bytes * nranks`, a stream, and start/end events on it.
pub struct CudaRank {
    pub device: i32,
    pub send: *mut std::ffi::c_void,
    pub recv: *mut std::ffi::c_void,
    pub stream: *mut std::ffi::c_void,
    pub bytes: usize,
    pub nranks: usize,
    start: *mut std::ffi::c_void,
    end: *mut std::ffi::c_void,
}

// SAFETY: the handles and device pointers are plain values into the fake runtime's
// process-global registries; any thread may use them.
unsafe impl Send for CudaRank {}

impl CudaRank {
    /// Makes `device` current on the calling thread and allocates everything there.
    pub fn new(device: i32, bytes: usize, nranks: usize, seed: u8) -> Self {
        use chd_fake_runtime::cuda::*;
        let mut r = CudaRank {
            device,
            send: std::ptr::null_mut(),
            recv: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            bytes,
            nranks,
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
        };
        let data = pattern(bytes, seed);
        let zeros = vec![0u8; bytes * nranks];
        // SAFETY: valid out-pointers; host vectors outlive the synchronous copies.
        unsafe {
            assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
            assert_eq!(cudaMalloc(&mut r.send, bytes), CUDA_SUCCESS);
            assert_eq!(cudaMalloc(&mut r.recv, bytes * nranks), CUDA_SUCCESS);
            assert_eq!(
                cudaMemcpy(
                    r.send,
                    data.as_ptr().cast(),
                    bytes,
                    CUDA_MEMCPY_HOST_TO_DEVICE
                ),
                CUDA_SUCCESS
            );
            assert_eq!(
                cudaMemcpy(
                    r.recv,
                    zeros.as_ptr().cast(),
                    zeros.len(),
                    CUDA_MEMCPY_HOST_TO_DEVICE
                ),
                CUDA_SUCCESS
            );
            assert_eq!(cudaStreamCreate(&mut r.stream), CUDA_SUCCESS);
            assert_eq!(cudaEventCreate(&mut r.start), CUDA_SUCCESS);
            assert_eq!(cudaEventCreate(&mut r.end), CUDA_SUCCESS);
        }
        r
    }

    /// Records the start event on the rank's stream.
    pub fn start(&self) {
        // SAFETY: `start` and `stream` were created in `new` and are destroyed only in `drop`.
        let rc = unsafe { chd_fake_runtime::cuda::cudaEventRecord(self.start, self.stream) };
        assert_eq!(rc, 0);
    }

    /// Records the end event and returns the elapsed milliseconds since [`Self::start`].
    pub fn stop_ms(&self) -> f32 {
        use chd_fake_runtime::cuda::*;
        let mut ms = -1.0;
        // SAFETY: live handles; valid out-pointer.
        unsafe {
            assert_eq!(cudaEventRecord(self.end, self.stream), CUDA_SUCCESS);
            assert_eq!(cudaStreamSynchronize(self.stream), CUDA_SUCCESS);
            assert_eq!(
                cudaEventElapsedTime(&mut ms, self.start, self.end),
                CUDA_SUCCESS
            );
        }
        ms
    }

    /// The receive buffer, read back with a device-to-host copy.
    pub fn recv_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.bytes * self.nranks];
        // SAFETY: `recv` holds `bytes * nranks` bytes; `out` is as large.
        let rc = unsafe {
            chd_fake_runtime::cuda::cudaMemcpy(
                out.as_mut_ptr().cast(),
                self.recv,
                out.len(),
                chd_fake_runtime::cuda::CUDA_MEMCPY_DEVICE_TO_HOST,
            )
        };
        assert_eq!(rc, 0);
        out
    }
}

impl Drop for CudaRank {
    fn drop(&mut self) {
        use chd_fake_runtime::cuda::*;
        // SAFETY: everything was created in `new` and is released once.
        let rcs = unsafe {
            [
                cudaEventDestroy(self.start),
                cudaEventDestroy(self.end),
                cudaStreamDestroy(self.stream),
                cudaFree(self.send),
                cudaFree(self.recv),
            ]
        };
        if !std::thread::panicking() {
            assert_eq!(rcs, [CUDA_SUCCESS; 5]);
        }
    }
}

/// The ACL counterpart of [`CudaRank`].
pub struct AclRank {
    pub device: i32,
    pub send: *mut std::ffi::c_void,
    pub recv: *mut std::ffi::c_void,
    pub stream: *mut std::ffi::c_void,
    pub bytes: usize,
    pub nranks: usize,
    start: *mut std::ffi::c_void,
    end: *mut std::ffi::c_void,
}

// SAFETY: as for CudaRank.
unsafe impl Send for AclRank {}

impl AclRank {
    /// Makes `device` current on the calling thread and allocates everything there.
    pub fn new(device: i32, bytes: usize, nranks: usize, seed: u8) -> Self {
        use chd_fake_runtime::acl::*;
        let mut r = AclRank {
            device,
            send: std::ptr::null_mut(),
            recv: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            bytes,
            nranks,
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
        };
        let data = pattern(bytes, seed);
        let zeros = vec![0u8; bytes * nranks];
        // SAFETY: valid out-pointers; host vectors outlive the synchronous copies.
        unsafe {
            assert_eq!(aclrtSetDevice(device), ACL_SUCCESS);
            assert_eq!(aclrtMalloc(&mut r.send, bytes, 0), ACL_SUCCESS);
            assert_eq!(aclrtMalloc(&mut r.recv, bytes * nranks, 0), ACL_SUCCESS);
            assert_eq!(
                aclrtMemcpy(
                    r.send,
                    bytes,
                    data.as_ptr().cast(),
                    bytes,
                    ACL_MEMCPY_HOST_TO_DEVICE
                ),
                ACL_SUCCESS
            );
            assert_eq!(
                aclrtMemcpy(
                    r.recv,
                    zeros.len(),
                    zeros.as_ptr().cast(),
                    zeros.len(),
                    ACL_MEMCPY_HOST_TO_DEVICE
                ),
                ACL_SUCCESS
            );
            assert_eq!(aclrtCreateStream(&mut r.stream), ACL_SUCCESS);
            assert_eq!(aclrtCreateEvent(&mut r.start), ACL_SUCCESS);
            assert_eq!(aclrtCreateEvent(&mut r.end), ACL_SUCCESS);
        }
        r
    }

    /// Records the start event on the rank's stream.
    pub fn start(&self) {
        // SAFETY: `start` and `stream` were created in `new` and are destroyed only in `drop`.
        let rc = unsafe { chd_fake_runtime::acl::aclrtRecordEvent(self.start, self.stream) };
        assert_eq!(rc, 0);
    }

    /// Records the end event and returns the elapsed milliseconds since [`Self::start`].
    pub fn stop_ms(&self) -> f32 {
        use chd_fake_runtime::acl::*;
        let mut ms = -1.0;
        // SAFETY: live handles; valid out-pointer.
        unsafe {
            assert_eq!(aclrtRecordEvent(self.end, self.stream), ACL_SUCCESS);
            assert_eq!(aclrtSynchronizeStream(self.stream), ACL_SUCCESS);
            assert_eq!(
                aclrtEventElapsedTime(&mut ms, self.start, self.end),
                ACL_SUCCESS
            );
        }
        ms
    }

    /// The receive buffer, read back with a device-to-host copy.
    pub fn recv_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.bytes * self.nranks];
        // SAFETY: `recv` holds `bytes * nranks` bytes; `out` is as large.
        let rc = unsafe {
            chd_fake_runtime::acl::aclrtMemcpy(
                out.as_mut_ptr().cast(),
                out.len(),
                self.recv,
                out.len(),
                chd_fake_runtime::acl::ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        assert_eq!(rc, 0);
        out
    }
}

impl Drop for AclRank {
    fn drop(&mut self) {
        use chd_fake_runtime::acl::*;
        // SAFETY: everything was created in `new` and is released once, after the stream's
        // work is synchronized (CANN: never release what a stream may still use).
        let rcs = unsafe {
            [
                aclrtSynchronizeStream(self.stream),
                aclrtDestroyEvent(self.start),
                aclrtDestroyEvent(self.end),
                aclrtDestroyStream(self.stream),
                aclrtFree(self.send),
                aclrtFree(self.recv),
            ]
        };
        if !std::thread::panicking() {
            assert_eq!(rcs, [ACL_SUCCESS; 6]);
        }
    }
}

/// Destroys NCCL communicators from one thread the way NCCL requires: grouped
/// (`ncclCommDestroy` is an intra-node collective call).
pub fn destroy_nccl(comms: &[*mut std::ffi::c_void]) {
    use chd_fake_runtime::nccl::*;
    // SAFETY: live communicators, each destroyed once.
    unsafe {
        assert_eq!(ncclGroupStart(), NCCL_SUCCESS);
        for &c in comms {
            assert_eq!(ncclCommDestroy(c), NCCL_SUCCESS);
        }
        assert_eq!(ncclGroupEnd(), NCCL_SUCCESS);
    }
}

/// Enables (or disables) CUDA peer access between `a` and `b`, both ways.
pub fn cuda_peer_access(a: i32, b: i32, on: bool) {
    use chd_fake_runtime::cuda::*;
    for (dev, peer) in [(a, b), (b, a)] {
        // SAFETY: plain values.
        unsafe {
            assert_eq!(cudaSetDevice(dev), CUDA_SUCCESS);
            let rc = if on {
                cudaDeviceEnablePeerAccess(peer, 0)
            } else {
                cudaDeviceDisablePeerAccess(peer)
            };
            assert_eq!(rc, CUDA_SUCCESS, "peer access {dev} -> {peer} on={on}");
        }
    }
}

/// Enables (or disables) ACL peer access between `a` and `b`, both ways.
pub fn acl_peer_access(a: i32, b: i32, on: bool) {
    use chd_fake_runtime::acl::*;
    for (dev, peer) in [(a, b), (b, a)] {
        // SAFETY: plain values.
        unsafe {
            assert_eq!(aclrtSetDevice(dev), ACL_SUCCESS);
            let rc = if on {
                aclrtDeviceEnablePeerAccess(peer, 0)
            } else {
                aclrtDeviceDisablePeerAccess(peer)
            };
            assert_eq!(rc, ACL_SUCCESS, "peer access {dev} -> {peer} on={on}");
        }
    }
}
