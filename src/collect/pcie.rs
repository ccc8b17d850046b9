//! `pcie`: PCIe link width and speed (current and max) and AER error totals of the
//! accelerators the runtime backend found (`<sysfs>/bus/pci/devices/<bdf>/`) and of every
//! HCA the HCA filter allows (`<sysfs>/class/infiniband/<hca>/device/`).
//!
//! | metric | type | labels | source |
//! |---|---|---|---|
//! | `chd_device_pcie_link_width` | gauge | device, state (`current`, `max`) | `current_link_width`, `max_link_width` |
//! | `chd_device_pcie_link_speed_transfers_per_second` | gauge | device, state | `current_link_speed`, `max_link_speed` (`32.0 GT/s PCIe` -> 3.2e10) |
//! | `chd_device_pcie_aer_errors_total` | counter | device, severity (`correctable`, `nonfatal`, `fatal`) | the `TOTAL_ERR_*` row of `aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal` |
//!
//! Accelerator bus ids may come in the runtime's spelling (`00000000:1A:00.0` from CUDA and
//! NVML); they are looked up in sysfs's (`0000:1a:00.0`, [`sysfs_bdf`]).
//!
//! `device` is the runtime index (`"0"`) for an accelerator and the HCA name (`"mlx5_0"`) for
//! an HCA: one collector covers both, and an HCA name cannot be mistaken for an index.
//!
//! A link speed of `Unknown` (link down, or a virtual function) is no series and no error.
//! A device without `aer_dev_*` files (kernel without CONFIG_PCIEAER, or no AER capability:
//! the kernel then does not create them) gets no AER series and no error. An HCA without a
//! `device` link (rxe, siw) is skipped quietly. An accelerator whose `<bdf>` directory is
//! missing counts one read error; any other link file that is missing or unreadable costs
//! its series and one read error.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::read::{self, content, list_dir, parse_u32, ParseError};
use super::{CollectError, CollectorSpec, NameFilter, PciDeviceRef, ReadError, Sink, SysCollector};
pub use crate::topology::pci::sysfs_bdf;
use crate::topology::pci_link;

const WIDTH: &str = "chd_device_pcie_link_width";
const SPEED: &str = "chd_device_pcie_link_speed_transfers_per_second";
const AER: &str = "chd_device_pcie_aer_errors_total";

/// (file, severity label, total row).
const AER_FILES: [(&str, &str, &str); 3] = [
    ("aer_dev_correctable", "correctable", "TOTAL_ERR_COR"),
    ("aer_dev_nonfatal", "nonfatal", "TOTAL_ERR_NONFATAL"),
    ("aer_dev_fatal", "fatal", "TOTAL_ERR_FATAL"),
];

/// The pcie collector.
#[derive(Debug)]
pub struct PcieCollector {
    sysfs: PathBuf,
    accelerators: Vec<PciDeviceRef>,
    hcas: NameFilter,
}

impl PcieCollector {
    pub fn new(sysfs: &Path, accelerators: Vec<PciDeviceRef>, hcas: NameFilter) -> Self {
        PcieCollector {
            sysfs: sysfs.to_path_buf(),
            accelerators,
            hcas,
        }
    }
}

/// The `pcie` row of the collector table (it applies the rdma row's HCA filter).
pub const SPEC: CollectorSpec = CollectorSpec {
    name: "pcie",
    default_enabled: true,
    help: "PCIe link width/speed and AER counters of accelerators and HCAs",
    options: &[],
    build: |ctx| {
        Some(Box::new(PcieCollector::new(
            &ctx.roots.sysfs,
            ctx.pci_devices.to_vec(),
            ctx.settings.hcas(),
        )))
    },
};

/// `current_link_speed`: `"32.0 GT/s PCIe"` -> Some(3.2e10), `"8 GT/s"` (older kernels) ->
/// Some(8e9), `"Unknown"` / `"Unknown speed"` -> None ([`pci_link::parse_speed`] with the
/// collectors' error type).
pub fn parse_link_speed(text: &str) -> Result<Option<u64>, ParseError> {
    let t = content(text)?;
    pci_link::parse_speed(t).map_err(|_| ParseError::Format(read::shorten(t).to_owned()))
}

/// The `TOTAL_ERR_*` row `key` of an `aer_dev_*` file.
pub fn parse_aer_total(text: &str, key: &str) -> Result<u64, ParseError> {
    content(text)?;
    let value = text
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(key)).then(|| fields.next())
        })
        .flatten()
        .ok_or_else(|| ParseError::Format(format!("no {key} row")))?;
    read::parse_u64(value)
}

