//! `chd advise --map FILE`: a proposed launch map scored against a node's ledger. Per rank,
//! the expected H2D (median of the map's CPUs' cells on the device, in the matrix its best
//! CPUs were judged on) over the best achievable on that device (the device's best cell);
//! for rank pairs whose devices have a core-pair matrix, the rank's CPUs' pair ratio
//! (`chd_pair_cpu_ratio` of the ledger's analysis: rank 0's side for the pair's first device)
//! as a penalty. Score = H2D ratio x min(1, pair ratios); a rank below the threshold fails.

use serde::Serialize;

use crate::format::calibration::Ledger;
use crate::format::launch_map::MapRank;
use crate::stats;
use crate::topology::cpulist;

/// The default `--threshold`.
pub const DEFAULT_THRESHOLD: f64 = 0.9;

/// A pair matrix's say about a rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairPenalty {
    pub pair: String,
    pub peer_rank: u32,
    /// Which rank of the pair's collective this rank's device is (0: the first device).
    pub side: u8,
    /// Median of the rank's CPUs' pair CPU ratios.
    pub ratio: f64,
}

/// One rank, scored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankScore {
    pub rank: u32,
    pub device: String,
    pub cpus: String,
    pub expected_gbps: Option<f64>,
    pub best_gbps: Option<f64>,
    pub h2d_ratio: Option<f64>,
    pub pair_penalties: Vec<PairPenalty>,
    pub score: Option<f64>,
    pub ok: bool,
    /// Why the rank fails, when it does.
    pub why: Option<String>,
}

/// A map, scored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MapScore {
    pub host: String,
    pub threshold: f64,
    pub ranks: Vec<RankScore>,
    /// Every rank at or above the threshold.
    pub ok: bool,
}

/// Why a map cannot be scored against a ledger.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoreError {
    #[error("rank {rank}: device {device:?} is not one of this node's devices ({known})")]
    UnknownDevice {
        rank: u32,
        device: String,
        known: String,
    },
}

/// Score `ranks` against `ledger`.
pub fn score(ledger: &Ledger, ranks: &[MapRank], threshold: f64) -> Result<MapScore, ScoreError> {
    let known = || {
        ledger
            .node
            .devices
            .iter()
            .map(|d| d.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::with_capacity(ranks.len());
    for r in ranks {
        let Some(device) = ledger.node.devices.iter().find(|d| d.id == r.device) else {
            return Err(ScoreError::UnknownDevice {
                rank: r.rank,
                device: r.device.clone(),
                known: known(),
            });
        };
        let cpus = cpulist::parse(&r.cpus).unwrap_or_default();
        let best = device.best_cpus.as_ref();
        let values: Vec<f64> = best
            .and_then(|b| {
                ledger
                    .h2d_gbps_by_core_device
                    .iter()
                    .find(|m| m.size_bytes == b.size_bytes && m.direction == b.direction)
            })
            .map(|m| {
                m.cells
                    .iter()
                    .filter(|c| c.device == r.device && cpus.contains(&c.cpu))
                    .filter_map(|c| c.gbps)
                    .collect()
            })
            .unwrap_or_default();
        let expected = stats::median(&values);
        let best_gbps = best.map(|b| b.best_gbps);
        let h2d_ratio = expected
            .zip(best_gbps)
            .and_then(|(e, b)| stats::ratio(e, b));
        let mut pair_penalties = Vec::new();
        for q in ranks
            .iter()
            .filter(|q| q.rank != r.rank && q.device != r.device)
        {
            for (label, side) in [
                (format!("{},{}", r.device, q.device), 0u8),
                (format!("{},{}", q.device, r.device), 1u8),
            ] {
                let Some(pair) = ledger.analysis.pairs.iter().find(|p| p.pair == label) else {
                    continue;
                };
                let ratios: Vec<f64> = pair
                    .cpus
                    .iter()
                    .filter(|c| c.rank == side && cpus.contains(&c.cpu))
                    .filter_map(|c| c.ratio)
                    .collect();
                if let Some(ratio) = stats::median(&ratios) {
                    pair_penalties.push(PairPenalty {
                        pair: label,
                        peer_rank: q.rank,
                        side,
                        ratio,
                    });
                }
            }
        }
        let worst_pair = pair_penalties
            .iter()
            .map(|p| p.ratio.min(1.0))
            .fold(1.0, f64::min);
        let score = h2d_ratio.map(|h| h * worst_pair);
        let ok = score.is_some_and(|s| s >= threshold);
        let why = match (score, h2d_ratio) {
            (None, _) => Some(format!(
                "no measured H2D cell for CPUs {} on device {}",
                r.cpus, r.device
            )),
            (Some(_), _) if ok => None,
            (Some(_), Some(h)) if h < threshold => Some(format!(
                "expected H2D {:.1} GB/s is {:.2} of the best {:.1} GB/s on device {}",
                expected.unwrap_or_default(),
                h,
                best_gbps.unwrap_or_default(),
                r.device
            )),
            (Some(_), _) => {
                let p = pair_penalties
                    .iter()
                    .min_by(|a, b| a.ratio.total_cmp(&b.ratio));
                Some(match p {
                    Some(p) => format!(
                        "its CPUs are at {:.2} of pair {}'s median as rank {} (with rank {})",
                        p.ratio, p.pair, p.side, p.peer_rank
                    ),
                    None => "below the threshold".into(),
                })
            }
        };
        out.push(RankScore {
            rank: r.rank,
            device: r.device.clone(),
            cpus: r.cpus.clone(),
            expected_gbps: expected,
            best_gbps,
            h2d_ratio,
            pair_penalties,
            score,
            ok,
            why,
        });
    }
    Ok(MapScore {
        host: ledger.node.host.clone(),
        threshold,
        ok: out.iter().all(|r| r.ok),
        ranks: out,
    })
}

/// `score` for a terminal: one line per rank, then the verdict.
pub fn render(score: &MapScore) -> String {
    let mut out = String::new();
    for r in &score.ranks {
        let num = |v: Option<f64>, digits: usize| {
            v.map(|v| format!("{v:.digits$}"))
                .unwrap_or_else(|| "-".into())
        };
        let pairs: String = r
            .pair_penalties
            .iter()
            .map(|p| format!(", pair {} with rank {} {:.2}", p.pair, p.peer_rank, p.ratio))
            .collect();
        out.push_str(&format!(
            "rank {} device {} CPUs {}: {} of {} GB/s = {}{pairs}, score {} {}\n",
            r.rank,
            r.device,
            r.cpus,
            num(r.expected_gbps, 1),
            num(r.best_gbps, 1),
            num(r.h2d_ratio, 2),
            num(r.score, 2),
            if r.ok { "ok" } else { "BELOW" },
        ));
        if let Some(why) = &r.why {
            out.push_str(&format!("  {why}\n"));
        }
    }
    let below = score.ranks.iter().filter(|r| !r.ok).count();
    out.push_str(&if below == 0 {
        format!(
            "{}: every rank at or above {:.2}\n",
            score.host, score.threshold
        )
    } else {
        format!(
            "{}: {below} of {} ranks below {:.2}\n",
            score.host,
            score.ranks.len(),
            score.threshold
        )
    });
    out
}
