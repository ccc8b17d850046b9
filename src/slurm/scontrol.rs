//! Running Slurm's `scontrol`: reading every node (`scontrol show nodes`), draining one
//! (`scontrol update NodeName=N State=DRAIN Reason=...`) and resuming one (`State=RESUME`).
//! slurmd runs a `HealthCheckProgram` with `SLURMD_NODENAME` as its whole environment
//! (`run_script_health_check`, src/slurmd/slurmd/slurmd.c): no `PATH`, no `SLURM_CONF`. So
//! `scontrol` is the one given, else the first on `PATH` when there is one, else the first of
//! the usual install paths ([`INSTALL_PATHS`]); the cluster's config is scontrol's own default
//! (`/etc/slurm/slurm.conf` in Debian's and most packages), or `SLURM_CONF` when it is set or
//! given.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::nodes::{self, Node, NodesError};

/// Where packages and sites install `scontrol`: distribution packages (Debian, Ubuntu, RHEL,
/// SUSE, OpenHPC), Slurm's own default prefix (`./configure` installs under `/usr/local`), and
/// the `/opt/slurm` prefix of many site and cloud installs (AWS ParallelCluster, Azure
/// CycleCloud).
pub const INSTALL_PATHS: [&str; 3] = [
    "/usr/bin/scontrol",
    "/usr/local/bin/scontrol",
    "/opt/slurm/bin/scontrol",
];

