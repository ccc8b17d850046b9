//! The `device` load profile's engine: a matrix-multiply loop on each probed device, on its own
//! stream, so it overlaps the copies being measured. cuBLAS is loaded at run time like
//! libcudart (no toolkit needed to build chd): first next to the CUDA runtime that was loaded
//! (`libcublas.so*` in its directory), then from the runtime library itself (a library that
//! exports the cuBLAS entry points too, as chd's fake runtime does), then the standard
//! sonames. Each load thread sets its device, allocates three `N x N` f32 matrices, creates a
//! stream, binds a cuBLAS handle to it and loops `cublasSgemm_v2` + `cudaStreamSynchronize`
//! until told to stop; everything is released on every path. The same machinery times one
//! device's SGEMM throughput ([`DeviceLoader::measure_matmul`], the basic validation table's
//! TFLOPS): products on one stream between two events.

// FFI: cuBLAS's C API, called through function pointers resolved at run time.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use libloading::Library;

use super::cuda::CudaRuntime;
use super::device_copy::{guard, stream_guard, DeviceApi, Handle};
use super::device_index;
use super::library;
use super::select::{DeviceRuntime, Opened};

/// cuBLAS sonames tried after the CUDA runtime's own directory and the runtime itself; the
/// same major versions as the CUDA runtime's candidates (`cuda::CANDIDATES`).
pub const CANDIDATES: &[&str] = &[
    "libcublas.so",
    "libcublas.so.13",
    "libcublas.so.12",
    "libcublas.so.11",
];
/// Matrix side of the load's gemms: three 4096 x 4096 f32 matrices (192 MiB) per device.
pub const DEFAULT_N: usize = 4096;

const CUBLAS_STATUS_SUCCESS: c_int = 0;
const CUBLAS_OP_N: c_int = 0;

type FnCreate = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type FnDestroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type FnSetStream = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type FnStatusText = unsafe extern "C" fn(c_int) -> *const std::ffi::c_char;
type FnSgemm = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> c_int;

/// cuBLAS's entry points. The library stays loaded as long as this lives.
pub struct Cublas {
    create: FnCreate,
    destroy: FnDestroy,
    set_stream: FnSetStream,
    sgemm: FnSgemm,
    /// `cublasGetStatusName` / `cublasGetStatusString` (cuBLAS 11.4.2 and later).
    status_text: Option<(FnStatusText, FnStatusText)>,
    /// Where it was loaded from.
    pub source: String,
    _library: Library,
}

impl std::fmt::Debug for Cublas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cublas")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn resolve(lib: Library, source: String) -> Result<Cublas, library::SymbolError> {
    // SAFETY: each type is the C declaration of the named cuBLAS function (cublas_api.h,
    // handles and streams as opaque pointers); the pointers live no longer than `_library`.
    unsafe {
        Ok(Cublas {
            create: library::symbol(&lib, &source, "cublasCreate_v2")?,
            destroy: library::symbol(&lib, &source, "cublasDestroy_v2")?,
            set_stream: library::symbol(&lib, &source, "cublasSetStream_v2")?,
            sgemm: library::symbol(&lib, &source, "cublasSgemm_v2")?,
            // Checked against cublas_api.h of nvidia-cublas-cu12 12.9.3.13.
            status_text: library::symbol(&lib, &source, "cublasGetStatusName")
                .and_then(|n| Ok((n, library::symbol(&lib, &source, "cublasGetStatusString")?)))
                .ok(),
            source,
            _library: lib,
        })
    }
}

/// Where cuBLAS is looked for, in order, when no path is given.
fn candidates(cuda_source: &str) -> Vec<String> {
    let mut names = Vec::new();
    let runtime = Path::new(cuda_source);
    if let Some(dir) = runtime.parent().filter(|d| !d.as_os_str().is_empty()) {
        for c in CANDIDATES {
            let p = dir.join(c);
            if p.exists() {
                names.push(p.display().to_string());
            }
        }
    }
    names.push(cuda_source.to_string());
    names.extend(CANDIDATES.iter().map(|c| c.to_string()));
    names
}

