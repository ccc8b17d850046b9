//! The `chd` binary: parses the command line, sets up logging and dispatches.

#![deny(unsafe_code)]

mod cli;
mod commands;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use chd::config::{Config, Layer};
use chd::runtime::{self, describe};
use chd::topology::{render, Topology};
use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.check_usage() {
        e.exit();
    }
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // `chd check` speaks in exit codes (0 ok, 1 degraded, 2 failed, 3 unknown; 4 the Slurm
    // circuit breaker refused a drain; NPD's 0, 1, 2 with --npd).
    if let Command::Check(args) = &cli.command {
        let samples = Config::resolve([])
            .map(|c| c.probe.samples_per_cell)
            .unwrap_or(5);
        return commands::check::run(&args.source(), &args.mode(), samples, &cli.roots());
    }
    if let Command::Advise(args) = &cli.command {
        return advise(&cli, args);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `chd advise`: 0 advised, or every rank of the map at or above the threshold; 1 a rank
/// below it; 2 the advice could not be given (bad input).
fn advise(cli: &Cli, args: &cli::AdviseArgs) -> ExitCode {
    let request = commands::advise::AdviseRequest {
        source: args.source(),
        json: args.json,
        map: args.map.clone(),
        threshold: args.threshold,
        roots: cli.roots(),
    };
    match commands::advise::run(&request) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chd: {e:#}");
            ExitCode::from(2)
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
                .max_blocking_threads(commands::serve::BLOCKING_THREADS)
                .enable_all()
                .thread_name("chd-worker")
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(commands::serve::run(config))
        }
        Command::Probe(probe) => commands::probe::run(cli.probe_request(probe)),
        Command::Report(args) => commands::report::run(&args.request()),
        Command::Check(_) => unreachable!("chd check returns its exit code from main"),
        Command::Advise(_) => unreachable!("chd advise is run by main"),
        Command::Ledger(args) => commands::ledger::run(&commands::ledger::LedgerRequest {
            input: args.input(),
            merge: args.merge.clone(),
            url: args.remote(),
            host: args.host.clone(),
            out: args.out.clone(),
            roots: cli.roots(),
        }),
        Command::Fabric(cli::FabricCommand::Rounds(args)) => {
            commands::fabric::rounds(&args.request())
        }
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
