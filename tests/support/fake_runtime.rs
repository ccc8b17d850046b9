//! Builds and locates `libchd_fake_runtime.so`, the workspace's stand-in for
//! libcudart, NVML and libascendcl (tests/fake-runtime).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Path of the fake runtime library next to the `chd` binary under test.
pub fn fake_runtime() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_BIN_EXE_chd"))
            .parent()
            .expect("binary dir")
            .to_path_buf();
        let lib = dir.join("libchd_fake_runtime.so");
        // `cargo test` builds the cdylib only under deps/; build it in place, every run, so a
        // stale copy from an older checkout is never loaded (a no-op when up to date).
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "chd-fake-runtime"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p chd-fake-runtime");
        assert!(status.success(), "cargo build -p chd-fake-runtime failed");
        assert!(
            lib.exists(),
            "{} missing after building chd-fake-runtime",
            lib.display()
        );
        lib
    })
}
