//! Test support: writes a machine's CPU/NUMA sysfs tree and `proc/self/status` into a
//! directory, with the kernel's exact file names and text formats (lists end in `"\n"`,
//! masks are `%*pb` hex words, `nodeN/meminfo` uses `Node N Label:   value kB`).
//!
//! Layout under the root: `sys/devices/system/{cpu,node}/...` and `proc/self/status`, so
//! `Roots { sysfs: root/sys, procfs: root/proc }` reads it. The committed fixtures under
//! `tests/fixtures/topology/` are this builder's output (a test checks they have not
//! drifted); the 640-CPU A3 tree is only ever built at test time.
//!
//! [`NodeDevices`] adds what the scrape-time collectors read on top of that tree: PCI
//! functions (accelerators, RoCE HCAs with their ports and netdevs) in the layout of
//! `tests/fixtures/collectors/README.md`, `proc/net/dev` and each NUMA node's `numastat`.

// Each test crate that includes this file uses a different subset of it.
#![allow(dead_code)]

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use chd::topology::cpulist;

/// `MAX_NUMNODES` of a distribution kernel (`CONFIG_NODES_SHIFT=10`): width of `Mems_allowed`.
const MAX_NUMNODES: u32 = 1024;

/// A machine to write. CPUs listed are the *present* ones.
#[derive(Debug, Clone)]
pub struct Machine {
    pub cpus: Vec<CpuSpec>,
    /// `None`: kernel without NUMA support, no `devices/system/node`.
    pub numa: Option<Numa>,
    /// `cpu/possible` size (`nr_cpu_ids`); at least every present CPU.
    pub possible: u32,
    /// `Cpus_allowed_list` of `proc/self/status`; `None`: no procfs tree at all.
    pub allowed: Option<Vec<u32>>,
}

#[derive(Debug, Clone)]
pub struct Numa {
    pub nodes: Vec<NodeSpec>,
    /// Whether `node/has_memory` is written (old kernels lack it).
    pub has_memory_file: bool,
}

#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub id: u32,
    /// `nodeN/cpulist`. On x86 an offlined CPU leaves its node's list.
    pub cpus: Vec<u32>,
    /// `MemTotal` in kB; 0 for a CPU-only node.
    pub mem_total_kb: u64,
}

#[derive(Debug, Clone)]
pub struct CpuSpec {
    pub id: u32,
    pub online: bool,
    /// `None`: no `cpuN/topology/` directory (offline CPUs, broken firmware).
    pub topology: Option<CpuTopology>,
}

/// Raw texts of `cpuN/topology/*`, without the trailing newline, so a test can write `N/A`.
#[derive(Debug, Clone)]
pub struct CpuTopology {
    pub physical_package_id: String,
    pub core_id: String,
    pub die_id: String,
    pub thread_siblings: Vec<u32>,
    /// All CPUs of the package (`core_siblings_list`, `package_cpus_list`).
    pub package_cpus: Vec<u32>,
    /// Replaces the text of `thread_siblings_list` (garbage cases); `None`: from the list.
    pub thread_siblings_list_text: Option<String>,
}

/// How SMT siblings are numbered on a [`grid`] machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Smt {
    /// No SMT: every CPU is its own core.
    None,
    /// Threads of a core are adjacent ids (`2k`, `2k+1`), as arm64 enumerates them.
    Adjacent,
    /// All first threads first, then all second threads (sibling of `c` is `c + n/2`), as
    /// x86 enumerates them.
    FirstThreadsFirst,
}

