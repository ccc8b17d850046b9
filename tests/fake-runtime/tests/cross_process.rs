//! NCCL and HCCL across processes (`src/net/`): two rank processes (this test binary run
//! again with `XP_ROLE=rank`) bootstrap through a unique id / root info that rank 0 makes
//! and hands over through a file, and allgather and all-reduce over real sockets: on
//! loopback (bytes, sums in f32/f16/bf16/int8, event time against wall time), across two
//! network namespaces joined by two veth rails, one shaped with `tc ... tbf` (the shaped
//! rail's bus bandwidth reads its rate, the other clearly faster), with a peer killed
//! mid-collective (an error naming it on the survivor within the timeout), with wrong ids
//! (refused) and with `NCCL_COMM_ID`. Point-to-point send/recv (2 ranks): 8 MiB each way on
//! loopback (bytes checked, event time against wall time), each way over the rail shaped
//! on one side only (the shaped direction reads the tbf rate, the other clearly faster),
//! mismatched calls refused on both ranks, in-process communicators refused. Rank 0 makes the id, so it joins through the hand-over
//! from the in-process rendezvous (`net::bootstrap`'s rule); rank 1 joins directly.
//!
//! Its own `main` (harness = false): the parent runs the tests below in order, a child runs
//! one rank. The namespace tests need root, `ip` and `tc` (iproute2) and `sch_tbf`; without
//! them they fail, saying so.