/// Why cuBLAS could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CublasLoadError {
    /// The library named by path did not load.
    #[error(transparent)]
    Open(#[from] library::LoadError),
    /// The library named by path lacks an entry point.
    #[error(transparent)]
    Symbol(#[from] library::SymbolError),
    /// No candidate loaded with every entry point: each one tried and why.
    #[error("cannot load the cuBLAS library: {}", .0.join("; "))]
    NoCandidate(Vec<String>),
}

/// Why the device load cannot run on this backend.
#[derive(Debug, thiserror::Error)]
pub enum DeviceLoadError {
    #[error(
        "load profile \"device\" needs cuBLAS's sgemm, which the acl backend does not load \
         (no aclblas support yet); use idle or cpu:N"
    )]
    AclBackend,
    #[error("load profile \"device\" needs an accelerator; the {0} backend has none")]
    NoAccelerator(String),
    #[error("load profile \"device\" needs cuBLAS: {0}")]
    Cublas(#[from] CublasLoadError),
}

/// Why a gemm loop failed (cloned: the first one also goes to the thread that started it).
#[derive(Debug, Clone, thiserror::Error)]
pub enum GemmError {
    #[error("{call} failed: {name}: {text}")]
    Status {
        call: &'static str,
        name: String,
        text: String,
    },
    #[error("{call} failed: cuBLAS status {code}")]
    StatusCode { call: &'static str, code: c_int },
    #[error("device {device}: {source}")]
    Device {
        device: i32,
        #[source]
        source: super::device_copy::ApiError,
    },
    /// A device label the backend does not have (the probe error's text).
    #[error("{0}")]
    UnknownDevice(String),
    #[error("matrix side {0} too big")]
    TooBig(usize),
    #[error("cannot start a device load thread: {0}")]
    Thread(String),
    #[error("a device load thread ended before its first gemm")]
    ThreadEnded,
    #[error("timing failed: {0}")]
    Timing(String),
}

impl Cublas {
    /// Load cuBLAS from `path`, else from the first candidate (see the module documentation)
    /// that loads and has every entry point.
    pub fn load(path: Option<&Path>, cuda_source: &str) -> Result<Cublas, CublasLoadError> {
        if let Some(p) = path {
            let (lib, source) = library::open("cuBLAS", Some(p), &[])?;
            return Ok(resolve(lib, source)?);
        }
        let mut why = Vec::new();
        for name in candidates(cuda_source) {
            match library::open("cuBLAS", None, &[name.as_str()]) {
                Ok((lib, source)) => match resolve(lib, source) {
                    Ok(c) => return Ok(c),
                    Err(e) => why.push(format!("{name}: lacks {}", e.symbol)),
                },
                Err(e) => why.extend(e.attempts.into_iter().map(|(n, d)| {
                    let d = d
                        .strip_prefix(n.as_str())
                        .and_then(|r| r.strip_prefix(": "))
                        .unwrap_or(&d)
                        .to_string();
                    format!("{n}: {d}")
                })),
            }
        }
        Err(CublasLoadError::NoCandidate(why))
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), GemmError> {
        if code == CUBLAS_STATUS_SUCCESS {
            Ok(())
        } else if let Some((name, text)) = self.status_text {
            // SAFETY: both return static NUL-terminated strings for any status.
            let (name, text) =
                unsafe { (library::c_text(name(code)), library::c_text(text(code))) };
            Err(GemmError::Status {
                call,
                name: name.to_string(),
                text: text.to_string(),
            })
        } else {
            Err(GemmError::StatusCode { call, code })
        }
    }
}

/// Starts device loads: the CUDA runtime and cuBLAS, loaded once for the run.
#[derive(Debug, Clone)]
pub struct DeviceLoader {
    runtime: Arc<CudaRuntime>,
    cublas: Arc<Cublas>,
    devices: Vec<super::DeviceInfo>,
    n: usize,
}

impl DeviceLoader {
    /// Load cuBLAS for the opened backend. Only the CUDA backend can run the device load.
    pub fn open(opened: &Opened, cublas: Option<&Path>) -> Result<DeviceLoader, DeviceLoadError> {
        let runtime = match &opened.runtime {
            Some(DeviceRuntime::Cuda(rt)) => rt.clone(),
            Some(DeviceRuntime::Acl(_)) => return Err(DeviceLoadError::AclBackend),
            None => {
                return Err(DeviceLoadError::NoAccelerator(
                    opened.backend.name().to_string(),
                ))
            }
        };
        let cublas = Cublas::load(cublas, &runtime.source)?;
        Ok(DeviceLoader {
            runtime,
            cublas: Arc::new(cublas),
            devices: opened.backend.devices().to_vec(),
            n: DEFAULT_N,
        })
    }