/// A regular machine: `sockets` packages of `nodes_per_socket` NUMA nodes with
/// `cpus_per_node` logical CPUs each, all online and allowed, `mem_per_node_kb` per node.
pub fn grid(
    sockets: u32,
    nodes_per_socket: u32,
    cpus_per_node: u32,
    smt: Smt,
    mem_per_node_kb: u64,
) -> Machine {
    let nodes_n = sockets * nodes_per_socket;
    let total = nodes_n * cpus_per_node;
    let threads = if smt == Smt::None { 1 } else { 2 };
    assert_eq!(
        cpus_per_node % threads,
        0,
        "odd CPU count per node with SMT"
    );
    let cores_total = total / threads;
    let cores_per_node = cpus_per_node / threads;
    let cores_per_socket = cores_per_node * nodes_per_socket;

    // Physical core index (0..cores_total, numbered node by node) and thread of each CPU.
    let place = |c: u32| -> (u32, u32) {
        match smt {
            Smt::None => (c, 0),
            Smt::Adjacent => (c / 2, c % 2),
            Smt::FirstThreadsFirst => (c % cores_total, c / cores_total),
        }
    };
    let cpu_of = |core: u32, thread: u32| -> u32 {
        match smt {
            Smt::None => core,
            Smt::Adjacent => core * 2 + thread,
            Smt::FirstThreadsFirst => thread * cores_total + core,
        }
    };
    let cpus_of_cores = |cores: std::ops::Range<u32>| -> Vec<u32> {
        let mut v: Vec<u32> = cores
            .flat_map(|p| (0..threads).map(move |t| cpu_of(p, t)))
            .collect();
        v.sort_unstable();
        v
    };

    let cpus = (0..total)
        .map(|c| {
            let (core, _) = place(c);
            let node = core / cores_per_node;
            let package = node / nodes_per_socket;
            let first = package * cores_per_socket;
            CpuSpec {
                id: c,
                online: true,
                topology: Some(CpuTopology {
                    physical_package_id: package.to_string(),
                    core_id: (core - first).to_string(),
                    die_id: "0".to_string(),
                    thread_siblings: cpus_of_cores(core..core + 1),
                    package_cpus: cpus_of_cores(first..first + cores_per_socket),
                    thread_siblings_list_text: None,
                }),
            }
        })
        .collect();
    let nodes = (0..nodes_n)
        .map(|n| NodeSpec {
            id: n,
            cpus: cpus_of_cores(n * cores_per_node..(n + 1) * cores_per_node),
            mem_total_kb: mem_per_node_kb,
        })
        .collect();
    Machine {
        cpus,
        numa: Some(Numa {
            nodes,
            has_memory_file: true,
        }),
        possible: total,
        allowed: Some((0..total).collect()),
    }
}

/// The seed's A3 host: 2 sockets x 4 NUMA nodes x 80 CPUs = 640, node `n` holding CPUs
/// `80n..80n+80` (socket 0: 0-319, socket 1: 320-639), SMT2 with adjacent siblings, all
/// online and allowed, ~192 GiB per node.
pub fn a3() -> Machine {
    grid(2, 4, 80, Smt::Adjacent, 201_326_592)
}

/// A 640-CPU x86 host of the same size numbered "all first threads first": node `n` holds
/// cores `40n..40n+40` and their siblings `+320` (node 0: `0-39,320-359`).
pub fn x86_640() -> Machine {
    grid(2, 4, 80, Smt::FirstThreadsFirst, 201_326_592)
}

/// 8 CPUs, 2 sockets = 2 NUMA nodes, SMT siblings `c`/`c+4`, CPUs 6 and 7 hot-unplugged
/// (they leave their node's cpulist and lose `topology/`), process restricted to cpuset 1-3.
pub fn two_node_offline() -> Machine {
    let mut m = grid(2, 1, 4, Smt::FirstThreadsFirst, 65_842_120);
    if let Some(numa) = &mut m.numa {
        numa.nodes[1].mem_total_kb = 66_055_552;
    }
    for id in [6, 7] {
        offline(&mut m, id);
    }
    m.allowed = Some(vec![1, 2, 3]);
    m
}

/// 4 CPUs, 1 socket, no SMT, kernel built without NUMA, no procfs (affinity unknown).
pub fn no_numa() -> Machine {
    let mut m = grid(1, 1, 4, Smt::None, 0);
    m.numa = None;
    m.allowed = None;
    m
}

