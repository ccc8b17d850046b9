//! What a fabric run measures, decided by rank 0 from what the ranks said of themselves, and
//! what each node keeps of it. The measuring ranks are one per node (its lowest local rank);
//! when every rank shares one node, its two lowest ranks (a loopback or same-node run). For
//! each pair of them, each rail of one with a rail of the other in the same subnet is measured
//! both ways, one transfer at a time, so rails never share the wire or the CPUs with each
//! other's measurement.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::wire::{CollectiveResult, RankInfo, Step, Transfer};
use crate::analysis::fabric::judge;
use crate::format::fabric::{CollectiveRecord, FabricRecord, Outcome, RailRecord, Way, SCHEMA};

/// How much each transfer moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volume {
    pub bytes: u64,
    pub streams: u32,
}

/// The measuring ranks, in rank order.
pub fn measuring(ranks: &[RankInfo]) -> Vec<&RankInfo> {
    let mut first_of_node: BTreeMap<&str, &RankInfo> = BTreeMap::new();
    for r in ranks {
        let e = first_of_node.entry(&r.node).or_insert(r);
        if (r.local_rank, r.rank) < (e.local_rank, e.rank) {
            *e = r;
        }
    }
    let mut out: Vec<&RankInfo> = if first_of_node.len() >= 2 {
        first_of_node.into_values().collect()
    } else {
        let mut all: Vec<&RankInfo> = ranks.iter().collect();
        all.sort_by_key(|r| r.rank);
        all.truncate(2);
        all
    };
    out.sort_by_key(|r| r.rank);
    out
}

/// The transfers of a run, in order.
pub fn steps(ranks: &[RankInfo], volume: Volume) -> Vec<Step> {
    let m = measuring(ranks);
    let mut out = Vec::new();
    for (i, a) in m.iter().enumerate() {
        for b in &m[i + 1..] {
            for ea in &a.endpoints {
                let Some(eb) = b.endpoints.iter().find(|eb| ea.rail.same_subnet(&eb.rail)) else {
                    continue;
                };
                for (s, es, r, er) in [(a, ea, b, eb), (b, eb, a, ea)] {
                    out.push(Step {
                        sender: s.rank,
                        receiver: r.rank,
                        rail: es.rail.name.clone(),
                        from: es.rail.address,
                        peer_rail: er.rail.name.clone(),
                        to: SocketAddr::new(er.rail.address, er.port),
                        bytes: volume.bytes,
                        streams: volume.streams,
                    });
                }
            }
        }
    }
    out
}

/// The CPUs `rank`'s streams of its rail `rail` ran on, as a cpulist (none: unbound).
fn cpus_of(rank: &RankInfo, rail: &str) -> Option<String> {
    rank.endpoints
        .iter()
        .find(|e| e.rail.name == rail)
        .filter(|e| !e.rail.cpus.is_empty())
        .map(|e| crate::topology::cpulist::format(&e.rail.cpus))
}

/// The RDMA port `rank`'s rail `rail` is, where it is one.
fn rdma_port_of(rank: &RankInfo, rail: &str) -> Option<String> {
    rank.endpoints
        .iter()
        .find(|e| e.rail.name == rail)
        .and_then(|e| e.rail.rdma_port.clone())
}

/// When and how a run went, for its records.
#[derive(Debug, Clone)]
pub struct RunFacts<'a> {
    pub run: &'a str,
    pub backend: &'a str,
    pub world_size: u32,
    pub started: f64,
    pub finished: f64,
}

