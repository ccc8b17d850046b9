//! What the pair probe holds between cells, and letting it go: communicators per device pair
//! (created once per probe window, or once per one-shot run) and the peer access enabled for
//! the copy method. `release_idle` frees both at the end of every window, so an exporter does
//! not sit on collective buffers (each HCCL communicator holds 2 x `HCCL_BUFFSIZE`, 400 MB by
//! default) or peer mappings between windows.
//!
//! Every teardown runs on its own thread and is waited for only a bounded grace: a destroy or
//! abort that blocks (a driver stuck on a hung collective) cannot block the probe window or
//! the scheduler. Its communicators stay counted as `releasing` until the call returns.
//! Communicators HCCL refuses to destroy (`HCCL_E_AGAIN`: still in use by an allgather that
//! has not returned) are kept `quarantined` and retried at every release; ones a library
//! refused otherwise are given up as `leaked` (retrying could free them twice) and logged.
//! [`PairHold::counts`] exports all of it.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::collective::{CollectiveApi, Released, Teardown};
use super::device_copy::{ApiError, DeviceApi, Handle};
use super::pair_cell::OpGate;
use super::peer_access::{PeerLink, PeerRoute};
use super::ProbeError;

/// How long a release at the end of a window waits for its teardown thread.
pub(crate) const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// Where a communicator chd created stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CommState {
    /// Cached for the pair's next cells.
    InUse,
    /// A destroy or abort is running on a teardown thread that has not returned yet.
    Releasing,
    /// HCCL said `HCCL_E_AGAIN` (in use); destroyed again at every release until it goes.
    Quarantined,
    /// The library refused to release it; chd no longer touches it (a restart frees it).
    Leaked,
}

impl CommState {
    pub const ALL: [CommState; 4] = [
        CommState::InUse,
        CommState::Releasing,
        CommState::Quarantined,
        CommState::Leaked,
    ];

    /// The `state` label.
    pub fn as_str(self) -> &'static str {
        match self {
            CommState::InUse => "in_use",
            CommState::Releasing => "releasing",
            CommState::Quarantined => "quarantined",
            CommState::Leaked => "leaked",
        }
    }
}

#[derive(Debug)]
struct Record {
    /// Identity (a freed handle's address may be handed out again).
    id: u64,
    handle: usize,
    device: i32,
    pair: [i32; 2],
    state: CommState,
}

/// Every communicator chd created and has not seen released; shared with teardown threads.
type Table = Arc<Mutex<Vec<Record>>>;

/// A communicator: (record id, library handle).
type Comm = (u64, usize);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Peer access opened for a pair, and rank threads of cells that gave up on it and may still
/// have copies in flight (access stays until they are gone).
struct PeerHold {
    link: PeerLink,
    stragglers: Vec<Weak<dyn Any + Send + Sync>>,
}

/// What the pair probe holds.
pub(crate) struct PairHold {
    api: Arc<dyn DeviceApi>,
    coll: Option<Arc<dyn CollectiveApi>>,
    table: Table,
    next_id: AtomicU64,
    cached: Mutex<BTreeMap<[i32; 2], [Comm; 2]>>,
    peers: Mutex<BTreeMap<[i32; 2], PeerHold>>,
    /// HCCL communicators held at once on one card, at least 1.
    per_card: usize,
}

/// The `pair` label of two device indices: `0,5`.
pub(crate) fn label(pair: [i32; 2]) -> String {
    format!("{},{}", pair[0], pair[1])
}

impl PairHold {
    /// `per_card`: the HCCL communicators held at once on one card (0 counts as 1).
    pub(crate) fn new(
        api: Arc<dyn DeviceApi>,
        coll: Option<Arc<dyn CollectiveApi>>,
        per_card: u32,
    ) -> Self {
        PairHold {
            per_card: (per_card as usize).max(1),
            api,
            coll,
            table: Arc::new(Mutex::new(Vec::new())),
            next_id: AtomicU64::new(0),
            cached: Mutex::new(BTreeMap::new()),
            peers: Mutex::new(BTreeMap::new()),
        }
    }

