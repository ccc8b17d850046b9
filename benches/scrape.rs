//! Cost of one `/metrics` scrape on a store shaped like the seed's A3 machine: 640 CPUs
//! (2 packages, 8 NUMA nodes of 80 CPUs) x 16 devices ("0".."15") x 3 sizes (4, 16, 64 MiB),
//! h2d only = 30,720 cells of 5 samples each, plus affinity verdicts for every CPU. The
//! registry is assembled the way `chd serve` assembles it (`ProbeMetrics` + `StoreView`).
//!
//! Before criterion runs, it prints one `scrape:` line per figure (body size and line and
//! series counts per format, process RSS at start, after building the store and registry,
//! and after one scrape) and writes the Prometheus text body to
//! `target/scrape-sample.prom` for `promtool check metrics < target/scrape-sample.prom`.
//!
//! Then one `scrape: gzip ...` line per flate2 level (1, 2, 3, 4, 6, 9): bytes on the wire and the
//! median time to compress the cells-on body, side by side with the plain body, which is how
//! `exposition::content_coding::GZIP_LEVEL` was chosen.
//!
//! Then `scrape: http ...` lines: the median time of a `GET /metrics` over a keep-alive
//! connection to the real server (`exposition::server`, in process, on 127.0.0.1), plain and
//! gzip, cells on and off, through the per-window cache (`Exposition::with_store`, what
//! `chd serve` runs) and, side by side in the same interleaved rounds, encoding everything
//! at every scrape (the view registered as an ordinary collector, as before the cache).
//!
//! Benchmarks: `encode/prometheus_text`, `encode/openmetrics` (cells exported),
//! `encode/prometheus_text_no_cells` (`exposition.cells = false`: aggregates only), and
//! `encode/prometheus_text_gzip`, `encode/prometheus_text_no_cells_gzip` (encode, then gzip
//! at `GZIP_LEVEL`): the cost of encoding the store, which is also what the first scrape
//! after a probe window pays. `cached/...`: the same bodies from the cache while the store
//! does not change (every other scrape).
//!
//! Run: `cargo bench --bench scrape` (about two minutes; the figures: `... | grep '^scrape:'`).

use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use criterion::Criterion;
use prometheus_client::registry::Registry;

use chd::exposition::calibration_page::CalibrationPage;
use chd::exposition::connections::ServerMetrics;
use chd::exposition::content_coding::{gzip, gzip_at, Acceptable, GZIP_LEVEL};
use chd::exposition::scrape::Exposition;
use chd::exposition::server::{self, ServerSettings};
use chd::exposition::store_collector::StoreView;
use chd::exposition::{encode, Format};
use chd::runtime::{DeviceInfo, Direction};
use chd::schedule::metrics::ProbeMetrics;
use chd::store::{unix_now, CellKey, Sample, SharedStore, Store};
use chd::topology::{Cpu, NumaNode, Topology};

const PACKAGES: u32 = 2;
const NUMA_NODES: u32 = 8;
const CPUS_PER_NODE: u32 = 80;
const CPUS: u32 = NUMA_NODES * CPUS_PER_NODE;
const DEVICES: u32 = 16;
const SIZES_BYTES: [u64; 3] = [4 << 20, 16 << 20, 64 << 20];
const SAMPLES_PER_CELL: usize = 5;
/// Typical H2D bandwidth of the seed's healthy columns, bytes/s.
const TYPICAL: f64 = 5.8e10;
/// The seed's slow column (device "0"), bytes/s.
const SLOW_COLUMN: f64 = 1.2e10;

/// splitmix64: deterministic "random" numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// 640 CPUs without SMT: CPU n sits on NUMA node n / 80, package n / 320, core n % 320.
fn topology() -> Topology {
    let cpus_per_package = CPUS / PACKAGES;
    let cpus = (0..CPUS)
        .map(|id| Cpu {
            id,
            numa_node: Some(id / CPUS_PER_NODE),
            package: Some(id / cpus_per_package),
            core: Some(id % cpus_per_package),
            siblings: vec![id],
            allowed: true,
        })
        .collect();
    let numa_nodes = (0..NUMA_NODES)
        .map(|id| NumaNode {
            id,
            cpus: (id * CPUS_PER_NODE..(id + 1) * CPUS_PER_NODE).collect(),
            has_memory: true,
            memory_total_bytes: Some(256 << 30),
        })
        .collect();
    Topology {
        cpus,
        offline_cpus: Vec::new(),
        numa_nodes,
    }
}