use std::ffi::{c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use chd_fake_runtime::acl::*;
use chd_fake_runtime::cuda::*;
use chd_fake_runtime::hccl::*;
use chd_fake_runtime::nccl::*;
use chd_fake_runtime::net::reduce::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

const MIB: usize = 1 << 20;
/// The shaped rail's rate: `tbf rate 200mbit`, in bytes per second.
const SHAPED_BYTES_PER_S: f64 = 200e6 / 8.0;

fn main() {
    if std::env::var("XP_ROLE").as_deref() == Ok("rank") {
        if let Err(e) = child::run() {
            eprintln!("rank error: {e}");
            std::process::exit(3);
        }
        return;
    }
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let tests: &[(&str, fn())] = &[
        ("loopback_nccl_two_processes", loopback_nccl_two_processes),
        ("loopback_hccl_two_processes", loopback_hccl_two_processes),
        (
            "killed_peer_fails_the_survivor",
            killed_peer_fails_the_survivor,
        ),
        ("wrong_ids_are_refused", wrong_ids_are_refused),
        (
            "one_rank_per_gpu_and_host_for_nccl",
            one_rank_per_gpu_and_host_for_nccl,
        ),
        ("p2p_mismatch_nccl_refused", p2p_mismatch_nccl_refused),
        ("p2p_mismatch_hccl_refused", p2p_mismatch_hccl_refused),
        ("p2p_in_process_not_supported", p2p_in_process_not_supported),
        ("nccl_comm_id_places_the_root", nccl_comm_id_places_the_root),
        ("namespaces_nccl_shaped_rail", namespaces_nccl_shaped_rail),
        ("namespaces_hccl_shaped_rail", namespaces_hccl_shaped_rail),
        (
            "namespaces_peer_killed_mid_transfer",
            namespaces_peer_killed_mid_transfer,
        ),
    ];
    let mut failed = Vec::new();
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let t0 = Instant::now();
        let ok = std::panic::catch_unwind(test).is_ok();
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "test {name} ... {} ({secs:.1} s)",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}

/// The byte pattern rank `seed` contributes.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    // Periodic in 256 bytes: built by repeating one period (fast in debug builds).
    let period: Vec<u8> = (0..=255u8)
        .map(|i| i.wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut out = Vec::with_capacity(len + 256);
    while out.len() < len {
        out.extend_from_slice(&period);
    }
    out.truncate(len);
    out
}

/// Element `i` of rank `r`'s all-reduce input, as f32 (exact in f16 and bf16 too: small
/// integers and halves).
fn reduce_input(r: usize, i: usize) -> f32 {
    ((i % 13) as f32 - 6.0) * 0.5 + r as f32
}

/// The rank process's side: everything it does is driven by `XP_*` variables.
mod child {
    use super::*;

    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Lib {
        Nccl,
        Hccl,
    }

    fn var(name: &str) -> Result<String, String> {
        std::env::var(name).map_err(|_| format!("{name} is not set"))
    }

    fn num(name: &str) -> Result<usize, String> {
        var(name)?.parse().map_err(|e| format!("{name}: {e}"))
    }

    /// One rank's device side: allocations, a stream and two events, CUDA or ACL.
    struct Dev {
        lib: Lib,
        stream: *mut c_void,
        start: *mut c_void,
        end: *mut c_void,
    }

    impl Dev {
        fn new(lib: Lib, device: i32) -> Dev {
            let mut d = Dev {
                lib,
                stream: null_mut(),
                start: null_mut(),
                end: null_mut(),
            };
            // SAFETY: valid out-pointers.
            unsafe {
                match lib {
                    Lib::Nccl => {
                        assert_eq!(cudaSetDevice(device), 0);
                        assert_eq!(cudaStreamCreate(&mut d.stream), 0);
                        assert_eq!(cudaEventCreate(&mut d.start), 0);
                        assert_eq!(cudaEventCreate(&mut d.end), 0);
                    }
                    Lib::Hccl => {
                        assert_eq!(aclrtSetDevice(device), 0);
                        assert_eq!(aclrtCreateStream(&mut d.stream), 0);
                        assert_eq!(aclrtCreateEvent(&mut d.start), 0);
                        assert_eq!(aclrtCreateEvent(&mut d.end), 0);
                    }
                }
            }
            d
        }

        fn upload(&self, data: &[u8]) -> *mut c_void {
            let mut p = null_mut();
            // SAFETY: valid out-pointer; `data` outlives the synchronous copy.
            unsafe {
                match self.lib {
                    Lib::Nccl => {
                        assert_eq!(cudaMalloc(&mut p, data.len()), 0);
                        let rc = cudaMemcpy(p, data.as_ptr().cast(), data.len(), 1);
                        assert_eq!(rc, 0);
                    }
                    Lib::Hccl => {
                        assert_eq!(aclrtMalloc(&mut p, data.len(), 0), 0);
                        let rc = aclrtMemcpy(
                            p,
                            data.len(),
                            data.as_ptr().cast(),
                            data.len(),
                            ACL_MEMCPY_HOST_TO_DEVICE,
                        );
                        assert_eq!(rc, 0);
                    }
                }
            }
            p
        }

        fn download(&self, p: *mut c_void, len: usize) -> Vec<u8> {
            let mut out = vec![0u8; len];
            // SAFETY: `p` holds `len` bytes; `out` is as large.
            let rc = unsafe {
                match self.lib {
                    Lib::Nccl => cudaMemcpy(out.as_mut_ptr().cast(), p, len, 2),
                    Lib::Hccl => aclrtMemcpy(
                        out.as_mut_ptr().cast(),
                        len,
                        p,
                        len,
                        ACL_MEMCPY_DEVICE_TO_HOST,
                    ),
                }
            };
            assert_eq!(rc, 0);
            out
        }

        fn record(&self, event: *mut c_void) {
            // SAFETY: live handles.
            let rc = unsafe {
                match self.lib {
                    Lib::Nccl => cudaEventRecord(event, self.stream),
                    Lib::Hccl => aclrtRecordEvent(event, self.stream),
                }
            };
            assert_eq!(rc, 0);
        }

        fn elapsed_ms(&self) -> f32 {
            let mut ms = -1.0;
            // SAFETY: live handles; valid out-pointer.
            unsafe {
                match self.lib {
                    Lib::Nccl => {
                        assert_eq!(cudaStreamSynchronize(self.stream), 0);
                        assert_eq!(cudaEventElapsedTime(&mut ms, self.start, self.end), 0);
                    }
                    Lib::Hccl => {
                        assert_eq!(aclrtSynchronizeStream(self.stream), 0);
                        assert_eq!(aclrtEventElapsedTime(&mut ms, self.start, self.end), 0);
                    }
                }
            }
            ms
        }
    }

    /// The id as hex, and back.
    fn make_id(lib: Lib) -> Vec<u8> {
        match lib {
            Lib::Nccl => {
                let mut id = ncclUniqueId { internal: [0; 128] };
                // SAFETY: valid out-pointer.
                assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
                id.internal.iter().map(|&c| c as u8).collect()
            }
            Lib::Hccl => {
                let mut id = HcclRootInfo {
                    internal: [0; 4108],
                };
                // SAFETY: valid out-pointer.
                assert_eq!(unsafe { HcclGetRootInfo(&mut id) }, 0);
                id.internal.iter().map(|&c| c as u8).collect()
            }
        }
    }

    fn share_id(lib: Lib, rank: usize, file: &Path) -> Result<Vec<u8>, String> {
        if rank == 0 {
            let id = make_id(lib);
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            let tmp = file.with_extension("tmp");
            std::fs::write(&tmp, hex).map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, file).map_err(|e| e.to_string())?;
            return Ok(id);
        }
        for _ in 0..400 {
            if let Ok(hex) = std::fs::read_to_string(file) {
                return (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!("no id in {} after 10 s", file.display()))
    }

    fn last_error(lib: Lib) -> String {
        match lib {
            // SAFETY: a NUL-terminated thread-local string.
            Lib::Nccl => unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
                .to_string_lossy()
                .into_owned(),
            Lib::Hccl => String::new(),
        }
    }

    fn init(lib: Lib, id: &[u8], nranks: usize, rank: usize) -> (c_int, *mut c_void) {
        let mut comm = null_mut();
        // SAFETY: valid out-pointer; the id buffers are the libraries' sizes.
        let rc = unsafe {
            match lib {
                Lib::Nccl => {
                    let mut uid = ncclUniqueId { internal: [0; 128] };
                    for (s, b) in uid.internal.iter_mut().zip(id) {
                        *s = *b as _;
                    }
                    ncclCommInitRank(&mut comm, nranks as c_int, uid, rank as c_int)
                }
                Lib::Hccl => {
                    let mut info = HcclRootInfo {
                        internal: [0; 4108],
                    };
                    for (s, b) in info.internal.iter_mut().zip(id) {
                        *s = *b as _;
                    }
                    HcclCommInitRootInfo(nranks as u32, &info, rank as u32, &mut comm)
                }
            }
        };
        (rc, comm)
    }

    /// NCCL datatype, HCCL datatype, element size and f32 <-> bytes for the all-reduce
    /// types.
    struct Ty {
        nccl: c_int,
        hccl: c_int,
        size: usize,
        enc: fn(f32, &mut Vec<u8>),
        dec: fn(&[u8]) -> f32,
    }

    fn ty(name: &str) -> Option<Ty> {
        Some(match name {
            "f32" => Ty {
                nccl: 7,
                hccl: 4,
                size: 4,
                enc: |x, out| out.extend_from_slice(&x.to_le_bytes()),
                dec: |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            },
            "f16" => Ty {
                nccl: 6,
                hccl: 3,
                size: 2,
                enc: |x, out| out.extend_from_slice(&f32_to_f16(x).to_le_bytes()),
                dec: |b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            },
            "bf16" => Ty {
                nccl: 9,
                hccl: 11,
                size: 2,
                enc: |x, out| out.extend_from_slice(&f32_to_bf16(x).to_le_bytes()),
                dec: |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            },
            "i8" => Ty {
                nccl: 0,
                hccl: 0,
                size: 1,
                enc: |x, out| out.push((x * 2.0) as i8 as u8),
                dec: |b| f32::from(b[0] as i8) / 2.0,
            },
            _ => return None,
        })
    }

    pub fn run() -> Result<(), String> {
        let lib = match var("XP_LIB")?.as_str() {
            "nccl" => Lib::Nccl,
            "hccl" => Lib::Hccl,
            other => return Err(format!("XP_LIB={other}")),
        };
        let (rank, nranks) = (num("XP_RANK")?, num("XP_NRANKS")?);
        let dev = Dev::new(lib, num("XP_DEVICE")? as i32);
        let id = share_id(lib, rank, Path::new(&var("XP_ID_FILE")?))?;
        let (rc, comm) = init(lib, &id, nranks, rank);
        if rc != 0 {
            return Err(format!("init: {rc} {}", last_error(lib)));
        }
        if let Ok(ready) = var("XP_READY_FILE") {
            std::fs::write(ready, "ready").map_err(|e| e.to_string())?;
        }
        if var("XP_HANG").is_ok() {
            std::thread::sleep(Duration::from_secs(600));
        }
        // `XP_OPS_<rank>` (this rank's own list) wins over `XP_OPS` (both ranks').
        let ops = var(&format!("XP_OPS_{rank}")).or_else(|_| var("XP_OPS"))?;
        for op in ops.split(',').filter(|o| !o.is_empty()) {
            let (kind, bytes) = op.split_once(':').ok_or(format!("op {op}"))?;
            let bytes: usize = bytes.parse().map_err(|e| format!("{op}: {e}"))?;
            if kind == "allgather" {
                allgather(lib, &dev, comm, rank, nranks, bytes)?;
            } else if let Some((from, to)) = kind
                .strip_prefix("p2p_")
                .or_else(|| kind.strip_prefix("p2pgroup_"))
                .and_then(|r| r.split_once("to"))
                .and_then(|(f, t)| Some((f.parse().ok()?, t.parse().ok()?)))
            {
                p2p(lib, &dev, comm, rank, from, to, bytes, kind)?;
            } else if let Some(how) = kind.strip_prefix("refused_") {
                refused(lib, &dev, comm, rank, how, bytes)?;
            } else if let Some(t) = kind.strip_prefix("allreduce_").and_then(ty) {
                allreduce(lib, &dev, comm, rank, nranks, bytes, &t, kind)?;
            } else {
                return Err(format!("unknown op {op}"));
            }
        }
        // SAFETY: a live communicator, destroyed once.
        let rc = unsafe {
            match lib {
                Lib::Nccl => ncclCommDestroy(comm),
                Lib::Hccl => HcclCommDestroy(comm),
            }
        };
        if rc != 0 {
            return Err(format!("destroy: {rc}"));
        }
        Ok(())
    }

    /// Prints `RESULT` (or `FAILED` when the collective failed) for the parent.
    fn report(
        lib: Lib,
        comm: *mut c_void,
        op: &str,
        bytes: usize,
        rc: c_int,
        dev: &Dev,
        wall: f64,
    ) {
        if rc != 0 {
            let mut async_rc = -1;
            // SAFETY: valid out-pointer; comm is live.
            unsafe {
                match lib {
                    Lib::Nccl => ncclCommGetAsyncError(comm, &mut async_rc),
                    Lib::Hccl => HcclGetCommAsyncError(comm, &mut async_rc),
                }
            };
            let abort_rc = match lib {
                // SAFETY: comm is live; aborted once.
                Lib::Nccl => unsafe { ncclCommAbort(comm) },
                Lib::Hccl => 0,
            };
            println!(
                "FAILED op={op} rc={rc} async={async_rc} abort={abort_rc} wall_ms={wall:.1} err={}",
                last_error(lib)
            );
            std::process::exit(0);
        }
        let ms = dev.elapsed_ms();
        println!("RESULT op={op} bytes={bytes} ms={ms} wall_ms={wall:.3}");
    }

    fn allgather(
        lib: Lib,
        dev: &Dev,
        comm: *mut c_void,
        rank: usize,
        nranks: usize,
        bytes: usize,
    ) -> Result<(), String> {
        let send = dev.upload(&pattern(bytes, rank as u8 + 1));
        let recv = dev.upload(&vec![0u8; bytes * nranks]);
        dev.record(dev.start);
        let t0 = Instant::now();
        // SAFETY: live buffers, stream and communicator.
        let rc = unsafe {
            match lib {
                Lib::Nccl => ncclAllGather(send, recv, bytes, 1, comm, dev.stream),
                Lib::Hccl => HcclAllGather(send, recv, bytes as u64, 7, comm, dev.stream),
            }
        };
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        dev.record(dev.end);
        report(lib, comm, "allgather", bytes, rc, dev, wall);
        let got = dev.download(recv, bytes * nranks);
        let want: Vec<u8> = (0..nranks)
            .map(|r| pattern(bytes, r as u8 + 1))
            .collect::<Vec<_>>()
            .concat();
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b);
            return Err(format!("allgather: wrong bytes, first at {at:?}"));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments, reason = "one rank's whole context")]
    fn allreduce(
        lib: Lib,
        dev: &Dev,
        comm: *mut c_void,
        rank: usize,
        nranks: usize,
        bytes: usize,
        t: &Ty,
        name: &str,
    ) -> Result<(), String> {
        let count = bytes / t.size;
        let mut input = Vec::with_capacity(bytes);
        for i in 0..count {
            (t.enc)(reduce_input(rank, i), &mut input);
        }
        let buf = dev.upload(&input);
        dev.record(dev.start);
        let t0 = Instant::now();
        // SAFETY: live buffer (in place), stream and communicator.
        let rc = unsafe {
            match lib {
                Lib::Nccl => ncclAllReduce(buf, buf, count, t.nccl, 0, comm, dev.stream),
                Lib::Hccl => HcclAllReduce(buf, buf, count as u64, t.hccl, 0, comm, dev.stream),
            }
        };
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        dev.record(dev.end);
        report(lib, comm, name, bytes, rc, dev, wall);
        let got = dev.download(buf, bytes);
        for (i, e) in got.chunks_exact(t.size).enumerate() {
            let want: f32 = (0..nranks).map(|r| reduce_input(r, i)).sum();
            let mut enc = Vec::with_capacity(t.size);
            (t.enc)(want, &mut enc);
            let want = (t.dec)(&enc);
            if (t.dec)(e) != want {
                return Err(format!("{name}: element {i} is {} not {want}", (t.dec)(e)));
            }
        }
        Ok(())
    }

    /// `ncclSend`/`HcclSend` (`send`) or `ncclRecv`/`HcclRecv` of `bytes` bytes (uint8).
    fn p2p_call(
        lib: Lib,
        send: bool,
        buf: *mut c_void,
        bytes: usize,
        peer: usize,
        comm: *mut c_void,
        stream: *mut c_void,
    ) -> c_int {
        let (n, p) = (bytes as u64, peer as u32);
        // SAFETY: live buffer of `bytes` bytes, stream and communicator.
        unsafe {
            match (lib, send) {
                (Lib::Nccl, true) => ncclSend(buf, bytes, 1, peer as c_int, comm, stream),
                (Lib::Nccl, false) => ncclRecv(buf, bytes, 1, peer as c_int, comm, stream),
                (Lib::Hccl, true) => HcclSend(buf, n, 7, p, comm, stream),
                (Lib::Hccl, false) => HcclRecv(buf, n, 7, p, comm, stream),
            }
        }
    }

    /// Rank `from` sends `bytes` of its pattern to rank `to`, which checks them.
    #[allow(clippy::too_many_arguments, reason = "one rank's whole context")]
    fn p2p(
        lib: Lib,
        dev: &Dev,
        comm: *mut c_void,
        rank: usize,
        from: usize,
        to: usize,
        bytes: usize,
        name: &str,
    ) -> Result<(), String> {
        let sending = rank == from;
        let (data, peer) = if sending {
            (pattern(bytes, from as u8 + 1), to)
        } else {
            (vec![0u8; bytes], from)
        };
        let buf = dev.upload(&data);
        dev.record(dev.start);
        let t0 = Instant::now();
        // `p2pgroup_`: NCCL's call inside ncclGroupStart/End (queued, run at the end).
        let grouped = lib == Lib::Nccl && name.starts_with("p2pgroup_");
        // SAFETY: group calls of this thread, balanced.
        if grouped && unsafe { ncclGroupStart() } != 0 {
            return Err("ncclGroupStart".to_owned());
        }
        let mut rc = p2p_call(lib, sending, buf, bytes, peer, comm, dev.stream);
        if grouped {
            // SAFETY: as above.
            let end = unsafe { ncclGroupEnd() };
            rc = if rc != 0 { rc } else { end };
        }
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        dev.record(dev.end);
        report(lib, comm, name, bytes, rc, dev, wall);
        if !sending && dev.download(buf, bytes) != pattern(bytes, from as u8 + 1) {
            return Err(format!("{name}: rank {rank} received wrong bytes"));
        }
        Ok(())
    }

    /// A point-to-point call that must be refused: `send`/`recv` to the other rank (the peer
    /// makes a call that does not match: `InvalidArgument` on both), `self` (a send to
    /// itself: not supported, refused here alone). Prints `REFUSED`.
    fn refused(
        lib: Lib,
        dev: &Dev,
        comm: *mut c_void,
        rank: usize,
        how: &str,
        bytes: usize,
    ) -> Result<(), String> {
        let buf = dev.upload(&vec![0u8; bytes]);
        let (send, peer, want) = match (how, lib) {
            ("send", Lib::Nccl) => (true, 1 - rank, NCCL_INVALID_ARGUMENT),
            ("recv", Lib::Nccl) => (false, 1 - rank, NCCL_INVALID_ARGUMENT),
            ("self", Lib::Nccl) => (true, rank, NCCL_INVALID_USAGE),
            ("send", Lib::Hccl) => (true, 1 - rank, HCCL_E_PARA),
            ("recv", Lib::Hccl) => (false, 1 - rank, HCCL_E_PARA),
            ("self", Lib::Hccl) => (true, rank, HCCL_E_NOT_SUPPORT),
            _ => return Err(format!("refused_{how}")),
        };
        let t0 = Instant::now();
        let rc = p2p_call(lib, send, buf, bytes, peer, comm, dev.stream);
        let err = last_error(lib);
        println!(
            "REFUSED op={how} rc={rc} wall_ms={:.1} err={err}",
            t0.elapsed().as_secs_f64() * 1e3
        );
        if rc != want {
            return Err(format!("refused_{how}: rc {rc}, want {want}: {err}"));
        }
        Ok(())
    }
}

