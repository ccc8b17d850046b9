//! The PCIe link of a device (`current_link_{speed,width}` and `max_link_{speed,width}` under
//! `<sysfs>/bus/pci/devices/<bdf>/`) and the payload bandwidth a link can carry: the line
//! rate of every lane after its line encoding, the physical limit no copy over that link can
//! beat (TLP headers and flow control take a few percent more, so real copies reach ~0.8-0.9
//! of it).
//!
//! | GT/s | generation | encoding | payload per lane |
//! |---|---|---|---|
//! | 2.5 | 1 | 8b/10b | 0.25 GB/s |
//! | 5 | 2 | 8b/10b | 0.5 GB/s |
//! | 8 | 3 | 128b/130b | 0.985 GB/s |
//! | 16 | 4 | 128b/130b | 1.969 GB/s |
//! | 32 | 5 | 128b/130b | 3.938 GB/s |
//! | 64 | 6 | FLIT, 236 of 256 bytes | 7.375 GB/s |
//! | 128 | 7 | FLIT, 236 of 256 bytes | 14.75 GB/s |
//!
//! In FLIT mode (PCIe 6.0, PAM4) a 256-byte flit carries 236 bytes of TLPs, 6 of data link
//! layer payload, 8 of CRC and 6 of FEC; only the TLP bytes carry the copy. So Gen5 x16 =
//! 63.0 GB/s, Gen4 x16 = Gen5 x8 = 31.5 GB/s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::pci::sysfs_bdf;

/// One end of a link's state: its width and its speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkState {
    /// Lanes.
    pub width: u32,
    /// Transfers per second per lane (`32.0 GT/s` = 32e9).
    pub transfers_per_second: u64,
}

/// A device's link as sysfs reports it: as trained now, and the most the device supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub current: LinkState,
    pub max: LinkState,
}

/// (GT/s, generation, payload bits per transferred bit).
const GENERATIONS: [(f64, u8, f64); 7] = [
    (2.5, 1, 8.0 / 10.0),
    (5.0, 2, 8.0 / 10.0),
    (8.0, 3, 128.0 / 130.0),
    (16.0, 4, 128.0 / 130.0),
    (32.0, 5, 128.0 / 130.0),
    (64.0, 6, 236.0 / 256.0),
    (128.0, 7, 236.0 / 256.0),
];

fn generation_row(transfers_per_second: u64) -> Option<(u8, f64)> {
    let gt = transfers_per_second as f64 / 1e9;
    GENERATIONS
        .iter()
        .find(|(rate, _, _)| (gt - rate).abs() < 0.05)
        .map(|&(_, generation, efficiency)| (generation, efficiency))
}

impl LinkState {
    /// The PCIe generation of this speed (`5` for 32 GT/s); `None` for a speed no generation
    /// defines.
    pub fn generation(&self) -> Option<u8> {
        generation_row(self.transfers_per_second).map(|(g, _)| g)
    }

    /// Payload bytes per second this state can carry in one direction; `None` for a speed
    /// no generation defines (its encoding is unknown) or no lanes.
    pub fn payload_bytes_per_second(&self) -> Option<f64> {
        let (_, efficiency) = generation_row(self.transfers_per_second)?;
        (self.width > 0)
            .then(|| self.transfers_per_second as f64 * efficiency * f64::from(self.width) / 8.0)
    }

    /// `x8 Gen5`, or `x8 20 GT/s` for a speed no generation defines.
    pub fn describe(&self) -> String {
        match self.generation() {
            Some(g) => format!("x{} Gen{g}", self.width),
            None => format!(
                "x{} {} GT/s",
                self.width,
                self.transfers_per_second as f64 / 1e9
            ),
        }
    }
}

impl Link {
    /// `x8 Gen5 of x16 Gen5, 31.5 GB/s`: the state now and at most, and the payload now.
    pub fn describe(&self) -> String {
        let payload = self
            .current
            .payload_bytes_per_second()
            .map(|b| format!(", {:.1} GB/s", b / 1e9))
            .unwrap_or_default();
        format!(
            "{} of {}{payload}",
            self.current.describe(),
            self.max.describe()
        )
    }

    /// Trained below what the device supports, in width or speed.
    pub fn degraded(&self) -> bool {
        self.current.width < self.max.width
            || self.current.transfers_per_second < self.max.transfers_per_second
    }
}

/// Why a link file's value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkValueError {
    #[error("not a link speed: {0:?}")]
    Speed(String),
    #[error("not a link width: {0:?}")]
    Width(String),
}

/// `current_link_speed`: `"32.0 GT/s PCIe"` -> Some(32e9), `"8 GT/s"` (older kernels) ->
/// Some(8e9), `"Unknown"` / `"Unknown speed"` (link down, virtual functions) -> None.
pub fn parse_speed(text: &str) -> Result<Option<u64>, LinkValueError> {
    let t = text.trim();
    if t.starts_with("Unknown") {
        return Ok(None);
    }
    let bad = || LinkValueError::Speed(t.chars().take(40).collect());
    let mut fields = t.split_whitespace();
    let gt: f64 = fields.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    if fields.next() != Some("GT/s") || !(0.0..=1e4).contains(&gt) {
        return Err(bad());
    }
    Ok(Some((gt * 1e9).round() as u64))
}

/// `current_link_width`: a lane count.
pub fn parse_width(text: &str) -> Result<u32, LinkValueError> {
    let t = text.trim();
    t.parse()
        .map_err(|_| LinkValueError::Width(t.chars().take(40).collect()))
}

