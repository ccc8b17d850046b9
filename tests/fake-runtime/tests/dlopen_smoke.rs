//! Smoke test of the built shared library itself: load `libchd_fake_runtime.so` with
//! `libloading`, the way chd does, and call through it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
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

        // NCCL through C function pointers, including the 128-byte ncclUniqueId passed by
        // value (a one-rank communicator needs no peer).
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct UniqueId {
            internal: [c_char; 128],
        }
        type Comm = *mut c_void;
        let version: libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            lib.get(b"ncclGetVersion\0").unwrap();
        let get_id: libloading::Symbol<unsafe extern "C" fn(*mut UniqueId) -> c_int> =
            lib.get(b"ncclGetUniqueId\0").unwrap();
        let init_rank: libloading::Symbol<
            unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
        > = lib.get(b"ncclCommInitRank\0").unwrap();
        let count: libloading::Symbol<unsafe extern "C" fn(Comm, *mut c_int) -> c_int> =
            lib.get(b"ncclCommCount\0").unwrap();
        let destroy: libloading::Symbol<unsafe extern "C" fn(Comm) -> c_int> =
            lib.get(b"ncclCommDestroy\0").unwrap();
        let live: libloading::Symbol<unsafe extern "C" fn() -> u64> =
            lib.get(b"chd_fake_live_communicators\0").unwrap();
        let collectives: libloading::Symbol<unsafe extern "C" fn(c_int) -> u64> =
            lib.get(b"chd_fake_collectives\0").unwrap();
        let hccl_str: libloading::Symbol<unsafe extern "C" fn(c_int) -> *const c_char> =
            lib.get(b"HcclGetErrorString\0").unwrap();
        let mut v = 0;
        assert_eq!(version(&mut v), 0);
        assert_eq!(v, 22005);
        let mut id = UniqueId { internal: [0; 128] };
        assert_eq!(get_id(&mut id), 0);
        let mut comm: Comm = std::ptr::null_mut();
        assert_eq!(init_rank(&mut comm, 1, id, 0), 0);
        assert_eq!(live(), 1);
        let mut n = 0;
        assert_eq!(count(comm, &mut n), 0);
        assert_eq!(n, 1);
        assert_eq!(destroy(comm), 0);
        assert_eq!(live(), 0);
        assert_eq!(collectives(0), 0);
        assert_eq!(CStr::from_ptr(hccl_str(9)).to_str().unwrap(), "timeout");
        for name in [
            &b"ncclCommInitAll\0"[..],
            b"ncclAllGather\0",
            b"ncclGroupStart\0",
            b"ncclGroupEnd\0",
            b"ncclCommAbort\0",
            b"ncclCommGetAsyncError\0",
            b"HcclCommInitAll\0",
            b"HcclCommInitRootInfo\0",
            b"HcclAllGather\0",
            b"cudaMemcpyPeerAsync\0",
            b"cudaDeviceCanAccessPeer\0",
            b"cudaDeviceEnablePeerAccess\0",
            b"aclrtDeviceCanAccessPeer\0",
            b"aclrtDeviceEnablePeerAccess\0",
        ] {
            let sym: Result<libloading::Symbol<unsafe extern "C" fn()>, _> = lib.get(name);
            assert!(
                sym.is_ok(),
                "{} is not exported",
                String::from_utf8_lossy(name)
            );
        }
    }
}