    /// The pair's communicators, created on first use (rank r on `pair[r]`).
    pub(crate) fn comms(&self, pair: [i32; 2]) -> Result<[usize; 2], ProbeError> {
        let coll = self
            .coll
            .as_ref()
            .ok_or_else(|| ProbeError::Collective("no collective library".into()))?;
        let mut cached = lock(&self.cached);
        if let Some(c) = cached.get(&pair) {
            return Ok(c.map(|(_, h)| h));
        }
        if coll.one_collective_per_card() {
            let over: Vec<([i32; 2], [Comm; 2])> =
                over_the_bound(cached.keys(), pair, self.per_card)
                    .into_iter()
                    .filter_map(|p| cached.remove(&p).map(|c| (p, c)))
                    .collect();
            for (other, comms) in over {
                tracing::debug!(
                    pair = %label(other),
                    next = %label(pair),
                    per_card = self.per_card,
                    "releasing a pair's communicators before the next pair's are made \
                     (runtime.hccl_communicators_per_card)"
                );
                self.teardown(
                    other,
                    comms.to_vec(),
                    Teardown::Destroy,
                    RELEASE_GRACE,
                    false,
                );
            }
            self.refuse_busy_cards(pair)?;
        }
        let comms = coll
            .init_all(&pair)
            .map_err(|e| ProbeError::Collective(e.to_string()))?;
        let c: [Comm; 2] = [0, 1].map(|r| {
            (
                self.next_id.fetch_add(1, Ordering::Relaxed),
                comms[r] as usize,
            )
        });
        lock(&self.table).extend((0..2).map(|r| Record {
            id: c[r].0,
            handle: c[r].1,
            device: pair[r],
            pair,
            state: CommState::InUse,
        }));
        cached.insert(pair, c);
        Ok(c.map(|(_, h)| h))
    }

    /// For a library that runs one collective at a time per card and cannot abort
    /// (`CollectiveApi::one_collective_per_card`: HCCL): while a communicator on one of
    /// `pair`'s cards is being released or quarantined (a timed-out allgather may still run on
    /// it), no new communicator or collective goes on that card (it would also take another
    /// 2 x `HCCL_BUFFSIZE` per timeout).
    fn refuse_busy_cards(&self, pair: [i32; 2]) -> Result<(), ProbeError> {
        let table = lock(&self.table);
        let busy = table.iter().find(|r| {
            pair.contains(&r.device)
                && matches!(r.state, CommState::Releasing | CommState::Quarantined)
        });
        match busy {
            Some(r) => Err(ProbeError::Quarantined(format!(
                "device {}: a communicator of pair {} is still {} after a cell that did not \
                 finish; no new communicator or collective on the card until it is released",
                r.device,
                label(r.pair),
                r.state.as_str()
            ))),
            None => Ok(()),
        }
    }

    /// The pair's peer route, enabling peer access on first use.
    pub(crate) fn peer(&self, pair: [i32; 2]) -> PeerRoute {
        let mut peers = lock(&self.peers);
        peers
            .entry(pair)
            .or_insert_with(|| PeerHold {
                link: PeerLink::open(&*self.api, pair),
                stragglers: Vec::new(),
            })
            .link
            .route
            .clone()
    }

    /// A cell of `pair` timed out or its collective failed: no rank starts another call
    /// (`gate`), the pair's communicators are aborted on a teardown thread waited for at most
    /// `grace`, and peer access stays until the cell's rank threads (`ranks`) are gone.
    pub(crate) fn give_up(
        &self,
        pair: [i32; 2],
        gate: &OpGate,
        ranks: Weak<dyn Any + Send + Sync>,
        grace: Duration,
    ) {
        let inside = gate.cancel();
        if let Some(comms) = lock(&self.cached).remove(&pair) {
            tracing::info!(
                pair = %label(pair),
                calls_in_flight = inside,
                "aborting the pair's communicators"
            );
            self.teardown(pair, comms.to_vec(), Teardown::Abort, grace, false);
        }
        if let Some(hold) = lock(&self.peers).get_mut(&pair) {
            hold.stragglers.push(ranks);
        }
    }