/// 16 GPUs, two per NUMA node.
fn devices() -> Vec<DeviceInfo> {
    (0..DEVICES)
        .map(|d| DeviceInfo {
            id: d.to_string(),
            kind: "cuda".into(),
            name: "NVIDIA H200".into(),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x1a + d * 0x0e),
            numa_node: Some(d / (DEVICES / NUMA_NODES)),
        })
        .collect()
}

/// Every (cpu, device, size) h2d cell with `SAMPLES_PER_CELL` fresh samples, and a
/// bindable verdict for every CPU.
fn store(universe: &[CellKey], topology: &Topology, devices: &[DeviceInfo]) -> Store {
    let mut rng = Rng(0x00c0_ffee);
    let now = unix_now();
    let mut store = Store::default();
    for key in universe {
        let device: u32 = key.device.parse().expect("numeric device id");
        let cpu_node = topology.cpu(key.cpu).and_then(|c| c.numa_node);
        let local = cpu_node == devices[device as usize].numa_node;
        let mut level = if device == 0 { SLOW_COLUMN } else { TYPICAL };
        if !local {
            level *= 0.97;
        }
        if key.size_bytes < 64 << 20 {
            level *= 0.95;
        }
        // A few extreme cells, as the seed found (0.2 GB/s).
        if rng.next_u64() % 4096 == 0 {
            level = 2e8;
        }
        for i in 0..SAMPLES_PER_CELL {
            let sample = Sample {
                bytes_per_second: level * (1.0 + 0.03 * rng.unit()),
                at: now - 600.0 * (SAMPLES_PER_CELL - i) as f64,
            };
            store.record_sample(key.clone(), sample, SAMPLES_PER_CELL);
        }
    }
    let verdicts: Vec<(u32, bool)> = topology.cpus.iter().map(|c| (c.id, true)).collect();
    store.record_bindable(&verdicts, now - 60.0);
    store.record_success("h2d", now - 600.0);
    store.record_success("affinity", now - 60.0);
    store
}

struct Fixture {
    /// Cells exported, the whole view encoded at every scrape.
    registry: Registry,
    /// `exposition.cells = false`, encoded at every scrape.
    registry_no_cells: Registry,
    /// Cells exported, the store's part cached (what `chd serve` runs).
    cached: Exposition,
    cached_no_cells: Exposition,
    /// The same store, for `/api/v1/calibration`.
    store: SharedStore,
    topology: Arc<Topology>,
    devices: Vec<DeviceInfo>,
}

/// The registry `serve::run` builds before the store's view, with some probe activity.
fn probe_registry() -> Registry {
    let mut registry = Registry::default();
    let metrics = ProbeMetrics::register(&mut registry);
    for _ in 0..100 {
        metrics.run("h2d", "ok");
        metrics.idle_window("probed");
        metrics.observe_duration("h2d", 4.2);
    }
    metrics.run("affinity", "ok");
    metrics.observe_duration("affinity", 0.03);
    metrics.error("h2d", "3", "copy");
    registry
}

/// The store's view the way `serve::run` builds it.
fn view(
    store: &SharedStore,
    topology: &Arc<Topology>,
    devices: &[DeviceInfo],
    universe: &Arc<Vec<CellKey>>,
    affinity_cpus: &Arc<Vec<u32>>,
    cells: bool,
) -> StoreView {
    StoreView {
        store: store.clone(),
        topology: topology.clone(),
        devices: devices.to_vec(),
        backend: "cuda".to_string(),
        universe: universe.clone(),
        d2d_universe: Default::default(),
        p2p_universe: Default::default(),
        affinity_cpus: affinity_cpus.clone(),
        stale_after: Duration::from_secs(24 * 3600),
        cells,
        pairs: vec![],
        pair_cells: false,
        cpu_series: Default::default(),
        p2p_paths: Default::default(),
        d2d_limits: Default::default(),
    }
}

