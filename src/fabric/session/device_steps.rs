//! The session's steps on a device backend ([`super::super::device`]): a rail step has two
//! rank processes, the receiving side's first (it makes the pair's rendezvous, which its rank
//! sends to rank 0 and rank 0 to the sending rank), then the sending side's; both sides'
//! ranks report what their process measured, and rank 0 keeps the slower side's time. The
//! collectives run in one rank process per rank, rank 0's rendezvous going out with the first.

use std::collections::BTreeMap;
use std::net::TcpStream;

use super::super::device::{self, DeviceFabric, RankChild};
use super::super::ring::Op;
use super::super::wire::{
    self, FromRank, FromRoot, Measured, SidePlace, SidePlaces, Step, WireError,
};
use super::{lost, Member, SessionError, Settings, HANDSHAKE};
use crate::runtime::rank_comm::RankOp;

/// This rank's rail named `name`.
fn rail<'a>(settings: &'a Settings, name: &str) -> Result<&'a super::Rail, String> {
    settings
        .rails
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| format!("this rank has no rail {name}"))
}

/// Start the receiving side of `step`; its process and the rendezvous it made.
fn start_receiver(
    step: &Step,
    settings: &Settings,
    dev: &DeviceFabric,
) -> Result<(RankChild, String), String> {
    let rail = rail(settings, &step.peer_rail)?;
    let job = device::rail_job(dev, rail, false, step.bytes, None, None);
    let what = format!("receiving on {} from {}", rail.name, step.from);
    let mut child = RankChild::spawn(dev, &job, &device::rail_env(&dev.backend, rail), &what)?;
    let id = child.id(settings.transfer_timeout)?;
    Ok((child, id))
}

/// Run the sending side of `step` with the receiver's rendezvous `id`: its seconds, and the
/// place it ran.
fn run_sender(
    step: &Step,
    settings: &Settings,
    dev: &DeviceFabric,
    id: &str,
    avoid: Option<String>,
) -> (Result<f64, String>, Option<SidePlace>) {
    let started = rail(settings, &step.rail).and_then(|rail| {
        let job = device::rail_job(dev, rail, true, step.bytes, Some(id.to_string()), avoid);
        let what = format!("sending on {} to {}", rail.name, step.to.ip());
        RankChild::spawn(dev, &job, &device::rail_env(&dev.backend, rail), &what)
    });
    match started {
        Ok(mut child) => {
            let r = child.result(0, settings.transfer_timeout);
            (r, child.place())
        }
        Err(e) => (Err(e), None),
    }
}

/// The receiving side's seconds and place.
fn finish_receiver(
    mut child: RankChild,
    settings: &Settings,
) -> (Result<f64, String>, Option<SidePlace>) {
    let r = child.result(0, settings.transfer_timeout);
    (r, child.place())
}

/// What a side's report says: its seconds, or its error.
fn side(m: Measured) -> Result<f64, String> {
    match (m.error, m.seconds) {
        (Some(e), _) => Err(e),
        (None, Some(s)) => Ok(s),
        (None, None) => Err("no time measured".into()),
    }
}

fn as_measured(bytes: u64, r: Result<f64, String>) -> Measured {
    match r {
        Ok(s) => Measured {
            bytes,
            seconds: Some(s),
            error: None,
        },
        Err(e) => Measured {
            bytes: 0,
            seconds: None,
            error: Some(e),
        },
    }
}

/// Rank 0's part in rail step `i` (of `n`): relay the rendezvous, run its own sides, gather
/// the others'. An error is fatal to the run (a rank lost), a failed side is the step's
/// measurement.
pub(super) fn root_step(
    i: usize,
    n: usize,
    step: &Step,
    settings: &Settings,
    dev: &DeviceFabric,
    members: &mut BTreeMap<u32, Member>,
) -> Result<(Measured, SidePlaces), String> {
    let wait = settings.transfer_timeout + HANDSHAKE;
    let died = |rank: u32, members: &BTreeMap<u32, Member>, e: &WireError| {
        format!(
            "rank {rank} ({}) died during step {} of {n} ({} {} -> {}): {}",
            members[&rank].info.node,
            i + 1,
            step.rail,
            step.from,
            step.to.ip(),
            lost(e)
        )
    };
    let mut sides: Vec<(&str, Result<f64, String>)> = Vec::new();
    let mut places = SidePlaces::default();
    let mut receiving: Option<RankChild> = None;
    let mut receiver_device: Option<String> = None;
    let id: Result<String, String> = if step.receiver == 0 {
        start_receiver(step, settings, dev).map(|(child, id)| {
            receiver_device = child.place().map(|p| p.device);
            receiving = Some(child);
            id
        })
    } else {
        let m = members
            .get_mut(&step.receiver)
            .expect("a planned receiver joined");
        let _ = m.conn.set_read_timeout(Some(wait));
        match wire::receive::<FromRank>(&mut m.conn) {
            Ok(FromRank::Rendezvous {
                step: s,
                id,
                device,
            }) if s == i => {
                receiver_device = device;
                id
            }
            Ok(other) => {
                return Err(format!(
                    "rank {} sent {other:?} instead of step {}'s rendezvous",
                    step.receiver,
                    i + 1
                ))
            }
            Err(e) => return Err(died(step.receiver, members, &e)),
        }
    };
    // Both sides on one node: NCCL runs one rank per GPU, so the sender takes another.
    let node = |rank: u32| {
        if rank == 0 {
            settings.node.as_str()
        } else {
            members[&rank].info.node.as_str()
        }
    };
    let avoid = (node(step.sender) == node(step.receiver))
        .then_some(receiver_device)
        .flatten();
    if step.sender == 0 {
        let (r, d) = match &id {
            Ok(id) => run_sender(step, settings, dev, id, avoid),
            Err(e) => (
                Err(format!("not started: the receiving side failed ({e})")),
                None,
            ),
        };
        places.sender = d;
        sides.push(("sender", r));
    } else {
        let m = members
            .get_mut(&step.sender)
            .expect("a planned sender joined");
        let msg = FromRoot::Rendezvous {
            step: i,
            id: id.clone(),
            avoid,
        };
        if let Err(e) = wire::send(&mut m.conn, &msg) {
            return Err(died(step.sender, members, &e));
        }
    }
    match (receiving, &id) {
        (Some(child), _) => {
            let (r, d) = finish_receiver(child, settings);
            places.receiver = d;
            sides.push(("receiver", r));
        }
        (None, Err(e)) if step.receiver == 0 => sides.push(("receiver", Err(e.clone()))),
        (None, _) => {}
    }
    for (who, rank) in [("receiver", step.receiver), ("sender", step.sender)] {
        if rank == 0 {
            continue;
        }
        let m = members.get_mut(&rank).expect("a planned rank joined");
        let _ = m.conn.set_read_timeout(Some(settings.step_budget()));
        match wire::receive::<FromRank>(&mut m.conn) {
            Ok(FromRank::Measured {
                step: s,
                measured,
                place,
            }) if s == i => {
                if rank == step.sender {
                    places.sender = place;
                } else {
                    places.receiver = place;
                }
                sides.push((who, side(measured)))
            }
            Ok(other) => {
                return Err(format!(
                    "rank {rank} sent {other:?} instead of step {}'s measurement",
                    i + 1
                ))
            }
            Err(e) => return Err(died(rank, members, &e)),
        }
    }
    Ok((device::merge(step.bytes, &sides), places))
}

