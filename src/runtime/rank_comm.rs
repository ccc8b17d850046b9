//! One rank of a communicator whose ranks live in several processes, for the fabric probe's
//! device backends (`chd probe fabric --backend cuda|acl`): a [`RankJob`] names the backend,
//! the device (by index, else the first device on a NUMA node, else a fallback index), the
//! world, this rank, the rendezvous bytes (none: this rank makes them, `ncclGetUniqueId` /
//! `HcclGetRootInfo`) and the operations: a point-to-point send or receive (one rail, one
//! direction) or an allgather / all-reduce over every rank. Each operation runs `warmup`
//! times untimed, then `iterations` times between two device events on one stream: the
//! seconds are the device's, per operation.
//!
//! What happens is told as [`RankEvent`]s, in order: the device, the id (when this rank made
//! it), each operation's result. Everything the job allocated (buffers, stream, events, the
//! communicator) is released before [`run`] returns; a failed operation aborts the
//! communicator instead of destroying it (its peers may still be in the collective).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::collective::{CollectiveApi, PeerEnd, Teardown};
use super::device_api::{ApiError, DeviceApi, Handle};
use super::device_copy::{guard, stream_guard, Guard};
use super::select::{self, BackendChoice, RuntimeConfig};
use super::DeviceInfo;
use crate::format::hex;
use crate::topology::{cpulist, Roots};

/// Which device a rank runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceChoice {
    /// This runtime index, when named.
    pub index: Option<u32>,
    /// Else the first device on this NUMA node (the one nearest a rail's NIC).
    pub numa: Option<u32>,
    /// Else this index, modulo the device count (the rank's local rank).
    pub fallback: u32,
    /// Never this device (the other side of a rail on the same node has it: NCCL runs one
    /// rank per GPU), even when named: the next one is taken instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoid: Option<String>,
}

impl DeviceChoice {
    /// The device's index among `devices`, and how it was chosen.
    pub fn pick(&self, devices: &[DeviceInfo]) -> Result<(usize, &'static str), String> {
        let (first, how) = self.first_pick(devices)?;
        let Some(avoid) = &self.avoid else {
            return Ok((first, how));
        };
        if devices[first].id != *avoid {
            return Ok((first, how));
        }
        (1..devices.len())
            .map(|k| (first + k) % devices.len())
            .find(|&i| devices[i].id != *avoid)
            .map(|i| {
                (
                    i,
                    "the next one: the other side on this node has the first choice",
                )
            })
            .ok_or_else(|| {
                format!(
                    "the other side of the rail on this node runs on device {avoid}, the only \
                     one: NCCL runs one rank per device"
                )
            })
    }

    fn first_pick(&self, devices: &[DeviceInfo]) -> Result<(usize, &'static str), String> {
        if devices.is_empty() {
            return Err("the backend has no devices".into());
        }
        if let Some(i) = self.index {
            return devices
                .iter()
                .position(|d| d.id == i.to_string())
                .map(|p| (p, "named"))
                .ok_or_else(|| {
                    format!(
                        "device {i} is not one of the backend's {} devices",
                        devices.len()
                    )
                });
        }
        if let Some(node) = self.numa {
            if let Some(p) = devices.iter().position(|d| d.numa_node == Some(node)) {
                return Ok((p, "nearest the rail"));
            }
        }
        Ok((self.fallback as usize % devices.len(), "the local rank's"))
    }
}

/// One operation of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RankOp {
    /// `bytes` to rank `peer`.
    Send { peer: u32, bytes: u64 },
    /// `bytes` from rank `peer`.
    Recv { peer: u32, bytes: u64 },
    /// An allgather whose whole receive buffer is `bytes` (each rank gives `bytes / world`).
    AllGather { bytes: u64 },
    /// A sum all-reduce of `bytes` of f32 values.
    AllReduce { bytes: u64 },
}

