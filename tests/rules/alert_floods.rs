//! Issue 29: one alert per problem, measured with promtool on the rules as shipped. A node
//! whose 640 CPUs cannot be bound (a container's cpuset) and whose one RDMA port was never
//! cabled (never ACTIVE) raised 641 firing alerts with the rules before issue 29: one
//! ChdCpuNotBindable per CPU and a critical ChdRdmaPortDown for the port. Now it raises
//! exactly one, ChdCpuNotBindable for the node, with every CPU in its description.

use crate::prometheus;

use crate::prometheus::{promtool_ok, rules_path};

const CPUS: u32 = 640;

/// A promtool test file: the node's series for 30 minutes, and what must fire at 25m;
/// `extra` adds alert_rule_test cases.
fn flood_test(rules: &std::path::Path, extra: &str) -> String {
    let node = r#"job="chd",instance="gpu-640""#;
    let mut series = vec![
        format!("      - series: 'up{{{node}}}'\n        values: '1x30'\n"),
        format!(
            "      - series: 'chd_build_info{{{node},version=\"0.1.0\",backend=\"cuda\"}}'\n        values: '1x30'\n"
        ),
        // The uncabled port: DOWN and Polling from the first scrape on.
        format!(
            "      - series: 'chd_rdma_port_state{{{node},hca=\"mlx5_3\",port=\"1\"}}'\n        values: '1x30'\n"
        ),
        format!(
            "      - series: 'chd_rdma_port_physical_state{{{node},hca=\"mlx5_3\",port=\"1\"}}'\n        values: '2x30'\n"
        ),
    ];
    for cpu in 0..CPUS {
        series.push(format!(
            "      - series: 'chd_cpu_bindable{{{node},cpu=\"{cpu}\"}}'\n        values: '0x30'\n"
        ));
    }
    format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{}\
         \x20   alert_rule_test:\n\
         \x20     - eval_time: 25m\n        alertname: ChdRdmaPortDown\n        exp_alerts: []\n{}\
         \x20   promql_expr_test:\n\
         \x20     - expr: count(ALERTS{{alertstate=\"firing\"}})\n        eval_time: 25m\n        exp_samples:\n\
         \x20         - labels: '{{}}'\n            value: 1\n\
         \x20     - expr: count(ALERTS{{alertname=\"ChdCpuNotBindable\", alertstate=\"firing\", instance=\"gpu-640\"}})\n        eval_time: 25m\n        exp_samples:\n\
         \x20         - labels: '{{}}'\n            value: 1\n",
        rules.display(),
        series.concat(),
        extra
    )
}

#[test]
fn a_640_cpu_cpuset_and_an_uncabled_port_raise_one_alert() {
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("flood.yml");
    std::fs::write(&test, flood_test(&rules_path(), "")).unwrap();
    let out = promtool_ok(
        [
            std::ffi::OsStr::new("test"),
            std::ffi::OsStr::new("rules"),
            test.as_os_str(),
        ],
        "640-CPU flood test",
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_one_alert_lists_every_cpu() {
    // The description names the CPUs (rendered with the node's own series), so the one
    // alert loses nothing of what the 640 said.
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("flood.yml");
    let cpus: Vec<String> = {
        let mut v: Vec<String> = (0..CPUS).map(|c| c.to_string()).collect();
        v.sort(); // sortByLabel sorts the label's text
        v
    };
    // A deliberately wrong expectation (silence) makes promtool print the alert it got.
    let text = flood_test(
        &rules_path(),
        "      - eval_time: 25m\n        alertname: ChdCpuNotBindable\n        exp_alerts: []\n",
    );
    std::fs::write(&test, text).unwrap();
    let out = prometheus::run_tool(
        "promtool",
        [
            std::ffi::OsStr::new("test"),
            "rules".as_ref(),
            test.as_os_str(),
        ],
    );
    let shown =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "promtool accepted a wrong expectation:\n{shown}"
    );
    let list = cpus.join(",");
    assert!(
        shown.contains("640 CPU(s) of gpu-640 cannot be bound") && shown.contains(&list),
        "ChdCpuNotBindable's description does not list the 640 CPUs:\n{}",
        &shown[..shown.len().min(4000)]
    );
}
