//! Configuration of the fake runtime: the `CHD_FAKE_*` environment variables, parsed once per
//! process on first use, plus the optional busy-device file that is re-read on every query.
//!
//! Parsing never fails: a malformed variable produces one line on stderr naming the variable
//! and the variable's default is used instead (see `README.md` for the full syntax).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Default number of devices (`CHD_FAKE_DEVICE_COUNT`).
pub const DEFAULT_DEVICE_COUNT: usize = 8;
/// Largest accepted `CHD_FAKE_DEVICE_COUNT` (keeps the default PCI bus numbers unique).
pub const MAX_DEVICE_COUNT: usize = 240;
/// Default host<->device bandwidth in GB/s (1e9 bytes per second).
pub const DEFAULT_GBPS: f64 = 58.9;
/// Default same-device device-to-device rate, GB/s (`CHD_FAKE_D2D_GBPS`): HBM to HBM, in the
/// 240-420 GB/s range calibration runs measured across ranks of one node.
pub const DEFAULT_D2D_GBPS: f64 = 400.0;
/// Default device name (`CHD_FAKE_DEVICE_NAME`).
pub const DEFAULT_DEVICE_NAME: &str = "Fake H200";
/// Default device memory size: 141 GiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 141 << 30;
/// An H200's HBM3e as NVML describes it: a 6144-bit bus at 3201 MHz (4.9 TB/s).
pub const DEFAULT_MEMORY_BUS_BITS: u32 = 6144;
pub const DEFAULT_MAX_MEMORY_CLOCK_MHZ: u32 = 3201;
/// Default bus bandwidth of a device pair in GB/s (`CHD_FAKE_PAIR_GBPS`).
pub const DEFAULT_PAIR_GBPS: f64 = 13.7;
/// Default rendezvous timeout of collectives and rank-by-rank communicator init
/// (`CHD_FAKE_PAIR_TIMEOUT_MS`).
pub const DEFAULT_PAIR_TIMEOUT_MS: u64 = 30_000;
/// Default single-precision matrix-multiply throughput per device in TFLOP/s
/// (`CHD_FAKE_GEMM_TFLOPS`).
pub const DEFAULT_GEMM_TFLOPS: f64 = 50.0;
/// Default factor on a device's copy bandwidth while a cuBLAS gemm loop runs on it
/// (`CHD_FAKE_LOAD_COPY_FACTOR`).
pub const DEFAULT_LOAD_COPY_FACTOR: f64 = 0.5;
/// Default rate of a cross-device copy without peer access, GB/s (`CHD_FAKE_STAGED_GBPS`):
/// CUDA then stages the copy through host memory.
pub const DEFAULT_STAGED_GBPS: f64 = 4.0;

