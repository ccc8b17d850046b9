//! The exported cuBLAS subset (`libcublas.so` role) that chd's `device` load profile uses:
//! `cublasCreate_v2`, `cublasSetStream_v2`, `cublasSgemm_v2` and `cublasDestroy_v2`.
//!
//! A handle belongs to the calling thread's current device at `cublasCreate_v2`. A gemm does
//! no arithmetic: it validates its arguments (the three matrices must lie in live `cudaMalloc`
//! allocations of the handle's device, and A and B must have been written whole by copies
//! first, else `CUBLAS_STATUS_EXECUTION_FAILED`, counted in [`unwritten_operands`]: real
//! cuBLAS multiplies whatever the allocator left, mostly zeros, which draw less power, read
//! high under a power cap and make a gemm load lighter than real work), advances the clock of the handle's stream by
//! `2*m*n*k / (TFLOP/s * 1e12)` seconds (the device's `CHD_FAKE_GEMM_TFLOPS`, x
//! `CHD_FAKE_LOAD_COPY_FACTOR` while another handle of the device has a gemm in flight), sleeps
//! 1 ms of wall time (so a gemm loop does not spin a core), and marks the handle as having a
//! gemm *in flight* for the next [`IN_FLIGHT`] of wall time. While any live handle of device
//! `d` has a gemm in flight, copies timed on device `d` run at their rate x
//! `CHD_FAKE_LOAD_COPY_FACTOR` (see [`loaded`]).
//!
//! Safety contract shared by every function here: pointer arguments must be null or valid for
//! the access the real cuBLAS documents. Handles are table entries, so stale or bogus ones
//! give `CUBLAS_STATUS_NOT_INITIALIZED` instead of a crash. No panic crosses the boundary (it
//! becomes `CUBLAS_STATUS_INTERNAL_ERROR`).

#![allow(non_snake_case)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the module documentation states the contract shared by all these C entry points"
)]
#![allow(
    clippy::too_many_arguments,
    reason = "cublasSgemm_v2 has the C signature it has"
)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::config;
use crate::device;
use crate::ffi;
use crate::memory::{self, Api, Location};
use crate::timing::{self, StreamRef};

/// `cublasStatus_t`.
pub type CublasStatus = c_int;

pub const CUBLAS_STATUS_SUCCESS: CublasStatus = 0;
pub const CUBLAS_STATUS_NOT_INITIALIZED: CublasStatus = 1;
pub const CUBLAS_STATUS_INVALID_VALUE: CublasStatus = 7;
pub const CUBLAS_STATUS_EXECUTION_FAILED: CublasStatus = 13;
pub const CUBLAS_STATUS_INTERNAL_ERROR: CublasStatus = 14;

/// `cublasOperation_t`: `CUBLAS_OP_N`, `CUBLAS_OP_T`, `CUBLAS_OP_C`.
pub const CUBLAS_OP_N: c_int = 0;
pub const CUBLAS_OP_T: c_int = 1;
pub const CUBLAS_OP_C: c_int = 2;

/// How long after its last gemm a handle still counts as loading its device.
pub const IN_FLIGHT: Duration = Duration::from_millis(100);
/// Wall time each gemm call sleeps.
pub const GEMM_WALL: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Handle {
    device: usize,
    /// The raw stream set with `cublasSetStream_v2` (NULL: the device's default stream).
    stream: usize,
    last_gemm: Option<Instant>,
}

#[derive(Default)]
struct Handles {
    next: usize,
    live: HashMap<usize, Handle>,
}

static HANDLES: Mutex<Option<Handles>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Handles) -> R) -> R {
    let mut guard = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Handles::default))
}

/// Per-device count of successful gemms.
fn counters() -> &'static [AtomicU64] {
    static COUNTERS: OnceLock<Vec<AtomicU64>> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        (0..config::get().device_count)
            .map(|_| AtomicU64::new(0))
            .collect()
    })
}

/// Successful gemms on `device` (0 for unknown devices).
pub fn gemms(device: usize) -> u64 {
    counters()
        .get(device)
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

/// Whether a live handle of `device` ran a gemm within the last [`IN_FLIGHT`].
pub fn loaded(device: usize) -> bool {
    with(|h| {
        h.live
            .values()
            .any(|x| x.device == device && x.last_gemm.is_some_and(|t| t.elapsed() < IN_FLIGHT))
    })
}

/// Whether a live handle of `device` other than `handle` ran a gemm within the last
/// [`IN_FLIGHT`]: a gemm then shares the device's compute with it.
fn loaded_by_another(device: usize, handle: usize) -> bool {
    with(|h| {
        h.live.iter().any(|(&k, x)| {
            k != handle
                && x.device == device
                && x.last_gemm.is_some_and(|t| t.elapsed() < IN_FLIGHT)
        })
    })
}

/// Live cuBLAS handles.
/// Products refused because A or B was never written whole.
static UNWRITTEN_OPERANDS: AtomicU64 = AtomicU64::new(0);

/// How many products were refused because an operand was never written.
pub fn unwritten_operands() -> u64 {
    UNWRITTEN_OPERANDS.load(Ordering::Relaxed)
}

pub fn live_handles() -> u64 {
    with(|h| h.live.len() as u64)
}

fn guard(body: impl FnOnce() -> CublasStatus) -> CublasStatus {
    ffi::guard(CUBLAS_STATUS_INTERNAL_ERROR, body)
}

/// `cublasCreate_v2`: a handle on the calling thread's current device.
#[no_mangle]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut *mut c_void) -> CublasStatus {
    guard(|| {
        if handle.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let Some(dev) = device::current_checked() else {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        };
        let raw = with(|h| {
            h.next += 1;
            // Pointer-looking, distinct from stream and event handles.
            let raw = 0x7fb0_0000_0000 + h.next * 64;
            h.live.insert(
                raw,
                Handle {
                    device: dev,
                    stream: 0,
                    last_gemm: None,
                },
            );
            raw
        });
        // SAFETY: checked non-null; writable per the module contract.
        unsafe { ffi::write(handle, raw as *mut c_void) };
        CUBLAS_STATUS_SUCCESS
    })
}