    /// Use `n x n` matrices instead of [`DEFAULT_N`].
    pub fn with_size(mut self, n: usize) -> DeviceLoader {
        self.n = n.max(1);
        self
    }

    /// Where cuBLAS came from.
    pub fn source(&self) -> &str {
        &self.cublas.source
    }

    /// Start one gemm loop per device label in `devices`, its thread confined to `cpus` (empty:
    /// where the caller's thread may run); returns once every loop ran its first gemm (so the
    /// load is on when the first cell is measured), or the first error (the loops already
    /// started are stopped).
    pub fn start(&self, devices: &[String], cpus: &[u32]) -> Result<DeviceLoad, GemmError> {
        let mut load = DeviceLoad {
            stop: Arc::new(AtomicBool::new(false)),
            gemms: Arc::new(AtomicU64::new(0)),
            handles: Vec::new(),
            devices: devices.to_vec(),
        };
        let (tx, rx) = mpsc::channel::<Result<(), GemmError>>();
        for label in devices {
            let index = device_index(&self.devices, label)
                .map_err(|e| GemmError::UnknownDevice(e.to_string()))?;
            let ctx = LoopContext {
                runtime: self.runtime.clone(),
                cublas: self.cublas.clone(),
                device: index,
                n: self.n,
                cpus: cpus.to_vec(),
                stop: load.stop.clone(),
                gemms: load.gemms.clone(),
            };
            let tx = tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("chd-gemm-{label}"))
                .spawn(move || gemm_loop(&ctx, &tx))
                .map_err(|e| GemmError::Thread(e.to_string()))?;
            load.handles.push(handle);
        }
        drop(tx);
        for _ in devices {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(GemmError::ThreadEnded),
            }
        }
        Ok(load)
    }
}

/// How one matmul sample is measured: `warmup` untimed products (cuBLAS picks its kernel on
/// the first), then `iterations` timed ones, of `n x n` f32 matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulParams {
    pub n: usize,
    pub warmup: u32,
    pub iterations: u32,
}

