//! One rank's part in a fabric run. Rank 0 listens for the others, checks each one's proof of
//! the token (and proves its own), hands out the plan, starts each transfer at its sender in
//! turn, gathers the measurements and hands everyone the results. The other ranks connect
//! (retrying until rank 0 is up), answer, run the transfers they are told to and serve their
//! rails' listeners meanwhile.
//!
//! Every wait has a deadline: a rank that never arrives, a wrong token, a rank that dies
//! mid-run end the run on every surviving rank with an error that says which rank and why;
//! rank 0 tells the others before it gives up ([`FromRoot::Abort`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::device::{DeviceFabric, RankChild};
use super::launch::Launch;
use super::plan::{self, RunFacts, Volume};
use super::rails::Rail;
use super::ring::{self, Links};
use super::stream::{self, Listener};
use super::token::{self, Token};
use super::wire::{
    self, CollectiveResult, CollectiveStep, Endpoint, FromRank, FromRoot, Measured, RankInfo, Step,
    Transfer, WireError,
};
use crate::format::fabric::FabricRecord;

/// How long a connected rank's handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

mod device_steps;

/// Everything one rank needs.
#[derive(Debug)]
pub struct Settings {
    pub launch: Launch,
    /// This rank's node (hostname unless named).
    pub node: String,
    pub token: Token,
    /// This rank's rails (their listeners are opened for the run only).
    pub rails: Vec<Rail>,
    pub volume: Volume,
    /// How long rank 0 waits for every rank, and a rank for rank 0.
    pub rendezvous_timeout: Duration,
    /// How long one transfer may run before it is cut.
    pub transfer_timeout: Duration,
    pub backend: String,
    /// The collectives over all ranks, after the rails (none: rails only).
    pub collectives: Vec<CollectiveStep>,
    /// How a device backend runs its rank processes; none: TCP streams and ring (host).
    pub device: Option<DeviceFabric>,
}

impl Settings {
    /// The longest one step (a rail transfer, or one collective) may keep a rank waiting: on
    /// a device backend the receiving side's rank process starts, then both sides transfer.
    fn step_budget(&self) -> Duration {
        match self.device {
            None => self.transfer_timeout + HANDSHAKE,
            Some(_) => (self.transfer_timeout + HANDSHAKE) * 2,
        }
    }
}

/// How a run ended for this rank.
#[derive(Debug)]
pub struct RankOutcome {
    pub run: String,
    /// What this rank keeps (empty unless it measured for its node).
    pub records: Vec<FabricRecord>,
    /// Every rank of the run and every transfer (for `--out`).
    pub ranks: Vec<RankInfo>,
    pub transfers: Vec<Transfer>,
}

/// Why a run failed on this rank.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("rank 0 cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open a listener on rail {rail} ({address}): {source}")]
    RailListener {
        rail: String,
        address: IpAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Rendezvous(String),
    #[error("rank 0 aborted the run: {0}")]
    Aborted(String),
    #[error("{0}")]
    Peer(String),
}

/// Run this rank's part. `started` is when the run began (Unix seconds).
pub fn run(settings: &Settings) -> Result<RankOutcome, (SessionError, FailureFacts)> {
    let started = unix_now();
    // The listeners first: their ports go into the hello.
    let mut listeners = Vec::new();
    let mut endpoints = Vec::new();
    for rail in &settings.rails {
        if settings.device.is_some() {
            // The rank processes listen for themselves.
            endpoints.push(Endpoint {
                rail: rail.clone(),
                port: 0,
            });
            continue;
        }
        let l = Listener::bind(rail).map_err(|source| {
            (
                SessionError::RailListener {
                    rail: rail.name.clone(),
                    address: rail.address,
                    source,
                },
                FailureFacts::new(started),
            )
        })?;
        endpoints.push(Endpoint {
            rail: rail.clone(),
            port: l.port(),
        });
        listeners.push(l);
    }
    let me = RankInfo {
        rank: settings.launch.rank,
        world_size: settings.launch.world_size,
        local_rank: settings.launch.local_rank,
        node: settings.node.clone(),
        endpoints,
        ring: None,
        backend: settings.backend.clone(),
    };
    let outcome = if me.rank == 0 {
        root(settings, me, started)
    } else {
        member(settings, me, started)
    };
    drop(listeners);
    outcome
}