impl PcieCollector {
    fn collect_device(&self, out: &mut Sink, device: &str, dir: &Path) {
        for (file, state) in [("current_link_width", "current"), ("max_link_width", "max")] {
            if let Some(width) = out.read(&dir.join(file), parse_u32) {
                out.gauge(
                    WIDTH,
                    "PCIe link width of the device, lanes",
                    [("device", device), ("state", state)],
                    width,
                );
            }
        }
        for (file, state) in [("current_link_speed", "current"), ("max_link_speed", "max")] {
            if let Some(Some(speed)) = out.read(&dir.join(file), parse_link_speed) {
                out.gauge(
                    SPEED,
                    "PCIe link speed of the device, transfers per second per lane",
                    [("device", device), ("state", state)],
                    speed,
                );
            }
        }
        for (file, severity, key) in AER_FILES {
            let path = dir.join(file);
            let text = match fs::read_to_string(&path) {
                // No AER capability or no AER support in the kernel.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                r => r,
            };
            if let Some(total) =
                out.accept(read::value_from(&path, text, |t| parse_aer_total(t, key)))
            {
                out.counter(
                    AER,
                    "PCIe AER errors the device reported (TOTAL_ERR_* of aer_dev_*)",
                    [("device", device), ("severity", severity)],
                    total,
                );
            }
        }
    }
}

impl SysCollector for PcieCollector {
    fn name(&self) -> &'static str {
        "pcie"
    }

    fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
        let pci = self.sysfs.join("bus/pci/devices");
        for acc in &self.accelerators {
            let dir = pci.join(sysfs_bdf(&acc.bdf));
            if dir.is_dir() {
                self.collect_device(out, &acc.device, &dir);
            } else {
                out.read_error(&ReadError::Io {
                    path: dir,
                    source: io::ErrorKind::NotFound.into(),
                });
            }
        }
        let class = super::rdma::class_dir(&self.sysfs);
        let hcas = match list_dir(&class) {
            Ok(hcas) => hcas.unwrap_or_default(),
            Err(source) => {
                return Err(CollectError::List {
                    path: class,
                    source,
                })
            }
        };
        for hca in hcas.iter().filter(|h| self.hcas.allows(h)) {
            let dir = class.join(hca).join("device");
            // Software RDMA devices (rxe, siw) have no PCI function.
            if dir.is_dir() {
                self.collect_device(out, hca, &dir);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_sysfs_spelling() {
        assert_eq!(sysfs_bdf("00000000:1A:00.0"), "0000:1a:00.0");
        assert_eq!(sysfs_bdf("0000:1a:00.0"), "0000:1a:00.0");
        assert_eq!(sysfs_bdf("0001:9B:00.1"), "0001:9b:00.1");
        assert_eq!(sysfs_bdf("1a:00.0"), "1a:00.0");
    }

    #[test]
    fn link_speeds_as_pci_sysfs_prints_them() {
        assert_eq!(
            parse_link_speed("32.0 GT/s PCIe\n"),
            Ok(Some(32_000_000_000))
        );
        assert_eq!(
            parse_link_speed("16.0 GT/s PCIe\n"),
            Ok(Some(16_000_000_000))
        );
        assert_eq!(parse_link_speed("8.0 GT/s PCIe\n"), Ok(Some(8_000_000_000)));
        assert_eq!(parse_link_speed("2.5 GT/s PCIe\n"), Ok(Some(2_500_000_000)));
        assert_eq!(parse_link_speed("5 GT/s\n"), Ok(Some(5_000_000_000)));
        assert_eq!(
            parse_link_speed("64.0 GT/s PCIe\n"),
            Ok(Some(64_000_000_000))
        );
        assert_eq!(parse_link_speed("Unknown\n"), Ok(None));
        assert_eq!(parse_link_speed("Unknown speed\n"), Ok(None));
        assert_eq!(parse_link_speed(""), Err(ParseError::Empty));
        assert!(matches!(
            parse_link_speed("fast\n"),
            Err(ParseError::Format(_))
        ));
        assert!(matches!(
            parse_link_speed("8.0 MB/s\n"),
            Err(ParseError::Format(_))
        ));
    }

    /// `aer_dev_correctable` of an H100 after a marginal riser (6.5 kernel).
    const H100_CORRECTABLE: &str = "RxErr 3\nBadTLP 1\nBadDLLP 1\nRollover 0\nTimeout 0\n\
NonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 5\n";

    #[test]
    fn aer_totals() {
        assert_eq!(parse_aer_total(H100_CORRECTABLE, "TOTAL_ERR_COR"), Ok(5));
        let fatal = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\n\
UnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\n\
AtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\nTOTAL_ERR_FATAL 0\n";
        assert_eq!(parse_aer_total(fatal, "TOTAL_ERR_FATAL"), Ok(0));
        assert!(matches!(
            parse_aer_total("RxErr 0\n", "TOTAL_ERR_COR"),
            Err(ParseError::Format(_))
        ));
        assert!(matches!(
            parse_aer_total("TOTAL_ERR_COR\n", "TOTAL_ERR_COR"),
            Err(ParseError::Format(_))
        ));
        assert!(matches!(
            parse_aer_total("TOTAL_ERR_COR x\n", "TOTAL_ERR_COR"),
            Err(ParseError::NotANumber(_))
        ));
        assert_eq!(parse_aer_total("", "TOTAL_ERR_COR"), Err(ParseError::Empty));
    }
}
