//! Who this rank is, learned from the engine that launched it: Slurm's `srun`, a Kubernetes
//! Indexed Job, torchrun, Open MPI or a PMI launcher (MPICH, Intel MPI) each set their own
//! variables; flags override any of them. chd never picks nodes or starts its peers: the engine
//! did, and this module reads what it said.

use std::fmt;

/// The rendezvous port when nothing names one.
pub const DEFAULT_PORT: u16 = 29517;

/// Which engine's variables gave the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Flags,
    Slurm,
    Kubernetes,
    Torchrun,
    OpenMpi,
    Pmi,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Flags => "flags",
            Engine::Slurm => "slurm",
            Engine::Kubernetes => "kubernetes",
            Engine::Torchrun => "torchrun",
            Engine::OpenMpi => "openmpi",
            Engine::Pmi => "pmi",
        }
    }
}

/// Where rank 0 listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// This process's place in the launched job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub engine: Engine,
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub rendezvous: Rendezvous,
    /// Whether rank 0 runs on this node (the launcher says so: Slurm's first host of the step
    /// is this node): the other ranks here reach it over loopback, without resolving its name.
    pub rank0_here: bool,
}

impl Launch {
    /// Where a rank other than 0 connects.
    pub fn connect_host(&self) -> &str {
        if self.rank0_here {
            "127.0.0.1"
        } else {
            &self.rendezvous.host
        }
    }
}

/// What the command line says, each overriding the engine's variable.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub local_rank: Option<u32>,
    /// `HOST` or `HOST:PORT`.
    pub rendezvous: Option<String>,
    pub port: Option<u16>,
}

/// Why the rank could not be learned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaunchError {
    #[error(
        "no launcher's variables found (Slurm's SLURM_PROCID/SLURM_NTASKS, a Kubernetes Indexed \
         Job's JOB_COMPLETION_INDEX, torchrun's RANK/WORLD_SIZE/MASTER_ADDR, Open MPI's \
         OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE): run it under one, or give --rank, --world-size \
         and --rendezvous"
    )]
    NoEngine,
    #[error("{name}={value:?} is not a number")]
    NotANumber { name: String, value: String },
    #[error("{engine} set the rank but not the {what}: {hint}")]
    Missing {
        engine: &'static str,
        what: &'static str,
        hint: &'static str,
    },
    #[error("rank {rank} is not below the world size {world_size}")]
    RankOutOfRange { rank: u32, world_size: u32 },
    #[error("a fabric run needs at least 2 ranks; the world size is {0}")]
    TooSmall(u32),
    #[error("rendezvous {0:?}: {1}")]
    BadRendezvous(String, &'static str),
    #[error("SLURM_STEP_NODELIST {0:?} is not a Slurm host list")]
    BadNodeList(String),
}

