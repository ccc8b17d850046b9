//! The node's verdict held steady for schedulers: a cause ([`crate::analysis::verdict`]) is
//! named only after it was found in `confirm` windows in a row, and dropped only after it was
//! absent from `clear` windows in a row, so one noisy window neither drains a node nor
//! returns it. Windows that do not run (a busy node) are no evidence either way. The verdict
//! is shared with the exposition (`chd_node_verdict`) and written as a Node Feature Discovery
//! feature file ([`crate::format::nfd_features`]) at every tick, with an expiry, so labels of a
//! chd that died go away.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use super::background_write::BackgroundWrite;
use crate::analysis::verdict::Cause;
#[cfg(test)]
use crate::analysis::verdict::Level;
pub use crate::analysis::verdict::NodeVerdict;
use crate::format::nfd_features;

/// Shared between the prober (writer) and the exposition (reader).
pub type SharedVerdict = Arc<RwLock<NodeVerdict>>;

#[derive(Debug)]
struct Tracked {
    cause: Cause,
    /// Windows in a row it was found in.
    seen: u32,
    /// Windows in a row it was absent from (once named).
    absent: u32,
    named: bool,
}

/// The hysteresis of the verdict.
#[derive(Debug)]
pub struct VerdictTracker {
    confirm: u32,
    clear: u32,
    tracked: BTreeMap<String, Tracked>,
    /// Windows observed since start.
    windows: u32,
}

impl VerdictTracker {
    /// `confirm` and `clear` are at least 1.
    pub fn new(confirm: u32, clear: u32) -> VerdictTracker {
        VerdictTracker {
            confirm: confirm.max(1),
            clear: clear.max(1),
            tracked: BTreeMap::new(),
            windows: 0,
        }
    }

    /// Past the first `confirm` windows: before, the verdict is still settling from the
    /// `ok` every start begins with (a node failed before a restart is named failed again
    /// only at its `confirm`-th window), so its changes are not counted as changes.
    pub fn settled(&self) -> bool {
        self.windows > self.confirm
    }

    /// One window's causes; returns the causes named now, worst first.
    pub fn observe(&mut self, found: Vec<Cause>) -> Vec<Cause> {
        self.windows = self.windows.saturating_add(1);
        let mut found: BTreeMap<String, Cause> =
            found.into_iter().map(|c| (c.id.clone(), c)).collect();
        self.tracked.retain(|id, t| match found.remove(id) {
            Some(cause) => {
                t.cause = cause;
                t.seen += 1;
                t.absent = 0;
                true
            }
            None => {
                t.seen = 0;
                t.absent += 1;
                t.named && t.absent < self.clear
            }
        });
        for (id, cause) in found {
            self.tracked.insert(
                id,
                Tracked {
                    cause,
                    seen: 1,
                    absent: 0,
                    named: false,
                },
            );
        }
        for t in self.tracked.values_mut() {
            t.named |= t.seen >= self.confirm;
        }
        let mut named: Vec<Cause> = self
            .tracked
            .values()
            .filter(|t| t.named)
            .map(|t| t.cause.clone())
            .collect();
        named.sort_by(|a, b| b.level.cmp(&a.level).then_with(|| a.id.cmp(&b.id)));
        named
    }
}

/// `next` (this window's verdict) as the held one after `held`: its changes carried over,
/// and one more when the level changed once `settled` (see [`VerdictTracker::settled`]).
pub fn hold(
    held: &NodeVerdict,
    mut next: NodeVerdict,
    settled: bool,
    at: SystemTime,
) -> NodeVerdict {
    next.changes = held.changes.clone();
    if settled {
        next.changes.record(held.level, next.level, at);
    }
    next
}

/// Where and how the verdict is published as NFD labels.
#[derive(Debug, Clone)]
pub struct NfdFile {
    pub path: PathBuf,
    /// How long the labels stay valid without a new write.
    pub valid_for: Duration,
}

impl NfdFile {
    /// Write `verdict`'s labels, valid until now + `valid_for`.
    pub fn write(&self, verdict: &NodeVerdict) -> Result<(), nfd_features::NfdError> {
        let expires = SystemTime::now() + self.valid_for;
        let text = nfd_features::render(
            &verdict.nfd_labels(),
            &humantime::format_rfc3339_seconds(expires).to_string(),
            "Written by chd serve (its node verdict); chd rewrites it at every scheduler tick.\n\
             NFD drops these labels after the expiry time if chd stops.",
        )?;
        nfd_features::write(&self.path, &text)
    }
}

/// Writes an [`NfdFile`] off the scheduler's thread ([`super::background_write`]): a write
/// that blocks costs the ticks it overlaps their labels, never a window. A failure is logged
/// once until the next success.
pub struct NfdPublisher {
    file: Arc<NfdFile>,
    write: BackgroundWrite,
    failing: Arc<AtomicBool>,
}

