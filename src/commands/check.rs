//! `chd check`: the node's verdict for a scheduler's health check (Slurm's
//! `HealthCheckProgram`, LBNL NHC, cron), from what chd measured — a state directory or a
//! recording; it never probes. Nagios/NHC exit codes: 0 ok, 1 degraded, 2 failed, 3 unknown
//! (nothing to judge: no state file, an unreadable one, no measured cell). One line on
//! stdout: `CHD DEGRADED - device 1 PCIe link x8 Gen5 of x16 Gen5`. With `--url` it asks a
//! running `chd serve` for its verdict (held across windows) through `/api/v1/calibration`.
//!
//! A state file or a recording is a snapshot, so every finding in it counts at once; the
//! hysteresis of `chd serve`'s verdict (`chd_node_verdict`) applies to windows as they come.
//!
//! With `--slurm` it also acts on the verdict in Slurm ([`chd::slurm`]: drain, resume or
//! leave the node; one log line per decision; exit 4 when the circuit breaker refuses a drain,
//! 3 when Slurm cannot be read or changed). With `--npd` it speaks node-problem-detector's
//! custom plugin protocol instead (see [`npd`]).

use std::path::PathBuf;
use std::process::ExitCode;

use chd::slurm::decide::{Decision, Policy};
use chd::slurm::scontrol::{node_name, Scontrol};
use chd::topology::Roots;

use chd::analysis::fabric::summarize;
use chd::analysis::live::numa_map;
use chd::analysis::verdict::{causes_of_store, Cause, Level, Observed};
use chd::format::calibration;
use chd::format::fabric::KEEP_PER_PEER;
use chd::format::fabric_dir::FabricDir;
use chd::format::state_file::state_path;
use chd::schedule::verdict::NodeVerdict;

/// Where the verdict comes from.
#[derive(Debug, Clone)]
pub enum CheckSource {
    /// A recording or run directory (as `chd serve --replay` reads it).
    Replay(PathBuf),
    /// `chd serve`'s state directory (its state.json).
    StateDir(PathBuf),
    /// A running `chd serve`: its held verdict, from `/api/v1/calibration`.
    Url(super::fetch::Remote),
}

