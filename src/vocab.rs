//! The small values every layer names, each a type that parses and prints itself (as the
//! `http` crate's `StatusCode` and `Method` do): a device id, an unordered device pair (`0,5`,
//! rank 0's device first), an ordered device pair (`0>5`: a copy from device 0 into device
//! 5), a copy direction, a host memory kind and a bandwidth. A value is checked once, where it
//! enters (a flag, a file, a label), and nothing below splits or formats these strings by
//! hand. Every one serializes as the string it prints, so the files that hold them (run.json,
//! cells.jsonl, state.json) keep the shape they had when these were plain strings.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a value of the vocabulary could not be parsed. The message names the value and what
/// was expected; the caller adds where it came from (a flag, a file and line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

/// Serialize as the value's `Display`, deserialize through its `FromStr`.
macro_rules! string_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A device as the `device` label spells it: a runtime index (`"3"`), or `numa<N>` for the
/// host backend's memory nodes. Never empty, and free of the pair separators `,` and `>` and
/// of whitespace, so a pair of ids always splits back into the same two.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(String);

impl DeviceId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DeviceId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<DeviceId, ParseError> {
        if s.is_empty() {
            return Err(ParseError("a device id cannot be empty".into()));
        }
        if let Some(c) = s
            .chars()
            .find(|c| matches!(c, ',' | '>') || c.is_whitespace() || c.is_control())
        {
            return Err(ParseError(format!(
                "{s:?} is not a device id (it holds {c:?})"
            )));
        }
        Ok(DeviceId(s.to_string()))
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DeviceId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for DeviceId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for DeviceId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

string_serde!(DeviceId);

/// Two different devices that run one collective together, written `A,B` (the `pair` label,
/// `chd probe pair --pair 0,5`): rank 0 on `first`, rank 1 on `second`. The pair is
/// unordered as a link (`0,5` and `5,0` join the same devices: [`DevicePair::same_devices`])
/// but keeps the order it was given in, which is the rank order. It holds its label, so it
/// reads as the `&str` the labels and the analysis take without allocating.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePair {
    label: String,
    /// Where the separator is in `label`.
    at: usize,
}

/// Two different device ids joined by `sep` into one label.
fn joined(first: &DeviceId, second: &DeviceId, sep: char) -> (String, usize) {
    (format!("{first}{sep}{second}"), first.0.len())
}

impl DevicePair {
    /// A pair of two different devices.
    pub fn new(first: DeviceId, second: DeviceId) -> Result<DevicePair, ParseError> {
        if first == second {
            return Err(ParseError(format!(
                "\"{first},{second}\" names device {first} twice; a pair is two devices"
            )));
        }
        let (label, at) = joined(&first, &second, ',');
        Ok(DevicePair { label, at })
    }

    /// The pair of two different devices in ascending order (numerically when both ids are
    /// numbers, `9,10`; else by their text, `numa0,numa1`): how chd labels a configured pair.
    pub fn ascending(a: DeviceId, b: DeviceId) -> Result<DevicePair, ParseError> {
        let swap = match (a.0.parse::<u64>(), b.0.parse::<u64>()) {
            (Ok(x), Ok(y)) => x > y,
            _ => a > b,
        };
        if swap {
            DevicePair::new(b, a)
        } else {
            DevicePair::new(a, b)
        }
    }

    /// Rank 0's device.
    pub fn first(&self) -> &str {
        &self.label[..self.at]
    }

    /// Rank 1's device.
    pub fn second(&self) -> &str {
        &self.label[self.at + 1..]
    }

    /// Both devices, rank 0's first.
    pub fn devices(&self) -> [&str; 2] {
        [self.first(), self.second()]
    }

    /// The label, `A,B`.
    pub fn as_str(&self) -> &str {
        &self.label
    }

    /// Whether `other` joins the same two devices, in either order.
    pub fn same_devices(&self, other: &DevicePair) -> bool {
        (self.first() == other.first() && self.second() == other.second())
            || (self.first() == other.second() && self.second() == other.first())
    }
}

fn split_two<'a>(s: &'a str, sep: char, what: &str) -> Result<(&'a str, &'a str), ParseError> {
    s.split_once(sep)
        .ok_or_else(|| ParseError(format!("{s:?} is not {what}")))
}

