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

/// [`fake_runtime`] for a test that loads the fake into its own process: the fake reads its
/// `CHD_FAKE_*` settings once per process, so `vars` are set before anything loads it. Such a
/// test changes the process's environment and the fake's process-wide state, so it runs alone
/// in a child process of its suite's binary (`alone!`, support/alone.rs); called anywhere else
/// this panics. The first call of the process wins.
pub fn fake_runtime_with(vars: &[(&str, &str)]) -> &'static PathBuf {
    // support/alone.rs sets this in the child that runs one test.
    assert!(
        std::env::var_os("CHD_TEST_ALONE").is_some(),
        "fake_runtime_with sets the process's environment: the calling test must begin with \
         alone!(its_name) (support/alone.rs) to run in a process of its own"
    );
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        for (k, v) in vars {
            // SAFETY: `set_var` races with threads reading the environment. This runs once,
            // inside `Once`, in a process that runs this one test (`alone!`), which calls it
            // before loading the fake or reading the environment itself, so no thread reads
            // while it writes (the test harness reads its own variables only before starting
            // the test).
            unsafe { std::env::set_var(k, v) };
        }
    });
    fake_runtime()
}
