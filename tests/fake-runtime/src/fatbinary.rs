//! nvcc's host-side registration calls (`crt/host_runtime.h` of CUDA 13.0): a program nvcc
//! builds registers its embedded fat binary with the CUDA runtime before `main` and
//! unregisters it at exit, even one with no kernels (`scripts/gpu-check/h2d_ref.cu`). With
//! these, such a program linked with `-cudart shared` runs against the fake. The fat binary is
//! recorded, never read: kernels cannot be launched here.

#![allow(non_snake_case)]
#![allow(
    clippy::missing_safety_doc,
    reason = "the handle contract is the runtime's: only handles returned here are passed back"
)]

use std::ffi::c_void;
use std::sync::Mutex;

/// Handles registered and not yet unregistered.
static LIVE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<usize>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registered fat binaries not yet unregistered.
pub fn live_registrations() -> usize {
    live().len()
}

/// `void** __cudaRegisterFatBinary(void *fatCubin)`: a new handle (never NULL) that holds
/// `fat_cubin`.
#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
    let handle = Box::into_raw(Box::new(fat_cubin));
    live().push(handle as usize);
    handle
}

/// `void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)`: the registration's end; nothing
/// to do without kernels.
#[no_mangle]
pub unsafe extern "C" fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

/// `void __cudaUnregisterFatBinary(void **fatCubinHandle)`: frees a handle from
/// `__cudaRegisterFatBinary`; an unknown or already freed one is ignored.
#[no_mangle]
pub unsafe extern "C" fn __cudaUnregisterFatBinary(handle: *mut *mut c_void) {
    let mut live = live();
    if let Some(at) = live.iter().position(|&h| h == handle as usize) {
        live.swap_remove(at);
        // SAFETY: the handle came from Box::into_raw above and leaves the registry once.
        drop(unsafe { Box::from_raw(handle) });
    }
}
