//! Faults a running chd survives, through the real binary, one module per kind:
//! - `faults_runtime`: runtime faults through the fake runtime's control file (copies failing
//!   mid-window, a device lost and back, a hanging collective, SIGTERM with a cell in flight);
//! - `hung_devices`: copies that never return: timeouts, quarantine, leaked memory (issue 25
//!   part 2);
//! - `faults_state`: a state directory that fills up or turns read-only (a tmpfs in a private
//!   mount namespace, issue 14);
//! - `planted_temp_files`: symlinks and FIFOs planted where chd writes (issue 30).
//!
//! Every test spawns `chd` (through `unshare` for `faults_state`) with its own environment;
//! none changes the test process's environment, current directory or other process-wide
//! state.

#[path = "../support/chd_process.rs"]
mod chd_process;
#[path = "../support/fake_runtime.rs"]
mod fake;
#[path = "../support/mount_ns.rs"]
mod mount_ns;

mod faults_runtime;
mod faults_state;
mod hung_devices;
mod planted_temp_files;