/// 4 CPUs on one node with firmware-garbage per-CPU files: cpu1 `core_id` reads `N/A`,
/// cpu2 has no `topology/` directory, cpu3 `physical_package_id` is `-1` and its
/// `thread_siblings_list` is garbage; `node/has_memory` is missing (old kernel).
pub fn garbage() -> Machine {
    let mut m = grid(1, 1, 4, Smt::None, 16_338_432);
    if let Some(t) = &mut m.cpus[1].topology {
        t.core_id = "N/A".into();
    }
    m.cpus[2].topology = None;
    if let Some(t) = &mut m.cpus[3].topology {
        t.physical_package_id = "-1".into();
        t.thread_siblings_list_text = Some("3,?".into());
    }
    if let Some(numa) = &mut m.numa {
        numa.has_memory_file = false;
    }
    m
}

/// Take CPU `id` offline the way x86 hotplug does: it loses `topology/`, and leaves its
/// siblings' and package mates' masks and its node's cpulist.
pub fn offline(m: &mut Machine, id: u32) {
    for cpu in &mut m.cpus {
        if cpu.id == id {
            cpu.online = false;
            cpu.topology = None;
        } else if let Some(t) = &mut cpu.topology {
            t.thread_siblings.retain(|&c| c != id);
            t.package_cpus.retain(|&c| c != id);
        }
    }
    if let Some(numa) = &mut m.numa {
        for node in &mut numa.nodes {
            node.cpus.retain(|&c| c != id);
        }
    }
}

impl Machine {
    /// Write the tree under `root` (created if needed); returns `(root/sys, root/proc)`.
    pub fn write(&self, root: &Path) -> io::Result<(PathBuf, PathBuf)> {
        let sys = root.join("sys");
        let proc = root.join("proc");
        let cpu_dir = sys.join("devices/system/cpu");
        fs::create_dir_all(&cpu_dir)?;

        let present: Vec<u32> = self.cpus.iter().map(|c| c.id).collect();
        let online: Vec<u32> = self
            .cpus
            .iter()
            .filter(|c| c.online)
            .map(|c| c.id)
            .collect();
        let possible: Vec<u32> = (0..self.possible).collect();
        let offline: Vec<u32> = possible
            .iter()
            .copied()
            .filter(|c| !online.contains(c))
            .collect();
        let nbits = self.possible;

        put(&cpu_dir.join("online"), &list(&online))?;
        put(&cpu_dir.join("present"), &list(&present))?;
        put(&cpu_dir.join("possible"), &list(&possible))?;
        put(&cpu_dir.join("offline"), &list(&offline))?;
        put(&cpu_dir.join("isolated"), "\n")?;
        put(&cpu_dir.join("kernel_max"), "8191\n")?;

        for cpu in &self.cpus {
            let dir = cpu_dir.join(format!("cpu{}", cpu.id));
            fs::create_dir_all(&dir)?;
            if cpu.id != 0 {
                // x86 cannot unplug the boot CPU, so cpu0 has no `online` file.
                put(&dir.join("online"), if cpu.online { "1\n" } else { "0\n" })?;
            }
            let Some(t) = &cpu.topology else { continue };
            let topo = dir.join("topology");
            fs::create_dir_all(&topo)?;
            put(
                &topo.join("physical_package_id"),
                &format!("{}\n", t.physical_package_id),
            )?;
            put(&topo.join("core_id"), &format!("{}\n", t.core_id))?;
            put(&topo.join("die_id"), &format!("{}\n", t.die_id))?;
            for (name, cpus) in [
                ("thread_siblings", &t.thread_siblings),
                ("core_cpus", &t.thread_siblings),
                ("core_siblings", &t.package_cpus),
                ("package_cpus", &t.package_cpus),
                ("die_cpus", &t.package_cpus),
            ] {
                put(&topo.join(name), &mask(cpus, nbits))?;
                put(&topo.join(format!("{name}_list")), &list(cpus))?;
            }
            if let Some(text) = &t.thread_siblings_list_text {
                put(&topo.join("thread_siblings_list"), &format!("{text}\n"))?;
            }
        }

        if let Some(numa) = &self.numa {
            let node_dir = sys.join("devices/system/node");
            fs::create_dir_all(&node_dir)?;
            let ids: Vec<u32> = numa.nodes.iter().map(|n| n.id).collect();
            let with_cpus: Vec<u32> = numa
                .nodes
                .iter()
                .filter(|n| !n.cpus.is_empty())
                .map(|n| n.id)
                .collect();
            let with_memory: Vec<u32> = numa
                .nodes
                .iter()
                .filter(|n| n.mem_total_kb > 0)
                .map(|n| n.id)
                .collect();
            put(&node_dir.join("online"), &list(&ids))?;
            put(&node_dir.join("possible"), &list(&ids))?;
            put(&node_dir.join("has_cpu"), &list(&with_cpus))?;
            if numa.has_memory_file {
                put(&node_dir.join("has_memory"), &list(&with_memory))?;
                put(&node_dir.join("has_normal_memory"), &list(&with_memory))?;
            }
            for node in &numa.nodes {
                let dir = node_dir.join(format!("node{}", node.id));
                fs::create_dir_all(&dir)?;
                put(&dir.join("cpulist"), &list(&node.cpus))?;
                put(&dir.join("cpumap"), &mask(&node.cpus, nbits))?;
                put(&dir.join("meminfo"), &meminfo(node.id, node.mem_total_kb))?;
                let distance: Vec<String> = numa
                    .nodes
                    .iter()
                    .map(|o| if o.id == node.id { "10" } else { "21" }.to_string())
                    .collect();
                put(&dir.join("distance"), &format!("{}\n", distance.join(" ")))?;
            }
        }

        if let Some(allowed) = &self.allowed {
            let mems: Vec<u32> = match &self.numa {
                Some(numa) => numa
                    .nodes
                    .iter()
                    .filter(|n| n.mem_total_kb > 0)
                    .map(|n| n.id)
                    .collect(),
                None => vec![0],
            };
            let self_dir = proc.join("self");
            fs::create_dir_all(&self_dir)?;
            put(&self_dir.join("status"), &status(allowed, nbits, &mems))?;
        }
        Ok((sys, proc))
    }
}

