//! ClusterHealthDetect recordings, through the reader's public entry point only
//! (`format::cluster_health::read` on a run directory), so the target outlives changes of
//! how the reader works inside.

use chd::format::cluster_health::{self, AFFINITY_FILE, RESULTS_FILE};

/// The input up to its first NUL is `results.json`, the rest `affinity.json` (absent when
/// there is no NUL). A recording that reads has a sample and names the files it read; an
/// error names the directory or one of its files.
pub fn check(data: &[u8]) {
    let (results, affinity) = super::two_files(data);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join(RESULTS_FILE), results).expect("write");
    if let Some(affinity) = affinity {
        std::fs::write(dir.path().join(AFFINITY_FILE), affinity).expect("write");
    }
    match cluster_health::read(dir.path()) {
        Ok(recording) => {
            assert!(!recording.samples.is_empty(), "a recording without samples");
            assert!(!recording.files.is_empty());
            assert!(
                recording.files.iter().all(|f| f.starts_with(dir.path())),
                "{:?}",
                recording.files
            );
            for sample in &recording.samples {
                if let Ok(bytes_per_second) = sample.outcome {
                    assert!(
                        bytes_per_second > 0.0 && bytes_per_second.is_finite(),
                        "{sample:?}"
                    );
                }
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&dir.path().display().to_string()),
                "{message}"
            );
        }
    }
}
