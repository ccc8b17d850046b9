//! `chd probe fabric`: one rank of a fabric run. Learns the rank from the launcher, finds the
//! rails, runs the session (`chd::fabric::session`), writes the node's side into the state
//! directory (and `--out`), and prints the rank's results. A failed run is recorded as failed
//! by the node's first rank, then exits non-zero with the reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use regex::Regex;
use serde::Serialize;

use super::request::FabricRequest;
use chd::config::{Config, FALLBACK_STATE_DIR};
use chd::fabric::device::DeviceFabric;
use chd::fabric::launch::{self, Launch};
use chd::fabric::plan::{self, RunFacts, Volume};
use chd::fabric::rails;
use chd::fabric::ring::Op;
use chd::fabric::session::{self, RankOutcome, Settings};
use chd::fabric::token::Token;
use chd::fabric::wire::{CollectiveStep, RankInfo, Transfer};
use chd::format::fabric::{self as results, FabricRecord, Outcome};
use chd::runtime::rank_comm::{RankEvent, RankJob};

/// What `--format json` prints.
#[derive(Serialize)]
struct Printed<'a> {
    run: &'a str,
    rank: u32,
    world_size: u32,
    node: &'a str,
    outcome: &'static str,
    error: Option<String>,
    results: &'a [FabricRecord],
    files: Vec<String>,
}

/// Rank 0's `--out DIR/fabric-run.json`: every rank and every transfer.
#[derive(Serialize)]
struct WholeRun<'a> {
    run: &'a str,
    ranks: &'a [RankInfo],
    transfers: &'a [Transfer],
}

/// `chd probe fabric-rank`: run the job on stdin, one JSON event per line on stdout.
pub fn rank_process() -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the job on stdin")?;
    let job: RankJob = serde_json::from_str(&line)
        .with_context(|| format!("the job on stdin is not a rank job: {}", line.trim()))?;
    let stdout = std::io::stdout();
    let mut emit = |e: &RankEvent| {
        let mut out = stdout.lock();
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string(e).expect("events serialize")
        );
        let _ = out.flush();
    };
    chd::runtime::rank_comm::run(&job, &mut emit).map_err(|e| anyhow!(e))
}

