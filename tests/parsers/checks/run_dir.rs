//! A run directory (`format::run_dir::read_run`): `run.json` and `cells.jsonl`.

use chd::format::run_dir::{self, CellLog, RunDirError, CELLS_FILE, RUN_FILE};

/// The input up to its first NUL is `run.json`, the rest `cells.jsonl` (absent when there
/// is no NUL). A run that reads is written again by chd's own writers into a directory
/// that reads back the same plan and samples, and the report's count of its slots is
/// computed; an error names a file of the directory.
pub fn check(data: &[u8]) {
    let (run, cells) = super::two_files(data);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join(RUN_FILE), run).expect("write");
    if let Some(cells) = cells {
        std::fs::write(dir.path().join(CELLS_FILE), cells).expect("write");
    }
    match run_dir::read_run(dir.path()) {
        Ok((run, records)) => {
            let _ = chd::probe::kinds::total_slots(&run.plan);
            let _ = run_dir::done_slots(&records);
            let out = tempfile::tempdir().expect("temp dir");
            let mut log = CellLog::create(out.path(), &run).expect("create");
            for record in &records {
                log.append(record).expect("append");
            }
            drop(log);
            let (run_again, records_again) = run_dir::read_run(out.path())
                .unwrap_or_else(|e| panic!("chd's own run directory does not read: {e}"));
            assert_eq!(run, run_again);
            assert_eq!(records, records_again);
        }
        Err(e) => {
            let named = match &e {
                RunDirError::Io { path, .. } | RunDirError::Format { path, .. } => path.clone(),
                RunDirError::Exists(path) | RunDirError::NoRun(path) => path.clone(),
            };
            assert!(named.starts_with(dir.path()), "{e}");
            assert!(e.to_string().contains(&named.display().to_string()), "{e}");
        }
    }
}