/// The verdict `chd serve` at `url` holds (its ledger's `verdict`).
fn served(remote: &super::fetch::Remote) -> Result<NodeVerdict, String> {
    let url = remote.url.as_str();
    let text = super::fetch::get(remote).map_err(|e| format!("{e:#}"))?;
    let ledger = calibration::parse(url, &text).map_err(|e| e.to_string())?;
    let Some(v) = ledger.verdict else {
        return Err(format!(
            "{url}: its ledger has no verdict (a chd before issue 16?)"
        ));
    };
    let level = |text: &str| match text {
        "ok" => Ok(Level::Ok),
        "degraded" => Ok(Level::Degraded),
        "failed" => Ok(Level::Failed),
        other => Err(format!("{url}: unknown verdict {other:?}")),
    };
    let causes = v
        .causes
        .into_iter()
        .map(|c| {
            Ok(Cause {
                level: level(&c.level)?,
                id: c.id,
                text: c.text,
                device: c.device,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(NodeVerdict {
        level: level(&v.level)?,
        causes,
        ..NodeVerdict::default()
    })
}

/// The exit code of a level (Nagios plugin convention).
fn code(level: Level) -> u8 {
    match level {
        Level::Ok => 0,
        Level::Degraded => 1,
        Level::Failed => 2,
    }
}

/// What `chd check` does with the verdict besides its exit code.
#[derive(Debug, Clone)]
pub enum Mode {
    /// One line and the Nagios exit code.
    Plain,
    /// Act on it in Slurm too.
    Slurm(SlurmRequest),
    /// node-problem-detector's custom plugin protocol.
    Npd { max_output: usize },
}

/// `chd check --slurm`'s settings.
#[derive(Debug, Clone)]
pub struct SlurmRequest {
    pub policy: Policy,
    /// `--slurm-node`; else slurmd's.
    pub node: Option<String>,
    pub scontrol: Option<PathBuf>,
    pub slurm_conf: Option<PathBuf>,
}

/// The exit code `chd check --slurm` returns when the circuit breaker refuses a drain.
const BREAKER_EXIT: u8 = 4;
/// The exit code of a verdict that could not be reached, or acted on.
const UNKNOWN_EXIT: u8 = 3;

/// The verdict's line: `CHD FAILED - device 0 slow column (...)`.
fn line(verdict: &NodeVerdict) -> String {
    format!(
        "CHD {} - {}",
        verdict.level.as_str().to_uppercase(),
        causes_text(verdict)
    )
}

fn causes_text(verdict: &NodeVerdict) -> String {
    if verdict.causes.is_empty() {
        return "no findings".to_string();
    }
    let texts: Vec<&str> = verdict.causes.iter().map(|c| c.text.as_str()).collect();
    texts.join("; ")
}

/// Judge `source`, print one line, act as `mode` says, return the exit code.
pub fn run(source: &CheckSource, mode: &Mode, samples_per_cell: usize, roots: &Roots) -> ExitCode {
    let judged = judge(source, samples_per_cell);
    match mode {
        Mode::Plain => match judged {
            Ok(verdict) => {
                println!("{}", line(&verdict));
                ExitCode::from(code(verdict.level))
            }
            Err(why) => {
                println!("CHD UNKNOWN - {why}");
                ExitCode::from(UNKNOWN_EXIT)
            }
        },
        Mode::Npd { max_output } => {
            let (status, message) = npd::answer(judged.as_ref().map(|v| (v.level, causes_text(v))));
            println!("{}", npd::fit(&message, *max_output));
            ExitCode::from(status)
        }
        Mode::Slurm(request) => slurm(judged, request, roots),
    }
}

/// `chd check --slurm`: the verdict acted on, one log line per decision.
fn slurm(judged: Result<NodeVerdict, String>, request: &SlurmRequest, roots: &Roots) -> ExitCode {
    let verdict = match judged {
        Ok(verdict) => verdict,
        Err(why) => {
            tracing::warn!("no verdict ({why}): the Slurm node is left as it is");
            println!("CHD UNKNOWN - {why}");
            return ExitCode::from(UNKNOWN_EXIT);
        }
    };
    let unknown = |why: String| {
        tracing::error!("{why}: the Slurm node is left as it is");
        println!("CHD UNKNOWN - {why} (verdict: {})", line(&verdict));
        ExitCode::from(UNKNOWN_EXIT)
    };
    let Some(node) = request.node.clone().or_else(|| {
        node_name(
            std::env::var("SLURMD_NODENAME").ok(),
            &chd::topology::hostname(roots),
        )
    }) else {
        return unknown("no Slurm node name: SLURMD_NODENAME is unset and the host has no name; give --slurm-node".into());
    };
    let slurm_conf = request
        .slurm_conf
        .clone()
        .or_else(|| std::env::var_os("SLURM_CONF").map(PathBuf::from));
    let scontrol = match Scontrol::locate(
        request.scontrol.as_deref(),
        std::env::var_os("PATH"),
        slurm_conf,
    ) {
        Ok(s) => s,
        Err(e) => return unknown(format!("cannot act on Slurm node {node}: {e}")),
    };
    let acted = match chd::slurm::act(
        &scontrol,
        &node,
        verdict.level,
        &verdict.causes,
        request.policy,
    ) {
        Ok(acted) => acted,
        Err(e) => return unknown(format!("cannot act on Slurm node {node}: {e}")),
    };
    match &acted.decision {
        Decision::Refuse { count } => {
            tracing::warn!("{}", acted.line);
            println!("{} (not drained: circuit breaker: {count})", line(&verdict));
            ExitCode::from(BREAKER_EXIT)
        }
        _ => {
            tracing::info!("{}", acted.line);
            println!("{}", line(&verdict));
            ExitCode::from(code(verdict.level))
        }
    }
}

fn judge(source: &CheckSource, samples_per_cell: usize) -> Result<NodeVerdict, String> {
    // A state directory's fabric results count as `chd serve`'s verdict counts them.
    let fabric_rails = match source {
        CheckSource::StateDir(dir) => {
            let listing = FabricDir::of_state_dir(dir)
                .list()
                .map_err(|e| format!("cannot read the fabric results: {e}"))?;
            summarize(&listing.records, KEEP_PER_PEER).rails
        }
        _ => Vec::new(),
    };
    let path = match source {
        CheckSource::Url(remote) => return served(remote),
        CheckSource::Replay(path) => path.clone(),
        CheckSource::StateDir(dir) => {
            let path = state_path(dir);
            if !path.exists() {
                return Err(format!(
                    "no state file {} (has chd serve run with --state-dir {}?)",
                    path.display(),
                    dir.display()
                ));
            }
            path
        }
    };
    let replay = chd::replay::load(&path, samples_per_cell)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if replay.store.measured_cells().next().is_none() && fabric_rails.is_empty() {
        return Err(format!("{}: no measured cell to judge", path.display()));
    }
    let (causes, best_numa) =
        // A recording or state file says nothing of the RDMA ports (they are read live).
        causes_of_store(
            &replay.store,
            &numa_map(&replay.topology),
            &replay.pairs,
            &Observed {
                p2p_paths: replay.p2p_paths.clone(),
                fabric_rails,
                ..Observed::default()
            },
        );
    Ok(NodeVerdict::immediate(causes, best_numa))
}

/// node-problem-detector's custom plugin protocol (pkg/custompluginmonitor/plugin/plugin.go
/// and types/types.go in kubernetes/node-problem-detector): the plugin's exit status is 0 OK,
/// 1 NonOK, anything else Unknown; its stdout, trimmed of white space and cut at the monitor's
/// `max_output_length` bytes (80 by default, types/config.go), is the condition's message. A
/// permanent rule turns NonOK into its condition True, OK into False (with the condition's
/// default message) and Unknown into Unknown (custom_plugin_monitor.go, `toConditionStatus`).
pub mod npd {
    use chd::analysis::verdict::Level;

    /// NPD's OK: the condition (`ChdCalibrationFailed`) is False.
    pub const OK: u8 = 0;
    /// NPD's NonOK: the condition is True.
    pub const NON_OK: u8 = 1;
    /// NPD's Unknown.
    pub const UNKNOWN: u8 = 2;

    /// The exit status and message for a verdict (level and causes), or why there is none.
    pub fn answer(judged: Result<(Level, String), &String>) -> (u8, String) {
        match judged {
            Ok((Level::Failed, causes)) => (NON_OK, causes),
            Ok((level, causes)) => (OK, format!("{level}: {causes}")),
            Err(why) => (UNKNOWN, format!("unknown: {why}")),
        }
    }

    /// `message` within `max` bytes, so NPD never cuts it inside a character or a word: cut at
    /// the last space that leaves room for `...`.
    pub fn fit(message: &str, max: usize) -> String {
        let message = message.trim();
        if message.len() <= max {
            return message.to_string();
        }
        let room = max.saturating_sub(3);
        let mut end = room;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let cut = message[..end]
            .rfind(' ')
            .filter(|&i| i > room / 2)
            .unwrap_or(end);
        format!("{}...", message[..cut].trim_end())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_message_fits_npds_limit_cut_at_a_word() {
            let long = "device 0 slow column (0.22 x the typical device); pair 0,3: CPU 6 as rank 0 slow (0.30 x the pair median)";
            let cut = fit(long, 80);
            assert!(cut.len() <= 80, "{} bytes", cut.len());
            assert_eq!(
                cut,
                "device 0 slow column (0.22 x the typical device); pair 0,3: CPU 6 as rank 0..."
            );
            assert_eq!(fit(" short \n", 80), "short");
            let wide = "é".repeat(60);
            assert!(fit(&wide, 80).len() <= 80);
        }

        #[test]
        fn only_a_failed_verdict_sets_the_condition() {
            assert_eq!(
                answer(Ok((Level::Failed, "x".into()))),
                (NON_OK, "x".into())
            );
            assert_eq!(
                answer(Ok((Level::Degraded, "y".into()))),
                (OK, "degraded: y".into())
            );
            assert_eq!(answer(Ok((Level::Ok, "no findings".into()))).0, OK);
            assert_eq!(
                answer(Err(&"no state file".to_string())),
                (UNKNOWN, "unknown: no state file".into())
            );
        }
    }
}