/// A PCI address `domain:bus:device.function`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddress {
    /// The default address of device `index`: `0000:XX:00.0` with `XX = 0x10 + index`.
    pub fn default_for(index: usize) -> Self {
        PciAddress {
            domain: 0,
            // MAX_DEVICE_COUNT keeps 0x10 + index within a byte.
            bus: u8::try_from(0x10 + index).unwrap_or(u8::MAX),
            device: 0,
            function: 0,
        }
    }

    /// Parses `[domain:]bus:device.function` (hex, any case; the domain may have up to 8 digits).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let parts: Vec<&str> = text.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [bus, rest] => ("0", *bus, *rest),
            [domain, bus, rest] => (*domain, *bus, *rest),
            _ => return Err(format!("{text:?} is not a PCI address like 0000:1a:00.0")),
        };
        let (device, function) = rest
            .split_once('.')
            .ok_or_else(|| format!("{text:?} lacks the .function part"))?;
        let hex = |s: &str, max_digits: usize, what: &str| -> Result<u32, String> {
            if s.is_empty() || s.len() > max_digits || !s.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!("bad PCI {what} {s:?} in {text:?}"));
            }
            u32::from_str_radix(s, 16).map_err(|e| format!("bad PCI {what} {s:?}: {e}"))
        };
        let domain = hex(domain, 8, "domain")?;
        let bus = hex(bus, 2, "bus")?;
        let device = hex(device, 2, "device")?;
        let function = hex(function, 1, "function")?;
        if device > 0x1f || function > 7 {
            return Err(format!("PCI device/function out of range in {text:?}"));
        }
        Ok(PciAddress {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }

    /// `0000:1A:00.0`: what `cudaDeviceGetPCIBusId` and NVML's `busIdLegacy` return.
    pub fn legacy_upper(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `00000000:1A:00.0`: NVML's `busId` format.
    pub fn nvml_upper(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// `CHD_FAKE_SLOW_CPUS` rule: copies on `device` issued from a CPU in `cpus` run at `gbps`.
#[derive(Clone, Debug, PartialEq)]
pub struct SlowCpuRule {
    pub device: usize,
    /// Inclusive CPU ranges.
    pub cpus: Vec<(usize, usize)>,
    pub gbps: f64,
}

impl SlowCpuRule {
    fn matches(&self, device: usize, cpu: usize) -> bool {
        self.device == device && self.cpus.iter().any(|&(lo, hi)| (lo..=hi).contains(&cpu))
    }
}

/// `CHD_FAKE_PAIR_GBPS` override: the collective rank `rank` running on a CPU in `cpus` limits
/// the pair's bus bandwidth to `gbps`.
#[derive(Clone, Debug, PartialEq)]
pub struct PairCpuRule {
    pub rank: usize,
    /// Inclusive CPU ranges.
    pub cpus: Vec<(usize, usize)>,
    pub gbps: f64,
}

impl PairCpuRule {
    fn matches(&self, rank: usize, cpu: usize) -> bool {
        self.rank == rank && self.cpus.iter().any(|&(lo, hi)| (lo..=hi).contains(&cpu))
    }
}

/// `CHD_FAKE_P2P_GBPS` rule: a peer copy over the link from a device in `src` to a device in
/// `dst` runs at `gbps`.
#[derive(Clone, Debug, PartialEq)]
pub struct P2pRule {
    /// Inclusive device ranges of the source.
    pub src: Vec<(usize, usize)>,
    /// Inclusive device ranges of the destination.
    pub dst: Vec<(usize, usize)>,
    pub gbps: f64,
}

impl P2pRule {
    fn matches(&self, src: usize, dst: usize) -> bool {
        let within = |ranges: &[(usize, usize)], d: usize| {
            ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&d))
        };
        within(&self.src, src) && within(&self.dst, dst)
    }
}

/// Everything read from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub device_count: usize,
    pub default_gbps: f64,
    /// Per-device bandwidth overrides from `CHD_FAKE_H2D_GBPS`.
    pub device_gbps: Vec<(usize, f64)>,
    /// Default same-device device-to-device rate from `CHD_FAKE_D2D_GBPS`.
    pub default_d2d_gbps: f64,
    /// Per-device same-device rate overrides from `CHD_FAKE_D2D_GBPS`.
    pub device_d2d_gbps: Vec<(usize, f64)>,
    pub slow_cpus: Vec<SlowCpuRule>,
    pub fail_devices: BTreeSet<usize>,
    /// Devices whose utilization and process queries fail (`CHD_FAKE_TELEMETRY_FAIL_DEVICES`).
    pub telemetry_fail_devices: BTreeSet<usize>,
    pub busy_devices: BTreeSet<usize>,
    pub busy_file: Option<PathBuf>,
    /// `CHD_FAKE_CONTROL_FILE`: faults a test changes mid-run (see [`Faults`]).
    pub control_file: Option<PathBuf>,
    /// One entry per device.
    pub pci_addresses: Vec<PciAddress>,
    pub device_name: String,
    pub memory_bytes: u64,
    /// `CHD_FAKE_MEMORY_BUS_BITS`: what `nvmlDeviceGetMemoryBusWidth` answers (an H200's
    /// 6144; 0: the query is `NVML_ERROR_NOT_SUPPORTED`).
    pub memory_bus_bits: u32,
    /// `CHD_FAKE_MAX_MEMORY_CLOCK_MHZ`: what `nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)`
    /// answers (an H200's 3201; 0: `NVML_ERROR_NOT_SUPPORTED`).
    pub max_memory_clock_mhz: u32,
    /// Default pair (collective / peer copy) bus bandwidth from `CHD_FAKE_PAIR_GBPS`.
    pub pair_gbps: f64,
    /// Per-rank CPU overrides from `CHD_FAKE_PAIR_GBPS`.
    pub pair_cpus: Vec<PairCpuRule>,
    /// `CHD_FAKE_P2P_GBPS`: per ordered device pair link rates of peer copies.
    pub p2p_gbps: Vec<P2pRule>,
    /// `CHD_FAKE_PAIR_FAIL`: every collective (and cross-device copy) fails.
    pub pair_fail: bool,
    /// `CHD_FAKE_PAIR_HANG_MS`: wall-clock delay before each collective (and cross-device
    /// copy) completes; a cross-process operation (`net::comm`) sleeps it before it starts.
    pub pair_hang_ms: u64,
    /// `CHD_FAKE_PAIR_HANG_ON`: the device whose streams' cross-device copies the hang
    /// delays (unset: every device's): one rank's copies hang while the other's complete.
    pub pair_hang_on: Option<usize>,
    /// `CHD_FAKE_PAIR_TIMEOUT_MS`: how long a rank waits for its peers.
    pub pair_timeout_ms: u64,
    /// `CHD_FAKE_GEMM_TFLOPS`: how fast `cublasSgemm_v2` advances its stream's clock.
    pub gemm_tflops: f64,
    /// Per-device overrides from `CHD_FAKE_GEMM_TFLOPS` (`50;1=20`).
    pub device_gemm_tflops: Vec<(usize, f64)>,
    /// `CHD_FAKE_LOAD_COPY_FACTOR`: copy bandwidth factor on a device with a gemm in flight.
    pub load_copy_factor: f64,
    /// `CHD_FAKE_FAIL_AFTER`: copies a stream completes before `CHD_FAKE_FAIL_DEVICES`
    /// applies to it (0: every copy fails).
    pub fail_after: u64,
    /// `CHD_FAKE_NVML_OWN_PID`: the pid NVML lists this process's own allocations under (a
    /// host PID namespace's view), instead of `getpid()`.
    pub nvml_own_pid: Option<u32>,
    /// `CHD_FAKE_ACL_PCI_BUS_ID`: whether `aclrtDeviceGetPCIBusId` answers (`0`: it returns
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`, as on a non-PCIe interconnect).
    pub acl_pci_bus_id: bool,
    /// `CHD_FAKE_STAGED_GBPS`: rate of a CUDA cross-device copy without peer access.
    pub staged_gbps: f64,
    /// `CHD_FAKE_NO_PEER`: device pairs (either order) that cannot access each other.
    pub no_peer: Vec<(usize, usize)>,
    /// `CHD_FAKE_ACL_PEER_ENABLED`: device pairs whose ACL peer access (both ways) another
    /// process enabled before this one started (CANN enables it per device, not process).
    pub acl_peer_enabled: Vec<(usize, usize)>,
    /// `CHD_FAKE_ABORT_HANG_MS`: wall-clock delay of every `ncclCommAbort` (after it broke
    /// the communicators).
    pub abort_hang_ms: u64,
    /// `CHD_FAKE_PIN_MS_PER_MIB`: simulated cost of a pinned host allocation, milliseconds
    /// per MiB (0: free).
    pub pin_ms_per_mib: f64,
    /// `CHD_FAKE_PIN_SLEEP`: whether a pinned allocation also sleeps its simulated cost in
    /// wall time (else it is only accounted in `chd_fake_simulated_ns`).
    pub pin_sleep: bool,
    /// `CHD_FAKE_COPY_LATENCY_US`: fixed virtual time added to every timed copy,
    /// microseconds (0: none).
    pub copy_latency_us: f64,
    /// `CHD_FAKE_SIZE_DIP`: (copy size in bytes, bandwidth factor) rules, applied to timed
    /// copies of exactly that size.
    pub size_dips: Vec<(u64, f64)>,
    /// `CHD_FAKE_ENQUEUE_US`: host time each enqueue call takes, microseconds (0: none; see
    /// `host_clock`).
    pub enqueue_us: f64,
    /// `CHD_FAKE_STREAM_WAIT_VALUE`: whether `cuStreamWaitValue32` (reached through
    /// `cudaGetDriverEntryPoint[ByVersion]`) is supported (`0`: it answers
    /// `CUDA_ERROR_NOT_SUPPORTED`, as a driver without stream memory operations).
    pub stream_wait_value: bool,
    /// `CHD_FAKE_ACL_HOST_FUNC`: whether `aclrtLaunchHostFunc` is supported (`0`: it answers
    /// `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`, as CANN before 8.3).
    pub acl_host_func: bool,
    /// `CHD_FAKE_HANG_DEVICES`: devices whose copies never complete (see [`Faults`]).
    pub hang_devices: BTreeSet<usize>,
}

impl Config {
    /// `cublasSgemm_v2`'s TFLOP/s on `device`: its override, else the default.
    pub fn gemm_tflops_of(&self, device: usize) -> f64 {
        self.device_gemm_tflops
            .iter()
            .rev()
            .find(|(d, _)| *d == device)
            .map_or(self.gemm_tflops, |(_, t)| *t)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            device_count: DEFAULT_DEVICE_COUNT,
            default_gbps: DEFAULT_GBPS,
            device_gbps: Vec::new(),
            default_d2d_gbps: DEFAULT_D2D_GBPS,
            device_d2d_gbps: Vec::new(),
            slow_cpus: Vec::new(),
            fail_devices: BTreeSet::new(),
            telemetry_fail_devices: BTreeSet::new(),
            busy_devices: BTreeSet::new(),
            busy_file: None,
            control_file: None,
            pci_addresses: (0..DEFAULT_DEVICE_COUNT)
                .map(PciAddress::default_for)
                .collect(),
            device_name: DEFAULT_DEVICE_NAME.to_owned(),
            memory_bytes: DEFAULT_MEMORY_BYTES,
            memory_bus_bits: DEFAULT_MEMORY_BUS_BITS,
            max_memory_clock_mhz: DEFAULT_MAX_MEMORY_CLOCK_MHZ,
            pair_gbps: DEFAULT_PAIR_GBPS,
            pair_cpus: Vec::new(),
            p2p_gbps: Vec::new(),
            pair_fail: false,
            pair_hang_ms: 0,
            pair_hang_on: None,
            pair_timeout_ms: DEFAULT_PAIR_TIMEOUT_MS,
            gemm_tflops: DEFAULT_GEMM_TFLOPS,
            device_gemm_tflops: Vec::new(),
            load_copy_factor: DEFAULT_LOAD_COPY_FACTOR,
            fail_after: 0,
            nvml_own_pid: None,
            acl_pci_bus_id: true,
            staged_gbps: DEFAULT_STAGED_GBPS,
            no_peer: Vec::new(),
            acl_peer_enabled: Vec::new(),
            abort_hang_ms: 0,
            pin_ms_per_mib: 0.0,
            pin_sleep: false,
            copy_latency_us: 0.0,
            size_dips: Vec::new(),
            enqueue_us: 0.0,
            stream_wait_value: true,
            acl_host_func: true,
            hang_devices: BTreeSet::new(),
        }
    }
}

/// A copy size: a bare number of bytes, or `KiB`, `MiB`, `GiB` (binary).
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("bad size {text:?}: expected e.g. 32MiB or 4096"))?;
    let shift = match unit.trim() {
        "" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => {
            return Err(format!(
                "bad size unit {other:?} in {text:?}: KiB, MiB or GiB"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("bad size {text:?}: zero or too large"))
}

/// `CHD_FAKE_SIZE_DIP`: `;`-separated `SIZE=FACTOR` rules, e.g. `32MiB=0.1;4096=0.5`.
pub fn parse_size_dips(text: &str) -> Result<Vec<(u64, f64)>, String> {
    text.split(';')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|rule| {
            let (size, factor) = rule
                .split_once('=')
                .ok_or_else(|| format!("rule {rule:?} is not SIZE=FACTOR"))?;
            Ok((parse_size(size)?, parse_positive(factor, "dip factor")?))
        })
        .collect()
}

fn parse_gbps(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|e| format!("bad bandwidth {text:?}: {e}"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "bandwidth {text:?} must be a positive number of GB/s"
        ));
    }
    Ok(v)
}

fn parse_index(text: &str, what: &str) -> Result<usize, String> {
    text.trim()
        .parse()
        .map_err(|e| format!("bad {what} {text:?}: {e}"))
}

/// Parses a device list such as `5`, `5,6` or `1 2;3` (empty means none).
pub fn parse_device_list(text: &str) -> Result<BTreeSet<usize>, String> {
    text.split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| parse_index(t, "device index"))
        .collect()
}

/// Parses `CHD_FAKE_H2D_GBPS`: `58.9;0=12.3;1=35` -> (default, overrides).
pub fn parse_h2d_gbps(text: &str) -> Result<(f64, Vec<(usize, f64)>), String> {
    parse_device_rates(text, DEFAULT_GBPS)
}

/// Parses a `DEFAULT;DEV=GBPS;...` rate list (`CHD_FAKE_H2D_GBPS`, `CHD_FAKE_D2D_GBPS`);
/// without a bare number the default stays `default`.
pub fn parse_device_rates(text: &str, default: f64) -> Result<(f64, Vec<(usize, f64)>), String> {
    let mut default = default;
    let mut overrides = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((dev, gbps)) => {
                overrides.push((parse_index(dev, "device index")?, parse_gbps(gbps)?))
            }
            None => default = parse_gbps(part)?,
        }
    }
    Ok((default, overrides))
}

/// Parses `CHD_FAKE_GEMM_TFLOPS`: `50;1=20` -> (default, per-device overrides).
pub fn parse_gemm_tflops(text: &str) -> Result<(f64, Vec<(usize, f64)>), String> {
    let mut default = DEFAULT_GEMM_TFLOPS;
    let mut overrides = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((dev, tflops)) => overrides.push((
                parse_index(dev, "device index")?,
                parse_positive(tflops, "TFLOP/s")?,
            )),
            None => default = parse_positive(part, "TFLOP/s")?,
        }
    }
    Ok((default, overrides))
}

/// Parses `CHD_FAKE_SLOW_CPUS`: `0@320-639=6.1;3@0-7,16-23=20`.
pub fn parse_slow_cpus(text: &str) -> Result<Vec<SlowCpuRule>, String> {
    let mut rules = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (lhs, gbps) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not DEVICE@CPUS=GBPS"))?;
        let (dev, cpus) = lhs
            .split_once('@')
            .ok_or_else(|| format!("{part:?} is not DEVICE@CPUS=GBPS"))?;
        rules.push(SlowCpuRule {
            device: parse_index(dev, "device index")?,
            cpus: parse_cpu_ranges(cpus)?,
            gbps: parse_gbps(gbps)?,
        });
    }
    Ok(rules)
}

/// Parses a CPU list such as `3`, `104-110` or `0-7,16-23` into inclusive ranges.
pub fn parse_cpu_ranges(text: &str) -> Result<Vec<(usize, usize)>, String> {
    let mut ranges = Vec::new();
    for range in text.split(',').map(str::trim) {
        let (lo, hi) = match range.split_once('-') {
            Some((lo, hi)) => (parse_index(lo, "cpu")?, parse_index(hi, "cpu")?),
            None => {
                let cpu = parse_index(range, "cpu")?;
                (cpu, cpu)
            }
        };
        if lo > hi {
            return Err(format!("cpu range {range:?} is reversed"));
        }
        ranges.push((lo, hi));
    }
    Ok(ranges)
}

/// Parses `CHD_FAKE_PAIR_GBPS`: `13.7;rank0:3=4.0;rank1:0-7,16=6.5` -> (default, rules).
pub fn parse_pair_gbps(text: &str) -> Result<(f64, Vec<PairCpuRule>), String> {
    let mut default = DEFAULT_PAIR_GBPS;
    let mut rules = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((lhs, gbps)) = part.split_once('=') else {
            default = parse_gbps(part)?;
            continue;
        };
        let (rank, cpus) = lhs
            .split_once(':')
            .ok_or_else(|| format!("{part:?} is not rankN:CPUS=GBPS"))?;
        let rank = rank
            .trim()
            .strip_prefix("rank")
            .ok_or_else(|| format!("{part:?} is not rankN:CPUS=GBPS"))?;
        rules.push(PairCpuRule {
            rank: parse_index(rank, "rank")?,
            cpus: parse_cpu_ranges(cpus)?,
            gbps: parse_gbps(gbps)?,
        });
    }
    Ok((default, rules))
}

/// Parses `CHD_FAKE_P2P_GBPS`: `;`-separated `SRC>DST=GBPS` rules, SRC and DST device lists
/// of `N` or `LO-HI` joined by `,`, e.g. `0-3>4-7=6;4-7>0-3=6;2>1=3`.
pub fn parse_p2p_gbps(text: &str) -> Result<Vec<P2pRule>, String> {
    let mut rules = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let shape =
            || format!("{part:?} is not SRC>DST=GBPS (the default rate is CHD_FAKE_PAIR_GBPS's)");
        let (lhs, gbps) = part.split_once('=').ok_or_else(shape)?;
        let (src, dst) = lhs.split_once('>').ok_or_else(shape)?;
        let devices = |t: &str| parse_cpu_ranges(t).map_err(|e| e.replace("cpu", "device"));
        rules.push(P2pRule {
            src: devices(src)?,
            dst: devices(dst)?,
            gbps: parse_gbps(gbps)?,
        });
    }
    Ok(rules)
}

/// Parses `CHD_FAKE_NO_PEER`: `;`-separated device pairs `A,B`, e.g. `0,5;1,2`.
pub fn parse_device_pairs(text: &str) -> Result<Vec<(usize, usize)>, String> {
    text.split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let (a, b) = part
                .split_once(',')
                .ok_or_else(|| format!("{part:?} is not a device pair A,B"))?;
            let (a, b) = (
                parse_index(a, "device index")?,
                parse_index(b, "device index")?,
            );
            if a == b {
                return Err(format!("{part:?} names one device twice"));
            }
            Ok((a.min(b), a.max(b)))
        })
        .collect()
}

/// Parses a boolean switch: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off` (any case).
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{text:?} is not 1 or 0")),
    }
}

