//! `chd ledger`: the node's calibration ledger (`chd::ledger`) from a recording or a state
//! directory, or as a running `chd serve` serves it (`--url`), printed or written to a file;
//! `--merge` makes one fleet file of several ledgers. (`/api/v1/calibration` of `chd serve` is `chd::exposition::calibration_page`.)

use std::path::{Path, PathBuf};

use anyhow::Context;

use chd::format::calibration::Ledger;
use chd::format::fabric_dir::{FabricDir, Listing};
use chd::ledger::{self, Source};
use chd::replay::Replay;
use chd::store::{persist, unix_now};
use chd::topology::Roots;

use super::fetch::{self, Remote};

/// Where a ledger's measurements come from.
#[derive(Debug, Clone)]
pub enum Input {
    /// A recording `chd serve --replay` reads.
    Replay(PathBuf),
    /// `chd serve`'s state directory (its `state.json`).
    StateDir(PathBuf),
}

/// What `chd ledger` was asked.
#[derive(Debug, Clone)]
pub struct LedgerRequest {
    pub input: Input,
    /// Ledgers to merge into a fleet file instead (`--merge`).
    pub merge: Vec<PathBuf>,
    /// A node's `/api/v1/calibration` to fetch instead (`--url`).
    pub url: Option<Remote>,
    /// The host name to record instead of the one found.
    pub host: Option<String>,
    pub out: Option<PathBuf>,
    pub roots: Roots,
}

/// Samples a cell keeps when a recording is read (as `chd serve`'s default).
const KEEP_SAMPLES: usize = 5;

/// A recording's or a state directory's contents, ready for [`ledger::build`].
fn read(input: &Input) -> anyhow::Result<(Replay, String)> {
    match input {
        Input::Replay(path) => {
            let replay = chd::replay::load(path, KEEP_SAMPLES)
                .with_context(|| format!("reading {}", path.display()))?;
            for w in &replay.warnings {
                tracing::warn!("{}: {w}", path.display());
            }
            Ok((replay, path.display().to_string()))
        }
        Input::StateDir(dir) => {
            let path = persist::state_path(dir);
            let bytes = std::fs::read(&path).with_context(|| {
                format!(
                    "reading {} (is {} chd serve's state directory?)",
                    path.display(),
                    dir.display()
                )
            })?;
            let store = persist::decode(&bytes).with_context(|| format!("{}", path.display()))?;
            Ok((
                chd::replay::from_state_store(store, true),
                format!("state directory {}", dir.display()),
            ))
        }
    }
}

/// The host a ledger of `input` names: `--host`, else the recording's, else this machine's
/// for a state directory, else the recording's file name.
pub fn host_of(input: &Input, replay: &Replay, host: Option<&str>, roots: &Roots) -> String {
    if let Some(h) = host.or(replay.host.as_deref()) {
        return h.to_string();
    }
    match input {
        Input::StateDir(_) => chd::topology::hostname(roots),
        Input::Replay(path) => {
            let named = if path.file_name().is_some_and(|n| {
                n == "results.json" || n == "run.json" || n == "partial_results.json"
            }) {
                path.parent().unwrap_or(path)
            } else {
                path.as_path()
            };
            named
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        }
    }
}

/// The ledger of `input` as of `now`.
pub fn ledger_of(
    input: &Input,
    host: Option<&str>,
    roots: &Roots,
    now: f64,
) -> anyhow::Result<Ledger> {
    let (replay, description) = read(input)?;
    let host = host_of(input, &replay, host, roots);
    let fabric = match input {
        Input::StateDir(dir) => {
            let dir = FabricDir::of_state_dir(dir);
            dir.list().with_context(|| {
                format!("reading the fabric results in {}", dir.path().display())
            })?
        }
        Input::Replay(_) => Listing::default(),
    };
    Ok(ledger::build(&Source {
        host: &host,
        backend: &replay.backend,
        description: &description,
        topology: &replay.topology,
        devices: &replay.devices,
        store: &replay.store,
        pairs: &replay.pairs,
        recorded_links: &replay.links,
        recorded_bindable: &replay.affinity,
        load_profile_delta: &replay.load_profile_delta,
        now,
        verdict: None,
        p2p_paths: &replay.p2p_paths,
        p2p_methods: &replay.p2p_methods,
        curves: &replay.curves,
        basics: replay.basics.as_ref(),
        fabric: &fabric,
        d2d_limits: &Default::default(),
    }))
}

fn write(out: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match out {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Run `chd ledger`.
pub fn run(request: &LedgerRequest) -> anyhow::Result<()> {
    if let Some(remote) = &request.url {
        // The node's document as it served it, once it parses as a ledger.
        let text = fetch::get(remote)?;
        chd::format::calibration::parse(&remote.url, &text)?;
        return write(request.out.as_deref(), &text);
    }
    if !request.merge.is_empty() {
        let inputs = request
            .merge
            .iter()
            .map(|p| {
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))
                    .map(|text| (p.display().to_string(), text))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let fleet = ledger::fleet::merge(&inputs)?;
        return write(request.out.as_deref(), &ledger::to_json(&fleet));
    }
    let ledger = ledger_of(
        &request.input,
        request.host.as_deref(),
        &request.roots,
        unix_now(),
    )?;
    write(request.out.as_deref(), &ledger::to_json(&ledger))
}
