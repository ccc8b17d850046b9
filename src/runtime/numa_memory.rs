//! NUMA-placed host buffers: anonymous mappings whose pages are bound to one NUMA node
//! (`mbind(MPOL_BIND)` before the first touch) or left to the default local policy and
//! first-touched on the calling thread, plus a `move_pages` check of where the pages landed.
//!
//! The host backend copies between a [`NodeBuffer::local`] buffer (allocated on the thread the
//! probe bound to its CPU, so the pages come from that CPU's node) and a [`NodeBuffer::new`]
//! buffer on the node under test.
//!
//! Fallback: on a kernel built without NUMA (`mbind` gives `ENOSYS`) or a machine where `mbind`
//! rejects the request with `EINVAL`, a request for node 0 on a machine with a single NUMA
//! node succeeds with an *unbound* buffer, since all memory is on node 0 there anyway; the
//! buffer's [`NodeBuffer::is_bound`] says so. Every other failure (`EPERM` in a restricted
//! container, a node that does not exist or is not in the cpuset's mems) is
//! [`ProbeError::Placement`].
//!
//! Caveat: with `MPOL_BIND` the kernel does not fall back to another node when the bound node
//! runs out of memory; the first touch then triggers the OOM killer. Keep buffers small
//! relative to a node's memory (probes use MiBs, nodes have GiBs).

// Syscalls on raw memory: mmap, mbind, move_pages, munmap, and slices over the mapping.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::errno::Errno;
use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use super::ProbeError;

/// `MPOL_MF_STRICT`: fail if existing pages do not follow the policy (linux/mempolicy.h).
const MPOL_MF_STRICT: libc::c_uint = 1 << 0;
/// `MPOL_MF_MOVE`: move existing pages of this mapping to the policy's nodes.
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;
/// Bits in the node mask passed to `mbind`; node ids at or above this are rejected.
const NODEMASK_BITS: usize = 1024;
const BITS_PER_WORD: usize = libc::c_ulong::BITS as usize;
/// Most pages `verify_placement` asks `move_pages` about.
const MAX_SAMPLE_PAGES: usize = 64;

/// Where the pages of a buffer were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementReport {
    /// The node the buffer was meant to be on (for a local buffer: the node of the CPU it was
    /// first-touched on).
    pub node: u32,
    /// Pages asked about.
    pub sampled: usize,
    /// Of those, pages on `node`.
    pub on_node: usize,
    /// Pages found on another node, as `(node, pages)`, ascending by node.
    pub elsewhere: Vec<(u32, usize)>,
    /// Pages whose node the kernel could not say (not present, or an error status).
    pub unknown: usize,
}

impl PlacementReport {
    /// Whether every sampled page is on the intended node.
    pub fn all_on_node(&self) -> bool {
        self.sampled > 0 && self.on_node == self.sampled
    }

    /// Pages not on the intended node (elsewhere or unknown).
    pub fn misplaced(&self) -> usize {
        self.sampled - self.on_node
    }
}

impl std::fmt::Display for PlacementReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} sampled pages on node {}",
            self.on_node, self.sampled, self.node
        )?;
        for (node, n) in &self.elsewhere {
            write!(f, ", {n} on node {node}")?;
        }
        if self.unknown > 0 {
            write!(f, ", {} unknown", self.unknown)?;
        }
        Ok(())
    }
}

/// How a buffer's pages were placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// `mbind(MPOL_BIND)` to the node.
    Bound,
    /// Single-node machine without usable `mbind`: left unbound (all memory is node 0).
    UnboundSingleNode,
    /// Default (local) policy, first-touched on a CPU of the node.
    Local,
}

/// An anonymous private mapping, every page touched, placed on one NUMA node. Unmapped on drop.
#[derive(Debug)]
pub struct NodeBuffer {
    ptr: NonNull<u8>,
    len: usize,
    node: u32,
    placement: Placement,
}