/// The link of the PCI function `bdf` (sysfs spelling, see [`super::pci::sysfs_bdf`]);
/// `None` when any of the four files is missing, unreadable, garbage or `Unknown`.
pub fn read(sysfs: &Path, bdf: &str) -> Option<Link> {
    let dir = sysfs.join("bus/pci/devices").join(bdf);
    let text = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let state = |width: &str, speed: &str| {
        Some(LinkState {
            width: parse_width(&text(width)?).ok()?,
            transfers_per_second: parse_speed(&text(speed)?).ok()??,
        })
    };
    Some(Link {
        current: state("current_link_width", "current_link_speed")?,
        max: state("max_link_width", "max_link_speed")?,
    })
}

/// Where to read each device's link: its PCI function under a sysfs root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceLinks {
    sysfs: PathBuf,
    /// Device label -> sysfs bus id.
    bdfs: BTreeMap<String, String>,
}

impl DeviceLinks {
    /// `devices` as (label, bus id in any spelling); devices without a bus id (the host
    /// backend's NUMA nodes) have no link.
    pub fn new<'a>(sysfs: &Path, devices: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        DeviceLinks {
            sysfs: sysfs.to_path_buf(),
            bdfs: devices
                .into_iter()
                .filter(|(_, bus_id)| !bus_id.is_empty())
                .map(|(device, bus_id)| (device.to_string(), sysfs_bdf(bus_id)))
                .collect(),
        }
    }

    /// The link of `device` now, if it has one sysfs can tell.
    pub fn read(&self, device: &str) -> Option<Link> {
        read(&self.sysfs, self.bdfs.get(device)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(width: u32, gt: f64) -> LinkState {
        LinkState {
            width,
            transfers_per_second: (gt * 1e9) as u64,
        }
    }

    fn gbps(s: LinkState) -> f64 {
        s.payload_bytes_per_second().unwrap() / 1e9
    }

    #[test]
    fn payload_follows_each_generations_encoding() {
        // The reference points.
        assert!((gbps(state(16, 32.0)) - 63.015).abs() < 0.01, "Gen5 x16");
        assert!((gbps(state(16, 16.0)) - 31.508).abs() < 0.01, "Gen4 x16");
        assert!((gbps(state(8, 32.0)) - 31.508).abs() < 0.01, "Gen5 x8");
        // 8b/10b: a fifth of the line rate is encoding.
        assert!((gbps(state(16, 2.5)) - 4.0).abs() < 1e-9, "Gen1 x16");
        assert!((gbps(state(1, 5.0)) - 0.5).abs() < 1e-9, "Gen2 x1");
        // 128b/130b.
        assert!((gbps(state(4, 8.0)) - 3.938).abs() < 0.001, "Gen3 x4");
        // FLIT: 236 of 256 bytes.
        assert!((gbps(state(16, 64.0)) - 118.0).abs() < 1e-9, "Gen6 x16");
        assert!((gbps(state(16, 128.0)) - 236.0).abs() < 1e-9, "Gen7 x16");
    }

    #[test]
    fn unknown_speeds_and_no_lanes_have_no_payload() {
        assert_eq!(state(16, 20.0).payload_bytes_per_second(), None);
        assert_eq!(state(0, 32.0).payload_bytes_per_second(), None);
        assert_eq!(state(16, 20.0).generation(), None);
        assert_eq!(state(8, 32.0).describe(), "x8 Gen5");
        assert_eq!(state(8, 20.0).describe(), "x8 20 GT/s");
    }

    #[test]
    fn degraded_in_width_or_speed() {
        let full = state(16, 32.0);
        let link = |current| Link { current, max: full };
        assert!(!link(full).degraded());
        assert!(link(state(8, 32.0)).degraded());
        assert!(link(state(16, 16.0)).degraded());
    }

    #[test]
    fn parses_the_kernels_spellings() {
        assert_eq!(parse_speed("32.0 GT/s PCIe\n"), Ok(Some(32_000_000_000)));
        assert_eq!(parse_speed("2.5 GT/s PCIe\n"), Ok(Some(2_500_000_000)));
        assert_eq!(parse_speed("8 GT/s\n"), Ok(Some(8_000_000_000)));
        assert_eq!(parse_speed("Unknown\n"), Ok(None));
        assert_eq!(parse_speed("Unknown speed\n"), Ok(None));
        assert!(parse_speed("fast").is_err());
        assert!(parse_speed("32 Gb/s").is_err());
        assert!(parse_speed("1e300 GT/s").is_err());
        assert_eq!(parse_width("16\n"), Ok(16));
        assert!(parse_width("x16").is_err());
    }

    #[test]
    fn reads_a_device_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bus/pci/devices/0000:1a:00.0");
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in [
            ("current_link_width", "8\n"),
            ("max_link_width", "16\n"),
            ("current_link_speed", "32.0 GT/s PCIe\n"),
            ("max_link_speed", "32.0 GT/s PCIe\n"),
        ] {
            std::fs::write(dir.join(file), text).unwrap();
        }
        let link = read(tmp.path(), "0000:1a:00.0").unwrap();
        let links = DeviceLinks::new(tmp.path(), [("0", "00000000:1A:00.0"), ("numa0", "")]);
        assert_eq!(links.read("0"), Some(link));
        assert_eq!(links.read("numa0"), None);
        assert_eq!(link.current, state(8, 32.0));
        assert_eq!(link.max, state(16, 32.0));
        assert!(link.degraded());
        assert_eq!(link.describe(), "x8 Gen5 of x16 Gen5, 31.5 GB/s");
        assert_eq!(read(tmp.path(), "0000:1b:00.0"), None);
        std::fs::write(dir.join("current_link_speed"), "Unknown\n").unwrap();
        assert_eq!(read(tmp.path(), "0000:1a:00.0"), None);
    }
}