/// One measured collective of a rank.
#[derive(Debug)]
struct Measured {
    op: String,
    bytes: usize,
    ms: f64,
    wall_ms: f64,
}

impl Measured {
    /// nccl-tests' bus bandwidth in bytes per second for 2 ranks: allgather per-rank bytes x
    /// (n - 1) / t, all-reduce bytes x 2 (n - 1) / n / t: both `bytes / t` here.
    fn busbw(&self) -> f64 {
        self.bytes as f64 / (self.ms * 1e-3)
    }
}

fn parse(out: &str) -> Vec<Measured> {
    out.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|l| {
            let field = |k: &str| {
                l.split(' ')
                    .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                    .unwrap_or_else(|| panic!("{k} in {l}"))
                    .to_owned()
            };
            Measured {
                op: field("op"),
                bytes: field("bytes").parse().unwrap(),
                ms: field("ms").parse().unwrap(),
                wall_ms: field("wall_ms").parse().unwrap(),
            }
        })
        .collect()
}

/// A rank process, killed on drop.
struct RankProc {
    child: Child,
}

impl Drop for RankProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RankProc {
    fn finish(mut self) -> (bool, String, String) {
        let mut out = String::new();
        let mut err = String::new();
        use std::io::Read;
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let ok = self.child.wait().map(|s| s.success()).unwrap_or(false);
        (ok, out, err)
    }
}