// SAFETY: NodeBuffer exclusively owns its mapping (like a Vec<u8>); nothing else aliases it,
// `&self` only gives shared reads and `&mut self` exclusive writes.
unsafe impl Send for NodeBuffer {}
// SAFETY: the `&self` methods only read the bytes (`as_slice`) or ask the kernel where the
// pages are (`move_pages` with nodes == NULL); `mbind` runs in the constructor, before the
// buffer is shared, and writes need `&mut self`: shared references never race.
unsafe impl Sync for NodeBuffer {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Number of NUMA nodes the kernel has online (1 on a kernel without NUMA support).
fn online_node_count() -> usize {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
        return 1;
    };
    let n = dir
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|s| s.strip_prefix("node"))
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    n.max(1)
}

/// The NUMA node of the CPU the calling thread runs on (0 where the kernel cannot say).
fn current_node() -> u32 {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: getcpu writes one c_uint through each non-null pointer; both point to live
    // locals. The third (cache) argument is unused by the kernel and may be null.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<c_void>(),
        )
    };
    if rc == 0 {
        node
    } else {
        0
    }
}

/// Whether a failed `mbind` may be answered with an unbound buffer: only for node 0, only
/// when NUMA is missing (`ENOSYS`) or the request was refused as invalid (`EINVAL`), and only
/// on a machine with a single node (asked last, as it reads sysfs).
fn may_fall_back_unbound(errno: Errno, node: u32, node_count: impl FnOnce() -> usize) -> bool {
    matches!(errno, Errno::ENOSYS | Errno::EINVAL) && node == 0 && node_count() == 1
}

impl NodeBuffer {
    /// Map `len` bytes, bind the pages to NUMA node `node`, and touch every page.
    pub fn new(len: usize, node: u32) -> Result<NodeBuffer, ProbeError> {
        let mut buf = NodeBuffer::map(len, node, Placement::Bound)?;
        match buf.bind(node) {
            Ok(()) => {}
            Err(errno) if may_fall_back_unbound(errno, node, online_node_count) => {
                tracing::debug!(%errno, "mbind unavailable on a single-node machine; buffer left unbound");
                buf.placement = Placement::UnboundSingleNode;
            }
            Err(errno) => {
                return Err(ProbeError::Placement {
                    node,
                    detail: format!("mbind(MPOL_BIND) of {len} bytes: {}", errno.desc()),
                });
            }
        }
        buf.touch();
        Ok(buf)
    }

    /// Map `len` bytes under the default policy and touch every page on the calling thread,
    /// so the pages come from the node of the CPU the thread runs on (for a bound probe
    /// thread: the probe CPU's node).
    pub fn local(len: usize) -> Result<NodeBuffer, ProbeError> {
        let mut buf = NodeBuffer::map(len, current_node(), Placement::Local)?;
        buf.touch();
        // Re-read after the touch: the node the pages were actually faulted on.
        buf.node = current_node();
        Ok(buf)
    }