    /// End of a window (or of the probe): destroy the cached communicators, retry the
    /// quarantined ones, and disable peer access no rank thread still needs.
    pub(crate) fn release_idle(&self) {
        let cached = std::mem::take(&mut *lock(&self.cached));
        for (pair, comms) in cached {
            self.teardown(
                pair,
                comms.to_vec(),
                Teardown::Destroy,
                RELEASE_GRACE,
                false,
            );
        }
        let mut quarantined: BTreeMap<[i32; 2], Vec<Comm>> = BTreeMap::new();
        for r in lock(&self.table)
            .iter()
            .filter(|r| r.state == CommState::Quarantined)
        {
            quarantined
                .entry(r.pair)
                .or_default()
                .push((r.id, r.handle));
        }
        for (pair, comms) in quarantined {
            self.teardown(pair, comms, Teardown::Destroy, RELEASE_GRACE, true);
        }
        let mut peers = lock(&self.peers);
        let pairs: Vec<[i32; 2]> = peers.keys().copied().collect();
        for pair in pairs {
            let Some(hold) = peers.get_mut(&pair) else {
                continue;
            };
            hold.stragglers.retain(|w| w.strong_count() > 0);
            if hold.stragglers.is_empty() {
                if let Some(hold) = peers.remove(&pair) {
                    hold.link.close(&*self.api);
                }
            } else {
                tracing::info!(
                    pair = %label(pair),
                    "keeping peer access until the rank threads of a timed-out cell return"
                );
            }
        }
    }

    /// Release `comms` of `pair` on a teardown thread; wait at most `grace` for it. `retry`:
    /// they were quarantined.
    fn teardown(
        &self,
        pair: [i32; 2],
        comms: Vec<Comm>,
        how: Teardown,
        grace: Duration,
        retry: bool,
    ) {
        let Some(coll) = self.coll.clone() else {
            return;
        };
        set_state(&self.table, &comms, CommState::Releasing);
        let table = self.table.clone();
        let (done_tx, done_rx) = mpsc::channel();
        let mine = comms.clone();
        let spawned = std::thread::Builder::new()
            .name("chd-teardown".into())
            .spawn(move || {
                let ptrs: Vec<Handle> = mine.iter().map(|&(_, h)| h as Handle).collect();
                let released = coll.release(&ptrs, how);
                settle(&table, coll.name(), pair, &mine, released, retry);
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => {
                if done_rx.recv_timeout(grace).is_err() {
                    tracing::warn!(
                        pair = %label(pair),
                        "releasing {} communicators did not return within {grace:?}; the \
                         probe goes on and counts them as releasing until it does",
                        comms.len()
                    );
                }
            }
            Err(e) => {
                tracing::error!(
                    pair = %label(pair),
                    "cannot start a teardown thread ({e}); giving up {} communicators",
                    comms.len()
                );
                set_state(&self.table, &comms, CommState::Leaked);
            }
        }
    }

    /// Communicators by state, and the device memory they hold per device when the library
    /// documents it (None: it does not).
    pub(crate) fn counts(&self) -> (BTreeMap<CommState, usize>, Option<BTreeMap<i32, u64>>) {
        let table = lock(&self.table);
        let mut states = BTreeMap::new();
        for r in table.iter() {
            *states.entry(r.state).or_insert(0) += 1;
        }
        let memory = self
            .coll
            .as_ref()
            .and_then(|c| c.bytes_per_communicator())
            .map(|per| {
                let mut by_device = BTreeMap::new();
                for r in table.iter() {
                    *by_device.entry(r.device).or_insert(0) += per;
                }
                by_device
            });
        (states, memory)
    }
}

/// The held pairs (`held`) to release so that `pair`'s new communicators keep every card
/// within `per_card`: per card of `pair`, the first held pairs on it beyond `per_card - 1`.
fn over_the_bound<'a>(
    held: impl Iterator<Item = &'a [i32; 2]> + Clone,
    pair: [i32; 2],
    per_card: usize,
) -> Vec<[i32; 2]> {
    let mut out: Vec<[i32; 2]> = Vec::new();
    for card in pair {
        let on_card: Vec<[i32; 2]> = held
            .clone()
            .filter(|p| p.contains(&card) && !out.contains(p))
            .copied()
            .collect();
        // Those already in `out` go anyway; the rest plus `pair`'s own must fit.
        let extra = (on_card.len() + 1).saturating_sub(per_card);
        out.extend(on_card.into_iter().take(extra));
    }
    out
}

