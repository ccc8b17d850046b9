//! Smoke test of the built shared library itself: load `libchd_fake_runtime.so` with
//! `libloading`, the way chd does, and call through it.

use std::ffi::{c_int, c_uint};
use std::path::PathBuf;

fn library_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/libchd_fake_runtime.so")
}

#[test]
fn load_and_call_through_the_shared_library() {
    let path = library_path();
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p chd-fake-runtime` first",
        path.display()
    );
    // Read by the library on its first call, in this process.
    std::env::set_var("CHD_FAKE_DEVICE_COUNT", "3");
    // SAFETY: loading our own library runs no initializers with preconditions.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen");
    // SAFETY: the signatures match the exported functions.
    unsafe {
        let cuda_count: libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            lib.get(b"cudaGetDeviceCount\0").unwrap();
        let mut n: c_int = 0;
        assert_eq!(cuda_count(&mut n), 0);
        assert_eq!(n, 3);

        let init: libloading::Symbol<unsafe extern "C" fn() -> c_int> =
            lib.get(b"nvmlInit_v2\0").unwrap();
        let nvml_count: libloading::Symbol<unsafe extern "C" fn(*mut c_uint) -> c_int> =
            lib.get(b"nvmlDeviceGetCount_v2\0").unwrap();
        let shutdown: libloading::Symbol<unsafe extern "C" fn() -> c_int> =
            lib.get(b"nvmlShutdown\0").unwrap();
        let mut m: c_uint = 0;
        assert_eq!(
            nvml_count(&mut m),
            1,
            "NVML_ERROR_UNINITIALIZED before nvmlInit"
        );
        assert_eq!(init(), 0);
        assert_eq!(nvml_count(&mut m), 0);
        assert_eq!(m, 3);
        assert_eq!(shutdown(), 0);

        let acl_count: libloading::Symbol<unsafe extern "C" fn(*mut u32) -> c_int> =
            lib.get(b"aclrtGetDeviceCount\0").unwrap();
        let mut k = 0u32;
        assert_eq!(acl_count(&mut k), 0);
        assert_eq!(k, 3);
    }
}
