//! Tests that load a runtime library into the test process itself (the fake runtime through
//! chd's loaders, or a real vendor library) each run alone in a fresh child process of their
//! suite's binary: [`alone!`] at the top of such a test re-runs this binary with
//! `--exact <the test>` and passes when that child passed the test.
//!
//! A lock would not do: the fake reads its `CHD_FAKE_*` settings once per process (the
//! first load wins, and each former test file planted settings of its own with
//! `std::env::set_var`), and its live-allocation and communicator counters are
//! process-wide; a library once loaded stays loaded. In a child the test owns the process:
//! its environment, the fake's settings and counters, whatever the library leaves behind.
//! The suite's other tests, and the parent, never set the environment, so the `chd` they
//! spawn inherits an environment no test changes.

use std::process::Command;

/// Set in the child to the name of the one test it runs.
const CHILD: &str = "CHD_TEST_ALONE";

/// `true` in the child that runs `test` (`module::function`, its name in this binary's test
/// list): the caller goes on with the test's body. `false` in the parent, once a child of
/// this binary ran exactly that test and passed; a failing child fails the caller with the
/// child's output.
pub fn in_child(test: &str) -> bool {
    if std::env::var_os(CHILD).is_some_and(|t| t == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("path of this test binary");
    let out = Command::new(&exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, test)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} {test}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The harness shows this on failure, or with --nocapture.
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "{test} failed in its own process ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("test result: ok. 1 passed;"),
        "the child of {test} ran no such test (is `alone!` given the test's own name?):\n{stdout}"
    );
    false
}

/// First statement of a test that loads a runtime library in-process: `alone!(its_name);`.
/// The parent returns here once the child, which runs the rest, passed.
macro_rules! alone {
    ($test:ident) => {
        let path = module_path!();
        let module = path.split_once("::").map_or("", |(_, m)| m);
        if !$crate::alone::in_child(&format!("{module}::{}", stringify!($test))) {
            return;
        }
    };
}
