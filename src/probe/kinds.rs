//! The probe-kind table: every [`ProbeKind`] once, and what callers ask of a plan through
//! its kind's row (its slots, how many there are).

use super::kind::ProbeKind;
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::SlotId;

/// Every probe kind, in the order `chd probe --help` lists them (each builds on the ones
/// before it).
pub static KINDS: [&dyn ProbeKind; 6] = [
    &super::h2d::KIND,
    &super::pairs::KIND,
    &super::d2d::KIND,
    &super::p2p::KIND,
    &super::sweep::KIND,
    &super::basics::KIND,
];

/// The table's entry of `kind`.
pub fn of(kind: MatrixKind) -> &'static dyn ProbeKind {
    KINDS
        .iter()
        .copied()
        .find(|k| k.kind() == kind)
        .expect("every MatrixKind has a row in probe::kinds::KINDS")
}

/// How `kind`'s cells are shown.
pub fn layout(kind: MatrixKind) -> super::kind::Layout {
    of(kind).layout()
}

/// Every slot of one pass of `plan` under `load`.
pub fn pass_slots(plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String> {
    of(plan.probe).pass_slots(plan, load, pass)
}

/// Slots per pass of `plan`.
pub fn cells_per_pass(plan: &RunPlan) -> usize {
    of(plan.probe).cells_per_pass(plan)
}

/// Every slot of the run (saturating, like [`ProbeKind::cells_per_pass`]).
pub fn total_slots(plan: &RunPlan) -> usize {
    cells_per_pass(plan)
        .saturating_mul(plan.repeats as usize)
        .saturating_mul(plan.loads.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_row() {
        let kinds = [
            MatrixKind::H2d,
            MatrixKind::Pair,
            MatrixKind::D2d,
            MatrixKind::P2p,
            MatrixKind::Sweep,
            MatrixKind::Basics,
        ];
        for (row, kind) in KINDS.iter().zip(kinds) {
            assert_eq!(row.kind(), kind);
            assert_eq!(of(kind).kind(), kind);
        }
        assert_eq!(KINDS.len(), kinds.len());
    }
}
