//! The alerting rules, the jsonnet mixin and the dashboards as tested code, one module per
//! concern:
//! - `rules`: `promtool check rules` and `promtool test rules` on alerts/, every alert of the
//!   contract defined, firing and silent in a test, reading only contract metrics;
//! - `mixin`: the committed rules and dashboards are what mixin/ renders, and pass mixtool's
//!   lint checks;
//! - `alert_floods`: one alert per problem (issue 29);
//! - `dashboards`: the Grafana dashboards' JSON, variables and PromQL without Grafana;
//! - `prometheus_e2e`: a real Prometheus scraping `chd serve` on the fake runtime, with the
//!   shipped rules, up to the alerts that fire.
//!
//! Every test spawns the tools and `chd` it needs with their own environment; none changes
//! the test process's environment, current directory or other process-wide state.

#[path = "../support/chd_process.rs"]
mod chd_process;
#[path = "../support/fake_runtime.rs"]
mod fake;
#[path = "../support/prometheus.rs"]
mod prometheus;
#[path = "../support/sysfs_builder.rs"]
mod sysfs_builder;
#[path = "../support/tls.rs"]
mod tls;

mod alert_floods;
mod dashboards;
mod mixin;
mod prometheus_e2e;
mod rules;