impl NfdPublisher {
    pub fn new(file: NfdFile) -> NfdPublisher {
        NfdPublisher {
            file: Arc::new(file),
            write: BackgroundWrite::new("NFD feature file write"),
            failing: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Start writing `verdict`'s labels; returns at once.
    pub fn publish(&mut self, verdict: NodeVerdict) {
        let (file, failing) = (self.file.clone(), self.failing.clone());
        self.write.start(move || match file.write(&verdict) {
            Ok(()) => {
                if failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("NFD feature file {} written again", file.path.display());
                }
            }
            Err(e) => {
                if !failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!("cannot write the NFD feature file: {e}");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(id: &str, level: Level, device: Option<&str>) -> Cause {
        Cause {
            id: id.into(),
            level,
            text: format!("{id} text"),
            device: device.map(str::to_string),
        }
    }

    fn ids(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn a_cause_is_named_after_two_windows_and_dropped_after_three_absent() {
        let mut t = VerdictTracker::new(2, 3);
        let slow = || vec![cause("slow_device:0", Level::Failed, Some("0"))];
        assert_eq!(ids(&t.observe(slow())), Vec::<&str>::new(), "one window");
        assert_eq!(ids(&t.observe(slow())), ["slow_device:0"], "confirmed");
        assert_eq!(ids(&t.observe(vec![])), ["slow_device:0"], "absent 1");
        assert_eq!(ids(&t.observe(vec![])), ["slow_device:0"], "absent 2");
        assert_eq!(ids(&t.observe(vec![])), Vec::<&str>::new(), "cleared");
    }

    #[test]
    fn a_flapping_finding_is_never_named_and_a_named_one_survives_a_blip() {
        let mut t = VerdictTracker::new(2, 3);
        let link = || vec![cause("link_degraded:1", Level::Degraded, Some("1"))];
        for _ in 0..5 {
            assert!(t.observe(link()).is_empty());
            assert!(t.observe(vec![]).is_empty());
        }
        t.observe(link());
        assert_eq!(ids(&t.observe(link())), ["link_degraded:1"]);
        assert_eq!(ids(&t.observe(vec![])), ["link_degraded:1"]);
        // Back before it cleared: still named, and its absence count starts over.
        assert_eq!(ids(&t.observe(link())), ["link_degraded:1"]);
        t.observe(vec![]);
        t.observe(vec![]);
        assert_eq!(ids(&t.observe(link())), ["link_degraded:1"]);
    }

    #[test]
    fn changes_count_from_the_settled_verdict_on() {
        let mut t = VerdictTracker::new(2, 3);
        let slow = || vec![cause("slow_device:0", Level::Failed, Some("0"))];
        let at = SystemTime::UNIX_EPOCH;
        let mut held = NodeVerdict::default();
        let step = |t: &mut VerdictTracker, held: &mut NodeVerdict, found: Vec<Cause>| {
            let named = t.observe(found);
            *held = hold(
                held,
                NodeVerdict::immediate(named, BTreeMap::new()),
                t.settled(),
                at,
            );
            held.level
        };
        // Failed since before a restart: named at window 2, not a change.
        assert_eq!(step(&mut t, &mut held, slow()), Level::Ok);
        assert_eq!(step(&mut t, &mut held, slow()), Level::Failed);
        assert!(held.changes.counts.is_empty());
        // Recovers (after three clear windows), fails again (after two).
        for _ in 0..3 {
            step(&mut t, &mut held, vec![]);
        }
        assert_eq!(held.level, Level::Ok);
        step(&mut t, &mut held, slow());
        step(&mut t, &mut held, slow());
        assert_eq!(held.level, Level::Failed);
        assert_eq!(held.changes.count(Level::Failed, Level::Ok), 1);
        assert_eq!(held.changes.count(Level::Ok, Level::Failed), 1);
        assert_eq!(held.changes.last, Some(at));
    }

    #[test]
    fn labels_follow_the_named_causes() {
        let verdict = NodeVerdict::immediate(
            vec![
                cause("slow_device:3", Level::Failed, Some("3")),
                cause("slow_device:0", Level::Failed, Some("0")),
                cause("link_degraded:1", Level::Degraded, Some("1")),
                cause("unbindable_cpus", Level::Degraded, None),
            ],
            BTreeMap::from([("0".to_string(), 1), ("1".to_string(), 0)]),
        );
        assert_eq!(verdict.level, Level::Failed);
        let labels = verdict.nfd_labels();
        let want: Vec<(String, String)> = [
            ("verdict", "failed"),
            ("slow-devices", "0_3"),
            ("degraded-devices", "1"),
            ("best-numa-0", "1"),
            ("best-numa-1", "0"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(labels, want);
        let ok = NodeVerdict::default();
        assert_eq!(ok.nfd_labels(), [("verdict".to_string(), "ok".to_string())]);
        assert_eq!(ok.line(), "ok");
    }

    #[test]
    fn the_feature_file_carries_an_expiry_and_the_labels() {
        let dir = tempfile::tempdir().unwrap();
        let file = NfdFile {
            path: dir.path().join("chd"),
            valid_for: Duration::from_secs(600),
        };
        let verdict = NodeVerdict::immediate(
            vec![cause("link_degraded:1", Level::Degraded, Some("1"))],
            BTreeMap::new(),
        );
        file.write(&verdict).unwrap();
        let text = std::fs::read_to_string(dir.path().join("chd")).unwrap();
        let expiry = text
            .lines()
            .find_map(|l| l.strip_prefix("# +expiry-time="))
            .unwrap();
        let at = humantime::parse_rfc3339(expiry).unwrap();
        let ahead = at.duration_since(SystemTime::now()).unwrap();
        assert!(ahead > Duration::from_secs(590) && ahead <= Duration::from_secs(600));
        assert!(text.ends_with(
            "chd.feature.node.kubernetes.io/verdict=degraded\n\
             chd.feature.node.kubernetes.io/degraded-devices=1\n"
        ));
    }
}