    fn map(len: usize, node: u32, placement: Placement) -> Result<NodeBuffer, ProbeError> {
        let bytes = len as u64;
        let nz = NonZeroUsize::new(len).ok_or_else(|| ProbeError::Alloc {
            bytes,
            detail: "zero-length buffer".into(),
        })?;
        // SAFETY: a fresh anonymous private mapping at a kernel-chosen address aliases no
        // existing memory; the returned pointer is owned by the NodeBuffer and unmapped once.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(|e| ProbeError::Alloc {
            bytes,
            detail: format!("mmap: {}", e.desc()),
        })?;
        Ok(NodeBuffer {
            ptr: ptr.cast(),
            len,
            node,
            placement,
        })
    }

    /// `mbind(MPOL_BIND, {node}, MPOL_MF_STRICT | MPOL_MF_MOVE)` over the whole mapping.
    fn bind(&self, node: u32) -> Result<(), Errno> {
        let bit = usize::try_from(node).map_err(|_| Errno::EINVAL)?;
        if bit >= NODEMASK_BITS {
            return Err(Errno::EINVAL);
        }
        let mut mask = [0 as libc::c_ulong; NODEMASK_BITS / BITS_PER_WORD];
        mask[bit / BITS_PER_WORD] |= 1 << (bit % BITS_PER_WORD);
        // The kernel reads `maxnode - 1` bits (a long-standing off-by-one that libnuma also
        // compensates for), so pass one more than the mask holds.
        let maxnode = (NODEMASK_BITS + 1) as libc::c_ulong;
        // SAFETY: addr/len describe this buffer's own mapping; the mask pointer refers to a
        // live array of NODEMASK_BITS bits, and the kernel only reads it.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.ptr.as_ptr() as *mut c_void,
                self.len as libc::c_ulong,
                libc::MPOL_BIND as libc::c_ulong,
                mask.as_ptr(),
                maxnode,
                (MPOL_MF_STRICT | MPOL_MF_MOVE) as libc::c_ulong,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(Errno::last())
        }
    }

    /// First touch: write one byte in every page so each is faulted in under the policy.
    fn touch(&mut self) {
        let page = page_size();
        let base = self.ptr.as_ptr();
        for off in (0..self.len).step_by(page) {
            // SAFETY: off < len, so the byte lies inside this buffer's writable mapping, which
            // we hold exclusively (&mut self). Volatile so the store is not elided.
            unsafe { base.add(off).write_volatile(0) };
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The node the buffer was placed on (for a local buffer, the node of the CPU that
    /// first-touched it).
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Whether the pages are bound with `mbind` (false for local buffers and for the
    /// single-node fallback).
    pub fn is_bound(&self) -> bool {
        self.placement == Placement::Bound
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live mapping of len readable bytes owned by self (all pages were
        // touched, so zero-initialised at least); the borrow ties the slice to &self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Ask the kernel (`move_pages` with no target nodes) which node holds each of up to 64
    /// pages spread evenly over the buffer, first and last page included.
    pub fn verify_placement(&self) -> Result<PlacementReport, ProbeError> {
        let page = page_size();
        let pages = self.len.div_ceil(page);
        let n = pages.min(MAX_SAMPLE_PAGES);
        let addrs: Vec<*mut c_void> = (0..n)
            .map(|i| {
                let p = if n > 1 { i * (pages - 1) / (n - 1) } else { 0 };
                // SAFETY: p < pages, so p * page < len rounded up to a page, i.e. inside the
                // mapping (mmap lengths are whole pages).
                unsafe { self.ptr.as_ptr().add(p * page) as *mut c_void }
            })
            .collect();
        let mut status: Vec<libc::c_int> = vec![i32::MIN; n];
        // SAFETY: `addrs` and `status` each hold n elements; nodes == NULL makes move_pages
        // only report, not move; pid 0 is this process. The kernel writes n ints to status.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as libc::c_long,
                n as libc::c_ulong,
                addrs.as_ptr(),
                std::ptr::null::<libc::c_int>(),
                status.as_mut_ptr(),
                0 as libc::c_long,
            )
        };
        if rc != 0 {
            let errno = Errno::last();
            if errno == Errno::ENOSYS && self.placement != Placement::Bound && self.node == 0 {
                // A kernel without NUMA: all memory is node 0 by definition.
                return Ok(PlacementReport {
                    node: 0,
                    sampled: n,
                    on_node: n,
                    elsewhere: Vec::new(),
                    unknown: 0,
                });
            }
            return Err(ProbeError::Placement {
                node: self.node,
                detail: format!("move_pages query: {}", errno.desc()),
            });
        }
        let mut report = PlacementReport {
            node: self.node,
            sampled: n,
            on_node: 0,
            elsewhere: Vec::new(),
            unknown: 0,
        };
        let mut other = std::collections::BTreeMap::<u32, usize>::new();
        for &s in &status {
            match u32::try_from(s) {
                Ok(node) if node == self.node => report.on_node += 1,
                Ok(node) => *other.entry(node).or_default() += 1,
                Err(_) => report.unknown += 1,
            }
        }
        report.elsewhere = other.into_iter().collect();
        Ok(report)
    }
}

impl Drop for NodeBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping created in `map`, unmapped only here; no
        // slice borrowed from it can outlive self.
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.len) } {
            tracing::warn!(bytes = self.len, error = %e, "munmap of a probe buffer failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn buffer_on_node0_is_placed_and_verified() {
        let buf = NodeBuffer::new(8 * MIB, 0).expect("node 0 buffer");
        assert_eq!(buf.len(), 8 * MIB);
        assert_eq!(buf.node(), 0);
        // Bound with mbind, except for the documented single-node fallback.
        eprintln!("node 0 buffer bound with mbind: {}", buf.is_bound());
        assert!(buf.is_bound() || online_node_count() == 1);
        let report = buf.verify_placement().expect("move_pages");
        assert_eq!(report.sampled, MAX_SAMPLE_PAGES);
        assert!(report.all_on_node(), "{report}");
        assert_eq!(report.misplaced(), 0);
    }

    #[test]
    fn small_and_odd_sizes_are_sampled_inside_the_buffer() {
        for len in [1, 4095, 4097, 3 * 4096 + 5] {
            let buf = NodeBuffer::new(len, 0).expect("node 0 buffer");
            let report = buf.verify_placement().unwrap();
            assert_eq!(report.sampled, len.div_ceil(page_size()));
            assert!(report.all_on_node(), "len {len}: {report}");
        }
    }

    #[test]
    fn write_read_round_trip() {
        let mut buf = NodeBuffer::new(MIB + 123, 0).unwrap();
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert!(buf
            .as_slice()
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8));
    }

    #[test]
    fn local_buffer_is_on_the_current_node() {
        let mut buf = NodeBuffer::local(4 * MIB).unwrap();
        assert!(!buf.is_bound());
        buf.as_mut_slice()[4 * MIB - 1] = 7;
        assert_eq!(buf.as_slice()[4 * MIB - 1], 7);
        let report = buf.verify_placement().unwrap();
        assert!(report.all_on_node(), "{report}");
    }

    #[test]
    fn impossible_node_is_a_placement_error() {
        for node in [63, 1023, 1024, u32::MAX] {
            let err = NodeBuffer::new(MIB, node).expect_err("node must not exist");
            assert_eq!(err.reason(), "placement", "node {node}: {err}");
            assert!(err.to_string().contains(&node.to_string()), "{err}");
        }
    }

    #[test]
    fn fallback_only_for_node0_on_one_node_without_mbind() {
        assert!(may_fall_back_unbound(Errno::ENOSYS, 0, || 1));
        assert!(may_fall_back_unbound(Errno::EINVAL, 0, || 1));
        assert!(!may_fall_back_unbound(Errno::EPERM, 0, || 1));
        assert!(!may_fall_back_unbound(Errno::ENOSYS, 1, || 1));
        assert!(!may_fall_back_unbound(Errno::ENOSYS, 0, || 2));
    }

    #[test]
    fn zero_length_is_an_alloc_error() {
        let err = NodeBuffer::new(0, 0).unwrap_err();
        assert_eq!(err.reason(), "alloc");
        assert_eq!(NodeBuffer::local(0).unwrap_err().reason(), "alloc");
    }

    #[test]
    fn report_display_names_the_other_nodes() {
        let r = PlacementReport {
            node: 1,
            sampled: 4,
            on_node: 1,
            elsewhere: vec![(0, 2)],
            unknown: 1,
        };
        assert!(!r.all_on_node());
        assert_eq!(r.misplaced(), 3);
        assert_eq!(
            r.to_string(),
            "1/4 sampled pages on node 1, 2 on node 0, 1 unknown"
        );
    }
}