/// A positive, finite number (`what` names it in the error).
fn parse_positive(text: &str, what: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|e| format!("bad {what} {text:?}: {e}"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("{what} {text:?} must be a positive number"));
    }
    Ok(v)
}

/// A finite number at or above zero (`what` names it in the error).
fn parse_non_negative(text: &str, what: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|e| format!("bad {what} {text:?}: {e}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{what} {text:?} must be a number at or above 0"));
    }
    Ok(v)
}

fn parse_ms(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|e| format!("bad millisecond count {text:?}: {e}"))
}

fn parse_count(text: &str) -> Result<usize, String> {
    let n = parse_index(text, "device count")?;
    if n > MAX_DEVICE_COUNT {
        return Err(format!("device count {n} exceeds {MAX_DEVICE_COUNT}"));
    }
    Ok(n)
}

fn parse_memory(text: &str) -> Result<u64, String> {
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|e| format!("bad byte count {text:?}: {e}"))?;
    if n == 0 {
        return Err("memory size must be positive".to_owned());
    }
    Ok(n)
}

fn parse_name(text: &str) -> Result<String, String> {
    if text.contains('\0') {
        return Err("device name contains a NUL byte".to_owned());
    }
    if text.len() > 255 {
        return Err("device name is longer than 255 bytes".to_owned());
    }
    Ok(text.to_owned())
}

