//! The fabric over the device's collective library (`--backend cuda|acl`). Every rail
//! transfer and the collective over all ranks run in a rank process of their own
//! (`chd probe fabric-rank`, which runs one [`RankJob`]), because NCCL reads `NCCL_IB_HCA` and
//! `NCCL_SOCKET_IFNAME` once per process: a rail's two processes (the receiving side makes the
//! rendezvous, the sending side joins it) see only that rail's variables ([`rail_env`]), the
//! collective's see the launcher's environment (plus `NCCL_ALGO=Ring` when asked).
//!
//! A rank process lives for one rail step or for the run's collectives; every wait on it has
//! a deadline, past which it is killed (by its pid) and the step fails with the reason, so a
//! hung transfer never stops the run. Its stderr goes to this rank's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::rails::Rail;
use super::wire::{Measured, SidePlace};
use crate::runtime::rank_comm::{DeviceChoice, RankEvent, RankJob, RankOp};

/// How this rank runs its device side.
#[derive(Debug, Clone)]
pub struct DeviceFabric {
    /// `cuda` or `acl`.
    pub backend: String,
    /// The chd binary whose `probe fabric-rank` runs a job.
    pub exe: PathBuf,
    pub runtime_library: Option<PathBuf>,
    pub collective_library: Option<PathBuf>,
    pub sysfs: PathBuf,
    /// `--device`: the collective's device (and every rail's), else chosen per rail.
    pub device: Option<u32>,
    /// The rank's local rank: its device when none is named or nearer.
    pub local_rank: u32,
    /// `NCCL_ALGO=Ring` / `HCCL_ALGO=level0:NA;level1:ring` for the collectives.
    pub ring_algorithm: bool,
    /// chd's advice per device (the node's ledger), among this rank's CPUs: where a rank
    /// process on that device runs (`--bind auto`).
    pub device_cpus: BTreeMap<String, Vec<u32>>,
    /// Where the collectives' rank process runs when its device has no advice
    /// (`--bind CPULIST`; empty: where this rank runs).
    pub collective_cpus: Vec<u32>,
    pub warmup: u32,
    pub iterations: u32,
}

/// The library variables that confine a rank process to `rail`.
///
/// NCCL: the bootstrap and socket transport on the interface only (`NCCL_SOCKET_IFNAME=
/// =<if>`, exact match), the IB/RoCE transport on the rail's HCA port only (`NCCL_IB_HCA=
/// =<hca>:<port>`) or off for a plain NIC (`NCCL_IB_DISABLE=1`), and neither peer-to-peer
/// nor shared memory, so that two ranks on one node still cross the rail. HCCL: its host
/// socket on the interface and address (`HCCL_SOCKET_IFNAME`, `HCCL_IF_IP`, which wins);
/// an NPU's own RoCE port is the device's, so the rail's device is the one chosen near it.
pub fn rail_env(backend: &str, rail: &Rail) -> Vec<(String, String)> {
    let v = |k: &str, v: String| (k.to_string(), v);
    match backend {
        "acl" => vec![
            v("HCCL_SOCKET_IFNAME", rail.name.clone()),
            v("HCCL_IF_IP", rail.address.to_string()),
        ],
        _ => {
            let mut env = vec![
                v("NCCL_SOCKET_IFNAME", format!("={}", rail.name)),
                v("NCCL_P2P_DISABLE", "1".into()),
                v("NCCL_SHM_DISABLE", "1".into()),
            ];
            match &rail.rdma_port {
                Some(port) => env.push(v("NCCL_IB_HCA", format!("={port}"))),
                None => env.push(v("NCCL_IB_DISABLE", "1".into())),
            }
            env
        }
    }
}

/// The variables of the collective's rank processes.
pub fn collective_env(backend: &str, ring_algorithm: bool) -> Vec<(String, String)> {
    if !ring_algorithm {
        return Vec::new();
    }
    match backend {
        "acl" => vec![("HCCL_ALGO".into(), "level0:NA;level1:ring".into())],
        _ => vec![("NCCL_ALGO".into(), "Ring".into())],
    }
}

/// A running rank process.
pub struct RankChild {
    child: Child,
    events: mpsc::Receiver<Result<RankEvent, String>>,
    what: String,
    /// Where it said it runs.
    place: Option<SidePlace>,
    /// Why the job failed, once it said: every later wait answers it.
    failed: Option<String>,
}

