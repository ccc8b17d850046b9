//! `chd serve`: wires topology, backend, store, scheduler and HTTP server together and runs
//! them until SIGTERM or SIGINT, saving the store on the way out.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use chd::analysis::verdict::{causes_of_store, Observed};
use chd::collect::{self, PciDeviceRef};
use chd::config::{Config, FALLBACK_STATE_DIR};
use chd::exposition::calibration_page::CalibrationPage;
use chd::exposition::connections::ServerMetrics;
use chd::exposition::page_cache::Page;
use chd::exposition::pair_probe_collector::PairProbeView;
use chd::exposition::scrape::Exposition;
use chd::exposition::server;
use chd::exposition::store_collector::StoreView;
use chd::exposition::verdict_collector::VerdictView;
use chd::exposition::web_settings::WebSettings;
use chd::format::fabric_dir::FabricDir;
use chd::runtime::{self, Backend, DeviceInfo};
use chd::schedule::metrics::ProbeMetrics;
use chd::schedule::verdict::{NfdFile, NodeVerdict, SharedVerdict};
use chd::schedule::Scheduler;
use chd::store::persist::{self, Loaded};
use chd::store::{unix_now, CellKey, D2dKey, P2pKey, SharedStore, Store};
use chd::topology::Topology;
use chd::vocab::{DeviceId, DevicePair};

/// Threads of the async runtime's blocking pool: scrapes and `/matrix` pages (at most
/// `exposition::server::CONCURRENT_RENDERS` at once), state saves and password checks.
/// Tokio's default, 512, lets the pool grow with every burst of blocking work (50 concurrent
/// scrapers made chd run 129 threads, tests/load.rs), and glibc gives each thread a malloc
/// arena of its own (up to 8 per core) that keeps the peak of the work that ran on it, so
/// VmRSS grew with the thread count. Bounding the threads bounds the arenas.
pub const BLOCKING_THREADS: usize = 8;

/// Every cell of the copy matrix for these CPUs and the backend's devices.
pub fn universe(config: &Config, cpus: &[u32], backend: &dyn Backend) -> Vec<CellKey> {
    let devices: Vec<&str> = backend.devices().iter().map(|d| d.id.as_str()).collect();
    chd::probe::copy_cells(
        cpus,
        &devices,
        &config.probe.sizes_bytes,
        &config.probe.directions,
    )
}

/// The pair probe and pair labels, when pairs are configured and the backend can run them.
/// A node that cannot (no accelerator, one device) logs why and serves everything else.
fn open_pairs(
    config: &Config,
    opened: &runtime::select::Opened,
) -> (Option<Arc<dyn runtime::pair::PairProbe>>, Vec<DevicePair>) {
    if config.probe.pairs.is_empty() {
        return (None, Vec::new());
    }
    let pairs = match chd::probe::pairs::resolve(
        &config.probe.pairs,
        opened.backend.devices(),
        &config.roots.sysfs,
    ) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("core-pair probe off: {e}");
            return (None, Vec::new());
        }
    };
    match runtime::select::open_pair_probe(&config.runtime, opened) {
        Ok((probe, notes)) => {
            for n in notes {
                tracing::warn!("{n}");
            }
            tracing::info!(
                method = probe.method(),
                "core-pair probe on pairs {}",
                pairs
                    .iter()
                    .map(DevicePair::as_str)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            // Know every pair's method from the start (peer copies: can the devices map each
            // other?), for the log and chd_pair_probe_info.
            for pair in &pairs {
                match probe.pair_method(pair.devices()) {
                    Ok(method) if method == runtime::peer_access::COPY_STAGED => tracing::warn!(
                        pair = %pair,
                        method,
                        "peer access refused: the pair's copies are staged through host memory \
                         and measure that path, not the link"
                    ),
                    Ok(method) => tracing::info!(pair = %pair, method, "pair probe method"),
                    Err(e) => tracing::warn!(pair = %pair, "pair probe method unknown: {e}"),
                }
            }
            (Some(probe), pairs)
        }
        Err(e) => {
            tracing::warn!("core-pair probe off: {e}");
            (None, Vec::new())
        }
    }
}

/// The backend's devices that sit on PCI, for the pcie collector.
fn pci_devices(backend: &dyn Backend) -> Vec<PciDeviceRef> {
    backend
        .devices()
        .iter()
        .filter(|d| !d.pci_bus_id.is_empty())
        .map(|d| PciDeviceRef {
            device: d.id.clone(),
            bdf: d.pci_bus_id.clone(),
        })
        .collect()
}

