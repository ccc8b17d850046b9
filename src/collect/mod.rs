//! Scrape-time collectors, one file each in the node_exporter manner: [`rdma`] (HCA ports
//! and their counters), [`numa`] (per-node numastat and meminfo), [`netdev`]
//! (`/proc/net/dev` for the netdevs behind RDMA ports, or all), [`pcie`] (link width and
//! speed, AER totals of the accelerators and HCAs) and [`device`] (accelerator utilization
//! and memory), [`fabric`] (what `chd probe fabric` left in the state directory). [`COLLECTORS`] lists them; [`registry`] derives flags, config keys, defaults
//! and construction from that table, so adding a collector is its file, its `pub mod` line
//! and its row.
//!
//! A [`CollectorSet`] holds the enabled collectors and is a prometheus-client
//! [`Collector`]: each scrape runs every collector in turn, times it, and emits the samples
//! it produced followed by three families with one row per collector:
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `chd_collector_success{collector}` | gauge | 1 if the collector ran to the end, 0 if it failed (its one source could not be listed or read) or panicked |
//! | `chd_collector_duration_seconds{collector}` | gauge | wall time of this scrape's run |
//! | `chd_collector_read_errors_total{collector}` | counter | values that could not be read or parsed, cumulative over the life of the set |
//!
//! Rules every collector follows:
//! - Every value is read on its own ([`Sink::read`]). A file that is missing, empty,
//!   `N/A (no PMA)`, not a number, or whose read fails (EINVAL, EISDIR, a dangling link)
//!   costs that one series and counts one read error; the collector carries on and still
//!   succeeds. Only a failure to reach a collector's one source (listing
//!   `/sys/class/infiniband` fails with something other than "not found", `/proc/net/dev`
//!   cannot be read) makes it fail, and even then the scrape itself succeeds.
//! - Hardware absent is quiet: no `/sys/class/infiniband`, no `devices/system/node`, no
//!   `counters/` on an irdma port, no `aer_dev_*` files (kernel without AER, or no AER
//!   capability) are successes with fewer samples and no read errors.
//! - Counters are exported as read, never smoothed: one that goes backwards (a driver reset,
//!   a 32-bit PMA counter wrapping) is exported as the smaller value and Prometheus'
//!   `rate()` treats it as a counter reset.
//! - A metric family belongs to exactly one collector (the text format allows each family
//!   once per scrape).
//! - Samples are built in a [`Sink`]: the collector passes the contract names from
//!   METRICS.md, counters with their `_total`; the encoder drops the suffix because
//!   prometheus-client appends it to counters.

pub mod device;
pub mod fabric;
pub mod netdev;
pub mod numa;
pub mod pcie;
pub mod rdma;
pub mod read;
pub mod registry;

use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use regex::Regex;

pub use read::{ParseError, ReadError};
pub use registry::{
    build, build_set, BuildContext, CollectorSettings, CollectorSpec, OptionField, OptionSpec,
    PciDeviceRef,
};

/// The collector table, in the order a scrape runs them. One row per collector file.
pub const COLLECTORS: &[CollectorSpec] = &[
    rdma::SPEC,
    numa::SPEC,
    netdev::SPEC,
    pcie::SPEC,
    device::SPEC,
    fabric::SPEC,
];

/// One scrape-time collector: reads its sources and adds samples to `out`.
pub trait SysCollector: fmt::Debug + Send + Sync {
    /// The value of the `collector` label (`rdma`, `numa`, ...).
    fn name(&self) -> &'static str;
    /// Read the sources and add samples to `out`. Per-value problems go to
    /// [`Sink::read_error`]; an `Err` means the collector could not do its job at all.
    fn collect(&self, out: &mut Sink) -> Result<(), CollectError>;
}

/// Why a collector failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("cannot list {path}: {source}")]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// A sample value: integers stay exact (a counter at `u64::MAX` is exported as such).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(u64),
    Float(f64),
}

impl From<u64> for Number {
    fn from(v: u64) -> Self {
        Number::Int(v)
    }
}

impl From<u32> for Number {
    fn from(v: u32) -> Self {
        Number::Int(v.into())
    }
}

impl From<f64> for Number {
    fn from(v: f64) -> Self {
        Number::Float(v)
    }
}

impl Number {
    /// `v` as an integer when it is one (exactly representable), else as a float: a rate
    /// of 2.5e10 bytes/s is written `25000000000`, not `25000000000.0`.
    pub fn exact(v: f64) -> Number {
        if v >= 0.0 && v.fract() == 0.0 && v < 9_007_199_254_740_992.0 {
            Number::Int(v as u64)
        } else {
            Number::Float(v)
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(v) => v as f64,
            Number::Float(v) => v,
        }
    }
}

/// Gauge or counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

