//! Helpers for the exported C functions: catching panics at the FFI boundary, writing
//! out-parameters and NUL-terminated strings into caller buffers.

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`, turning a panic into `on_panic` so no unwind crosses the C boundary.
pub fn guard(on_panic: c_int, body: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

/// Writes `value` through `out`; returns false when `out` is null.
///
/// # Safety
/// `out` must be null or valid for writing a `T`.
pub unsafe fn write<T>(out: *mut T, value: T) -> bool {
    if out.is_null() {
        return false;
    }
    // SAFETY: non-null and, per the caller's contract, valid for writes.
    unsafe { out.write_unaligned(value) };
    true
}

/// Outcome of writing a C string into a caller buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrWrite {
    Written,
    /// The buffer is null or has no room.
    Invalid,
    /// The buffer is too small for the whole string (nothing written).
    TooSmall,
}

/// Copies `text` plus a NUL into `buf` of `len` bytes; with `truncate`, a short buffer gets a
/// truncated, still NUL-terminated prefix instead of `TooSmall`.
///
/// # Safety
/// `buf` must be null or valid for writing `len` bytes.
pub unsafe fn write_str(buf: *mut c_char, len: usize, text: &str, truncate: bool) -> StrWrite {
    if buf.is_null() || len == 0 {
        return StrWrite::Invalid;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > len && !truncate {
        return StrWrite::TooSmall;
    }
    let n = bytes.len().min(len - 1);
    // SAFETY: `buf` is valid for `len` bytes and `n + 1 <= len`; the source is a distinct Rust
    // string.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    StrWrite::Written
}
