//! A `chd serve` whose state directory is a size-limited tmpfs in a private mount namespace
//! of its own (util-linux `unshare`), which the test remounts read-only and fills while chd
//! runs: real `EROFS` and `ENOSPC` from the kernel, for root too (chmod does not stop root),
//! and nothing mounted on the host. As root the namespace is a plain mount namespace; as
//! another user it sits in a user namespace (`--map-root-user`). The test reaches the tmpfs
//! through `/proc/<chd>/root/...` and runs `mount` inside with `nsenter`. Where namespaces or
//! tmpfs mounts are not allowed, [`TmpfsChd::start`] fails and says what is missing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::chd_process::{chd_bin, Chd};

/// Whether this process is root (no user namespace needed).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}

/// `unshare` with the namespaces this user needs.
fn unshare() -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private"]);
    if !is_root() {
        c.arg("--map-root-user");
    }
    c
}

/// Fail, naming what is missing, unless a tmpfs can be mounted in a private mount namespace.
fn require_mounts() {
    let probe = tempfile::tempdir().unwrap();
    let out = unshare()
        .args(["sh", "-c", "mount -t tmpfs -o size=64k chd-probe \"$0\""])
        .arg(probe.path())
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => panic!(
            "this test needs util-linux's `unshare` (apt-get install util-linux): \
             cannot run it: {e}"
        ),
    };
    assert!(
        out.status.success(),
        "this test mounts a tmpfs in a private mount namespace and cannot here ({}; \
         `unshare --mount{}` then `mount -t tmpfs` said: {}). It needs root, or unprivileged \
         user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
         user.max_user_namespaces > 0), and a kernel that lets that namespace mount tmpfs",
        if is_root() { "root" } else { "not root" },
        if is_root() { "" } else { " --map-root-user" },
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// A chd whose state directory is a tmpfs only it sees.
pub struct TmpfsChd {
    pub chd: Chd,
    dir: PathBuf,
}

impl TmpfsChd {
    /// Mount a tmpfs of `size` (`mount -o size=`, e.g. `256k`) on `state_dir` in a new mount
    /// namespace and exec `chd serve --state-dir state_dir ARGS...` there.
    pub fn start(state_dir: &Path, size: &str, args: &[&str]) -> TmpfsChd {
        require_mounts();
        let mut wrapper = unshare();
        // $0: the directory; "$@": chd and its arguments. `exec` keeps chd's pid the
        // child's, so /proc/<pid>/root and nsenter reach the namespace.
        wrapper
            .args([
                "sh",
                "-c",
                &format!("mount -t tmpfs -o size={size},mode=0755 chd-state \"$0\" && exec \"$@\""),
            ])
            .arg(state_dir)
            .arg(chd_bin());
        let chd = Chd::spawn(wrapper, state_dir, args);
        TmpfsChd {
            chd,
            dir: state_dir.to_path_buf(),
        }
    }

    /// `name` in the state directory as chd sees it (through its mount namespace).
    pub fn path(&self, name: &str) -> PathBuf {
        let relative = self.dir.strip_prefix("/").expect("absolute state dir");
        PathBuf::from(format!("/proc/{}/root", self.chd.pid()))
            .join(relative)
            .join(name)
    }

    /// Run `script` with `sh -c` inside chd's mount namespace; `Err` with its stderr.
    pub fn in_namespace(&self, script: &str) -> Result<(), String> {
        let pid = self.chd.pid().to_string();
        let mut c = Command::new("nsenter");
        c.args(["-t", &pid, "-m"]);
        if !is_root() {
            c.args(["-U", "--preserve-credentials"]);
        }
        let out = c
            .args(["sh", "-c", script])
            .output()
            .expect("run nsenter (util-linux)");
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Make the state directory's mount `ro` or `rw` again (a bind remount: the mount
    /// point's flag, which a user namespace may change where a superblock remount is
    /// refused; writes then fail with EROFS all the same). Turning read-only fails with
    /// EBUSY while a file is open for writing (a save in flight): tried again for 10 s.
    pub fn remount(&self, options: &str) {
        let script = format!("mount -o remount,bind,{options} \"{}\"", self.dir.display());
        let start = Instant::now();
        loop {
            match self.in_namespace(&script) {
                Ok(()) => return,
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{script}: {e}"),
            }
        }
    }

    /// Bytes free on the tmpfs.
    pub fn free_bytes(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.path("")).expect("statvfs of the tmpfs");
        st.blocks_available() as u64 * st.fragment_size() as u64
    }

    /// Fill the tmpfs with `filler` until ENOSPC, then give back `leave` bytes of it.
    pub fn fill(&self, leave: u64) {
        use std::io::Write;
        let path = self.path("filler");
        let mut f = std::fs::File::create(&path).expect("create the filler");
        let block = vec![0xa5u8; 4096];
        let err = loop {
            if let Err(e) = f.write_all(&block) {
                break e;
            }
        };
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ENOSPC),
            "filling the tmpfs: {err}"
        );
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
    }
}
