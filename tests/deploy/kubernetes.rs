//! `deploy/kubernetes/`: every kustomization built with `kubectl kustomize` (once per run),
//! the built-in kinds validated by `kubernetes-validate --strict`, the DaemonSet's settings and
//! arguments (parsed by the real binary with the ConfigMap's chd.toml), the base's file list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_yaml::{Mapping, Value};

use crate::tools::{
    chd_bin, kubernetes_validate, read, relative, require_tool, root, run, temp_dir,
    KUBERNETES_VALIDATE_INSTALL,
};
use crate::yaml::{at, key, seq, string_map, text, yaml_documents};

pub(crate) const K8S: &str = "deploy/kubernetes";

pub(crate) fn kustomize(dir: &Path) -> Vec<Value> {
    let kubectl = require_tool("kubectl", "the `kubectl` package, for `kubectl kustomize`");
    let ran = run(Command::new(kubectl).arg("kustomize").arg(dir)).expect_success();
    yaml_documents(&ran.stdout, &format!("kubectl kustomize {}", dir.display()))
}

/// The base with one component, built from an overlay made in a temp dir as a user would
/// write it.
pub(crate) fn base_with(component: &str) -> Vec<Value> {
    let base = root().join(K8S).join("base");
    let overlay = temp_dir().keep();
    let kustomization = format!(
        "resources:\n  - {}\ncomponents:\n  - {}\n",
        relative(&overlay, &base).display(),
        relative(
            &overlay,
            &root().join(K8S).join("components").join(component)
        )
        .display()
    );
    std::fs::write(overlay.join("kustomization.yaml"), kustomization).unwrap();
    let built = kustomize(&overlay);
    let _ = std::fs::remove_dir_all(&overlay);
    built
}

/// Kustomizations built once per test run: the base, the Ascend overlay, and the base with
/// each component (PodMonitor; TLS and basic auth; NFD labels; the NPD condition).
pub(crate) fn builds() -> &'static Vec<(String, Vec<Value>)> {
    static BUILDS: OnceLock<Vec<(String, Vec<Value>)>> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let base = root().join(K8S).join("base");
        vec![
            ("base".to_string(), kustomize(&base)),
            (
                "overlays/ascend".to_string(),
                kustomize(&root().join(K8S).join("overlays/ascend")),
            ),
            (
                "base + components/podmonitor".to_string(),
                base_with("podmonitor"),
            ),
            (
                "base + components/web-config".to_string(),
                base_with("web-config"),
            ),
            ("base + components/nfd".to_string(), base_with("nfd")),
            ("base + components/npd".to_string(), base_with("npd")),
        ]
    })
}

pub(crate) fn kind(doc: &Value) -> String {
    text(&at(doc, "kind", "manifest"), "kind")
}

pub(crate) fn name(doc: &Value) -> String {
    text(&at(doc, "metadata.name", "manifest"), "metadata.name")
}

pub(crate) fn find<'a>(docs: &'a [Value], k: &str) -> Option<&'a Value> {
    docs.iter().find(|d| kind(d) == k)
}

pub(crate) fn only<'a>(docs: &'a [Value], k: &str, build: &str) -> &'a Value {
    let all: Vec<&Value> = docs.iter().filter(|d| kind(d) == k).collect();
    assert_eq!(all.len(), 1, "{build}: expected one {k}, got {}", all.len());
    all[0]
}

pub(crate) fn is_operator_kind(doc: &Value) -> bool {
    text(&at(doc, "apiVersion", "manifest"), "apiVersion").starts_with("monitoring.coreos.com/")
}

/// Kubernetes versions the built-in kinds are validated against: an old still-deployed one
/// and the newest the pinned kubernetes-validate bundles.
pub(crate) const KUBERNETES_VERSIONS: &[&str] = &["1.27.0", "1.37.0"];

#[test]
pub(crate) fn kubernetes_builtin_kinds_pass_schema_validation() {
    for (build, docs) in builds() {
        let core: Vec<&Value> = docs.iter().filter(|d| !is_operator_kind(d)).collect();
        let kinds: BTreeSet<String> = core.iter().map(|d| kind(d)).collect();
        for k in ["Namespace", "ConfigMap", "DaemonSet"] {
            assert!(kinds.contains(k), "{build}: no {k} in {kinds:?}");
        }
        validate_strict(build, &core);
    }
}

