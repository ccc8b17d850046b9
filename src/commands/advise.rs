//! `chd advise`: launch advice from a node's ledger (`chd::ledger::advice`), or with `--map`
//! a proposed launch map scored against it (`chd::ledger::score`), exit 1 when a rank is
//! below the threshold. The ledger comes from a recording, a state directory, a ledger file,
//! or a node's `/api/v1/calibration` (`--url`, over HTTP or TLS: [`super::fetch`]).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};

use chd::format::calibration::{self, Ledger};
use chd::format::launch_map;
use chd::ledger::{advice, score};
use chd::store::unix_now;
use chd::topology::Roots;

use super::fetch::{self, Remote};
use super::ledger::{ledger_of, Input};

/// Where the ledger comes from.
#[derive(Debug, Clone)]
pub enum Source {
    Local(Input),
    /// A ledger file (`chd ledger --out`), or `-` for stdin.
    File(PathBuf),
    /// `http[s]://node[:9863]` (the path `/api/v1/calibration` is added when absent).
    Url(Remote),
}

/// What `chd advise` was asked.
#[derive(Debug, Clone)]
pub struct AdviseRequest {
    pub source: Source,
    pub json: bool,
    pub map: Option<PathBuf>,
    pub threshold: f64,
    pub roots: Roots,
}

fn load(request: &AdviseRequest) -> anyhow::Result<Ledger> {
    let (name, text) = match &request.source {
        Source::Local(input) => return ledger_of(input, None, &request.roots, unix_now()),
        Source::File(path) if path.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text)?;
            ("stdin".to_string(), text)
        }
        Source::File(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        ),
        Source::Url(remote) => (remote.url.clone(), fetch::get(remote)?),
    };
    Ok(calibration::parse(&name, &text)?)
}

/// Run `chd advise`; `Ok(false)` when `--map` has a rank below the threshold.
pub fn run(request: &AdviseRequest) -> anyhow::Result<bool> {
    if !(0.0..=1.0).contains(&request.threshold) {
        bail!("--threshold {} is not between 0 and 1", request.threshold);
    }
    let ledger = load(request)?;
    let Some(map) = &request.map else {
        let advice = advice::advise(&ledger);
        if request.json {
            print!("{}", chd::ledger::to_json(&advice));
        } else {
            print!("{}", advice::render(&advice));
        }
        return Ok(true);
    };
    let text =
        std::fs::read_to_string(map).with_context(|| format!("reading {}", map.display()))?;
    let ranks = launch_map::parse(&map.display().to_string(), &text)?;
    let scored = score::score(&ledger, &ranks, request.threshold)?;
    if request.json {
        print!("{}", chd::ledger::to_json(&scored));
    } else {
        print!("{}", score::render(&scored));
    }
    Ok(scored.ok)
}
