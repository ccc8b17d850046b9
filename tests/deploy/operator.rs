//! The Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule), which no
//! bundled schema covers: checked field by field against the operator's v1 API, and their
//! selectors matched against the pods and services they must select.

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;

use crate::kubernetes::{builds, container_port_names, find, main_container, only, pod_template};
use crate::yaml::{
    at, check_keys, duration_seconds, is_prometheus_duration, key, seq, string_map, text,
};

pub(crate) const METADATA_KEYS: &[&str] = &["name", "namespace", "labels", "annotations"];
pub(crate) const RELABEL_KEYS: &[&str] = &[
    "sourceLabels",
    "separator",
    "targetLabel",
    "regex",
    "modulus",
    "replacement",
    "action",
];
pub(crate) const RELABEL_ACTIONS: &[&str] = &[
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
];
pub(crate) const SCRAPE_ENDPOINT_KEYS: &[&str] = &[
    "port",
    "portNumber",
    "targetPort",
    "path",
    "scheme",
    "params",
    "interval",
    "scrapeTimeout",
    "tlsConfig",
    "bearerTokenSecret",
    "authorization",
    "basicAuth",
    "oauth2",
    "honorLabels",
    "honorTimestamps",
    "trackTimestampsStaleness",
    "metricRelabelings",
    "relabelings",
    "proxyUrl",
    "noProxy",
    "proxyFromEnvironment",
    "proxyConnectHeader",
    "followRedirects",
    "enableHttp2",
    "filterRunning",
];
pub(crate) const MONITOR_SPEC_KEYS: &[&str] = &[
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
    "endpoints",
    "podMetricsEndpoints",
    "selector",
    "selectorMechanism",
    "namespaceSelector",
    "sampleLimit",
    "targetLimit",
    "labelLimit",
    "labelNameLengthLimit",
    "labelValueLengthLimit",
    "keepDroppedTargets",
    "attachMetadata",
    "scrapeClass",
    "scrapeProtocols",
    "fallbackScrapeProtocol",
    "bodySizeLimit",
];

pub(crate) fn check_metadata(doc: &Value, what: &str) {
    check_keys(&at(doc, "metadata", what), what, METADATA_KEYS, &["name"]);
    check_keys(
        doc,
        what,
        &["apiVersion", "kind", "metadata", "spec"],
        &["apiVersion", "kind", "metadata", "spec"],
    );
    assert_eq!(
        at(doc, "metadata.namespace", what).as_str(),
        Some("chd"),
        "{what}: namespace"
    );
}

pub(crate) fn check_relabelings(v: &Value, what: &str) -> Vec<Value> {
    let rules = seq(v, what);
    for (i, r) in rules.iter().enumerate() {
        let w = format!("{what}[{i}]");
        check_keys(r, &w, RELABEL_KEYS, &[]);
        let action = key(r, "action")
            .map(|a| text(&a, &w).to_lowercase())
            .unwrap_or_else(|| "replace".into());
        assert!(
            RELABEL_ACTIONS.contains(&action.as_str()),
            "{w}: unknown action {action}"
        );
        if let Some(re) = key(r, "regex") {
            let re = text(&re, &w);
            regex::Regex::new(&format!("^(?:{re})$"))
                .unwrap_or_else(|e| panic!("{w}: regex {re:?}: {e}"));
        }
        if let Some(sl) = key(r, "sourceLabels") {
            for l in seq(&sl, &w) {
                text(&l, &w);
            }
        }
        if action == "replace" {
            assert!(
                key(r, "targetLabel").is_some(),
                "{w}: replace needs targetLabel"
            );
        }
    }
    rules
}

/// The structural check of a ServiceMonitor's or PodMonitor's scrape endpoints.
pub(crate) fn check_scrape_endpoints(v: &Value, what: &str) -> Vec<Value> {
    let eps = seq(v, what);
    assert!(!eps.is_empty(), "{what}: no endpoints");
    for (i, ep) in eps.iter().enumerate() {
        let w = format!("{what}[{i}]");
        check_keys(ep, &w, SCRAPE_ENDPOINT_KEYS, &[]);
        let interval = key(ep, "interval").map(|d| text(&d, &w));
        let timeout = key(ep, "scrapeTimeout").map(|d| text(&d, &w));
        for d in interval.iter().chain(timeout.iter()) {
            assert!(is_prometheus_duration(d), "{w}: bad duration {d:?}");
        }
        if let (Some(i), Some(t)) = (&interval, &timeout) {
            assert!(
                duration_seconds(t) <= duration_seconds(i),
                "{w}: scrapeTimeout {t} exceeds interval {i}"
            );
        }
        let relabel = check_relabelings(
            &key(ep, "relabelings").unwrap_or_else(|| panic!("{w}: no relabelings")),
            &format!("{w}.relabelings"),
        );
        // instance = the node's name, not pod IP:port.
        assert!(
            relabel.iter().any(|r| {
                key(r, "targetLabel").and_then(|t| t.as_str().map(str::to_owned))
                    == Some("instance".into())
                    && key(r, "sourceLabels")
                        == Some(Value::Sequence(vec![
                            "__meta_kubernetes_pod_node_name".into()
                        ]))
            }),
            "{w}: no relabelling sets instance from __meta_kubernetes_pod_node_name"
        );
        assert_eq!(
            key(ep, "port").and_then(|p| p.as_str().map(str::to_owned)),
            Some("metrics".into()),
            "{w}: port"
        );
    }
    eps
}