/// `kubernetes-validate --strict` on `docs` (built-in kinds only) against every version of
/// [`KUBERNETES_VERSIONS`]: no error, no warning.
pub(crate) fn validate_strict(build: &str, docs: &[&Value]) {
    let dir = temp_dir();
    let file = dir.path().join("manifests.yaml");
    let body: Vec<String> = docs
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    std::fs::write(&file, body.join("---\n")).unwrap();
    let mut cmd = kubernetes_validate();
    cmd.arg("--strict").arg("--quiet");
    for v in KUBERNETES_VERSIONS {
        cmd.arg("-k").arg(v);
    }
    let ran = run(cmd.arg(&file));
    let report = format!("{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.success && !report.contains("ERROR") && !report.contains("WARN"),
        "{build}: kubernetes-validate --strict failed (install: \
         {KUBERNETES_VALIDATE_INSTALL}):\n{report}"
    );
}

#[test]
pub(crate) fn kubernetes_validate_rejects_a_misspelt_field() {
    // The check above is only worth something if strict validation rejects unknown fields.
    let (_, docs) = &builds()[0];
    let mut ds = only(docs, "DaemonSet", "base").clone();
    let spec = ds
        .get_mut("spec")
        .and_then(|s| s.get_mut("template"))
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_mapping_mut)
        .unwrap();
    spec.insert("hostPid".into(), true.into());
    let dir = temp_dir();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, serde_yaml::to_string(&ds).unwrap()).unwrap();
    let ran = run(kubernetes_validate()
        .arg("--strict")
        .arg("--quiet")
        .arg(&file));
    assert!(
        !ran.success && ran.stdout.contains("hostPid"),
        "kubernetes-validate accepted an unknown field:\n{}{}",
        ran.stdout,
        ran.stderr
    );
}

pub(crate) struct Pod {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) spec: Value,
}

/// chd's pod (the DaemonSet named chd: components/npd adds node-problem-detector's).
pub(crate) fn pod_template(docs: &[Value], build: &str) -> Pod {
    let chd: Vec<&Value> = docs
        .iter()
        .filter(|d| kind(d) == "DaemonSet" && name(d) == "chd")
        .collect();
    assert_eq!(
        chd.len(),
        1,
        "{build}: expected one DaemonSet chd, got {}",
        chd.len()
    );
    let ds = chd[0];
    let tpl = at(ds, "spec.template", build);
    Pod {
        labels: string_map(&at(&tpl, "metadata.labels", build), build),
        spec: at(&tpl, "spec", build),
    }
}

pub(crate) fn main_container(pod: &Pod, build: &str) -> Value {
    let containers = seq(&at(&pod.spec, "containers", build), build);
    containers
        .into_iter()
        .find(|c| key(c, "name").and_then(|n| n.as_str().map(str::to_owned)) == Some("chd".into()))
        .unwrap_or_else(|| panic!("{build}: no container named chd"))
}

pub(crate) fn container_port_names(c: &Value, what: &str) -> BTreeMap<String, i64> {
    seq(&at(c, "ports", what), what)
        .iter()
        .map(|p| {
            (
                text(&at(p, "name", what), what),
                at(p, "containerPort", what).as_i64().unwrap(),
            )
        })
        .collect()
}