/// One metric family a collector produced: a name (counters with `_total`), help, type,
/// label names and rows.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub label_names: Vec<&'static str>,
    /// Label values of all rows, `label_names.len()` per row.
    values: Vec<String>,
    numbers: Vec<Number>,
}

impl Family {
    /// The rows: `(label name, value)` pairs and the sample value.
    pub fn samples(&self) -> impl Iterator<Item = (Vec<(&'static str, &str)>, Number)> + '_ {
        let width = self.label_names.len();
        self.numbers.iter().enumerate().map(move |(i, n)| {
            let values = &self.values[i * width..(i + 1) * width];
            let labels = self
                .label_names
                .iter()
                .copied()
                .zip(values.iter().map(String::as_str))
                .collect();
            (labels, *n)
        })
    }

    pub fn len(&self) -> usize {
        self.numbers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }
}

/// Where a collector puts its samples and counts its read errors during one scrape.
#[derive(Debug, Default)]
pub struct Sink {
    families: Vec<Family>,
    read_errors: u64,
}

impl Sink {
    /// Add a gauge sample.
    pub fn gauge<const N: usize>(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: [(&'static str, &str); N],
        value: impl Into<Number>,
    ) {
        self.push(name, help, Kind::Gauge, &labels, value.into());
    }

    /// Add a counter sample; `name` is the contract name, ending in `_total`.
    pub fn counter<const N: usize>(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: [(&'static str, &str); N],
        value: impl Into<Number>,
    ) {
        debug_assert!(name.ends_with("_total"), "counter {name} without _total");
        self.push(name, help, Kind::Counter, &labels, value.into());
    }

    fn push(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &[(&'static str, &str)],
        value: Number,
    ) {
        // Families are few (at most a dozen per collector) and usually the last one is hit.
        let family = match self.families.iter().rposition(|f| f.name == name) {
            Some(i) => &mut self.families[i],
            None => {
                self.families.push(Family {
                    name,
                    help,
                    kind,
                    label_names: labels.iter().map(|(k, _)| *k).collect(),
                    values: Vec::new(),
                    numbers: Vec::new(),
                });
                let last = self.families.len() - 1;
                &mut self.families[last]
            }
        };
        debug_assert!(
            family.kind == kind
                && family.label_names.len() == labels.len()
                && family
                    .label_names
                    .iter()
                    .zip(labels)
                    .all(|(a, (b, _))| a == b),
            "{name}: inconsistent type or label names"
        );
        family
            .values
            .extend(labels.iter().map(|(_, v)| (*v).to_owned()));
        family.numbers.push(value);
    }

    /// Read one value: `Some` when `path` could be read and parsed, else `None` and one
    /// read error counted.
    pub fn read<T>(
        &mut self,
        path: &Path,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Option<T> {
        self.accept(read::read_value(path, parse))
    }

    /// The value of a read, counting the error if there was one.
    pub fn accept<T>(&mut self, result: Result<T, ReadError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.read_error(&e);
                None
            }
        }
    }

    /// The names in `dir` ([`read::list_dir`]); empty when it does not exist (quietly) or
    /// cannot be listed (one read error).
    pub fn list(&mut self, dir: &Path) -> Vec<String> {
        match read::list_dir(dir) {
            Ok(names) => names.unwrap_or_default(),
            Err(source) => {
                self.read_error(&ReadError::Io {
                    path: dir.to_path_buf(),
                    source,
                });
                Vec::new()
            }
        }
    }

    /// Count one value that could not be read.
    pub fn read_error(&mut self, error: &ReadError) {
        tracing::debug!(error = %error, "scrape-time read error");
        self.read_errors += 1;
    }

    /// Count one value of a multi-value file (`path`) that could not be parsed.
    pub fn parse_error(&mut self, path: &Path, source: ParseError) {
        self.read_error(&ReadError::Parse {
            path: path.to_path_buf(),
            source,
        });
    }

    /// Read errors of this run.
    pub fn read_errors(&self) -> u64 {
        self.read_errors
    }

    /// The families produced, in the order of their first sample.
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// The family called `name`, if any sample of it was added.
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }
}

/// Which names a collector covers: included when `include` matches (or is unset) and
/// `exclude` does not. Matching is a search, unanchored, as node_exporter's
/// `--collector.*.device-include`; anchor the pattern (`^mlx5_[01]$`) to match whole names.
#[derive(Debug, Clone, Default)]
pub struct NameFilter {
    pub include: Option<Regex>,
    pub exclude: Option<Regex>,
}

impl NameFilter {
    pub fn new(include: Option<Regex>, exclude: Option<Regex>) -> NameFilter {
        NameFilter { include, exclude }
    }

    pub fn allows(&self, name: &str) -> bool {
        self.include.as_ref().is_none_or(|r| r.is_match(name))
            && !self.exclude.as_ref().is_some_and(|r| r.is_match(name))
    }
}

#[derive(Debug)]
struct Entry {
    collector: Box<dyn SysCollector>,
    read_errors: AtomicU64,
}

/// The result of running one collector.
#[derive(Debug)]
pub struct Outcome {
    pub collector: &'static str,
    pub success: bool,
    pub duration: Duration,
    pub sink: Sink,
    /// Read errors of this collector over the life of the set, this run included.
    pub read_errors_total: u64,
}

/// The enabled collectors; a prometheus-client [`Collector`] that runs them at each scrape.
#[derive(Debug, Default)]
pub struct CollectorSet {
    entries: Vec<Entry>,
}

impl CollectorSet {
    pub fn new() -> CollectorSet {
        CollectorSet::default()
    }

    /// Add a collector (for example a device-telemetry collector from a runtime backend).
    pub fn push(&mut self, collector: Box<dyn SysCollector>) {
        self.entries.push(Entry {
            collector,
            read_errors: AtomicU64::new(0),
        });
    }

    /// Names of the collectors, in run order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.collector.name()).collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Run every collector once.
    pub fn run(&self) -> Vec<Outcome> {
        self.entries.iter().map(run_one).collect()
    }
}

fn run_one(entry: &Entry) -> Outcome {
    let name = entry.collector.name();
    let mut sink = Sink::default();
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| entry.collector.collect(&mut sink)));
    let duration = started.elapsed();
    let success = match result {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(collector = name, error = %e, "collector failed");
            false
        }
        Err(_) => {
            tracing::error!(collector = name, "collector panicked");
            false
        }
    };
    let read_errors_total = entry
        .read_errors
        .fetch_add(sink.read_errors, Ordering::Relaxed)
        + sink.read_errors;
    Outcome {
        collector: name,
        success,
        duration,
        sink,
        read_errors_total,
    }
}

/// A row's labels: the family's names zipped with this row's values.
struct Row<'a> {
    names: &'a [&'static str],
    values: &'a [String],
}

impl EncodeLabelSet for Row<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        for (name, value) in self.names.iter().zip(self.values) {
            EncodeLabel::encode(&(*name, value.as_str()), encoder.encode_label())?;
        }
        Ok(())
    }
}

