//! A real one-node Slurm cluster in a scratch directory, for `chd check --slurm`: Debian's
//! munged (its own key, socket and logs in the directory), slurmctld and slurmd (their own
//! ports, `SlurmUser=root`, `proctrack/linuxproc`, state and spool in the directory) and a
//! `HealthCheckProgram` the test rewrites per case. Besides the real node, `ghost[1-4]` are
//! configured but never start, so the partition has nodes a test can drain without a daemon:
//! their slurmd port is a [`GhostPort`] that closes every connection it accepts. (With no
//! listener at all, slurmctld retries a refused connect once a second for `MessageTimeout`,
//! 10 s, in every ping cycle, and sends no health check while a ping cycle runs: the checks
//! came ~12 s apart whatever `HealthCheckInterval` said.) Every process started is stopped by its pid when the
//! cluster is dropped, a failed test included. A missing daemon or tool fails the test with
//! what to install (scripts/test.sh installs them).
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const INSTALL: &str = "apt-get install slurmctld slurmd slurm-client munge (scripts/test.sh does)";

/// The real node's Slurm name: not the host name, so chd must take slurmd's SLURMD_NODENAME.
pub const NODE: &str = "chdnode";
/// The configured nodes that never run.
pub const GHOSTS: [&str; 4] = ["ghost1", "ghost2", "ghost3", "ghost4"];
/// slurm.conf's HealthCheckInterval, seconds.
pub const HEALTH_CHECK_INTERVAL_S: u64 = 2;

/// `name` on PATH or in /usr/sbin, /usr/bin (where Debian puts the daemons), else a panic
/// saying what to install.
pub fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not installed; the Slurm tests need it: {INSTALL}"))
}