impl Config {
    /// Builds a configuration from `lookup` (normally the process environment). Each
    /// malformed variable is reported through `warn` and replaced by its default.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        mut warn: impl FnMut(String),
    ) -> Config {
        let mut cfg = Config::default();
        // Empty values count as unset.
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut field =
            |name: &str, default_text: &str, apply: &mut dyn FnMut(&str) -> Result<(), String>| {
                if let Some(value) = get(name) {
                    if let Err(why) = apply(&value) {
                        warn(format!(
                        "chd-fake-runtime: ignoring {name}={value:?}: {why}; using the default ({default_text})"
                    ));
                    }
                }
            };

        field("CHD_FAKE_DEVICE_COUNT", "8", &mut |v| {
            cfg.device_count = parse_count(v)?;
            Ok(())
        });
        field("CHD_FAKE_H2D_GBPS", "58.9 for every device", &mut |v| {
            (cfg.default_gbps, cfg.device_gbps) = parse_h2d_gbps(v)?;
            Ok(())
        });
        field("CHD_FAKE_D2D_GBPS", "400 for every device", &mut |v| {
            (cfg.default_d2d_gbps, cfg.device_d2d_gbps) = parse_device_rates(v, DEFAULT_D2D_GBPS)?;
            Ok(())
        });
        field("CHD_FAKE_SLOW_CPUS", "none", &mut |v| {
            cfg.slow_cpus = parse_slow_cpus(v)?;
            Ok(())
        });
        field("CHD_FAKE_FAIL_DEVICES", "none", &mut |v| {
            cfg.fail_devices = parse_device_list(v)?;
            Ok(())
        });
        field("CHD_FAKE_FAIL_AFTER", "0", &mut |v| {
            cfg.fail_after = v
                .trim()
                .parse()
                .map_err(|e| format!("bad copy count {v:?}: {e}"))?;
            Ok(())
        });
        field("CHD_FAKE_NVML_OWN_PID", "getpid()", &mut |v| {
            let pid: u32 = v
                .trim()
                .parse()
                .map_err(|e| format!("bad pid {v:?}: {e}"))?;
            if pid == 0 {
                return Err("a pid must be positive".to_owned());
            }
            cfg.nvml_own_pid = Some(pid);
            Ok(())
        });
        field("CHD_FAKE_ACL_PCI_BUS_ID", "1", &mut |v| {
            cfg.acl_pci_bus_id = parse_switch(v)?;
            Ok(())
        });
        field("CHD_FAKE_TELEMETRY_FAIL_DEVICES", "none", &mut |v| {
            cfg.telemetry_fail_devices = parse_device_list(v)?;
            Ok(())
        });
        field("CHD_FAKE_BUSY_DEVICES", "none", &mut |v| {
            cfg.busy_devices = parse_device_list(v)?;
            Ok(())
        });
        field("CHD_FAKE_BUSY_FILE", "none", &mut |v| {
            cfg.busy_file = Some(PathBuf::from(v));
            Ok(())
        });
        field("CHD_FAKE_CONTROL_FILE", "none", &mut |v| {
            cfg.control_file = Some(PathBuf::from(v));
            Ok(())
        });
        let count = cfg.device_count;
        let mut pci: Vec<PciAddress> = (0..count).map(PciAddress::default_for).collect();
        field(
            "CHD_FAKE_PCI_BUS_IDS",
            "0000:XX:00.0 with XX = 0x10 + index",
            &mut |v| {
                let parsed = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(PciAddress::parse)
                    .collect::<Result<Vec<_>, _>>()?;
                for (slot, addr) in pci.iter_mut().zip(parsed) {
                    *slot = addr;
                }
                Ok(())
            },
        );
        cfg.pci_addresses = pci;
        field("CHD_FAKE_DEVICE_NAME", DEFAULT_DEVICE_NAME, &mut |v| {
            cfg.device_name = parse_name(v)?;
            Ok(())
        });
        field("CHD_FAKE_MEMORY_BYTES", "141 GiB", &mut |v| {
            cfg.memory_bytes = parse_memory(v)?;
            Ok(())
        });
        field("CHD_FAKE_MEMORY_BUS_BITS", "6144", &mut |v| {
            cfg.memory_bus_bits = v
                .trim()
                .parse()
                .map_err(|e| format!("bad bit count {v:?}: {e}"))?;
            Ok(())
        });
        field("CHD_FAKE_MAX_MEMORY_CLOCK_MHZ", "3201", &mut |v| {
            cfg.max_memory_clock_mhz = v
                .trim()
                .parse()
                .map_err(|e| format!("bad clock {v:?}: {e}"))?;
            Ok(())
        });
        field(
            "CHD_FAKE_PAIR_GBPS",
            "13.7 for every rank and CPU",
            &mut |v| {
                (cfg.pair_gbps, cfg.pair_cpus) = parse_pair_gbps(v)?;
                Ok(())
            },
        );
        field("CHD_FAKE_P2P_GBPS", "none", &mut |v| {
            cfg.p2p_gbps = parse_p2p_gbps(v)?;
            Ok(())
        });
        field("CHD_FAKE_PAIR_FAIL", "0", &mut |v| {
            cfg.pair_fail = parse_switch(v)?;
            Ok(())
        });
        field("CHD_FAKE_PAIR_HANG_MS", "0", &mut |v| {
            cfg.pair_hang_ms = parse_ms(v)?;
            Ok(())
        });
        field("CHD_FAKE_PAIR_HANG_ON", "", &mut |v| {
            cfg.pair_hang_on = if v.trim().is_empty() {
                None
            } else {
                Some(
                    v.trim()
                        .parse()
                        .map_err(|_| format!("{v:?} is not a device index"))?,
                )
            };
            Ok(())
        });
        field("CHD_FAKE_PAIR_TIMEOUT_MS", "30000", &mut |v| {
            let ms = parse_ms(v)?;
            if ms == 0 {
                return Err("the timeout must be positive".to_owned());
            }
            cfg.pair_timeout_ms = ms;
            Ok(())
        });
        field("CHD_FAKE_GEMM_TFLOPS", "50", &mut |v| {
            (cfg.gemm_tflops, cfg.device_gemm_tflops) = parse_gemm_tflops(v)?;
            Ok(())
        });
        field("CHD_FAKE_LOAD_COPY_FACTOR", "0.5", &mut |v| {
            cfg.load_copy_factor = parse_positive(v, "copy factor")?;
            Ok(())
        });
        field("CHD_FAKE_STAGED_GBPS", "4", &mut |v| {
            cfg.staged_gbps = parse_gbps(v)?;
            Ok(())
        });
        field("CHD_FAKE_ACL_PEER_ENABLED", "", &mut |v| {
            cfg.acl_peer_enabled = parse_device_pairs(v)?;
            Ok(())
        });
        field("CHD_FAKE_NO_PEER", "none", &mut |v| {
            cfg.no_peer = parse_device_pairs(v)?;
            Ok(())
        });
        field("CHD_FAKE_ABORT_HANG_MS", "0", &mut |v| {
            cfg.abort_hang_ms = parse_ms(v)?;
            Ok(())
        });
        field("CHD_FAKE_PIN_MS_PER_MIB", "0", &mut |v| {
            cfg.pin_ms_per_mib = parse_non_negative(v, "milliseconds per MiB")?;
            Ok(())
        });
        field("CHD_FAKE_PIN_SLEEP", "0", &mut |v| {
            cfg.pin_sleep = parse_switch(v)?;
            Ok(())
        });
        field("CHD_FAKE_COPY_LATENCY_US", "0", &mut |v| {
            cfg.copy_latency_us = parse_non_negative(v, "microseconds")?;
            Ok(())
        });
        field("CHD_FAKE_SIZE_DIP", "none", &mut |v| {
            cfg.size_dips = parse_size_dips(v)?;
            Ok(())
        });
        field("CHD_FAKE_ENQUEUE_US", "0", &mut |v| {
            cfg.enqueue_us = parse_non_negative(v, "microseconds")?;
            Ok(())
        });
        field("CHD_FAKE_STREAM_WAIT_VALUE", "1", &mut |v| {
            cfg.stream_wait_value = parse_switch(v)?;
            Ok(())
        });
        field("CHD_FAKE_ACL_HOST_FUNC", "1", &mut |v| {
            cfg.acl_host_func = parse_switch(v)?;
            Ok(())
        });
        field("CHD_FAKE_HANG_DEVICES", "none", &mut |v| {
            cfg.hang_devices = parse_device_list(v)?;
            Ok(())
        });
        cfg
    }

    /// Virtual nanoseconds of one timed copy of `bytes` at `gbps`: `bytes / (gbps x the
    /// first CHD_FAKE_SIZE_DIP factor for exactly this size)` plus `CHD_FAKE_COPY_LATENCY_US`.
    pub fn copy_ns(&self, bytes: u64, gbps: f64) -> f64 {
        let dip = self
            .size_dips
            .iter()
            .find(|(size, _)| *size == bytes)
            .map_or(1.0, |(_, f)| *f);
        bytes as f64 / (gbps * dip) + self.copy_latency_us * 1e3
    }

    /// Bandwidth in GB/s for a copy on `device` issued from `cpu`.
    pub fn gbps(&self, device: usize, cpu: Option<usize>) -> f64 {
        if let Some(cpu) = cpu {
            if let Some(rule) = self.slow_cpus.iter().find(|r| r.matches(device, cpu)) {
                return rule.gbps;
            }
        }
        self.device_gbps
            .iter()
            .rev()
            .find(|(d, _)| *d == device)
            .map_or(self.default_gbps, |&(_, g)| g)
    }

    /// Same-device device-to-device bandwidth in GB/s on `device` (no CPU rule applies: the
    /// copy never leaves the device).
    pub fn d2d_gbps(&self, device: usize) -> f64 {
        self.device_d2d_gbps
            .iter()
            .rev()
            .find(|(d, _)| *d == device)
            .map_or(self.default_d2d_gbps, |&(_, g)| g)
    }

    /// Pair bus bandwidth in GB/s contributed by collective rank `rank` running on `cpu`: the
    /// first matching `rankN:CPUS=GBPS` rule, else the `CHD_FAKE_PAIR_GBPS` default.
    pub fn pair_gbps_for(&self, rank: usize, cpu: Option<usize>) -> f64 {
        cpu.and_then(|cpu| self.pair_cpus.iter().find(|r| r.matches(rank, cpu)))
            .map_or(self.pair_gbps, |r| r.gbps)
    }

    /// Link rate in GB/s of a peer copy from `src` to `dst` over the link, issued by collective
    /// rank `rank` from `cpu`: the first matching `CHD_FAKE_P2P_GBPS` rule, else
    /// [`Config::pair_gbps_for`].
    pub fn peer_copy_gbps(&self, src: usize, dst: usize, rank: usize, cpu: Option<usize>) -> f64 {
        self.p2p_gbps
            .iter()
            .find(|r| r.matches(src, dst))
            .map_or_else(|| self.pair_gbps_for(rank, cpu), |r| r.gbps)
    }

    /// Whether `a` and `b` (distinct) may enable peer access to each other: not listed in
    /// `CHD_FAKE_NO_PEER`.
    pub fn peer_supported(&self, a: usize, b: usize) -> bool {
        a != b && !self.no_peer.contains(&(a.min(b), a.max(b)))
    }

    /// Whether the utilization and process queries of `device` fail.
    pub fn telemetry_fails(&self, device: usize) -> bool {
        self.telemetry_fail_devices.contains(&device)
    }

    /// The busy devices right now: the busy file when configured (re-read on every call),
    /// otherwise `CHD_FAKE_BUSY_DEVICES`.
    pub fn busy_devices_now(&self) -> BTreeSet<usize> {
        let Some(path) = &self.busy_file else {
            return self.busy_devices.clone();
        };
        let result = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|text| parse_device_list(&text));
        match result {
            Ok(set) => set,
            Err(why) => {
                warn_once(format!(
                    "chd-fake-runtime: CHD_FAKE_BUSY_FILE: {why}; using CHD_FAKE_BUSY_DEVICES instead"
                ));
                self.busy_devices.clone()
            }
        }
    }
}

