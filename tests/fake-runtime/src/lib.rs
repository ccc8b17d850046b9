//! `chd-fake-runtime`: a host-memory stand-in for `libcudart.so`, `libnvidia-ml.so.1` and
//! `libascendcl.so`, plus the NCCL and HCCL collective libraries and a cuBLAS subset, built as
//! `libchd_fake_runtime.so`.
//!
//! chd loads this library with `libloading` in place of the real runtimes, so the exported
//! symbols below use the real C names, signatures and struct layouts. One library serves all
//! five roles at once. Copies really copy bytes (device memory is host memory tagged with a
//! device) and are timed on virtual per-stream clocks from configured bandwidths; devices can
//! be made to fail or to look busy. Configuration comes from `CHD_FAKE_*` environment
//! variables, described in `README.md` and in [`config`].
//!
//! Module map: [`config`] (environment), [`device`] (per-thread current device, current CPU),
//! [`memory`] (allocation registry), [`cost`] (simulated pinning and copy time), [`host_clock`] (the host time enqueue calls take), [`timing`] (streams, events, virtual clocks, holds), [`pending`]
//! (ACL work not yet synchronized), [`copy`]
//! (the copy engine), [`collective`] (communicators and the allgather engine), [`net`] (collectives across processes over sockets), [`cublas`] (gemms that load a
//! device), [`cuda`],
//! [`nvml`], [`acl`], [`nccl`], [`hccl`] (the exported C APIs), [`fatbinary`] (nvcc's
//! registration calls, for nvcc-built host programs), [`exit_report`] (what the process still
//! holds when the library is unloaded, for `CHD_FAKE_EXIT_REPORT`) and [`hooks`] (test-only exports such as
//! `chd_fake_live_pinned_allocations`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod acl;
pub mod collective;
pub mod config;
pub mod copy;
pub mod cost;
pub mod cublas;
pub mod cuda;
pub mod device;
pub mod exit_report;
pub mod fatbinary;
pub mod hccl;
pub mod hooks;
pub mod host_clock;
pub mod memory;
pub mod nccl;
pub mod net;
pub mod nvml;
pub mod pending;
pub mod timing;

mod ffi;