#[test]
pub(crate) fn daemonset_runs_chd_unprivileged_on_every_accelerator_node() {
    for (build, docs) in builds() {
        let what = build.as_str();
        let pod = pod_template(docs, build);
        let spec = &pod.spec;
        let flag = |k: &str| key(spec, k).and_then(|v| v.as_bool()).unwrap_or(false);
        assert!(!flag("hostPID"), "{what}: hostPID");
        assert!(!flag("hostIPC"), "{what}: hostIPC");
        assert!(
            !flag("automountServiceAccountToken")
                && key(spec, "automountServiceAccountToken").is_some(),
            "{what}: chd needs no API token"
        );
        // Accelerator nodes only.
        let selector = string_map(&at(spec, "nodeSelector", what), what);
        assert!(
            selector.contains_key("nvidia.com/gpu.present") != selector.contains_key("accelerator"),
            "{what}: nodeSelector must pick NVIDIA or Ascend nodes: {selector:?}"
        );
        // Pod: non-root, RuntimeDefault seccomp.
        let psc = at(spec, "securityContext", what);
        assert_eq!(key(&psc, "runAsNonRoot"), Some(true.into()), "{what}");
        assert_ne!(key(&psc, "runAsUser"), Some(0.into()), "{what}");
        assert_eq!(
            at(&psc, "seccompProfile.type", what).as_str(),
            Some("RuntimeDefault"),
            "{what}"
        );

        let c = main_container(&pod, build);
        let csc = at(&c, "securityContext", what);
        assert_eq!(
            key(&csc, "readOnlyRootFilesystem"),
            Some(true.into()),
            "{what}"
        );
        assert_eq!(
            key(&csc, "allowPrivilegeEscalation"),
            Some(false.into()),
            "{what}"
        );
        assert_ne!(key(&csc, "privileged"), Some(true.into()), "{what}");
        assert_eq!(
            at(&csc, "capabilities.drop", what),
            Value::Sequence(vec!["ALL".into()]),
            "{what}: drop ALL"
        );
        assert!(
            key(&at(&csc, "capabilities", what), "add").is_none(),
            "{what}: chd needs no capability"
        );
        for init in key(spec, "initContainers")
            .map(|v| seq(&v, what))
            .unwrap_or_default()
        {
            let add = key(&at(&init, "securityContext.capabilities", what), "add");
            assert!(
                add.is_none() || add == Some(Value::Sequence(vec!["CHOWN".into()])),
                "{what}: an init container may add CHOWN at most: {add:?}"
            );
        }

        // Resources: requests, a memory limit, no CPU limit, no accelerator taken from jobs.
        let res = at(&c, "resources", what);
        let requests = at(&res, "requests", what);
        assert!(key(&requests, "cpu").is_some() && key(&requests, "memory").is_some());
        let limits = key(&res, "limits").unwrap_or(Value::Mapping(Mapping::new()));
        assert!(
            key(&limits, "cpu").is_none(),
            "{what}: no CPU limit (throttling)"
        );
        for m in [&requests, &limits] {
            for k in m.as_mapping().unwrap().keys() {
                let k = text(k, what);
                assert!(
                    k == "cpu" || k == "memory" || k == "ephemeral-storage",
                    "{what}: resource {k} would take accelerators from training jobs"
                );
            }
        }

        // Probes on /healthz; with a web config (basic auth covers /healthz too) on the port.
        let web_config = seq(&at(&c, "args", what), what).iter().find_map(|a| {
            text(a, what)
                .strip_prefix("--web.config.file=")
                .map(str::to_owned)
        });
        for p in ["livenessProbe", "readinessProbe"] {
            let probe = at(&c, p, what);
            if web_config.is_some() {
                assert_eq!(at(&probe, "tcpSocket.port", what).as_str(), Some("metrics"));
                assert!(key(&probe, "httpGet").is_none(), "{what}: {p}");
            } else {
                assert_eq!(at(&probe, "httpGet.path", what).as_str(), Some("/healthz"));
                assert_eq!(at(&probe, "httpGet.port", what).as_str(), Some("metrics"));
            }
        }

        // Volumes: /sys and /proc of the host, read-only, where the flags point; the state
        // directory on the host; the config map.
        let volumes: BTreeMap<String, Value> = seq(&at(spec, "volumes", what), what)
            .into_iter()
            .map(|v| (text(&at(&v, "name", what), what), v))
            .collect();
        let mounts: BTreeMap<String, Value> = seq(&at(&c, "volumeMounts", what), what)
            .into_iter()
            .map(|m| (text(&at(&m, "mountPath", what), what), m))
            .collect();
        let args: Vec<String> = seq(&at(&c, "args", what), what)
            .iter()
            .map(|a| text(a, what))
            .collect();
        let arg = |flag: &str| -> String {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{flag}=")))
                .unwrap_or_else(|| panic!("{what}: no {flag}= argument in {args:?}"))
                .to_string()
        };
        let host_path_at = |mount: &str| -> (String, bool) {
            let m = mounts
                .get(mount)
                .unwrap_or_else(|| panic!("{what}: nothing mounted at {mount}"));
            let vol = &volumes[&text(&at(m, "name", what), what)];
            (
                text(&at(vol, "hostPath.path", what), what),
                key(m, "readOnly") == Some(true.into()),
            )
        };
        assert_eq!(host_path_at(&arg("--sysfs-root")), ("/sys".into(), true));
        assert_eq!(host_path_at(&arg("--procfs-root")), ("/proc".into(), true));
        assert_eq!(
            host_path_at(&arg("--state-dir")),
            ("/var/lib/chd".into(), false)
        );
        // The web config file is in a mounted Secret, next to the certificates it names.
        if let Some(file) = &web_config {
            let dir = Path::new(file).parent().unwrap().to_str().unwrap();
            let m = mounts
                .get(dir)
                .unwrap_or_else(|| panic!("{what}: nothing mounted at {dir}"));
            assert_eq!(key(m, "readOnly"), Some(true.into()), "{what}: {dir}");
            let vol = &volumes[&text(&at(m, "name", what), what)];
            assert_eq!(
                at(vol, "secret.secretName", what).as_str(),
                Some("chd-web-config"),
                "{what}"
            );
            let sm =
                find(docs, "ServiceMonitor").expect("the component patches the ServiceMonitor");
            let ep = &seq(&at(sm, "spec.endpoints", what), what)[0];
            assert_eq!(at(ep, "scheme", what).as_str(), Some("https"), "{what}");
            assert_eq!(
                at(ep, "tlsConfig.ca.secret.name", what).as_str(),
                Some("chd-web-config")
            );
            assert!(key(ep, "basicAuth").is_some(), "{what}: basicAuth");
        }
        let config_path = PathBuf::from(arg("--config"));
        let config_mount = &mounts[config_path.parent().unwrap().to_str().unwrap()];
        let config_volume = &volumes[&text(&at(config_mount, "name", what), what)];
        let config_map_name = text(&at(config_volume, "configMap.name", what), what);
        let config_map = docs
            .iter()
            .find(|d| kind(d) == "ConfigMap" && name(d) == config_map_name)
            .unwrap_or_else(|| panic!("{what}: no ConfigMap {config_map_name}"));
        let file_name = config_path.file_name().unwrap().to_str().unwrap();
        let toml = key(&at(config_map, "data", what), file_name)
            .map(|t| text(&t, what))
            .unwrap_or_else(|| panic!("{what}: ConfigMap {config_map_name} has no {file_name}"));

        // The real binary accepts the container's arguments with the ConfigMap's file.
        let dir = temp_dir();
        let local_config = dir.path().join("chd.toml");
        std::fs::write(&local_config, toml).unwrap();
        let local_args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("--config=") {
                    format!("--config={}", local_config.display())
                } else {
                    a.clone()
                }
            })
            .collect();
        let ran = run(Command::new(chd_bin())
            .args(&local_args)
            .arg("--print-config"))
        .expect_success();
        for line in [
            "sysfs = \"/host/sys\"",
            "procfs = \"/host/proc\"",
            "state_dir = \"/var/lib/chd\"",
            "listen = \"0.0.0.0:9863\"",
        ] {
            assert!(
                ran.stdout.contains(line),
                "{what}: {line} not in\n{}",
                ran.stdout
            );
        }
    }
}

