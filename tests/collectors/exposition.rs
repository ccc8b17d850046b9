//! The scrape as text: counter names in both formats, `promtool check metrics` on every tree,
//! every family in the metric contract (docs/METRICS.md).

use std::path::Path;

use chd::collect::CollectorSettings;
use chd::exposition::{encode, Format};

use crate::scrape::{odd_accelerators, registry, roce_gpus, scrape, scrape_with};

#[test]
fn counters_are_named_once_with_total_in_both_formats() {
    let s = scrape("roce-dual-rail", roce_gpus());
    assert!(s
        .text
        .contains("# TYPE chd_rdma_port_errors_total counter\n"));
    assert!(s
        .text
        .contains("# TYPE chd_collector_read_errors_total counter\n"));
    assert!(s.text.contains("# TYPE chd_numa_memory_bytes gauge\n"));
    assert!(!s.text.contains("_total_total"));
    let om = encode(
        &registry(&CollectorSettings::default(), "roce-dual-rail", roce_gpus()),
        Format::OpenMetrics,
    )
    .unwrap();
    assert!(om.contains("# TYPE chd_rdma_port_errors counter\n"), "{om}");
    assert!(om.contains(
        "chd_rdma_port_errors_total{hca=\"mlx5_0\",port=\"1\",counter=\"link_downed\"} 1\n"
    ));
    assert!(om.ends_with("# EOF\n"));
}

/// `promtool check metrics` on a scrape; panics (never skips) without promtool.
pub(crate) fn promtool_check(name: &str, text: &str) {
    crate::promtool::check_metrics(name, text);
}

#[test]
fn promtool_accepts_every_tree() {
    promtool_check(
        "roce-dual-rail",
        &scrape("roce-dual-rail", roce_gpus()).text,
    );
    let all = CollectorSettings {
        netdev_all: true,
        ..Default::default()
    };
    promtool_check(
        "roce-dual-rail (netdev_all)",
        &scrape_with(&all, "roce-dual-rail", roce_gpus()).text,
    );
    promtool_check("infiniband", &scrape("infiniband", vec![]).text);
    promtool_check("odd", &scrape("odd", odd_accelerators()).text);
}

/// Families the collectors emit that docs/METRICS.md does not list (none: every one is in
/// the contract).
pub(crate) const NOT_IN_CONTRACT: [&str; 0] = [];

/// Every `chd_...` name of METRICS.md, with the table's `A` / `..._tail` shorthand expanded
/// (`..._received_bytes_total` after `chd_rdma_port_data_transmitted_bytes_total`).
pub(crate) fn contract_names(markdown: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in markdown.lines() {
        let mut previous: Option<String> = None;
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            if token.starts_with("chd_") {
                names.insert(token.to_owned());
                previous = Some(token.to_owned());
            } else if let (Some(tail), Some(prev)) = (token.strip_prefix("..._"), &previous) {
                let keep = prev.split('_').count() - tail.split('_').count();
                let head: Vec<&str> = prev.split('_').take(keep).collect();
                names.insert(format!("{}_{tail}", head.join("_")));
            }
        }
    }
    names
}

#[test]
fn every_family_is_in_the_metric_contract_or_a_listed_addition() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/METRICS.md"))
            .expect("docs/METRICS.md");
    let contract = contract_names(&text);
    let mut scraped = scrape("roce-dual-rail", roce_gpus()).text;
    scraped.push_str(&scrape("odd", odd_accelerators()).text);
    let families: std::collections::BTreeSet<&str> = scraped
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.len() >= 20, "{families:?}");
    for family in families {
        assert!(
            contract.contains(family) || NOT_IN_CONTRACT.contains(&family),
            "{family} is neither in docs/METRICS.md nor in NOT_IN_CONTRACT"
        );
    }
}