/// What one rank process runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankJob {
    /// `cuda` or `acl`.
    pub backend: String,
    /// The device runtime library to load instead of the default (libcudart, libascendcl).
    pub runtime_library: Option<PathBuf>,
    /// The collective library to load instead of the default (libnccl, libhccl).
    pub collective_library: Option<PathBuf>,
    pub sysfs: PathBuf,
    pub device: DeviceChoice,
    pub world: u32,
    pub rank: u32,
    /// The rendezvous bytes, hex; none: this rank makes them and says so first.
    pub id: Option<String>,
    pub ops: Vec<RankOp>,
    pub warmup: u32,
    pub iterations: u32,
    /// The CPUs chd's advice gives each device (the node's ledger: its best measured CPUs,
    /// among those this rank may use): the process runs there once it knows its device.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_cpus: BTreeMap<String, Vec<u32>>,
    /// Else these CPUs (a rail's NUMA node's, `fabric::placement`, or `--bind CPULIST`);
    /// empty: where it was started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<u32>,
}

impl RankJob {
    /// The CPUs the process runs on with `device`, and why.
    pub fn placement(&self, device: &str) -> (Vec<u32>, &'static str) {
        match self.device_cpus.get(device) {
            Some(c) if !c.is_empty() => (c.clone(), "chd's advice for the device"),
            _ if !self.cpus.is_empty() => (self.cpus.clone(), "the rail's NUMA node or --bind"),
            _ => (Vec::new(), "unbound"),
        }
    }
}

/// What a rank process says, one line of JSON each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RankEvent {
    /// The device it runs on, and the CPUs (a cpulist; empty: unbound).
    Device {
        device: String,
        name: String,
        chosen: String,
        #[serde(default)]
        cpus: String,
        #[serde(default)]
        placed: String,
    },
    /// The rendezvous it made, hex (rank 0 of a job without an id).
    Id { id: String },
    /// Operation `index`'s seconds per operation, or why it failed.
    Result {
        index: usize,
        seconds: Option<f64>,
        error: Option<String>,
    },
    /// The job could not run (before or between its operations).
    Failed { error: String },
}

/// Run `job`, telling `emit` what happens. An error is also emitted as [`RankEvent::Failed`].
pub fn run(job: &RankJob, emit: &mut dyn FnMut(&RankEvent)) -> Result<(), String> {
    let result = run_inner(job, emit);
    if let Err(e) = &result {
        emit(&RankEvent::Failed { error: e.clone() });
    }
    result
}

fn run_inner(job: &RankJob, emit: &mut dyn FnMut(&RankEvent)) -> Result<(), String> {
    if job.rank >= job.world || job.world < 2 {
        return Err(format!(
            "rank {} of a world of {}: a communicator has 2 or more ranks",
            job.rank, job.world
        ));
    }
    let (api, coll, devices) = open(job)?;
    let (index, chosen) = job.device.pick(&devices)?;
    let device = &devices[index];
    let ordinal = super::device_index(&devices, &device.id).map_err(|e| e.to_string())?;
    let (cpus, placed) = job.placement(&device.id);
    crate::affinity::pin_this_thread(&cpus).map_err(|e| {
        format!(
            "binding the rank process to CPUs {} ({placed}): {e}",
            cpulist::format(&cpus)
        )
    })?;
    emit(&RankEvent::Device {
        device: device.id.clone(),
        name: device.name.clone(),
        chosen: chosen.to_string(),
        cpus: cpulist::format(&cpus),
        placed: placed.to_string(),
    });
    api.set_device(ordinal).map_err(|e| e.to_string())?;
    let id = match &job.id {
        Some(text) => hex::decode(text).map_err(|e| format!("the rendezvous id: {e}"))?,
        None => {
            if job.rank != 0 {
                return Err("only rank 0 makes the rendezvous; this rank needs its id".into());
            }
            let id = coll.unique_id().map_err(|e| e.to_string())?;
            emit(&RankEvent::Id {
                id: hex::encode(&id),
            });
            id
        }
    };
    let comm = coll
        .init_rank(job.world, &id, job.rank)
        .map_err(|e| format!("joining the communicator as rank {}: {e}", job.rank))?;
    let mut failed = false;
    for (index, op) in job.ops.iter().enumerate() {
        let r = time_op(api.as_ref(), coll.as_ref(), comm, job, *op);
        failed |= r.is_err();
        let (seconds, error) = match r {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(e)),
        };
        emit(&RankEvent::Result {
            index,
            seconds,
            error,
        });
        if failed {
            // A communicator whose operation failed is not used again.
            for later in index + 1..job.ops.len() {
                emit(&RankEvent::Result {
                    index: later,
                    seconds: None,
                    error: Some(format!("not run: operation {} failed", index + 1)),
                });
            }
            break;
        }
    }
    let how = if failed {
        Teardown::Abort
    } else {
        Teardown::Destroy
    };
    let released = coll.release(&[comm], how);
    if let Some((_, e)) = released.failed.first().or(released.busy.first()) {
        tracing::warn!("releasing the communicator: {e}");
    }
    Ok(())
}

