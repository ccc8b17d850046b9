//! A file write the scheduler starts on the blocking pool and does not wait for (issue 30:
//! a write that blocks, on a hung file system or, before `format::atomic_file`, on a FIFO
//! planted at a temp file's name, stopped the tick loop: no window ended, and SIGTERM could
//! not save). At most one write of a kind is in flight: while it runs, the next is skipped
//! (and said so once), so a stuck file system costs one pool thread, not one per tick.

use std::time::Duration;

use tokio::task::JoinHandle;

/// One kind of write (the state file, the NFD feature file) and the one in flight.
pub struct BackgroundWrite {
    what: &'static str,
    running: Option<JoinHandle<()>>,
    /// A skip was logged and no write has finished since.
    said_stuck: bool,
}

impl BackgroundWrite {
    /// `what` names the file in the log ("state save", "NFD feature file write").
    pub fn new(what: &'static str) -> BackgroundWrite {
        BackgroundWrite {
            what,
            running: None,
            said_stuck: false,
        }
    }

    /// Whether a write started earlier has not finished.
    pub fn in_flight(&self) -> bool {
        self.running.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Run `write` on the blocking pool, unless the previous one is still running: then
    /// skip it and return false.
    pub fn start(&mut self, write: impl FnOnce() + Send + 'static) -> bool {
        if self.in_flight() {
            if !std::mem::replace(&mut self.said_stuck, true) {
                tracing::warn!(
                    "the previous {} has not finished (a hung file system?); skipping new ones \
                     until it does",
                    self.what
                );
            }
            return false;
        }
        if std::mem::take(&mut self.said_stuck) {
            tracing::info!("the stuck {} finished", self.what);
        }
        self.running = Some(tokio::task::spawn_blocking(write));
        true
    }

    /// Wait at most `limit` for the write in flight; whether none is left running.
    pub async fn settle(&mut self, limit: Duration) -> bool {
        let Some(handle) = self.running.as_mut() else {
            return true;
        };
        if tokio::time::timeout(limit, handle).await.is_ok() {
            self.running = None;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test]
    async fn a_write_in_flight_makes_the_next_one_skip_not_wait() {
        let mut w = BackgroundWrite::new("test write");
        let (release, held) = mpsc::channel::<()>();
        assert!(w.start(move || {
            let _ = held.recv();
        }));
        assert!(w.in_flight());
        let (ran_tx, ran) = mpsc::channel();
        let second = ran_tx.clone();
        assert!(!w.start(move || second.send(2).unwrap()), "skipped");
        assert!(
            !w.settle(Duration::from_millis(1)).await,
            "still held: a bounded wait gives up"
        );
        release.send(()).unwrap();
        assert!(w.settle(Duration::from_secs(60)).await);
        assert!(!w.in_flight());
        assert!(w.start(move || ran_tx.send(3).unwrap()));
        assert!(w.settle(Duration::from_secs(60)).await);
        assert_eq!(ran.try_iter().collect::<Vec<_>>(), [3]);
    }
}
