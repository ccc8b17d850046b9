//! One `/metrics` scrape: the families encoded at every scrape (probe counters, HTTP
//! counters, scrape-time collectors, coverage) followed by the store's families from the
//! [`MatrixCache`], in the negotiated format and content coding. In gzip, only the first
//! part is compressed per scrape; the store's part is compressed once per snapshot.

use std::sync::Arc;

use hyper::body::Bytes;
use prometheus_client::registry::Registry;

use super::content_coding::{gzip_member, Acceptable, Coding, DeflatedPart};
use super::matrix_cache::{CoverageOf, MatrixCache, Snapshot};
use super::store_collector::StoreView;
use super::{encode, encode_leading, Format};

/// What `/metrics` serves.
#[derive(Debug)]
pub struct Exposition {
    /// Encoded at every scrape.
    live: Registry,
    matrix: Option<Arc<MatrixCache>>,
}

/// A scrape's body in its coding, as the chunks it is sent in (the cached part is shared
/// with the snapshot, not copied).
#[derive(Debug)]
pub struct Scrape {
    pub body: Vec<Bytes>,
    pub coding: Coding,
}

impl Scrape {
    /// The body in one buffer.
    pub fn concat(&self) -> Vec<u8> {
        self.body.concat()
    }
}

impl Exposition {
    /// Only `live`, encoded at every scrape.
    pub fn new(live: Registry) -> Exposition {
        Exposition { live, matrix: None }
    }

    /// `live` and the families of `view`, whose store part is cached per store generation
    /// (its coverage is encoded with `live`, from the same snapshot).
    pub fn with_store(live: Registry, view: StoreView) -> Exposition {
        Exposition {
            live,
            matrix: Some(Arc::new(MatrixCache::new(view))),
        }
    }

    /// The families encoded at every scrape: `live`, then `snapshot`'s coverage as of now.
    fn encode_live(
        &self,
        snapshot: &Arc<Snapshot>,
        format: Format,
    ) -> Result<String, std::fmt::Error> {
        let mut text = encode_leading(&self.live, format)?;
        let mut coverage = Registry::default();
        coverage.register_collector(Box::new(CoverageOf(snapshot.clone())));
        text.push_str(&encode_leading(&coverage, format)?);
        Ok(text)
    }

