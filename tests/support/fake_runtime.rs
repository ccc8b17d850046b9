//! Builds and locates `libchd_fake_runtime.so`, the workspace's stand-in for
//! libcudart, NVML and libascendcl (tests/fake-runtime), and configures it for tests that
//! load it into their own process.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Once, OnceLock};

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

/// [`fake_runtime`] as a `&str`, for command lines (`--cuda-runtime`, `--nvml`, ...).
pub fn fake_runtime_path() -> &'static str {
    fake_runtime().to_str().expect("UTF-8 path")
}

/// [`fake_runtime`] for a test binary that loads the fake into its own process: the fake
/// reads its `CHD_FAKE_*` settings once per process, so `vars` are set before anything
/// loads it. The first call of the process wins; every test of such a binary calls this
/// with the same settings before it touches the fake.
pub fn fake_runtime_with(vars: &[(&str, &str)]) -> &'static PathBuf {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        for (k, v) in vars {
            // SAFETY: `set_var` races with threads reading the environment. This runs once,
            // inside `Once`, and every test of the binary calls it before loading the fake
            // or reading the environment itself, so no thread reads while it writes (the
            // test harness reads its own variables only before starting the tests).
            unsafe { std::env::set_var(k, v) };
        }
    });
    fake_runtime()
}