fn fixture() -> Fixture {
    let topology = Arc::new(topology());
    let devices = devices();
    let mut universe = Vec::new();
    for cpu in &topology.cpus {
        for device in &devices {
            for &size_bytes in &SIZES_BYTES {
                universe.push(CellKey {
                    cpu: cpu.id,
                    device: device.id.clone(),
                    size_bytes,
                    direction: Direction::H2d,
                });
            }
        }
    }
    let store: SharedStore = Arc::new(RwLock::new(store(&universe, &topology, &devices)));
    let universe = Arc::new(universe);
    let affinity_cpus = Arc::new(topology.cpus.iter().map(|c| c.id).collect::<Vec<u32>>());
    let view = |cells| {
        view(
            &store,
            &topology,
            &devices,
            &universe,
            &affinity_cpus,
            cells,
        )
    };
    let uncached = |cells| {
        let mut registry = probe_registry();
        registry.register_collector(Box::new(view(cells)));
        registry
    };
    Fixture {
        registry: uncached(true),
        registry_no_cells: uncached(false),
        cached: Exposition::with_store(probe_registry(), view(true)),
        cached_no_cells: Exposition::with_store(probe_registry(), view(false)),
        store: store.clone(),
        topology: topology.clone(),
        devices: devices.clone(),
    }
}

/// `/api/v1/calibration` on the same store: the page kept per store generation and held
/// verdict (what `chd serve` runs) and, interleaved in the same rounds, built afresh (what
/// every request paid before issue 28, and what the first request after a probe window pays).
fn report_ledger(fx: &Fixture, rounds: usize) {
    let page = || CalibrationPage {
        store: fx.store.clone(),
        topology: fx.topology.clone(),
        devices: fx.devices.clone(),
        host: "seed-a3".into(),
        backend: "cuda".into(),
        description: "chd serve".into(),
        pairs: Vec::new(),
        recorded_links: Default::default(),
        recorded_bindable: Vec::new(),
        load_profile_delta: Default::default(),
        verdict: Some(Arc::default()),
        p2p_paths: Default::default(),
        p2p_methods: Default::default(),
        curves: Vec::new(),
        basics: None,
        fabric: None,
        d2d_limits: Default::default(),
    };
    let cached = page().renderer();
    let fresh = page();
    let kept_page = cached();
    let bytes = kept_page.body().len();
    // The same document but for the ages and its own time, which grow between the two builds.
    fn timeless(text: &[u8]) -> serde_json::Value {
        fn strip(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    m.retain(|k, _| k != "age_seconds" && k != "generated_at");
                    m.values_mut().for_each(strip);
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
                _ => {}
            }
        }
        let mut v = serde_json::from_slice(text).expect("the page is JSON");
        strip(&mut v);
        v
    }
    assert!(
        timeless(&kept_page.body()) == timeless(fresh.rebuilt().as_bytes()),
        "the kept page is the built one"
    );
    let (mut kept, mut built) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        kept.push(median_ms(1, || {
            black_box(cached());
        }));
        built.push(median_ms(1, || {
            black_box(fresh.rebuilt());
        }));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (kept, built) = (median(kept), median(built));
    println!(
        "scrape: ledger cached_ms={kept:.3} rebuilt_ms={built:.1} bytes={bytes} ratio={:.0}",
        built / kept
    );

    // The same kept page with the state directory's fabric results as `chd serve` has them:
    // 15 peers x the 8 runs kept of each, 8 rails both ways; every request lists the
    // directory (its stamp is part of the page's key).
    let state = tempfile::tempdir().expect("temporary state directory");
    let dir = chd::format::fabric::dir_of(state.path());
    for peer in 0..15 {
        for run in 0..chd::format::fabric::KEEP_PER_PEER {
            chd::format::fabric::write(&dir, &fabric_record(peer, run)).expect("write a record");
        }
    }
    let with_fabric = CalibrationPage {
        fabric: Some(chd::format::fabric_dir::FabricDir::of_state_dir(
            state.path(),
        )),
        ..page()
    }
    .renderer();
    let fabric_bytes = with_fabric().body().len();
    let mut kept_fabric = Vec::new();
    for _ in 0..rounds {
        kept_fabric.push(median_ms(1, || {
            black_box(with_fabric());
        }));
    }
    println!(
        "scrape: ledger with fabric cached_ms={:.3} files={} bytes={fabric_bytes}",
        median(kept_fabric),
        15 * chd::format::fabric::KEEP_PER_PEER
    );
}