impl DeviceLoader {
    /// SGEMM throughput of device `label`, floating-point operations per second: `2 n^3` per
    /// product over the time between two events recorded on the products' stream. Runs on the
    /// calling thread, sets its current device; everything is released on every path.
    pub fn measure_matmul(&self, label: &str, params: &MatmulParams) -> Result<f64, GemmError> {
        let device = device_index(&self.devices, label)
            .map_err(|e| GemmError::UnknownDevice(e.to_string()))?;
        let api = &*self.runtime;
        let cublas = &*self.cublas;
        let on = |source| GemmError::Device { device, source };
        api.set_device(device).map_err(on)?;
        let n = c_int::try_from(params.n).map_err(|_| GemmError::TooBig(params.n))?;
        let bytes = params
            .n
            .checked_mul(params.n)
            .and_then(|e| e.checked_mul(std::mem::size_of::<f32>()))
            .ok_or(GemmError::TooBig(params.n))?;
        let a = guard(api, api.device_alloc(bytes), CudaRuntime::device_free).map_err(on)?;
        let b = guard(api, api.device_alloc(bytes), CudaRuntime::device_free).map_err(on)?;
        let c = guard(api, api.device_alloc(bytes), CudaRuntime::device_free).map_err(on)?;
        let start = guard(api, api.event_create(), CudaRuntime::event_destroy).map_err(on)?;
        let end = guard(api, api.event_create(), CudaRuntime::event_destroy).map_err(on)?;
        // Synchronized before it is destroyed and before the matrices go, on error paths too;
        // the handle goes first.
        let stream = stream_guard(api).map_err(on)?;
        fill_operands(api, stream.handle, &[a.handle, b.handle], bytes).map_err(on)?;
        let handle = cublas.handle_on(stream.handle)?;
        let matrices = Square {
            n,
            a: a.handle,
            b: b.handle,
            c: c.handle,
        };
        for _ in 0..params.warmup {
            // SAFETY: the matrices are live n x n f32 allocations of this device, held above.
            unsafe { cublas.sgemm(&handle, &matrices) }?;
        }
        api.event_record(start.handle, stream.handle).map_err(on)?;
        for _ in 0..params.iterations {
            // SAFETY: as above.
            unsafe { cublas.sgemm(&handle, &matrices) }?;
        }
        api.event_record(end.handle, stream.handle).map_err(on)?;
        api.event_synchronize(end.handle).map_err(on)?;
        let ms = api.event_elapsed_ms(start.handle, end.handle).map_err(on)?;
        if !(ms.is_finite() && ms > 0.0) {
            return Err(GemmError::Timing(format!(
                "device events measured {ms} ms for {} products",
                params.iterations
            )));
        }
        Ok(matrices.flops() * f64::from(params.iterations) / (f64::from(ms) / 1e3))
    }
}

/// The most host memory [`fill_operands`] holds: one block of values, copied over and over.
const FILL_BLOCK_BYTES: usize = 1 << 20;

/// Fill each of `matrices` (`bytes` of device memory each) with values drawn uniformly from
/// [-1, 1), once, before anything is timed: operands left as the allocator gave them (mostly
/// zeros) toggle fewer bits, draw less power and read high under a power cap, and a gemm load
/// on them is lighter than real work. One block of at most [`FILL_BLOCK_BYTES`] of pageable
/// host memory is copied into every block of each matrix on `stream` (a pageable copy is
/// staged by the runtime), and the stream is synchronized before the block is dropped.
fn fill_operands(
    api: &CudaRuntime,
    stream: Handle,
    matrices: &[Handle],
    bytes: usize,
) -> Result<(), super::device_copy::ApiError> {
    use rand::Rng;
    let mut rng = rand::rng();
    let block: Vec<f32> = (0..FILL_BLOCK_BYTES.min(bytes) / std::mem::size_of::<f32>())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let block_bytes = std::mem::size_of_val(block.as_slice());
    if block_bytes == 0 {
        return Ok(());
    }
    for &matrix in matrices {
        let mut offset = 0;
        while offset < bytes {
            let len = block_bytes.min(bytes - offset);
            // `offset < bytes`: inside the matrix's allocation.
            let dst = matrix.cast::<u8>().wrapping_add(offset).cast::<c_void>();
            api.copy_async(
                dst,
                block.as_ptr().cast_mut().cast::<c_void>(),
                len,
                crate::vocab::Direction::H2d,
                stream,
            )?;
            offset += len;
        }
    }
    api.stream_synchronize(stream)
}

/// Running gemm loops; dropping stops and joins them.
#[derive(Debug)]
pub struct DeviceLoad {
    stop: Arc<AtomicBool>,
    gemms: Arc<AtomicU64>,
    handles: Vec<JoinHandle<()>>,
    devices: Vec<String>,
}

