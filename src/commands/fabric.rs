//! `chd fabric rounds`: the node list read from a file, stdin or the argument, the
//! round-robin schedule of `chd::fabric::rounds`, printed as text, JSON or one pair a line.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use serde_json::json;

use chd::fabric::nodes::NodeList;
use chd::fabric::rounds::{Round, Schedule};

/// How `chd fabric rounds` prints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RoundsFormat {
    /// `round 1: a-b c-d` (`bye: e`), one line per round.
    Text,
    /// One document: nodes, round count and the rounds printed.
    Json,
    /// `ROUND A B`, one line per pair.
    Pairs,
}

/// `chd fabric rounds` as asked.
#[derive(Debug, Clone)]
pub struct RoundsRequest {
    /// A file, `-` (stdin) or a hostlist.
    pub nodes: String,
    /// Only this round (1-based).
    pub round: Option<usize>,
    pub format: RoundsFormat,
}

/// Run `chd fabric rounds`.
pub fn rounds(request: &RoundsRequest) -> anyhow::Result<()> {
    let nodes = read_nodes(&request.nodes)?;
    let schedule = Schedule::new(nodes).context("--nodes")?;
    let rounds: Vec<Round> = match request.round {
        Some(k) => vec![schedule.round(k).context("--round")?],
        None => schedule.rounds().collect(),
    };
    print!("{}", render(&schedule, &rounds, request.format));
    Ok(())
}

/// The node list of `--nodes`: stdin for `-`, a file when one by that name exists or the
/// value has a '/', else the value itself as a hostlist.
fn read_nodes(value: &str) -> anyhow::Result<NodeList> {
    if value == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("--nodes -: reading stdin")?;
        return NodeList::from_file_text(&text).context("--nodes -: stdin");
    }
    let path = Path::new(value);
    if value.contains('/') || path.is_file() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--nodes: reading the node file {value}"))?;
        return NodeList::from_file_text(&text).with_context(|| format!("--nodes: {value}"));
    }
    NodeList::from_list(value).context("--nodes")
}

/// The rounds in `format`.
fn render(schedule: &Schedule, rounds: &[Round], format: RoundsFormat) -> String {
    let mut out = String::new();
    match format {
        RoundsFormat::Text => {
            for round in rounds {
                let pairs: Vec<String> = round
                    .pairs
                    .iter()
                    .map(|(a, b)| format!("{a}-{b}"))
                    .collect();
                out += &format!("round {}: {}", round.number, pairs.join(" "));
                if let Some(bye) = &round.bye {
                    out += &format!(" bye: {bye}");
                }
                out += "\n";
            }
        }
        RoundsFormat::Pairs => {
            for round in rounds {
                for (a, b) in &round.pairs {
                    out += &format!("{} {a} {b}\n", round.number);
                }
            }
        }
        RoundsFormat::Json => {
            let rounds: Vec<_> = rounds
                .iter()
                .map(|r| {
                    json!({
                        "round": r.number,
                        "pairs": r.pairs.iter().map(|(a, b)| [a.as_str(), b.as_str()]).collect::<Vec<_>>(),
                        "bye": r.bye.as_ref().map(|b| b.as_str()),
                    })
                })
                .collect();
            let document = json!({
                "nodes": schedule.nodes().iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                "round_count": schedule.round_count(),
                "rounds": rounds,
            });
            out = serde_json::to_string_pretty(&document).expect("JSON of strings and numbers");
            out += "\n";
        }
    }
    out
}