fn metric_type(kind: Kind) -> MetricType {
    match kind {
        Kind::Gauge => MetricType::Gauge,
        Kind::Counter => MetricType::Counter,
    }
}

fn encode_value(metric: &mut MetricEncoder, kind: Kind, value: Number) -> fmt::Result {
    match (kind, value) {
        (Kind::Gauge, Number::Int(v)) => metric.encode_gauge(&v),
        (Kind::Gauge, Number::Float(v)) => metric.encode_gauge(&v),
        (Kind::Counter, Number::Int(v)) => metric.encode_counter::<NoLabelSet, _, u64>(&v, None),
        (Kind::Counter, Number::Float(v)) => metric.encode_counter::<NoLabelSet, _, u64>(&v, None),
    }
}

fn encode_family(enc: &mut DescriptorEncoder, family: &Family) -> fmt::Result {
    if family.is_empty() {
        return Ok(());
    }
    // prometheus-client appends `_total` to counters.
    let name = match family.kind {
        Kind::Counter => family.name.strip_suffix("_total").unwrap_or(family.name),
        Kind::Gauge => family.name,
    };
    let mut metric = enc.encode_descriptor(name, family.help, None, metric_type(family.kind))?;
    let width = family.label_names.len();
    for (i, value) in family.numbers.iter().enumerate() {
        let row = Row {
            names: &family.label_names,
            values: &family.values[i * width..(i + 1) * width],
        };
        encode_value(&mut metric.encode_family(&row)?, family.kind, *value)?;
    }
    Ok(())
}

/// Encode the samples of `outcomes` and the per-collector health families.
pub fn encode_outcomes(outcomes: &[Outcome], enc: &mut DescriptorEncoder) -> fmt::Result {
    for outcome in outcomes {
        for family in outcome.sink.families() {
            encode_family(enc, family)?;
        }
    }
    if outcomes.is_empty() {
        return Ok(());
    }
    let mut health = Sink::default();
    for o in outcomes {
        let labels = [("collector", o.collector)];
        health.gauge(
            "chd_collector_success",
            "1 if the scrape-time collector ran to the end, 0 if it failed",
            labels,
            u64::from(o.success),
        );
        health.gauge(
            "chd_collector_duration_seconds",
            "Wall time of the scrape-time collector in this scrape",
            labels,
            o.duration.as_secs_f64(),
        );
        health.counter(
            "chd_collector_read_errors_total",
            "Values the scrape-time collector could not read or parse (each costs one series)",
            labels,
            o.read_errors_total,
        );
    }
    for family in health.families() {
        encode_family(enc, family)?;
    }
    Ok(())
}