impl DeviceLoad {
    /// Stop and join the loops; returns how many gemms they ran.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.gemms.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                tracing::warn!("a device load thread panicked");
            }
        }
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        format!(
            "sgemm loop on device{} {}",
            if self.devices.len() == 1 { "" } else { "s" },
            self.devices.join(",")
        )
    }
}

impl Drop for DeviceLoad {
    fn drop(&mut self) {
        self.halt();
    }
}

struct LoopContext {
    runtime: Arc<CudaRuntime>,
    cublas: Arc<Cublas>,
    device: i32,
    n: usize,
    /// CPUs the loop's thread may run on (empty: unchanged).
    cpus: Vec<u32>,
    stop: Arc<AtomicBool>,
    gemms: Arc<AtomicU64>,
}

/// Confine the calling thread to `cpus` (best effort: the load runs either way).
fn confine(cpus: &[u32]) {
    if cpus.is_empty() {
        return;
    }
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        if set.set(c as usize).is_err() {
            tracing::debug!("device load: CPU {c} is beyond the CPU set size");
        }
    }
    if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
        tracing::debug!("device load thread could not change its CPU mask: {e}");
    }
}

/// One device's loop: reports the first gemm's outcome on `ready`, then runs until stopped.
fn gemm_loop(ctx: &LoopContext, ready: &mpsc::Sender<Result<(), GemmError>>) {
    confine(&ctx.cpus);
    let result = run_loop(ctx, &mut |first: Result<(), GemmError>| {
        let _ = ready.send(first);
    });
    if let Err(e) = result {
        tracing::warn!("device load on device {}: {e}", ctx.device);
    }
}

/// Three `n x n` f32 device matrices of one device: `c = a b`.
pub(crate) struct Square {
    pub(crate) n: c_int,
    pub(crate) a: Handle,
    pub(crate) b: Handle,
    pub(crate) c: Handle,
}

impl Square {
    /// Floating-point operations of one product (a multiply and an add per term).
    pub(crate) fn flops(&self) -> f64 {
        2.0 * f64::from(self.n).powi(3)
    }
}

impl Cublas {
    /// A handle whose work goes to `stream` (a live stream of the calling thread's current
    /// device), destroyed on drop: before the stream, so hold it after the stream's guard.
    pub(crate) fn handle_on(&self, stream: Handle) -> Result<HandleGuard<'_>, GemmError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a live local cublasCreate_v2 writes the handle to.
        self.check("cublasCreate_v2", unsafe { (self.create)(&mut raw) })?;
        let handle = HandleGuard {
            cublas: self,
            handle: raw,
        };
        // SAFETY: `handle` came from cublasCreate_v2 and is held by its guard; the caller
        // keeps `stream` alive longer than the handle.
        self.check("cublasSetStream_v2", unsafe {
            (self.set_stream)(handle.handle, stream)
        })?;
        Ok(handle)
    }

    /// Enqueue `c = a b` on the handle's stream.
    ///
    /// # Safety
    /// `m`'s matrices are live allocations of at least `n * n` f32 each on the handle's
    /// device, not freed before the stream is synchronized.
    pub(crate) unsafe fn sgemm(
        &self,
        handle: &HandleGuard<'_>,
        m: &Square,
    ) -> Result<(), GemmError> {
        // The matrices' contents do not matter (uninitialised floats are still floats).
        let (alpha, beta) = (1.0f32, 0.0f32);
        let n = m.n;
        // SAFETY: the caller's contract; alpha and beta are host scalars (the default pointer
        // mode); leading dimensions are n.
        let code = unsafe {
            (self.sgemm)(
                handle.handle,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                n,
                n,
                n,
                &alpha,
                m.a.cast(),
                n,
                m.b.cast(),
                n,
                &beta,
                m.c.cast(),
                n,
            )
        };
        self.check("cublasSgemm_v2", code)
    }
}

