//! The host backend end to end on the live machine: a dedicated thread bound to each allowed
//! CPU measures 16 MiB h2d and d2h cells against NUMA node 0, and the test thread's own
//! affinity is untouched afterwards.

use chd::affinity;
use chd::runtime::host::HostBackend;
use chd::runtime::{Backend, CopyParams, Direction, HostMemory};
use chd::topology::{Cpu, NumaNode, Topology};

const MIB: u64 = 1 << 20;

/// Node 0 with the CPUs this test may run on (built by hand; no sysfs reading here).
fn live_topology(cpus: &[u32]) -> Topology {
    Topology {
        cpus: cpus
            .iter()
            .map(|&id| Cpu {
                id,
                numa_node: Some(0),
                package: Some(0),
                core: Some(id),
                siblings: vec![id],
                allowed: true,
            })
            .collect(),
        offline_cpus: vec![],
        numa_nodes: vec![NumaNode {
            id: 0,
            cpus: cpus.to_vec(),
            has_memory: true,
            memory_total_bytes: None,
        }],
    }
}

#[test]
fn bound_thread_per_cpu_measures_h2d_and_d2h() {
    let before = affinity::current_cpus().expect("read affinity");
    let backend = std::sync::Arc::new(HostBackend::new(&live_topology(&before)));
    assert_eq!(backend.devices().len(), 1);
    assert_eq!(backend.devices()[0].id, "numa0");

    for &cpu in &before {
        let b = backend.clone();
        let results = std::thread::Builder::new()
            .name(format!("probe-cpu{cpu}"))
            .spawn(move || {
                let binding = affinity::bind_exactly(cpu).expect("bind");
                assert_eq!(affinity::current_cpus().unwrap(), vec![cpu]);
                let out: Vec<(Direction, f64)> = [Direction::H2d, Direction::D2h]
                    .into_iter()
                    .map(|direction| {
                        let params = CopyParams {
                            size_bytes: 16 * MIB,
                            direction,
                            warmup: 2,
                            iterations: 8,
                            host_memory: HostMemory::Pageable,
                        };
                        let bw = b
                            .measure_copy("numa0", &params)
                            .unwrap_or_else(|e| panic!("cpu {cpu} {direction:?}: {e}"));
                        (direction, bw)
                    })
                    .collect();
                drop(binding);
                out
            })
            .expect("spawn")
            .join()
            .expect("probe thread panicked");

        for (direction, bw) in results {
            eprintln!(
                "cpu {cpu} {} numa0 16 MiB: {:.2} GB/s",
                direction.as_str(),
                bw / 1e9
            );
            assert!(bw.is_finite(), "cpu {cpu} {direction:?}: {bw}");
            assert!(bw > 100e6, "cpu {cpu} {direction:?}: {bw} B/s is too slow");
            assert!(
                bw < 10e12,
                "cpu {cpu} {direction:?}: {bw} B/s is impossible"
            );
        }
        assert_eq!(
            affinity::current_cpus().unwrap(),
            before,
            "the test thread must not be left bound"
        );
    }
}

#[test]
fn unknown_device_is_reported_as_such() {
    let cpus = affinity::current_cpus().expect("read affinity");
    let backend = HostBackend::new(&live_topology(&cpus));
    let params = CopyParams {
        size_bytes: MIB,
        direction: Direction::H2d,
        warmup: 0,
        iterations: 1,
        host_memory: HostMemory::Pageable,
    };
    for device in ["numa1", "numa99", "0", "gpu0"] {
        let err = backend
            .measure_copy(device, &params)
            .expect_err("unknown device must fail");
        assert_eq!(err.reason(), "unknown_device", "{device}: {err}");
        assert!(err.to_string().contains(device), "{err}");
    }
}