#[test]
pub(crate) fn base_kustomization_lists_every_manifest() {
    let base = root().join(K8S).join("base");
    let k = &yaml_documents(
        &read(&base.join("kustomization.yaml")),
        "kustomization.yaml",
    )[0];
    let listed: BTreeSet<String> = seq(&at(k, "resources", "kustomization"), "resources")
        .iter()
        .map(|r| text(r, "resources"))
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, on_disk,
        "base/kustomization.yaml resources vs files"
    );
}

/// components/nfd: chd writes its feature file where the hostPath of NFD's feature directory
/// is mounted, and the init container opens that same directory to chd's group.
#[test]
pub(crate) fn nfd_component_points_chd_at_nfds_feature_directory() {
    const DIR: &str = "/etc/kubernetes/node-feature-discovery/features.d";
    let (build, docs) = builds()
        .iter()
        .find(|(b, _)| b.ends_with("components/nfd"))
        .expect("the nfd build");
    let pod = pod_template(docs, build);
    let c = main_container(&pod, build);
    let args: Vec<String> = seq(&at(&c, "args", build), build)
        .iter()
        .map(|a| text(a, build))
        .collect();
    assert!(
        args.contains(&format!("--nfd-features-file={DIR}/chd")),
        "{args:?}"
    );
    let mounted = |container: &Value| {
        seq(&at(container, "volumeMounts", build), build)
            .into_iter()
            .find(|m| at(m, "mountPath", build).as_str() == Some(DIR))
            .map(|m| text(&at(&m, "name", build), build))
    };
    let volume = mounted(&c).expect("the feature directory mounted in chd");
    let host = seq(&at(&pod.spec, "volumes", build), build)
        .into_iter()
        .find(|v| at(v, "name", build).as_str() == Some(volume.as_str()))
        .expect("its volume");
    assert_eq!(at(&host, "hostPath.path", build).as_str(), Some(DIR));
    let init = seq(&at(&pod.spec, "initContainers", build), build)
        .into_iter()
        .find(|i| at(i, "name", build).as_str() == Some("nfd-features-dir"))
        .expect("the init container");
    assert_eq!(mounted(&init), Some(volume));
    let command = seq(&at(&init, "command", build), build)
        .iter()
        .map(|a| text(a, build))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        command.contains(&format!("d={DIR} "))
            && command.contains("chgrp 9863 $d ")
            && command.contains("chmod 1775 $d "),
        "{command}"
    );
}
