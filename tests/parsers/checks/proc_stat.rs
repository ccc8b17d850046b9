//! The CPU idle gate's inputs (`schedule::gate::CpuGate::sample`): `/proc/stat` and
//! `/proc/self/stat` under a procfs root.

use chd::schedule::gate::CpuGate;

/// The input up to its first NUL is `stat`, the rest `self/stat` (this process's own when
/// there is no NUL). A sample that reads has no more busy than total time; an error names
/// the file it could not use.
pub fn check(data: &[u8]) {
    let (stat, self_stat) = super::two_files(data);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("self")).expect("mkdir");
    std::fs::write(dir.path().join("stat"), stat).expect("write");
    let own = match self_stat {
        Some(text) => text.to_vec(),
        None => std::fs::read("/proc/self/stat").expect("/proc/self/stat"),
    };
    std::fs::write(dir.path().join("self/stat"), own).expect("write");
    match CpuGate::new(dir.path(), 0.5).sample() {
        Ok(times) => assert!(times.busy <= times.total, "{times:?}"),
        Err(e) => {
            assert!(e.path.starts_with(dir.path()), "{e}");
            assert!(e.to_string().contains(&e.path.display().to_string()), "{e}");
        }
    }
}