impl RankChild {
    /// Start `job` with `env` added, described as `what` in errors.
    pub fn spawn(
        dev: &DeviceFabric,
        job: &RankJob,
        env: &[(String, String)],
        what: &str,
    ) -> Result<RankChild, String> {
        let mut child = Command::new(&dev.exe)
            .args(["probe", "fabric-rank"])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{what}: cannot start {}: {e}", dev.exe.display()))?;
        let line = serde_json::to_string(job).expect("a job serializes");
        let mut stdin = child.stdin.take().expect("piped");
        if let Err(e) = writeln!(stdin, "{line}") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: the rank process took no job: {e}"));
        }
        drop(stdin);
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("fabric-rank-out".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let event = match line {
                        Ok(l) if l.trim().is_empty() => continue,
                        Ok(l) => serde_json::from_str::<RankEvent>(&l)
                            .map_err(|e| format!("a line that is not a rank event ({e}): {l}")),
                        Err(e) => Err(format!("reading its output: {e}")),
                    };
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            });
        if let Err(e) = reader {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: cannot read the rank process: {e}"));
        }
        Ok(RankChild {
            child,
            events: rx,
            what: what.to_string(),
            place: None,
            failed: None,
        })
    }

    /// The next event other than the device line, within `timeout`; the process is killed
    /// when it does not come.
    pub fn next(&mut self, timeout: Duration) -> Result<RankEvent, String> {
        if let Some(why) = &self.failed {
            return Err(format!("not run: {why}"));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Ok(RankEvent::Device {
                    device,
                    name,
                    chosen,
                    cpus,
                    placed,
                })) => {
                    let on = if cpus.is_empty() {
                        "unbound".to_string()
                    } else {
                        format!("CPUs {cpus}, {placed}")
                    };
                    tracing::info!("{}: device {device} ({name}, {chosen}), {on}", self.what);
                    self.place = Some(SidePlace {
                        device,
                        cpus: (!cpus.is_empty()).then_some(cpus),
                    });
                }
                Ok(Ok(RankEvent::Failed { error })) => {
                    let why = format!("{}: {error}", self.what);
                    self.failed = Some(why.clone());
                    return Err(why);
                }
                Ok(Ok(event)) => return Ok(event),
                Ok(Err(e)) => return Err(format!("{}: {e}", self.what)),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let pid = self.child.id();
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "{}: no answer within {} s; its rank process (pid {pid}) was killed",
                        self.what,
                        timeout.as_secs()
                    ));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map_or("?".to_string(), |s| s.to_string());
                    return Err(format!(
                        "{}: its rank process ended ({status}) before saying more",
                        self.what
                    ));
                }
            }
        }
    }

    /// Where it runs, once it said.
    pub fn place(&self) -> Option<SidePlace> {
        self.place.clone()
    }

    /// The result of operation `index`, within `timeout`.
    pub fn result(&mut self, index: usize, timeout: Duration) -> Result<f64, String> {
        match self.next(timeout)? {
            RankEvent::Result {
                index: i,
                seconds: Some(s),
                error: None,
            } if i == index => Ok(s),
            RankEvent::Result {
                index: i,
                error: Some(e),
                ..
            } if i == index => Err(format!("{}: {e}", self.what)),
            other => Err(format!(
                "{}: said {other:?} instead of operation {}'s result",
                self.what,
                index + 1
            )),
        }
    }

    /// The rendezvous it made, within `timeout`.
    pub fn id(&mut self, timeout: Duration) -> Result<String, String> {
        match self.next(timeout)? {
            RankEvent::Id { id } => Ok(id),
            other => Err(format!(
                "{}: said {other:?} instead of its rendezvous",
                self.what
            )),
        }
    }
}

impl Drop for RankChild {
    fn drop(&mut self) {
        // A finished process has exited or is about to (it releases what it held first).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
            }
        }
    }
}

/// A job of `dev`'s on `device`, the rest as given.
fn job(
    dev: &DeviceFabric,
    device: DeviceChoice,
    (world, rank): (u32, u32),
    id: Option<String>,
    ops: Vec<RankOp>,
    cpus: Vec<u32>,
) -> RankJob {
    RankJob {
        backend: dev.backend.clone(),
        runtime_library: dev.runtime_library.clone(),
        collective_library: dev.collective_library.clone(),
        sysfs: dev.sysfs.clone(),
        device,
        world,
        rank,
        id,
        ops,
        warmup: dev.warmup,
        iterations: dev.iterations,
        device_cpus: dev.device_cpus.clone(),
        cpus,
    }
}

/// The two ranks of a rail transfer: the receiving side is rank 0 of the pair's communicator
/// (it makes the rendezvous), the sending side rank 1. `avoid`: the device the other side has
/// when both sides are on one node.
pub fn rail_job(
    dev: &DeviceFabric,
    rail: &Rail,
    sending: bool,
    bytes: u64,
    id: Option<String>,
    avoid: Option<String>,
) -> RankJob {
    let device = DeviceChoice {
        index: dev.device,
        numa: rail.numa_node,
        fallback: dev.local_rank,
        avoid,
    };
    let op = if sending {
        RankOp::Send { peer: 0, bytes }
    } else {
        RankOp::Recv { peer: 1, bytes }
    };
    let rank = u32::from(sending);
    job(dev, device, (2, rank), id, vec![op], rail.cpus.clone())
}