/// What a failed run knew, for its record.
#[derive(Debug, Clone, Default)]
pub struct FailureFacts {
    pub started: f64,
    pub run: Option<String>,
    /// The peer nodes of this node, once the plan was known.
    pub peers: Vec<String>,
}

impl FailureFacts {
    fn new(started: f64) -> Self {
        FailureFacts {
            started,
            ..Default::default()
        }
    }
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A run id: the start time and a random suffix.
fn new_run_id(started: f64) -> String {
    let suffix: u32 = rand::random();
    format!("{}-{:08x}", started as u64, suffix)
}

/// The peers of `me`'s node among the measuring ranks.
fn peers_of(me: u32, ranks: &[RankInfo]) -> Vec<String> {
    let m = plan::measuring(ranks);
    if !m.iter().any(|r| r.rank == me) {
        return Vec::new();
    }
    m.iter()
        .filter(|r| r.rank != me)
        .map(|r| r.node.clone())
        .collect()
}

/// One connected, authenticated rank.
struct Member {
    info: RankInfo,
    conn: TcpStream,
}

enum Arrival {
    Joined(Box<Member>),
    Refused { from: SocketAddr, why: String },
}

fn root(
    settings: &Settings,
    mut me: RankInfo,
    started: f64,
) -> Result<RankOutcome, (SessionError, FailureFacts)> {
    let run = new_run_id(started);
    let mut facts = FailureFacts {
        started,
        run: Some(run.clone()),
        peers: Vec::new(),
    };
    let fail = |e: SessionError, f: &FailureFacts| (e, f.clone());
    let bind_addr = listen_address(
        &settings.launch.rendezvous.host,
        settings.launch.rendezvous.port,
    );
    let listener = TcpListener::bind(bind_addr).map_err(|source| {
        fail(
            SessionError::Listen {
                addr: bind_addr.to_string(),
                source,
            },
            &facts,
        )
    })?;
    listener.set_nonblocking(true).map_err(|source| {
        fail(
            SessionError::Listen {
                addr: bind_addr.to_string(),
                source,
            },
            &facts,
        )
    })?;
    tracing::info!(
        "rank 0 of {} listening on {bind_addr} for {}s",
        settings.launch.world_size,
        settings.rendezvous_timeout.as_secs()
    );

    let (tx, rx) = mpsc::channel::<Arrival>();
    let deadline = Instant::now() + settings.rendezvous_timeout;
    let mut members: BTreeMap<u32, Member> = BTreeMap::new();
    let mut refused: Vec<String> = Vec::new();
    let want = settings.launch.world_size as usize - 1;
    std::thread::scope(|scope| {
        while members.len() < want && Instant::now() < deadline {
            match listener.accept() {
                Ok((conn, from)) => {
                    let tx = tx.clone();
                    let token = &settings.token;
                    let world = settings.launch.world_size;
                    let backend = settings.backend.as_str();
                    scope.spawn(move || {
                        let _ = tx.send(handshake(conn, from, token, world, backend));
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => tracing::warn!("rendezvous accept: {e}"),
            }
            while let Ok(a) = rx.try_recv() {
                admit(&mut members, &mut refused, a);
            }
        }
    });
    // Handshakes that finished after the loop.
    while let Ok(a) = rx.try_recv() {
        admit(&mut members, &mut refused, a);
    }
    drop(listener);
    if members.len() < want {
        let missing: Vec<String> = (1..settings.launch.world_size)
            .filter(|r| !members.contains_key(r))
            .map(|r| r.to_string())
            .collect();
        let mut why = format!(
            "rank{} {} never arrived within {} s",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            settings.rendezvous_timeout.as_secs()
        );
        if !refused.is_empty() {
            why.push_str(&format!(" (refused: {})", refused.join("; ")));
        }
        abort_all(&mut members, &why);
        return Err(fail(SessionError::Rendezvous(why), &facts));
    }
    if !refused.is_empty() {
        tracing::warn!("rendezvous refused: {}", refused.join("; "));
    }

    // Rank 0's ring listener, on the address the others reached it at.
    let ring_listener = if settings.collectives.is_empty() || settings.device.is_some() {
        None
    } else {
        let ip = members
            .values()
            .find_map(|m| m.conn.local_addr().ok())
            .map(|a| a.ip())
            .expect("a world of 2 or more has members");
        match TcpListener::bind(SocketAddr::new(ip, 0)) {
            Ok(l) => {
                me.ring = l.local_addr().ok();
                Some(l)
            }
            Err(source) => {
                let why = format!("rank 0 cannot listen for the ring on {ip}: {source}");
                abort_all(&mut members, &why);
                return Err(fail(SessionError::Peer(why), &facts));
            }
        }
    };
    let mut ranks: Vec<RankInfo> = vec![me.clone()];
    ranks.extend(members.values().map(|m| m.info.clone()));
    let ring_addrs: Vec<SocketAddr> = ranks.iter().filter_map(|r| r.ring).collect();
    if ring_listener.is_some() && ring_addrs.len() != ranks.len() {
        let lacking: Vec<String> = ranks
            .iter()
            .filter(|r| r.ring.is_none())
            .map(|r| r.rank.to_string())
            .collect();
        let why = format!(
            "rank(s) {} have no ring listener: run every rank with the same --collective-sizes",
            lacking.join(", ")
        );
        abort_all(&mut members, &why);
        return Err(fail(SessionError::Peer(why), &facts));
    }
    let steps = plan::steps(&ranks, settings.volume);
    tracing::info!(
        "run {run}: all {} ranks arrived; {} transfers planned",
        ranks.len(),
        steps.len()
    );
    facts.peers = peers_of(0, &ranks);
    let plan = FromRoot::Plan {
        run: run.clone(),
        steps: steps.clone(),
        collectives: settings.collectives.clone(),
        ring: ring_addrs.clone(),
    };
    broadcast(&mut members, &plan, "before the plan reached it")
        .map_err(|why| fail(SessionError::Peer(why), &facts))?;

    let step_wait = settings.transfer_timeout + HANDSHAKE;
    let mut transfers = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        // Everyone hears each step begin: their wait for the next message is one step long.
        broadcast(
            &mut members,
            &FromRoot::Go { step: i },
            &format!("at step {}", i + 1),
        )
        .map_err(|why| fail(SessionError::Peer(why), &facts))?;
        if let Some(dev) = &settings.device {
            let (measured, places) =
                device_steps::root_step(i, steps.len(), step, settings, dev, &mut members)
                    .map_err(|why| {
                        abort_all(&mut members, &why);
                        fail(SessionError::Peer(why), &facts)
                    })?;
            transfers.push(Transfer {
                step: step.clone(),
                measured,
                places,
            });
            continue;
        }
        let measured = if step.sender == 0 {
            measure(step, settings)
        } else {
            let m = members
                .get_mut(&step.sender)
                .expect("a planned sender joined");
            let _ = m.conn.set_read_timeout(Some(step_wait));
            match wire::receive::<FromRank>(&mut m.conn) {
                Ok(FromRank::Measured {
                    step: s, measured, ..
                }) if s == i => measured,
                Ok(other) => {
                    let why = format!(
                        "rank {} sent {other:?} instead of step {}'s measurement",
                        step.sender,
                        i + 1
                    );
                    abort_all(&mut members, &why);
                    return Err(fail(SessionError::Peer(why), &facts));
                }
                Err(e) => {
                    let node = members[&step.sender].info.node.clone();
                    let why = format!(
                        "rank {} ({node}) died during step {} of {} ({} {} -> {}): {}",
                        step.sender,
                        i + 1,
                        steps.len(),
                        step.rail,
                        step.from,
                        step.to,
                        lost(&e)
                    );
                    abort_all(&mut members, &why);
                    return Err(fail(SessionError::Peer(why), &facts));
                }
            }
        };
        transfers.push(Transfer {
            step: step.clone(),
            measured,
            places: Default::default(),
        });
    }
    let mut collectives = Vec::with_capacity(settings.collectives.len());
    let mut links: Option<Links> = None;
    // A device backend's rank process for the collectives, started before the first: its
    // rendezvous goes out with it.
    let mut own = match &settings.device {
        Some(dev) if !settings.collectives.is_empty() => {
            Some(device_steps::collectives_child(dev, settings, 0, None))
        }
        _ => None,
    };
    for (i, c) in settings.collectives.iter().enumerate() {
        let id = match &mut own {
            Some(Ok((_, id))) if i == 0 => Some(id.clone()),
            _ => None,
        };
        let begin = FromRoot::Collective { index: i, id };
        broadcast(&mut members, &begin, &format!("at collective {}", i + 1))
            .map_err(|why| fail(SessionError::Peer(why), &facts))?;
        let mut times = Vec::new();
        let mut errors = Vec::new();
        let mine = match &mut own {
            Some(child) => device_steps::collective_result(child, i, settings),
            None => {
                let listener = ring_listener
                    .as_ref()
                    .expect("a listener when collectives are planned");
                collective(
                    &mut links,
                    listener,
                    &ring_addrs,
                    0,
                    c,
                    settings.transfer_timeout,
                )
            }
        };
        match mine {
            Ok(t) => times.push(t),
            Err(e) => errors.push(format!("rank 0: {e}")),
        }
        for (rank, m) in members.iter_mut() {
            let _ = m.conn.set_read_timeout(Some(settings.step_budget()));
            match wire::receive::<FromRank>(&mut m.conn) {
                Ok(FromRank::Collective {
                    index,
                    seconds,
                    error,
                }) if index == i => {
                    times.extend(seconds);
                    errors.extend(error.map(|e| format!("rank {rank}: {e}")));
                }
                Ok(other) => errors.push(format!("rank {rank} sent {other:?}")),
                Err(e) => {
                    let why = format!(
                        "rank {rank} ({}) died during the {} of {} bytes: {}",
                        m.info.node,
                        c.op.as_str(),
                        c.bytes,
                        lost(&e)
                    );
                    abort_all(&mut members, &why);
                    return Err(fail(SessionError::Peer(why), &facts));
                }
            }
        }
        let complete = errors.is_empty() && times.len() == ranks.len();
        collectives.push(CollectiveResult {
            step: *c,
            ranks: ranks.len() as u32,
            seconds: complete.then(|| times.iter().copied().fold(0.0, f64::max)),
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        });
    }
    drop(links);
    drop(ring_listener);
    drop(own);
    let done = FromRoot::Done {
        ranks: ranks.clone(),
        transfers: transfers.clone(),
        collectives: collectives.clone(),
    };
    for (rank, m) in members.iter_mut() {
        if let Err(e) = wire::send(&mut m.conn, &done) {
            tracing::warn!("rank {rank} ({}) did not get the results: {e}", m.info.node);
        }
    }
    let finished = unix_now();
    let records = plan::records(
        0,
        &ranks,
        &transfers,
        &collectives,
        &RunFacts {
            run: &run,
            backend: &settings.backend,
            world_size: settings.launch.world_size,
            started,
            finished,
        },
    );
    Ok(RankOutcome {
        run,
        records,
        ranks,
        transfers,
    })
}

/// Take an arrival in: a new rank joins; a second connection claiming a rank already here
/// is told so and refused.
fn admit(members: &mut BTreeMap<u32, Member>, refused: &mut Vec<String>, arrival: Arrival) {
    match arrival {
        Arrival::Joined(m) => match members.entry(m.info.rank) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(*m);
            }
            std::collections::btree_map::Entry::Occupied(_) => {
                let rank = m.info.rank;
                let from = m.conn.peer_addr().map_or("?".into(), |a| a.to_string());
                refused.push(format!("a second rank {rank} from {from}"));
                let mut c = m.conn;
                let why = format!("rank {rank} arrived twice");
                let _ = wire::send(&mut c, &FromRoot::Abort { why });
            }
        },
        Arrival::Refused { from, why } => refused.push(format!("{from}: {why}")),
    }
}

fn lost(e: &WireError) -> String {
    match e {
        WireError::Closed => "its connection closed".into(),
        WireError::TimedOut => "no answer within the step's deadline".into(),
        other => other.to_string(),
    }
}

/// Send `msg` to every member; when one is lost, tell the others why (abort) and return it.
fn broadcast(
    members: &mut BTreeMap<u32, Member>,
    msg: &FromRoot,
    when: &str,
) -> Result<(), String> {
    let lost = members.iter_mut().find_map(|(rank, m)| {
        wire::send(&mut m.conn, msg)
            .err()
            .map(|e| format!("rank {rank} ({}) was lost {when}: {e}", m.info.node))
    });
    match lost {
        Some(why) => {
            abort_all(members, &why);
            Err(why)
        }
        None => Ok(()),
    }
}

fn abort_all(members: &mut BTreeMap<u32, Member>, why: &str) {
    for m in members.values_mut() {
        let _ = m.conn.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = wire::send(
            &mut m.conn,
            &FromRoot::Abort {
                why: why.to_string(),
            },
        );
    }
}

/// Where rank 0 listens: the rendezvous host itself when it is an address (a test's
/// loopback or namespace address), else every address.
fn listen_address(host: &str, port: u16) -> SocketAddr {
    match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port),
    }
}

