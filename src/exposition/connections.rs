//! The HTTP server's connection bound: at most `max_connections` open at once, and the
//! metrics that show it.
//!
//! A connection is *busy* from the moment its request is let in (its head parsed and, with
//! basic auth, its credentials accepted) until hyper has taken its response body (into its
//! write buffer: up to `server::MAX_BUF_BYTES` of it may still be on the way to a slow
//! reader), *idle* otherwise (waiting for its first or next request, a half-sent header
//! included, or for its credentials' bcrypt check: a flood of wrong passwords cannot pin
//! slots). At the cap a new connection is admitted by closing the
//! connection that has been idle longest, so a flood of silent or half-open connections
//! cannot lock out a scraper or `/healthz`: each new one displaces the oldest idler, and a
//! client that sends its request at once is served. Only when every slot is busy does the
//! server stop accepting; new connections then wait in the kernel's listen backlog until
//! a response finishes. Busy connections are never closed for room.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use super::basic_auth::Refusal;

/// `reason` of `chd_http_connections_dropped_total`.
pub const DROP_REASONS: [&str; 3] = ["header_timeout", "evicted", "tls_handshake"];

/// The `reason` label of the connection and login counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub reason: String,
}

/// The server's connection metrics.
#[derive(Debug, Clone, Default)]
pub struct ServerMetrics {
    /// `chd_http_connections`: open now.
    pub open: Gauge,
    /// `chd_http_connection_limit`: `server.max_connections`.
    pub limit: Gauge,
    /// `chd_http_connections_accepted_total`.
    pub accepted: Counter,
    /// `chd_http_connections_dropped_total{reason}`: closed by chd, not the client.
    pub dropped: Family<DropLabels, Counter>,
    /// `chd_http_auth_failures_total{reason}`: requests basic auth did not let in.
    pub auth_failures: Family<DropLabels, Counter>,
}

impl ServerMetrics {
    /// Register the metrics (every `reason` at zero) with the limit they report.
    pub fn register(registry: &mut Registry, max_connections: usize) -> ServerMetrics {
        let m = ServerMetrics::default();
        m.limit.set(max_connections as i64);
        for reason in DROP_REASONS {
            m.drop_counter(reason);
        }
        for refusal in Refusal::ALL {
            m.auth_counter(refusal);
        }
        registry.register(
            "chd_http_connections",
            "HTTP connections open now (busy or idle)",
            m.open.clone(),
        );
        registry.register(
            "chd_http_connection_limit",
            "Most HTTP connections open at once (server.max_connections)",
            m.limit.clone(),
        );
        registry.register(
            "chd_http_connections_accepted",
            "HTTP connections accepted",
            m.accepted.clone(),
        );
        registry.register(
            "chd_http_connections_dropped",
            "HTTP connections chd closed before the client did: header_timeout (no complete \
             request head within server.header_timeout, idle keep-alive included), evicted \
             (the longest-idle connection, closed at server.max_connections for a new one), \
             tls_handshake (a TLS handshake that failed or did not finish within \
             server.header_timeout)",
            m.dropped.clone(),
        );
        registry.register(
            "chd_http_auth_failures",
            "Requests basic auth did not let in (server.web_config_file with \
             basic_auth_users): missing (no or malformed Basic credentials), wrong (bcrypt \
             checked them and they did not match, unknown users included), repeated \
             (credentials that failed before, refused from the cache without bcrypt), busy \
             (not checked, answered 503: the bcrypt queue was full or a check from the same \
             address was pending)",
            m.auth_failures.clone(),
        );
        m
    }

    fn auth_counter(&self, refusal: Refusal) -> Counter {
        self.auth_failures
            .get_or_create(&DropLabels {
                reason: refusal.label().to_string(),
            })
            .clone()
    }

    /// Count a request basic auth refused.
    pub fn auth_refused(&self, refusal: Refusal) {
        self.auth_counter(refusal).inc();
    }

    fn drop_counter(&self, reason: &str) -> Counter {
        self.dropped
            .get_or_create(&DropLabels {
                reason: reason.to_string(),
            })
            .clone()
    }

    /// Count a connection closed for `reason` (one of [`DROP_REASONS`]).
    pub fn dropped(&self, reason: &str) {
        self.drop_counter(reason).inc();
    }
}

struct Slot {
    /// Since when the connection waits for a request; `None` while it serves one.
    idle_since: Option<Instant>,
    /// Told to close when the slot is taken for a newer connection.
    evict: Arc<Notify>,
}

struct State {
    next_id: u64,
    open: BTreeMap<u64, Slot>,
}