pub fn run(req: &FabricRequest) -> anyhow::Result<()> {
    match req.backend.as_str() {
        "host" | "cuda" | "acl" => {}
        other => bail!("--backend: {other:?} is not one of host, cuda, acl"),
    }
    if req.backend == "host" && (req.device.is_some() || req.ring_algorithm) {
        bail!("--device and --algorithm ring are for --backend cuda or acl; the host backend measures over TCP");
    }
    let token = Token::load(
        req.token_file.as_deref(),
        std::env::var("CHD_FABRIC_TOKEN").ok(),
    )?;
    let mut launch: Launch = launch::derive(&|k| std::env::var(k).ok(), &req.overrides)?;
    slurm_node_addr(&mut launch);
    let config = Config::resolve([req.layer.clone()])?;
    let node = match &req.node {
        Some(n) => n.clone(),
        None => std::env::var("SLURMD_NODENAME")
            .or_else(|_| std::env::var("NODE_NAME"))
            .unwrap_or_else(|_| chd::topology::hostname(&config.roots)),
    };
    let pattern = req
        .rails
        .as_deref()
        .map(Regex::new)
        .transpose()
        .map_err(|e| anyhow!("--rails: {e}"))?;
    let mut rails = rails::choose(&rails::interface_addresses()?, pattern.as_ref())?;
    let bytes = chd::probe::plan::parse_size(&req.bytes).map_err(|e| anyhow!("--bytes: {e}"))?;
    if bytes == 0 {
        bail!("--bytes: a transfer must move at least one byte");
    }
    let collectives = collective_plan(&req.collectives, &req.collective_sizes)?;
    let state_dir = match &req.state_dir {
        Some(d) => d.clone(),
        None => {
            let (dir, why) = chd::store::persist::choose_state_dir(
                &config.state_dir,
                Path::new(FALLBACK_STATE_DIR),
            )
            .with_context(|| {
                format!(
                    "neither {} nor {FALLBACK_STATE_DIR} is writable",
                    config.state_dir.display()
                )
            })?;
            if let Some(why) = why {
                tracing::warn!("{why}; the results go to {}", dir.display());
            }
            dir
        }
    };
    for rail in &mut rails {
        rail.rdma_port = chd::fabric::nic::rdma_port(&config.roots.sysfs, &rail.name);
        rail.numa_node = chd::fabric::nic::numa_node(&config.roots.sysfs, &rail.name);
    }
    let (advised, collective_cpus) = if req.backend == "host" {
        (BTreeMap::new(), Vec::new())
    } else {
        device_placement(&req.bind, &config.roots, &state_dir)?
    };
    let device = (req.backend != "host")
        .then(|| -> anyhow::Result<DeviceFabric> {
            let cuda = req.backend == "cuda";
            Ok(DeviceFabric {
                backend: req.backend.clone(),
                exe: std::env::current_exe()
                    .context("locating the chd binary for the rank processes")?,
                runtime_library: if cuda {
                    config.runtime.cuda_runtime.clone()
                } else {
                    config.runtime.acl_runtime.clone()
                },
                collective_library: if cuda {
                    config.runtime.nccl.clone()
                } else {
                    config.runtime.hccl.clone()
                },
                sysfs: config.roots.sysfs.clone(),
                device: req.device,
                local_rank: launch.local_rank,
                ring_algorithm: req.ring_algorithm,
                device_cpus: advised.clone(),
                collective_cpus: collective_cpus.clone(),
                warmup: req.warmup,
                iterations: req.iterations,
            })
        })
        .transpose()?;
    place(&mut rails, &req.bind, &config.roots, &state_dir)?;
    tracing::info!(
        "rank {} of {} (local rank {}, from {}), node {node}, rails {}, rank 0 at {}",
        launch.rank,
        launch.world_size,
        launch.local_rank,
        launch.engine.as_str(),
        rails
            .iter()
            .map(|r| {
                let port = r
                    .rdma_port
                    .as_ref()
                    .map(|p| format!(" {p}"))
                    .unwrap_or_default();
                match r.cpus.as_slice() {
                    [] => format!("{}{port} {} (unbound)", r.name, r.address),
                    cpus => format!(
                        "{}{port} {} (CPUs {})",
                        r.name,
                        r.address,
                        chd::topology::cpulist::format(cpus)
                    ),
                }
            })
            .collect::<Vec<_>>()
            .join(", "),
        launch.rendezvous
    );
    let settings = Settings {
        launch: launch.clone(),
        node: node.clone(),
        token,
        rails,
        volume: Volume {
            bytes,
            streams: req.streams,
        },
        rendezvous_timeout: req.timeout,
        transfer_timeout: req.transfer_timeout,
        backend: req.backend.clone(),
        collectives,
        device,
    };
    let fabric_dir = results::dir_of(&state_dir);
    match session::run(&settings) {
        Ok(outcome) => finish(req, &launch, &node, &fabric_dir, &outcome),
        Err((error, facts)) => {
            let why = error.to_string();
            let mut files = Vec::new();
            if launch.local_rank == 0 {
                let run = facts
                    .run
                    .clone()
                    .unwrap_or_else(|| format!("{}-rank{}", facts.started as u64, launch.rank));
                let records = plan::failed_records(
                    &node,
                    &facts.peers,
                    &RunFacts {
                        run: &run,
                        backend: &req.backend,
                        world_size: launch.world_size,
                        started: facts.started,
                        finished: session::unix_now(),
                    },
                    &why,
                );
                files = write_all(&fabric_dir, req.out.as_deref(), &records)?;
                if req.json {
                    print_json(
                        &run,
                        &launch,
                        &node,
                        Outcome::Failed,
                        Some(why.clone()),
                        &records,
                        &files,
                    );
                }
            }
            Err(anyhow!(
                "fabric run failed on rank {} ({node}): {why}{}",
                launch.rank,
                if files.is_empty() {
                    String::new()
                } else {
                    format!(" (recorded in {})", files.join(", "))
                }
            ))
        }
    }
}

/// `--collectives` x `--collective-sizes`, in that order.
fn collective_plan(ops: &str, sizes: &str) -> anyhow::Result<Vec<CollectiveStep>> {
    if ops.trim() == "none" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let sizes: Vec<u64> = sizes
        .split(',')
        .map(|s| {
            chd::probe::plan::parse_size(s.trim()).map_err(|e| anyhow!("--collective-sizes: {e}"))
        })
        .collect::<anyhow::Result<_>>()?;
    if sizes.contains(&0) {
        bail!("--collective-sizes: a collective moves at least one byte");
    }
    for op in ops.split(',').map(str::trim) {
        let op = match op {
            "allgather" => Op::AllGather,
            "allreduce" => Op::AllReduce,
            other => bail!("--collectives: {other:?} is not allgather, allreduce or none"),
        };
        out.extend(sizes.iter().map(|&bytes| CollectiveStep { op, bytes }));
    }
    Ok(out)
}

