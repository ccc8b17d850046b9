//! A proposed launch map for `chd advise --map FILE`: which device and CPUs each local rank
//! gets. Either JSON (`[{"rank": 0, "device": "0", "cpus": "0-7"}, ...]`, or that list under
//! `"ranks"`) or text lines `rank device cpulist` (`#` starts a comment).

use serde::Deserialize;

use crate::topology::cpulist;

/// One rank of a launch map.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapRank {
    pub rank: u32,
    pub device: String,
    /// cpulist.
    pub cpus: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonMap {
    List(Vec<MapRank>),
    Object { ranks: Vec<MapRank> },
}

/// Why a launch map was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchMapError {
    #[error("{name}: not a launch map: {problem}")]
    Json { name: String, problem: String },
    #[error("{name}:{line}: {problem} (expected `rank device cpulist`)")]
    Line {
        name: String,
        line: usize,
        problem: String,
    },
    #[error("{name}: rank {rank}: cpus {cpus:?}: {problem}")]
    Cpus {
        name: String,
        rank: u32,
        cpus: String,
        problem: String,
    },
    #[error("{name}: rank {rank} is listed twice")]
    Duplicate { name: String, rank: u32 },
    #[error("{name}: no ranks")]
    Empty { name: String },
}

/// Parse a launch map (`name` for messages); ranks come back ascending, each with its CPUs
/// checked as a cpulist.
pub fn parse(name: &str, text: &str) -> Result<Vec<MapRank>, LaunchMapError> {
    let trimmed = text.trim_start();
    let mut ranks = if trimmed.starts_with('[') || trimmed.starts_with('{') {
        match serde_json::from_str::<JsonMap>(text) {
            Ok(JsonMap::List(r)) | Ok(JsonMap::Object { ranks: r }) => r,
            Err(e) => {
                return Err(LaunchMapError::Json {
                    name: name.into(),
                    problem: e.to_string(),
                })
            }
        }
    } else {
        let mut ranks = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let bad = |problem: String| LaunchMapError::Line {
                name: name.into(),
                line: i + 1,
                problem,
            };
            let [rank, device, cpus] = fields[..] else {
                return Err(bad(format!("{} fields", fields.len())));
            };
            let rank = rank
                .parse()
                .map_err(|_| bad(format!("rank {rank:?} is not a number")))?;
            ranks.push(MapRank {
                rank,
                device: device.into(),
                cpus: cpus.into(),
            });
        }
        ranks
    };
    if ranks.is_empty() {
        return Err(LaunchMapError::Empty { name: name.into() });
    }
    for r in &ranks {
        cpulist::parse(&r.cpus).map_err(|e| LaunchMapError::Cpus {
            name: name.into(),
            rank: r.rank,
            cpus: r.cpus.clone(),
            problem: e.to_string(),
        })?;
    }
    ranks.sort_by_key(|r| r.rank);
    if let Some(w) = ranks.windows(2).find(|w| w[0].rank == w[1].rank) {
        return Err(LaunchMapError::Duplicate {
            name: name.into(),
            rank: w[0].rank,
        });
    }
    Ok(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_lines_give_the_same_ranks() {
        let lines = "# rank device cpus\n1 1 4-7\n0 0 0-3  # first\n";
        let json = r#"[{"rank": 0, "device": "0", "cpus": "0-3"}, {"rank": 1, "device": "1", "cpus": "4-7"}]"#;
        let object = format!("{{\"ranks\": {json}}}");
        let a = parse("m", lines).unwrap();
        assert_eq!(a, parse("m", json).unwrap());
        assert_eq!(a, parse("m", &object).unwrap());
        assert_eq!(a[0].cpus, "0-3");
    }

    #[test]
    fn bad_maps_say_where() {
        let e = parse("m", "0 0\n").unwrap_err().to_string();
        assert!(e.contains("m:1") && e.contains("2 fields"), "{e}");
        let e = parse("m", "0 0 0-x\n").unwrap_err().to_string();
        assert!(e.contains("rank 0"), "{e}");
        let e = parse("m", "0 0 1\n0 1 2\n").unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        assert!(parse("m", "# nothing\n").is_err());
        assert!(parse("m", "[{\"rank\": 0}]").is_err());
    }
}
