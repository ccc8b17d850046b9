//! The real NVIDIA libraries, pinned in `scripts/real-libs.sh` (PyPI wheels, sha256-checked)
//! and fetched into a cache outside the repository on first use. A fetch that fails fails the
//! calling test with the script's reason: these tests are never skipped.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// One fetched library (or tool) of `scripts/real-libs.sh`.
#[derive(Debug, Clone)]
pub struct RealLib {
    /// The script's name for it: `cudart12`, `nccl`, `cublas`, `cudart13`, `nvcc`.
    pub name: &'static str,
    /// The pinned package, `nvidia-cuda-runtime-cu12==12.9.79`.
    pub package: String,
    /// Absolute path of the library (or of `nvcc`).
    pub path: PathBuf,
}

impl RealLib {
    /// `path` as a `&str` for command lines.
    pub fn arg(&self) -> &str {
        self.path.to_str().expect("cache paths are UTF-8")
    }
}

impl std::fmt::Display for RealLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.package, self.path.display())
    }
}

/// The repository's `scripts/real-libs.sh`.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/real-libs.sh")
}

fn run(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/real-libs.sh: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && !stdout.is_empty(),
        "scripts/real-libs.sh {} failed ({}); this test needs the real NVIDIA library from \
         PyPI:\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Fetch (if needed) and locate `name`, checking that the script pins `package`, so a test
/// named after a version really ran that version.
pub fn real_lib(name: &'static str, package: &str) -> RealLib {
    let pinned = run(&["describe", name]);
    assert_eq!(
        pinned, package,
        "scripts/real-libs.sh now pins {pinned} for {name}: rename the tests that say {package}"
    );
    RealLib {
        name,
        package: pinned,
        path: PathBuf::from(run(&["path", name])),
    }
}

/// These tests check what the libraries answer on a machine without the NVIDIA driver; on a
/// machine with one (libcuda.so.1 loads) they would measure real devices instead.
pub fn assert_no_driver() {
    // SAFETY: loading the driver library (if any) runs its initialisers only.
    let driver = unsafe { libloading::Library::new("libcuda.so.1") };
    assert!(
        driver.is_err(),
        "libcuda.so.1 (the NVIDIA driver) loads here: these tests check the real libraries' \
         answers on a machine without a GPU; run scripts/gpu-check.sh on this one instead"
    );
}
