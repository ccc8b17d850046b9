//! The runtime calls the copy cells need, as one trait the CUDA and ACL loaders implement
//! (`cuda.rs`, `acl.rs`), with the handle type and the error of a failed call. The shared
//! measurement routines (`device_copy`, `stream_latch`, `device_wait`) are written against it.

use std::ffi::c_void;

use super::stuck_work::StuckWork;
use super::Direction;

/// A host function: what `cudaLaunchHostFunc` / `aclrtLaunchHostFunc` call.
pub(crate) type HostFunction = unsafe extern "C" fn(*mut c_void);

/// An opaque runtime handle (stream, event, or memory pointer).
pub type Handle = *mut c_void;

/// A failed runtime call: which call, its code, and the runtime's own text for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {text} (code {code})")]
pub struct ApiError {
    pub call: &'static str,
    pub code: i32,
    pub text: String,
}

/// The runtime calls the measurement needs. Implemented by the CUDA and ACL loaders.
///
/// Handle contract (what the implementations' `// SAFETY:` comments rely on): every
/// [`Handle`] passed in was returned by the matching create/alloc call of the same runtime,
/// has not been released yet, and a memory handle spans at least the `bytes` passed with
/// it; each handle is released exactly once, after the work queued on it is synchronized.
/// Callers hold handles in [`Guard`]s and [`HostBuffer`]s (released on drop) or, in the
/// pair probe, in its per-cell owners, which keep to this.
pub(crate) trait DeviceApi: Send + Sync {
    fn set_device(&self, device: i32) -> Result<(), ApiError>;
    fn host_alloc_pinned(&self, bytes: usize) -> Result<Handle, ApiError>;
    fn host_free_pinned(&self, ptr: Handle) -> Result<(), ApiError>;
    fn device_alloc(&self, bytes: usize) -> Result<Handle, ApiError>;
    fn device_free(&self, ptr: Handle) -> Result<(), ApiError>;
    fn stream_create(&self) -> Result<Handle, ApiError>;
    fn stream_destroy(&self, stream: Handle) -> Result<(), ApiError>;
    fn stream_synchronize(&self, stream: Handle) -> Result<(), ApiError>;
    /// Enqueue a copy of `bytes` from `src` to `dst` in `direction` on `stream`.
    fn copy_async(
        &self,
        dst: Handle,
        src: Handle,
        bytes: usize,
        direction: Direction,
        stream: Handle,
    ) -> Result<(), ApiError>;
    /// Enqueue a device-to-device copy (the devices may differ: peer copy) on `stream`.
    fn copy_device_async(
        &self,
        dst: Handle,
        src: Handle,
        bytes: usize,
        stream: Handle,
    ) -> Result<(), ApiError>;
    fn event_create(&self) -> Result<Handle, ApiError>;
    fn event_destroy(&self, event: Handle) -> Result<(), ApiError>;
    fn event_record(&self, event: Handle, stream: Handle) -> Result<(), ApiError>;
    fn event_synchronize(&self, event: Handle) -> Result<(), ApiError>;
    /// Wait at most `timeout` for `event` to complete: `Ok(true)` once it has, `Ok(false)` if
    /// it has not by then (zero: just ask). The default waits without a bound (a runtime
    /// without an event query; `stuck_work` explains why every copy cell wants the bound).
    fn event_wait(&self, event: Handle, _timeout: std::time::Duration) -> Result<bool, ApiError> {
        self.event_synchronize(event).map(|()| true)
    }
    /// The work of this runtime's cells that did not finish in time.
    fn stuck_work(&self) -> &StuckWork;
    /// Milliseconds between two recorded events.
    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, ApiError>;
    /// Why this runtime's async copies cannot take pageable host memory, where they cannot
    /// (then every host buffer they touch must come from `host_alloc_pinned`).
    fn pageable_refusal(&self) -> Option<&'static str> {
        None
    }
    /// Whether `device` can map `peer`'s memory (`cudaDeviceCanAccessPeer`,
    /// `aclrtDeviceCanAccessPeer`).
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, ApiError>;
    /// Let the calling thread's current device access `peer`'s memory (one way). `Ok(false)`:
    /// it already could (CUDA's `cudaErrorPeerAccessAlreadyEnabled`), or the runtime cannot
    /// say whether it could (ACL, always), so this call must not be undone.
    fn enable_peer_access(&self, peer: i32) -> Result<bool, ApiError>;
    /// Undo a successful [`DeviceApi::enable_peer_access`] from the current device.
    fn disable_peer_access(&self, peer: i32) -> Result<(), ApiError>;
    /// Whether a cross-device copy without peer access still runs, staged through host memory
    /// (CUDA), rather than failing (ACL requires peer access).
    fn stages_peer_copies(&self) -> bool;
    /// Whether `code` says the device is gone or unusable (CUDA's
    /// `cudaErrorDevicesUnavailable`, ACL's `ACL_ERROR_RT_LOST_HEARTBEAT`), whichever call
    /// returned it: such a cell failed for its device, not for a copy or its timing.
    fn device_lost(&self, _code: i32) -> bool {
        false
    }
    /// Whether this runtime's streams can wait on a word of its pinned host memory
    /// ([`DeviceApi::stream_wait_word`]): then host buffers carry a latch word
    /// ([`HostBuffer::with_latch_word`]).
    fn has_stream_wait(&self) -> bool {
        false
    }
    /// Enqueue on `stream` a wait until the 32-bit word at `word` (inside memory from
    /// [`DeviceApi::host_alloc_pinned`]) reaches `value` (cyclic `>=`); work enqueued after it
    /// waits too. `Ok(false)`: the driver refuses stream waits, nothing was enqueued.
    fn stream_wait_word(
        &self,
        _stream: Handle,
        _word: Handle,
        _value: u32,
    ) -> Result<bool, ApiError> {
        Ok(false)
    }
    /// Enqueue `func(data)` on `stream`: it runs on a runtime thread once the work ahead of it
    /// ran, and work enqueued after it waits until it returns. `func` calls no runtime API.
    /// `Ok(false)`: this runtime has no host functions, nothing was enqueued.
    fn launch_host_function(
        &self,
        _stream: Handle,
        _func: HostFunction,
        _data: *mut c_void,
    ) -> Result<bool, ApiError> {
        Ok(false)
    }
}