impl FromStr for DevicePair {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<DevicePair, ParseError> {
        let what = "a device pair like 0,5";
        let (a, b) = split_two(s, ',', what)?;
        let id = |t: &str| {
            t.parse::<DeviceId>()
                .map_err(|e| ParseError(format!("{s:?} is not {what}: {e}")))
        };
        DevicePair::new(id(a)?, id(b)?)
    }
}

impl fmt::Display for DevicePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

string_serde!(DevicePair);

/// An ordered pair of different devices, written `SRC>DST`: a peer copy from a buffer of
/// `src` into a buffer of `dst`, issued on a stream of `src` (`chd probe p2p`, the `src` and
/// `dst` labels). `0>5` and `5>0` are two different cells. Like [`DevicePair`] it holds its
/// label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderedPair {
    label: String,
    at: usize,
}

impl OrderedPair {
    /// An ordered pair of two different devices.
    pub fn new(src: DeviceId, dst: DeviceId) -> Result<OrderedPair, ParseError> {
        if src == dst {
            return Err(ParseError(format!(
                "\"{src}>{dst}\" copies device {src} into itself; a peer copy joins two devices"
            )));
        }
        let (label, at) = joined(&src, &dst, '>');
        Ok(OrderedPair { label, at })
    }

    /// The device copied from.
    pub fn src(&self) -> &str {
        &self.label[..self.at]
    }

    /// The device copied into.
    pub fn dst(&self) -> &str {
        &self.label[self.at + 1..]
    }

    /// The label, `SRC>DST`.
    pub fn as_str(&self) -> &str {
        &self.label
    }

    /// The same two devices the other way round.
    pub fn reversed(&self) -> OrderedPair {
        let (label, at) = (format!("{}>{}", self.dst(), self.src()), self.dst().len());
        OrderedPair { label, at }
    }
}

impl FromStr for OrderedPair {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<OrderedPair, ParseError> {
        let what = "an ordered device pair like 0>5";
        let (a, b) = split_two(s, '>', what)?;
        let id = |t: &str| {
            t.parse::<DeviceId>()
                .map_err(|e| ParseError(format!("{s:?} is not {what}: {e}")))
        };
        OrderedPair::new(id(a)?, id(b)?)
    }
}

impl fmt::Display for OrderedPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

string_serde!(OrderedPair);

/// Direction of a copy between host memory local to the probing CPU and the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    H2d,
    D2h,
}

impl Direction {
    /// Both directions, host to device first.
    pub const ALL: [Direction; 2] = [Direction::H2d, Direction::D2h];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::H2d => "h2d",
            Direction::D2h => "d2h",
        }
    }
}

impl FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "h2d" => Ok(Direction::H2d),
            "d2h" => Ok(Direction::D2h),
            other => Err(format!("unknown direction {other:?}: expected h2d or d2h")),
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

string_serde!(Direction);

/// Host memory for the host side of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum HostMemory {
    /// Page-locked memory from the runtime (cudaHostAlloc, aclrtMallocHost): the default,
    /// what training frameworks stage through.
    #[default]
    Pinned,
    /// Ordinary pageable memory.
    Pageable,
}

impl HostMemory {
    pub fn as_str(self) -> &'static str {
        match self {
            HostMemory::Pinned => "pinned",
            HostMemory::Pageable => "pageable",
        }
    }
}

impl FromStr for HostMemory {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pinned" => Ok(HostMemory::Pinned),
            "pageable" => Ok(HostMemory::Pageable),
            other => Err(format!(
                "unknown host memory {other:?}: expected pinned or pageable"
            )),
        }
    }
}

impl fmt::Display for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

string_serde!(HostMemory);

/// A bandwidth, bytes per second. People read it in decimal GB/s (1e9 bytes per second):
/// [`Bandwidth::gbps`], and `Display`, which prints the GB/s with two decimals unless the
/// format asks for another precision (`{:.3}`), without the unit, as tables show it.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Bandwidth(f64);

impl Bandwidth {
    pub fn from_bytes_per_second(bytes_per_second: f64) -> Bandwidth {
        Bandwidth(bytes_per_second)
    }