/// A scratch directory for the id and ready files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("chd-xp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Spawns rank `rank` (optionally inside network namespace `netns`) with `vars`.
fn spawn(netns: Option<&str>, rank: usize, vars: &[(&str, String)]) -> RankProc {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.env("XP_ROLE", "rank")
        .env("XP_RANK", rank.to_string())
        .env("XP_NRANKS", "2")
        .env("XP_DEVICE", rank.to_string())
        .env("CHD_FAKE_DEVICE_COUNT", "2")
        .env("CHD_FAKE_MEMORY_BYTES", (1u64 << 32).to_string())
        .env_remove("NCCL_SOCKET_IFNAME")
        .env_remove("HCCL_SOCKET_IFNAME")
        .env_remove("NCCL_COMM_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        // `{host}`: this rank's host number on a rail (rank 0 is .1, rank 1 is .2).
        cmd.env(k, v.replace("{host}", &(rank + 1).to_string()));
    }
    RankProc {
        child: cmd.spawn().expect("spawning a rank"),
    }
}

/// Runs both ranks to the end and returns rank 0's and rank 1's measurements.
fn pair(netns: [Option<&str>; 2], vars: &[(&str, String)], tag: &str) -> [Vec<Measured>; 2] {
    let scratch = Scratch::new(tag);
    let mut all = vars.to_vec();
    all.push(("XP_ID_FILE", scratch.0.join("id").display().to_string()));
    let procs = [spawn(netns[0], 0, &all), spawn(netns[1], 1, &all)];
    let results = procs.map(|p| {
        let (ok, out, err) = p.finish();
        assert!(ok, "a rank failed:\nstdout:\n{out}\nstderr:\n{err}");
        parse(&out)
    });
    results
}

