//! Saving the store to `state.json` after every window and at exit. A save that fails (the
//! state directory turned read-only, the disk or quota is full) costs only that save: it is
//! counted in `chd_state_save_errors_total{reason}` and logged as a warning naming the path
//! and the OS error (when a run of failures starts and whenever the error changes, so a
//! broken directory does not repeat itself every interval), probing goes on with the
//! matrix in memory, and the next save that succeeds writes all of it and says how many
//! failed before it.

use std::path::PathBuf;

use super::metrics::ProbeMetrics;
use crate::store::{persist, unix_now, SharedStore};

/// Saves one store to one directory and keeps the tally of failed saves.
pub struct StateSaver {
    dir: PathBuf,
    store: SharedStore,
    metrics: ProbeMetrics,
    /// Failed saves since the last one that succeeded.
    failed: u64,
    /// The error of the last failed save, to log a changed one again.
    last_error: Option<String>,
}

/// How a save ended: `None` written, else the `reason` label and the message.
type Outcome = Option<(&'static str, String)>;

impl StateSaver {
    pub fn new(dir: PathBuf, store: SharedStore, metrics: ProbeMetrics) -> StateSaver {
        StateSaver {
            dir,
            store,
            metrics,
            failed: 0,
            last_error: None,
        }
    }

    /// Write a snapshot of the store (off the async threads). `at_exit`: the last save
    /// before chd stops, whose failure is always logged (what it did not write is lost).
    pub async fn save(&mut self, at_exit: bool) {
        let store = self.store.clone();
        let dir = self.dir.clone();
        let result = tokio::task::spawn_blocking(move || {
            let snapshot = store.read().unwrap_or_else(|p| p.into_inner()).clone();
            persist::save(&dir, &snapshot, unix_now())
        })
        .await;
        let outcome = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some((e.reason(), e.to_string())),
            Err(e) => Some(("other", format!("state save task failed: {e}"))),
        };
        self.record(outcome, at_exit);
    }

    /// Count and log one save's outcome.
    fn record(&mut self, outcome: Outcome, at_exit: bool) {
        match outcome {
            None => {
                if self.failed > 0 {
                    tracing::info!(
                        failed_saves = self.failed,
                        "state saved to {} again, the whole matrix, after {} failed saves",
                        persist::state_path(&self.dir).display(),
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
        saver.save(false).await;
        saver.save(false).await;
        assert_eq!(saver.failed, 2);
        assert_eq!(errors(&metrics, "other"), 2);
        saver.record(Some(("no_space", "full".into())), false);
        assert_eq!(errors(&metrics, "no_space"), 1);
        assert_eq!(saver.last_error.as_deref(), Some("full"));

        saver.dir = dir.path().to_path_buf();
        saver.save(false).await;
        assert_eq!((saver.failed, saver.last_error.as_deref()), (0, None));
        assert_eq!(errors(&metrics, "other"), 2, "a success counts nothing");
        match persist::load(dir.path(), 6.0) {
            persist::Loaded::Restored(s) => assert_eq!(s.last_success()["h2d"], 5.0),
            other => panic!("{other:?}"),
        }
    }
}
