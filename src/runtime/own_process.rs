//! chd's own process as the device management library may report it. NVML lists compute
//! processes by their pid in the *outermost* PID namespace it can see: in a container without
//! the host PID namespace that is the host pid, not `getpid()`, so comparing with
//! `std::process::id()` alone calls chd's own context foreign and keeps the device gate shut.
//!
//! `<procfs>/self/status` has an `NSpid:` line (Linux 4.1+) listing this process's pid in
//! every PID namespace it belongs to, from the namespace of whoever mounted that procfs down
//! to its own (proc(5)); a process NVML lists under any of them is chd itself. So the host
//! pid is there only when `--procfs-root` is a procfs of the host's PID namespace, as the
//! shipped DaemonSet mounts it (`/host/proc`); a container's own `/proc` shows its own level
//! only. This is exact and costs one read at start (the pids never change). Two alternatives were rejected: matching NVML's `usedGpuMemory` with
//! what chd allocated (NVML counts context overhead chd cannot know, and reports "not
//! available" inside many containers and under MIG), and releasing chd's contexts to see
//! which entry goes away (the CUDA runtime's primary context goes only with
//! `cudaDeviceReset`, which would pull it from under every other thread of chd, and it still
//! races with a job starting meanwhile).

use std::path::Path;

/// The pids this process has in each of its PID namespaces, and `std::process::id()`.
pub fn own_pids(procfs: &Path) -> Vec<u32> {
    let path = procfs.join("self/status");
    let mut pids = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let pids = namespace_pids(&text);
            if pids.is_empty() {
                tracing::info!(
                    "{} has no NSpid line (Linux before 4.1?): in a container without the \
                     host PID namespace, chd's own device contexts will look foreign",
                    path.display()
                );
            }
            pids
        }
        Err(e) => {
            tracing::info!(
                "cannot read {}: {e}; chd knows itself only by pid {}",
                path.display(),
                std::process::id()
            );
            Vec::new()
        }
    };
    pids.push(std::process::id());
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The pids of the `NSpid:` line of a `/proc/<pid>/status` text; empty without one.
pub fn namespace_pids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lists_every_namespace_level() {
        let status = "Name:\tchd\nTgid:\t77\nPid:\t77\nNSpid:\t123456\t4711\t77\nNSsid:\t1\n";
        assert_eq!(namespace_pids(status), [123456, 4711, 77]);
        assert_eq!(namespace_pids("Name:\tchd\nNSpid:\t42\n"), [42]);
        assert!(namespace_pids("Name:\tchd\nPid:\t42\n").is_empty());
        assert!(namespace_pids("NSpid:\tx\n").is_empty());
    }

    #[test]
    fn own_pids_always_include_getpid() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        assert_eq!(own_pids(dir.path()), [me]);
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::write(
            dir.path().join("self/status"),
            format!("Name:\tchd\nNSpid:\t{}\t{me}\n", me + 1),
        )
        .unwrap();
        assert_eq!(own_pids(dir.path()), [me, me + 1]);
        // The real procfs: at least our own pid, last on the NSpid line.
        let real = own_pids(Path::new("/proc"));
        assert!(real.contains(&me), "{real:?}");
    }
}