fn ops_checked(results: &[Vec<Measured>; 2], ops: &[&str]) {
    for (rank, r) in results.iter().enumerate() {
        let names: Vec<&str> = r.iter().map(|m| m.op.as_str()).collect();
        assert_eq!(names, ops, "rank {rank}");
    }
    for (a, b) in results[0].iter().zip(&results[1]) {
        // Both ranks' clocks advance by the same wall time the bytes took (the longer rank's),
        // which lies inside the longer call.
        let rel = (a.ms - b.ms).abs() / a.ms;
        assert!(
            a.ms > 0.0 && rel < 1e-5,
            "the ranks' elapsed times differ: {a:?} {b:?}"
        );
        assert!(a.ms <= a.wall_ms.max(b.wall_ms) + 0.01, "{a:?} {b:?}");
    }
}

fn loopback(lib: &str, ifvar: &str) {
    let ops = format!(
        "allgather:{},allreduce_f32:{},allreduce_f16:{},allreduce_bf16:{},allreduce_i8:{},\
         p2p_1to0:{},p2p_0to1:{}",
        64 * MIB,
        16 * MIB,
        MIB,
        MIB,
        MIB + 3,
        8 * MIB,
        8 * MIB
    );
    let vars = [
        ("XP_LIB", lib.to_owned()),
        ("XP_OPS", ops),
        (ifvar, "=lo".to_owned()),
    ];
    let results = pair([None, None], &vars, lib);
    let names = [
        "allgather",
        "allreduce_f32",
        "allreduce_f16",
        "allreduce_bf16",
        "allreduce_i8",
        "p2p_1to0",
        "p2p_0to1",
    ];
    ops_checked(&results, &names);
    for m in &results[0] {
        let gbps = m.busbw() / 1e9;
        println!(
            "  {lib} loopback {} {} B: {gbps:.3} GB/s {}, {:.1} ms",
            m.op,
            m.bytes,
            if m.op.starts_with("p2p_") {
                "one way"
            } else {
                "bus bandwidth"
            },
            m.ms
        );
    }
    for (a, b) in results[0].iter().zip(&results[1]) {
        if !a.op.starts_with("p2p_") {
            continue;
        }
        // The stream clock moved by the bytes' wall time (at most the longer call's: checked
        // above), not by a model's: a one-way copy through the loopback sockets of a debug
        // build is well below 50 GB/s, and the sender's clock took the receiver's time.
        let gbps = a.busbw() / 1e9;
        assert!(
            gbps > 0.0 && gbps < 50.0,
            "{lib} {}: {gbps} GB/s ({b:?})",
            a.op
        );
    }
}

fn loopback_nccl_two_processes() {
    loopback("nccl", "NCCL_SOCKET_IFNAME");
}

fn loopback_hccl_two_processes() {
    loopback("hccl", "HCCL_SOCKET_IFNAME");
}