/// What `me` keeps of a finished run: one record per peer node, its rails both ways judged,
/// and its rails with no rail of that peer in their subnet as errors. Empty unless `me` is a
/// measuring rank.
pub fn records(
    me: u32,
    ranks: &[RankInfo],
    transfers: &[Transfer],
    collectives: &[CollectiveResult],
    facts: &RunFacts,
) -> Vec<FabricRecord> {
    let collectives: Vec<CollectiveRecord> = collectives
        .iter()
        .map(|c| CollectiveRecord {
            op: c.step.op.as_str().to_string(),
            bytes: c.step.bytes,
            ranks: c.ranks,
            seconds: c.seconds,
            alg_gbps: c.alg_gbps(),
            bus_gbps: c.bus_gbps(),
            error: c.error.clone(),
        })
        .collect();
    let m = measuring(ranks);
    let Some(mine) = m.iter().find(|r| r.rank == me) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for peer in m.iter().filter(|r| r.rank != me) {
        let mut rails = Vec::new();
        for t in transfers {
            let (s, mm) = (&t.step, &t.measured);
            let (way, rail, address, peer_rail, peer_address, place) =
                if s.sender == me && s.receiver == peer.rank {
                    let p = &t.places.sender;
                    (Way::Send, &s.rail, s.from, &s.peer_rail, s.to.ip(), p)
                } else if s.receiver == me && s.sender == peer.rank {
                    let p = &t.places.receiver;
                    (Way::Receive, &s.peer_rail, s.to.ip(), &s.rail, s.from, p)
                } else {
                    continue;
                };
            rails.push(RailRecord {
                rail: rail.clone(),
                address: address.to_string(),
                peer_rail: Some(peer_rail.clone()),
                peer_address: Some(peer_address.to_string()),
                way,
                gbps: mm.gbps(),
                bytes: mm.bytes,
                streams: s.streams,
                seconds: mm.seconds,
                error: mm.error.clone(),
                slow: false,
                // A rank process says where it ran; the host's streams run on the rail's CPUs.
                cpus: match place {
                    Some(p) => p.cpus.clone(),
                    None => cpus_of(mine, rail),
                },
                rdma_port: rdma_port_of(mine, rail),
                device: place.as_ref().map(|p| p.device.clone()),
            });
        }
        for e in &mine.endpoints {
            if peer.endpoints.iter().any(|p| e.rail.same_subnet(&p.rail)) {
                continue;
            }
            for way in [Way::Send, Way::Receive] {
                rails.push(RailRecord {
                    rail: e.rail.name.clone(),
                    address: e.rail.address.to_string(),
                    peer_rail: None,
                    peer_address: None,
                    way,
                    gbps: None,
                    bytes: 0,
                    streams: 0,
                    seconds: None,
                    error: Some(format!(
                        "{} has no rail in {}/{}",
                        peer.node, e.rail.address, e.rail.prefix
                    )),
                    slow: false,
                    cpus: None,
                    rdma_port: e.rail.rdma_port.clone(),
                    device: None,
                });
            }
        }
        rails.sort_by(|a, b| (a.way, &a.rail).cmp(&(b.way, &b.rail)));
        judge(&mut rails);
        out.push(FabricRecord {
            schema: SCHEMA,
            run: facts.run.to_string(),
            node: mine.node.clone(),
            peer: peer.node.clone(),
            backend: facts.backend.to_string(),
            world_size: facts.world_size,
            started: facts.started,
            finished: facts.finished,
            outcome: Outcome::Ok,
            error: None,
            rails,
            collectives: collectives.clone(),
        });
    }
    out
}

