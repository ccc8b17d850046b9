//! Cost of one scrape of the scrape-time collectors (rdma, numa, netdev, pcie) on the
//! largest fixture, `tests/fixtures/collectors/roce-dual-rail` (two mlx5 RoCE rails with
//! counters/ and hw_counters/, 8 NUMA nodes, two GPUs): every collector reads its sysfs and
//! procfs files and the result is encoded as Prometheus text, as `/metrics` does. The issue
//! asks for a median under 5 ms.
//!
//! Before criterion runs, it prints `collectors:` lines (series and bytes of one scrape) and
//! writes the body to `target/collectors-sample.prom` for `promtool check metrics`.
//!
//! Benchmarks: `collectors/scrape` (run + encode) and `collectors/run` (reading only).
//!
//! Run: `cargo bench --bench collectors`.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::Criterion;
use prometheus_client::registry::Registry;

use chd::collect::{build, CollectorSettings, PciDeviceRef};
use chd::exposition::{encode, Format};
use chd::topology::Roots;

fn main() {
    let tree =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/collectors/roce-dual-rail");
    let roots = Roots {
        sysfs: tree.join("sys"),
        procfs: tree.join("proc"),
    };
    let gpus = vec![
        PciDeviceRef {
            device: "0".into(),
            bdf: "0000:1a:00.0".into(),
        },
        PciDeviceRef {
            device: "1".into(),
            bdf: "0000:9b:00.0".into(),
        },
    ];
    let settings = CollectorSettings::default();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(build(&settings, &roots, gpus.clone())));
    let reader = build(&settings, &roots, gpus);

    let body = encode(&registry, Format::Prometheus).expect("encode");
    let series = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    println!("collectors: series={series}");
    println!("collectors: bytes={}", body.len());
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let sample = target.join("collectors-sample.prom");
    match std::fs::create_dir_all(&target).and_then(|()| std::fs::write(&sample, &body)) {
        Ok(()) => println!("collectors: sample={}", sample.display()),
        Err(e) => println!("collectors: sample not written: {e}"),
    }

    let mut c = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    {
        let mut group = c.benchmark_group("collectors");
        group.bench_function("scrape", |b| {
            b.iter(|| encode(black_box(&registry), Format::Prometheus).expect("encode"))
        });
        group.bench_function("run", |b| b.iter(|| black_box(&reader).run()));
        group.finish();
    }
    c.final_summary();
}