/// Kills rank 1 `after_ready` after it initialised and checks rank 0's allgather fails with
/// `ncclRemoteError` naming `peer`, soon after the kill and well within the timeout; the
/// async error reports it and `ncclCommAbort` works. `hang`: rank 1 never enters the
/// collective (else it is killed in the middle of it).
fn kill_peer(
    netns: [Option<&str>; 2],
    ifname: &str,
    bytes: usize,
    hang: bool,
    after_ready: Duration,
    peer: &str,
) {
    let scratch = Scratch::new("kill");
    let ready = scratch.0.join("ready");
    let vars = [
        ("XP_LIB", "nccl".to_owned()),
        ("XP_OPS", format!("allgather:{bytes}")),
        ("NCCL_SOCKET_IFNAME", ifname.to_owned()),
        ("CHD_FAKE_PAIR_TIMEOUT_MS", "20000".to_owned()),
        ("XP_ID_FILE", scratch.0.join("id").display().to_string()),
    ];
    let survivor = spawn(netns[0], 0, &vars);
    let mut doomed_vars = vars.to_vec();
    if hang {
        doomed_vars.push(("XP_HANG", "1".to_owned()));
    }
    doomed_vars.push(("XP_READY_FILE", ready.display().to_string()));
    let mut doomed = spawn(netns[1], 1, &doomed_vars);
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "rank 1 never initialised"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(after_ready);
    let killed_at = Instant::now();
    doomed.child.kill().unwrap();
    let _ = doomed.child.wait();
    let (ok, out, err) = survivor.finish();
    let after = killed_at.elapsed();
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("FAILED "))
        .unwrap_or_else(|| panic!("rank 0 did not fail: {out}"));
    assert!(line.contains("rc=6 "), "ncclRemoteError: {line}");
    assert!(
        line.contains("async=6 "),
        "the async error reports it: {line}"
    );
    assert!(line.contains("abort=0 "), "ncclCommAbort works: {line}");
    assert!(line.contains(peer), "names the peer {peer}: {line}");
    assert!(
        after < Duration::from_secs(5),
        "within the 20 s timeout: {after:?}"
    );
    println!("  survivor failed {after:?} after the kill: {line}");
}

/// Rank 1 killed while rank 0 waits in its allgather for it.
fn killed_peer_fails_the_survivor() {
    let wait = Duration::from_millis(500);
    kill_peer(
        [None, None],
        "lo",
        4 * MIB,
        true,
        wait,
        "rank 1 at 127.0.0.1:",
    );
}

/// Rank 1 killed in the middle of a 64 MiB allgather over the shaped rail (2.7 s).
fn namespaces_peer_killed_mid_transfer() {
    let ns = Netns::new("kill");
    let netns = [Some(ns.names[0].as_str()), Some(ns.names[1].as_str())];
    let wait = Duration::from_millis(1200);
    kill_peer(
        netns,
        "=rail0",
        64 * MIB,
        false,
        wait,
        "rank 1 at 10.77.0.2:",
    );
}

/// Point-to-point calls that do not match are refused on both ranks, and the communicator
/// still works after them: both ranks sending, sizes that differ, a send to oneself (refused
/// at once, locally); then a matching transfer goes through (for NCCL inside a group).
fn p2p_mismatch(lib: &str) {
    let vars = [
        ("XP_LIB", lib.to_owned()),
        ("NCCL_SOCKET_IFNAME", "=lo".to_owned()),
        ("HCCL_SOCKET_IFNAME", "=lo".to_owned()),
        (
            "XP_OPS_0",
            "refused_send:65536,refused_send:1000,refused_self:64,p2pgroup_1to0:4096".to_owned(),
        ),
        (
            "XP_OPS_1",
            "refused_send:65536,refused_recv:2000,refused_self:64,p2pgroup_1to0:4096".to_owned(),
        ),
    ];
    let scratch = Scratch::new(&format!("mismatch-{lib}"));
    let mut all = vars.to_vec();
    all.push(("XP_ID_FILE", scratch.0.join("id").display().to_string()));
    let procs = [spawn(None, 0, &all), spawn(None, 1, &all)];
    for (rank, p) in procs.into_iter().enumerate() {
        let (ok, out, err) = p.finish();
        assert!(ok, "rank {rank} failed:\nstdout:\n{out}\nstderr:\n{err}");
        let refused: Vec<&str> = out.lines().filter(|l| l.starts_with("REFUSED ")).collect();
        assert_eq!(refused.len(), 3, "rank {rank}: {out}");
        if lib == "nccl" {
            for line in &refused[..2] {
                assert!(line.contains("point-to-point mismatch"), "{line}");
            }
            assert!(
                refused[1].contains("a send of 1000 bytes"),
                "{}",
                refused[1]
            );
            assert!(
                refused[1].contains("a receive of 2000 bytes"),
                "{}",
                refused[1]
            );
            assert!(
                refused[2].contains("2-rank communicators"),
                "{}",
                refused[2]
            );
        }
        for line in &refused {
            println!("  {lib} rank {rank}: {line}");
        }
        let done = parse(&out);
        assert_eq!(done.len(), 1, "rank {rank}: {out}");
        assert_eq!(done[0].op, "p2pgroup_1to0");
    }
}

fn p2p_mismatch_nccl_refused() {
    p2p_mismatch("nccl");
}

fn p2p_mismatch_hccl_refused() {
    p2p_mismatch("hccl");
}