pub(crate) fn selector_matches(
    selector: &Value,
    labels: &BTreeMap<String, String>,
    what: &str,
) -> bool {
    check_keys(selector, what, &["matchLabels", "matchExpressions"], &[]);
    assert!(
        key(selector, "matchExpressions").is_none(),
        "{what}: matchExpressions not expected"
    );
    let want = string_map(&at(selector, "matchLabels", what), what);
    assert!(
        !want.is_empty(),
        "{what}: empty selector selects everything"
    );
    want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
pub(crate) fn prometheus_operator_kinds_are_well_formed_and_select_the_pods() {
    for (build, docs) in builds() {
        let pod = pod_template(docs, build);
        let ports = container_port_names(&main_container(&pod, build), build);
        assert_eq!(ports.get("metrics"), Some(&9863), "{build}: port metrics");

        let service_monitor = find(docs, "ServiceMonitor");
        let pod_monitor = find(docs, "PodMonitor");
        assert!(
            service_monitor.is_some() != pod_monitor.is_some(),
            "{build}: exactly one of ServiceMonitor and PodMonitor (both would scrape twice)"
        );
        if let Some(sm) = service_monitor {
            let what = format!("{build}: ServiceMonitor");
            check_metadata(sm, &what);
            let spec = at(sm, "spec", &what);
            check_keys(&spec, &what, MONITOR_SPEC_KEYS, &["selector", "endpoints"]);
            check_scrape_endpoints(&at(&spec, "endpoints", &what), &format!("{what}.endpoints"));
            assert_eq!(
                key(&spec, "jobLabel").and_then(|j| j.as_str().map(str::to_owned)),
                Some("app.kubernetes.io/name".into()),
                "{what}: jobLabel (job=\"chd\" is what ChdExporterDown matches)"
            );
            // The Service it selects is headless, selects the pods, and names the port.
            let svc = only(docs, "Service", build);
            let svc_what = format!("{build}: Service");
            let svc_labels = string_map(&at(svc, "metadata.labels", &svc_what), &svc_what);
            assert!(selector_matches(
                &at(&spec, "selector", &what),
                &svc_labels,
                &what
            ));
            assert_eq!(
                at(svc, "spec.clusterIP", &svc_what).as_str(),
                Some("None"),
                "{svc_what}: headless"
            );
            let svc_selector = string_map(&at(svc, "spec.selector", &svc_what), &svc_what);
            assert!(
                !svc_selector.is_empty()
                    && svc_selector
                        .iter()
                        .all(|(k, v)| pod.labels.get(k) == Some(v)),
                "{svc_what}: selector {svc_selector:?} must select the pods"
            );
            assert_eq!(
                svc_labels.get("app.kubernetes.io/name").map(String::as_str),
                Some("chd"),
                "{svc_what}: the job label ServiceMonitor takes"
            );
            let svc_ports = seq(&at(svc, "spec.ports", &svc_what), &svc_what);
            assert!(
                svc_ports.iter().any(|p| {
                    key(p, "name") == Some("metrics".into())
                        && key(p, "port") == Some(9863.into())
                        && key(p, "targetPort") == Some("metrics".into())
                }),
                "{svc_what}: port 9863 named metrics -> container port metrics"
            );
        }
        if let Some(pm) = pod_monitor {
            let what = format!("{build}: PodMonitor");
            check_metadata(pm, &what);
            let spec = at(pm, "spec", &what);
            check_keys(
                &spec,
                &what,
                MONITOR_SPEC_KEYS,
                &["selector", "podMetricsEndpoints"],
            );
            check_scrape_endpoints(
                &at(&spec, "podMetricsEndpoints", &what),
                &format!("{what}.podMetricsEndpoints"),
            );
            assert!(selector_matches(
                &at(&spec, "selector", &what),
                &pod.labels,
                &what
            ));
            assert!(
                find(docs, "Service").is_none(),
                "{build}: the headless Service is only for the ServiceMonitor"
            );
        }

        let rule = only(docs, "PrometheusRule", build);
        check_prometheus_rule_shape(rule, &format!("{build}: PrometheusRule"));
    }
}

pub(crate) fn check_prometheus_rule_shape(rule: &Value, what: &str) {
    check_metadata(rule, what);
    let spec = at(rule, "spec", what);
    check_keys(&spec, what, &["groups"], &["groups"]);
    let mut names = BTreeSet::new();
    for (i, g) in seq(&at(&spec, "groups", what), what).iter().enumerate() {
        let w = format!("{what}.groups[{i}]");
        check_keys(
            g,
            &w,
            &[
                "name",
                "interval",
                "rules",
                "labels",
                "limit",
                "query_offset",
                "partial_response_strategy",
            ],
            &["name", "rules"],
        );
        let n = text(&at(g, "name", &w), &w);
        assert!(names.insert(n.clone()), "{what}: group {n} twice");
        if let Some(d) = key(g, "interval") {
            assert!(is_prometheus_duration(&text(&d, &w)), "{w}: interval");
        }
        for (j, r) in seq(&at(g, "rules", &w), &w).iter().enumerate() {
            let rw = format!("{w}.rules[{j}]");
            check_keys(
                r,
                &rw,
                &[
                    "record",
                    "alert",
                    "expr",
                    "for",
                    "keep_firing_for",
                    "labels",
                    "annotations",
                ],
                &["expr"],
            );
            assert!(
                key(r, "record").is_some() != key(r, "alert").is_some(),
                "{rw}: exactly one of record and alert"
            );
            text(&at(r, "expr", &rw), &rw);
            for d in ["for", "keep_firing_for"] {
                if let Some(v) = key(r, d) {
                    assert!(is_prometheus_duration(&text(&v, &rw)), "{rw}: {d}");
                }
            }
            // The CRD types labels and annotations as map[string]string.
            for m in ["labels", "annotations"] {
                if let Some(v) = key(r, m) {
                    string_map(&v, &format!("{rw}.{m}"));
                }
            }
        }
    }
}
