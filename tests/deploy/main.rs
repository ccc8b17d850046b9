//! Deployment files, checked with the tools that consume them:
//! - `deploy/systemd/`: `systemd-analyze verify` (with and without the Ascend drop-in), the
//!   hardening settings chd depends on, and the unit's command line parsed by the real binary;
//! - chd's own uid and gid in the image, the manifests and the NFD init script (`identity`);
//! - `deploy/kubernetes/`: every kustomization built with `kubectl kustomize`, the built-in
//!   kinds validated against Kubernetes' OpenAPI schemas by `kubernetes-validate --strict`, the
//!   Prometheus Operator kinds (no schema there) checked field by field here, the DaemonSet's
//!   arguments parsed by the real binary with the ConfigMap's chd.toml; the fabric component's
//!   Indexed Job, headless Service and CronJob (`fabric`);
//! - the PrometheusRule, regenerated from `alerts/` and compared byte for byte
//!   (`CHD_REGENERATE=1`, or `deploy/kubernetes/gen-prometheusrule.sh`, rewrites it), and its
//!   groups checked by `promtool check rules`;
//! - `deploy/prometheus/prometheus.yml`: `promtool check config`;
//! - `deploy/slurm/chd-fabric-round.sbatch`: run as sbatch would, with the real `scontrol`
//!   and `chd fabric rounds` and a recording `srun` (`slurm_fabric`), and shellcheck;
//! - the `dist` build profile.
//!
//! Tools (scripts/test.sh installs them; a missing one fails its test with the command that
//! installs it): `systemd-analyze` (Debian package `systemd`), `promtool` (Debian package
//! `prometheus`), `kubectl` (for `kubectl kustomize`), `kubernetes-validate` (PyPI),
//! `scontrol` (Debian package `slurm-client`), `shellcheck`.

mod dist_profile;
mod fabric;
mod identity;
mod kubernetes;
mod operator;
mod prometheus_config;
mod prometheus_rule;
mod slurm_fabric;
mod systemd;
mod tools;
mod yaml;
