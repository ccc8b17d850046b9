//! nvcc's fat-binary registration: distinct handles, each freed once; unknown or repeated
//! unregistrations are ignored.

use std::ffi::c_void;
use std::ptr::null_mut;

use chd_fake_runtime::fatbinary::*;

#[test]
fn registrations_get_distinct_handles_and_each_is_freed_once() {
    let mut blob = [0u8; 16];
    // SAFETY: only handles returned by the fake are passed back to it.
    unsafe {
        let a = __cudaRegisterFatBinary(blob.as_mut_ptr().cast::<c_void>());
        let b = __cudaRegisterFatBinary(null_mut());
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(*a, blob.as_mut_ptr().cast::<c_void>());
        __cudaRegisterFatBinaryEnd(a);
        __cudaRegisterFatBinaryEnd(b);
        assert_eq!(live_registrations(), 2);
        __cudaUnregisterFatBinary(a);
        assert_eq!(live_registrations(), 1);
        __cudaUnregisterFatBinary(a);
        __cudaUnregisterFatBinary(null_mut());
        assert_eq!(live_registrations(), 1);
        __cudaUnregisterFatBinary(b);
        assert_eq!(live_registrations(), 0);
    }
}
