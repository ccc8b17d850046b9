//! What a probe kind is: each kind of measurement chd makes in one-shot runs (`chd probe h2d`,
//! `pair`, `d2d`, `p2p`, `sweep`, `basics`) is one module of `probe` with one [`ProbeKind`]
//! value, listed once in `super::kinds::KINDS`, as `collect::COLLECTORS` lists the
//! collectors. What every kind has to say about a plan (its slots, how many, what the run
//! measures in words, the flags that set each plan field, what its report's header lists) is
//! asked through the trait; no code outside a kind's module matches on the kind for it.

use super::plan::FlagNames;
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::SlotId;

/// One kind of one-shot measurement.
pub trait ProbeKind: Sync {
    /// The kind: the subcommand, run.json's `probe`, the `matrix` of its slots.
    fn kind(&self) -> MatrixKind;

    /// Every slot of one pass under one load profile, in a canonical order. A plan whose
    /// fields name no valid slot (a damaged run.json) is an error naming the field.
    fn pass_slots(&self, plan: &RunPlan, load: &str, pass: u32) -> Result<Vec<SlotId>, String>;

    /// Slots per pass, counted without building them (saturating: `usize::MAX` for a plan of
    /// more, a run.json no run could finish).
    fn cells_per_pass(&self, plan: &RunPlan) -> usize;

    /// What a run of `plan` measures, for the line `measuring N cells x ... {shape}`.
    fn shape(&self, plan: &RunPlan) -> String;

    /// What one sample times: `copies`, `operations per rank`, ...
    fn per_sample(&self) -> &'static str;

    /// The flags that set each plan field (for "--sizes differ from the run being resumed").
    fn flag_names(&self) -> FlagNames;

    /// The report header's facts of this kind's plan (`devices`, `pairs`, ...), after the
    /// CPUs and before the sizes.
    fn plan_facts(&self, plan: &RunPlan) -> Vec<(String, String)>;

    /// The header's name of `plan.directions`.
    fn directions_fact(&self) -> &'static str {
        "directions"
    }

    /// Whether the kind's cells cross a host-to-device link (the report reads each device's
    /// PCIe link right after its first such copies).
    fn copies_over_link(&self) -> bool {
        false
    }

    /// Whether a point the backend cannot measure at all (`unsupported`) is said and
    /// skipped, rather than failing the run like any failed cell (a sweep's or the basics
    /// table's operation the backend lacks; a matrix's refused cell still fails it).
    fn skips_unsupported(&self) -> bool {
        false
    }

    /// Where summary.md lists this kind's failed cells.
    fn failures_in(&self) -> &'static str {
        "\"Failed cells\" in summary.md"
    }
}

/// The plan's devices as typed ids, or the error naming the bad one.
pub(crate) fn device_ids(plan: &RunPlan) -> Result<Vec<crate::vocab::DeviceId>, String> {
    plan.devices
        .iter()
        .map(|d| d.parse().map_err(|e| format!("devices: {e}")))
        .collect()
}

/// The plan's host memory kinds as typed values, or the error naming the bad one.
pub(crate) fn host_memories(plan: &RunPlan) -> Result<Vec<crate::vocab::HostMemory>, String> {
    plan.host_memories
        .iter()
        .map(|m| m.parse().map_err(|e| format!("host_memories: {e}")))
        .collect()
}
