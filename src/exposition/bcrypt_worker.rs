//! The one thread that runs basic auth's bcrypt checks, fed by a bounded queue.
//!
//! bcrypt is CPU-bound by design (~60 ms at cost 10), so checks that run on the shared blocking
//! pool can take every pool thread and make a valid scrape's encoding wait behind other
//! clients' wrong passwords (issue 30: 30 connections looping a wrong password pushed a valid,
//! cached `/metrics` from 2 ms to 1.4 s). Here checks run one at a time on a thread of their
//! own, and a check is queued only when the queue has room ([`QUEUE`]) and no other check of
//! the same client address is queued or running: every other request is answered at once
//! ([`Refused`]), never made to wait. So a client can keep at most one bcrypt pending, a new
//! login waits for at most [`QUEUE`] checks before its own, and nothing else in the server
//! ever waits for bcrypt. A check whose requester has gone (its connection closed or was
//! evicted while it waited) is dropped unrun.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Checks queued at most, besides the one running.
pub const QUEUE: usize = 8;

/// The check itself: whether `password` matches `hash`. bcrypt in chd; tests give their own.
pub type Verify = Arc<dyn Fn(&[u8], &str) -> bool + Send + Sync>;

/// Why a check was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// [`QUEUE`] checks are waiting already.
    Full,
    /// A check of the same client address is queued or running.
    PeerPending,
    /// The worker thread could not be started or has stopped.
    NoWorker,
}

struct Job {
    peer: IpAddr,
    hash: String,
    password: Vec<u8>,
    reply: oneshot::Sender<bool>,
}

/// The queue's sending end and the addresses with a check pending.
pub struct BcryptWorker {
    jobs: SyncSender<Job>,
    pending: Arc<Mutex<HashSet<IpAddr>>>,
}

fn lock(pending: &Mutex<HashSet<IpAddr>>) -> MutexGuard<'_, HashSet<IpAddr>> {
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

impl BcryptWorker {
    /// Start the worker thread (`chd-bcrypt`) with `verify`; it ends when the worker is
    /// dropped.
    pub fn start(verify: Verify) -> std::io::Result<BcryptWorker> {
        let (jobs, queue) = sync_channel::<Job>(QUEUE);
        let pending = Arc::new(Mutex::new(HashSet::new()));
        let done = pending.clone();
        std::thread::Builder::new()
            .name("chd-bcrypt".into())
            .spawn(move || {
                for job in queue {
                    let matches = !job.reply.is_closed() && verify(&job.password, &job.hash);
                    // Free the address before answering, so its next request may queue.
                    lock(&done).remove(&job.peer);
                    let _ = job.reply.send(matches);
                }
            })?;
        Ok(BcryptWorker { jobs, pending })
    }

    /// Queue a check of `password` against `hash` for the client at `peer`; the answer comes
    /// on the returned receiver (closed without one only if the worker stopped).
    pub fn submit(
        &self,
        peer: IpAddr,
        hash: String,
        password: Vec<u8>,
    ) -> Result<oneshot::Receiver<bool>, Refused> {
        let mut pending = lock(&self.pending);
        if !pending.insert(peer) {
            return Err(Refused::PeerPending);
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            peer,
            hash,
            password,
            reply,
        };
        match self.jobs.try_send(job) {
            Ok(()) => Ok(answer),
            Err(e) => {
                pending.remove(&peer);
                Err(match e {
                    TrySendError::Full(_) => Refused::Full,
                    TrySendError::Disconnected(_) => Refused::NoWorker,
                })
            }
        }
    }
}

