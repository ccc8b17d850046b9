//! Paths, tools and processes the deployment tests share: the repository root, the binary
//! under test, required tools (a missing one fails with its install command), commands run
//! to completion, temp dirs, relative paths.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn chd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_chd")
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A tool the test cannot run without: its path, or a failure that says how to install it.
pub(crate) fn require_tool(name: &str, install: &str) -> PathBuf {
    which(name).unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH, and tests/deploy/ needs it. Install it: {install} \
             (scripts/test.sh installs every test tool)."
        )
    })
}

pub(crate) const KUBERNETES_VALIDATE_INSTALL: &str = "pip install kubernetes-validate==1.37.0";

/// `kubernetes-validate` as a command: the script pip installs, else the module.
pub(crate) fn kubernetes_validate() -> Command {
    if let Some(exe) = which("kubernetes-validate") {
        return Command::new(exe);
    }
    for python in ["python3", "python"] {
        if let Some(py) = which(python) {
            let probe = Command::new(&py)
                .args(["-c", "import kubernetes_validate"])
                .output();
            if probe.is_ok_and(|o| o.status.success()) {
                let mut cmd = Command::new(py);
                cmd.args(["-m", "kubernetes_validate"]);
                return cmd;
            }
        }
    }
    panic!(
        "`kubernetes-validate` is neither on PATH nor an importable Python module, and \
         tests/deploy/ needs it. Install it with `{KUBERNETES_VALIDATE_INSTALL}` \
         (scripts/test.sh installs every test tool)."
    )
}

pub(crate) struct Ran {
    pub(crate) success: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) what: String,
}

impl Ran {
    pub(crate) fn expect_success(self) -> Ran {
        assert!(
            self.success,
            "{} failed:\n--- stdout\n{}\n--- stderr\n{}",
            self.what, self.stdout, self.stderr
        );
        self
    }
}

pub(crate) fn run(cmd: &mut Command) -> Ran {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    Ran {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        what,
    }
}

pub(crate) fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("deploy-test-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

/// Relative path from `from` to `to` (kustomize refuses absolute paths).
pub(crate) fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let to = to.canonicalize().unwrap();
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..f.len() {
        rel.push("..");
    }
    for c in &t[common..] {
        rel.push(c.as_os_str());
    }
    rel
}
