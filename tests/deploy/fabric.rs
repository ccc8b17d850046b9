//! `deploy/kubernetes/components/fabric/` built onto the base with `kubectl kustomize`: the
//! built-in kinds pass `kubernetes-validate --strict` as the base's do, the base's objects
//! are left as they were, and the Indexed Job holds together: 2 indexed pods on 2 nodes
//! (anti-affinity), the headless Service that is their subdomain, rank and rendezvous
//! derived from the index and the Job's name, the token from a Secret, every GPU and an RDMA
//! device requested, the node's chd state directory (the DaemonSet's) mounted where
//! `--state-dir` points. The CronJob runs exactly the Job's spec.

use std::collections::BTreeMap;

use serde_yaml::Value;

use crate::kubernetes::{base_with, builds, is_operator_kind, kind, name, validate_strict};
use crate::yaml::{at, key, seq, string_map, text};

const BUILD: &str = "base + components/fabric";

fn built() -> Vec<Value> {
    base_with("fabric")
}

fn one<'a>(docs: &'a [Value], k: &str, n: &str) -> &'a Value {
    let all: Vec<&Value> = docs
        .iter()
        .filter(|d| kind(d) == k && name(d) == n)
        .collect();
    assert_eq!(all.len(), 1, "{BUILD}: expected one {k} {n}");
    all[0]
}

fn env_of(container: &Value) -> Vec<(String, Value)> {
    seq(&at(container, "env", BUILD), BUILD)
        .into_iter()
        .map(|e| (text(&at(&e, "name", BUILD), BUILD), e))
        .collect()
}

/// A resource list (quantities are strings or numbers in YAML) as text.
fn quantities(v: &Value) -> BTreeMap<String, String> {
    let m = v
        .as_mapping()
        .unwrap_or_else(|| panic!("{BUILD}: resources: {v:?}"));
    m.iter()
        .map(|(k, q)| {
            let q = match q {
                Value::Number(n) => n.to_string(),
                other => text(other, BUILD),
            };
            (text(k, BUILD), q)
        })
        .collect()
}

#[test]
fn the_fabric_component_validates_and_leaves_the_base_alone() {
    let docs = built();
    let core: Vec<&Value> = docs.iter().filter(|d| !is_operator_kind(d)).collect();
    validate_strict(BUILD, &core);
    let (_, base) = &builds()[0];
    let added: Vec<String> = docs
        .iter()
        .filter(|d| !base.contains(d))
        .map(|d| format!("{} {}", kind(d), name(d)))
        .collect();
    assert_eq!(
        added,
        ["Service chd-fabric", "CronJob chd-fabric", "Job chd-fabric"],
        "{BUILD}: the component adds its three objects and changes nothing of the base"
    );
    for d in docs.iter().filter(|d| !base.contains(d)) {
        assert_eq!(
            at(d, "metadata.namespace", BUILD).as_str(),
            Some("chd"),
            "{} {}: in chd's namespace",
            kind(d),
            name(d)
        );
    }
}