fn finish(
    req: &FabricRequest,
    launch: &Launch,
    node: &str,
    fabric_dir: &Path,
    outcome: &RankOutcome,
) -> anyhow::Result<()> {
    // The node's first rank writes for the node (ranks sharing a node share its state
    // directory); the others print.
    let files = if launch.local_rank == 0 {
        write_all(fabric_dir, req.out.as_deref(), &outcome.records)?
    } else {
        Vec::new()
    };
    if launch.rank == 0 {
        if let Some(out) = &req.out {
            let path = out.join("fabric-run.json");
            let body = serde_json::to_vec_pretty(&WholeRun {
                run: &outcome.run,
                ranks: &outcome.ranks,
                transfers: &outcome.transfers,
            })?;
            chd::format::atomic_file::write(&path, |f| std::io::Write::write_all(f, &body))
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    if req.json {
        print_json(
            &outcome.run,
            launch,
            node,
            Outcome::Ok,
            None,
            &outcome.records,
            &files,
        );
    } else {
        print_text(outcome, launch, node, &files);
    }
    Ok(())
}

/// Write `records` into the state directory's fabric directory and `out`; the paths written.
fn write_all(
    fabric_dir: &Path,
    out: Option<&Path>,
    records: &[FabricRecord],
) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> = vec![fabric_dir.to_path_buf()];
    if let Some(out) = out {
        dirs.push(out.to_path_buf());
    }
    for dir in &dirs {
        for r in records {
            let path = results::write(dir, r)
                .with_context(|| format!("writing the fabric results into {}", dir.display()))?;
            files.push(path.display().to_string());
        }
    }
    Ok(files)
}

fn print_json(
    run: &str,
    launch: &Launch,
    node: &str,
    outcome: Outcome,
    error: Option<String>,
    records: &[FabricRecord],
    files: &[String],
) {
    let printed = Printed {
        run,
        rank: launch.rank,
        world_size: launch.world_size,
        node,
        outcome: outcome.as_str(),
        error,
        results: records,
        files: files.to_vec(),
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&printed).expect("plain records serialize")
    );
}

fn print_text(outcome: &RankOutcome, launch: &Launch, node: &str, files: &[String]) {
    println!(
        "fabric run {}: rank {} of {} on {node}",
        outcome.run, launch.rank, launch.world_size
    );
    if outcome.records.is_empty() {
        println!("this rank measured nothing (another rank of {node} measures for it)");
        return;
    }
    for r in &outcome.records {
        println!("\npeer {}:", r.peer);
        println!(
            "{:<16} {:<8} {:<16} {:>10}  judged",
            "rail", "way", "peer rail", "GB/s"
        );
        for rail in &r.rails {
            let gbps = rail.gbps.map_or("-".to_string(), |g| format!("{g:.3}"));
            let name = match &rail.rdma_port {
                Some(port) => format!("{} ({port})", rail.rail),
                None => rail.rail.clone(),
            };
            let judged = match (&rail.error, rail.slow) {
                (Some(e), _) => format!("failed: {e}"),
                (None, true) => "slow".to_string(),
                (None, false) => "ok".to_string(),
            };
            println!(
                "{:<16} {:<8} {:<16} {:>10}  {judged}",
                name,
                rail.way.as_str(),
                rail.peer_rail.as_deref().unwrap_or("-"),
                gbps
            );
        }
    }
    if let Some(first) = outcome.records.first() {
        if !first.collectives.is_empty() {
            println!("\ncollectives over {} ranks:", first.collectives[0].ranks);
            println!(
                "{:<10} {:>12} {:>10} {:>10}",
                "op", "bytes", "alg GB/s", "bus GB/s"
            );
            for c in &first.collectives {
                let g = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
                println!(
                    "{:<10} {:>12} {:>10} {:>10}{}",
                    c.op,
                    c.bytes,
                    g(c.alg_gbps),
                    g(c.bus_gbps),
                    c.error
                        .as_deref()
                        .map(|e| format!("  failed: {e}"))
                        .unwrap_or_default()
                );
            }
        }
    }
    for f in files {
        println!("wrote {f}");
    }
}

/// Each rail's CPUs under `bind` ([`chd::fabric::placement`]): of this rank's allowed CPUs,
/// without those the node's affinity probe found unbindable (its state file, when there is
/// one that reads).
fn place(
    rails: &mut [chd::fabric::rails::Rail],
    bind: &chd::fabric::placement::Bind,
    roots: &chd::topology::Roots,
    state_dir: &Path,
) -> anyhow::Result<()> {
    use chd::fabric::placement::{self, Bind};
    if *bind == Bind::Off {
        return Ok(());
    }
    let topology =
        chd::topology::Topology::read(roots).context("reading the topology for --bind")?;
    let allowed = chd::affinity::current_cpus().context("reading this rank's CPUs")?;
    let unbindable: Vec<u32> = std::fs::read(chd::store::persist::state_path(state_dir))
        .ok()
        .and_then(|bytes| chd::store::persist::decode(&bytes).ok())
        .map(|store| {
            store
                .bindable()
                .iter()
                .filter(|(_, b)| !b.bindable)
                .map(|(&cpu, _)| cpu)
                .collect()
        })
        .unwrap_or_default();
    for rail in rails.iter_mut() {
        rail.cpus = placement::rail_cpus(
            bind,
            &roots.sysfs,
            &topology,
            &rail.name,
            &allowed,
            &unbindable,
        );
    }
    if let Bind::Cpus(wanted) = bind {
        if rails.iter().all(|r| r.cpus.is_empty()) {
            anyhow::bail!(
                "--bind {}: none of these CPUs may be used by this rank (allowed: {})",
                chd::topology::cpulist::format(wanted),
                chd::topology::cpulist::format(&allowed)
            );
        }
    }
    Ok(())
}