fn load_store(dir: &std::path::Path, topology: &Topology, backend: &dyn Backend) -> Store {
    match persist::load(dir, unix_now()) {
        Loaded::Missing => {
            tracing::info!(
                "no state file in {}; starting with an empty matrix",
                dir.display()
            );
            Store::default()
        }
        Loaded::Restored(mut store) => {
            let dropped = store.retain_known(
                |cpu| topology.cpu(cpu).is_some(),
                |dev| backend.devices().iter().any(|d| d.id == dev),
            );
            tracing::info!(
                cells = store.h2d().len(),
                dropped,
                "restored state from {}",
                persist::state_path(dir).display()
            );
            store
        }
        Loaded::SetAside { moved_to, problem } => {
            tracing::warn!(
                "state file was unusable ({problem}); moved it to {} and starting empty",
                moved_to.display()
            );
            Store::default()
        }
    }
}

/// Whether the per-cell series are exported for a matrix of `planned` cells (resolving
/// `exposition.cells = "auto"`), logged with the reason.
fn export_cells(config: &Config, planned: usize) -> bool {
    let decision = config.exposition.cells_for(planned);
    tracing::info!("{decision}");
    decision.on
}

/// Each ordered pair's path class by name, as the verdict and the ledger read them.
fn path_names(
    paths: &BTreeMap<P2pKey, chd::topology::pci_path::PathClass>,
) -> BTreeMap<String, String> {
    paths
        .iter()
        .map(|(k, c)| (k.to_string(), c.as_str().to_string()))
        .collect()
}

/// The `/matrix` page: the store's heatmaps, rendered under a read lock when asked for.
fn matrix_page(
    store: &SharedStore,
    topology: &Arc<Topology>,
    devices: &[DeviceInfo],
) -> server::PageRenderer {
    let (store, topology, devices) = (store.clone(), topology.clone(), devices.to_vec());
    Arc::new(move || {
        let store = store
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::new(Page::new(chd::report::svg::matrix_page(
            &store, &topology, &devices,
        )))
    })
}