/// A member's part in rail step `i` when it is one of its sides.
pub(super) fn member_step(
    i: usize,
    step: &Step,
    me: u32,
    settings: &Settings,
    dev: &DeviceFabric,
    conn: &mut TcpStream,
) -> Result<(), SessionError> {
    let gone = |e: WireError, what: &str| {
        SessionError::Peer(format!(
            "rank 0 was lost {what} of step {}: {}",
            i + 1,
            lost(&e)
        ))
    };
    let (r, place) = if step.receiver == me {
        let started = start_receiver(step, settings, dev);
        let device = started
            .as_ref()
            .ok()
            .and_then(|(child, _)| child.place())
            .map(|p| p.device);
        let id = started
            .as_ref()
            .map(|(_, id)| id.clone())
            .map_err(Clone::clone);
        wire::send(
            conn,
            &FromRank::Rendezvous {
                step: i,
                id,
                device,
            },
        )
        .map_err(|e| gone(e, "after the rendezvous"))?;
        match started {
            Ok((child, _)) => finish_receiver(child, settings),
            Err(e) => (Err(e), None),
        }
    } else if step.sender == me {
        let id = match wire::receive::<FromRoot>(conn) {
            Ok(FromRoot::Rendezvous { step: s, id, avoid }) if s == i => (id, avoid),
            Ok(FromRoot::Abort { why }) => return Err(SessionError::Aborted(why)),
            Ok(other) => {
                return Err(SessionError::Peer(format!(
                    "rank 0 sent {other:?} instead of step {}'s rendezvous",
                    i + 1
                )))
            }
            Err(e) => return Err(gone(e, "before the rendezvous")),
        };
        let (id, avoid) = id;
        match id {
            Ok(id) => run_sender(step, settings, dev, &id, avoid),
            Err(e) => (
                Err(format!("not started: the receiving side failed ({e})")),
                None,
            ),
        }
    } else {
        return Ok(());
    };
    let measured = as_measured(step.bytes, r);
    let report = FromRank::Measured {
        step: i,
        measured,
        place,
    };
    wire::send(conn, &report).map_err(|e| gone(e, "after"))
}

/// The operations of the run's collectives.
fn collective_ops(settings: &Settings) -> Vec<RankOp> {
    settings
        .collectives
        .iter()
        .map(|c| match c.op {
            Op::AllGather => RankOp::AllGather { bytes: c.bytes },
            Op::AllReduce => RankOp::AllReduce { bytes: c.bytes },
        })
        .collect()
}

/// Start this rank's process for the collectives: with `id` (a member), or making it (rank
/// 0); the process and the rendezvous.
pub(super) fn collectives_child(
    dev: &DeviceFabric,
    settings: &Settings,
    rank: u32,
    id: Option<String>,
) -> Result<(RankChild, String), String> {
    let job = device::collective_job(
        dev,
        settings.launch.world_size,
        rank,
        id.clone(),
        collective_ops(settings),
    );
    let env = device::collective_env(&dev.backend, dev.ring_algorithm);
    let what = format!("the collectives' rank {rank}");
    let mut child = RankChild::spawn(dev, &job, &env, &what)?;
    let id = match id {
        Some(id) => id,
        None => child.id(settings.transfer_timeout)?,
    };
    Ok((child, id))
}

/// Collective `index`'s seconds from this rank's process.
pub(super) fn collective_result(
    child: &mut Result<(RankChild, String), String>,
    index: usize,
    settings: &Settings,
) -> Result<f64, String> {
    match child {
        Ok((child, _)) => child.result(index, settings.transfer_timeout),
        Err(e) => Err(e.clone()),
    }
}