/// The record of a run that failed before its results were gathered: one per peer node known,
/// else one against `unknown`.
pub fn failed_records(
    node: &str,
    peers: &[String],
    facts: &RunFacts,
    why: &str,
) -> Vec<FabricRecord> {
    let unknown = ["unknown".to_string()];
    let peers = if peers.is_empty() {
        &unknown[..]
    } else {
        peers
    };
    peers
        .iter()
        .map(|peer| FabricRecord {
            schema: SCHEMA,
            run: facts.run.to_string(),
            node: node.to_string(),
            peer: peer.clone(),
            backend: facts.backend.to_string(),
            world_size: facts.world_size,
            started: facts.started,
            finished: facts.finished,
            outcome: Outcome::Failed,
            error: Some(why.to_string()),
            rails: Vec::new(),
            collectives: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::rails::Rail;
    use crate::fabric::wire::{Endpoint, Measured};

    fn ep(name: &str, addr: &str, port: u16) -> Endpoint {
        Endpoint {
            rail: Rail {
                name: name.into(),
                address: addr.parse().unwrap(),
                prefix: 24,
                cpus: Vec::new(),
                rdma_port: None,
                numa_node: None,
            },
            port,
        }
    }

    fn rank(rank: u32, node: &str, local: u32, endpoints: Vec<Endpoint>) -> RankInfo {
        RankInfo {
            rank,
            world_size: 4,
            local_rank: local,
            node: node.into(),
            endpoints,
            ring: None,
            backend: "host".into(),
        }
    }

    fn two_nodes() -> Vec<RankInfo> {
        vec![
            rank(
                0,
                "a",
                0,
                vec![
                    ep("v1", "10.7.1.1", 100),
                    ep("v2", "10.7.2.1", 101),
                    ep("v3", "10.7.3.1", 102),
                ],
            ),
            rank(1, "a", 1, vec![]),
            rank(
                2,
                "b",
                0,
                vec![ep("w1", "10.7.1.2", 200), ep("w2", "10.7.2.2", 201)],
            ),
            rank(3, "b", 1, vec![]),
        ]
    }

    const VOLUME: Volume = Volume {
        bytes: 1000,
        streams: 2,
    };

    #[test]
    fn one_rank_per_node_measures_each_rail_pair_both_ways() {
        let ranks = two_nodes();
        let m: Vec<u32> = measuring(&ranks).iter().map(|r| r.rank).collect();
        assert_eq!(m, [0, 2]);
        let s = steps(&ranks, VOLUME);
        let shown: Vec<String> = s
            .iter()
            .map(|s| {
                format!(
                    "{}:{}>{}:{} {}",
                    s.sender, s.rail, s.receiver, s.peer_rail, s.to
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "0:v1>2:w1 10.7.1.2:200",
                "2:w1>0:v1 10.7.1.1:100",
                "0:v2>2:w2 10.7.2.2:201",
                "2:w2>0:v2 10.7.2.1:101",
            ]
        );
        // Ranks sharing one node: its two lowest ranks.
        let same: Vec<RankInfo> = (0..3)
            .map(|i| rank(i, "n", i, vec![ep("lo", "127.0.0.1", 9)]))
            .collect();
        let m: Vec<u32> = measuring(&same).iter().map(|r| r.rank).collect();
        assert_eq!(m, [0, 1]);
        assert_eq!(steps(&same, VOLUME).len(), 2);
    }

    #[test]
    fn each_node_keeps_its_side_both_ways_with_unpaired_rails_as_errors() {
        let ranks = two_nodes();
        let gbps = [9.0, 8.0, 2.0, 9.5];
        let transfers: Vec<Transfer> = steps(&ranks, VOLUME)
            .into_iter()
            .zip(gbps)
            .map(|(step, g)| Transfer {
                step,
                measured: Measured {
                    bytes: (g * 1e9) as u64,
                    seconds: Some(1.0),
                    error: None,
                },
                places: Default::default(),
            })
            .collect();
        let facts = RunFacts {
            run: "r1",
            backend: "host",
            world_size: 4,
            started: 1.0,
            finished: 2.0,
        };
        assert!(records(1, &ranks, &transfers, &[], &facts).is_empty());
        let a = records(0, &ranks, &transfers, &[], &facts);
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].node.as_str(), a[0].peer.as_str()), ("a", "b"));
        let rows: Vec<String> = a[0]
            .rails
            .iter()
            .map(|r| format!("{} {} {:?} {}", r.way.as_str(), r.rail, r.gbps, r.slow))
            .collect();
        assert_eq!(
            rows,
            [
                "send v1 Some(9.0) false",
                "send v2 Some(2.0) true",
                "send v3 None true",
                "receive v1 Some(8.0) false",
                "receive v2 Some(9.5) false",
                "receive v3 None true",
            ]
        );
        assert!(a[0].rails[2]
            .error
            .as_deref()
            .unwrap()
            .contains("b has no rail in 10.7.3.1/24"));
        let b = records(2, &ranks, &transfers, &[], &facts);
        assert_eq!(b[0].rails.len(), 4);
        assert_eq!(b[0].rails[0].rail, "w1");
        assert_eq!(b[0].rails[0].way, Way::Send);
        assert_eq!(b[0].rails[0].gbps, Some(8.0));
    }
}