/// Derive the launch from `env` (a variable lookup; `std::env::var` in the binary) and `flags`.
pub fn derive(
    env: &dyn Fn(&str) -> Option<String>,
    flags: &Overrides,
) -> Result<Launch, LaunchError> {
    let number = |name: &str| parsed::<u32>(env, name);
    let port_var = |name: &str| parsed::<u16>(env, name);
    let generic_rendezvous = env("CHD_FABRIC_RENDEZVOUS");
    let generic_world = number("CHD_FABRIC_WORLD_SIZE")?;

    // (engine, rank, world size, local rank, rendezvous host, rendezvous port)
    type Found = (
        Engine,
        Option<u32>,
        Option<u32>,
        Option<u32>,
        Option<String>,
        Option<u16>,
    );
    let found: Found = if let (Some(rank), Some(addr)) = (number("RANK")?, env("MASTER_ADDR")) {
        // torchrun's elastic agent may hold MASTER_PORT for its own store
        // (TORCHELASTIC_USE_AGENT_STORE): chd then listens on the next port.
        let agent_store = env("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        let port = port_var("MASTER_PORT")?.map(|p| if agent_store { p + 1 } else { p });
        (
            Engine::Torchrun,
            Some(rank),
            number("WORLD_SIZE")?,
            number("LOCAL_RANK")?,
            Some(addr),
            port,
        )
    } else if let Some(rank) = number("OMPI_COMM_WORLD_RANK")? {
        (
            Engine::OpenMpi,
            Some(rank),
            number("OMPI_COMM_WORLD_SIZE")?,
            number("OMPI_COMM_WORLD_LOCAL_RANK")?,
            None,
            None,
        )
    } else if let Some(rank) = number("PMI_RANK")? {
        let local = match number("MPI_LOCALRANKID")? {
            Some(l) => Some(l),
            None => number("PMI_LOCAL_RANK")?,
        };
        (
            Engine::Pmi,
            Some(rank),
            number("PMI_SIZE")?,
            local,
            None,
            None,
        )
    } else if let Some(rank) = number("SLURM_PROCID")? {
        let list = env("SLURM_STEP_NODELIST").or_else(|| env("SLURM_JOB_NODELIST"));
        let host = list
            .map(|l| first_host(&l).ok_or(LaunchError::BadNodeList(l)))
            .transpose()?;
        (
            Engine::Slurm,
            Some(rank),
            number("SLURM_NTASKS")?.or(number("SLURM_NPROCS")?),
            number("SLURM_LOCALID")?,
            host,
            None,
        )
    } else if let Some(index) = number("JOB_COMPLETION_INDEX")? {
        // An Indexed Job's pod: rank 0 is `<job>-0.<subdomain>`, the headless Service's
        // record of index 0. The job's name comes from the manifest (the downward API's
        // `batch.kubernetes.io/job-name` label) or, without host networking, from the pod's
        // hostname `<job>-<index>`.
        let job = env("CHD_FABRIC_JOB").or_else(|| {
            env("HOSTNAME").and_then(|h| {
                h.strip_suffix(&format!("-{index}"))
                    .filter(|j| !j.is_empty())
                    .map(str::to_string)
            })
        });
        let host = match (job, env("CHD_FABRIC_SUBDOMAIN")) {
            (Some(job), Some(sub)) => Some(format!("{job}-0.{sub}")),
            (Some(job), None) => Some(format!("{job}-0")),
            _ => None,
        };
        (Engine::Kubernetes, Some(index), None, None, host, None)
    } else {
        (Engine::Flags, None, None, None, None, None)
    };
    let (engine, rank, world, local, host, port) = found;
    let rank0_here = engine == Engine::Slurm
        && host.is_some()
        && env("SLURMD_NODENAME").as_deref() == host.as_deref();

    let rank = flags.rank.or(rank).ok_or(LaunchError::NoEngine)?;
    let world_size = flags
        .world_size
        .or(world)
        .or(generic_world)
        .ok_or(match engine {
            Engine::Kubernetes => LaunchError::Missing {
                engine: "Kubernetes",
                what: "world size",
                hint: "set CHD_FABRIC_WORLD_SIZE (the Job's completions) or --world-size",
            },
            _ => LaunchError::Missing {
                engine: engine.as_str(),
                what: "world size",
                hint: "give --world-size",
            },
        })?;
    if world_size < 2 {
        return Err(LaunchError::TooSmall(world_size));
    }
    if rank >= world_size {
        return Err(LaunchError::RankOutOfRange { rank, world_size });
    }
    let local_rank = flags.local_rank.or(local).unwrap_or(0);

    let named = flags.rendezvous.clone().or(generic_rendezvous);
    let rank0_here = rank0_here && named.is_none();
    let (host, named_port) = match named {
        Some(text) => {
            let (h, p) = split_host_port(&text)?;
            (Some(h), p)
        }
        None => (host, None),
    };
    let host = host.ok_or(LaunchError::Missing {
        engine: engine.as_str(),
        what: "rendezvous host",
        hint: "give --rendezvous HOST[:PORT] or CHD_FABRIC_RENDEZVOUS (rank 0's address)",
    })?;
    let port = flags
        .port
        .or(named_port)
        .or(port)
        .or(port_var("CHD_FABRIC_PORT")?)
        .unwrap_or(DEFAULT_PORT);
    Ok(Launch {
        engine,
        rank,
        world_size,
        local_rank,
        rendezvous: Rendezvous { host, port },
        rank0_here,
    })
}

/// The variable `name` as a number, if set; a value that is not one is an error naming it.
fn parsed<T: std::str::FromStr>(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<T>, LaunchError> {
    env(name)
        .map(|v| {
            v.trim().parse().map_err(|_| LaunchError::NotANumber {
                name: name.to_string(),
                value: v,
            })
        })
        .transpose()
}

/// `host`, `host:port`, `[v6]:port` or a bare IPv6 address.
fn split_host_port(text: &str) -> Result<(String, Option<u16>), LaunchError> {
    let bad = |why| LaunchError::BadRendezvous(text.to_string(), why);
    if let Some(rest) = text.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or(bad("no closing ']'"))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => Some(p.parse().map_err(|_| bad("the port is not a number"))?),
            None if tail.is_empty() => None,
            None => return Err(bad("text after ']' is not :PORT")),
        };
        return Ok((host.to_string(), port));
    }
    if text.is_empty() {
        return Err(bad("empty"));
    }
    match text.matches(':').count() {
        0 => Ok((text.to_string(), None)),
        1 => {
            let (h, p) = text.split_once(':').expect("one colon");
            if h.is_empty() {
                return Err(bad("no host before ':'"));
            }
            let port = p.parse().map_err(|_| bad("the port is not a number"))?;
            Ok((h.to_string(), Some(port)))
        }
        _ => Ok((text.to_string(), None)),
    }
}