/// The faults in force right now: `CHD_FAKE_FAIL_DEVICES` and `CHD_FAKE_PAIR_HANG_MS`, and
/// lost devices, as the control file (`CHD_FAKE_CONTROL_FILE`) sets them at this moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Devices whose copies fail (after `CHD_FAKE_FAIL_AFTER` copies per stream).
    pub fail_devices: BTreeSet<usize>,
    /// Devices that are gone: every call that works on one fails with the API's
    /// device-lost code (see README, "Lost devices").
    pub lost_devices: BTreeSet<usize>,
    /// Wall-clock delay of every collective and cross-device copy.
    pub pair_hang_ms: u64,
    /// Devices whose copies never complete while they are listed: the copy is enqueued, the
    /// stream never gets past it (see README, "Hung devices").
    pub hang_devices: BTreeSet<usize>,
}

impl Faults {
    /// Whether copies on `device` fail (once their stream is past `fail_after` copies).
    pub fn fails(&self, device: usize) -> bool {
        self.fail_devices.contains(&device)
    }

    /// Whether `device` is lost.
    pub fn lost(&self, device: usize) -> bool {
        self.lost_devices.contains(&device)
    }

    /// Whether copies on `device` hang.
    pub fn hangs(&self, device: usize) -> bool {
        self.hang_devices.contains(&device)
    }
}