/// Rank 0's side of one connection's handshake.
fn handshake(
    mut conn: TcpStream,
    from: SocketAddr,
    token: &Token,
    world: u32,
    backend: &str,
) -> Arrival {
    let refuse = |conn: &mut TcpStream, why: String| {
        let _ = wire::send(conn, &FromRoot::Refused { why: why.clone() });
        Arrival::Refused { from, why }
    };
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(HANDSHAKE));
    let _ = conn.set_write_timeout(Some(HANDSHAKE));
    let challenge = token::challenge();
    if let Err(e) = wire::send(
        &mut conn,
        &FromRoot::Challenge {
            challenge: challenge.clone(),
        },
    ) {
        return Arrival::Refused {
            from,
            why: format!("lost before the challenge: {e}"),
        };
    }
    match wire::receive::<FromRank>(&mut conn) {
        Ok(FromRank::Hello {
            info,
            proof,
            challenge: theirs,
        }) => {
            if !token.verify("rank", &challenge, info.rank, &proof) {
                return refuse(
                    &mut conn,
                    format!(
                        "rank {} ({}) does not have the run's token",
                        info.rank, info.node
                    ),
                );
            }
            if info.world_size != world {
                return refuse(
                    &mut conn,
                    format!(
                        "rank {} says the world size is {}, rank 0 says {world}",
                        info.rank, info.world_size
                    ),
                );
            }
            if info.backend != backend {
                return refuse(
                    &mut conn,
                    format!(
                        "rank {} measures with --backend {}, rank 0 with {backend}: every rank \
                         of a run uses the same backend",
                        info.rank, info.backend
                    ),
                );
            }
            if info.rank == 0 || info.rank >= world {
                return refuse(
                    &mut conn,
                    format!("rank {} is not a rank of a world of {world}", info.rank),
                );
            }
            let proof = token.prove("root", &theirs, info.rank);
            if let Err(e) = wire::send(&mut conn, &FromRoot::Welcome { proof }) {
                return Arrival::Refused {
                    from,
                    why: format!("lost after its hello: {e}"),
                };
            }
            Arrival::Joined(Box::new(Member { info, conn }))
        }
        Ok(other) => refuse(&mut conn, format!("sent {other:?} instead of a hello")),
        Err(e) => Arrival::Refused {
            from,
            why: format!("no hello: {e}"),
        },
    }
}

