//! Command-line interface: the raw clap arguments and their translation into a
//! configuration layer. Validation happens in `chd::config`, never here.

mod client_args;
mod collector_args;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use chd::config::{Layer, RawCells};
use client_args::ClientArgs;
use collector_args::CollectorArgs;

/// chd keeps accelerator nodes honest: it measures, in idle windows, how fast each CPU core
/// feeds each device, which cores can really be bound, and serves it all to Prometheus.
#[derive(Debug, Parser)]
#[command(name = "chd", version, propagate_version = true)]
pub struct Cli {
    /// Root of the sysfs tree to read (a fixture tree in tests).
    #[arg(long, global = true, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Root of the procfs tree to read (a fixture tree in tests).
    #[arg(long, global = true, value_name = "DIR")]
    pub procfs_root: Option<PathBuf>,
    /// Log filter (tracing env-filter syntax); RUST_LOG works too.
    #[arg(long, global = true, default_value = "info", value_name = "FILTER")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the exporter: probe in idle windows and serve /metrics.
    ///
    /// Every option also has a config-file key (shown in brackets); flags override the file,
    /// the file overrides the built-in defaults. `--print-config` shows the result.
    Serve(Box<ServeArgs>),
    /// Print the CPUs, NUMA nodes, cpuset and devices chd sees.
    Topology(TopologyArgs),
    /// Measure now, in one go: full or partial matrices with progress, Ctrl-C and --resume,
    /// and with --out a run directory and its report.
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// Render a run directory (chd's, or a ClusterHealthDetect recording) as summary.md,
    /// cells.csv, heatmap PNGs and report.xlsx.
    Report(ReportArgs),
    /// The node's verdict for a scheduler's health check, from what chd measured (it never
    /// probes): one line of causes and the exit code 0 ok, 1 degraded, 2 failed, 3 unknown
    /// (no state file, an unreadable one, nothing measured). For LBNL NHC or cron; with
    /// --slurm a complete Slurm HealthCheckProgram (it drains and resumes the node itself),
    /// with --npd a node-problem-detector custom plugin. A state file or recording counts
    /// every finding at once; chd serve's own verdict (chd_node_verdict, --url) waits for a
    /// finding to show in two windows.
    Check(CheckArgs),
    /// Print the node's calibration ledger: one JSON document (schema chd.calibration/v2,
    /// docs/calibration.schema.json) with the node's identity and topology, every
    /// core x device and core-pair cell (GB/s, samples, age), the affinity verdicts, the
    /// load-profile delta, and the device ratios, NUMA segments, measured NUMA nodes, best
    /// CPUs and findings as chd computes them. `chd serve` serves the same document at
    /// /api/v1/calibration.
    ///
    /// It reads what chd measured, never probes: a recording (--replay, as chd serve --replay
    /// takes) or chd serve's state directory (--state-dir, default /var/lib/chd). With --merge
    /// it makes one fleet file (schema chd.calibration-fleet/v1) of several nodes' ledgers,
    /// refusing ledgers of another schema version and two of one host. With --url it fetches
    /// a running chd serve's /api/v1/calibration instead, as served (refused unless it parses
    /// as a ledger).
    Ledger(LedgerArgs),
    /// Launch advice from what chd measured: for each device the CPUs whose H2D cell is
    /// within 5 % of the device's best (a cpulist, bindable CPUs only), their NUMA node
    /// against the one sysfs declares, a numactl and a taskset line per local rank (local
    /// rank i drives the i-th device) and Slurm --cpu-bind lists (map_cpu:, mask_cpu:).
    ///
    /// With --map FILE it scores a proposed launch map instead: JSON
    /// ([{"rank": 0, "device": "0", "cpus": "0-7"}, ...], or that list under "ranks") or
    /// lines `rank device cpulist`. Per rank: the expected H2D (median of its CPUs' cells)
    /// over the best on that device, times the pair matrix's ratio of its CPUs where a pair
    /// matrix covers it and another rank's device. Exit 0 when every rank is at or above
    /// --threshold, 1 when one is below (to gate a launch in CI), 2 on bad input.
    ///
    /// The ledger comes from a recording (--replay), chd serve's state directory
    /// (--state-dir, default /var/lib/chd), a ledger file (--ledger, `-` for stdin) or a
    /// node's /api/v1/calibration (--url http://node:9863, or https:// with --ca-file,
    /// --cert-file and --key-file, --user and --password-file for a node serving a web
    /// config file).
    Advise(AdviseArgs),
    /// Between nodes: the fleet schedule of the fabric probe.
    #[command(subcommand)]
    Fabric(FabricCommand),
}

#[derive(Debug, Subcommand)]
pub enum FabricCommand {
    /// Print a round-robin schedule of node pairs: every pair of the nodes exactly once, in
    /// n - 1 rounds of disjoint pairs (n rounds for an odd n, each giving one node a bye), so
    /// the pairs of one round can run at the same time and a slow node shows as the common
    /// factor of its slow pairs. A batch script runs one round per job (`--round K`), one
    /// `chd probe fabric` per pair; deploy/slurm/chd-fabric-round.sbatch does it with srun.
    ///
    /// Text: `round 1: a-b c-d` (and `bye: e`), one line per round; json: {"nodes",
    /// "round_count", "rounds": [{"round", "pairs": [["a", "b"], ...], "bye"}]}; pairs: one
    /// line `ROUND A B` per pair, for `while read -r round a b` in a shell script (node
    /// names may contain '-').
    Rounds(RoundsArgs),
}

#[derive(Debug, Args)]
pub struct RoundsArgs {
    /// The nodes: a file of one node per line (`#` comments, blank lines skipped; e.g.
    /// `scontrol show hostnames` output), `-` for stdin, or a list: comma-separated names and
    /// Slurm hostlist expressions (`node[01-04,07],gpu-a`). A value naming an existing file,
    /// or containing '/', is a file. Every node once; at least two.
    #[arg(long, value_name = "FILE|LIST")]
    pub nodes: String,
    /// Print only round K (1-based), e.g. for the batch job of that round.
    #[arg(long, value_name = "K")]
    pub round: Option<usize>,
    /// Output: text, json or pairs.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json", "pairs"])]
    pub format: String,
}

