//! cuBLAS role: a gemm advances its stream's clock by flops / CHD_FAKE_GEMM_TFLOPS, and while
//! a gemm is in flight on a device its copies (same-device device-to-device ones included)
//! run at CHD_FAKE_LOAD_COPY_FACTOR x their rate;
//! other devices, and the device after the handle is destroyed, are unaffected.

mod common;

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use chd_fake_runtime::cublas::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hooks::*;
use common::{assert_close, expected_ms};

const ENV: &[(&str, &str)] = &[
    ("CHD_FAKE_DEVICE_COUNT", "2"),
    ("CHD_FAKE_H2D_GBPS", "40"),
    ("CHD_FAKE_D2D_GBPS", "200"),
    ("CHD_FAKE_GEMM_TFLOPS", "10"),
    ("CHD_FAKE_LOAD_COPY_FACTOR", "0.25"),
];

const N: usize = 256;
const COPY: usize = 8 << 20;

/// Milliseconds one H2D copy of `COPY` bytes takes on `device`, timed with events.
fn copy_ms(device: i32) -> f32 {
    let mut host = vec![0u8; COPY];
    let (mut dev, mut stream, mut start, mut end) =
        (null_mut(), null_mut(), null_mut(), null_mut());
    let mut ms = 0f32;
    // SAFETY: valid out-pointers; `host` outlives the synchronous fake copy.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut dev, COPY), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut start), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut end), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(start, stream), CUDA_SUCCESS);
        assert_eq!(
            cudaMemcpyAsync(dev, host.as_mut_ptr().cast(), COPY, 1, stream),
            CUDA_SUCCESS
        );
        assert_eq!(cudaEventRecord(end, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, start, end), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(start), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(end), CUDA_SUCCESS);
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cudaFree(dev), CUDA_SUCCESS);
    }
    ms
}

/// Milliseconds one same-device device-to-device copy of `COPY` bytes takes on `device`.
fn d2d_ms(device: i32) -> f32 {
    let (mut a, mut b, mut stream, mut start, mut end) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    let mut ms = 0f32;
    // SAFETY: valid out-pointers; both buffers are live device allocations of COPY bytes.
    unsafe {
        assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut a, COPY), CUDA_SUCCESS);
        assert_eq!(cudaMalloc(&mut b, COPY), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut stream), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut start), CUDA_SUCCESS);
        assert_eq!(cudaEventCreate(&mut end), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(start, stream), CUDA_SUCCESS);
        assert_eq!(cudaMemcpyAsync(b, a, COPY, 3, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventRecord(end, stream), CUDA_SUCCESS);
        assert_eq!(cudaEventElapsedTime(&mut ms, start, end), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(start), CUDA_SUCCESS);
        assert_eq!(cudaEventDestroy(end), CUDA_SUCCESS);
        assert_eq!(cudaStreamDestroy(stream), CUDA_SUCCESS);
        assert_eq!(cudaFree(a), CUDA_SUCCESS);
        assert_eq!(cudaFree(b), CUDA_SUCCESS);
    }
    ms
}

struct Gemm {
    handle: *mut c_void,
    stream: *mut c_void,
    mats: [*mut c_void; 3],
}

impl Gemm {
    /// A handle on `device` bound to a new stream, with three N x N f32 matrices there, A and
    /// B filled (on a stream of their own, so the handle's stream clock stays at 0).
    fn new(device: i32) -> Gemm {
        let g = Gemm::unfilled(device);
        let host = vec![0.5f32; N * N];
        let mut fill = null_mut();
        // SAFETY: A and B are live N x N f32 allocations; `host` outlives the synchronous
        // fake copies; the stream is destroyed after them.
        unsafe {
            assert_eq!(cudaStreamCreate(&mut fill), CUDA_SUCCESS);
            for m in &g.mats[..2] {
                assert_eq!(
                    cudaMemcpyAsync(*m, host.as_ptr().cast(), N * N * 4, 1, fill),
                    CUDA_SUCCESS
                );
            }
            assert_eq!(cudaStreamSynchronize(fill), CUDA_SUCCESS);
            assert_eq!(cudaStreamDestroy(fill), CUDA_SUCCESS);
        }
        g
    }

    /// As [`Gemm::new`], the matrices as the allocator left them.
    fn unfilled(device: i32) -> Gemm {
        let mut g = Gemm {
            handle: null_mut(),
            stream: null_mut(),
            mats: [null_mut(); 3],
        };
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(cudaSetDevice(device), CUDA_SUCCESS);
            for m in &mut g.mats {
                assert_eq!(cudaMalloc(m, N * N * 4), CUDA_SUCCESS);
            }
            assert_eq!(cudaStreamCreate(&mut g.stream), CUDA_SUCCESS);
            assert_eq!(cublasCreate_v2(&mut g.handle), CUBLAS_STATUS_SUCCESS);
            assert_eq!(
                cublasSetStream_v2(g.handle, g.stream),
                CUBLAS_STATUS_SUCCESS
            );
        }
        g
    }

    fn run(&self) -> i32 {
        let (alpha, beta) = (1f32, 0f32);
        let n = N as i32;
        // SAFETY: the matrices are live device allocations of N x N f32.
        unsafe {
            cublasSgemm_v2(
                self.handle,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                n,
                n,
                n,
                &alpha,
                self.mats[0].cast(),
                n,
                self.mats[1].cast(),
                n,
                &beta,
                self.mats[2].cast(),
                n,
            )
        }
    }

    fn clock_ms(&self) -> f32 {
        let (mut a, mut b) = (null_mut(), null_mut());
        let mut ms = 0f32;
        // SAFETY: valid out-pointers and live handles. `a` is recorded at the stream's clock
        // and `b` on the device's default stream, which no one advanced (clock 0).
        unsafe {
            assert_eq!(cudaEventCreate(&mut a), CUDA_SUCCESS);
            assert_eq!(cudaEventCreate(&mut b), CUDA_SUCCESS);
            assert_eq!(cudaEventRecord(a, null_mut()), CUDA_SUCCESS);
            assert_eq!(cudaEventRecord(b, self.stream), CUDA_SUCCESS);
            assert_eq!(cudaEventElapsedTime(&mut ms, a, b), CUDA_SUCCESS);
            cudaEventDestroy(a);
            cudaEventDestroy(b);
        }
        ms
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        // SAFETY: all created above and released once.
        unsafe {
            assert_eq!(cublasDestroy_v2(self.handle), CUBLAS_STATUS_SUCCESS);
            cudaStreamDestroy(self.stream);
            for m in self.mats {
                cudaFree(m);
            }
        }
    }
}