impl Collector for CollectorSet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        encode_outcomes(&self.run(), &mut encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use std::sync::Arc;

    #[derive(Debug)]
    struct Fake {
        errors: u64,
        fail: bool,
        panic: bool,
    }

    impl SysCollector for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }

        fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
            out.gauge("chd_fake_value", "A value", [("x", "a\"b")], 1.5);
            out.counter("chd_fake_events_total", "Events", [("x", "1")], u64::MAX);
            for _ in 0..self.errors {
                out.parse_error(Path::new("f"), ParseError::Empty);
            }
            if self.panic {
                panic!("fake collector panics");
            }
            if self.fail {
                return Err(CollectError::List {
                    path: "d".into(),
                    source: io::Error::from_raw_os_error(libc::EACCES),
                });
            }
            Ok(())
        }
    }

    fn scrape(set: Arc<CollectorSet>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(set));
        // The text format /metrics serves by default, encoded as the exposition does.
        let mut body = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut body, &registry).unwrap();
        body
    }

    fn set(fake: Fake) -> Arc<CollectorSet> {
        let mut set = CollectorSet::new();
        set.push(Box::new(fake));
        Arc::new(set)
    }

    #[test]
    fn counters_get_total_once_and_errors_accumulate() {
        let s = set(Fake {
            errors: 2,
            fail: false,
            panic: false,
        });
        let text = scrape(s.clone());
        // Prometheus text 0.0.4 names counters with `_total` in TYPE too; never `_total_total`.
        assert!(
            text.contains("# TYPE chd_fake_events_total counter\n"),
            "{text}"
        );
        assert!(!text.contains("_total_total"), "{text}");
        assert!(
            text.contains("chd_fake_events_total{x=\"1\"} 18446744073709551615\n"),
            "{text}"
        );
        assert!(
            text.contains("chd_fake_value{x=\"a\\\"b\"} 1.5\n"),
            "{text}"
        );
        assert!(text.contains("chd_collector_success{collector=\"fake\"} 1\n"));
        assert!(text.contains("chd_collector_read_errors_total{collector=\"fake\"} 2\n"));
        assert!(text.contains("chd_collector_duration_seconds{collector=\"fake\"} "));
        let text = scrape(s);
        assert!(text.contains("chd_collector_read_errors_total{collector=\"fake\"} 4\n"));
    }

    #[test]
    fn failure_and_panic_are_success_zero_and_the_scrape_goes_on() {
        let text = scrape(set(Fake {
            errors: 0,
            fail: true,
            panic: false,
        }));
        assert!(text.contains("chd_collector_success{collector=\"fake\"} 0\n"));
        let text = scrape(set(Fake {
            errors: 1,
            fail: false,
            panic: true,
        }));
        assert!(text.contains("chd_collector_success{collector=\"fake\"} 0\n"));
        assert!(text.contains("chd_collector_read_errors_total{collector=\"fake\"} 1\n"));
    }

    #[test]
    fn sink_rows_and_exact_numbers() {
        let mut sink = Sink::default();
        sink.gauge("chd_x", "x", [("a", "1"), ("b", "2")], 3u64);
        sink.gauge("chd_x", "x", [("a", "4"), ("b", "5")], 6u64);
        let family = sink.family("chd_x").unwrap();
        let rows: Vec<_> = family.samples().collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1], (vec![("a", "4"), ("b", "5")], Number::Int(6)));
        assert_eq!(Number::exact(25e9), Number::Int(25_000_000_000));
        assert_eq!(Number::exact(0.5), Number::Float(0.5));
        assert_eq!(Number::exact(-1.0), Number::Float(-1.0));
        assert_eq!(Number::exact(1e300), Number::Float(1e300));
    }

    #[test]
    fn an_empty_set_encodes_nothing() {
        let text = scrape(Arc::new(CollectorSet::new()));
        assert!(!text.contains("chd_"), "{text}");
    }

    #[test]
    fn name_filter_is_an_unanchored_search() {
        let f = NameFilter::new(Regex::new("^mlx5_").ok(), Regex::new("_1$").ok());
        assert!(f.allows("mlx5_0"));
        assert!(!f.allows("mlx5_1"));
        assert!(f.allows("mlx5_10"));
        assert!(!f.allows("irdma0"));
        assert!(NameFilter::default().allows("anything"));
    }

    #[test]
    fn settings_switches() {
        use crate::topology::Roots;
        let mut s = CollectorSettings::default();
        assert_eq!(s.enabled("netdev"), Some(true));
        assert!(s.set_enabled("netdev", false));
        assert_eq!(s.enabled("netdev"), Some(false));
        assert!(!s.set_enabled("bogus", true));
        let roots = Roots::default();
        assert_eq!(build(&s, &roots, vec![]).names(), ["rdma", "numa", "pcie"]);
    }
}