#[test]
fn the_indexed_job_is_two_ranks_on_two_whole_nodes_that_find_rank_0() {
    let docs = built();
    let job = one(&docs, "Job", "chd-fabric");
    let spec = at(job, "spec", BUILD);
    assert_eq!(at(&spec, "completionMode", BUILD).as_str(), Some("Indexed"));
    assert_eq!(at(&spec, "completions", BUILD).as_u64(), Some(2));
    assert_eq!(at(&spec, "parallelism", BUILD).as_u64(), Some(2));
    let pod = at(&spec, "template", BUILD);
    let pod_labels = string_map(&at(&pod, "metadata.labels", BUILD), BUILD);
    let pod_spec = at(&pod, "spec", BUILD);

    // The subdomain is a headless Service that selects these pods; the base's Service does not.
    let subdomain = text(&at(&pod_spec, "subdomain", BUILD), BUILD);
    let service = one(&docs, "Service", &subdomain);
    assert_eq!(at(service, "spec.clusterIP", BUILD).as_str(), Some("None"));
    let selects = |svc: &Value| {
        string_map(&at(svc, "spec.selector", BUILD), BUILD)
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    assert!(selects(service), "{subdomain} selects the fabric pods");
    assert!(
        !selects(one(&docs, "Service", "chd")),
        "the metrics Service must not select the fabric pods"
    );

    // One pod per node, host networking with cluster DNS.
    let anti = seq(
        &at(
            &pod_spec,
            "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            BUILD,
        ),
        BUILD,
    );
    assert_eq!(anti.len(), 1);
    assert_eq!(
        at(&anti[0], "topologyKey", BUILD).as_str(),
        Some("kubernetes.io/hostname")
    );
    let anti_labels = string_map(&at(&anti[0], "labelSelector.matchLabels", BUILD), BUILD);
    assert!(anti_labels
        .iter()
        .all(|(k, v)| pod_labels.get(k) == Some(v)));
    assert_eq!(key(&pod_spec, "hostNetwork"), Some(true.into()));
    assert_eq!(
        at(&pod_spec, "dnsPolicy", BUILD).as_str(),
        Some("ClusterFirstWithHostNet"),
        "with hostNetwork only this resolves <job>-0.{subdomain}"
    );
    assert_eq!(
        at(&pod_spec, "restartPolicy", BUILD).as_str(),
        Some("Never")
    );

    let containers = seq(&at(&pod_spec, "containers", BUILD), BUILD);
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let args: Vec<String> = seq(&at(c, "args", BUILD), BUILD)
        .iter()
        .map(|a| text(a, BUILD))
        .collect();
    assert_eq!(args[..2], ["probe", "fabric"]);

    // Rank = the completion index; world size = completions; rank 0 = <job>-0.<subdomain>,
    // the Job's name read before MASTER_ADDR refers to it ($(VAR) sees earlier entries only).
    let env = env_of(c);
    let position = |n: &str| env.iter().position(|(k, _)| k == n);
    let get = |n: &str| {
        env[position(n).unwrap_or_else(|| panic!("no env {n}"))]
            .1
            .clone()
    };
    assert_eq!(
        at(&get("RANK"), "valueFrom.fieldRef.fieldPath", BUILD).as_str(),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
    assert_eq!(at(&get("WORLD_SIZE"), "value", BUILD).as_str(), Some("2"));
    assert_eq!(at(&get("LOCAL_RANK"), "value", BUILD).as_str(), Some("0"));
    let master = text(&at(&get("MASTER_ADDR"), "value", BUILD), BUILD);
    let job_var = master
        .strip_prefix("$(")
        .and_then(|m| m.strip_suffix(&format!(")-0.{subdomain}")))
        .unwrap_or_else(|| panic!("MASTER_ADDR {master:?} is not $(JOB)-0.{subdomain}"));
    assert_eq!(
        at(&get(job_var), "valueFrom.fieldRef.fieldPath", BUILD).as_str(),
        Some("metadata.labels['batch.kubernetes.io/job-name']")
    );
    assert!(position(job_var) < position("MASTER_ADDR"));
    let port = text(&at(&get("MASTER_PORT"), "value", BUILD), BUILD);
    let container_ports: Vec<String> = seq(&at(c, "ports", BUILD), BUILD)
        .iter()
        .map(|p| at(p, "containerPort", BUILD).as_u64().unwrap().to_string())
        .collect();
    assert_eq!(container_ports, std::slice::from_ref(&port));
    let service_ports: Vec<String> = seq(&at(service, "spec.ports", BUILD), BUILD)
        .iter()
        .map(|p| at(p, "port", BUILD).as_u64().unwrap().to_string())
        .collect();
    assert_eq!(service_ports, [port]);
    let token = get("CHD_FABRIC_TOKEN");
    assert!(
        key(&at(&token, "valueFrom", BUILD), "secretKeyRef").is_some(),
        "the token comes from a Secret: {token:?}"
    );

    // Every GPU and an RDMA device, requested and limited alike; no CPU limit.
    let requests = quantities(&at(c, "resources.requests", BUILD));
    let limits = quantities(&at(c, "resources.limits", BUILD));
    let gpus: u32 = requests["nvidia.com/gpu"].parse().unwrap();
    assert!(gpus >= 1);
    assert_eq!(limits.get("nvidia.com/gpu"), requests.get("nvidia.com/gpu"));
    let rdma: Vec<&String> = requests.keys().filter(|k| k.starts_with("rdma/")).collect();
    assert_eq!(rdma.len(), 1, "an RDMA device request: {requests:?}");
    assert_eq!(limits.get(rdma[0]), requests.get(rdma[0]));
    assert!(!limits.contains_key("cpu"), "no CPU limit (throttling)");

    // Unprivileged as chd's own user; the one capability RDMA memory registration needs.
    let daemonset = one(&docs, "DaemonSet", "chd");
    let ds_pod = at(daemonset, "spec.template.spec", BUILD);
    assert_eq!(
        at(&pod_spec, "securityContext", BUILD),
        at(&ds_pod, "securityContext", BUILD),
        "the DaemonSet's identity and seccomp"
    );
    let csc = at(c, "securityContext", BUILD);
    assert_eq!(key(&csc, "allowPrivilegeEscalation"), Some(false.into()));
    assert_eq!(key(&csc, "readOnlyRootFilesystem"), Some(true.into()));
    assert_eq!(
        at(&csc, "capabilities.add", BUILD),
        Value::Sequence(vec!["IPC_LOCK".into()])
    );

    // The node's chd state directory, the DaemonSet's hostPath, where --state-dir points.
    let host_paths = |spec: &Value| -> BTreeMap<String, String> {
        seq(&at(spec, "volumes", BUILD), BUILD)
            .iter()
            .filter_map(|v| {
                key(v, "hostPath").map(|h| {
                    (
                        text(&at(v, "name", BUILD), BUILD),
                        text(&at(&h, "path", BUILD), BUILD),
                    )
                })
            })
            .collect()
    };
    let state_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--state-dir="))
        .expect("--state-dir=");
    let mount = seq(&at(c, "volumeMounts", BUILD), BUILD)
        .into_iter()
        .find(|m| at(m, "mountPath", BUILD).as_str() == Some(state_dir))
        .unwrap_or_else(|| panic!("nothing mounted at {state_dir}"));
    let volume = text(&at(&mount, "name", BUILD), BUILD);
    assert_eq!(host_paths(&pod_spec)[&volume], "/var/lib/chd");
    assert!(
        host_paths(&ds_pod).values().any(|p| p == "/var/lib/chd"),
        "the DaemonSet keeps its state there too"
    );
}

#[test]
fn the_cronjob_runs_exactly_the_jobs_spec_never_two_at_once() {
    let docs = built();
    let job = one(&docs, "Job", "chd-fabric");
    let cron = one(&docs, "CronJob", "chd-fabric");
    assert_eq!(
        at(cron, "spec.jobTemplate.spec", BUILD),
        at(job, "spec", BUILD),
        "cronjob.yaml's job spec differs from job.yaml's"
    );
    assert_eq!(
        at(cron, "spec.concurrencyPolicy", BUILD).as_str(),
        Some("Forbid")
    );
    assert!(key(&at(cron, "spec", BUILD), "schedule").is_some());
}