    /// The whole exposition in the coding `accept` prefers, `None` when it accepts neither
    /// gzip nor identity.
    pub fn scrape(
        &self,
        format: Format,
        accept: Acceptable,
    ) -> Result<Option<Scrape>, std::fmt::Error> {
        let Some(matrix) = &self.matrix else {
            let text = encode(&self.live, format)?;
            return Ok(accept.choose(text.len()).map(|coding| Scrape {
                body: vec![match coding {
                    Coding::Gzip => gzip_member(&[&DeflatedPart::last(text.as_bytes())]).into(),
                    Coding::Identity => text.into(),
                }],
                coding,
            }));
        };
        let snapshot = matrix.snapshot(format)?;
        let live = self.encode_live(&snapshot, format)?;
        let Some(coding) = accept.choose(live.len() + snapshot.bytes().len()) else {
            return Ok(None);
        };
        let body = match coding {
            Coding::Gzip => {
                let live = DeflatedPart::leading(live.as_bytes());
                vec![gzip_member(&[&live, snapshot.gzip()]).into()]
            }
            Coding::Identity => vec![live.into(), snapshot.bytes()],
        };
        Ok(Some(Scrape { body, coding }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::store_collector::tests::{key, view};
    use crate::store::{unix_now, Sample};
    use std::io::Read;

    fn gzip_accepted() -> Acceptable {
        Acceptable::parse(["gzip"])
    }

    /// The whole exposition as a plain scrape sends it.
    fn text(exposition: &Exposition, format: Format) -> String {
        let scrape = exposition
            .scrape(format, Acceptable::parse([]))
            .unwrap()
            .unwrap();
        String::from_utf8(scrape.concat()).unwrap()
    }

    fn sorted_lines(text: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines
    }

    /// The exposition served from the cache holds the same lines as the view encoded afresh.
    #[test]
    fn cached_scrape_equals_a_fresh_encoding() {
        let uncached = {
            let mut registry = Registry::default();
            registry.register_collector(Box::new(view(true)));
            encode(&registry, Format::Prometheus).unwrap()
        };
        let exposition = Exposition::with_store(Registry::default(), view(true));
        let cached = text(&exposition, Format::Prometheus);
        assert_eq!(sorted_lines(&cached), sorted_lines(&uncached));
        assert!(cached.contains("chd_probe_cells{probe=\"h2d\",state=\"unmeasured\"} 1\n"));
    }

    #[test]
    fn openmetrics_ends_once_with_eof() {
        let exposition = Exposition::with_store(Registry::default(), view(false));
        let text = text(&exposition, Format::OpenMetrics);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        // The live part (coverage) comes first, the store's families after it.
        let coverage = text.find("# TYPE chd_probe_cells gauge").unwrap();
        let matrix = text.find("# TYPE chd_h2d_device_ratio gauge").unwrap();
        assert!(coverage < matrix);
    }

    #[test]
    fn gzip_scrape_decodes_to_the_identity_scrape() {
        let exposition = Exposition::with_store(Registry::default(), view(true));
        let plain = exposition
            .scrape(Format::Prometheus, Acceptable::parse([]))
            .unwrap()
            .unwrap();
        assert_eq!(plain.coding, Coding::Identity);
        let packed = exposition
            .scrape(Format::Prometheus, gzip_accepted())
            .unwrap()
            .unwrap();
        assert_eq!(packed.coding, Coding::Gzip);
        let mut text = Vec::new();
        assert_eq!(packed.body.len(), 1);
        flate2::read::GzDecoder::new(&packed.concat()[..])
            .read_to_end(&mut text)
            .unwrap();
        // Plain: the live part, then the snapshot's own buffer.
        assert_eq!(plain.body.len(), 2);
        assert_eq!(text, plain.concat());
        let refused = exposition
            .scrape(Format::Prometheus, Acceptable::parse(["*;q=0"]))
            .unwrap();
        assert!(refused.is_none());
    }

    /// The store's part is encoded once per store generation: the same snapshot until a
    /// probe records something, a new one after, with the new value in it.
    #[test]
    fn the_store_part_is_encoded_again_only_when_the_store_changes() {
        let view = view(true);
        let store = view.store.clone();
        let cache = MatrixCache::new(view);
        let first = cache.snapshot(Format::Prometheus).unwrap();
        let again = cache.snapshot(Format::Prometheus).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        // The other format has a snapshot of its own.
        let om = cache.snapshot(Format::OpenMetrics).unwrap();
        assert!(!Arc::ptr_eq(&first, &om));
        let series = "chd_h2d_bandwidth_bytes_per_second{cpu=\"3\",numa_node=\"1\",device=\"3\",size_bytes=\"67108864\",direction=\"h2d\"}";
        assert!(!first.text().contains(series));
        store.write().unwrap().record_sample(
            key(3, "3"),
            Sample {
                bytes_per_second: 5.0e10,
                at: unix_now(),
            },
            5,
        );
        let after = cache.snapshot(Format::Prometheus).unwrap();
        assert!(!Arc::ptr_eq(&first, &after));
        assert!(after.text().contains(&format!("{series} 50000000000\n")));
        // The gzip form is made once per snapshot.
        assert!(std::ptr::eq(after.gzip(), after.gzip()));
    }

    /// A scrape's coverage and its matrix come from one snapshot, read under one lock: the
    /// fresh count always equals the cells the same scrape exports.
    #[test]
    fn coverage_and_matrix_of_one_scrape_agree() {
        let view = view(true);
        let store = view.store.clone();
        let exposition = Exposition::with_store(Registry::default(), view);
        let count = |text: &str| {
            let cells = text
                .lines()
                .filter(|l| l.starts_with("chd_h2d_bandwidth_bytes_per_second{"))
                .count();
            let fresh = text
                .lines()
                .find_map(|l| l.strip_prefix("chd_probe_cells{probe=\"h2d\",state=\"fresh\"} "))
                .map(|v| v.parse::<usize>().unwrap());
            (cells, fresh)
        };
        assert_eq!(
            count(&text(&exposition, Format::Prometheus)),
            (15, Some(15))
        );
        store.write().unwrap().record_sample(
            key(3, "3"),
            Sample {
                bytes_per_second: 5.0e10,
                at: unix_now(),
            },
            5,
        );
        assert_eq!(
            count(&text(&exposition, Format::Prometheus)),
            (16, Some(16))
        );
    }
}