/// What went wrong talking to Slurm.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("no scontrol: not on PATH ({path}) nor in {}; give it with --scontrol", INSTALL_PATHS.join(", "))]
    NoScontrol { path: String },
    #[error("{0}: not an executable file")]
    NotExecutable(PathBuf),
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{command}` exited with {status}: {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`scontrol show nodes`: {0}")]
    Parse(#[from] NodesError),
    #[error("node {0} is not in `scontrol show nodes` (is --slurm-node right?)")]
    NoSuchNode(String),
}

/// `scontrol` and the config it reads.
#[derive(Debug, Clone)]
pub struct Scontrol {
    program: PathBuf,
    /// `SLURM_CONF` for scontrol; `None`: chd's own environment decides.
    slurm_conf: Option<PathBuf>,
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Scontrol {
    /// `given`, else `scontrol` on `path_env` (the value of `PATH`), else the first of
    /// [`INSTALL_PATHS`] that is an executable file.
    pub fn locate(
        given: Option<&Path>,
        path_env: Option<OsString>,
        slurm_conf: Option<PathBuf>,
    ) -> Result<Scontrol, SlurmError> {
        let program = match given {
            Some(path) if executable(path) => path.to_path_buf(),
            Some(path) => return Err(SlurmError::NotExecutable(path.to_path_buf())),
            None => {
                let on_path = path_env
                    .as_ref()
                    .into_iter()
                    .flat_map(std::env::split_paths)
                    .map(|dir| dir.join("scontrol"));
                let installed = INSTALL_PATHS.iter().map(PathBuf::from);
                on_path
                    .chain(installed)
                    .find(|p| executable(p))
                    .ok_or_else(|| SlurmError::NoScontrol {
                        path: path_env
                            .map(|p| p.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "unset".into()),
                    })?
            }
        };
        Ok(Scontrol {
            program,
            slurm_conf,
        })
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    fn run(&self, args: &[String]) -> Result<String, SlurmError> {
        let mut command = Command::new(&self.program);
        command.args(args);
        if let Some(conf) = &self.slurm_conf {
            command.env("SLURM_CONF", conf);
        }
        let shown = format!("{} {}", self.program.display(), args.join(" "));
        let out = command.output().map_err(|source| SlurmError::Spawn {
            program: self.program.display().to_string(),
            source,
        })?;
        if !out.status.success() {
            return Err(SlurmError::Failed {
                command: shown,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Every node of the cluster (`scontrol show nodes`).
    pub fn nodes(&self) -> Result<Vec<Node>, SlurmError> {
        let text = self.run(&["show".into(), "nodes".into()])?;
        Ok(nodes::parse(&text)?)
    }

    /// The address Slurm reaches node `name` at (`NodeAddr`), for a name that does not
    /// resolve (`scontrol show node NAME`).
    pub fn node_addr(&self, name: &str) -> Result<Option<String>, SlurmError> {
        let text = self.run(&["show".into(), "node".into(), name.into()])?;
        let node = nodes::parse(&text)?
            .into_iter()
            .find(|n| n.name == name)
            .ok_or_else(|| SlurmError::NoSuchNode(name.to_string()))?;
        Ok(node.addr)
    }

    /// `name` and every node, from one `scontrol show nodes`.
    pub fn node_and_all(&self, name: &str) -> Result<(Node, Vec<Node>), SlurmError> {
        let all = self.nodes()?;
        let me = all
            .iter()
            .find(|n| n.name == name)
            .cloned()
            .ok_or_else(|| SlurmError::NoSuchNode(name.to_string()))?;
        Ok((me, all))
    }

    /// Drain `node` with `reason` (a reason of [`super::reason::reason`]: one argument, so
    /// its spaces need no quotes).
    pub fn drain(&self, node: &str, reason: &str) -> Result<(), SlurmError> {
        self.run(&[
            "update".into(),
            format!("NodeName={node}"),
            "State=DRAIN".into(),
            format!("Reason={reason}"),
        ])
        .map(drop)
    }

    /// Resume `node` (undrain it).
    pub fn resume(&self, node: &str) -> Result<(), SlurmError> {
        self.run(&[
            "update".into(),
            format!("NodeName={node}"),
            "State=RESUME".into(),
        ])
        .map(drop)
    }
}

/// The node name slurmd uses: `SLURMD_NODENAME` when set (slurmd sets it for its health
/// check), else the host name up to its first dot (slurmd's default, `gethostname_short`).
pub fn node_name(slurmd_nodename: Option<String>, hostname: &str) -> Option<String> {
    slurmd_nodename.filter(|n| !n.is_empty()).or_else(|| {
        let short = hostname.trim().split('.').next().unwrap_or_default();
        (!short.is_empty()).then(|| short.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn scontrol_is_the_given_one_else_on_path_else_installed() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let on_path = script(&bin, "scontrol", "#!/bin/sh\n");
        let found = Scontrol::locate(None, Some(bin.clone().into_os_string()), None).unwrap();
        assert_eq!(found.program(), on_path);
        let given = script(dir.path(), "my-scontrol", "#!/bin/sh\n");
        let found = Scontrol::locate(Some(&given), Some(bin.into_os_string()), None).unwrap();
        assert_eq!(found.program(), given);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        let err = Scontrol::locate(Some(&plain), None, None).unwrap_err();
        assert!(err.to_string().ends_with("not an executable file"), "{err}");
        // No PATH, as slurmd runs a health check: the install paths, or an error naming them.
        match Scontrol::locate(None, None, None) {
            Ok(found) => assert!(INSTALL_PATHS.contains(&found.program().to_str().unwrap())),
            Err(err) => assert!(
                err.to_string()
                    .starts_with("no scontrol: not on PATH (unset) nor in /usr/bin/scontrol, "),
                "{err}"
            ),
        }
    }

    #[test]
    fn the_arguments_and_slurm_conf_reach_scontrol_and_failures_say_what_ran() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let fake = script(
            dir.path(),
            "scontrol",
            &format!(
                "#!/bin/sh\nfor a in \"$@\"; do echo \"[$a]\"; done >> {log}\necho \"conf=$SLURM_CONF\" >> {log}\n\
                 [ \"$1\" = update ] && exit 0\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n",
                log = log.display()
            ),
        );
        let s = Scontrol::locate(Some(&fake), None, Some("/x/slurm.conf".into())).unwrap();
        s.drain("vm", "chd: device 0 slow column").unwrap();
        s.resume("vm").unwrap();
        let err = s.nodes().unwrap_err().to_string();
        assert!(
            err.contains("scontrol show nodes` exited with exit status: 1: slurm_load_node error"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "[update]\n[NodeName=vm]\n[State=DRAIN]\n[Reason=chd: device 0 slow column]\nconf=/x/slurm.conf\n\
             [update]\n[NodeName=vm]\n[State=RESUME]\nconf=/x/slurm.conf\n\
             [show]\n[nodes]\nconf=/x/slurm.conf\n"
        );
    }

    #[test]
    fn the_node_name_is_slurmds() {
        assert_eq!(
            node_name(Some("gpu17".into()), "host.example.org").as_deref(),
            Some("gpu17")
        );
        assert_eq!(
            node_name(None, "host.example.org\n").as_deref(),
            Some("host")
        );
        assert_eq!(node_name(Some(String::new()), "h").as_deref(), Some("h"));
        assert_eq!(node_name(None, ""), None);
    }
}
