//! Exposition: the prometheus-client registry (live probe counters plus the scrape-time
//! store and pair-probe views) and its encoding in the Prometheus 0.0.4 text format (default) or OpenMetrics
//! (when the scraper's Accept header asks for it). A scrape (`scrape`) joins what is encoded
//! at every scrape with the store's families, which `matrix_cache` encodes once per store
//! generation. `page_cache` keeps a rendered page (the calibration ledger, `calibration_page`) per generation
//! likewise. `server` serves it over HTTP, gzipped when asked (`content_coding`), within
//! the connection bounds of `connections`, with TLS and basic auth from the exporters' web
//! config file (`web_config`, reloaded by `web_settings`, passwords checked by `basic_auth` on
//! the thread of `bcrypt_worker`).

pub mod basic_auth;
pub mod bcrypt_worker;
pub mod calibration_page;
pub mod connections;
pub mod content_coding;
pub mod matrix_cache;
pub mod page_cache;
pub mod pair_probe_collector;
pub mod scrape;
pub mod server;
pub mod store_collector;
pub mod verdict_collector;
pub mod web_config;
pub mod web_settings;

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Content type of OpenMetrics text 1.0.0.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which text format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Prometheus,
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the Accept header lists it, else Prometheus text 0.0.4.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// Size of the previous scrape, so the next one allocates its buffer once (a 30,720-cell
/// matrix encodes to about 4 MB).
static LAST_BODY_BYTES: AtomicUsize = AtomicUsize::new(64 * 1024);

/// Encode the registry as a first part of an exposition, which more families follow: in
/// OpenMetrics without the `# EOF` line.
pub fn encode_leading(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut body = String::with_capacity(64 * 1024);
    match format {
        Format::Prometheus => prometheus_text::encode(&mut body, registry)?,
        Format::OpenMetrics => text::encode_registry(&mut body, registry)?,
    }
    Ok(body)
}

/// Encode the whole registry.
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let hint = LAST_BODY_BYTES.load(Ordering::Relaxed);
    let mut body = String::with_capacity(hint + hint / 8);
    match format {
        Format::Prometheus => prometheus_text::encode(&mut body, registry)?,
        Format::OpenMetrics => text::encode(&mut body, registry)?,
    }
    LAST_BODY_BYTES.store(body.len(), Ordering::Relaxed);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_prometheus_text() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4;q=0.3,*/*;q=0.2")),
            Format::Prometheus
        );
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
    }
}
