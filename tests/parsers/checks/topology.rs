//! `topology::Topology::read` over a fixture tree with one file's text replaced: every
//! list, id and `meminfo` the reader opens, through its public entry point.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use chd::topology::{Roots, Topology};

/// The files the input may replace, relative to the fixture root.
const FILES: &[&str] = &[
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/possible",
    "sys/devices/system/cpu/present",
    "sys/devices/system/node/online",
    "sys/devices/system/node/has_memory",
    "sys/devices/system/node/node0/cpulist",
    "sys/devices/system/node/node1/cpulist",
    "sys/devices/system/node/node0/meminfo",
    "sys/devices/system/cpu/cpu0/topology/thread_siblings_list",
    "sys/devices/system/cpu/cpu1/topology/core_id",
    "sys/devices/system/cpu/cpu2/topology/physical_package_id",
    "proc/self/status",
];

/// A copy of `tests/fixtures/topology/two-node-offline`, made once per process; one input
/// at a time changes a file of it and puts the fixture's text back after.
fn work_tree() -> &'static Mutex<tempfile::TempDir> {
    static DIR: OnceLock<Mutex<tempfile::TempDir>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(fixture());
        copy_tree(&src, dir.path());
        Mutex::new(dir)
    })
}

/// The fixture's path relative to the crate being built (chd or chd-fuzz).
fn fixture() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rel = "tests/fixtures/topology/two-node-offline";
    if here.join(rel).is_dir() {
        PathBuf::from(rel)
    } else {
        Path::new("..").join(rel)
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("fixture tree") {
        let entry = entry.expect("entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).expect("copy");
        }
    }
}

/// The first byte picks a file, the rest is its new text. A topology that reads has
/// ascending unique CPUs and nodes, each CPU in its own sibling list when it has one; an
/// error names a file under the root.
pub fn check(data: &[u8]) {
    let Some((&pick, content)) = data.split_first() else {
        return;
    };
    let file = FILES[usize::from(pick) % FILES.len()];
    let dir = work_tree()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let target = dir.path().join(file);
    let restore = Restore {
        original: std::fs::read(&target).expect("fixture file"),
        path: target,
    };
    std::fs::write(&restore.path, content).expect("write");
    let read = Topology::read(&Roots {
        sysfs: dir.path().join("sys"),
        procfs: dir.path().join("proc"),
    });
    drop(restore);
    holds(read, dir.path());
}

/// Puts a fixture file's text back, also when the reader panics.
struct Restore {
    path: PathBuf,
    original: Vec<u8>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, &self.original);
    }
}

fn holds(read: Result<Topology, chd::topology::TopologyError>, root: &Path) {
    match read {
        Ok(t) => {
            assert!(
                t.cpus.windows(2).all(|w| w[0].id < w[1].id),
                "cpus not ascending"
            );
            assert!(
                t.numa_nodes.windows(2).all(|w| w[0].id < w[1].id),
                "nodes not ascending"
            );
            assert!(!t.numa_nodes.is_empty(), "no node");
            for cpu in &t.cpus {
                assert!(
                    !t.offline_cpus.contains(&cpu.id),
                    "cpu {} online and offline",
                    cpu.id
                );
                assert!(cpu.siblings.windows(2).all(|w| w[0] < w[1]));
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains(&root.display().to_string()), "{message}");
        }
    }
}