impl RoundsArgs {
    /// The command's request.
    pub fn request(&self) -> crate::commands::fabric::RoundsRequest {
        use crate::commands::fabric::{RoundsFormat, RoundsRequest};
        RoundsRequest {
            nodes: self.nodes.clone(),
            round: self.round,
            format: match self.format.as_str() {
                "json" => RoundsFormat::Json,
                "pairs" => RoundsFormat::Pairs,
                _ => RoundsFormat::Text,
            },
        }
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub from: CheckFrom,
    /// Act as Slurm's HealthCheckProgram: drain this node (Reason="chd: <causes>") on a
    /// verdict at --drain-on or worse, resume it on ok when its drain reason is chd's, never
    /// touch a node drained, down or reserved for anything else. Exit 4 when the circuit
    /// breaker (--max-drained) refuses a drain; 3 when Slurm cannot be read or changed.
    #[arg(long, conflicts_with = "npd")]
    pub slurm: bool,
    /// With --slurm: the verdict that drains the node (failed or degraded).
    #[arg(long, value_name = "VERDICT", default_value = "failed", value_parser = ["failed", "degraded"], requires = "slurm")]
    pub drain_on: String,
    /// With --slurm: the most nodes of each of this node's partitions chd may hold drained,
    /// this one included: a count (3) or a percentage of the partition (10%; rounded down,
    /// at least one node above 0%). Counted from `scontrol show nodes`: the nodes drained with
    /// a reason starting `chd:`.
    #[arg(long, value_name = "N|P%", default_value = "10%", value_parser = parse_max_drained, requires = "slurm")]
    pub max_drained: chd::slurm::breaker::MaxDrained,
    /// With --slurm: this node's Slurm name [default: $SLURMD_NODENAME, else the short host
    /// name].
    #[arg(long, value_name = "NAME", requires = "slurm")]
    pub slurm_node: Option<String>,
    /// With --slurm: the scontrol to run [default: the first on PATH, else /usr/bin,
    /// /usr/local/bin, /opt/slurm/bin].
    #[arg(long, value_name = "PATH", requires = "slurm")]
    pub scontrol: Option<PathBuf>,
    /// With --slurm: the cluster's slurm.conf, passed to scontrol as SLURM_CONF [default:
    /// $SLURM_CONF, else scontrol's own default].
    #[arg(long, value_name = "FILE", requires = "slurm")]
    pub slurm_conf: Option<PathBuf>,
    /// Speak node-problem-detector's custom plugin protocol: exit 0 when the node is not
    /// failed (condition ChdCalibrationFailed False), 1 when it is (True), 2 when unknown;
    /// stdout one message of at most --npd-max-output bytes.
    #[arg(long)]
    pub npd: bool,
    /// With --npd: the plugin monitor's max_output_length (NPD cuts stdout there).
    #[arg(long, value_name = "BYTES", default_value_t = 80, requires = "npd")]
    pub npd_max_output: usize,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Where `chd check` reads the verdict from (exactly one).
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct CheckFrom {
    /// chd serve's state directory (reads its state.json).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// A recording or run directory, as chd serve --replay reads it (a ClusterHealthDetect
    /// run, a chd probe --out directory, a state.json).
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// A running chd serve, http://HOST[:PORT] or https://HOST[:PORT] (port 9863 by
    /// default): its verdict as it holds it (from /api/v1/calibration; TLS and basic auth
    /// with the flags below).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
}

fn parse_max_drained(text: &str) -> Result<chd::slurm::breaker::MaxDrained, String> {
    text.parse()
}

impl CheckArgs {
    /// Where the verdict comes from.
    pub fn source(&self) -> crate::commands::check::CheckSource {
        use crate::commands::check::CheckSource;
        let f = &self.from;
        match (&f.replay, &f.state_dir, &f.url) {
            (Some(path), _, _) => CheckSource::Replay(path.clone()),
            (None, Some(dir), _) => CheckSource::StateDir(dir.clone()),
            (None, None, Some(url)) => CheckSource::Url(self.client.remote(url)),
            (None, None, None) => unreachable!("clap requires one of --replay, --state-dir, --url"),
        }
    }

    /// What `chd check` does with the verdict.
    pub fn mode(&self) -> crate::commands::check::Mode {
        use crate::commands::check::{Mode, SlurmRequest};
        use chd::slurm::decide::{DrainOn, Policy};
        if self.slurm {
            return Mode::Slurm(SlurmRequest {
                policy: Policy {
                    drain_on: if self.drain_on == "degraded" {
                        DrainOn::Degraded
                    } else {
                        DrainOn::Failed
                    },
                    max_drained: self.max_drained,
                },
                node: self.slurm_node.clone(),
                scontrol: self.scontrol.clone(),
                slurm_conf: self.slurm_conf.clone(),
            });
        }
        if self.npd {
            return Mode::Npd {
                max_output: self.npd_max_output,
            };
        }
        Mode::Plain
    }
}

#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// A recording, as chd ledger --replay takes.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["state_dir", "ledger", "url"])]
    pub replay: Option<PathBuf>,
    /// chd serve's state directory [default: /var/lib/chd].
    #[arg(long, value_name = "DIR", conflicts_with_all = ["ledger", "url"])]
    pub state_dir: Option<PathBuf>,
    /// A ledger file (chd ledger --out, of a recording or a node's --url); `-` reads stdin.
    #[arg(long, value_name = "FILE", conflicts_with = "url")]
    pub ledger: Option<PathBuf>,
    /// A node's chd serve: http://HOST[:PORT] or https://HOST[:PORT] (port 9863 by default;
    /// TLS and basic auth with the flags below).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Score this launch map (JSON, or `rank device cpulist` lines) instead of advising.
    #[arg(long, value_name = "FILE")]
    pub map: Option<PathBuf>,
    /// Lowest score a rank of --map may have (score: expected H2D / best on its device,
    /// times its pair ratio).
    #[arg(long, value_name = "RATIO", default_value_t = 0.9)]
    pub threshold: f64,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl AdviseArgs {
    /// Where the ledger comes from.
    pub fn source(&self) -> crate::commands::advise::Source {
        use crate::commands::advise::Source;
        use crate::commands::ledger::Input;
        match (&self.replay, &self.state_dir, &self.ledger, &self.url) {
            (Some(file), ..) => Source::Local(Input::Replay(file.clone())),
            (_, Some(dir), ..) => Source::Local(Input::StateDir(dir.clone())),
            (_, _, Some(file), _) => Source::File(file.clone()),
            (_, _, _, Some(url)) => Source::Url(self.client.remote(url)),
            _ => Source::Local(Input::StateDir(chd::config::DEFAULT_STATE_DIR.into())),
        }
    }
}

#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// A recording: a ClusterHealthDetect results.json or run directory, a chd probe --out
    /// run directory, or a chd state.json.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["state_dir", "merge"])]
    pub replay: Option<PathBuf>,
    /// chd serve's state directory [default: /var/lib/chd].
    #[arg(long, value_name = "DIR", conflicts_with = "merge")]
    pub state_dir: Option<PathBuf>,
    /// Merge these nodes' ledgers (files chd ledger wrote) into one fleet file.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub merge: Vec<PathBuf>,
    /// The host name to record [default: the recording's; this machine's for a state
    /// directory; else the recording's file name].
    #[arg(long, value_name = "NAME", conflicts_with = "merge")]
    pub host: Option<String>,
    /// A running chd serve's ledger instead: http://HOST[:PORT] or https://HOST[:PORT] (port
    /// 9863 by default, path /api/v1/calibration; TLS and basic auth with the flags below).
    #[arg(long, value_name = "URL", conflicts_with_all = ["replay", "state_dir", "merge", "host"])]
    pub url: Option<String>,
    /// Write the document to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl LedgerArgs {
    /// The node `--url` fetches the ledger from.
    pub fn remote(&self) -> Option<crate::commands::fetch::Remote> {
        self.url.as_deref().map(|url| self.client.remote(url))
    }

    /// Where the ledger's measurements come from.
    pub fn input(&self) -> crate::commands::ledger::Input {
        use crate::commands::ledger::Input;
        match (&self.replay, &self.state_dir) {
            (Some(file), _) => Input::Replay(file.clone()),
            (None, Some(dir)) => Input::StateDir(dir.clone()),
            (None, None) => Input::StateDir(chd::config::DEFAULT_STATE_DIR.into()),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ProbeCommand {
    /// The core x device copy matrix: every selected CPU x device x size x direction x host
    /// memory kind, each cell measured --repeats times (every pass in a fresh random order),
    /// under each --load profile.
    ///
    /// With --out DIR every sample is appended to DIR/cells.jsonl as it is measured (the plan
    /// is in DIR/run.json); Ctrl-C stops after the cell in flight and keeps what was measured;
    /// --resume continues exactly where the run stopped; at the end the report (summary.md,
    /// cells.csv, h2d_<size>.png, report.xlsx) is written to DIR.
    H2d(Box<H2dArgs>),
    /// The core-pair matrix of a device pair: its allgather (NCCL with cuda, HCCL with acl,
    /// peer copies where neither is found) with rank 0 bound to each selected CPU x rank 1
    /// bound to each selected CPU, per size, each cell measured --repeats times (every pass
    /// in a fresh random order). Bus bandwidth as nccl-tests defines it.
    ///
    /// With --out DIR every sample is appended to DIR/cells.jsonl as it is measured (the plan
    /// is in DIR/run.json); Ctrl-C stops after the cell in flight and keeps what was measured;
    /// --resume continues exactly where the run stopped; at the end the report (summary.md
    /// with the slow rank 0 / rank 1 CPUs, cells.csv, pair_<a>-<b>_<size>.png, report.xlsx)
    /// is written to DIR. A cell whose collective fails or exceeds --timeout is recorded as
    /// failed, and the run exits non-zero.
    Pair(Box<PairArgs>),
    /// Same-device copies (device memory to device memory of one device: HBM to HBM on an
    /// accelerator; on the host backend between two buffers of the NUMA node): per device and
    /// size, each device measured from one CPU of its NUMA node (recorded in run.json and the
    /// report), each cell --repeats times (every pass in a fresh random order), under each
    /// --load profile. Bytes of one copy over its time, as nvbandwidth counts them.
    ///
    /// With --out DIR every sample is appended to DIR/cells.jsonl as it is measured (the plan
    /// is in DIR/run.json); Ctrl-C stops after the cell in flight and keeps what was measured;
    /// --resume continues exactly where the run stopped; at the end the report (summary.md
    /// with each device's median, its ratio to the node's typical device and the slow devices
    /// flagged, cells.csv, report.xlsx) is written to DIR. A device whose copies fail costs
    /// only its cells; the run then exits non-zero.
    D2d(Box<D2dArgs>),
    /// The ordered device x device peer copy matrix: every ordered pair SRC>DST of the
    /// selected devices, with each pair's PCIe path class (PIX, PXB, PHB, NODE, SYS).
    ///
    /// One thread (bound to --cpu) copies --size bytes from a buffer on SRC to a buffer on DST
    /// on a stream of SRC, timed with device events; each pair measured --repeats times (every
    /// pass in a fresh random order). Peer access is enabled for the
    /// pair where the runtime allows and disabled again after it; a CUDA pair whose peer
    /// access is refused is still measured, staged through host memory, and recorded as
    /// method copy-staged; an ACL pair whose peer access is refused fails with the refusal.
    /// Each pair gets its PCIe path class from the sysfs PCI tree, as nvidia-smi topo -m
    /// names them: PIX (one PCIe switch), PXB (several switches below one host bridge), PHB
    /// (through a host bridge), NODE (host bridges of one NUMA node), SYS (across the CPU
    /// interconnect), unknown (no PCI path).
    ///
    /// With --out DIR every sample is appended to DIR/cells.jsonl as it is measured (the plan,
    /// path classes and methods are in DIR/run.json; cells are labelled SRC>DST, e.g. 0>5);
    /// Ctrl-C stops after the cell in flight; --resume continues where the run stopped; at the
    /// end the report is written to DIR: summary.md (medians per path class, pairs below 0.7 x
    /// their class median, failed pairs), p2p.csv, cells.csv, p2p_<size>.png (source x
    /// destination heatmap), report.xlsx. A failed pair costs only its cells; the run then
    /// exits non-zero.
    P2p(Box<P2pArgs>),
    /// Size curves: from one CPU to each device, every operation (--ops: h2d, d2h, d2d
    /// same-device copy, allgather of the device with its peer) at sizes doubling from --from
    /// to --to, each point measured --repeats times with the event timing of probe h2d.
    ///
    /// The CPU (--cpu) defaults to the first CPU of the first device's NUMA node; allgather
    /// runs rank 0 there and rank 1 on the first other CPU of the peer's NUMA node, the peer being
    /// --peer or each device's farthest device by PCI topology (skipped, with a note, when
    /// there is one device or no pair probe opens; without NCCL/HCCL its points are peer
    /// copies, as in probe pair). A point's value is the median of its
    /// samples and its spread (max - min) / median; the report flags points whose spread is
    /// wide (re-measure), dips (a point well below the curve on both sides) and each curve's
    /// plateau (the smallest size from which it stays within 5 % of its maximum). An operation
    /// the backend cannot do is recorded as failed with reason unsupported and named as such.
    ///
    /// With --out DIR every sample is appended to DIR/cells.jsonl as it is measured; --resume
    /// continues an interrupted run; at the end sweep.csv (one row per operation, device and
    /// size), sweep.png (GB/s over a log2 size axis) and summary.md are written to DIR, and
    /// chd report DIR writes them again.
    Sweep(Box<SweepArgs>),
    /// The basic validation table, the one to read first to see whether a node is sane at
    /// all: per device, from a CPU of its NUMA node, matmul TFLOPS (cuBLAS SGEMM), H2D and
    /// same-device D2D GB/s, and the 2-rank allgather of its pair (consecutive devices: 0,1
    /// 2,3 ...), each under every --load profile; per measurement and profile the slowest
    /// and the fastest device, and a finding when the slowest is below 0.8 x the fastest.
    ///
    /// What the backend cannot measure (matmul without cuBLAS, e.g. on acl; allgather with
    /// one device) is said in the report, never shown as zeros. With --out DIR the samples
    /// stream to DIR/cells.jsonl, --resume continues, and the report (summary.md "Basic
    /// validation", basics.csv, report.xlsx) is written there.
    Basics(Box<BasicsArgs>),
    /// Which CPUs a thread can really be bound to (bind, read back, restore), e.g. inside a
    /// container whose cpuset lists cores it cannot use.
    Affinity(AffinityArgs),
    /// Between nodes: one rank of a fabric run, started by a launcher on every node at once
    /// (srun, a Kubernetes Indexed Job, torchrun, mpirun); chd never starts its peers.
    ///
    /// The rank, world size, local rank and rank 0's address come from the launcher's
    /// variables (Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the first host of
    /// SLURM_STEP_NODELIST; an Indexed Job: JOB_COMPLETION_INDEX with CHD_FABRIC_JOB,
    /// CHD_FABRIC_SUBDOMAIN and CHD_FABRIC_WORLD_SIZE; torchrun: RANK, WORLD_SIZE,
    /// LOCAL_RANK, MASTER_ADDR, MASTER_PORT; Open MPI: OMPI_COMM_WORLD_*; PMI: PMI_RANK,
    /// PMI_SIZE), or CHD_FABRIC_RENDEZVOUS; the flags override them. Rank 0 listens, the others
    /// connect; every rank proves it has the run's token (--token-file or CHD_FABRIC_TOKEN)
    /// without sending it. Rank 0 plans: one measuring rank per node; each rail (an
    /// interface with an address; --rails names them) paired with the peer's rail in the same
    /// subnet, measured both ways, one transfer at a time, --streams TCP streams bound to the
    /// rail carrying --bytes. A rank that never arrives, a wrong token or a rank that dies
    /// ends the run on every surviving rank with an error naming it (exit 1).
    ///
    /// Each node's measuring rank writes its side (per rail and direction: GB/s, and the
    /// rails judged slow: below 0.7 x the median of the node's other rails) atomically to
    /// STATE_DIR/fabric/RUN__PEER.json, where chd serve publishes it at its next scrape; a
    /// failed run is recorded as failed. --format json prints the rank's results on stdout.
    ///
    /// With --backend cuda (NCCL) or acl (HCCL) each rail is measured by the device's own
    /// library: a point-to-point send of --bytes between two rank processes started for that
    /// rail alone (NCCL_SOCKET_IFNAME, NCCL_IB_HCA for an RDMA port; HCCL_SOCKET_IFNAME,
    /// HCCL_IF_IP), on the device nearest the rail's NIC, timed with device events; the
    /// collectives run in one rank process per rank on --device (default: the local rank's).
    Fabric(Box<FabricArgs>),
    /// One rank process of a device-backend fabric run: reads its job (one JSON line) on
    /// stdin, says what it did as JSON lines on stdout. Started by chd probe fabric itself.
    #[command(hide = true)]
    FabricRank,
}

#[derive(Debug, Args)]
pub struct FabricArgs {
    /// What measures: host (TCP streams over the rails and a TCP ring), cuda (NCCL) or acl
    /// (HCCL): each rail a send between two rank processes confined to it, the collectives
    /// over every rank's device.
    #[arg(long, value_name = "BACKEND", default_value = "host")]
    pub backend: String,
    /// cuda/acl: the device of the collectives (and of every rail) [default: the local
    /// rank's for the collectives, the device nearest each rail's NIC for the rails].
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// cuda/acl: the collectives' algorithm: auto (the library's choice) or ring
    /// (NCCL_ALGO=Ring, HCCL_ALGO=level0:NA;level1:ring; two-node all-reduce with other
    /// algorithms can overstate what the NICs carry).
    #[arg(long, value_name = "auto|ring", default_value = "auto", value_parser = ["auto", "ring"])]
    pub algorithm: String,
    /// cuda/acl: untimed operations before each timed set.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub warmup: u32,
    /// cuda/acl: timed operations per rail transfer and per collective (their mean).
    #[arg(long, alias = "iters", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,
    /// libcudart to load instead of libcudart.so / libcudart.so.12 ... [runtime.cuda_runtime].
    #[arg(long, value_name = "PATH")]
    pub cuda_runtime: Option<PathBuf>,
    /// libascendcl to load instead of libascendcl.so [runtime.acl_runtime].
    #[arg(long, value_name = "PATH")]
    pub acl_runtime: Option<PathBuf>,
    /// libnccl to load instead of libnccl.so / libnccl.so.2 [runtime.nccl].
    #[arg(long, value_name = "PATH")]
    pub nccl: Option<PathBuf>,
    /// libhccl to load instead of libhccl.so [runtime.hccl].
    #[arg(long, value_name = "PATH")]
    pub hccl: Option<PathBuf>,
    /// This rank [default: from the launcher's variables].
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// Ranks in the run [default: from the launcher's variables].
    #[arg(long, value_name = "N")]
    pub world_size: Option<u32>,
    /// This rank among the ranks of its node [default: from the launcher, else 0].
    #[arg(long, value_name = "N")]
    pub local_rank: Option<u32>,
    /// Rank 0's address, HOST or HOST:PORT [default: from the launcher's variables].
    #[arg(long, value_name = "HOST[:PORT]")]
    pub rendezvous: Option<String>,
    /// Rank 0's port [default: MASTER_PORT under torchrun, CHD_FABRIC_PORT, else 29517].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// This rank's node name, as the results name it [default: the hostname].
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// A file holding the run's shared token (at least 16 bytes) [default: CHD_FABRIC_TOKEN].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The rails: interfaces whose name matches (loopback included when it matches)
    /// [default: every interface with an address other than loopback].
    #[arg(long, value_name = "REGEX")]
    pub rails: Option<String>,
    /// Bytes each transfer moves (one rail, one direction), e.g. 256MiB, 1GiB.
    #[arg(long, value_name = "SIZE", default_value = "1GiB")]
    pub bytes: String,
    /// Parallel TCP streams per transfer (host; a device backend's library makes its own).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: u32,
    /// Where each rail's streams run: auto (the CPUs of the NUMA node its network device
    /// sits on, as sysfs says, among this rank's allowed CPUs and without those the node's
    /// affinity probe found unbindable: production placement), none, or a cpulist for every
    /// rail. A rail without a NUMA node (virtual, loopback) runs unbound; each rail's record
    /// names its CPUs. On cuda/acl a rank process runs on chd's advice for its device (the
    /// best measured CPUs of the state directory's ledger, as chd advise prints them), else
    /// as above.
    #[arg(long, value_name = "auto|none|CPULIST", default_value = "auto")]
    pub bind: chd::fabric::placement::Bind,
    /// The collectives over all ranks after the rails (bus bandwidth as nccl-tests defines
    /// it): allgather, allreduce, or none. Host: a ring over TCP as NCCL's ring moves data;
    /// cuda/acl: NCCL's / HCCL's own, on each rank's device.
    #[arg(long, value_name = "OPS", default_value = "allgather,allreduce")]
    pub collectives: String,
    /// Sizes of each collective (the whole buffer), e.g. 64MiB,1GiB.
    #[arg(long, value_name = "SIZES", default_value = "64MiB,1GiB")]
    pub collective_sizes: String,
    /// Seconds rank 0 waits for every rank (and a rank for rank 0).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub timeout: u64,
    /// Seconds one transfer may run before it is cut (and measured on what it carried); on
    /// cuda/acl, the longest any wait on a rank process may take before it is killed.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub transfer_timeout: u64,
    /// The node's chd state directory, where chd serve reads the results
    /// [paths.state_dir] (default /var/lib/chd, else ./chd-state).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Also write the rank's results and, on rank 0, the whole run (every rank, every
    /// transfer) to DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Output on stdout: text or json.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
}

#[derive(Debug, Args)]
pub struct BasicsArgs {
    /// Devices: all, or runtime device labels, comma-separated (0,3) [default: all].
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Measurements, comma-separated: matmul, h2d, d2d, allgather [default: all four].
    #[arg(long, value_name = "OP,...", value_delimiter = ',')]
    pub ops: Option<Vec<String>>,
    /// Bytes of each copy and of each rank's allgather buffer (KiB, MiB, GiB; a bare number
    /// is MiB) [default: 256MiB].
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// Side N of the matmul's N x N f32 matrices (three per device) [default: 4096].
    #[arg(long, value_name = "N")]
    pub matrix_side: Option<u64>,
    /// Untimed operations before each sample [default: 2].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed operations per sample [default: 10].
    #[arg(long, alias = "iters", value_name = "N")]
    pub iterations: Option<u32>,
    /// Samples per device, measurement and load profile; the value is their median
    /// [default: 3].
    #[arg(long, alias = "samples", value_name = "K")]
    pub repeats: Option<u32>,
    /// Background load while measuring, repeatable (one pass per profile): idle, cpu:N,
    /// cpu:N@CPULIST or device (a cuBLAS SGEMM loop on each device; cuda only), as for
    /// `chd probe h2d` [default: idle].
    #[arg(long = "load", value_name = "PROFILE")]
    pub loads: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Args)]
pub struct H2dArgs {
    /// CPUs: all or auto (every CPU this process may use), per-node:N (N spread over each
    /// NUMA node), or a list like 0-79,160 [default: all].
    #[arg(long, value_name = "SELECTION")]
    pub cpus: Option<String>,
    /// Devices: all, or runtime device labels, comma-separated (0,3 or numa0) [default: all].
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Copy sizes, comma-separated: 16MiB,64MiB,1GiB (KiB, MiB, GiB; a bare number is MiB)
    /// [default: 64MiB].
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',')]
    pub sizes: Option<Vec<String>>,
    /// Directions, comma-separated: h2d, d2h [default: h2d].
    #[arg(
        long,
        alias = "direction",
        value_name = "DIR,...",
        value_delimiter = ','
    )]
    pub directions: Option<Vec<String>>,
    /// Host memory kinds, comma-separated: pinned, pageable (the host backend always uses
    /// pageable; the acl backend refuses it) [default: pinned]. Same as --host-memory.
    #[arg(long, value_name = "KIND,...")]
    pub memory: Option<String>,
    /// Untimed copies before each sample [default: 2]. More than chd serve's 1 + 4: a
    /// one-shot run has the node to itself and takes a cell's samples back to back, so each
    /// sample averages more copies.
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed copies per sample [default: 10] (chd serve: 4, see --warmup).
    #[arg(long, alias = "iters", value_name = "N")]
    pub iterations: Option<u32>,
    /// Samples per cell and load profile; the cell's value is their median [default: 3].
    /// Fewer than chd serve keeps (5): these are taken now, one after another; serve's
    /// accrue over days, one per window.
    #[arg(long, alias = "samples", value_name = "K")]
    pub repeats: Option<u32>,
    /// Background load while measuring, repeatable (one run per profile): idle, cpu:N (N
    /// threads streaming memory and doing multiply-adds, pinned away from the probed CPUs),
    /// cpu:N@CPULIST (pinned to CPULIST) or device (a cuBLAS SGEMM loop on each probed
    /// device on its own stream; cuda backend only) [default: idle].
    #[arg(long = "load", value_name = "PROFILE")]
    pub loads: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Devices: all, or runtime device labels, comma-separated (0,3 or numa0) [default: all].
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// The CPU every point is measured from (allgather: rank 0's) [default: the first CPU of
    /// the first device's NUMA node, else the first CPU this process may use].
    #[arg(long, value_name = "N")]
    pub cpu: Option<u32>,
    /// Smallest size (KiB, MiB, GiB; a bare number is MiB) [default: 128KiB].
    #[arg(long, value_name = "SIZE")]
    pub from: Option<String>,
    /// Largest size; the sizes double from --from up to it [default: 1GiB].
    #[arg(long, value_name = "SIZE")]
    pub to: Option<String>,
    /// Operations, comma-separated: h2d, d2h, d2d (same-device copy), allgather (2 ranks:
    /// the device and its peer) [default: all four].
    #[arg(long, value_name = "OP,...", value_delimiter = ',')]
    pub ops: Option<Vec<String>>,
    /// Rank 1's device in every allgather point [default: each device's farthest peer by
    /// PCI topology].
    #[arg(long, value_name = "DEVICE")]
    pub peer: Option<String>,
    /// Host memory of the h2d and d2h points: pinned or pageable (the host backend always
    /// uses pageable) [default: pinned].
    #[arg(long, value_name = "KIND")]
    pub memory: Option<String>,
    /// Untimed operations before each sample [default: 2].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed operations per sample [default: 10].
    #[arg(long, alias = "iters", value_name = "N")]
    pub iterations: Option<u32>,
    /// Samples per point; the point's value is their median and its spread their
    /// (max - min) / median [default: 3].
    #[arg(long, alias = "samples", value_name = "K")]
    pub repeats: Option<u32>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Args)]
