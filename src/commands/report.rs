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
    use chd::format::fabric;
    if !request.inputs.is_empty() && request.inputs.iter().all(|p| fabric::holds_records(p)) {
        return fabric_report(request);
    }
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

/// `chd report` on fabric results (the `fabric/` directories of many nodes).
fn fabric_report(request: &ReportRequest) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use chd::format::fabric;
    let mut records = Vec::new();
    let mut unreadable = 0;
    for input in &request.inputs {
        for path in fabric::find_files(input, 3) {
            match fabric::read(&path) {
                Ok(r) => records.push(r),
                Err(e) => {
                    unreadable += 1;
                    eprintln!("chd report: not used: {e}");
                }
            }
        }
    }
    if records.is_empty() {
        anyhow::bail!("no readable fabric result among {} file(s)", unreadable);
    }
    let out = match &request.out {
        Some(o) => o.clone(),
        None => {
            let first = &request.inputs[0];
            if first.is_dir() {
                first.clone()
            } else {
                first.parent().map(PathBuf::from).unwrap_or_default()
            }
        }
    };
    let written = chd::report::fabric::write(&records, &out)
        .with_context(|| format!("writing the fabric report into {}", out.display()))?;
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