fn put(path: &Path, text: &str) -> io::Result<()> {
    fs::write(path, text)
}

/// A kernel cpulist/nodelist file (`%*pbl`): compact ranges, newline.
fn list(ids: &[u32]) -> String {
    format!("{}\n", cpulist::format(ids))
}

/// A kernel bitmap file (`%*pb`) of `nbits` bits: 32-bit hex words, most significant first,
/// comma separated, the first word only as wide as its bits need; newline.
fn mask(ids: &[u32], nbits: u32) -> String {
    format!("{}\n", mask_text(ids, nbits))
}

fn mask_text(ids: &[u32], nbits: u32) -> String {
    let words = nbits.div_ceil(32).max(1);
    let mut bits = vec![0u32; words as usize];
    for &id in ids {
        bits[(id / 32) as usize] |= 1 << (id % 32);
    }
    let top_bits = match nbits % 32 {
        0 => 32,
        r => r,
    };
    let top_width = top_bits.div_ceil(4) as usize;
    let mut parts = Vec::with_capacity(words as usize);
    for (i, w) in bits.iter().enumerate().rev() {
        if i + 1 == words as usize {
            parts.push(format!("{w:0top_width$x}"));
        } else {
            parts.push(format!("{w:08x}"));
        }
    }
    parts.join(",")
}

/// `nodeN/meminfo` as `node_read_meminfo()` prints it.
fn meminfo(id: u32, total_kb: u64) -> String {
    let free = total_kb / 10 * 9;
    let used = total_kb - free;
    let file = used / 2;
    let anon = used / 4;
    let slab = used / 16;
    let rows: [(&str, u64); 33] = [
        ("MemTotal:", total_kb),
        ("MemFree:", free),
        ("MemUsed:", used),
        ("SwapCached:", 0),
        ("Active:", file / 2 + anon / 8),
        ("Inactive:", file / 2 + anon - anon / 8),
        ("Active(anon):", anon / 8),
        ("Inactive(anon):", anon - anon / 8),
        ("Active(file):", file / 2),
        ("Inactive(file):", file - file / 2),
        ("Unevictable:", 0),
        ("Mlocked:", 0),
        ("Dirty:", 0),
        ("Writeback:", 0),
        ("FilePages:", file),
        ("Mapped:", file / 8),
        ("AnonPages:", anon),
        ("Shmem:", 0),
        ("KernelStack:", used / 256),
        ("PageTables:", used / 128),
        ("SecPageTables:", 0),
        ("NFS_Unstable:", 0),
        ("Bounce:", 0),
        ("WritebackTmp:", 0),
        ("KReclaimable:", slab / 2),
        ("Slab:", slab),
        ("SReclaimable:", slab / 2),
        ("SUnreclaim:", slab - slab / 2),
        ("AnonHugePages:", 0),
        ("ShmemHugePages:", 0),
        ("ShmemPmdMapped:", 0),
        ("FileHugePages:", 0),
        ("FilePmdMapped:", 0),
    ];
    let mut out = String::new();
    for (label, kb) in rows {
        out.push_str(&format!("Node {id} {label:<16}{kb:>8} kB\n"));
    }
    for label in ["HugePages_Total:", "HugePages_Free:", "HugePages_Surp:"] {
        out.push_str(&format!("Node {id} {label:<16} {:>5}\n", 0));
    }
    out
}