fn set_state(table: &Table, comms: &[Comm], state: CommState) {
    for r in lock(table).iter_mut() {
        if comms.iter().any(|&(id, _)| id == r.id) {
            r.state = state;
        }
    }
}

/// Record what a release did: gone, busy (quarantined) or refused (leaked), and say so.
fn settle(
    table: &Table,
    library: &str,
    pair: [i32; 2],
    comms: &[Comm],
    released: Released,
    retry: bool,
) {
    let ids = |of: &[(Handle, ApiError)]| -> Vec<u64> {
        comms
            .iter()
            .filter(|(_, h)| of.iter().any(|(p, _)| *p as usize == *h))
            .map(|(id, _)| *id)
            .collect()
    };
    let (busy, failed) = (ids(&released.busy), ids(&released.failed));
    let mine = |r: &Record| comms.iter().any(|&(id, _)| id == r.id);
    let mut t = lock(table);
    t.retain(|r| !mine(r) || busy.contains(&r.id) || failed.contains(&r.id));
    for r in t.iter_mut().filter(|r| mine(r)) {
        if busy.contains(&r.id) {
            r.state = CommState::Quarantined;
        } else if failed.contains(&r.id) {
            r.state = CommState::Leaked;
        }
    }
    drop(t);
    if let Some((_, e)) = released.busy.first().filter(|_| retry) {
        tracing::info!(
            pair = %label(pair),
            "{e}: {} quarantined {library} communicator(s) still in use; trying again at the \
             end of the next probe window",
            busy.len()
        );
    } else if let Some((_, e)) = released.busy.first() {
        tracing::warn!(
            pair = %label(pair),
            "{e}: a collective is still in flight and {library} has no abort; keeping {} \
             communicator(s) quarantined and destroying them again at the end of every probe \
             window",
            busy.len()
        );
    } else if retry && failed.is_empty() {
        tracing::info!(pair = %label(pair), "released the quarantined {library} communicators");
    }
    if let Some((_, e)) = released.failed.first() {
        tracing::error!(
            pair = %label(pair),
            "{e}: giving up {} {library} communicator(s) (counted as leaked; a restart frees \
             them)",
            failed.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::over_the_bound;

    #[test]
    fn a_new_pair_releases_the_held_pairs_that_would_put_a_card_past_its_bound() {
        let held = [[0, 1], [0, 2], [1, 2], [3, 4]];
        // One per card: everything on cards 0 and 1 goes, 3,4 stays.
        assert_eq!(
            over_the_bound(held.iter(), [0, 1], 1),
            [[0, 1], [0, 2], [1, 2]]
        );
        // Two per card: card 0 holds 0,1 and 0,2, so one goes; card 5 holds none.
        assert_eq!(over_the_bound(held.iter(), [0, 5], 2), [[0, 1]]);
        // Room enough: nothing goes.
        assert!(over_the_bound(held.iter(), [5, 6], 1).is_empty());
        assert!(over_the_bound(held.iter(), [0, 3], 3).is_empty());
    }
}
