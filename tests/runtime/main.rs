//! chd's library against what it finds on a node, in the test process itself, one module per
//! concern:
//! - the runtime loaders against the fake runtime (tests/fake-runtime), in-process:
//!   `runtime_loaders` (CUDA and ACL copy cells release everything, NVML sees chd's own
//!   context), `matmul` (cuBLAS through the fake), `peer_copy` (ordered peer copy cells),
//!   `probe_groups` (one pinned buffer per window group), `nvml_own_process` (chd's own
//!   context under its host pid), `pair_resources` and `pair_teardown` (what the core-pair
//!   probe holds, and hung cells);
//! - `real_libs`: the loaders and the CLI against the real NVIDIA libraries, without a driver;
//!   `gpu_check`: scripts/gpu-check.sh on the fake, with its reference built by the real nvcc;
//! - `host_backend`: the host backend on the live machine; `topology`: `chd::topology` on
//!   fixture trees, the 640-CPU A3 tree and the live machine.
//!
//! Process-wide state: a test that loads a runtime library into the test process (every test
//! of the fake's in-process modules above, and `real_libs`' symbol checks) begins with
//! `alone!(its_name)` and so runs in a child process of this binary of its own
//! (support/alone.rs): the fake reads its `CHD_FAKE_*` settings, which such a test sets in the
//! process's environment, once per process, and its counters are process-wide. The other
//! tests share this process and change none of its state: they spawn `chd`, the scripts and
//! the tools with environments of their own, and bind only threads of their own.

#[path = "../support/alone.rs"]
#[macro_use]
mod alone;
#[path = "../support/chd_process.rs"]
mod chd_process;
#[path = "../support/fake_runtime.rs"]
mod fake;
#[path = "../support/pair_fixture.rs"]
mod fixture;
#[path = "../support/real_libs.rs"]
mod real;
#[path = "../support/sysfs_builder.rs"]
mod sysfs_builder;

mod gpu_check;
mod host_backend;
mod matmul;
mod nvml_own_process;
mod pair_resources;
mod pair_teardown;
mod peer_copy;
mod probe_groups;
mod real_libs;
mod runtime_loaders;
mod topology;