/// The job of this rank's share of the collectives.
pub fn collective_job(
    dev: &DeviceFabric,
    world: u32,
    rank: u32,
    id: Option<String>,
    ops: Vec<RankOp>,
) -> RankJob {
    let device = DeviceChoice {
        index: dev.device,
        numa: None,
        fallback: dev.local_rank,
        avoid: None,
    };
    job(
        dev,
        device,
        (world, rank),
        id,
        ops,
        dev.collective_cpus.clone(),
    )
}

/// One rail step's measurement from what its two sides measured: the slower side's time
/// (the bytes have arrived when both are done), or every side's error.
pub fn merge(bytes: u64, sides: &[(&str, Result<f64, String>)]) -> Measured {
    let errors: Vec<String> = sides
        .iter()
        .filter_map(|(who, r)| r.as_ref().err().map(|e| format!("{who}: {e}")))
        .collect();
    if !errors.is_empty() || sides.is_empty() {
        return Measured {
            bytes: 0,
            seconds: None,
            error: Some(if errors.is_empty() {
                "no side measured".into()
            } else {
                errors.join("; ")
            }),
        };
    }
    let seconds = sides
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().copied())
        .fold(0.0, f64::max);
    Measured {
        bytes,
        seconds: Some(seconds),
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(name: &str, port: Option<&str>) -> Rail {
        Rail {
            name: name.into(),
            address: "10.0.2.1".parse().unwrap(),
            prefix: 24,
            cpus: Vec::new(),
            rdma_port: port.map(String::from),
            numa_node: Some(1),
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_rail_process_sees_only_its_rail() {
        let env = rail_env("cuda", &rail("eth2", Some("mlx5_2:1")));
        assert_eq!(get(&env, "NCCL_SOCKET_IFNAME"), Some("=eth2"));
        assert_eq!(get(&env, "NCCL_IB_HCA"), Some("=mlx5_2:1"));
        assert_eq!(get(&env, "NCCL_IB_DISABLE"), None);
        assert_eq!(get(&env, "NCCL_P2P_DISABLE"), Some("1"));
        assert_eq!(get(&env, "NCCL_SHM_DISABLE"), Some("1"));
        let env = rail_env("cuda", &rail("veth1", None));
        assert_eq!(get(&env, "NCCL_IB_DISABLE"), Some("1"));
        assert_eq!(get(&env, "NCCL_IB_HCA"), None);
        let env = rail_env("acl", &rail("eth2", Some("mlx5_2:1")));
        assert_eq!(get(&env, "HCCL_SOCKET_IFNAME"), Some("eth2"));
        assert_eq!(get(&env, "HCCL_IF_IP"), Some("10.0.2.1"));
        assert!(env.iter().all(|(k, _)| !k.starts_with("NCCL")));
    }

    #[test]
    fn the_ring_algorithm_is_asked_for_in_each_librarys_words() {
        assert!(collective_env("cuda", false).is_empty());
        assert_eq!(
            collective_env("cuda", true),
            vec![("NCCL_ALGO".to_string(), "Ring".to_string())]
        );
        assert_eq!(
            collective_env("acl", true),
            vec![("HCCL_ALGO".to_string(), "level0:NA;level1:ring".to_string())]
        );
    }

    #[test]
    fn a_step_takes_the_slower_side_or_every_error() {
        let m = merge(1000, &[("receiver", Ok(2.0)), ("sender", Ok(1.5))]);
        assert_eq!((m.bytes, m.seconds, m.error), (1000, Some(2.0), None));
        let m = merge(1000, &[("receiver", Err("x".into())), ("sender", Ok(1.0))]);
        assert_eq!(m.seconds, None);
        assert_eq!(m.error.as_deref(), Some("receiver: x"));
        assert!(merge(1, &[]).error.is_some());
    }

    #[test]
    fn the_receiver_is_rank_0_and_makes_the_rendezvous() {
        let dev = DeviceFabric {
            backend: "cuda".into(),
            exe: "chd".into(),
            runtime_library: None,
            collective_library: None,
            sysfs: "/sys".into(),
            device: None,
            local_rank: 3,
            ring_algorithm: false,
            device_cpus: BTreeMap::new(),
            collective_cpus: Vec::new(),
            warmup: 1,
            iterations: 2,
        };
        let r = rail("eth2", None);
        let recv = rail_job(&dev, &r, false, 64, None, None);
        assert_eq!((recv.rank, recv.world, recv.id.clone()), (0, 2, None));
        assert_eq!(recv.ops, vec![RankOp::Recv { peer: 1, bytes: 64 }]);
        assert_eq!(recv.device.numa, Some(1));
        assert_eq!(recv.device.fallback, 3);
        let send = rail_job(&dev, &r, true, 64, Some("ab".into()), Some("3".into()));
        assert_eq!(send.device.avoid.as_deref(), Some("3"));
        assert_eq!(send.rank, 1);
        assert_eq!(send.ops, vec![RankOp::Send { peer: 0, bytes: 64 }]);
    }
}