/// Communicators of `ncclCommInitAll` / `HcclCommInitAll` (in-process): send/recv are
/// refused as not supported (count 0 is still a success, a NULL buffer an argument error).
fn p2p_in_process_not_supported() {
    std::env::set_var("CHD_FAKE_DEVICE_COUNT", "2");
    let last = || {
        // SAFETY: a NUL-terminated thread-local string.
        unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: valid out-pointers, live buffers and communicators throughout.
    unsafe {
        let mut comms = [null_mut(); 2];
        assert_eq!(ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()), 0);
        assert_eq!(cudaSetDevice(0), 0);
        let mut buf = null_mut();
        assert_eq!(cudaMalloc(&mut buf, 4096), 0);
        assert_eq!(
            ncclSend(buf, 1024, 7, 1, comms[0], null_mut()),
            NCCL_INVALID_USAGE
        );
        assert!(
            last().contains("not supported by the fake in-process"),
            "{}",
            last()
        );
        assert_eq!(
            ncclRecv(buf, 1024, 7, 1, comms[0], null_mut()),
            NCCL_INVALID_USAGE
        );
        assert_eq!(ncclSend(buf, 0, 7, 1, comms[0], null_mut()), NCCL_SUCCESS);
        assert_eq!(
            ncclRecv(null_mut(), 16, 7, 1, comms[0], null_mut()),
            NCCL_INVALID_ARGUMENT
        );
        assert!(last().contains("recvbuff is NULL"), "{}", last());
        assert_eq!(
            ncclSend(buf, 16, 7, 2, comms[0], null_mut()),
            NCCL_INVALID_ARGUMENT
        );
        assert!(last().contains("peer 2 is out of range"), "{}", last());
        assert_eq!(cudaFree(buf), 0);
        assert_eq!(ncclGroupStart(), 0);
        for c in comms {
            assert_eq!(ncclCommDestroy(c), 0);
        }
        assert_eq!(ncclGroupEnd(), 0);

        let mut hcomms = [null_mut(); 2];
        let mut devs = [0, 1];
        assert_eq!(
            HcclCommInitAll(2, devs.as_mut_ptr(), hcomms.as_mut_ptr()),
            0
        );
        assert_eq!(aclrtSetDevice(0), 0);
        let mut hbuf = null_mut();
        assert_eq!(aclrtMalloc(&mut hbuf, 4096, 0), 0);
        assert_eq!(
            HcclSend(hbuf, 1024, 4, 1, hcomms[0], null_mut()),
            HCCL_E_NOT_SUPPORT
        );
        assert_eq!(
            HcclRecv(hbuf, 1024, 4, 1, hcomms[0], null_mut()),
            HCCL_E_NOT_SUPPORT
        );
        assert_eq!(HcclSend(hbuf, 0, 4, 1, hcomms[0], null_mut()), HCCL_SUCCESS);
        assert_eq!(
            HcclRecv(null_mut(), 16, 4, 1, hcomms[0], null_mut()),
            HCCL_E_PTR
        );
        assert_eq!(aclrtFree(hbuf), 0);
        for c in hcomms {
            assert_eq!(HcclCommDestroy(c), 0);
        }
    }
}

/// NCCL's init refuses two ranks of one communicator on one device of one host
/// ("Duplicate GPU detected", `ncclInvalidUsage`) on both; the host is `NCCL_HOSTID` when set,
/// so two processes that stand for two nodes may use the same device index. HCCL has no such
/// rule in the fake.
fn one_rank_per_gpu_and_host_for_nccl() {
    let run = |lib: &str, hosts: [&str; 2]| {
        let scratch = Scratch::new(&format!("dup-{lib}-{}", hosts[1]));
        let procs = [0, 1].map(|rank| {
            let vars = [
                ("XP_LIB", lib.to_owned()),
                ("XP_OPS", format!("allgather:{MIB}")),
                ("NCCL_SOCKET_IFNAME", "=lo".to_owned()),
                ("HCCL_SOCKET_IFNAME", "=lo".to_owned()),
                ("XP_ID_FILE", scratch.0.join("id").display().to_string()),
                ("XP_DEVICE", "0".to_owned()),
                ("NCCL_HOSTID", hosts[rank].to_owned()),
            ];
            spawn(None, rank, &vars)
        });
        procs.map(|p| p.finish())
    };
    for (rank, (ok, out, err)) in run("nccl", ["h", "h"]).into_iter().enumerate() {
        assert!(!ok, "rank {rank} joined beside a rank on its device: {out}");
        assert!(
            err.contains("init: 5 ")
                && err.contains("Duplicate GPU detected : rank ")
                && err.contains("both on CUDA device 10000"),
            "rank {rank}: {err}"
        );
    }
    for (lib, hosts) in [("nccl", ["node-a", "node-b"]), ("hccl", ["h", "h"])] {
        for (rank, (ok, out, err)) in run(lib, hosts).into_iter().enumerate() {
            assert!(ok, "{lib} rank {rank} on {hosts:?}: {out}{err}");
        }
    }
}

fn wrong_ids_are_refused() {
    std::env::set_var("CHD_FAKE_DEVICE_COUNT", "2");
    std::env::set_var("CHD_FAKE_PAIR_TIMEOUT_MS", "3000");
    std::env::set_var("NCCL_SOCKET_IFNAME", "=lo");
    let last = || {
        // SAFETY: a NUL-terminated thread-local string.
        unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: valid out-pointers and ids passed by value throughout.
    unsafe {
        assert_eq!(cudaSetDevice(0), 0);
        let mut comm = null_mut();
        let garbage = ncclUniqueId {
            internal: [0x5a; 128],
        };
        assert_eq!(
            ncclCommInitRank(&mut comm, 2, garbage, 1),
            NCCL_INVALID_ARGUMENT
        );
        assert!(last().contains("not made by ncclGetUniqueId"), "{}", last());

        // A real id with its nonce altered: not this process's, so the socket path; the
        // root refuses the registration.
        let mut id = ncclUniqueId { internal: [0; 128] };
        assert_eq!(ncclGetUniqueId(&mut id), 0);
        let nonce_at = chd_fake_runtime::net::bootstrap::ID_LEN - 1;
        let mut altered = id;
        altered.internal[nonce_at] ^= 0x11;
        let t0 = Instant::now();
        assert_eq!(
            ncclCommInitRank(&mut comm, 2, altered, 1),
            NCCL_INVALID_ARGUMENT
        );
        assert!(last().contains("nonce"), "{}", last());
        assert!(t0.elapsed() < Duration::from_secs(2), "refused at once");

        // A root that is gone: nothing listens at the id's address any more.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let mut stale = altered;
        let port_at = 25; // family byte at 24, then the port (big-endian)
        stale.internal[port_at] = (port >> 8) as _;
        stale.internal[port_at + 1] = (port & 0xff) as _;
        stale.internal[24] = 4;
        assert_eq!(ncclCommInitRank(&mut comm, 2, stale, 1), NCCL_SYSTEM_ERROR);
        assert!(
            last().contains("cannot reach the unique id's root"),
            "{}",
            last()
        );
    }
}

/// `NCCL_COMM_ID=host:port`: the root of a new id listens there, and the id says so.
fn nccl_comm_id_places_the_root() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    std::env::set_var("NCCL_COMM_ID", format!("127.0.0.1:{port}"));
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    let rc = unsafe { ncclGetUniqueId(&mut id) };
    std::env::remove_var("NCCL_COMM_ID");
    assert_eq!(rc, 0);
    let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    let info = chd_fake_runtime::net::bootstrap::parse_id(&bytes).expect("a root address");
    assert_eq!(info.root, format!("127.0.0.1:{port}").parse().unwrap());
    assert!(
        std::net::TcpStream::connect(info.root).is_ok(),
        "the root listens at NCCL_COMM_ID"
    );
}