/// One node's record of run `run` against peer `peer`: 8 rails both ways at 24 GB/s.
fn fabric_record(peer: usize, run: usize) -> chd::format::fabric::FabricRecord {
    use chd::format::fabric::{FabricRecord, Outcome, RailRecord, Way, SCHEMA};
    let rails = (0..8)
        .flat_map(|r| {
            [Way::Send, Way::Receive].map(|way| RailRecord {
                rail: format!("eth{r}"),
                address: format!("10.{r}.0.1"),
                peer_rail: Some(format!("eth{r}")),
                peer_address: Some(format!("10.{r}.0.{}", peer + 2)),
                way,
                gbps: Some(24.0),
                bytes: 1 << 30,
                streams: 4,
                seconds: Some(0.045),
                error: None,
                slow: false,
                cpus: None,
                rdma_port: Some(format!("mlx5_{r}:1")),
                device: None,
            })
        })
        .collect();
    FabricRecord {
        schema: SCHEMA,
        run: format!("run{run}"),
        node: "seed-a3".into(),
        peer: format!("peer{peer:02}"),
        backend: "host".into(),
        world_size: 2,
        started: 1000.0 + run as f64,
        finished: 1001.0 + run as f64,
        outcome: Outcome::Ok,
        error: None,
        rails,
        collectives: Vec::new(),
    }
}

/// An exposition served by `exposition::server` on 127.0.0.1 in a runtime of its own.
fn serve(exposition: Exposition, runtime: &tokio::runtime::Runtime) -> SocketAddr {
    let mut http = Registry::default();
    let metrics = ServerMetrics::register(&mut http, 64);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("bound address");
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    runtime.spawn(async move {
        let _stop = _stop;
        server::serve(
            listener,
            Arc::new(exposition),
            server::Pages::default(),
            ServerSettings {
                max_connections: 64,
                header_timeout: Duration::from_secs(10),
                web_config_file: None,
            },
            None,
            metrics,
            shutdown,
        )
        .await
    });
    addr
}

/// A keep-alive HTTP/1.1 client for `GET /metrics`: enough of the protocol for chd's
/// responses (a status line, headers, a `content-length` body).
struct Client {
    reader: BufReader<TcpStream>,
    request: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr, gzip: bool) -> Client {
        let stream = TcpStream::connect(addr).expect("connect to the bench server");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let encoding = if gzip {
            "Accept-Encoding: gzip\r\n"
        } else {
            ""
        };
        Client {
            reader: BufReader::new(stream),
            request: format!("GET /metrics HTTP/1.1\r\nHost: bench\r\n{encoding}\r\n").into_bytes(),
        }
    }

    /// One scrape; the body's length on the wire.
    fn get(&mut self) -> usize {
        self.reader
            .get_mut()
            .write_all(&self.request)
            .expect("send the request");
        let mut len = None;
        let mut line = String::new();
        loop {
            line.clear();
            self.reader
                .read_line(&mut line)
                .expect("read the response head");
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    len = value.trim().parse().ok();
                }
            }
        }
        let len = len.expect("a content-length header");
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).expect("read the body");
        black_box(&body);
        len
    }
}