/// `/proc/self/status` of a process named `chd` (6.x kernel layout).
fn status(allowed: &[u32], nbits: u32, mems: &[u32]) -> String {
    format!(
        "Name:\tchd
Umask:\t0022
State:\tR (running)
Tgid:\t4711
Ngid:\t0
Pid:\t4711
PPid:\t1
TracerPid:\t0
Uid:\t0\t0\t0\t0
Gid:\t0\t0\t0\t0
FDSize:\t64
Groups:\t
NStgid:\t4711
NSpid:\t4711
NSpgid:\t4711
NSsid:\t4711
Kthread:\t0
VmPeak:\t  120396 kB
VmSize:\t  120396 kB
VmLck:\t       0 kB
VmPin:\t       0 kB
VmHWM:\t   10240 kB
VmRSS:\t   10240 kB
RssAnon:\t    4096 kB
RssFile:\t    6144 kB
RssShmem:\t       0 kB
VmData:\t   33024 kB
VmStk:\t     132 kB
VmExe:\t    8192 kB
VmLib:\t    2412 kB
VmPTE:\t      92 kB
VmSwap:\t       0 kB
HugetlbPages:\t       0 kB
CoreDumping:\t0
THP_enabled:\t1
untag_mask:\t0xffffffffffffffff
Threads:\t5
SigQ:\t0/1030564
SigPnd:\t0000000000000000
ShdPnd:\t0000000000000000
SigBlk:\t0000000000000000
SigIgn:\t0000000000001000
SigCgt:\t0000000100004440
CapInh:\t0000000000000000
CapPrm:\t000001ffffffffff
CapEff:\t000001ffffffffff
CapBnd:\t000001ffffffffff
CapAmb:\t0000000000000000
NoNewPrivs:\t0
Seccomp:\t0
Seccomp_filters:\t0
Speculation_Store_Bypass:\tthread vulnerable
SpeculationIndirectBranch:\tconditional enabled
Cpus_allowed:\t{}
Cpus_allowed_list:\t{}
Mems_allowed:\t{}
Mems_allowed_list:\t{}
voluntary_ctxt_switches:\t12
nonvoluntary_ctxt_switches:\t3
",
        mask_text(allowed, nbits),
        cpulist::format(allowed),
        mask_text(mems, MAX_NUMNODES),
        cpulist::format(mems),
    )
}

/// A PCI function: its address as sysfs names it (`0000:1a:00.0`) and its `numa_node`.
#[derive(Debug, Clone)]
pub struct PciFunction {
    pub bdf: String,
    pub numa_node: u32,
}

/// A single-port RoCE HCA (mlx5 on Ethernet) and the netdev of its port.
#[derive(Debug, Clone)]
pub struct RoceHca {
    /// `mlx5_0`.
    pub name: String,
    pub function: PciFunction,
    /// `eth0`.
    pub netdev: String,
}

/// A node's accelerators and RoCE HCAs, each function under a root port of its NUMA node's
/// root complex.
#[derive(Debug, Clone)]
pub struct NodeDevices {
    pub accelerators: Vec<PciFunction>,
    pub hcas: Vec<RoceHca>,
}

