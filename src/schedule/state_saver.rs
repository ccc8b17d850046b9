//! Saving the store to `state.json` after every window and at exit. A save that fails (the
//! state directory turned read-only, the disk or quota is full) costs only that save: it is
//! counted in `chd_state_save_errors_total{reason}` and logged as a warning naming the path
//! and the OS error (when a run of failures starts and whenever the error changes, so a
//! broken directory does not repeat itself every interval), probing goes on with the
//! matrix in memory, and the next save that succeeds writes all of it and says how many
//! failed before it. Saves run on the blocking pool and the scheduler does not wait for them
//! ([`super::background_write`]): a save that hangs skips the next ones until it ends, and at
//! exit chd waits for it and for the last save at most [`EXIT_WAIT`] each.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::background_write::BackgroundWrite;
use super::metrics::ProbeMetrics;
use crate::store::{persist, unix_now, SharedStore};

/// The longest chd waits at exit for a save in flight, then for the last save. Two of them
/// and the window's last cell fit the 60 s chd's systemd unit and DaemonSet give SIGTERM.
pub const EXIT_WAIT: Duration = Duration::from_secs(15);

/// The tally of failed saves, kept by whichever save finishes.
struct Tally {
    metrics: ProbeMetrics,
    /// Failed saves since the last one that succeeded.
    failed: u64,
    /// The error of the last failed save, to log a changed one again.
    last_error: Option<String>,
}

/// Saves one store to one directory and keeps the tally of failed saves.
pub struct StateSaver {
    dir: PathBuf,
    store: SharedStore,
    tally: Arc<Mutex<Tally>>,
    write: BackgroundWrite,
}

/// How a save ended: `None` written, else the `reason` label and the message.
type Outcome = Option<(&'static str, String)>;

impl StateSaver {
    pub fn new(dir: PathBuf, store: SharedStore, metrics: ProbeMetrics) -> StateSaver {
        StateSaver {
            tally: Arc::new(Mutex::new(Tally {
                metrics,
                failed: 0,
                last_error: None,
            })),
            dir,
            store,
            write: BackgroundWrite::new("state save"),
        }
    }

    /// Start writing a snapshot of the store (off the async threads); returns without
    /// waiting, unless `at_exit`: the last save before chd stops, whose failure is always
    /// logged (what it did not write is lost), waited for at most [`EXIT_WAIT`] after at most
    /// as long for a save still in flight.
    pub async fn save(&mut self, at_exit: bool) {
        if at_exit && !self.write.settle(EXIT_WAIT).await {
            tracing::warn!("a state save has not finished within {EXIT_WAIT:?}; saving again");
            self.write = BackgroundWrite::new("state save");
        }
        let store = self.store.clone();
        let dir = self.dir.clone();
        let tally = self.tally.clone();
        self.write.start(move || {
            let snapshot = store.read().unwrap_or_else(|p| p.into_inner()).clone();
            let outcome = persist::save(&dir, &snapshot, unix_now())
                .err()
                .map(|e| (e.reason(), e.to_string()));
            drop(snapshot);
            return_freed_memory();
            tally
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(&dir, outcome, at_exit);
        });
        if at_exit && !self.write.settle(EXIT_WAIT).await {
            tracing::warn!(
                "the last state save has not finished within {EXIT_WAIT:?}; stopping without \
                 it: what was measured since the last save is lost"
            );
        }
    }

    /// Wait at most `limit` for the save in flight; whether none is left running.
    pub async fn settle(&mut self, limit: Duration) -> bool {
        self.write.settle(limit).await
    }
}

/// Hand the pages the snapshot and its encoding freed back to the kernel. The snapshot is
/// many small blocks on whichever blocking-pool thread ran the save; glibc keeps freed blocks
/// in that thread's arena, so without this every pool thread that ever saved would hold a
/// store's worth of free memory in chd's VmRSS (tests/load.rs saw +50-60 MiB in steps at the
/// seed's shape). `malloc_trim` walks every arena once per save: microseconds to a few ms.
#[allow(unsafe_code)] // one libc call, no pointers (see lib.rs)
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only returns free pages of glibc's own
    // arenas to the kernel; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Tally {
    /// Count and log one save's outcome.
    fn record(&mut self, dir: &Path, outcome: Outcome, at_exit: bool) {
        match outcome {
            None => {
                if self.failed > 0 {
                    tracing::info!(
                        failed_saves = self.failed,
                        "state saved to {} again, the whole matrix, after {} failed saves",
                        persist::state_path(dir).display(),
                        self.failed
                    );
                }
                self.failed = 0;
                self.last_error = None;
            }
            Some((reason, message)) => {
                self.failed += 1;
                self.metrics.state_save_error(reason);
                if at_exit {
                    tracing::warn!(
                        reason,
                        "{message}; stopping without saving: what was measured since the last \
                         save is lost"
                    );
                } else if self.last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(
                        reason,
                        failed_saves = self.failed,
                        "{message}; probing goes on with the matrix in memory, and the next \
                         save that succeeds writes all of it (chd_state_save_errors_total \
                         counts every failed save)"
                    );
                } else {
                    tracing::debug!(reason, failed_saves = self.failed, "{message}");
                }
                self.last_error = Some(message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::metrics::ReasonLabels;
    use crate::store::Store;
    use std::sync::{Arc, RwLock};

    fn errors(m: &ProbeMetrics, reason: &str) -> u64 {
        m.state_save_errors
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .get()
    }

    #[tokio::test]
    async fn failed_saves_are_counted_by_reason_and_the_next_one_writes() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = ProbeMetrics::default();
        let store = Arc::new(RwLock::new(Store::default()));
        store.write().unwrap().record_success("h2d", 5.0);
        // A state directory that is a file: every save fails (ENOTDIR, reason `other`).
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        let mut saver = StateSaver::new(blocker.clone(), store.clone(), metrics.clone());
        let wait = Duration::from_secs(60);
        saver.save(false).await;
        assert!(saver.settle(wait).await);
        saver.save(false).await;
        assert!(saver.settle(wait).await);
        let tally = |s: &StateSaver| {
            let t = s.tally.lock().unwrap();
            (t.failed, t.last_error.clone())
        };
        assert_eq!(tally(&saver).0, 2);
        assert_eq!(errors(&metrics, "other"), 2);
        saver
            .tally
            .lock()
            .unwrap()
            .record(&blocker, Some(("no_space", "full".into())), false);
        assert_eq!(errors(&metrics, "no_space"), 1);
        assert_eq!(tally(&saver).1.as_deref(), Some("full"));

        saver.dir = dir.path().to_path_buf();
        saver.save(true).await;
        assert_eq!(tally(&saver), (0, None));
        assert_eq!(errors(&metrics, "other"), 2, "a success counts nothing");
        match persist::load(dir.path(), 6.0) {
            persist::Loaded::Restored(s) => assert_eq!(s.last_success()["h2d"], 5.0),
            other => panic!("{other:?}"),
        }
    }
}
