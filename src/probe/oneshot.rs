//! The one-shot measurement loop behind `chd probe`: every sample slot of a run is measured
//! once, pass by pass, each pass in a fresh random order (so an order artefact cannot repeat
//! in the same place), on one dedicated thread that the measure function binds to each
//! cell's CPU. Slots already measured (a resumed run) are skipped; a stop flag (Ctrl-C) is
//! checked between cells, so the cell in flight always completes and is recorded.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use rand::seq::SliceRandom;

use crate::format::run_dir::{RunPlan, SampleRecord, SlotId};
use crate::runtime::{stream_latch, ProbeError};
use crate::store::unix_now;

/// The slots of `load` still to measure, in measuring order: pass by pass, each pass
/// shuffled. A plan that names no valid slot is an error naming the field.
pub fn schedule(
    plan: &RunPlan,
    load: &str,
    done: &BTreeSet<SlotId>,
) -> Result<Vec<SlotId>, String> {
    let mut rng = rand::rng();
    let mut order = Vec::new();
    for pass in 0..plan.repeats {
        let mut slots: Vec<SlotId> = super::kinds::pass_slots(plan, load, pass)?
            .into_iter()
            .filter(|s| !done.contains(s))
            .collect();
        slots.shuffle(&mut rng);
        order.extend(slots);
    }
    Ok(order)
}

/// How a call to [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Slots measured (successfully or not) and handed to the sink.
    pub measured: usize,
    /// Whether the stop flag or the sink ended it before every slot was measured.
    pub stopped: bool,
}

/// Measure `slots` in order on a dedicated thread. `measure` runs on that thread and binds it
/// as the cell requires; `sink` gets every record as soon as it is measured and returns
/// `false` to stop (e.g. the output file cannot be written).
pub fn run(
    slots: &[SlotId],
    stop: &AtomicBool,
    measure: &(dyn Fn(&SlotId) -> Result<f64, ProbeError> + Sync),
    sink: &mut (dyn FnMut(SampleRecord) -> bool + Send),
) -> Outcome {
    let mut outcome = Outcome {
        measured: 0,
        stopped: false,
    };
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("chd-oneshot".into())
            .spawn_scoped(scope, || {
                let mut out = Outcome {
                    measured: 0,
                    stopped: false,
                };
                for slot in slots {
                    if stop.load(Ordering::SeqCst) {
                        out.stopped = true;
                        break;
                    }
                    // The timing method the cell's timed region used (event-timed cells).
                    let _ = stream_latch::take_last_method();
                    let result = measure(slot);
                    let timing = stream_latch::take_last_method()
                        .filter(|_| result.is_ok())
                        .map(|m| m.as_str().to_string());
                    let record = SampleRecord {
                        slot: slot.clone(),
                        timing,
                        bytes_per_second: result.as_ref().ok().copied(),
                        reason: result.as_ref().err().map(|e| e.reason().to_string()),
                        error: result.err().map(|e| e.to_string()),
                        at: unix_now(),
                    };
                    out.measured += 1;
                    if !sink(record) {
                        out.stopped = true;
                        break;
                    }
                }
                out
            });
        match worker {
            Ok(handle) => match handle.join() {
                Ok(out) => outcome = out,
                Err(_) => {
                    tracing::error!("the probe thread panicked");
                    outcome.stopped = true;
                }
            },
            Err(e) => {
                tracing::error!("cannot start the probe thread: {e}");
                outcome.stopped = true;
            }
        }
    });
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::run_dir::MatrixKind;

    fn plan() -> RunPlan {
        RunPlan {
            probe: MatrixKind::H2d,
            cpus: vec![0, 1, 2],
            devices: vec!["a".into(), "b".into()],
            pairs: vec![],
            sizes_bytes: vec![1],
            directions: vec!["h2d".into()],
            host_memories: vec!["pageable".into()],
            warmup: 0,
            iterations: 1,
            repeats: 2,
            loads: vec!["idle".into()],
            ..RunPlan::empty(MatrixKind::H2d)
        }
    }

    #[test]
    fn schedule_skips_done_slots_and_keeps_passes_in_order() {
        let p = plan();
        let done: BTreeSet<SlotId> = crate::probe::kinds::pass_slots(&p, "idle", 0)
            .unwrap()
            .into_iter()
            .take(4)
            .collect();
        let order = schedule(&p, "idle", &done).unwrap();
        assert_eq!(order.len(), 12 - 4);
        assert!(order.iter().all(|s| !done.contains(s)));
        let passes: Vec<u32> = order.iter().map(|s| s.pass).collect();
        let mut sorted = passes.clone();
        sorted.sort_unstable();
        assert_eq!(passes, sorted, "pass 0 must finish before pass 1 starts");
    }

    #[test]
    fn stop_flag_ends_between_cells_and_failures_are_recorded() {
        let p = plan();
        let slots = schedule(&p, "idle", &BTreeSet::new()).unwrap();
        let stop = AtomicBool::new(false);
        let mut got = Vec::new();
        let device = |s: &SlotId| s.record().device;
        let measure = |s: &SlotId| {
            if device(s) == "b" {
                Err(ProbeError::Copy("planted".into()))
            } else {
                Ok(1e9)
            }
        };
        let outcome = run(&slots, &stop, &measure, &mut |r| {
            got.push(r);
            if got.len() == 5 {
                stop.store(true, Ordering::SeqCst);
            }
            true
        });
        assert_eq!(
            outcome,
            Outcome {
                measured: 5,
                stopped: true
            }
        );
        assert_eq!(got.len(), 5);
        for r in &got {
            if device(&r.slot) == "b" {
                assert_eq!(r.reason.as_deref(), Some("copy"));
                assert!(r.bytes_per_second.is_none());
            } else {
                assert_eq!(r.bytes_per_second, Some(1e9));
            }
        }
    }
}