pub struct D2dArgs {
    /// Devices: all, or runtime device labels, comma-separated (0,3 or numa0) [default: all].
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Copy sizes, comma-separated: 64MiB,256MiB,1GiB (KiB, MiB, GiB; a bare number is MiB);
    /// each cell holds two buffers of the size on its device [default: 256MiB].
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',')]
    pub sizes: Option<Vec<String>>,
    /// Untimed copies before each sample [default: 2].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed copies per sample [default: 10].
    #[arg(long, alias = "iters", value_name = "N")]
    pub iterations: Option<u32>,
    /// Samples per cell and load profile; the cell's value is their median [default: 3].
    #[arg(long, alias = "samples", value_name = "K")]
    pub repeats: Option<u32>,
    /// Background load while measuring, repeatable (one run per profile): idle, cpu:N,
    /// cpu:N@CPULIST or device (a cuBLAS SGEMM loop on each probed device; cuda backend
    /// only), as for probe h2d [default: idle].
    #[arg(long = "load", value_name = "PROFILE")]
    pub loads: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Args)]
pub struct PairArgs {
    /// A device pair, e.g. 0,5, or auto (device 0 and its farthest peer by PCI topology);
    /// repeatable [default: auto].
    #[arg(long = "pair", value_name = "A,B|auto")]
    pub pairs: Vec<String>,
    /// CPUs of both ranks (the matrix is these x these): all or auto (every CPU this process
    /// may use), per-node:N (N spread over each NUMA node), or a list like 0-79,160
    /// [default: all].
    #[arg(long, value_name = "SELECTION")]
    pub cpus: Option<String>,
    /// Bytes per rank of one allgather, comma-separated: 16MiB,64MiB (KiB, MiB, GiB; a bare
    /// number is MiB) [default: 64MiB].
    #[arg(long, value_name = "SIZE,...", value_delimiter = ',')]
    pub sizes: Option<Vec<String>>,
    /// Untimed operations before each sample [default: 2]. More than chd serve's 1 + 4: a
    /// one-shot run has the node to itself and takes a cell's samples back to back, so each
    /// sample averages more operations.
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed operations per sample [default: 10] (chd serve: 4, see --warmup).
    #[arg(long, alias = "iters", value_name = "N")]
    pub iterations: Option<u32>,
    /// Samples per cell; the cell's value is their median [default: 3]. Fewer than chd
    /// serve keeps (5): these are taken now, one after another; serve's accrue over days,
    /// one per window.
    #[arg(long, alias = "samples", value_name = "K")]
    pub repeats: Option<u32>,
    /// Longest one cell may take; a collective still running then is aborted and the cell
    /// counts as failed, e.g. 30s, 500ms [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Args)]
pub struct P2pArgs {
    /// Devices, comma-separated runtime device labels (0,3,5), or all; every ordered pair of
    /// two of them is measured [default: all].
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Bytes of one copy (KiB, MiB, GiB; a bare number is MiB) [default: 256MiB].
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,
    /// The CPU the one issuing thread is bound to [default: the first CPU this process may
    /// use].
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<u32>,
    /// Untimed copies before each sample [default: 2]. More than chd serve's 1 + 4: a
    /// one-shot run has the node to itself and takes a cell's samples back to back, so each
    /// sample averages more copies.
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed copies per sample [default: 10] (chd serve: 4, see --warmup).
    #[arg(long, alias = "iters", value_name = "N")]
    pub iterations: Option<u32>,
    /// Samples per pair; the pair's value is their median [default: 3]. Fewer than chd
    /// serve keeps (5): these are taken now, one after another; serve's accrue over days,
    /// one per window.
    #[arg(long, alias = "samples", value_name = "K")]
    pub repeats: Option<u32>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The flags every `chd probe` matrix subcommand (h2d, pair, d2d, p2p, sweep, basics) shares
/// with the same help, last in each.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Run directory: stream samples to DIR/cells.jsonl and write the report there.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// TOML config file in chd serve's format; its [paths], [runtime] and [limits] keys
    /// apply (flags override it). [limits."MODEL"] h2d_gbps, d2h_gbps, d2d_gbps: the most
    /// a path of that device model carries, where no API says; a sample above it is
    /// reported implausible.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Continue the interrupted run in --out DIR with its plan; flags given must match it.
    #[arg(long, requires = "out")]
    pub resume: bool,
    /// Do not write the report at the end (chd report DIR writes it later).
    #[arg(long, requires = "out")]
    pub no_report: bool,
    /// Print plain progress lines even on a terminal.
    #[arg(long)]
    pub no_progress_bar: bool,
    /// Output on stdout without --out: table (GB/s), csv or json (bytes per second)
    /// [default: table].
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

impl RunArgs {
    /// These flags as the one-shot driver's run options (the planning flags, whose help
    /// differs per subcommand, go into the kind's request).
    fn options(&self, cli: &Cli) -> crate::commands::request::RunOptions {
        crate::commands::request::RunOptions {
            layer: cli.runtime_layer(&self.runtime),
            config: self.config.clone(),
            out: self.out.clone(),
            resume: self.resume,
            format: self.format.clone(),
            no_report: self.no_report,
            no_progress_bar: self.no_progress_bar,
        }
    }
}

#[derive(Debug, Args)]
pub struct AffinityArgs {
    /// CPUs to try: all (every online CPU, also those outside this process's cpuset), or a
    /// list like 0-79,160 [default: all].
    #[arg(long, value_name = "SELECTION")]
    pub cpus: Option<String>,
    /// Write DIR/affinity.json (chd report DIR includes it).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Output: table, csv or json [default: table].
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A run directory of chd probe --out; a ClusterHealthDetect run directory (results.json,
    /// else the per-rank rank_NNNNN.json, else the partial checkpoints, which the report
    /// then says; affinity.json beside them adds the CPU records); or one such file. Rows
    /// chd cannot use are counted by reason on stderr and in summary.md; a recording with
    /// no usable row is an error (exit 1). Also a ClusterHealthDetect xlsx workbook (H2D
    /// matrix, core-pair or NUMA affinity), or size-sweep JSON / CSV files, several at once:
    /// one chart and one table per operation, its settings (HCCL_BUFFSIZE, ...) compared.
    #[arg(value_name = "DIR|FILE", required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Where to write the report [default: the run directory, or the file's directory].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl ReportArgs {
    /// The library's request.
    pub fn request(&self) -> crate::commands::report::ReportRequest {
        crate::commands::report::ReportRequest {
            inputs: self.input.clone(),
            out: self.out.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct TopologyArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// Which accelerator runtime to load, shared by `serve` and `topology`.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// Runtime to probe with: auto (the first of cuda, acl that loads and has devices, else
    /// host), cuda, acl or host [runtime.backend] (default auto).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// libcudart to load instead of libcudart.so / libcudart.so.12 ... [runtime.cuda_runtime].
    #[arg(long, value_name = "PATH")]
    pub cuda_runtime: Option<PathBuf>,
    /// libascendcl to load instead of libascendcl.so [runtime.acl_runtime].
    #[arg(long, value_name = "PATH")]
    pub acl_runtime: Option<PathBuf>,
    /// libnvidia-ml to load instead of libnvidia-ml.so.1 [runtime.nvml].
    #[arg(long, value_name = "PATH")]
    pub nvml: Option<PathBuf>,
    /// Host side of accelerator copies: pinned or pageable (not with acl: aclrtMemcpyAsync
    /// needs aclrtMallocHost memory) [runtime.host_memory] (default pinned).
    #[arg(long, value_name = "KIND")]
    pub host_memory: Option<String>,
    /// What the core-pair probe moves bytes with: auto (NCCL with cuda, HCCL with acl, else
    /// peer copies), nccl, hccl or copy [runtime.collective] (default auto).
    #[arg(long, value_name = "NAME")]
    pub collective: Option<String>,
    /// libnccl to load instead of libnccl.so / libnccl.so.2 [runtime.nccl].
    #[arg(long, value_name = "PATH")]
    pub nccl: Option<PathBuf>,
    /// libhccl to load instead of libhccl.so [runtime.hccl].
    #[arg(long, value_name = "PATH")]
    pub hccl: Option<PathBuf>,
    /// HCCL communicators the pair probe holds at once on one card: each holds 2 x
    /// HCCL_BUFFSIZE (200 MB by default) of its memory, so a window over all pairs of 8 NPUs
    /// would otherwise hold up to 7 per card; a pair's communicators beyond it are released
    /// before the next pair's are made [runtime.hccl_communicators_per_card] (default 1).
    #[arg(long, value_name = "N")]
    pub hccl_communicators_per_card: Option<u32>,
}

impl RuntimeArgs {
    fn apply(&self, l: &mut Layer) {
        l.runtime.backend = self.backend.clone();
        l.runtime.cuda_runtime = self.cuda_runtime.clone();
        l.runtime.acl_runtime = self.acl_runtime.clone();
        l.runtime.nvml = self.nvml.clone();
        l.runtime.host_memory = self.host_memory.clone();
        l.runtime.collective = self.collective.clone();
        l.runtime.nccl = self.nccl.clone();
        l.runtime.hccl = self.hccl.clone();
        l.runtime.hccl_communicators_per_card = self.hccl_communicators_per_card;
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Address to serve on [server.listen] (default 0.0.0.0:9863).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Serve a recorded matrix instead of probing: a ClusterHealthDetect run directory or
    /// results file (read as chd report reads it), a chd probe --out directory, or a chd
    /// state.json; topology from the file, probing and collectors off [server.replay].
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// Most HTTP connections open at once; at the cap the longest-idle connection is closed
    /// for a new one, and while all are busy new ones wait [server.max_connections]
    /// (default 64).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Longest a connection may take to send a complete request head after its accept or
    /// its previous response (so also the keep-alive idle timeout) [server.header_timeout]
    /// (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub header_timeout: Option<String>,
    /// TLS and basic auth from the web config file Prometheus exporters share (YAML, as
    /// node_exporter's --web.config.file reads it: tls_server_config with cert_file and
    /// key_file, client_auth_type and client_ca_file; basic_auth_users with bcrypt hashes).
    /// Keys chd cannot honour are refused at startup by name. Re-read when it or a
    /// certificate it names changes. Unset: plain HTTP, no authentication
    /// [server.web_config_file].
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Where the matrix is saved [paths.state_dir] (default /var/lib/chd, else ./chd-state).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep a Node Feature Discovery feature file up to date with the node's verdict (e.g.
    /// /etc/kubernetes/node-feature-discovery/features.d/chd): NFD labels the node
    /// `chd.feature.node.kubernetes.io/verdict=ok|degraded|failed` and the like
    /// [paths.nfd_features_file] (default: none).
    #[arg(long, value_name = "FILE")]
    pub nfd_features_file: Option<PathBuf>,
    /// Windows in a row a finding must show in before the node's verdict names it
    /// [schedule.verdict_confirm_windows] (default 2).
    #[arg(long, value_name = "N")]
    pub verdict_confirm_windows: Option<u32>,
    /// Windows in a row a named finding must be absent from before the verdict drops it
    /// [schedule.verdict_clear_windows] (default 3).
    #[arg(long, value_name = "N")]
    pub verdict_clear_windows: Option<u32>,
    /// Time between scheduler ticks, e.g. 60s, 5m [schedule.interval] (default 60s).
    #[arg(long, value_name = "DURATION")]
    pub interval: Option<String>,
    /// Probing time one window may spend [schedule.window_budget] (default 2s).
    #[arg(long, value_name = "DURATION")]
    pub window_budget: Option<String>,
    /// Skip or stop a window when other processes use more than this share of all CPUs,
    /// 0..1; 1 disables the CPU gate [schedule.cpu_busy_threshold] (default 0.5).
    #[arg(long, value_name = "RATIO")]
    pub cpu_busy_threshold: Option<f64>,
    /// Skip or stop a window when a device is busier than this, 0..1; a foreign compute
    /// process on a device always counts as busy [schedule.device_busy_threshold]
    /// (default 0.1).
    #[arg(long, value_name = "RATIO")]
    pub device_busy_threshold: Option<f64>,
    /// Serve metrics but never probe [schedule.enabled = false].
    #[arg(long)]
    pub no_probe: bool,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub collectors: CollectorArgs,
    /// Copy sizes in MiB, comma-separated [probe.sizes_mib] (default 64).
    #[arg(long, value_name = "MIB,...", value_delimiter = ',')]
    pub sizes: Option<Vec<u64>>,
    /// Copy directions, comma-separated: h2d, d2h [probe.directions] (default h2d).
    #[arg(long, value_name = "DIR,...", value_delimiter = ',')]
    pub directions: Option<Vec<String>>,
    /// Untimed copies before timing a cell [probe.warmup] (default 1). Fewer than chd
    /// probe's 2 + 10 on purpose: serve measures between jobs and yields only between cells,
    /// so a cell is kept short (1 + 4 copies of 64 MiB at 0.2 GB/s, the slowest cells seen,
    /// fit a 2 s window; 2 + 10 would not), and the median of a cell's samples from separate
    /// windows does the averaging.
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed copies per sample [probe.iterations] (default 4; chd probe: 10, see --warmup).
    #[arg(long, value_name = "N")]
    pub iterations: Option<u32>,
    /// CPUs to probe: `all` (every CPU this process may use) or a list like 0-79,160
    /// [probe.cpus] (default all).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Samples a cell keeps; its value is their median [probe.samples_per_cell] (default 5;
    /// one per window, so more than chd probe's 3 back-to-back repeats).
    #[arg(long, value_name = "K")]
    pub samples: Option<usize>,
    /// Age after which a cell counts as stale [probe.stale_after] (default 24h).
    #[arg(long, value_name = "DURATION")]
    pub stale_after: Option<String>,
    /// Export every matrix cell, not only aggregates: true, false, or auto (when the planned
    /// matrix has at most exposition.auto_cells_limit cells, default 12288) [exposition.cells]
    /// (default auto).
    #[arg(long, value_name = "MODE", value_parser = ["true", "false", "auto"])]
    pub cells: Option<String>,
    /// A device pair for the core-pair probe, e.g. 0,5, or auto (device 0 and its farthest
    /// peer by PCI topology); repeatable [probe.pairs] (default none).
    #[arg(long = "pair", value_name = "A,B")]
    pub pairs: Vec<String>,
    /// Bytes per rank of one pair allgather, MiB [probe.pair_size_mib] (default 64).
    #[arg(long, value_name = "MIB")]
    pub pair_size: Option<u64>,
    /// Longest one pair cell may take before it is aborted [probe.pair_timeout]
    /// (default 30s).
    #[arg(long, value_name = "DURATION")]
    pub pair_timeout: Option<String>,
    /// Longest the device work of one copy cell may take; past it the cell is a timeout,
    /// its memory is kept (never freed under the DMA) and its devices get no cells until it
    /// finishes [probe.cell_timeout] (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub cell_timeout: Option<String>,
    /// Export every core-pair cell; 409,600 series at 640 CPUs [exposition.pair_cells]
    /// (default false).
    #[arg(long, value_name = "BOOL")]
    pub pair_cells: Option<bool>,
    /// Per-CPU series: exceptions (chd_cpu_bindable only for CPUs that cannot be bound, and
    /// chd_cpus counts) or all (every CPU's chd_cpu_bindable and chd_cpu_info; 1,280 series
    /// at 640 CPUs) [exposition.cpu_series] (default exceptions).
    #[arg(long, value_name = "MODE", value_parser = ["exceptions", "all"])]
    pub cpu_series: Option<String>,
    /// Size of the same-device copy (HBM to HBM) cell each window measures on every device,
    /// MiB; 0 turns it off [probe.d2d_size_mib] (default 64).
    #[arg(long, value_name = "MIB")]
    pub d2d_size: Option<u64>,
    /// Size of the ordered peer copy cell each window measures on one device pair (the least
    /// recently tried), MiB; 0 turns it off [probe.p2p_size_mib] (default 64).
    #[arg(long, value_name = "MIB")]
    pub p2p_size: Option<u64>,
}

impl Cli {
    /// What clap cannot say: `--ca-file`, `--cert-file`, `--key-file`, `--user` and
    /// `--password-file` need `--url` (clap drops a `requires` whose target conflicts with a
    /// flag given, as `--replay` does `--url`). A clap usage error (exit 2) otherwise.
    pub fn check_usage(&self) -> Result<(), clap::Error> {
        let (name, client, url) = match &self.command {
            Command::Advise(a) => ("advise", &a.client, a.url.is_some()),
            Command::Check(a) => ("check", &a.client, a.from.url.is_some()),
            Command::Ledger(a) => ("ledger", &a.client, a.url.is_some()),
            _ => return Ok(()),
        };
        match client.first_given() {
            Some(flag) if !url => {
                use clap::CommandFactory;
                let mut cli = Cli::command();
                cli.build();
                let verb = cli.find_subcommand_mut(name).expect("a verb of Command");
                Err(verb.error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    format!("{flag} is for a node's --url (it does not apply to a local source)"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The global flags as a configuration layer.
    pub fn global_layer(&self) -> Layer {
        let mut l = Layer::default();
        l.paths.sysfs = self.sysfs_root.clone();
        l.paths.procfs = self.procfs_root.clone();
        l
    }

    /// The pseudo filesystems' roots the global flags name.
    pub fn roots(&self) -> chd::topology::Roots {
        let d = chd::topology::Roots::default();
        chd::topology::Roots {
            sysfs: self.sysfs_root.clone().unwrap_or(d.sysfs),
            procfs: self.procfs_root.clone().unwrap_or(d.procfs),
        }
    }

    /// `chd probe`'s flags as the library's request.
    pub fn probe_request(&self, probe: &ProbeCommand) -> crate::commands::request::ProbeRequest {
        use crate::commands::request::{AffinityRequest, ProbeRequest};
        use chd::probe::plan::Common;
        use chd::probe::{basics, d2d, h2d, p2p, pairs, sweep};
        let counts = |warmup, iterations, repeats| Common {
            warmup,
            iterations,
            repeats,
            ..Common::default()
        };
        match probe {
            ProbeCommand::H2d(a) => ProbeRequest::H2d(
                a.run.options(self),
                h2d::Request {
                    common: Common {
                        cpus: a.cpus.clone(),
                        sizes: a.sizes.clone(),
                        ..counts(a.warmup, a.iterations, a.repeats)
                    },
                    devices: a.devices.clone(),
                    directions: a.directions.clone(),
                    host_memory: a
                        .memory
                        .clone()
                        .or_else(|| a.run.runtime.host_memory.clone()),
                    loads: a.loads.clone(),
                },
            ),
            ProbeCommand::Pair(a) => ProbeRequest::Pair(
                a.run.options(self),
                pairs::Request {
                    common: Common {
                        cpus: a.cpus.clone(),
                        sizes: a.sizes.clone(),
                        ..counts(a.warmup, a.iterations, a.repeats)
                    },
                    pairs: a.pairs.clone(),
                    timeout: a.timeout.clone(),
                },
            ),
            ProbeCommand::Basics(a) => ProbeRequest::Basics(
                a.run.options(self),
                basics::Request {
                    common: counts(a.warmup, a.iterations, a.repeats),
                    devices: a.devices.clone(),
                    ops: a.ops.clone(),
                    size: a.size.clone(),
                    matrix_side: a.matrix_side,
                    loads: a.loads.clone(),
                },
            ),
            ProbeCommand::Sweep(a) => ProbeRequest::Sweep(
                a.run.options(self),
                sweep::Request {
                    common: counts(a.warmup, a.iterations, a.repeats),
                    devices: a.devices.clone(),
                    cpu: a.cpu,
                    from: a.from.clone(),
                    to: a.to.clone(),
                    ops: a.ops.clone(),
                    peer: a.peer.clone(),
                    host_memory: a
                        .memory
                        .clone()
                        .or_else(|| a.run.runtime.host_memory.clone()),
                },
            ),
            ProbeCommand::P2p(a) => ProbeRequest::P2p(
                a.run.options(self),
                p2p::Request {
                    common: Common {
                        cpus: a.cpu.map(|c| c.to_string()),
                        sizes: a.size.clone().map(|s| vec![s]),
                        ..counts(a.warmup, a.iterations, a.repeats)
                    },
                    devices: a.devices.clone(),
                },
            ),
            ProbeCommand::D2d(a) => ProbeRequest::D2d(
                a.run.options(self),
                d2d::Request {
                    common: Common {
                        sizes: a.sizes.clone(),
                        ..counts(a.warmup, a.iterations, a.repeats)
                    },
                    devices: a.devices.clone(),
                    loads: a.loads.clone(),
                },
            ),
            ProbeCommand::Affinity(a) => ProbeRequest::Affinity(AffinityRequest {
                layer: self.global_layer(),
                cpus: a.cpus.clone(),
                out: a.out.clone(),
                format: a.format.clone(),
            }),
            ProbeCommand::FabricRank => ProbeRequest::FabricRank,
            ProbeCommand::Fabric(a) => {
                let mut layer = self.global_layer();
                layer.runtime.cuda_runtime = a.cuda_runtime.clone();
                layer.runtime.acl_runtime = a.acl_runtime.clone();
                layer.runtime.nccl = a.nccl.clone();
                layer.runtime.hccl = a.hccl.clone();
                ProbeRequest::Fabric(Box::new(crate::commands::request::FabricRequest {
                    layer,
                    backend: a.backend.clone(),
                    device: a.device,
                    ring_algorithm: a.algorithm == "ring",
                    warmup: a.warmup,
                    iterations: a.iterations,
                    overrides: chd::fabric::launch::Overrides {
                        rank: a.rank,
                        world_size: a.world_size,
                        local_rank: a.local_rank,
                        rendezvous: a.rendezvous.clone(),
                        port: a.port,
                    },
                    node: a.node.clone(),
                    token_file: a.token_file.clone(),
                    rails: a.rails.clone(),
                    bytes: a.bytes.clone(),
                    streams: a.streams,
                    bind: a.bind.clone(),
                    collectives: a.collectives.clone(),
                    collective_sizes: a.collective_sizes.clone(),
                    timeout: std::time::Duration::from_secs(a.timeout),
                    transfer_timeout: std::time::Duration::from_secs(a.transfer_timeout),
                    state_dir: a.state_dir.clone(),
                    out: a.out.clone(),
                    json: a.format == "json",
                }))
            }
        }
    }

    /// A subcommand's runtime flags over the global ones, as a configuration layer.
    pub fn runtime_layer(&self, runtime: &RuntimeArgs) -> Layer {
        let mut l = self.global_layer();
        runtime.apply(&mut l);
        l
    }

    /// `chd serve`'s flags as a configuration layer (only what was given).
    pub fn serve_layer(&self, serve: Option<&ServeArgs>) -> Layer {
        let mut l = self.global_layer();
        if let Some(a) = serve {
            a.runtime.apply(&mut l);
            l.collectors = a.collectors.layer.clone();
            l.schedule.device_busy_threshold = a.device_busy_threshold;
            l.server.listen = a.listen.clone();
            l.server.replay = a.replay.clone();
            l.server.max_connections = a.max_connections;
            l.server.header_timeout = a.header_timeout.clone();
            l.server.web_config_file = a.web_config_file.clone();
            l.paths.state_dir = a.state_dir.clone();
            l.paths.nfd_features_file = a.nfd_features_file.clone();
            l.schedule.verdict_confirm_windows = a.verdict_confirm_windows;
            l.schedule.verdict_clear_windows = a.verdict_clear_windows;
            l.schedule.interval = a.interval.clone();
            l.schedule.window_budget = a.window_budget.clone();
            l.schedule.cpu_busy_threshold = a.cpu_busy_threshold;
            l.schedule.enabled = a.no_probe.then_some(false);
            l.probe.sizes_mib = a.sizes.clone();
            l.probe.directions = a.directions.clone();
            l.probe.warmup = a.warmup;
            l.probe.iterations = a.iterations;
            l.probe.cpus = a.cpus.clone();
            l.probe.samples_per_cell = a.samples;
            l.probe.stale_after = a.stale_after.clone();
            l.exposition.cells = a.cells.as_deref().map(RawCells::from);
            l.exposition.pair_cells = a.pair_cells;
            l.exposition.cpu_series = a.cpu_series.clone();
            l.probe.pairs = (!a.pairs.is_empty()).then(|| a.pairs.clone());
            l.probe.pair_size_mib = a.pair_size;
            l.probe.pair_timeout = a.pair_timeout.clone();
            l.probe.cell_timeout = a.cell_timeout.clone();
            l.probe.d2d_size_mib = a.d2d_size;
            l.probe.p2p_size_mib = a.p2p_size;
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The long help of `chd <path...>`, unwrapped.
    fn long_help(path: &[&str]) -> String {
        let mut cmd = Cli::command();
        let mut sub = &mut cmd;
        for name in path {
            sub = sub.find_subcommand_mut(name).expect(name);
        }
        sub.clone()
            .term_width(10_000)
            .render_long_help()
            .to_string()
    }

    /// A default as `serve --help` writes it: strings bare, lists comma-joined or `none`.
    fn as_help(value: &toml::Value) -> Vec<String> {
        match value {
            toml::Value::String(s) => vec![s.clone()],
            toml::Value::Array(items) if items.is_empty() => vec!["none".into()],
            toml::Value::Array(items) => {
                vec![items.iter().flat_map(as_help).collect::<Vec<_>>().join(",")]
            }
            toml::Value::Boolean(on) => vec![on.to_string(), if *on { "on" } else { "off" }.into()],
            other => vec![other.to_string()],
        }
    }

    #[test]
    fn serve_help_states_the_real_defaults() {
        let help = long_help(&["serve"]);
        let defaults = toml::Value::try_from(Layer::defaults()).unwrap();
        let stated = regex::Regex::new(r"\[([a-z_]+)\.([a-z_]+)\] \(default ([^),;]+)").unwrap();
        let mut checked = 0;
        for m in stated.captures_iter(&help) {
            let (section, key, text) = (&m[1], &m[2], m[3].trim());
            let value = defaults
                .get(section)
                .and_then(|s| s.get(key))
                .unwrap_or_else(|| panic!("[{section}.{key}] states a default it does not have"));
            assert!(
                as_help(value).iter().any(|v| v == text),
                "[{section}.{key}]: help says {text:?}, the default is {value}"
            );
            checked += 1;
        }
        assert!(checked >= 25, "only {checked} defaults found in:\n{help}");
    }

    #[test]
    fn probe_help_states_its_measurement_defaults_and_why_serve_differs() {
        use chd::probe::plan::{DEFAULT_ITERATIONS, DEFAULT_REPEATS, DEFAULT_WARMUP};
        for kind in ["h2d", "pair", "p2p"] {
            let help = long_help(&["probe", kind]);
            for stated in [
                format!("before each sample [default: {DEFAULT_WARMUP}]. More than chd serve's"),
                format!("per sample [default: {DEFAULT_ITERATIONS}] (chd serve: 4"),
                format!("their median [default: {DEFAULT_REPEATS}]. Fewer than chd"),
            ] {
                assert!(
                    help.contains(&stated),
                    "probe {kind}: {stated:?} not in\n{help}"
                );
            }
        }
        let serve = Layer::defaults().probe;
        assert_eq!(
            (serve.warmup, serve.iterations, serve.samples_per_cell),
            (Some(1), Some(4), Some(5)),
            "the probe help quotes serve's 1 + 4 and 5"
        );
    }

    /// `chd ARGS...` parsed and checked as `main` does, or clap's error kind.
    fn parse(args: &[&str]) -> Result<Cli, clap::error::ErrorKind> {
        let cli = Cli::try_parse_from(std::iter::once("chd").chain(args.iter().copied()))
            .map_err(|e| e.kind())?;
        cli.check_usage().map_err(|e| e.kind())?;
        Ok(cli)
    }

    #[test]
    fn the_tls_and_auth_flags_go_with_url_and_a_certificate_with_its_key() {
        use clap::error::ErrorKind;
        let tls = [
            "--ca-file",
            "ca.pem",
            "--cert-file",
            "c.pem",
            "--key-file",
            "k.pem",
            "--user",
            "alice",
            "--password-file",
            "pw",
        ];
        for verb in ["advise", "check", "ledger"] {
            let mut args = vec![verb, "--url", "https://node"];
            args.extend(tls);
            assert!(parse(&args).is_ok(), "{args:?}");
            for (extra, what) in [
                (
                    &["--cert-file", "c.pem"][..],
                    "a certificate without its key",
                ),
                (
                    &["--key-file", "k.pem"][..],
                    "a key without its certificate",
                ),
                (
                    &["--password-file", "pw"][..],
                    "a password file without --user",
                ),
            ] {
                let mut args = vec![verb, "--url", "https://node"];
                args.extend(extra);
                assert_eq!(
                    parse(&args).err(),
                    Some(ErrorKind::MissingRequiredArgument),
                    "{verb}: {what}"
                );
            }
            // Without --url, alone or beside a local source that conflicts with it.
            for local in [&[][..], &["--replay", "r.json"][..]] {
                for flag in ["--ca-file", "--user"] {
                    let mut args = vec![verb];
                    args.extend(local);
                    args.extend([flag, "x"]);
                    assert_eq!(
                        parse(&args).err(),
                        Some(ErrorKind::MissingRequiredArgument),
                        "{args:?}"
                    );
                }
            }
        }
        // chd ledger --url fetches a document: nothing to build it from, no host to record.
        for other in [
            &["--replay", "r.json"][..],
            &["--host", "n"],
            &["--merge", "a.json"],
        ] {
            let mut args = vec!["ledger", "--url", "http://node"];
            args.extend(other);
            assert_eq!(
                parse(&args).err(),
                Some(ErrorKind::ArgumentConflict),
                "{args:?}"
            );
        }
        let Ok(Cli {
            command: Command::Ledger(ledger),
            ..
        }) = parse(&["ledger", "--url", "http://node", "--out", "l.json"])
        else {
            panic!("ledger --url --out parses");
        };
        assert_eq!(ledger.remote().unwrap().url, "http://node");
    }

    #[test]
    fn the_url_help_names_the_password_variable_and_the_default_roots() {
        for verb in ["advise", "check", "ledger"] {
            let help = long_help(&[verb]);
            for stated in [
                crate::commands::fetch::PASSWORD_ENV,
                "https://HOST[:PORT]",
                "webpki-roots",
                "--password-file <FILE>",
            ] {
                assert!(help.contains(stated), "{verb}: {stated:?} not in\n{help}");
            }
            assert!(!help.contains("plain HTTP"), "{verb}: {help}");
        }
    }
}