    pub fn from_gbps(gbps: f64) -> Bandwidth {
        Bandwidth(gbps * 1e9)
    }

    pub fn bytes_per_second(self) -> f64 {
        self.0
    }

    /// Decimal gigabytes per second.
    pub fn gbps(self) -> f64 {
        self.0 / 1e9
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.*}", f.precision().unwrap_or(2), self.gbps())
    }
}

/// A size in the words of reports and labels: `64MiB`, `1GiB`, `512KiB`, `100B` (binary
/// units, the largest that divides it).
pub fn size_label(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{name}", bytes / unit);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_print_and_refuse_what_is_not_a_pair() {
        let p: DevicePair = "0,5".parse().unwrap();
        assert_eq!((p.first(), p.second()), ("0", "5"));
        assert_eq!(p.as_str(), "0,5");
        assert_eq!(p.to_string(), "0,5");
        assert!(p.same_devices(&"5,0".parse().unwrap()));
        let id = |s: &str| s.parse::<DeviceId>().unwrap();
        let up = |a, b| DevicePair::ascending(id(a), id(b)).unwrap().to_string();
        assert_eq!(up("5", "0"), "0,5");
        assert_eq!(up("10", "9"), "9,10");
        assert_eq!(up("numa1", "numa0"), "numa0,numa1");
        assert!(DevicePair::ascending(id("3"), id("3")).is_err());
        assert!(!p.same_devices(&"0,6".parse().unwrap()));
        let o: OrderedPair = "numa0>numa1".parse().unwrap();
        assert_eq!((o.src(), o.dst()), ("numa0", "numa1"));
        assert_eq!(o.reversed().to_string(), "numa1>numa0");
        for (text, expected) in [
            ("0", "\"0\" is not a device pair like 0,5"),
            ("3,3", "names device 3 twice"),
            (",5", "a device id cannot be empty"),
            ("0,5,6", "\"5,6\" is not a device id"),
            ("0>5", "\"0>5\" is not a device pair like 0,5"),
        ] {
            let err = text.parse::<DevicePair>().unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        for (text, expected) in [
            ("0,5", "is not an ordered device pair like 0>5"),
            ("2>2", "copies device 2 into itself"),
            ("1>2>3", "\"2>3\" is not a device id"),
            ("1> 2", "\" 2\" is not a device id"),
        ] {
            let err = text.parse::<OrderedPair>().unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn values_serialize_as_the_strings_they_print() {
        let pair: DevicePair = "0,5".parse().unwrap();
        assert_eq!(serde_json::to_string(&pair).unwrap(), "\"0,5\"");
        let back: OrderedPair = serde_json::from_str("\"2>1\"").unwrap();
        assert_eq!(back.to_string(), "2>1");
        let err = serde_json::from_str::<OrderedPair>("\"2,1\"").unwrap_err();
        assert!(err.to_string().contains("ordered device pair"), "{err}");
        assert_eq!(serde_json::to_string(&Direction::D2h).unwrap(), "\"d2h\"");
        assert_eq!(
            serde_json::from_str::<HostMemory>("\"pageable\"").unwrap(),
            HostMemory::Pageable
        );
        assert!(serde_json::from_str::<DeviceId>("\"\"").is_err());
    }

    #[test]
    fn sizes_are_labelled_in_the_largest_binary_unit_that_divides_them() {
        assert_eq!(size_label(64 << 20), "64MiB");
        assert_eq!(size_label(1 << 30), "1GiB");
        assert_eq!(size_label(3 << 29), "1536MiB");
        assert_eq!(size_label(512 << 10), "512KiB");
        assert_eq!(size_label(100), "100B");
    }

    #[test]
    fn bandwidth_prints_gbps_at_the_precision_asked() {
        let b = Bandwidth::from_bytes_per_second(12_345_678_901.0);
        assert_eq!(b.gbps(), 12.345678901);
        assert_eq!(b.to_string(), "12.35");
        assert_eq!(format!("{b:.3}"), "12.346");
        assert_eq!(format!("{:.0}", Bandwidth::from_gbps(58.4)), "58");
    }
}
