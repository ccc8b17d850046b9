//! chd in a container without the host PID namespace: NVML reports chd's own compute context
//! under its host pid (the fake's `CHD_FAKE_NVML_OWN_PID`), which only the `NSpid:` line of
//! `<procfs>/self/status` connects to chd. With it the device gate stays open while chd holds
//! device memory; a real foreign process still closes it; without it chd would call itself
//! foreign, and the pid it cannot see is reported (`unseen_pids`, and a warning naming
//! what to mount). (The same-namespace case is in `runtime_loaders.rs`, where NVML reports getpid().)

use crate::fake;

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use chd::runtime::select::{self, BackendChoice, RuntimeConfig};
use chd::runtime::telemetry::DeviceSample;
use chd::topology::{Roots, Topology};

/// The host pid the fake's NVML lists this process under.
const HOST_PID: u32 = 123456;

/// The fake's allocations are per process: tests that hold device memory run one at a time.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn setup() -> &'static Path {
    fake::fake_runtime_with(&[
        ("CHD_FAKE_DEVICE_COUNT", "2"),
        ("CHD_FAKE_BUSY_DEVICES", "1"),
        ("CHD_FAKE_NVML_OWN_PID", &HOST_PID.to_string()),
    ])
}

/// A procfs root whose `self/status` is this process's with `nspid` as its `NSpid:` line.
fn procfs_with_nspid(nspid: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::read_to_string("/proc/self/status").unwrap();
    let mut status: String = real
        .lines()
        .filter(|l| !l.starts_with("NSpid:"))
        .map(|l| format!("{l}\n"))
        .collect();
    status.push_str(&format!("NSpid:\t{nspid}\n"));
    std::fs::create_dir(dir.path().join("self")).unwrap();
    std::fs::write(dir.path().join("self/status"), status).unwrap();
    let root = dir.path().to_path_buf();
    (dir, root)
}

/// Device samples through `chd`'s own backend selection with `procfs` as the procfs root,
/// taken while this process holds 4 KiB on each device.
fn samples_holding_memory(procfs: PathBuf) -> Vec<DeviceSample> {
    let lib = setup();
    let cfg = RuntimeConfig {
        backend: BackendChoice::Cuda,
        cuda_runtime: Some(lib.to_path_buf()),
        nvml: Some(lib.to_path_buf()),
        ..RuntimeConfig::default()
    };
    let roots = Roots {
        procfs,
        ..Roots::default()
    };
    let topology = Topology::read(&Roots::default()).unwrap();
    let opened = select::open(&cfg, &roots, &topology).unwrap();
    assert_eq!(opened.telemetry.source(), "nvml", "{:?}", opened.skipped);
    // SAFETY: the fake exports these with the CUDA runtime's C signatures; the library stays
    // loaded while `opened` holds it.
    unsafe {
        let l = libloading::Library::new(lib).unwrap();
        let set_device = *l
            .get::<unsafe extern "C" fn(c_int) -> c_int>(b"cudaSetDevice")
            .unwrap();
        let malloc = *l
            .get::<unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int>(b"cudaMalloc")
            .unwrap();
        let free = *l
            .get::<unsafe extern "C" fn(*mut c_void) -> c_int>(b"cudaFree")
            .unwrap();
        let mut held = [std::ptr::null_mut(); 2];
        for (device, p) in held.iter_mut().enumerate() {
            assert_eq!(set_device(device as c_int), 0);
            assert_eq!(malloc(p, 4096), 0);
        }
        let samples = opened.telemetry.sample();
        for p in held {
            assert_eq!(free(p), 0);
        }
        samples
    }
}

fn device(samples: &[DeviceSample], id: &str) -> DeviceSample {
    samples.iter().find(|s| s.device == id).unwrap().clone()
}

#[test]
fn the_host_pid_on_the_nspid_line_is_chd_itself() {
    alone!(the_host_pid_on_the_nspid_line_is_chd_itself);
    let _one_at_a_time = exclusive();
    let me = std::process::id();
    let (_dir, root) = procfs_with_nspid(&format!("{HOST_PID}\t{me}"));
    // The host's procfs shows the other job's process.
    std::fs::create_dir(root.join("4242")).unwrap();
    let samples = samples_holding_memory(root);
    // Device 0 lists only chd (under the host pid): idle, the gate stays open.
    let idle = device(&samples, "0");
    assert_eq!(idle.foreign_processes, Some(0));
    assert_eq!(idle.memory_used_bytes, Some(4096));
    assert!(!idle.is_busy(0.1));
    // Device 1 also runs someone else's process (pid 4242): still busy, at any threshold.
    let busy = device(&samples, "1");
    assert_eq!(busy.foreign_processes, Some(1));
    assert!(busy.is_busy(1.0));
    assert!(busy.unseen_pids.is_empty(), "{busy:?}");
}

#[test]
fn without_the_host_pid_chd_would_take_itself_for_a_foreign_process() {
    alone!(without_the_host_pid_chd_would_take_itself_for_a_foreign_process);
    let _one_at_a_time = exclusive();
    let me = std::process::id();
    let (_dir, root) = procfs_with_nspid(&me.to_string());
    let samples = samples_holding_memory(root);
    let own = device(&samples, "0");
    assert_eq!(own.foreign_processes, Some(1));
    assert!(own.is_busy(1.0));
    // ... but it can tell why: NVML's pid is not in the procfs it sees (and says so, once,
    // naming what to mount).
    assert_eq!(own.unseen_pids, [HOST_PID]);
}