/// CPUs per device label.
type DeviceCpus = BTreeMap<String, Vec<u32>>;

/// Where the rank processes of a device backend run: under `--bind auto`, on chd's advice for
/// their device (the best measured CPUs of the node's ledger in `state_dir`, among this
/// rank's CPUs), else on their rail's NUMA node (see [`place`]); under `--bind CPULIST`
/// there (the collectives' process too); under `--bind none` where the launcher put the rank.
fn device_placement(
    bind: &chd::fabric::placement::Bind,
    roots: &chd::topology::Roots,
    state_dir: &Path,
) -> anyhow::Result<(DeviceCpus, Vec<u32>)> {
    use chd::fabric::placement::Bind;
    use chd::topology::cpulist;
    let allowed = || chd::affinity::current_cpus().context("reading this rank's CPUs");
    match bind {
        Bind::Off => Ok((BTreeMap::new(), Vec::new())),
        Bind::Cpus(list) => {
            let allowed = allowed()?;
            Ok((
                BTreeMap::new(),
                list.iter()
                    .copied()
                    .filter(|c| allowed.contains(c))
                    .collect(),
            ))
        }
        Bind::Auto => {
            let state = chd::store::persist::state_path(state_dir);
            if !state.exists() {
                tracing::info!(
                    "no {} to advise CPUs from: each rank process runs on its rail's NUMA node",
                    state.display()
                );
                return Ok((BTreeMap::new(), Vec::new()));
            }
            let input = super::ledger::Input::StateDir(state_dir.to_path_buf());
            let ledger = match super::ledger::ledger_of(&input, None, roots, session::unix_now()) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(
                        "{e:#}: no advice, each rank process runs on its rail's NUMA node"
                    );
                    return Ok((BTreeMap::new(), Vec::new()));
                }
            };
            let allowed = allowed()?;
            let advised: BTreeMap<String, Vec<u32>> = chd::ledger::advice::advise(&ledger)
                .devices
                .into_iter()
                .map(|d| {
                    let cpus: Vec<u32> = cpulist::parse(&d.cpus)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| allowed.contains(c))
                        .collect();
                    (d.device, cpus)
                })
                .filter(|(_, cpus)| !cpus.is_empty())
                .collect();
            tracing::info!(
                "chd's advice from {}: {}",
                state.display(),
                if advised.is_empty() {
                    "none for this rank's CPUs; each rank process runs on its rail's NUMA node"
                        .to_string()
                } else {
                    advised
                        .iter()
                        .map(|(d, c)| format!("device {d} on CPUs {}", cpulist::format(c)))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            );
            Ok((advised, Vec::new()))
        }
    }
}

/// Under Slurm, rank 0's host is the first node of the step by its Slurm name, which need not
/// resolve (`NodeName=gpu01 NodeAddr=10.1.0.1`): a rank that must reach it over the network
/// and cannot resolve the name asks Slurm for the node's address (`scontrol show node`), as
/// srun itself does. Nothing changes where the name resolves or Slurm cannot say.
fn slurm_node_addr(launch: &mut Launch) {
    use std::net::ToSocketAddrs;
    let rv = &launch.rendezvous;
    if launch.engine != launch::Engine::Slurm
        || launch.rank == 0
        || launch.rank0_here
        || (rv.host.as_str(), rv.port).to_socket_addrs().is_ok()
    {
        return;
    }
    let addr = chd::slurm::scontrol::Scontrol::locate(None, std::env::var_os("PATH"), None)
        .and_then(|s| s.node_addr(&rv.host));
    match addr {
        Ok(Some(addr)) if addr != rv.host => {
            tracing::info!(
                "rank 0's node {} does not resolve; Slurm's NodeAddr is {addr}",
                rv.host
            );
            launch.rendezvous.host = addr;
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(
            "rank 0's node {} does not resolve, and Slurm gives no address for it: {e}",
            rv.host
        ),
    }
}
