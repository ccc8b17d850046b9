//! The store's families (matrix, aggregates, pairs, affinity verdicts, info), encoded once per
//! store generation and format instead of at every scrape: the matrix only changes when a
//! probe records a cell, while a scrape comes every few seconds. A [`Snapshot`] holds the
//! text and, once a scrape has asked for gzip, its compressed form; the coverage
//! (`chd_probe_cells`), which depends on the clock, is counted at every scrape from the
//! snapshot's sorted measurement times (`CoverageView`).

use std::sync::{Arc, Mutex, OnceLock};

use hyper::body::Bytes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::content_coding::DeflatedPart;
use super::store_collector::{Coverage, StoreView};
use super::{encode, Format};
use crate::store::unix_now;

/// The store's families as of one store generation, in one format.
#[derive(Debug)]
pub struct Snapshot {
    generation: u64,
    /// The encoded families (UTF-8); in OpenMetrics it ends with the `# EOF` line, since a
    /// scrape puts this part last. Shared with the responses that send it.
    text: Bytes,
    coverage: Arc<Coverage>,
    gzip: OnceLock<DeflatedPart>,
}

impl Snapshot {
    /// The text, validated as UTF-8 again (a scrape sends [`Snapshot::bytes`]).
    #[cfg(test)]
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.text).expect("encoded metrics are UTF-8")
    }

    /// The text as bytes, sharing the snapshot's buffer.
    pub fn bytes(&self) -> Bytes {
        self.text.clone()
    }

    /// The text as the last part of a gzip member, compressed the first time it is asked for.
    pub fn gzip(&self) -> &DeflatedPart {
        self.gzip.get_or_init(|| DeflatedPart::last(&self.text))
    }
}

/// What one encoding of the store saw: its generation and its coverage, read under the same
/// read lock as the encoded families, so a snapshot's parts always agree.
type Seen = Mutex<Option<(u64, Arc<Coverage>)>>;

/// Encodes a [`StoreView`]'s families for a private registry (`Registry` owns its
/// collectors; this one shares the view with the cache) and leaves what it saw in `seen`.
#[derive(Debug)]
struct StorePart {
    view: Arc<StoreView>,
    seen: Arc<Seen>,
}

impl Collector for StorePart {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A copy, taken under the read lock and encoded after it is released: a probe
        // records each cell under the write lock, and would otherwise wait for a whole
        // analysis and encoding of the matrix after every cell while scrapes come in
        // (tests/load.rs counts how long the probe thread sleeps). The copy keeps the
        // generation, so the snapshot still names what it encoded.
        let store = self
            .view
            .store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let coverage = Arc::new(self.view.coverage(&store));
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((store.generation(), coverage));
        self.view.encode_store(&store, &mut encoder)
    }
}

/// The latest snapshot of each format.
#[derive(Debug)]
pub struct MatrixCache {
    view: Arc<StoreView>,
    part: Registry,
    seen: Arc<Seen>,
    /// Indexed by [`slot`].
    snapshots: Mutex<[Option<Arc<Snapshot>>; 2]>,
}

fn slot(format: Format) -> usize {
    match format {
        Format::Prometheus => 0,
        Format::OpenMetrics => 1,
    }
}

impl MatrixCache {
    pub fn new(view: StoreView) -> MatrixCache {
        let view = Arc::new(view);
        let seen = Arc::new(Seen::default());
        let mut part = Registry::default();
        part.register_collector(Box::new(StorePart {
            view: view.clone(),
            seen: seen.clone(),
        }));
        MatrixCache {
            view,
            part,
            seen,
            snapshots: Mutex::new([None, None]),
        }
    }

    /// The snapshot of the store as it is now, in `format`: the cached one while the store
    /// has not changed since it was encoded, else a new one. Scrapes that arrive while one
    /// is being encoded wait for it rather than encode it again.
    pub fn snapshot(&self, format: Format) -> Result<Arc<Snapshot>, std::fmt::Error> {
        let mut snapshots = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        let generation = self
            .view
            .store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .generation();
        if let Some(current) = snapshots[slot(format)]
            .as_ref()
            .filter(|s| s.generation == generation)
        {
            return Ok(current.clone());
        }
        let mut text = encode(&self.part, format)?;
        // `encode` sizes its buffer for growth; a snapshot keeps it for a window.
        text.shrink_to_fit();
        // What the encoding saw (a probe may have written since `generation` was read).
        let (generation, coverage) = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("the store part records what it encoded");
        let snapshot = Arc::new(Snapshot {
            generation,
            text: Bytes::from(text),
            coverage,
            gzip: OnceLock::new(),
        });
        snapshots[slot(format)] = Some(snapshot.clone());
        Ok(snapshot)
    }
}

/// `chd_probe_cells` of one snapshot, counted as of the scrape that sends it: a scrape
/// encodes it with the live families, from the same snapshot as the store's families, so
/// coverage and matrix in one scrape describe the same store.
#[derive(Debug)]
pub struct CoverageOf(pub Arc<Snapshot>);

impl Collector for CoverageOf {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.0.coverage.encode(unix_now(), &mut encoder)
    }
}
