//! `chd report`: load a run directory, a ClusterHealthDetect recording or workbook, or
//! size-sweep files, and write the report files next to the (first) input (or into `--out`).

use std::path::PathBuf;

/// `chd report` as asked.
#[derive(Debug, Clone, Default)]
pub struct ReportRequest {
    /// A run directory, a directory holding `results.json`, a results / run / workbook file,
    /// or one or more size-sweep files.
    pub inputs: Vec<PathBuf>,
    /// Where to write; default: the run directory (the file's directory).
    pub out: Option<PathBuf>,
}

/// Run `chd report`.
pub fn run(request: &ReportRequest) -> anyhow::Result<()> {
    let (ds, dir) = chd::dataset::load_all(&request.inputs)?;
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