/// IB PortCounters of `ports/N/counters/` as 6.x kernels expose them for an mlx5 port.
const PORT_COUNTERS: [&str; 21] = [
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
];

/// mlx5's `ports/N/hw_counters/` for RoCE (besides `lifespan`).
const MLX5_ROCE_HW_COUNTERS: [&str; 30] = [
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "req_rnr_retries_exceeded",
    "req_transport_retries_exceeded",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
];

/// Rows of `aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal` (6.x), then the total.
const AER_CORRECTABLE: [&str; 8] = [
    "RxErr",
    "BadTLP",
    "BadDLLP",
    "Rollover",
    "Timeout",
    "NonFatalErr",
    "CorrIntErr",
    "HeaderOF",
];
const AER_UNCORRECTABLE: [&str; 18] = [
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
];

/// The seed's A3 node's devices: on each of its 8 NUMA nodes two accelerators and one
/// 200 GbE RoCE rail (`mlx5_N`, netdev `ethN`), 24 PCI functions in all. NUMA node `n`'s
/// root complex is bus `0x10 + 0x20 n`; its accelerators sit on buses `+2` and `+4`, its
/// HCA on `+6` (accelerator `d` is on node `d / 2`).
pub fn a3_devices() -> NodeDevices {
    let function = |n: u32, offset: u32| PciFunction {
        bdf: format!("0000:{:02x}:00.0", 0x10 + 0x20 * n + offset),
        numa_node: n,
    };
    NodeDevices {
        accelerators: (0..8)
            .flat_map(|n| [function(n, 2), function(n, 4)])
            .collect(),
        hcas: (0..8)
            .map(|n| RoceHca {
                name: format!("mlx5_{n}"),
                function: function(n, 6),
                netdev: format!("eth{n}"),
            })
            .collect(),
    }
}

impl NodeDevices {
    /// Write the PCI functions, RDMA devices, netdevs, `proc/net/dev` (with `lo`) and a
    /// `numastat` for each of `machine`'s NUMA nodes under `root`, next to what
    /// [`Machine::write`] wrote there.
    pub fn write(&self, root: &Path, machine: &Machine) -> io::Result<()> {
        let sys = root.join("sys");
        for f in &self.accelerators {
            self.function_dir(&sys, f)?;
        }
        for (i, hca) in self.hcas.iter().enumerate() {
            let dir = self.function_dir(&sys, &hca.function)?;
            let net = dir.join("net").join(&hca.netdev);
            fs::create_dir_all(&net)?;
            put(&net.join("dev_port"), "0\n")?;
            put(&net.join("dev_id"), "0x0\n")?;
            put(&net.join("mtu"), "9000\n")?;
            let ib = dir.join("infiniband").join(&hca.name);
            let port = ib.join("ports/1");
            fs::create_dir_all(port.join("counters"))?;
            fs::create_dir_all(port.join("hw_counters"))?;
            symlink(format!("../../../{}", hca.function.bdf), ib.join("device"))?;
            put(&ib.join("node_type"), "1: CA\n")?;
            put(&port.join("state"), "4: ACTIVE\n")?;
            put(&port.join("phys_state"), "5: LinkUp\n")?;
            put(&port.join("rate"), "200 Gb/sec (4X HDR)\n")?;
            put(&port.join("link_layer"), "Ethernet\n")?;
            for (k, name) in PORT_COUNTERS.iter().enumerate() {
                let v = (i as u64 + 1) * 1_000_003 * k as u64;
                put(&port.join("counters").join(name), &format!("{v}\n"))?;
            }
            for (k, name) in MLX5_ROCE_HW_COUNTERS.iter().enumerate() {
                put(
                    &port.join("hw_counters").join(name),
                    &format!("{}\n", k % 3),
                )?;
            }
            put(&port.join("hw_counters/lifespan"), "12\n")?;
            let rel = |to: &Path| Path::new("../..").join(to.strip_prefix(&sys).unwrap());
            fs::create_dir_all(sys.join("class/net"))?;
            fs::create_dir_all(sys.join("class/infiniband"))?;
            symlink(rel(&net), sys.join("class/net").join(&hca.netdev))?;
            symlink(rel(&ib), sys.join("class/infiniband").join(&hca.name))?;
        }
        let mut dev = String::from(
            "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n",
        );
        let mut row = |name: &str, bytes: u64, packets: u64| {
            dev.push_str(&format!(
                "{name:>6}: {bytes:>8} {packets:>8}    0    0    0     0          0         0 {bytes:>8} {packets:>8}    0    0    0     0       0          0\n"
            ));
        };
        row("lo", 8_675_309, 12_345);
        for (i, hca) in self.hcas.iter().enumerate() {
            row(&hca.netdev, 24_691_357_800 * (i as u64 + 1), 493_827_160);
        }
        let proc_net = root.join("proc/net");
        fs::create_dir_all(&proc_net)?;
        put(&proc_net.join("dev"), &dev)?;
        for node in machine.numa.iter().flat_map(|n| &n.nodes) {
            let dir = sys.join(format!("devices/system/node/node{}", node.id));
            let id = u64::from(node.id);
            let rows = [
                ("numa_hit", (id + 1) * 1_000_003),
                ("numa_miss", 17 * id),
                ("numa_foreign", 19 * id),
                ("interleave_hit", 3047),
                ("local_node", (id + 1) * 1_000_003 - 23 * id),
                ("other_node", 23 * id),
            ];
            let text: String = rows.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
            put(&dir.join("numastat"), &text)?;
        }
        Ok(())
    }

