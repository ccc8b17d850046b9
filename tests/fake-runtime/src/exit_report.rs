//! `CHD_FAKE_EXIT_REPORT`: when the library is unloaded (at process exit, or at the last
//! `dlclose`), write what the process still holds in the fake, and the CPU affinity of every
//! thread still alive, to the named file. A test that stops chd with a signal reads it to see
//! that chd freed its pinned memory and communicators and left no thread bound to a probe
//! CPU before it exited; a process killed without running its exit path leaves no report.
//!
//! Format: `KEY=VALUE` lines, `live_pinned_allocations`, `live_pinned_bytes`,
//! `live_device_allocations`, `live_communicators`, `latch_deadlocks`,
//! `host_function_api_calls`, `frees_in_flight` (see the hooks of the same names),
//! `freed_under_copy`, `foreign_acl_peer_access_disabled`, `hccl_concurrent_calls`, `hccl_max_communicators_per_card`, `context_devices` (the devices with a CUDA context, comma-separated), then one
//! `thread=TID NAME CPUS_ALLOWED_LIST` line per thread of the process (from
//! `/proc/self/task/*/{comm,status}`), the process's main thread (TID = pid) first.

use std::fmt::Write as _;

use crate::{collective, memory, timing};

/// One thread's name and `Cpus_allowed_list`, from procfs.
fn thread_line(tid: &str) -> Option<String> {
    let dir = format!("/proc/self/task/{tid}");
    let name = std::fs::read_to_string(format!("{dir}/comm")).ok()?;
    let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim()
        .to_owned();
    Some(format!(
        "thread={tid} {} {cpus}",
        name.trim().replace(' ', "_")
    ))
}

/// The report's text.
pub fn report() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "live_pinned_allocations={}", memory::live_pinned());
    let _ = writeln!(out, "live_pinned_bytes={}", memory::live_pinned_bytes());
    let _ = writeln!(out, "live_device_allocations={}", memory::live_device());
    let _ = writeln!(
        out,
        "live_communicators={}",
        collective::live_communicators()
    );
    let _ = writeln!(out, "latch_deadlocks={}", timing::latch_deadlocks());
    let _ = writeln!(
        out,
        "host_function_api_calls={}",
        timing::host_function_api_calls()
    );
    let _ = writeln!(out, "frees_in_flight={}", memory::frees_in_flight());
    let _ = writeln!(out, "freed_under_copy={}", memory::freed_under_copy());
    let _ = writeln!(
        out,
        "foreign_acl_peer_access_disabled={}",
        crate::device::foreign_acl_peer_access_disabled()
    );
    let _ = writeln!(
        out,
        "hccl_concurrent_calls={}",
        collective::concurrent_hccl_calls()
    );
    let _ = writeln!(
        out,
        "hccl_max_communicators_per_card={}",
        collective::max_hccl_communicators_per_card()
    );
    let contexts = crate::device::contexts();
    let devices: Vec<String> = (0..64)
        .filter(|d| contexts & (1 << d) != 0)
        .map(|d: u32| d.to_string())
        .collect();
    let _ = writeln!(out, "context_devices={}", devices.join(","));
    let pid = std::process::id().to_string();
    let mut tids: Vec<String> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_by_key(|t| (t != &pid, t.parse::<u64>().unwrap_or(u64::MAX)));
    for tid in tids {
        if let Some(line) = thread_line(&tid) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

extern "C" fn write_exit_report() {
    let _ = std::panic::catch_unwind(|| {
        let Some(path) = std::env::var_os("CHD_FAKE_EXIT_REPORT").filter(|p| !p.is_empty()) else {
            return;
        };
        if let Err(e) = std::fs::write(&path, report()) {
            eprintln!(
                "chd-fake-runtime: CHD_FAKE_EXIT_REPORT: cannot write {}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    });
}

/// Run by the dynamic loader when the library is unloaded, which for a library still loaded
/// at `exit` happens during `exit` (after `main` returned), while other threads may still run.
#[used]
#[link_section = ".fini_array"]
static WRITE_EXIT_REPORT: extern "C" fn() = write_exit_report;
