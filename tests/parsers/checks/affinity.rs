//! `affinity.json` as `chd probe affinity` writes it (`format::affinity_file`).

use chd::format::affinity_file::{self, AffinityFileError};

/// Rows that read are written back as a file that reads to the same rows; an error names
/// the file.
pub fn check(data: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(affinity_file::AFFINITY_FILE);
    std::fs::write(&path, data).expect("write");
    match affinity_file::read(&path) {
        Ok(rows) => {
            let out = tempfile::tempdir().expect("temp dir");
            let written = affinity_file::write(out.path(), &rows).expect("write back");
            assert_eq!(affinity_file::read(&written).expect("reads back"), rows);
        }
        Err(e) => {
            assert!(
                matches!(&e, AffinityFileError::Json { path: p, .. } | AffinityFileError::Io { path: p, .. } if *p == path)
            );
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
    }
}