/// Applies the `KEY=VALUE` lines of a control file over `faults` (`#` starts a comment; blank
/// lines are ignored). Keys: `fail_devices`, `lost_devices`, `hang_devices` (device lists,
/// empty = none) and `pair_hang_ms`; a key not in the file keeps its environment value.
pub fn parse_control(text: &str, mut faults: Faults) -> Result<Faults, String> {
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| format!("line {line:?} is not KEY=VALUE"))?;
        let value = value.trim();
        match key.trim() {
            "fail_devices" => faults.fail_devices = parse_device_list(value)?,
            "lost_devices" => faults.lost_devices = parse_device_list(value)?,
            "hang_devices" => faults.hang_devices = parse_device_list(value)?,
            "pair_hang_ms" => {
                faults.pair_hang_ms = value
                    .parse()
                    .map_err(|e| format!("bad pair_hang_ms {value:?}: {e}"))?
            }
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    Ok(faults)
}

impl Config {
    /// The faults in force now: the environment's, with the control file (re-read on every
    /// call) applied over them. An unreadable or malformed file leaves the environment's
    /// values (one stderr line per distinct problem).
    pub fn faults_now(&self) -> Faults {
        let env = Faults {
            fail_devices: self.fail_devices.clone(),
            lost_devices: BTreeSet::new(),
            pair_hang_ms: self.pair_hang_ms,
            hang_devices: self.hang_devices.clone(),
        };
        let Some(path) = &self.control_file else {
            return env;
        };
        let result = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|text| parse_control(&text, env.clone()));
        match result {
            Ok(faults) => faults,
            Err(why) => {
                warn_once(format!(
                    "chd-fake-runtime: CHD_FAKE_CONTROL_FILE: {why}; using the environment's faults"
                ));
                env
            }
        }
    }

    /// Whether `device` is lost right now (see [`Faults::lost_devices`]).
    pub fn lost_now(&self, device: usize) -> bool {
        self.control_file.is_some() && self.faults_now().lost(device)
    }
}

/// Prints `line` to stderr unless the previous warning printed through here was the same.
fn warn_once(line: String) {
    static LAST: Mutex<Option<String>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.as_deref() != Some(line.as_str()) {
        eprintln!("{line}");
        *last = Some(line);
    }
}

