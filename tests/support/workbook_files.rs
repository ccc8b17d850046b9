//! ClusterHealthDetect workbooks and size-sweep files in the tool's exact layouts, written by
//! `scripts/gen-workbook.py` (standard-library Python, as the tool's own writer is). A missing
//! python3 fails the test with what to install, never skips.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Write `kind` (`h2d`, `pair`, `numa`, `empty` workbooks; `sweeps` a directory) at `out`.
pub fn generate(kind: &str, out: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gen-workbook.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg(kind)
        .arg(out)
        .output()
        .expect(
            "python3 is needed to write ClusterHealthDetect workbooks (apt-get install python3)",
        );
    assert!(
        run.status.success(),
        "{} {kind} failed: {}",
        script.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    out.to_path_buf()
}
