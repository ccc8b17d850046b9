//! `chd check`: the node's verdict for a scheduler's health check (Slurm's
//! `HealthCheckProgram`, LBNL NHC, cron), from what chd measured — a state directory or a
//! recording; it never probes. Nagios/NHC exit codes: 0 ok, 1 degraded, 2 failed, 3 unknown
//! (nothing to judge: no state file, an unreadable one, no measured cell). One line on
//! stdout: `CHD DEGRADED - device 1 PCIe link x8 Gen5 of x16 Gen5`. With `--url` it asks a
//! running `chd serve` for its verdict (held across windows) through `/api/v1/calibration`.
//!
//! A state file or a recording is a snapshot, so every finding in it counts at once; the
//! hysteresis of `chd serve`'s verdict (`chd_node_verdict`) applies to windows as they come.

use std::path::PathBuf;
use std::process::ExitCode;

use chd::analysis::live::numa_map;
use chd::analysis::verdict::{causes_of_store, Cause, Level, Observed};
use chd::format::calibration;
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
    Url(String),
}

/// The verdict `chd serve` at `url` holds (its ledger's `verdict`).
fn served(url: &str) -> Result<NodeVerdict, String> {
    let text = super::advise::fetch(url).map_err(|e| format!("{e:#}"))?;
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
        best_numa: Default::default(),
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

/// Judge `source`, print one line, return the exit code.
pub fn run(source: &CheckSource, samples_per_cell: usize) -> ExitCode {
    match judge(source, samples_per_cell) {
        Ok(verdict) => {
            let text = if verdict.causes.is_empty() {
                "no findings".to_string()
            } else {
                let texts: Vec<&str> = verdict.causes.iter().map(|c| c.text.as_str()).collect();
                texts.join("; ")
            };
            println!("CHD {} - {text}", verdict.level.as_str().to_uppercase());
            ExitCode::from(code(verdict.level))
        }
        Err(why) => {
            println!("CHD UNKNOWN - {why}");
            ExitCode::from(3)
        }
    }
}

fn judge(source: &CheckSource, samples_per_cell: usize) -> Result<NodeVerdict, String> {
    let path = match source {
        CheckSource::Url(url) => return served(url),
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
    if replay.store.measured_cells().next().is_none() {
        return Err(format!("{}: no measured cell to judge", path.display()));
    }
    let (causes, best_numa) =
        // A recording or state file says nothing of the RDMA ports (they are read live).
        causes_of_store(
            &replay.store,
            &numa_map(&replay.topology),
            &replay.pairs,
            &Observed::default(),
        );
    Ok(NodeVerdict::immediate(causes, best_numa))
}
