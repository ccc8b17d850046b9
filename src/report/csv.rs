//! `cells.csv`: one line per cell (its samples folded into a median), for spreadsheets and
//! scripts. Bandwidth both in decimal GB/s and in bytes per second; errors quoted.

use std::fmt::Write;

use super::dataset::{size_label, Dataset};
use crate::format::run_dir::MatrixKind;

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
        .filter(|c| c.matrix.kind != MatrixKind::Basics)
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
            value.map(|v| format!("{:.3}", v / 1e9)).unwrap_or_default(),
            value.map(|v| format!("{v:.0}")).unwrap_or_default(),
            c.samples.len(),
            c.errors.len(),
            c.errors.last().map(|e| field(e)).unwrap_or_default(),
        );
    }
    out
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
