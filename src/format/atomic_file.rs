//! Writing a file whole, safely, in a directory others may write to: the NFD feature
//! directory (group-writable, where the kernel's protected-symlink and FIFO rules do not
//! apply), the state directory, a run directory. The new content goes to a temporary file in
//! the same directory, named `.<name>.<random>.tmp` (hidden: NFD skips it), created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0644, so a symlink, FIFO or file planted at any
//! name is never followed, opened or truncated (`EEXIST`: another random name is tried), and
//! checked with `fstat` to be a regular file. It is synced and renamed over the target, so a
//! reader sees the old file or the new one, never half of one; a write that fails removes
//! the temporary file. issue 30 found the fixed names before this (`.<name>.tmp`,
//! `state.json.tmp`, `run.json.tmp`, `.chd-write-test`) followed a planted symlink (chd
//! overwrote its target) and blocked on a planted FIFO (the scheduler hung, SIGTERM could not
//! save).

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of every file written here: the owner writes, everyone reads (nfd-worker reads
/// the feature file under its own identity).
pub const MODE: u32 = 0o644;

/// Create `path`, which must not exist in any form (a symlink or FIFO included): never
/// follows, opens or blocks on what is there. Mode [`MODE`] whatever the umask.
pub fn create_new(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file after creating it",
            path.display()
        )));
    }
    file.set_permissions(Permissions::from_mode(MODE))?;
    Ok(file)
}

/// A new temporary file beside `path`, open for writing, removed when dropped unless
/// persisted.
fn temp_beside(path: &Path) -> io::Result<tempfile::NamedTempFile<File>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "chd".into());
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .rand_bytes(10)
        .make_in(dir, create_new)
}

/// Replace `path` with what `write` writes, atomically (see the module's doc). `write` gets
/// the temporary file; buffer inside it if it writes in small pieces.
pub fn write(path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let mut temp = temp_beside(path)?;
    write(temp.as_file_mut())?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    // Make the rename itself durable; a directory that cannot be opened or synced loses
    // nothing already written.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Whether files can be created in `dir` (created first if missing): makes and removes a
/// temporary file there the way [`write()`] does.
pub fn check_writable(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    temp_beside(&dir.join("chd-write-test")).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileTypeExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn writes_whole_with_mode_0644_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chd");
        write(&path, |f| f.write_all(b"a=1\n")).unwrap();
        write(&path, |f| f.write_all(b"a=2\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=2\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        assert_eq!(names(dir.path()), ["chd"]);
    }

    #[test]
    fn a_failed_write_removes_its_temporary_file_and_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write(&path, |f| f.write_all(b"old")).unwrap();
        let e = write(&path, |f| {
            f.write_all(b"half")?;
            Err(io::Error::from(io::ErrorKind::StorageFull))
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["state.json"]);
    }

    /// What an attacker with write access to the directory can plant at the name chd is
    /// about to create: a symlink to a file of someone else's, and a FIFO.
    #[test]
    fn a_planted_symlink_or_fifo_at_the_name_is_neither_followed_nor_opened() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, "precious\n").unwrap();
        let link = dir.path().join(".chd.x.tmp");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create_new(&link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        // A dangling symlink: O_CREAT alone would create its target.
        let dangling = dir.path().join(".chd.y.tmp");
        std::os::unix::fs::symlink(dir.path().join("created-through-link"), &dangling).unwrap();
        assert_eq!(
            create_new(&dangling).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        // A FIFO: opening it for writing would block until someone reads. This returns at
        // once (the test would hang otherwise).
        let fifo = dir.path().join(".chd.z.tmp");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        assert_eq!(
            create_new(&fifo).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
        assert!(!dir.path().join("created-through-link").exists());
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
    }

    #[test]
    fn the_target_itself_a_symlink_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, "precious\n").unwrap();
        let path = dir.path().join("chd");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write(&path, |f| f.write_all(b"a=1\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=1\n");
    }

    #[test]
    fn the_write_check_leaves_nothing_and_fails_on_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        check_writable(&state).unwrap();
        assert!(names(&state).is_empty());
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(check_writable(&file).is_err());
    }
}