    /// `sys/devices/pci0000:RC/0000:RC:0P.0/BDF/` with its link, AER and `numa_node` files,
    /// and its `sys/bus/pci/devices` link; returns the function's directory.
    fn function_dir(&self, sys: &Path, f: &PciFunction) -> io::Result<PathBuf> {
        let bus = u32::from_str_radix(&f.bdf[5..7], 16).expect("hex bus");
        let rc = 0x10 + 0x20 * f.numa_node;
        let port = format!("0000:{rc:02x}:{:02x}.0", bus - rc);
        let rel = format!("devices/pci0000:{rc:02x}/{port}/{}", f.bdf);
        let dir = sys.join(&rel);
        fs::create_dir_all(&dir)?;
        put(&dir.join("numa_node"), &format!("{}\n", f.numa_node))?;
        for (name, text) in [
            ("current_link_width", "16\n"),
            ("max_link_width", "16\n"),
            ("current_link_speed", "32.0 GT/s PCIe\n"),
            ("max_link_speed", "32.0 GT/s PCIe\n"),
        ] {
            put(&dir.join(name), text)?;
        }
        for (file, rows, total) in [
            ("aer_dev_correctable", &AER_CORRECTABLE[..], "TOTAL_ERR_COR"),
            (
                "aer_dev_nonfatal",
                &AER_UNCORRECTABLE[..],
                "TOTAL_ERR_NONFATAL",
            ),
            ("aer_dev_fatal", &AER_UNCORRECTABLE[..], "TOTAL_ERR_FATAL"),
        ] {
            let mut text: String = rows.iter().map(|r| format!("{r} 0\n")).collect();
            text.push_str(&format!("{total} 0\n"));
            put(&dir.join(file), &text)?;
        }
        let bus_dir = sys.join("bus/pci/devices");
        fs::create_dir_all(&bus_dir)?;
        symlink(Path::new("../../..").join(&rel), bus_dir.join(&f.bdf))?;
        Ok(dir)
    }
}

/// Every regular file under `root` as `(relative path, contents)`, sorted by path.
pub fn snapshot(root: &Path) -> io::Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push((rel.to_path_buf(), fs::read_to_string(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_match_kernel_bitmap_print() {
        // 2 possible CPUs: "3" (one hex digit), as on a 2-vCPU VM.
        assert_eq!(mask_text(&[0, 1], 2), "3");
        assert_eq!(mask_text(&[1, 2, 3], 8), "0e");
        assert_eq!(mask_text(&[0], 64), "00000000,00000001");
        assert_eq!(mask_text(&[0, 639], 640).split(',').count(), 20);
        assert!(mask_text(&[0], 1024).starts_with("00000000,"));
    }
}