type Opened = (Arc<dyn DeviceApi>, Arc<dyn CollectiveApi>, Vec<DeviceInfo>);

fn open(job: &RankJob) -> Result<Opened, String> {
    let backend: BackendChoice = job.backend.parse()?;
    let mut cfg = RuntimeConfig {
        backend,
        ..RuntimeConfig::default()
    };
    if backend == BackendChoice::Acl {
        cfg.acl_runtime = job.runtime_library.clone();
        cfg.hccl = job.collective_library.clone();
    } else {
        cfg.cuda_runtime = job.runtime_library.clone();
        cfg.nccl = job.collective_library.clone();
    }
    let roots = Roots {
        sysfs: job.sysfs.clone(),
        ..Roots::default()
    };
    let (runtime, devices) =
        select::open_device_runtime(&cfg, &roots).map_err(|e| e.to_string())?;
    let coll = select::native_collective(&runtime, &cfg)?;
    Ok((runtime.api(), coll, devices))
}

/// `op` timed: its buffers (a point-to-point uses one), `job.warmup` untimed and
/// `job.iterations` timed operations between two events on a stream of its own; seconds per
/// operation.
fn time_op(
    api: &dyn DeviceApi,
    coll: &dyn CollectiveApi,
    comm: Handle,
    job: &RankJob,
    op: RankOp,
) -> Result<f64, String> {
    let world = u64::from(job.world);
    let (send_bytes, recv_bytes) = match op {
        RankOp::Send { bytes, .. } => (bytes, 0),
        RankOp::Recv { bytes, .. } => (0, bytes),
        RankOp::AllGather { bytes } => {
            let per = bytes / world;
            if per == 0 {
                return Err(format!(
                    "an allgather of {bytes} bytes over {world} ranks gives each rank nothing"
                ));
            }
            (per, per * world)
        }
        RankOp::AllReduce { bytes } => {
            let count = bytes / 4;
            if count == 0 {
                return Err(format!("an all-reduce of {bytes} bytes holds no f32 value"));
            }
            (count * 4, count * 4)
        }
    };
    let text = |e: ApiError| e.to_string();
    let alloc = |bytes: u64| -> Result<Option<Guard<'_, dyn DeviceApi>>, String> {
        if bytes == 0 {
            return Ok(None);
        }
        let b = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes is too large"))?;
        guard(api, api.device_alloc(b), <dyn DeviceApi>::device_free)
            .map(Some)
            .map_err(|e| format!("allocating {bytes} bytes of device memory: {e}"))
    };
    let send = alloc(send_bytes)?;
    let recv = alloc(recv_bytes)?;
    let start = guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(text)?;
    let end = guard(api, api.event_create(), <dyn DeviceApi>::event_destroy).map_err(text)?;
    // Declared last, so released first: synchronized before the buffers its work uses go.
    let stream = stream_guard(api).map_err(text)?;
    let ptr = |g: &Option<Guard<'_, dyn DeviceApi>>| {
        g.as_ref().map_or(std::ptr::null_mut(), |g| g.handle)
    };
    let (s, r, st) = (ptr(&send), ptr(&recv), stream.handle);
    let enqueue = || -> Result<(), ApiError> {
        match op {
            RankOp::Send { peer, .. } => {
                coll.point_to_point(PeerEnd::Send, s, send_bytes as usize, peer, comm, st)
            }
            RankOp::Recv { peer, .. } => {
                coll.point_to_point(PeerEnd::Recv, r, recv_bytes as usize, peer, comm, st)
            }
            RankOp::AllGather { .. } => coll.all_gather(s, r, send_bytes as usize, comm, st),
            RankOp::AllReduce { .. } => {
                coll.all_reduce_f32(s, r, (send_bytes / 4) as usize, comm, st)
            }
        }
    };
    for _ in 0..job.warmup {
        enqueue().map_err(text)?;
    }
    api.stream_synchronize(st).map_err(text)?;
    let iterations = job.iterations.max(1);
    api.event_record(start.handle, st).map_err(text)?;
    for _ in 0..iterations {
        enqueue().map_err(text)?;
    }
    api.event_record(end.handle, st).map_err(text)?;
    api.event_synchronize(end.handle).map_err(text)?;
    let ms = api
        .event_elapsed_ms(start.handle, end.handle)
        .map_err(text)?;
    if ms.is_nan() || ms <= 0.0 {
        return Err(format!(
            "the device timed {iterations} operations at {ms} ms: no time measured"
        ));
    }
    Ok(f64::from(ms) / 1e3 / f64::from(iterations))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: &str, numa: Option<u32>) -> DeviceInfo {
        DeviceInfo {
            id: id.into(),
            kind: "cuda".into(),
            name: "x".into(),
            pci_bus_id: String::new(),
            numa_node: numa,
        }
    }

    #[test]
    fn the_device_is_named_else_nearest_else_the_local_ranks() {
        let devices = [dev("0", Some(0)), dev("1", Some(0)), dev("2", Some(1))];
        let choose = |index, numa, fallback| {
            DeviceChoice {
                index,
                numa,
                fallback,
                avoid: None,
            }
            .pick(&devices)
        };
        let avoiding = |index, numa, avoid: &str| {
            DeviceChoice {
                index,
                numa,
                fallback: 0,
                avoid: Some(avoid.to_string()),
            }
            .pick(&devices)
        };
        // The other side of a rail on this node has the nearest (or the named) device.
        assert_eq!(avoiding(None, Some(1), "2").unwrap().0, 0);
        assert_eq!(avoiding(Some(0), None, "0").unwrap().0, 1);
        assert_eq!(avoiding(None, Some(0), "1").unwrap().0, 0);
        assert!(DeviceChoice {
            index: None,
            numa: None,
            fallback: 0,
            avoid: Some("0".into()),
        }
        .pick(&devices[..1])
        .unwrap_err()
        .contains("one rank per device"));
        assert_eq!(choose(Some(1), Some(1), 0), Ok((1, "named")));
        assert_eq!(choose(None, Some(1), 0), Ok((2, "nearest the rail")));
        assert_eq!(choose(None, Some(7), 4), Ok((1, "the local rank's")));
        assert_eq!(choose(None, None, 2), Ok((2, "the local rank's")));
        assert!(choose(Some(9), None, 0).unwrap_err().contains("not one of"));
        assert!(DeviceChoice {
            index: None,
            numa: None,
            fallback: 0,
            avoid: None,
        }
        .pick(&[])
        .is_err());
    }

    #[test]
    fn jobs_and_events_are_one_json_line_each() {
        let job = RankJob {
            backend: "cuda".into(),
            runtime_library: None,
            collective_library: None,
            sysfs: "/sys".into(),
            device: DeviceChoice {
                index: None,
                numa: Some(1),
                fallback: 0,
                avoid: None,
            },
            world: 2,
            rank: 1,
            id: Some("00ff".into()),
            ops: vec![RankOp::Send { peer: 0, bytes: 8 }],
            warmup: 1,
            iterations: 1,
            device_cpus: BTreeMap::from([("0".to_string(), vec![5])]),
            cpus: vec![2, 3],
        };
        assert_eq!(job.placement("0"), (vec![5], "chd's advice for the device"));
        assert_eq!(job.placement("1").0, vec![2, 3]);
        let bare = RankJob {
            device_cpus: BTreeMap::new(),
            cpus: Vec::new(),
            ..job.clone()
        };
        assert_eq!(bare.placement("0"), (Vec::new(), "unbound"));
        let line = serde_json::to_string(&job).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<RankJob>(&line).unwrap(), job);
        let e = RankEvent::Result {
            index: 0,
            seconds: Some(0.5),
            error: None,
        };
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.contains("\"event\":\"result\""), "{line}");
        assert_eq!(serde_json::from_str::<RankEvent>(&line).unwrap(), e);
    }
}