/// Median times of `GET /metrics`, cached and uncached, interleaved round by round.
fn report_http(fx: Fixture, rounds: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let Fixture {
        registry,
        registry_no_cells,
        cached,
        cached_no_cells,
        ..
    } = fx;
    let servers = [
        ("cached cells_on", serve(cached, &runtime)),
        ("cached cells_off", serve(cached_no_cells, &runtime)),
        (
            "uncached cells_on",
            serve(Exposition::new(registry), &runtime),
        ),
        (
            "uncached cells_off",
            serve(Exposition::new(registry_no_cells), &runtime),
        ),
    ];
    let mut cases: Vec<(String, Client, Vec<f64>, usize)> = servers
        .iter()
        .flat_map(|&(name, addr)| {
            [(false, "identity"), (true, "gzip")].map(|(gzip, coding)| {
                (
                    format!("{name} {coding}"),
                    Client::connect(addr, gzip),
                    Vec::new(),
                    0,
                )
            })
        })
        .collect();
    for (_, client, _, bytes) in &mut cases {
        // The first scrape of a cached exposition encodes its snapshot.
        *bytes = client.get();
    }
    for _ in 0..rounds {
        for (_, client, times, _) in &mut cases {
            let start = std::time::Instant::now();
            client.get();
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    for (name, _, mut times, bytes) in cases {
        times.sort_by(f64::total_cmp);
        println!(
            "scrape: http {name} median_ms={:.3} p99_ms={:.3} bytes={bytes}",
            times[times.len() / 2],
            times[(times.len() * 99 / 100).min(times.len() - 1)]
        );
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
}

/// VmRSS of this process, KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn report_body(name: &str, body: &str) {
    let lines = body.lines().count();
    let series = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    println!("scrape: {name} bytes={}", body.len());
    println!("scrape: {name} lines={lines}");
    println!("scrape: {name} series={series}");
}

/// Median of `runs` timings of `f`, milliseconds.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = std::time::Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

/// Bytes and compression time per gzip level, for the cells-on and cells-off bodies.
fn report_gzip(prom: &str, no_cells: &str) {
    for (name, body) in [
        ("prometheus_text", prom),
        ("prometheus_text_no_cells", no_cells),
    ] {
        println!("scrape: gzip {name} level=none bytes={}", body.len());
        for level in [1, 2, 3, 4, 6, 9] {
            let bytes = gzip_at(body.as_bytes(), level).len();
            let ms = median_ms(9, || {
                black_box(gzip_at(black_box(body.as_bytes()), level));
            });
            let chosen = if level == GZIP_LEVEL {
                " (GZIP_LEVEL)"
            } else {
                ""
            };
            println!(
                "scrape: gzip {name} level={level} bytes={bytes} ratio={:.1} compress_ms={ms:.2}{chosen}",
                body.len() as f64 / bytes as f64
            );
        }
    }
}

fn main() {
    println!("scrape: rss_start_kib={}", rss_kib());
    let fx = fixture();
    println!(
        "scrape: rss_after_build_kib={} (store + registries, {} cells)",
        rss_kib(),
        CPUS as usize * DEVICES as usize * SIZES_BYTES.len()
    );

    let prom = encode(&fx.registry, Format::Prometheus).expect("encode prometheus text");
    println!("scrape: rss_after_scrape_kib={}", rss_kib());
    let om = encode(&fx.registry, Format::OpenMetrics).expect("encode openmetrics");
    let no_cells = encode(&fx.registry_no_cells, Format::Prometheus).expect("encode without cells");
    report_body("prometheus_text", &prom);
    report_body("openmetrics", &om);
    report_body("prometheus_text_no_cells", &no_cells);

    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let sample = target.join("scrape-sample.prom");
    match std::fs::create_dir_all(&target).and_then(|()| std::fs::write(&sample, &prom)) {
        Ok(()) => println!("scrape: sample={}", sample.display()),
        Err(e) => println!("scrape: sample not written: {e}"),
    }
    report_gzip(&prom, &no_cells);
    drop((prom, om, no_cells));

    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    {
        let mut group = c.benchmark_group("encode");
        group.bench_function("prometheus_text", |b| {
            b.iter(|| encode(black_box(&fx.registry), Format::Prometheus).unwrap())
        });
        group.bench_function("openmetrics", |b| {
            b.iter(|| encode(black_box(&fx.registry), Format::OpenMetrics).unwrap())
        });
        group.bench_function("prometheus_text_no_cells", |b| {
            b.iter(|| encode(black_box(&fx.registry_no_cells), Format::Prometheus).unwrap())
        });
        group.bench_function("prometheus_text_gzip", |b| {
            b.iter(|| {
                gzip(
                    encode(black_box(&fx.registry), Format::Prometheus)
                        .unwrap()
                        .as_bytes(),
                )
            })
        });
        group.bench_function("prometheus_text_no_cells_gzip", |b| {
            b.iter(|| {
                gzip(
                    encode(black_box(&fx.registry_no_cells), Format::Prometheus)
                        .unwrap()
                        .as_bytes(),
                )
            })
        });
        group.finish();
    }
    {
        let mut group = c.benchmark_group("cached");
        let identity = Acceptable::parse([]);
        let gzip_ok = Acceptable::parse(["gzip"]);
        for (name, exposition, accept) in [
            ("prometheus_text", &fx.cached, identity),
            ("prometheus_text_no_cells", &fx.cached_no_cells, identity),
            ("prometheus_text_gzip", &fx.cached, gzip_ok),
            (
                "prometheus_text_no_cells_gzip",
                &fx.cached_no_cells,
                gzip_ok,
            ),
        ] {
            group.bench_function(name, |b| {
                b.iter(|| {
                    black_box(exposition)
                        .scrape(Format::Prometheus, accept)
                        .unwrap()
                })
            });
        }
        group.finish();
    }
    c.final_summary();
    report_ledger(&fx, 15);
    let rounds = std::env::var("CHD_BENCH_HTTP_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    report_http(fx, rounds);
}