/// A port nothing listens on right now, below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the kernel handed out (`bind(0)`) is one it may
/// hand to the next outgoing connection of any process before slurmd binds it, which made
/// slurmd fail with "Address already in use" while other tests' streams ran.
fn free_port() -> u16 {
    let low: u16 = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let range = 10_000..low.max(10_001);
    for _ in 0..1000 {
        let port = rand::random_range(range.clone());
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {range:?} after 1000 tries");
}

/// The ghost nodes' slurmd port: a listener that accepts each connection and closes it at
/// once, so slurmctld's RPCs to a ghost fail right away (its connect succeeds, the reply never
/// comes) instead of being retried for `MessageTimeout` as a refused connect is
/// (`slurm_send_addr_recv_msgs` in Slurm 22.05's src/common/slurm_protocol_api.c). The ghosts
/// stay `unknown*` (not responding), as before. Stopped (and its thread joined) on drop.
pub struct GhostPort {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl GhostPort {
    fn start() -> GhostPort {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                drop(conn);
            }
        });
        GhostPort {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for GhostPort {
    /// Set the flag, then wake the blocked `accept` with one last connection.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One line of the health check's run log: the case that ran and chd's exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub case: String,
    pub status: i32,
    pub at: Instant,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// Started processes, in order (stopped in reverse).
    procs: Vec<(&'static str, Child)>,
    runs_seen: Vec<Run>,
    /// Dropped after the daemons (fields drop after [`Cluster`]'s own `drop`).
    ghost_port: GhostPort,
}

impl Cluster {
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Start munged, slurmctld and slurmd with `health_check` as the first health check
    /// program's script body (see [`Cluster::set_health_check`]).
    pub fn start(case: &str, chd_line: &str) -> Cluster {
        Cluster::start_nodes(case, chd_line, &[NODE])
    }

    /// [`Cluster::start`] with these nodes, each a slurmd of its own on this machine
    /// (`slurmd -N NAME`, its own port): a cluster of several nodes on one host, as Slurm's
    /// own test suite emulates one.
    pub fn start_nodes(case: &str, chd_line: &str, names: &[&str]) -> Cluster {
        // The effective uid: the second field of /proc/self/status's Uid line.
        let status = fs::read_to_string("/proc/self/status").unwrap();
        let euid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string));
        assert!(
            euid.as_deref() == Some("0"),
            "the Slurm tests run slurmd with SlurmdUser=root: run them as root (CI does)"
        );
        let (munged, mungekey) = (tool("munged"), tool("mungekey"));
        let (slurmctld, slurmd) = (tool("slurmctld"), tool("slurmd"));
        tool("scontrol");
        tool("sinfo");
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster {
            dir,
            procs: Vec::new(),
            runs_seen: Vec::new(),
            ghost_port: GhostPort::start(),
        };
        let munge = cluster.path("munge");
        for d in ["munge", "state", "spool", "log"] {
            fs::create_dir(cluster.path(d)).unwrap();
        }
        // munged wants its socket's directory searchable by all, and no one else writing
        // where its key is.
        fs::set_permissions(&munge, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(cluster.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let key = munge.join("munge.key");
        let ran = Command::new(mungekey)
            .arg("--create")
            .arg(format!("--keyfile={}", key.display()))
            .output()
            .unwrap();
        assert!(ran.status.success(), "mungekey: {ran:?}");
        let socket = munge.join("munge.socket");
        let child = Command::new(munged)
            .arg("--foreground")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", munge.join("munged.pid").display()))
            .arg(format!("--log-file={}", munge.join("munged.log").display()))
            .arg(format!(
                "--seed-file={}",
                munge.join("munged.seed").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        cluster.procs.push(("munged", child));
        cluster.wait_until("munged's socket", Duration::from_secs(30), |c| {
            if let Some(e) = c.exited() {
                panic!("{e}\n{}", c.logs());
            }
            socket.exists()
        });

        let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let host = host.trim().split('.').next().unwrap().to_string();
        let dir = cluster.dir.path().display().to_string();
        // One node: slurmd on SlurmdPort; several: each on its own.
        let node_lines: String = names
            .iter()
            .map(|n| {
                let port = if names.len() > 1 {
                    format!(" Port={}", free_port())
                } else {
                    String::new()
                };
                format!("NodeName={n} NodeAddr=127.0.0.1{port} CPUs=1 RealMemory=100\n")
            })
            .collect();
        let conf = format!(
            "# chd's tests/support/slurm_cluster.rs: a one-node cluster in a scratch directory.\n\
             ClusterName=chdtest\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             StateSaveLocation={dir}/state\n\
             SlurmdSpoolDir={dir}/spool/%n\n\
             SlurmctldPidFile={dir}/slurmctld.pid\n\
             SlurmdPidFile={dir}/slurmd-%n.pid\n\
             SlurmctldLogFile={dir}/log/slurmctld.log\n\
             SlurmdLogFile={dir}/log/slurmd.log\n\
             SlurmctldDebug=info\n\
             SlurmdDebug=info\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             SwitchType=switch/none\n\
             MpiDefault=none\n\
             SelectType=select/cons_tres\n\
             ReturnToService=2\n\
             HealthCheckProgram={dir}/health-check\n\
             HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}\n\
             HealthCheckNodeState=ANY\n\
             {node_lines}\
             NodeName=ghost[1-4] NodeAddr=127.0.0.1 Port={ghost} CPUs=1 RealMemory=100\n\
             PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            ctld = free_port(),
            slurmd = free_port(),
            ghost = cluster.ghost_port.port,
            node_lines = node_lines,
            socket = socket.display(),
        );
        fs::write(cluster.conf(), conf).unwrap();
        cluster.set_health_check(case, chd_line);

        let logs = cluster.path("log");
        let out = |name: &str| fs::File::create(logs.join(format!("{name}.out"))).unwrap();
        let child = Command::new(slurmctld)
            .args(["-D", "-f"])
            .arg(cluster.conf())
            .env("SLURM_CONF", cluster.conf())
            .stdout(out("slurmctld"))
            .stderr(out("slurmctld.err"))
            .spawn()
            .unwrap();
        cluster.procs.push(("slurmctld", child));
        cluster.wait_until("slurmctld answers", Duration::from_secs(60), |c| {
            if let Some(e) = c.exited() {
                panic!("{e}\n{}", c.logs());
            }
            c.scontrol(&["ping"]).0
        });
        for (i, name) in names.iter().enumerate() {
            let suffix = if i == 0 {
                String::new()
            } else {
                format!("-{name}")
            };
            let child = Command::new(&slurmd)
                .args(["-D", "-N", name, "-f"])
                .arg(cluster.conf())
                .env("SLURM_CONF", cluster.conf())
                .stdout(out(&format!("slurmd{suffix}")))
                .stderr(out(&format!("slurmd{suffix}.err")))
                .spawn()
                .unwrap();
            cluster.procs.push(("slurmd", child));
        }
        cluster
    }

    /// Replace the health check program (atomically: slurmd may be starting it) by a script
    /// that records its environment, runs `chd_line` (a shell command line, chd's output
    /// appended to `chd-check.log`) and logs `<case> <exit status>` to `runs`.
    pub fn set_health_check(&mut self, case: &str, chd_line: &str) {
        let dir = self.dir.path().display();
        let script = format!(
            "#!/bin/sh\n\
             # case {case}\n\
             /usr/bin/env > {dir}/health-check.env\n\
             {chd_line} >> {dir}/chd-check.log 2>&1\n\
             status=$?\n\
             echo \"{case} $status\" >> {dir}/runs\n\
             exit $status\n"
        );
        let tmp = self.path(".health-check.tmp");
        fs::write(&tmp, script).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, self.path("health-check")).unwrap();
    }

    /// Runs logged so far (`case status` lines), each stamped when this test first saw it.
    pub fn runs(&mut self) -> Vec<Run> {
        let text = fs::read_to_string(self.path("runs")).unwrap_or_default();
        for line in text.lines().skip(self.runs_seen.len()) {
            let (case, status) = line.rsplit_once(' ').expect("case status");
            self.runs_seen.push(Run {
                case: case.to_string(),
                status: status.parse().unwrap_or(-1),
                at: Instant::now(),
            });
        }
        self.runs_seen.clone()
    }

    /// Runs of `case` so far.
    pub fn runs_of(&mut self, case: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.case == case).collect()
    }

    /// The environment slurmd gave the last health check.
    pub fn health_check_env(&self) -> String {
        fs::read_to_string(self.path("health-check.env")).unwrap_or_default()
    }

    /// chd's output (stdout and log lines) of every health check so far.
    pub fn chd_log(&self) -> String {
        fs::read_to_string(self.path("chd-check.log")).unwrap_or_default()
    }

    /// `scontrol ARGS` with this cluster's config: (success, stdout + stderr).
    pub fn scontrol(&self, args: &[&str]) -> (bool, String) {
        self.client("scontrol", args)
    }

    fn client(&self, name: &str, args: &[&str]) -> (bool, String) {
        let out = Command::new(tool(name))
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// `srun ARGS` with this cluster's config and `env` added to the step's environment.
    pub fn srun(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        Command::new(tool("srun"))
            .args(args)
            .env("SLURM_CONF", self.conf())
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }

    /// `sbatch ARGS` with this cluster's config and `env` added to the job's environment
    /// (sbatch exports the submitter's environment to the job by default).
    pub fn sbatch(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        Command::new(tool("sbatch"))
            .args(args)
            .env("SLURM_CONF", self.conf())
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }

    /// `sinfo -N -o '%N %T %E'`: every node, its state and reason.
    pub fn sinfo(&self) -> String {
        let (ok, text) = self.client("sinfo", &["-N", "-o", "%N %T %E"]);
        assert!(ok, "sinfo: {text}");
        text
    }

    /// The real node's state and reason as sinfo gives them (`drained`, `chd: ...`).
    pub fn node_state(&self) -> (String, String) {
        let (ok, text) = self.client("sinfo", &["-h", "-N", "-n", NODE, "-o", "%T|%E"]);
        assert!(ok, "sinfo: {text}");
        let line = text.lines().next().unwrap_or_default();
        let (state, reason) = line.split_once('|').unwrap_or((line, ""));
        (state.to_string(), reason.to_string())
    }

    /// A daemon that has exited, if one has.
    fn exited(&mut self) -> Option<String> {
        for (name, child) in &mut self.procs {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(format!("{name} exited: {status}"));
            }
        }
        None
    }

    /// The daemons' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for name in [
            "munge/munged.log",
            "log/slurmctld.log",
            "log/slurmctld.err.out",
            "log/slurmd.log",
            "log/slurmd.err.out",
        ] {
            let text = fs::read_to_string(self.path(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            out.push_str(&format!("--- {name} (last lines)\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out.push_str(&format!("--- chd-check.log\n{}", self.chd_log()));
        out
    }

    /// Poll `ready` until it holds; panic after `limit` (only for start-up: the cases are
    /// bounded by health-check runs, see [`Cluster::within_runs`]).
    pub fn wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut(&mut Cluster) -> bool,
    ) {
        let start = Instant::now();
        while !ready(self) {
            assert!(
                start.elapsed() < limit,
                "{what}: not within {limit:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until `holds` is true, for at most `runs` completed health checks of `case`.
    /// Returns false when `runs` checks ran and it still is not. Time is bounded only by the
    /// health checks: a panic when none of any case completes for `stall` (slurmd stopped
    /// running them).
    pub fn within_runs(
        &mut self,
        case: &str,
        runs: usize,
        stall: Duration,
        mut holds: impl FnMut(&Cluster) -> bool,
    ) -> bool {
        let mut last = (self.runs().len(), Instant::now());
        loop {
            // Read the runs first: a run that completes after `holds` is checked counts next turn.
            let done = self.runs_of(case).len();
            if holds(self) {
                println!("case {case}: holds after {done} completed health check(s)");
                return true;
            }
            if done >= runs {
                let held = holds(self);
                println!("case {case}: {done} health checks ran, holds: {held}");
                return held;
            }
            let all = self.runs().len();
            if all != last.0 {
                last = (all, Instant::now());
            }
            if let Some(e) = self.exited() {
                panic!("{e}\n{}", self.logs());
            }
            assert!(
                last.1.elapsed() < stall,
                "slurmd ran no health check for {stall:?} (case {case})\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    /// Stop every process started, by its pid: SIGTERM (slurmctld stops its slurmscriptd),
    /// then SIGKILL after 15 s.
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        for (_, child) in self.procs.iter_mut().rev() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(15)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // CHD_KEEP_SLURM_DIR=1 keeps the scratch directory (configs, logs) of a failed test.
        if std::thread::panicking() && std::env::var_os("CHD_KEEP_SLURM_DIR").is_some() {
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
            eprintln!("kept the Slurm scratch directory {}", dir.keep().display());
        }
    }
}
