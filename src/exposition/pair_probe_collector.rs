//! Scrape-time view of the core-pair probe: which method measures each configured pair
//! (`chd_pair_probe_info`), and what the probe holds on the devices between cells —
//! communicators by library and state, and the device memory they hold where the library
//! documents it (`chd_held_communicators`, `chd_held_device_memory_bytes`). Reads a snapshot
//! the probe keeps; never calls into a runtime.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::runtime::pair::PairProbe;
use crate::vocab::DevicePair;

/// The pair probe and the pairs it measures.
pub struct PairProbeView {
    pub probe: Arc<dyn PairProbe>,
    /// Configured `pair` labels.
    pub pairs: Vec<DevicePair>,
}

impl std::fmt::Debug for PairProbeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairProbeView")
            .field("pairs", &self.pairs)
            .finish_non_exhaustive()
    }
}

impl Collector for PairProbeView {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let held = self.probe.holdings();
        let mut family = enc.encode_descriptor(
            "chd_pair_probe_info",
            "How the core-pair probe measures each pair: nccl, hccl, copy (peer copies over the \
             link) or copy-staged (peer access refused: host-staged copies)",
            None,
            MetricType::Gauge,
        )?;
        for pair in &self.pairs {
            let known = held
                .methods
                .iter()
                .find(|(p, _)| p == pair.as_str())
                .map(|(_, m)| *m);
            let Some(method) = known.or(held.library) else {
                continue;
            };
            family
                .encode_family(&[("pair", pair.as_str()), ("method", method)])?
                .encode_gauge(&1i64)?;
        }
        if let Some(library) = held.library {
            let mut family = enc.encode_descriptor(
                "chd_held_communicators",
                "Collective communicators chd holds, by state: in_use (cached for the \
                 window), releasing (a destroy or abort has not returned), quarantined \
                 (HCCL_E_AGAIN; retried every window), leaked (refused; freed by a restart)",
                None,
                MetricType::Gauge,
            )?;
            for (state, n) in &held.communicators {
                family
                    .encode_family(&[("library", library), ("state", state.as_str())])?
                    .encode_gauge(&(*n as i64))?;
            }
        }
        if let Some(memory) = &held.device_memory {
            let mut family = enc.encode_descriptor(
                "chd_held_device_memory_bytes",
                "Device memory chd's communicators hold (HCCL: 2 x HCCL_BUFFSIZE each)",
                None,
                MetricType::Gauge,
            )?;
            for (device, bytes) in memory {
                family
                    .encode_family(&[("device", device.as_str())])?
                    .encode_gauge(&(*bytes as i64))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::{encode, Format};
    use crate::runtime::pair::{CommState, Holdings, PairParams};
    use crate::runtime::ProbeError;
    use prometheus_client::registry::Registry;

    struct Fixed(Holdings);

    impl PairProbe for Fixed {
        fn method(&self) -> &'static str {
            self.0.library.unwrap_or("copy")
        }
        fn pair_method(&self, _: [&str; 2]) -> Result<&'static str, ProbeError> {
            Ok(self.method())
        }
        fn measure(&self, _: [&str; 2], _: [u32; 2], _: &PairParams) -> Result<f64, ProbeError> {
            Err(ProbeError::Timing("not measured here".into()))
        }
        fn release_idle(&self) {}
        fn holdings(&self) -> Holdings {
            self.0.clone()
        }
    }

    fn scrape(held: Holdings, pairs: &[&str]) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(PairProbeView {
            probe: Arc::new(Fixed(held)),
            pairs: pairs.iter().map(|p| p.parse().unwrap()).collect(),
        }));
        encode(&registry, Format::Prometheus).unwrap()
    }

    #[test]
    fn copy_pairs_show_their_method_and_no_communicators() {
        let text = scrape(
            Holdings {
                methods: vec![("0,1".into(), "copy"), ("0,2".into(), "copy-staged")],
                ..Holdings::default()
            },
            &["0,1", "0,2", "1,3"],
        );
        assert!(
            text.contains("chd_pair_probe_info{pair=\"0,1\",method=\"copy\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("chd_pair_probe_info{pair=\"0,2\",method=\"copy-staged\"} 1\n"),
            "{text}"
        );
        // Not known yet: no series rather than a guess.
        assert!(!text.contains("pair=\"1,3\""), "{text}");
        assert!(!text.contains("chd_held_communicators{"), "{text}");
        assert!(!text.contains("chd_held_device_memory_bytes{"), "{text}");
    }

    #[test]
    fn hccl_holdings_count_states_and_memory() {
        let text = scrape(
            Holdings {
                library: Some("hccl"),
                communicators: CommState::ALL
                    .iter()
                    .map(|s| (*s, usize::from(*s == CommState::Quarantined) * 2))
                    .collect(),
                device_memory: Some(vec![("0".into(), 419_430_400), ("1".into(), 0)]),
                methods: Vec::new(),
            },
            &["0,1"],
        );
        assert!(
            text.contains("chd_pair_probe_info{pair=\"0,1\",method=\"hccl\"} 1\n"),
            "{text}"
        );
        for (state, n) in [
            ("in_use", 0),
            ("releasing", 0),
            ("quarantined", 2),
            ("leaked", 0),
        ] {
            let line =
                format!("chd_held_communicators{{library=\"hccl\",state=\"{state}\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains("chd_held_device_memory_bytes{device=\"0\"} 419430400\n"),
            "{text}"
        );
        assert!(
            text.contains("chd_held_device_memory_bytes{device=\"1\"} 0\n"),
            "{text}"
        );
    }
}