/// The process-wide configuration, read from the environment on first use.
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        Config::from_lookup(|name| std::env::var(name).ok(), |line| eprintln!("{line}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut warnings = Vec::new();
        let cfg = Config::from_lookup(|n| map.get(n).cloned(), |w| warnings.push(w));
        (cfg, warnings)
    }

    #[test]
    fn defaults() {
        let (cfg, warnings) = from(&[]);
        assert!(warnings.is_empty());
        assert_eq!(cfg, Config::default());
        assert_eq!(cfg.device_count, 8);
        assert_eq!(cfg.gbps(3, Some(0)), 58.9);
        assert_eq!(cfg.pci_addresses[2].legacy_upper(), "0000:12:00.0");
        assert_eq!(cfg.pci_addresses[2].nvml_upper(), "00000000:12:00.0");
        assert_eq!(cfg.memory_bytes, 141 * 1024 * 1024 * 1024);
    }

    #[test]
    fn bandwidth_overrides_and_slow_cpus() {
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_H2D_GBPS", "50;0=12.3; 1=35"),
            ("CHD_FAKE_SLOW_CPUS", "0@320-639=6.1;3@0-7,16=20"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.gbps(0, None), 12.3);
        assert_eq!(cfg.gbps(0, Some(1)), 12.3);
        assert_eq!(cfg.gbps(0, Some(320)), 6.1);
        assert_eq!(cfg.gbps(0, Some(639)), 6.1);
        assert_eq!(cfg.gbps(0, Some(640)), 12.3);
        assert_eq!(cfg.gbps(1, Some(320)), 35.0);
        assert_eq!(cfg.gbps(2, Some(320)), 50.0);
        assert_eq!(cfg.gbps(3, Some(7)), 20.0);
        assert_eq!(cfg.gbps(3, Some(16)), 20.0);
        assert_eq!(cfg.gbps(3, Some(8)), 50.0);
    }

    #[test]
    fn same_device_rates_are_their_own() {
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_H2D_GBPS", "50;1=35"),
            ("CHD_FAKE_D2D_GBPS", "3=120; 1=300"),
            ("CHD_FAKE_SLOW_CPUS", "3@0-7=2"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.d2d_gbps(0), DEFAULT_D2D_GBPS);
        assert_eq!(cfg.d2d_gbps(1), 300.0);
        assert_eq!(cfg.d2d_gbps(3), 120.0);
        let (cfg, _) = from(&[("CHD_FAKE_D2D_GBPS", "250;2=90")]);
        assert_eq!((cfg.d2d_gbps(0), cfg.d2d_gbps(2)), (250.0, 90.0));
        let (cfg, warnings) = from(&[("CHD_FAKE_D2D_GBPS", "0=-5")]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(cfg.d2d_gbps(0), DEFAULT_D2D_GBPS);
    }

    #[test]
    fn malformed_values_warn_and_fall_back() {
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_DEVICE_COUNT", "many"),
            ("CHD_FAKE_H2D_GBPS", "58.9;0=-1"),
            ("CHD_FAKE_SLOW_CPUS", "0@5-1=3"),
            ("CHD_FAKE_FAIL_DEVICES", "x"),
            ("CHD_FAKE_MEMORY_BYTES", "0"),
            ("CHD_FAKE_PCI_BUS_IDS", "0000:1g:00.0"),
            ("CHD_FAKE_FAIL_AFTER", "-1"),
            ("CHD_FAKE_NVML_OWN_PID", "0"),
        ]);
        assert_eq!(warnings.len(), 8, "{warnings:?}");
        assert!(warnings[0].contains("CHD_FAKE_DEVICE_COUNT"));
        assert!(warnings.iter().all(|w| !w.contains('\n')));
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn pair_bandwidth_rules() {
        let (cfg, warnings) = from(&[
            (
                "CHD_FAKE_PAIR_GBPS",
                "12.5; rank0:3=4.0;rank1:0=6.5;rank0:104-110,200=2; rank1:3=9",
            ),
            ("CHD_FAKE_PAIR_FAIL", "1"),
            ("CHD_FAKE_PAIR_HANG_MS", "250"),
            ("CHD_FAKE_PAIR_TIMEOUT_MS", "1500"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.pair_gbps, 12.5);
        assert_eq!(cfg.pair_gbps_for(0, None), 12.5);
        assert_eq!(cfg.pair_gbps_for(0, Some(3)), 4.0);
        assert_eq!(cfg.pair_gbps_for(1, Some(3)), 9.0);
        assert_eq!(cfg.pair_gbps_for(1, Some(0)), 6.5);
        assert_eq!(cfg.pair_gbps_for(0, Some(0)), 12.5);
        assert_eq!(cfg.pair_gbps_for(0, Some(104)), 2.0);
        assert_eq!(cfg.pair_gbps_for(0, Some(110)), 2.0);
        assert_eq!(cfg.pair_gbps_for(0, Some(111)), 12.5);
        assert_eq!(cfg.pair_gbps_for(0, Some(200)), 2.0);
        assert_eq!(cfg.pair_gbps_for(2, Some(3)), 12.5);
        assert!(cfg.pair_fail);
        assert_eq!(cfg.pair_hang_ms, 250);
        assert_eq!(cfg.pair_timeout_ms, 1500);

        let (cfg, warnings) = from(&[]);
        assert!(warnings.is_empty());
        assert_eq!(cfg.pair_gbps_for(1, Some(0)), 13.7);
        assert!(!cfg.pair_fail);
        assert_eq!((cfg.pair_hang_ms, cfg.pair_timeout_ms), (0, 30_000));

        let (cfg, warnings) = from(&[
            ("CHD_FAKE_PAIR_GBPS", "13.7;r0:3=4"),
            ("CHD_FAKE_PAIR_FAIL", "maybe"),
            ("CHD_FAKE_PAIR_HANG_MS", "-5"),
            ("CHD_FAKE_PAIR_TIMEOUT_MS", "0"),
        ]);
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        assert!(warnings[0].contains("CHD_FAKE_PAIR_GBPS"));
        assert_eq!(cfg, Config::default());
        assert_eq!(
            parse_pair_gbps("rank1:5-3=2"),
            Err("cpu range \"5-3\" is reversed".to_owned())
        );
        assert!(parse_pair_gbps("rank0:1=0").is_err());
        assert_eq!(parse_switch(" Off "), Ok(false));
    }

    #[test]
    fn peer_access_and_teardown_settings() {
        let (cfg, warnings) = from(&[]);
        assert!(warnings.is_empty());
        assert_eq!((cfg.staged_gbps, cfg.abort_hang_ms), (4.0, 0));
        assert!(cfg.peer_supported(0, 5) && !cfg.peer_supported(3, 3));
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_STAGED_GBPS", "2.5"),
            ("CHD_FAKE_NO_PEER", "5,0; 1,2"),
            ("CHD_FAKE_ABORT_HANG_MS", "750"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!((cfg.staged_gbps, cfg.abort_hang_ms), (2.5, 750));
        assert_eq!(cfg.no_peer, [(0, 5), (1, 2)]);
        assert!(!cfg.peer_supported(0, 5) && !cfg.peer_supported(5, 0));
        assert!(!cfg.peer_supported(2, 1) && cfg.peer_supported(0, 1));
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_STAGED_GBPS", "0"),
            ("CHD_FAKE_NO_PEER", "3"),
            ("CHD_FAKE_ABORT_HANG_MS", "soon"),
        ]);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert_eq!(cfg, Config::default());
        assert!(parse_device_pairs("4,4").is_err());
    }

    #[test]
    fn copy_latency_and_size_dips() {
        let (cfg, warnings) = from(&[]);
        assert!(warnings.is_empty());
        assert_eq!(
            cfg.copy_ns(1000, 10.0),
            100.0,
            "no latency, no dip by default"
        );
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_COPY_LATENCY_US", "20"),
            ("CHD_FAKE_SIZE_DIP", "8MiB=0.1; 4096=0.5"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.size_dips, [(8 << 20, 0.1), (4096, 0.5)]);
        assert_eq!(cfg.copy_ns(1000, 10.0), 100.0 + 20_000.0);
        assert_eq!(cfg.copy_ns(4096, 1.0), 8192.0 + 20_000.0);
        let eight = (8u64 << 20) as f64;
        assert!((cfg.copy_ns(8 << 20, 10.0) - (eight / 1.0 + 20_000.0)).abs() < 1e-6);
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_COPY_LATENCY_US", "-1"),
            ("CHD_FAKE_SIZE_DIP", "32MB=0.1"),
        ]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert_eq!(cfg, Config::default());
        assert!(parse_size_dips("1MiB=0").is_err());
        assert!(parse_size_dips("1MiB").is_err());
    }

    #[test]
    fn ordered_pair_rates() {
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_PAIR_GBPS", "20;rank0:3=4"),
            ("CHD_FAKE_P2P_GBPS", "2>1=3; 0-3>4-7=6;4-7>0-3,9=6.5"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.peer_copy_gbps(2, 1, 0, None), 3.0);
        // Ordered: 1 -> 2 is not 2 -> 1.
        assert_eq!(cfg.peer_copy_gbps(1, 2, 0, None), 20.0);
        assert_eq!(cfg.peer_copy_gbps(0, 5, 0, None), 6.0);
        assert_eq!(cfg.peer_copy_gbps(7, 9, 1, None), 6.5);
        // No rule: CHD_FAKE_PAIR_GBPS, its CPU rules included.
        assert_eq!(cfg.peer_copy_gbps(0, 1, 0, Some(3)), 4.0);
        assert_eq!(cfg.peer_copy_gbps(8, 9, 1, Some(3)), 20.0);
        let (cfg, warnings) = from(&[("CHD_FAKE_P2P_GBPS", "12")]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("CHD_FAKE_P2P_GBPS"), "{warnings:?}");
        assert!(cfg.p2p_gbps.is_empty());
        assert_eq!(
            parse_p2p_gbps("3-1>0=2"),
            Err("device range \"3-1\" is reversed".to_owned())
        );
        assert!(parse_p2p_gbps("0>1=0").is_err());
        assert!(parse_p2p_gbps("0=1").is_err());
    }

    #[test]
    fn gemm_rate_and_load_factor() {
        let (cfg, warnings) = from(&[]);
        assert!(warnings.is_empty());
        assert_eq!((cfg.gemm_tflops, cfg.load_copy_factor), (50.0, 0.5));
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_GEMM_TFLOPS", "12.5"),
            ("CHD_FAKE_LOAD_COPY_FACTOR", "0.25"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!((cfg.gemm_tflops, cfg.load_copy_factor), (12.5, 0.25));
        let (cfg, warnings) = from(&[("CHD_FAKE_GEMM_TFLOPS", "40;1=20; 3=35")]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.gemm_tflops_of(1), 20.0);
        assert_eq!(cfg.gemm_tflops_of(3), 35.0);
        assert_eq!(cfg.gemm_tflops_of(0), 40.0);
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_GEMM_TFLOPS", "0"),
            ("CHD_FAKE_LOAD_COPY_FACTOR", "fast"),
        ]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("CHD_FAKE_GEMM_TFLOPS"));
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn pinning_cost_settings() {
        let (cfg, warnings) = from(&[]);
        assert!(warnings.is_empty());
        assert_eq!((cfg.pin_ms_per_mib, cfg.pin_sleep), (0.0, false));
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_PIN_MS_PER_MIB", "0.12"),
            ("CHD_FAKE_PIN_SLEEP", "1"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!((cfg.pin_ms_per_mib, cfg.pin_sleep), (0.12, true));
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_PIN_MS_PER_MIB", "-1"),
            ("CHD_FAKE_PIN_SLEEP", "maybe"),
        ]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("CHD_FAKE_PIN_MS_PER_MIB"));
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn pci_ids_and_lists() {
        let (cfg, warnings) = from(&[
            ("CHD_FAKE_DEVICE_COUNT", "3"),
            ("CHD_FAKE_PCI_BUS_IDS", "0000:1a:00.0, 00000001:9B:1f.7"),
            ("CHD_FAKE_FAIL_DEVICES", "5,6"),
            ("CHD_FAKE_FAIL_AFTER", "3"),
            ("CHD_FAKE_BUSY_DEVICES", "2"),
            ("CHD_FAKE_DEVICE_NAME", "Fake 910B"),
            ("CHD_FAKE_NVML_OWN_PID", "123456"),
            ("CHD_FAKE_ACL_PCI_BUS_ID", "0"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!((cfg.fail_after, cfg.nvml_own_pid), (3, Some(123456)));
        assert!(!cfg.acl_pci_bus_id);
        assert_eq!(cfg.pci_addresses.len(), 3);
        assert_eq!(cfg.pci_addresses[0].legacy_upper(), "0000:1A:00.0");
        assert_eq!(cfg.pci_addresses[1].nvml_upper(), "00000001:9B:1F.7");
        assert_eq!(cfg.pci_addresses[2], PciAddress::default_for(2));
        let faults = cfg.faults_now();
        assert!(faults.fails(5) && faults.fails(6) && !faults.fails(0));
        assert_eq!(cfg.busy_devices_now(), BTreeSet::from([2]));
        assert_eq!(cfg.device_name, "Fake 910B");
        assert_eq!(
            PciAddress::parse("1a:00.0"),
            PciAddress::parse("0000:1A:00.0")
        );
        assert!(PciAddress::parse("1a:00").is_err());
    }

    #[test]
    fn control_files_override_only_the_keys_they_name() {
        let env = Faults {
            fail_devices: [2].into(),
            lost_devices: BTreeSet::new(),
            pair_hang_ms: 7,
            hang_devices: BTreeSet::new(),
        };
        let f = parse_control(
            "# faults\nlost_devices=1, 3\n\npair_hang_ms = 500\n",
            env.clone(),
        )
        .unwrap();
        assert_eq!(f.lost_devices, [1, 3].into());
        assert_eq!(f.pair_hang_ms, 500);
        assert_eq!(
            f.fail_devices, env.fail_devices,
            "not named: the environment's"
        );
        assert!(parse_control("fail_devices=\n", env.clone())
            .unwrap()
            .fail_devices
            .is_empty());
        for bad in [
            "lost_devices",
            "bogus=1",
            "pair_hang_ms=soon",
            "lost_devices=x",
        ] {
            assert!(parse_control(bad, env.clone()).is_err(), "{bad}");
        }
    }
}