/// `cublasDestroy_v2`.
#[no_mangle]
pub unsafe extern "C" fn cublasDestroy_v2(handle: *mut c_void) -> CublasStatus {
    guard(|| match with(|h| h.live.remove(&(handle as usize))) {
        Some(_) => CUBLAS_STATUS_SUCCESS,
        None => CUBLAS_STATUS_NOT_INITIALIZED,
    })
}

/// `cublasSetStream_v2`: NULL is the handle device's default stream; anything else must be a
/// live CUDA stream of the handle's device.
#[no_mangle]
pub unsafe extern "C" fn cublasSetStream_v2(
    handle: *mut c_void,
    stream: *mut c_void,
) -> CublasStatus {
    guard(|| {
        with(|h| {
            let Some(x) = h.live.get_mut(&(handle as usize)) else {
                return CUBLAS_STATUS_NOT_INITIALIZED;
            };
            match timing::stream_device(StreamRef::from_raw(stream, x.device), Api::Cuda) {
                Ok(d) if d == x.device => {
                    x.stream = stream as usize;
                    CUBLAS_STATUS_SUCCESS
                }
                _ => CUBLAS_STATUS_INVALID_VALUE,
            }
        })
    })
}

/// Bytes spanned by a column-major `rows x cols` matrix with leading dimension `ld` (f32).
fn span(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        return 0;
    }
    (ld * (cols - 1) + rows) * 4
}

/// `cublasSgemm_v2`: `C = alpha * op(A) op(B) + beta * C`, timed, not computed (see the module
/// documentation).
#[no_mangle]
pub unsafe extern "C" fn cublasSgemm_v2(
    handle: *mut c_void,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
) -> CublasStatus {
    guard(|| {
        let Some((dev, stream)) =
            with(|h| h.live.get(&(handle as usize)).map(|x| (x.device, x.stream)))
        else {
            return CUBLAS_STATUS_NOT_INITIALIZED;
        };
        let ops = [CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C];
        if !ops.contains(&transa) || !ops.contains(&transb) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let dims: Vec<usize> = match [m, n, k, lda, ldb, ldc]
            .iter()
            .map(|&v| usize::try_from(v))
            .collect::<Result<_, _>>()
        {
            Ok(d) => d,
            Err(_) => return CUBLAS_STATUS_INVALID_VALUE,
        };
        let (m, n, k, lda, ldb, ldc) = (dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]);
        // Stored shapes: op(A) is m x k, op(B) is k x n.
        let (a_rows, a_cols) = if transa == CUBLAS_OP_N {
            (m, k)
        } else {
            (k, m)
        };
        let (b_rows, b_cols) = if transb == CUBLAS_OP_N {
            (k, n)
        } else {
            (n, k)
        };
        if lda < a_rows.max(1) || ldb < b_rows.max(1) || ldc < m.max(1) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if m == 0 || n == 0 {
            return CUBLAS_STATUS_SUCCESS;
        }
        if alpha.is_null() || beta.is_null() {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        let matrices = [
            (a as usize, span(a_rows, a_cols, lda)),
            (b as usize, span(b_rows, b_cols, ldb)),
            (c as usize, span(m, n, ldc)),
        ];
        for (ptr, bytes) in matrices {
            if bytes > 0 && memory::locate(ptr, bytes) != Location::Device(dev) {
                return CUBLAS_STATUS_INVALID_VALUE;
            }
        }
        // Operands never written hold whatever the allocator left (mostly zeros on silicon):
        // such products draw less power and read high under a power cap, and a gemm load on
        // them is lighter than real work. cuBLAS multiplies them anyway; the fake refuses.
        if ![matrices[0], matrices[1]]
            .iter()
            .all(|&(ptr, bytes)| bytes == 0 || memory::fully_written(ptr, bytes))
        {
            UNWRITTEN_OPERANDS.fetch_add(1, Ordering::Relaxed);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        let cfg = config::get();
        let faults = cfg.faults_now();
        if faults.fails(dev) || faults.lost(dev) {
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        // flop / (TFLOP/s * 1e12) s = flop / (TFLOP/s * 1e3) ns.
        let mut tflops = cfg.gemm_tflops_of(dev);
        if loaded_by_another(dev, handle as usize) {
            tflops *= cfg.load_copy_factor;
        }
        let ns = flops / (tflops * 1e3);
        let stream = StreamRef::from_raw(stream as *mut c_void, dev);
        if timing::advance(stream, Api::Cuda, ns).is_err() {
            // The stream was destroyed after cublasSetStream_v2.
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        std::thread::sleep(GEMM_WALL);
        let now = Instant::now();
        with(|h| {
            if let Some(x) = h.live.get_mut(&(handle as usize)) {
                x.last_gemm = Some(now);
            }
        });
        if let Some(counter) = counters().get(dev) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        CUBLAS_STATUS_SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::span;

    #[test]
    fn spans_count_the_leading_dimension_but_not_past_the_last_column() {
        assert_eq!(span(4, 3, 4), 48);
        assert_eq!(span(4, 3, 10), (20 + 4) * 4);
        assert_eq!(span(0, 3, 4), 0);
    }
}