/// The first host of a Slurm host list: `gpu[07-09,12],login1` -> `gpu07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let first = &list[..end];
    if first.is_empty() {
        return None;
    }
    let Some(open) = first.find('[') else {
        return (!first.contains(']')).then(|| first.to_string());
    };
    let close = first.find(']')?;
    if close < open {
        return None;
    }
    let (prefix, inside, suffix) = (&first[..open], &first[open + 1..close], &first[close + 1..]);
    let start = inside.split([',', '-']).next()?;
    if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(format!("{prefix}{start}{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn derive_from(pairs: &[(&str, &str)]) -> Result<Launch, LaunchError> {
        derive(&env_of(pairs), &Overrides::default())
    }

    #[test]
    fn srun_sets_rank_tasks_local_id_and_the_step_node_list() {
        // What `srun -N2 -n2` exports into rank 1 (Slurm 22.05), trimmed to what chd reads.
        let l = derive_from(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_STEP_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_NODELIST", "gpu[01-08]"),
            ("SLURMD_NODENAME", "gpu08"),
        ])
        .unwrap();
        assert_eq!(l.engine, Engine::Slurm);
        assert_eq!((l.rank, l.world_size, l.local_rank), (1, 2, 0));
        assert_eq!(l.rendezvous.to_string(), "gpu07:29517");
        assert_eq!(l.connect_host(), "gpu07");
        // A rank on rank 0's own node reaches it over loopback.
        let l = derive_from(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "gpu07"),
            ("SLURMD_NODENAME", "gpu07"),
        ])
        .unwrap();
        assert_eq!(l.connect_host(), "127.0.0.1");
    }

    #[test]
    fn an_indexed_job_pod_finds_index_zero_through_the_headless_service() {
        let l = derive_from(&[
            ("JOB_COMPLETION_INDEX", "1"),
            ("HOSTNAME", "chd-fabric-1"),
            ("CHD_FABRIC_SUBDOMAIN", "chd-fabric"),
            ("CHD_FABRIC_WORLD_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(l.engine, Engine::Kubernetes);
        assert_eq!((l.rank, l.world_size), (1, 2));
        assert_eq!(l.rendezvous.host, "chd-fabric-0.chd-fabric");
        // With hostNetwork the hostname is the node's: the job name comes from the label.
        let l = derive_from(&[
            ("JOB_COMPLETION_INDEX", "0"),
            ("HOSTNAME", "gpu-node-17"),
            ("CHD_FABRIC_JOB", "fabric-r3"),
            ("CHD_FABRIC_SUBDOMAIN", "chd-fabric"),
            ("CHD_FABRIC_WORLD_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(l.rendezvous.host, "fabric-r3-0.chd-fabric");
        let e = derive_from(&[("JOB_COMPLETION_INDEX", "0"), ("HOSTNAME", "x-0")]).unwrap_err();
        assert!(e.to_string().contains("CHD_FABRIC_WORLD_SIZE"), "{e}");
    }

    #[test]
    fn torchrun_mpi_and_pmi() {
        let l = derive_from(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap();
        assert_eq!(l.engine, Engine::Torchrun);
        assert_eq!((l.rank, l.world_size, l.local_rank), (3, 4, 1));
        assert_eq!(l.rendezvous.to_string(), "10.0.0.1:29501");

        let l = derive_from(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("CHD_FABRIC_RENDEZVOUS", "[fd00::1]:4000"),
        ])
        .unwrap();
        assert_eq!(l.engine, Engine::OpenMpi);
        assert_eq!(l.rendezvous.to_string(), "[fd00::1]:4000");
        let e = derive_from(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")])
            .unwrap_err();
        assert!(e.to_string().contains("--rendezvous"), "{e}");

        let l = derive_from(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "0"),
            ("CHD_FABRIC_RENDEZVOUS", "head"),
        ])
        .unwrap();
        assert_eq!((l.engine, l.rank), (Engine::Pmi, 0));
    }

    #[test]
    fn flags_override_and_bad_values_are_named() {
        let flags = Overrides {
            rank: Some(0),
            world_size: Some(2),
            rendezvous: Some("127.0.0.1:7000".into()),
            ..Default::default()
        };
        let l = derive(&env_of(&[("SLURM_PROCID", "1")]), &flags).unwrap();
        assert_eq!((l.rank, l.rendezvous.port), (0, 7000));
        assert_eq!(derive_from(&[]).unwrap_err(), LaunchError::NoEngine);
        assert!(matches!(
            derive_from(&[("SLURM_PROCID", "x")]).unwrap_err(),
            LaunchError::NotANumber { .. }
        ));
        assert_eq!(
            derive_from(&[
                ("SLURM_PROCID", "2"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_STEP_NODELIST", "a")
            ])
            .unwrap_err(),
            LaunchError::RankOutOfRange {
                rank: 2,
                world_size: 2
            }
        );
        assert_eq!(
            derive_from(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).unwrap_err(),
            LaunchError::TooSmall(1)
        );
    }

    #[test]
    fn the_first_host_of_a_slurm_host_list() {
        assert_eq!(first_host("gpu[07-09,12],login1").as_deref(), Some("gpu07"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("n[1-2]-ib").as_deref(), Some("n1-ib"));
        assert_eq!(first_host("chdnode").as_deref(), Some("chdnode"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("n[x-2]"), None);
        assert_eq!(first_host("n]1["), None);
    }
}