/// Serve a recording (`--replay`) until a termination signal: no probing, no collectors,
/// no state written; every tick counts as `disabled`.
async fn run_replay(
    config: Config,
    path: std::path::PathBuf,
    web: Option<Arc<WebSettings>>,
) -> anyhow::Result<()> {
    let replay = chd::replay::load(&path, config.probe.samples_per_cell)
        .with_context(|| format!("replaying {}", path.display()))?;
    tracing::info!("replaying {}: {}", path.display(), replay.description);
    for w in &replay.warnings {
        tracing::warn!("replaying {}: {w}", path.display());
    }
    let host = super::ledger::host_of(
        &super::ledger::Input::Replay(path.clone()),
        &replay,
        None,
        &config.roots,
    );
    let topology = Arc::new(replay.topology);
    let backend = chd::replay::ReplayBackend {
        devices: replay.devices,
    };
    let (ledger_backend, links, load_profile_delta, recorded_bindable) = (
        replay.backend,
        replay.links,
        replay.load_profile_delta,
        replay.affinity,
    );
    let (p2p_paths, p2p_methods, curves, basics) = (
        replay.p2p_paths,
        replay.p2p_methods,
        replay.curves,
        replay.basics,
    );
    // The path classes a `chd probe p2p` run recorded (its devices are not this machine's
    // PCI tree); a pair it does not name is `unknown`.
    let recorded_paths: BTreeMap<P2pKey, chd::topology::pci_path::PathClass> = p2p_paths
        .iter()
        .filter_map(|(k, c)| Some((k.parse().ok()?, c.parse().ok()?)))
        .collect();
    let mut registry = Registry::default();
    let metrics = ProbeMetrics::register(&mut registry);
    let http = ServerMetrics::register(&mut registry, config.server.max_connections);
    // The first tick is counted before any scrape can see the exporter.
    metrics.idle_window("disabled");
    for e in &replay.errors {
        metrics.error(e.probe, &e.device, "recorded");
    }
    let universe: Vec<CellKey> = replay.store.h2d().keys().cloned().collect();
    // A replay measures nothing: its coverage is what the recording holds.
    let d2d_universe: Vec<D2dKey> = replay.store.d2d().keys().cloned().collect();
    let p2p_universe: Vec<P2pKey> = replay.store.p2p().keys().cloned().collect();
    let cells = export_cells(&config, universe.len());
    // A recording does not change: its verdict is what it shows, named at once.
    let (causes, best_numa) = causes_of_store(
        &replay.store,
        &chd::analysis::live::numa_map(&topology),
        &replay.pairs,
        &Observed {
            p2p_paths: p2p_paths.clone(),
            ..Observed::default()
        },
    );
    let verdict = NodeVerdict::immediate(causes, best_numa);
    tracing::info!("replay verdict: {}", verdict.line());
    registry.register_collector(Box::new(VerdictView(Arc::new(RwLock::new(verdict)))));
    let cpus: Vec<u32> = topology.cpus.iter().map(|c| c.id).collect();
    let store = Arc::new(RwLock::new(replay.store));
    let exposition = Exposition::with_store(
        registry,
        StoreView {
            store: store.clone(),
            topology: topology.clone(),
            devices: backend.devices.clone(),
            backend: backend.name().to_string(),
            universe: Arc::new(universe),
            d2d_universe: Arc::new(d2d_universe),
            p2p_universe: Arc::new(p2p_universe),
            affinity_cpus: Arc::new(cpus),
            stale_after: config.probe.stale_after,
            cells,
            pairs: replay.pairs.clone(),
            pair_cells: config.exposition.pair_cells,
            cpu_series: config.exposition.cpu_series,
            p2p_paths: Arc::new(recorded_paths),
            d2d_limits: Default::default(),
        },
    );
    let pages = server::Pages {
        matrix: Some(matrix_page(&store, &topology, &backend.devices)),
        calibration: Some(
            CalibrationPage {
                store: store.clone(),
                topology: topology.clone(),
                devices: backend.devices.clone(),
                host,
                backend: ledger_backend,
                description: path.display().to_string(),
                pairs: replay.pairs,
                recorded_links: links,
                recorded_bindable,
                load_profile_delta,
                verdict: None,
                p2p_paths,
                p2p_methods,
                curves,
                basics,
                fabric: None,
                d2d_limits: Default::default(),
            }
            .renderer(),
        ),
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(
        "listening on {}",
        listener.local_addr().context("reading the bound address")?
    );
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let server = tokio::spawn(server::serve(
        listener,
        Arc::new(exposition),
        pages,
        config.server.clone(),
        web,
        http,
        shutdown_rx.clone(),
    ));
    let ticks = {
        let mut shutdown = shutdown_rx;
        let interval = config.schedule.interval;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => metrics.idle_window("disabled"),
                    _ = shutdown.wait_for(|stop| *stop) => break,
                }
            }
        })
    };
    wait_for_signal().await?;
    let _ = shutdown_tx.send(true);
    ticks.await.context("tick loop panicked")?;
    server.await.context("HTTP server panicked")?;
    tracing::info!("stopped");
    Ok(())
}

/// How long NFD keeps the labels of a verdict without a new write: five ticks, at least ten
/// minutes (chd rewrites the file at every tick; a chd that died stops labelling the node).
fn nfd_valid_for(interval: std::time::Duration) -> std::time::Duration {
    (interval * 5).max(std::time::Duration::from_secs(600))
}