#[test]
fn a_gemm_takes_its_flops_and_slows_copies_on_its_device_only() {
    let _g = common::setup(ENV);
    let full = expected_ms(COPY, 40.0);
    assert_close(copy_ms(1), full);
    let gemm = Gemm::new(1);
    // A handle without a gemm does not load the device.
    assert_close(copy_ms(1), full);
    let before = chd_fake_gemms(1);
    assert_eq!(gemm.run(), CUBLAS_STATUS_SUCCESS);
    assert_eq!(gemm.run(), CUBLAS_STATUS_SUCCESS);
    assert_eq!(chd_fake_gemms(1), before + 2);
    // 2 * 256^3 flop at 10 TFLOP/s = 3.3554 us per gemm; two of them.
    assert_close(
        gemm.clock_ms(),
        2.0 * 2.0 * (N as f64).powi(3) / 10e12 * 1e3,
    );
    assert_close(copy_ms(1), full / 0.25);
    assert_close(copy_ms(0), full);
    // Same-device copies (at their own CHD_FAKE_D2D_GBPS rate) slow down the same way.
    assert_close(d2d_ms(1), expected_ms(COPY, 200.0) / 0.25);
    assert_close(d2d_ms(0), expected_ms(COPY, 200.0));
    // In flight for 100 ms of wall time after the last gemm only.
    std::thread::sleep(IN_FLIGHT + std::time::Duration::from_millis(20));
    assert_close(copy_ms(1), full);
    assert_eq!(gemm.run(), CUBLAS_STATUS_SUCCESS);
    assert_close(copy_ms(1), full / 0.25);
    let live = chd_fake_live_cublas_handles();
    drop(gemm);
    assert_eq!(chd_fake_live_cublas_handles(), live - 1);
    assert_close(copy_ms(1), full);
}

#[test]
fn a_product_of_operands_never_written_is_refused() {
    let _g = common::setup(ENV);
    let before = (chd_fake_unwritten_gemm_operands(), chd_fake_gemms(0));
    let gemm = Gemm::unfilled(0);
    assert_eq!(gemm.run(), 13, "CUBLAS_STATUS_EXECUTION_FAILED");
    assert_eq!(chd_fake_unwritten_gemm_operands(), before.0 + 1);
    assert_eq!(chd_fake_gemms(0), before.1);
    // Filled, the same shape runs.
    let filled = Gemm::new(0);
    assert_eq!(filled.run(), CUBLAS_STATUS_SUCCESS);
    assert_eq!(chd_fake_unwritten_gemm_operands(), before.0 + 1);
}

#[test]
fn bad_handles_streams_and_matrices_are_refused() {
    let _g = common::setup(ENV);
    let gemm = Gemm::new(0);
    let (alpha, beta) = (1f32, 0f32);
    let n = N as i32;
    let mut host = vec![0f32; N * N];
    // SAFETY: pointers are valid or deliberately wrong; the fake validates them.
    unsafe {
        assert_eq!(cublasCreate_v2(null_mut()), CUBLAS_STATUS_INVALID_VALUE);
        assert_eq!(
            cublasDestroy_v2(0x1234 as *mut c_void),
            CUBLAS_STATUS_NOT_INITIALIZED
        );
        // A stream of another device.
        let mut other = null_mut();
        assert_eq!(cudaSetDevice(1), CUDA_SUCCESS);
        assert_eq!(cudaStreamCreate(&mut other), CUDA_SUCCESS);
        assert_eq!(
            cublasSetStream_v2(gemm.handle, other),
            CUBLAS_STATUS_INVALID_VALUE
        );
        assert_eq!(cudaStreamDestroy(other), CUDA_SUCCESS);
        // Host memory as C.
        assert_eq!(
            cublasSgemm_v2(
                gemm.handle,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                n,
                n,
                n,
                &alpha,
                gemm.mats[0].cast(),
                n,
                gemm.mats[1].cast(),
                n,
                &beta,
                host.as_mut_ptr(),
                n,
            ),
            CUBLAS_STATUS_INVALID_VALUE
        );
        // A leading dimension shorter than the rows; a bad operation; NULL alpha.
        for (op, lda, alpha) in [
            (CUBLAS_OP_N, n - 1, &alpha as *const f32),
            (7, n, &alpha),
            (CUBLAS_OP_N, n, null()),
        ] {
            assert_eq!(
                cublasSgemm_v2(
                    gemm.handle,
                    op,
                    CUBLAS_OP_N,
                    n,
                    n,
                    n,
                    alpha,
                    gemm.mats[0].cast(),
                    lda,
                    gemm.mats[1].cast(),
                    n,
                    &beta,
                    gemm.mats[2].cast(),
                    n,
                ),
                CUBLAS_STATUS_INVALID_VALUE
            );
        }
    }
    assert_eq!(gemm.clock_ms(), 0.0);
}
