//! One sysfs/procfs value: `collect::read`'s parsers and the collectors' own (`rdma`,
//! `pcie`, `netdev`, `numa`), and `topology::pci`'s `numa_node`.

use std::io;
use std::path::Path;

use chd::collect::read::{self, ParseError, ReadError};
use chd::collect::{netdev, numa, pcie, rdma};
use chd::topology::pci;

/// Every parser on the same text: numbers that parse print back to themselves, rates and
/// speeds are finite and non-negative, row names are what the row starts with, and a
/// parse error, once given a path, names that path.
pub fn check(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    let path = Path::new("/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data");
    match read::parse_u64(text) {
        Ok(v) => assert_eq!(read::parse_u64(&v.to_string()), Ok(v)),
        Err(e) => names_the_file(path, text, e),
    }
    if let Ok(v) = read::parse_u32(text) {
        assert_eq!(read::parse_u32(&v.to_string()), Ok(v));
        assert_eq!(read::parse_u64(text), Ok(u64::from(v)));
    }
    if let Ok(word) = read::parse_word(text) {
        assert_eq!(word, text.trim());
        assert!(!word.is_empty() && !word.starts_with("N/A"), "{word:?}");
    }
    if let Ok(state) = rdma::parse_state(text) {
        assert_eq!(rdma::parse_state(&format!("{state}: ACTIVE\n")), Ok(state));
    }
    if let Ok(rate) = rdma::parse_rate(text) {
        assert!(rate.is_finite() && rate >= 0.0, "rate {rate} from {text:?}");
    }
    match rdma::parse_numa_node(text) {
        Ok(Some(node)) => assert_eq!(pci::parse_numa_node(text), Some(node)),
        Ok(None) => assert_eq!(pci::parse_numa_node(text), None),
        Err(_) => {}
    }
    let _ = pcie::parse_link_speed(text);
    let _ = pcie::parse_aer_total(text, "TOTAL_ERR_COR");
    for row in netdev::parse_net_dev(text).into_iter().flatten() {
        assert!(
            !row.name.is_empty() && !row.name.contains(':'),
            "{:?}",
            row.name
        );
        assert_eq!(row.name, row.name.trim());
        if let Ok(values) = &row.values {
            assert!(values.len() >= 16, "{} values", values.len());
        }
    }
    for (event, value) in numa::parse_numastat(text).into_iter().flatten() {
        assert!(
            !event.is_empty() && !event.contains(char::is_whitespace),
            "{event:?}"
        );
        let row = format!("{event} {value}\n");
        assert_eq!(numa::parse_numastat(&row), vec![Ok((event, value))]);
    }
    for (kind, bytes) in numa::parse_meminfo(text).into_iter().flatten() {
        assert_eq!(bytes % 1024, 0, "{kind}: {bytes} is not whole kB");
    }
}

/// `value_from` wraps a parse error with the file's path, and the message shows both.
fn names_the_file(path: &Path, text: &str, _error: ParseError) {
    let err = read::value_from(path, Ok(text.to_owned()), read::parse_u64).unwrap_err();
    assert!(matches!(err, ReadError::Parse { .. }), "{err:?}");
    assert_eq!(err.path(), path);
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    let io = read::value_from(
        path,
        Err(io::Error::from(io::ErrorKind::InvalidInput)),
        read::parse_u64,
    )
    .unwrap_err();
    assert!(io.to_string().contains(&path.display().to_string()), "{io}");
}
