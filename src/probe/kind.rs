//! What a probe kind is: each kind of measurement chd makes in one-shot runs (`chd probe h2d`,
//! `pair`, `d2d`, `p2p`, `sweep`, `basics`) is one module of `probe` with one [`ProbeKind`]
//! value, listed once in `super::kinds::KINDS`, as `collect::COLLECTORS` lists the
//! collectors. What every kind has to say about a plan (its slots, how many, what the run
//! measures in words, the flags that set each plan field, what its report's header lists) is
//! asked through the trait; no code outside a kind's module matches on the kind for it.

use super::plan::FlagNames;
use crate::format::run_dir::{MatrixKind, RunPlan};
use crate::format::slot::SlotId;

/// How a kind's cells are arranged for people: the shape the report, its pictures and CSVs,
/// `chd probe`'s stdout and a replay's store give them. Several kinds may share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// CPUs x devices, one matrix per size, direction, host memory and load: a heatmap, the
    /// column and segment analysis, the store's core x device family.
    CpuByDevice,
    /// Rank 0's CPUs x rank 1's CPUs, one matrix per device pair and size.
    CpuPairs,
    /// One value per device and size, each from one CPU: a table of devices.
    Devices,
    /// Source x destination devices (ordered pairs), with their path classes.
    SourceByDestination,
    /// Size curves, per operation and device.
    Curves,
    /// One table of measurements per device (the basic validation table).
    Table,
}

impl Layout {
    /// Whether the cells are grouped into matrices of CPUs or devices (heatmaps, cells.csv),
    /// rather than the curves or the table of their own sections.
    pub fn is_matrix(self) -> bool {
        !matches!(self, Layout::Curves | Layout::Table)
    }
}

/// What names one matrix of a run, for its title.
#[derive(Debug, Clone, Copy)]
pub struct MatrixFacts<'a> {
    pub size_bytes: u64,
    pub direction: &'a str,
    pub host_memory: &'a str,
    pub load: &'a str,
    /// The device pair of a pair matrix.
    pub pair: Option<&'a str>,
}

/// One kind of one-shot measurement.
pub trait ProbeKind: Sync {
    /// The kind: the subcommand, run.json's `probe`, the `matrix` of its slots.
    fn kind(&self) -> MatrixKind;

    /// How its cells are shown.
    fn layout(&self) -> Layout;

    /// A matrix's title in the report: `H2D 64MiB h2d, pinned memory, load idle`.
    fn matrix_title(&self, m: &MatrixFacts) -> String;

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

    /// The header's fact of how each pair was measured (`run.json`'s `pair_methods`), if any.
    fn methods_fact(
        &self,
        methods: &std::collections::BTreeMap<String, String>,
    ) -> Option<(String, String)> {
        if methods.is_empty() {
            return None;
        }
        let listed: Vec<String> = methods
            .iter()
            .map(|(pair, method)| format!("{pair}: {method}"))
            .collect();
        Some(("pair methods".into(), listed.join("; ")))
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