/// Run one collective as rank `me` of the ring `ring` (linking the ring at the first one).
fn collective(
    links: &mut Option<Links>,
    listener: &TcpListener,
    ring: &[SocketAddr],
    me: usize,
    step: &CollectiveStep,
    timeout: Duration,
) -> Result<f64, String> {
    let n = ring.len();
    if links.is_none() {
        let next = ring[(me + 1) % n];
        *links =
            Some(ring::link(listener, next, timeout).map_err(|e| {
                format!("linking the ring to rank {} at {next}: {e}", (me + 1) % n)
            })?);
    }
    ring::run(links.as_mut().expect("linked"), step.op, step.bytes, me, n)
}

/// One transfer, its streams on the CPUs of this rank's rail.
fn measure(step: &Step, settings: &Settings) -> Measured {
    let cpus = settings
        .rails
        .iter()
        .find(|r| r.name == step.rail)
        .map_or(&[][..], |r| r.cpus.as_slice());
    stream::send(
        &step.rail,
        step.from,
        step.to,
        step.bytes,
        step.streams,
        cpus,
        settings.transfer_timeout,
    )
}

fn member(
    settings: &Settings,
    mut me: RankInfo,
    started: f64,
) -> Result<RankOutcome, (SessionError, FailureFacts)> {
    let mut facts = FailureFacts::new(started);
    let rv = &settings.launch.rendezvous;
    let deadline = Instant::now() + settings.rendezvous_timeout;
    let mut conn = connect_until(settings.launch.connect_host(), rv.port, deadline)
        .map_err(|e| (SessionError::Rendezvous(e), facts.clone()))?;
    let _ = conn.set_read_timeout(Some(HANDSHAKE));
    let _ = conn.set_write_timeout(Some(HANDSHAKE));
    let at = format!("rank 0 at {rv}");
    let challenge = match wire::receive::<FromRoot>(&mut conn) {
        Ok(FromRoot::Challenge { challenge }) => challenge,
        Ok(other) => {
            return Err((
                SessionError::Rendezvous(format!("{at} sent {other:?} instead of a challenge")),
                facts,
            ))
        }
        Err(e) => {
            return Err((
                SessionError::Rendezvous(format!(
                    "{at}: {e} before its challenge (is it a chd fabric rank 0?)"
                )),
                facts,
            ))
        }
    };
    // The ring listener, on the address this rank reached rank 0 from.
    let ring_listener = if settings.collectives.is_empty() || settings.device.is_some() {
        None
    } else {
        let ip = conn.local_addr().map(|a| a.ip()).map_err(|e| {
            (
                SessionError::Rendezvous(format!("the rendezvous connection's address: {e}")),
                facts.clone(),
            )
        })?;
        let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| {
            (
                SessionError::Rendezvous(format!("cannot listen for the ring on {ip}: {e}")),
                facts.clone(),
            )
        })?;
        me.ring = l.local_addr().ok();
        Some(l)
    };
    let mine = token::challenge();
    let hello = FromRank::Hello {
        proof: settings.token.prove("rank", &challenge, me.rank),
        info: me.clone(),
        challenge: mine.clone(),
    };
    if let Err(e) = wire::send(&mut conn, &hello) {
        return Err((
            SessionError::Rendezvous(format!("{at}: {e} while saying hello")),
            facts,
        ));
    }
    match wire::receive::<FromRoot>(&mut conn) {
        Ok(FromRoot::Welcome { proof })
            if settings.token.verify("root", &mine, me.rank, &proof) => {}
        Ok(FromRoot::Welcome { .. }) => {
            return Err((
                SessionError::Rendezvous(format!(
                    "{at} does not have the run's token (its proof is wrong): not our rank 0"
                )),
                facts,
            ))
        }
        Ok(FromRoot::Refused { why }) => {
            return Err((
                SessionError::Rendezvous(format!("{at} refused this rank: {why}")),
                facts,
            ))
        }
        Ok(FromRoot::Abort { why }) => return Err((SessionError::Aborted(why), facts)),
        Ok(other) => {
            return Err((
                SessionError::Rendezvous(format!("{at} sent {other:?} instead of a welcome")),
                facts,
            ))
        }
        Err(e) => {
            return Err((
                SessionError::Rendezvous(format!("{at}: {e} before its welcome")),
                facts,
            ))
        }
    }
    // The plan comes once every rank has arrived.
    let _ = conn.set_read_timeout(Some(settings.rendezvous_timeout + HANDSHAKE));
    let _ = conn.set_write_timeout(Some(settings.transfer_timeout + HANDSHAKE));
    let lost = |e: WireError, what: &str| {
        SessionError::Peer(format!(
            "{at} was lost {what}: {}",
            match e {
                WireError::Closed => "its connection closed (did it die?)".to_string(),
                WireError::TimedOut => "no message within the deadline".to_string(),
                other => other.to_string(),
            }
        ))
    };
    let (run, steps, planned, ring_addrs) = match wire::receive::<FromRoot>(&mut conn) {
        Ok(FromRoot::Plan {
            run,
            steps,
            collectives,
            ring,
        }) => (run, steps, collectives, ring),
        Ok(FromRoot::Abort { why }) => return Err((SessionError::Aborted(why), facts)),
        Ok(other) => {
            return Err((
                SessionError::Peer(format!("{at} sent {other:?} instead of the plan")),
                facts,
            ))
        }
        Err(e) => return Err((lost(e, "before the plan"), facts)),
    };
    // The peers' node names arrive with the results: a run that fails before says `unknown`.
    facts.run = Some(run.clone());
    tracing::info!("run {run}: the plan has {} transfers", steps.len());
    let _ = conn.set_read_timeout(Some(settings.step_budget() + HANDSHAKE));
    let mut links: Option<Links> = None;
    let mut own: Option<Result<(RankChild, String), String>> = None;
    loop {
        match wire::receive::<FromRoot>(&mut conn) {
            Ok(FromRoot::Collective { index, id }) => {
                let r = match &settings.device {
                    Some(dev) => {
                        if index == 0 {
                            own = Some(match id {
                                Some(id) => device_steps::collectives_child(
                                    dev,
                                    settings,
                                    me.rank,
                                    Some(id),
                                ),
                                None => Err("rank 0 made no rendezvous for the collectives \
                                             (its rank process failed)"
                                    .into()),
                            });
                        }
                        match &mut own {
                            Some(child) => device_steps::collective_result(child, index, settings),
                            None => Err(format!("collective {} before the first", index + 1)),
                        }
                    }
                    None => match (planned.get(index), &ring_listener) {
                        (Some(c), Some(listener)) if ring_addrs.len() > me.rank as usize => {
                            collective(
                                &mut links,
                                listener,
                                &ring_addrs,
                                me.rank as usize,
                                c,
                                settings.transfer_timeout,
                            )
                        }
                        _ => Err(format!(
                            "no collective {index} in the plan, or no ring listener here"
                        )),
                    },
                };
                let reply = FromRank::Collective {
                    index,
                    seconds: r.as_ref().ok().copied(),
                    error: r.err(),
                };
                if let Err(e) = wire::send(&mut conn, &reply) {
                    return Err((lost(e, &format!("after collective {}", index + 1)), facts));
                }
            }
            Ok(FromRoot::Go { step }) => {
                let Some(s) = steps.get(step) else {
                    return Err((
                        SessionError::Peer(format!(
                            "{at} started step {step} of a plan of {}",
                            steps.len()
                        )),
                        facts,
                    ));
                };
                if let Some(dev) = &settings.device {
                    if let Err(e) =
                        device_steps::member_step(step, s, me.rank, settings, dev, &mut conn)
                    {
                        return Err((e, facts));
                    }
                    continue;
                }
                if s.sender == me.rank {
                    let measured = measure(s, settings);
                    let report = FromRank::Measured {
                        step,
                        measured,
                        place: None,
                    };
                    if let Err(e) = wire::send(&mut conn, &report) {
                        return Err((lost(e, &format!("after step {}", step + 1)), facts));
                    }
                }
            }
            Ok(FromRoot::Done {
                ranks,
                transfers,
                collectives,
            }) => {
                drop(own);
                let records = plan::records(
                    me.rank,
                    &ranks,
                    &transfers,
                    &collectives,
                    &RunFacts {
                        run: &run,
                        backend: &settings.backend,
                        world_size: settings.launch.world_size,
                        started,
                        finished: unix_now(),
                    },
                );
                return Ok(RankOutcome {
                    run,
                    records,
                    ranks,
                    transfers,
                });
            }
            Ok(FromRoot::Abort { why }) => return Err((SessionError::Aborted(why), facts)),
            Ok(other) => {
                return Err((
                    SessionError::Peer(format!("{at} sent {other:?} mid-run")),
                    facts,
                ))
            }
            Err(e) => return Err((lost(e, "mid-run"), facts)),
        }
    }
}

/// Connect to rank 0, retrying until `deadline` (it may not be listening yet).
fn connect_until(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, String> {
    let mut last = String::from("no attempt");
    loop {
        match (host, port).to_socket_addrs() {
            Ok(addrs) => {
                for addr in addrs {
                    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                        Ok(c) => return Ok(c),
                        Err(e) => last = format!("{addr}: {e}"),
                    }
                }
            }
            Err(e) => last = format!("cannot resolve {host}: {e}"),
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "rank 0 at {host}:{port} did not answer before the rendezvous deadline ({last})"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