/// A verifier for tests that holds every check until it is opened.
#[cfg(test)]
pub(crate) mod gate {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};

    use super::Verify;

    /// Holds checks while closed (it starts closed) and counts the ones that finished.
    #[derive(Default)]
    pub(crate) struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
        entered: AtomicUsize,
        finished: AtomicUsize,
    }

    impl Gate {
        /// A verifier that waits for the gate, then answers with `check`.
        pub(crate) fn verifier(self: &Arc<Self>, check: fn(&[u8], &str) -> bool) -> Verify {
            let gate = self.clone();
            Arc::new(move |password, hash| {
                gate.entered.fetch_add(1, Ordering::SeqCst);
                let mut open = gate.open.lock().unwrap();
                while !*open {
                    open = gate.opened.wait(open).unwrap();
                }
                drop(open);
                let answer = check(password, hash);
                gate.finished.fetch_add(1, Ordering::SeqCst);
                answer
            })
        }

        pub(crate) fn set(&self, open: bool) {
            *self.open.lock().unwrap() = open;
            self.opened.notify_all();
        }

        /// Checks started so far (held at the gate while it is closed, or finished).
        pub(crate) fn entered(&self) -> usize {
            self.entered.load(Ordering::SeqCst)
        }

        /// Checks finished so far.
        pub(crate) fn finished(&self) -> usize {
            self.finished.load(Ordering::SeqCst)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gate::Gate;
    use super::*;

    /// The tests' "hash" is the password itself.
    fn same(password: &[u8], hash: &str) -> bool {
        password == hash.as_bytes()
    }

    fn peer(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[tokio::test]
    async fn one_check_per_address_and_a_bounded_queue_the_rest_answered_at_once() {
        let gate = Arc::new(Gate::default());
        let worker = BcryptWorker::start(gate.verifier(same)).unwrap();
        // The first check runs (and blocks in the gate); QUEUE more wait behind it.
        let mut answers = vec![worker.submit(peer(0), "x".into(), b"x".to_vec()).unwrap()];
        while worker.pending.lock().unwrap().len() < 1 + QUEUE {
            let n = answers.len() as u8;
            match worker.submit(peer(n), "x".into(), b"no".to_vec()) {
                Ok(a) => answers.push(a),
                // The worker has not taken the first job off the queue yet.
                Err(Refused::Full) => tokio::task::yield_now().await,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(answers.len(), 1 + QUEUE);
        assert_eq!(
            worker.submit(peer(200), "x".into(), b"x".to_vec()).err(),
            Some(Refused::Full)
        );
        assert_eq!(
            worker.submit(peer(3), "x".into(), b"x".to_vec()).err(),
            Some(Refused::PeerPending)
        );
        gate.set(true);
        let mut results = Vec::new();
        for a in answers {
            results.push(a.await.unwrap());
        }
        assert!(results[0]);
        assert!(results[1..].iter().all(|ok| !ok));
        // Every address is free again.
        assert!(worker.pending.lock().unwrap().is_empty());
        let again = worker.submit(peer(3), "y".into(), b"y".to_vec()).unwrap();
        assert!(again.await.unwrap());
    }

    #[tokio::test]
    async fn a_check_whose_requester_left_is_not_run() {
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let gate = Arc::new(Gate::default());
        let gated = gate.verifier(same);
        let worker = BcryptWorker::start(Arc::new(move |p, h| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            gated(p, h)
        }))
        .unwrap();
        let first = worker.submit(peer(1), "a".into(), b"a".to_vec()).unwrap();
        let gone = loop {
            match worker.submit(peer(2), "b".into(), b"b".to_vec()) {
                Ok(a) => break a,
                Err(Refused::Full) => tokio::task::yield_now().await,
                Err(e) => panic!("{e:?}"),
            }
        };
        drop(gone);
        gate.set(true);
        assert!(first.await.unwrap());
        // The address is free once the dropped check was skipped; the next one runs.
        let last = loop {
            match worker.submit(peer(2), "c".into(), b"c".to_vec()) {
                Ok(a) => break a,
                Err(Refused::PeerPending) => tokio::task::yield_now().await,
                Err(e) => panic!("{e:?}"),
            }
        };
        assert!(last.await.unwrap());
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