/// Releases a cuBLAS handle on drop.
pub(crate) struct HandleGuard<'a> {
    cublas: &'a Cublas,
    handle: *mut c_void,
}

impl Drop for HandleGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from cublasCreate_v2 and is destroyed once.
        let code = unsafe { (self.cublas.destroy)(self.handle) };
        if let Err(e) = self.cublas.check("cublasDestroy_v2", code) {
            tracing::warn!("releasing a cuBLAS handle: {e}");
        }
    }
}

fn run_loop(
    ctx: &LoopContext,
    ready: &mut dyn FnMut(Result<(), GemmError>),
) -> Result<(), GemmError> {
    let mut reported = false;
    let result = (|| -> Result<(), GemmError> {
        let api = &*ctx.runtime;
        let cublas = &*ctx.cublas;
        let on = |source| GemmError::Device {
            device: ctx.device,
            source,
        };
        api.set_device(ctx.device).map_err(on)?;
        let n = c_int::try_from(ctx.n).map_err(|_| GemmError::TooBig(ctx.n))?;
        let bytes = ctx.n * ctx.n * std::mem::size_of::<f32>();
        let a = guard(api, api.device_alloc(bytes), CudaRuntime::device_free).map_err(on)?;
        let b = guard(api, api.device_alloc(bytes), CudaRuntime::device_free).map_err(on)?;
        let c = guard(api, api.device_alloc(bytes), CudaRuntime::device_free).map_err(on)?;
        // Synchronized before it is destroyed and before the matrices go, on error paths too.
        let stream = stream_guard(api).map_err(on)?;
        fill_operands(api, stream.handle, &[a.handle, b.handle], bytes).map_err(on)?;
        let handle = cublas.handle_on(stream.handle)?;
        let matrices = Square {
            n,
            a: a.handle,
            b: b.handle,
            c: c.handle,
        };
        loop {
            // SAFETY: the matrices are live n x n f32 allocations of this device, held above.
            unsafe { cublas.sgemm(&handle, &matrices) }?;
            api.stream_synchronize(stream.handle).map_err(on)?;
            ctx.gemms.fetch_add(1, Ordering::Relaxed);
            if !reported {
                reported = true;
                ready(Ok(()));
            }
            if ctx.stop.load(Ordering::Relaxed) {
                // Release in reverse order: handle, stream, matrices.
                drop(handle);
                return Ok(());
            }
        }
    })();
    if let Err(e) = &result {
        if !reported {
            ready(Err(e.clone()));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublas_is_looked_for_next_to_the_runtime_then_in_it_then_by_soname() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libcublas.so.12"), b"").unwrap();
        let runtime = dir.path().join("libcudart.so.12").display().to_string();
        let names = candidates(&runtime);
        assert_eq!(
            names,
            [
                dir.path().join("libcublas.so.12").display().to_string(),
                runtime,
                "libcublas.so".into(),
                "libcublas.so.13".into(),
                "libcublas.so.12".into(),
                "libcublas.so.11".into(),
            ]
        );
        // A runtime found by soname has no directory to look in.
        assert_eq!(candidates("libcudart.so")[0], "libcudart.so");
    }

    #[test]
    fn a_library_without_sgemm_is_not_cublas() {
        let err = Cublas::load(Some(Path::new("libc.so.6")), "libc.so.6")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks symbol cublasCreate_v2"), "{err}");
        // On a machine with a real cuBLAS installed the sonames find it.
        if let Err(err) = Cublas::load(None, "/nonexistent/libcudart.so").map_err(|e| e.to_string())
        {
            assert!(err.starts_with("cannot load the cuBLAS library: "), "{err}");
            assert!(err.contains("/nonexistent/libcudart.so: "), "{err}");
        }
    }
}