/// Two network namespaces joined by two veth rails, torn down on drop.
struct Netns {
    names: [String; 2],
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (iproute2 is needed)"));
    assert!(
        out.status.success(),
        "{args:?}: {} (the namespace tests need root, iproute2 and sch_tbf)",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    /// `rail0` (10.77.0.1 <-> .2, shaped to 200 Mbit/s on A's egress: rank 0 -> rank 1; the
    /// collectives, which move bytes both ways at once, read that rate, and point-to-point
    /// tells the two directions apart) and `rail1` (10.78.0.x, unshaped) between namespaces
    /// A (rank 0) and B (rank 1).
    fn new(tag: &str) -> Netns {
        let pid = std::process::id();
        let ns = Netns {
            names: [
                format!("chdxp-{tag}-a-{pid}"),
                format!("chdxp-{tag}-b-{pid}"),
            ],
        };
        let [a, b] = &ns.names;
        sh(&["ip", "netns", "add", a]);
        sh(&["ip", "netns", "add", b]);
        for (i, net) in ["10.77.0", "10.78.0"].iter().enumerate() {
            let rail = format!("rail{i}");
            sh(&[
                "ip", "link", "add", &rail, "netns", a, "type", "veth", "peer", "name", &rail,
                "netns", b,
            ]);
            for (j, n) in [a, b].iter().enumerate() {
                let addr = format!("{net}.{}/24", j + 1);
                sh(&["ip", "-n", n, "addr", "add", &addr, "dev", &rail]);
                sh(&["ip", "-n", n, "link", "set", &rail, "up"]);
                if i == 0 && j == 0 {
                    sh(&[
                        "tc", "-n", n, "qdisc", "add", "dev", &rail, "root", "tbf", "rate",
                        "200mbit", "burst", "64kb", "latency", "50ms",
                    ]);
                }
            }
        }
        for n in [a, b] {
            sh(&["ip", "-n", n, "link", "set", "lo", "up"]);
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// Allgathers `gather` bytes per rank and all-reduces `reduce` bytes of f32 on each rail.
/// The rail is chosen with `ifvar` (`=rail0`, `=rail1`); for HCCL the unshaped rail is
/// chosen with `HCCL_IF_IP` instead, which must win over `HCCL_SOCKET_IFNAME=rail0`.
fn namespaces(lib: &str, ifvar: &str, gather: usize, reduce: usize) {
    let ns = Netns::new(lib);
    let netns = [Some(ns.names[0].as_str()), Some(ns.names[1].as_str())];
    let p2p = 8 * MIB;
    let ops = format!("allgather:{gather},allreduce_f32:{reduce},p2p_0to1:{p2p},p2p_1to0:{p2p}");
    let mut rates = Vec::new();
    for rail in ["rail0", "rail1"] {
        let mut vars = vec![
            ("XP_LIB", lib.to_owned()),
            ("XP_OPS", ops.clone()),
            (ifvar, format!("={rail}")),
        ];
        if lib == "hccl" && rail == "rail1" {
            vars[2].1 = "=rail0".to_owned();
            vars.push(("HCCL_IF_IP", "10.78.0.{host}".to_owned()));
        }
        let results = pair(netns, &vars, &format!("{lib}-{rail}"));
        ops_checked(
            &results,
            &["allgather", "allreduce_f32", "p2p_0to1", "p2p_1to0"],
        );
        for m in &results[0] {
            let busbw = m.busbw();
            println!(
                "  {lib} {rail} {} {} MiB: {:.4} GB/s {} ({:.1} ms)",
                m.op,
                m.bytes / MIB,
                busbw / 1e9,
                if m.op.starts_with("p2p_") {
                    "one way"
                } else {
                    "bus bandwidth"
                },
                m.ms
            );
            rates.push((rail, m.op.clone(), busbw));
        }
    }
    for (rail, op, busbw) in &rates {
        // Only rank 0 -> rank 1 is shaped on rail0: the send from rank 1 crosses it at the
        // unshaped rate.
        let shaped = *rail == "rail0" && op != "p2p_1to0";
        if shaped {
            let x = busbw / SHAPED_BYTES_PER_S;
            assert!(
                (0.3..=1.2).contains(&x),
                "{op} on the shaped rail reads {x:.2} x its 200 Mbit/s"
            );
        } else {
            // The all-reduce's reductions run in a debug build on shared cores: it is
            // CPU-bound near 0.2 GB/s here, so its margin is smaller.
            let want = if op == "allreduce_f32" { 2.0 } else { 4.0 };
            let x = busbw / SHAPED_BYTES_PER_S;
            assert!(
                x > want,
                "{op} on {rail} (unshaped that way) reads only {x:.2} x 200 Mbit/s (want > \
                 {want})"
            );
        }
    }
}

fn namespaces_nccl_shaped_rail() {
    namespaces("nccl", "NCCL_SOCKET_IFNAME", 64 * MIB, 32 * MIB);
}

fn namespaces_hccl_shaped_rail() {
    namespaces("hccl", "HCCL_SOCKET_IFNAME", 16 * MIB, 16 * MIB);
}