/// Run the exporter until a termination signal.
pub async fn run(config: Config) -> anyhow::Result<()> {
    // A web config that cannot be honoured stops chd before it reads or probes anything.
    let web = web_settings(&config)?;
    if let Some(path) = config.replay.clone() {
        return run_replay(config, path, web).await;
    }
    let topology = Arc::new(
        Topology::read(&config.roots).context("reading the host topology (see --sysfs-root)")?,
    );
    let opened = runtime::select::open(&config.runtime, &config.roots, &topology)?;
    for line in &opened.skipped {
        tracing::info!("{line}");
    }
    tracing::info!("backend: {}", opened.description);
    let backend = opened.backend.clone();
    let telemetry = opened.telemetry.clone();
    let (pair_probe, pairs) = open_pairs(&config, &opened);
    let (state_dir, fallback_reason) =
        persist::choose_state_dir(&config.state_dir, std::path::Path::new(FALLBACK_STATE_DIR))
            .with_context(|| {
                format!(
                    "neither {} nor ./{FALLBACK_STATE_DIR} is a writable state directory",
                    config.state_dir.display()
                )
            })?;
    if let Some(why) = fallback_reason {
        tracing::warn!("{why}; using ./{FALLBACK_STATE_DIR}");
    }
    tracing::info!("state directory: {}", state_dir.display());

    let cpus = config.probe.cpus.resolve(&topology);
    if cpus.is_empty() {
        anyhow::bail!("probe.cpus selects no online CPU");
    }
    let universe = Arc::new(universe(&config, &cpus, &*backend));
    let affinity_cpus = Arc::new(cpus);
    tracing::info!(
        backend = backend.name(),
        devices = backend.devices().len(),
        cpus = affinity_cpus.len(),
        cells = universe.len(),
        "matrix planned"
    );

    let cells = export_cells(&config, universe.len());
    // Where each ordered pair's peer copies go, read once: the PCI tree does not change.
    let p2p_paths = Arc::new(if !backend.capabilities().peer_copies {
        BTreeMap::new()
    } else {
        let ids: Vec<DeviceId> = backend
            .devices()
            .iter()
            .filter_map(|d| d.id.parse().ok())
            .collect();
        chd::probe::p2p::path_classes(
            &chd::probe::p2p::ordered_pairs(&ids),
            backend.devices(),
            &config.roots.sysfs,
        )
    });

    // The same-device and peer copy cells the windows measure, for their coverage.
    let d2d_universe: Arc<Vec<D2dKey>> = Arc::new(if config.probe.d2d_size_bytes == 0 {
        Vec::new()
    } else {
        backend
            .devices()
            .iter()
            .map(|d| D2dKey {
                device: d.id.clone(),
                size_bytes: config.probe.d2d_size_bytes,
            })
            .collect()
    });
    let p2p_universe: Arc<Vec<P2pKey>> = Arc::new(if config.probe.p2p_size_bytes == 0 {
        Vec::new()
    } else {
        p2p_paths.keys().cloned().collect()
    });

    let d2d_limits = d2d_limits(backend.devices(), &*telemetry, &config.limits);
    if !d2d_limits.is_empty() {
        tracing::info!(
            "same-device copy limits: {}",
            backend
                .devices()
                .iter()
                .filter_map(|d| {
                    let l = d2d_limits.get(&d.id, "d2d")?;
                    Some(format!(
                        "device {} {:.0} GB/s ({})",
                        d.id,
                        l.bytes_per_second / 1e9,
                        l.source
                    ))
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    let mut loaded = load_store(&state_dir, &topology, &*backend);
    loaded.set_cpu_numa(
        topology
            .cpus
            .iter()
            .filter_map(|c| Some((c.id, c.numa_node?)))
            .collect(),
    );
    let store = Arc::new(RwLock::new(loaded));
    let mut registry = Registry::default();
    let metrics = ProbeMetrics::register(&mut registry);
    let http = ServerMetrics::register(&mut registry, config.server.max_connections);
    let collectors = collect::build_set(&collect::BuildContext {
        settings: &config.collectors,
        roots: &config.roots,
        pci_devices: &pci_devices(&*backend),
        telemetry: Some(telemetry.clone()),
        state_dir: Some(&state_dir),
    });
    tracing::info!("scrape-time collectors: {}", collectors.names().join(", "));
    registry.register_collector(Box::new(collectors));
    if let Some(probe) = &pair_probe {
        registry.register_collector(Box::new(PairProbeView {
            probe: probe.clone(),
            pairs: pairs.clone(),
        }));
    }
    let verdict: SharedVerdict = Arc::default();
    registry.register_collector(Box::new(VerdictView(verdict.clone())));
    let nfd = config.nfd_features_file.clone().map(|path| NfdFile {
        path,
        valid_for: nfd_valid_for(config.schedule.interval),
    });
    let exposition = Exposition::with_store(
        registry,
        StoreView {
            store: store.clone(),
            topology: topology.clone(),
            devices: backend.devices().to_vec(),
            backend: backend.name().to_string(),
            universe: universe.clone(),
            d2d_universe: d2d_universe.clone(),
            p2p_universe: p2p_universe.clone(),
            affinity_cpus: affinity_cpus.clone(),
            stale_after: config.probe.stale_after,
            cells,
            pairs: pairs.clone(),
            pair_cells: config.exposition.pair_cells,
            cpu_series: config.exposition.cpu_series,
            p2p_paths: p2p_paths.clone(),
            d2d_limits: Arc::new(d2d_limits.clone()),
        },
    );

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;
    tracing::info!("listening on {local}");

    let pages = server::Pages {
        matrix: Some(matrix_page(&store, &topology, backend.devices())),
        calibration: Some(
            CalibrationPage {
                store: store.clone(),
                topology: topology.clone(),
                devices: backend.devices().to_vec(),
                host: chd::topology::hostname(&config.roots),
                backend: backend.name().to_string(),
                description: "chd serve".into(),
                pairs: pairs.clone(),
                recorded_links: Default::default(),
                recorded_bindable: Vec::new(),
                load_profile_delta: Default::default(),
                verdict: Some(verdict.clone()),
                p2p_paths: path_names(&p2p_paths),
                p2p_methods: Default::default(),
                curves: Vec::new(),
                basics: None,
                fabric: Some(FabricDir::of_state_dir(&state_dir)),
                d2d_limits: d2d_limits.clone(),
            }
            .renderer(),
        ),
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let server = tokio::spawn(server::serve(
        listener,
        Arc::new(exposition),
        pages,
        config.server.clone(),
        web,
        http,
        shutdown_rx.clone(),
    ));
    // Every copy cell's device work is bounded by it (`runtime::stuck_work`).
    chd::runtime::stuck_work::set_cell_timeout(config.probe.cell_timeout);
    let scheduler = Scheduler {
        roots: config.roots.clone(),
        schedule: config.schedule.clone(),
        probe: config.probe.clone(),
        host_memory: config.runtime.host_memory,
        topology,
        backend,
        store,
        metrics,
        state_dir,
        universe,
        affinity_cpus,
        telemetry,
        pair_probe,
        pairs,
        verdict,
        nfd,
        hcas: config.collectors.hcas(),
        p2p_paths: path_names(&p2p_paths),
        d2d_limits,
    };
    let prober = tokio::spawn(scheduler.run(shutdown_rx));

    wait_for_signal().await?;
    tracing::info!("stopping: finishing the cell in flight and saving state");
    let _ = shutdown_tx.send(true);
    prober.await.context("probe loop panicked")?;
    server.await.context("HTTP server panicked")?;
    tracing::info!("stopped");
    Ok(())
}

/// The web config (`server.web_config_file`), read and checked before chd listens.
fn web_settings(config: &Config) -> anyhow::Result<Option<Arc<WebSettings>>> {
    let Some(path) = &config.server.web_config_file else {
        tracing::info!("TLS and authentication are off (no server.web_config_file)");
        return Ok(None);
    };
    let web = WebSettings::load(path).context("server.web_config_file")?;
    let current = web.current();
    tracing::info!(
        path = %path.display(),
        tls = current.tls.is_some(),
        basic_auth_users = current.users.len(),
        "web config loaded (re-read when it or its certificates change)"
    );
    Ok(Some(Arc::new(web)))
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}

/// Each device's same-device copy limit (`analysis::limits`): the configured
/// `[limits."MODEL"] d2d_gbps` of its model, else half the bandwidth of the device memory NVML
/// describes. Host copies are not limited here: their PCIe link is only known after a
/// window's copies, and the report judges them from run.json.
fn d2d_limits(
    devices: &[chd::runtime::DeviceInfo],
    telemetry: &dyn chd::runtime::telemetry::DeviceTelemetry,
    configured: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>>,
) -> chd::analysis::limits::PathLimits {
    use chd::analysis::limits::{model_limits, DeviceFacts, MemoryBus, ModelLimits, PathLimits};
    let buses: std::collections::BTreeMap<String, MemoryBus> = telemetry
        .memory_buses()
        .into_iter()
        .map(|(device, b)| {
            let bus = MemoryBus {
                bus_width_bits: b.bus_width_bits,
                max_clock_mhz: b.max_clock_mhz,
            };
            (device, bus)
        })
        .collect();
    let facts: Vec<DeviceFacts> = devices
        .iter()
        .map(|d| DeviceFacts {
            device: d.id.clone(),
            model: d.name.clone(),
            link: None,
            memory: buses.get(&d.id).copied(),
            pcie_host_path: false,
        })
        .collect();
    // Only `d2d` is asked of them here: without a host path (`pcie_host_path: false`), the
    // host copies' limits are the report's to judge.
    let models: std::collections::BTreeMap<String, ModelLimits> = configured
        .iter()
        .map(|(model, ops)| (model.clone(), model_limits(ops)))
        .collect();
    PathLimits::build(&facts, &models)
}