/// The connection table shared by the accept loop and the connections.
pub struct Limit {
    max: usize,
    state: Mutex<State>,
    /// Signalled when a slot frees or a connection turns idle.
    changed: Notify,
    metrics: ServerMetrics,
}

impl Limit {
    pub fn new(max: usize, metrics: ServerMetrics) -> Arc<Limit> {
        Arc::new(Limit {
            max: max.max(1),
            state: Mutex::new(State {
                next_id: 0,
                open: BTreeMap::new(),
            }),
            changed: Notify::new(),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn has_room(state: &State, max: usize) -> bool {
        state.open.len() < max || state.open.values().any(|s| s.idle_since.is_some())
    }

    /// Wait until a new connection could be admitted: a free slot or an idle one.
    pub async fn room(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if Limit::has_room(&self.lock(), self.max) {
                return;
            }
            notified.await;
        }
    }

    /// Admit a just-accepted connection, closing the longest-idle one at the cap; `None`
    /// when every slot is busy (wait for [`Limit::room`] and try again).
    pub fn admit(self: &Arc<Limit>) -> Option<Ticket> {
        let mut state = self.lock();
        if state.open.len() >= self.max {
            let oldest = state
                .open
                .iter()
                .filter_map(|(id, s)| s.idle_since.map(|t| (t, *id)))
                .min()?
                .1;
            if let Some(slot) = state.open.remove(&oldest) {
                slot.evict.notify_one();
                self.metrics.dropped("evicted");
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let evict = Arc::new(Notify::new());
        state.open.insert(
            id,
            Slot {
                idle_since: Some(Instant::now()),
                evict: evict.clone(),
            },
        );
        self.metrics.open.set(state.open.len() as i64);
        self.metrics.accepted.inc();
        Some(Ticket {
            limit: self.clone(),
            id,
            evict,
        })
    }

    fn set_busy(&self, id: u64, busy: bool) {
        if let Some(slot) = self.lock().open.get_mut(&id) {
            slot.idle_since = (!busy).then(Instant::now);
        }
        if !busy {
            self.changed.notify_waiters();
        }
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }
}

/// One admitted connection's slot; dropping it frees the slot.
pub struct Ticket {
    limit: Arc<Limit>,
    id: u64,
    evict: Arc<Notify>,
}

impl Ticket {
    /// Resolves when the slot was taken for a newer connection: close now.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// Mark the connection busy until the returned guard drops.
    pub fn busy(self: &Arc<Ticket>) -> Busy {
        self.limit.set_busy(self.id, true);
        Busy(self.clone())
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.limit.lock();
        state.open.remove(&self.id);
        self.limit.metrics.open.set(state.open.len() as i64);
        drop(state);
        self.limit.changed.notify_waiters();
    }
}

/// A request in progress on a connection (see [`Ticket::busy`]).
pub struct Busy(Arc<Ticket>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.limit.set_busy(self.0.id, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    fn limit(max: usize) -> Arc<Limit> {
        Limit::new(max, ServerMetrics::default())
    }

    #[test]
    fn the_longest_idle_connection_makes_room() {
        let l = limit(2);
        let a = Arc::new(l.admit().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = Arc::new(l.admit().unwrap());
        let c = l.admit().unwrap();
        assert_eq!(l.metrics().open.get(), 2);
        assert_eq!(l.metrics().drop_counter("evicted").get(), 1);
        // `a` was told to go; `b` was not.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut fa = Box::pin(a.evicted());
        let mut fb = Box::pin(b.evicted());
        assert!(fa.as_mut().poll(&mut cx).is_ready());
        assert!(fb.as_mut().poll(&mut cx).is_pending());
        drop((fa, fb, c));
    }

    #[test]
    fn busy_connections_are_never_evicted() {
        let l = limit(2);
        let a = Arc::new(l.admit().unwrap());
        let b = Arc::new(l.admit().unwrap());
        let busy_a = a.busy();
        let busy_b = b.busy();
        assert!(l.admit().is_none(), "both busy: no room");
        drop(busy_a);
        let c = l.admit().expect("a is idle again");
        assert_eq!(l.metrics().open.get(), 2);
        drop((busy_b, c, a, b));
        assert_eq!(l.metrics().open.get(), 0);
    }

    #[tokio::test]
    async fn room_waits_while_every_slot_is_busy() {
        let l = limit(1);
        let a = Arc::new(l.admit().unwrap());
        let busy = a.busy();
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "room while the only slot is busy");
        drop(busy);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("room once the slot is idle")
            .unwrap();
    }
}
