//! `chd report`: load a run directory or a ClusterHealthDetect `results.json` and write the
//! report files next to it (or into `--out`).

use std::path::PathBuf;

/// `chd report` as asked.
#[derive(Debug, Clone, Default)]
pub struct ReportRequest {
    /// A run directory, a directory holding `results.json`, or a results / run file.
    pub input: PathBuf,
    /// Where to write; default: the run directory (the file's directory).
    pub out: Option<PathBuf>,
}

/// Run `chd report`.
pub fn run(request: &ReportRequest) -> anyhow::Result<()> {
    let (ds, dir) = chd::dataset::load(&request.input)?;
    for note in ds.partial.iter().chain(&ds.notes) {
        eprintln!("chd report: note: {note}");
    }
    for r in &ds.rejected {
        eprintln!(
            "chd report: {} row{} not used: {} (first: {})",
            r.count,
            if r.count == 1 { "" } else { "s" },
            r.reason,
            r.first
        );
    }
    let out = request.out.clone().unwrap_or(dir);
    let written = chd::report::write(&ds, &out)?;
    for f in &written.files {
        println!("wrote {}", f.display());
    }
    if written.findings.is_empty() {
        println!("findings: none");
    }
    for f in &written.findings {
        println!("finding: {f}");
    }
    Ok(())
}
