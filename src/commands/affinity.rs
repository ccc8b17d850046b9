//! `chd probe affinity`: which CPUs a thread can really be bound to (bind, read back,
//! restore), printed as a table, CSV or JSON and, with `--out DIR`, saved as
//! `DIR/affinity.json` for `chd report`.

use anyhow::{anyhow, bail, Context as _};

use super::request::AffinityRequest;
use chd::config::{Config, CpuSelection};
use chd::format::affinity_file::{self, AffinityRow};
use chd::topology::Topology;

/// Run `chd probe affinity`.
pub fn run(req: &AffinityRequest) -> anyhow::Result<()> {
    let format = req.format.clone().unwrap_or_else(|| "table".into());
    if !["table", "csv", "json"].contains(&format.as_str()) {
        bail!("--format: {format:?} is not one of table, csv, json");
    }
    let config = Config::resolve([req.layer.clone()])?;
    let topology = Topology::read(&config.roots).context("reading the host topology")?;
    let cpus: Vec<u32> = match req.cpus.as_deref().map(str::trim) {
        None | Some("all") | Some("auto") => topology.cpus.iter().map(|c| c.id).collect(),
        Some(text) => CpuSelection::parse(text)
            .map_err(|e| anyhow!("--cpus: {e}"))?
            .resolve(&topology),
    };
    if cpus.is_empty() {
        bail!("--cpus selects no online CPU");
    }
    let rows: Vec<AffinityRow> = chd::affinity::probe_bindable(&cpus)
        .into_iter()
        .map(|(cpu, bindable)| AffinityRow {
            cpu,
            numa_node: topology.cpu(cpu).and_then(|c| c.numa_node),
            bindable,
        })
        .collect();
    match format.as_str() {
        "json" => println!("{}", affinity_file::encode(&rows)),
        "csv" => {
            println!("cpu,numa_node,allowed,bindable");
            for r in &rows {
                let allowed = topology.cpu(r.cpu).is_some_and(|c| c.allowed);
                println!(
                    "{},{},{},{}",
                    r.cpu,
                    r.numa_node.map(|n| n.to_string()).unwrap_or_default(),
                    u8::from(allowed),
                    u8::from(r.bindable)
                );
            }
        }
        _ => {
            println!(
                "{:>5} {:>4} {:>8} {:>9}",
                "cpu", "numa", "allowed", "bindable"
            );
            for r in &rows {
                let allowed = topology.cpu(r.cpu).is_some_and(|c| c.allowed);
                println!(
                    "{:>5} {:>4} {:>8} {:>9}",
                    r.cpu,
                    r.numa_node
                        .map(|n| n.to_string())
                        .unwrap_or_else(|| "-".into()),
                    if allowed { "yes" } else { "no" },
                    if r.bindable { "yes" } else { "NO" }
                );
            }
        }
    }
    let bad: Vec<u32> = rows.iter().filter(|r| !r.bindable).map(|r| r.cpu).collect();
    eprintln!(
        "{} of {} CPUs bindable{}",
        rows.len() - bad.len(),
        rows.len(),
        if bad.is_empty() {
            String::new()
        } else {
            format!("; not bindable: {}", chd::topology::cpulist::format(&bad))
        }
    );
    if let Some(dir) = &req.out {
        let path = affinity_file::write(dir, &rows)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
