//! `cells.csv`: one line per cell (its samples folded into a median), for spreadsheets and
//! scripts. Bandwidth both in decimal GB/s and in bytes per second; errors quoted.

use std::fmt::Write;

use crate::dataset::{size_label, Dataset};
use crate::probe::kind::Layout;
use crate::probe::kinds::layout;

/// The header line's columns.
pub const COLUMNS: &str = "matrix,load,cpu,numa_node,peer_cpu,device,size,size_bytes,direction,host_memory,gbps,bytes_per_second,samples,failed,last_error";

/// Quote a field when it holds a comma, quote or line break (RFC 4180).
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV text for every cell of `ds`.
pub fn render(ds: &Dataset) -> String {
    let numa = ds.numa_map();
    let mut out = String::from(COLUMNS);
    out.push('\n');
    // A basics cell's value is not always a bandwidth: `basics.csv` has them in their units.
    for c in ds
        .cells
        .iter()
        .filter(|c| layout(c.matrix.kind) != Layout::Table)
    {
        let m = &c.matrix;
        let value = c.value();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            m.kind.as_str(),
            field(&m.load),
            c.cpu,
            numa.get(&c.cpu).map(|n| n.to_string()).unwrap_or_default(),
            c.peer_cpu.map(|p| p.to_string()).unwrap_or_default(),
            field(&c.device),
            size_label(m.size_bytes),
            m.size_bytes,
            field(&m.direction),
            field(&m.host_memory),
            value
                .map(|v| format!("{:.3}", crate::vocab::Bandwidth::from_bytes_per_second(v)))
                .unwrap_or_default(),
            value.map(|v| format!("{v:.0}")).unwrap_or_default(),
            c.samples.len(),
            c.errors.len(),
            c.errors.last().map(|e| field(e)).unwrap_or_default(),
        );
    }
    out
}

/// The header line of `p2p.csv`.
pub const P2P_COLUMNS: &str = "load,size_bytes,src,dst,path,method,gbps,class_median_gbps,ratio,slow,samples,failed,last_error";

/// `p2p.csv`: one line per ordered pair of each peer copy matrix, with its path class, how it
/// was measured, its class's median and whether it is slow; `None` without p2p cells.
pub fn render_p2p(ds: &Dataset) -> Option<String> {
    use crate::analysis::p2p::P2pMatrix;
    let mut out = String::from(P2P_COLUMNS);
    out.push('\n');
    let mut any = false;
    for (id, cells) in ds.matrices() {
        if layout(id.kind) != Layout::SourceByDestination {
            continue;
        }
        any = true;
        let m = P2pMatrix::of(
            &crate::dataset::cells::cells(&cells),
            &ds.p2p_paths,
            &ds.p2p_methods,
        );
        let gb = |v: Option<f64>| {
            v.map(|v| format!("{:.3}", crate::vocab::Bandwidth::from_bytes_per_second(v)))
                .unwrap_or_default()
        };
        for p in &m.pairs {
            let median = m.class(&p.class).and_then(|c| c.median);
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                field(&id.load),
                id.size_bytes,
                field(&p.src),
                field(&p.dst),
                p.class,
                p.method.as_deref().unwrap_or_default(),
                gb(p.value),
                gb(median),
                p.ratio.map(|r| format!("{r:.3}")).unwrap_or_default(),
                p.is_slow(),
                p.samples,
                p.failed,
                p.last_error.as_deref().map(field).unwrap_or_default(),
            );
        }
    }
    any.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_with_commas_and_quotes_are_quoted() {
        assert_eq!(field("0,5"), "\"0,5\"");
        assert_eq!(field("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(field("plain"), "plain");
    }
}
