//! The `chd` binary: parses the command line, sets up logging and dispatches.

mod cli;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use chd::config::{Config, Layer};
use chd::runtime::{self, describe};
use chd::topology::{render, Topology};
use cli::{Cli, Command, H2dArgs, ProbeCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Serve(args) => {
            let mut layers = Vec::new();
            if let Some(path) = &args.config {
                layers.push(Layer::from_file(path)?);
            }
            layers.push(cli.serve_layer(Some(args)));
            let config = Config::resolve(layers)?;
            if args.print_config {
                print!("{}", config.to_toml());
                return Ok(());
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .thread_name("chd-worker")
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(chd::serve::run(config))
        }
        Command::Probe(ProbeCommand::H2d(args)) => probe_h2d(&cli, args),
        Command::Topology(args) => {
            let config = Config::resolve([cli.runtime_layer(&args.runtime)])?;
            let topology = Topology::read(&config.roots)?;
            let opened = runtime::select::open(&config.runtime, &config.roots, &topology)?;
            let devices = opened.backend.devices();
            if args.json {
                println!(
                    "{}",
                    describe::topology_json(&topology, opened.backend.name(), devices)
                );
            } else {
                print!("{}", render::table(&topology));
                print!(
                    "{}",
                    describe::devices_table(opened.backend.name(), &opened.description, devices)
                );
                for line in &opened.skipped {
                    println!("note: {line}");
                }
            }
            Ok(())
        }
    }
}

/// `chd probe h2d`: measure the selected cells now and print them.
fn probe_h2d(cli: &Cli, args: &H2dArgs) -> anyhow::Result<()> {
    use chd::config::CpuSelection;
    use chd::probe::{copy_cells, oneshot};
    use chd::runtime::{Direction, HostMemory};

    // --host-memory takes a list here; the rest of the runtime flags are as for serve.
    let memories: Vec<HostMemory> = args
        .runtime
        .host_memory
        .as_deref()
        .unwrap_or("pinned")
        .split(',')
        .map(|m| m.trim().parse::<HostMemory>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--host-memory: {e}"))?;
    let mut layer = cli.runtime_layer(&args.runtime);
    layer.runtime.host_memory = None;
    let config = Config::resolve([layer])?;
    let topology = Topology::read(&config.roots)?;
    let opened = runtime::select::open(&config.runtime, &config.roots, &topology)?;
    for line in &opened.skipped {
        eprintln!("note: {line}");
    }
    eprintln!("backend: {}", opened.description);
    // The host backend copies between ordinary memory only.
    let memories = if opened.backend.name() == "host" {
        vec![HostMemory::Pageable]
    } else {
        memories
    };

    let cpus = CpuSelection::parse(&args.cpus)
        .map_err(|e| anyhow::anyhow!("--cpus: {e}"))?
        .resolve(&topology);
    let known: Vec<&str> = opened
        .backend
        .devices()
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    let devices: Vec<&str> = if args.devices.trim() == "all" {
        known.clone()
    } else {
        let wanted: Vec<&str> = args.devices.split(',').map(str::trim).collect();
        if let Some(bad) = wanted.iter().find(|d| !known.contains(d)) {
            anyhow::bail!(
                "--devices: {bad:?} is not a device of this backend ({})",
                known.join(", ")
            );
        }
        wanted
    };
    let directions: Vec<Direction> = args
        .directions
        .iter()
        .map(|d| d.parse::<Direction>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--directions: {e}"))?;
    if args.sizes.contains(&0) || args.iterations == 0 || args.samples == 0 {
        anyhow::bail!("--sizes, --iterations and --samples must be at least 1");
    }
    if !["table", "csv", "json"].contains(&args.format.as_str()) {
        anyhow::bail!("--format: {:?} is not one of table, csv, json", args.format);
    }
    let sizes: Vec<u64> = args.sizes.iter().map(|m| m << 20).collect();
    if cpus.is_empty() || devices.is_empty() {
        anyhow::bail!(
            "nothing to measure: {} CPUs x {} devices",
            cpus.len(),
            devices.len()
        );
    }
    let spec = oneshot::OneShotSpec {
        cells: copy_cells(&cpus, &devices, &sizes, &directions),
        host_memories: memories,
        warmup: args.warmup,
        iterations: args.iterations,
        samples: args.samples,
    };
    eprintln!(
        "measuring {} cells x {} samples on {} CPUs and {} devices",
        spec.cells.len() * spec.host_memories.len(),
        spec.samples,
        cpus.len(),
        devices.len()
    );
    let started = std::time::Instant::now();
    let mut last = std::time::Instant::now();
    let mut progress = |done: usize, total: usize| {
        if last.elapsed().as_secs() >= 5 || done == total {
            eprintln!(
                "  {done}/{total} samples, {:.0} s",
                started.elapsed().as_secs_f64()
            );
            last = std::time::Instant::now();
        }
    };
    let rows = oneshot::run(&*opened.backend, &topology, &spec, &mut progress);
    match args.format.as_str() {
        "csv" => print!("{}", oneshot::to_csv(&rows)),
        "json" => println!("{}", serde_json::to_string_pretty(&rows)?),
        _ => print!("{}", oneshot::to_table(&rows)),
    }
    let failed = rows.iter().filter(|r| r.bytes_per_second.is_none()).count();
    if failed > 0 {
        anyhow::bail!("{failed} of {} cells could not be measured", rows.len());
    }
    Ok(())
}
