//! The data plane of a cross-process communicator: a TCP ring (each rank connects to the
//! next, bound to its interface's address and, where permitted, to the device itself with
//! `SO_BINDTODEVICE`), and the ring allgather and all-reduce that move the bytes over it, and
//! the one-way transfers of point-to-point send/receive (rank `r`'s connection to its next
//! rank is the one that rank accepted from its previous rank, so with 2 ranks each
//! direction has its own connection: rank 0's next is rank 1's prev and vice versa).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::bootstrap::NONCE_LEN;
use super::ifname::IfAddr;
use super::reduce::{reduce_into, Elem, RedOp};
use crate::collective::CollError;

/// A socket bound to `iface`: to the device where the process may (root, or
/// `CAP_NET_RAW`), and always to the interface's address.
fn bound_socket(iface: &IfAddr) -> std::io::Result<Socket> {
    let addr = iface.socket_addr(0);
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Not permitted without privileges: the address binding below still picks the rail.
    let _ = socket.bind_device(Some(iface.name.as_bytes()));
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// The listening socket a rank's ring predecessor connects to.
pub fn listen(iface: &IfAddr) -> Result<(TcpListener, SocketAddr), CollError> {
    let fail = |e: std::io::Error| {
        CollError::System(format!(
            "cannot listen on {} ({}): {e}",
            iface.name, iface.ip
        ))
    };
    let socket = bound_socket(iface).map_err(fail)?;
    socket.listen(16).map_err(fail)?;
    let listener: TcpListener = socket.into();
    let addr = listener.local_addr().map_err(fail)?;
    Ok((listener, addr))
}

/// One rank's two ring connections.
#[derive(Debug)]
pub struct Ring {
    pub rank: usize,
    pub nranks: usize,
    /// To rank `rank + 1` and its address; `None` for one rank.
    next: Option<(TcpStream, SocketAddr)>,
    /// From rank `rank - 1` and its address.
    prev: Option<(TcpStream, SocketAddr)>,
    timeout: Duration,
}

fn hello(nonce: &[u8; NONCE_LEN], rank: usize) -> Vec<u8> {
    let mut h = nonce.to_vec();
    h.extend_from_slice(&(rank as u32).to_be_bytes());
    h
}

impl Ring {
    /// Connects rank `rank` to its successor in `peers` (the data-plane addresses, index =
    /// rank) from `iface`, and accepts its predecessor on `listener`, both within `timeout`.
    pub fn connect(
        listener: TcpListener,
        iface: &IfAddr,
        peers: &[SocketAddr],
        rank: usize,
        nonce: &[u8; NONCE_LEN],
        timeout: Duration,
    ) -> Result<Ring, CollError> {
        let nranks = peers.len();
        if nranks < 2 {
            return Ok(Ring {
                rank,
                nranks,
                next: None,
                prev: None,
                timeout,
            });
        }
        let (next_rank, prev_rank) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
        let next_addr = peers[next_rank];
        let socket = bound_socket(iface).map_err(|e| {
            CollError::System(format!("cannot bind to {} ({}): {e}", iface.name, iface.ip))
        })?;
        socket
            .connect_timeout(&next_addr.into(), timeout)
            .map_err(|e| {
                CollError::Remote(format!(
                    "cannot connect to rank {next_rank} at {next_addr} from {}: {e}",
                    iface.name
                ))
            })?;
        let mut next: TcpStream = socket.into();
        let _ = next.set_nodelay(true);
        next.write_all(&hello(nonce, rank))
            .map_err(|e| CollError::Remote(format!("rank {next_rank} at {next_addr}: {e}")))?;
        let deadline = Instant::now() + timeout;
        let want = hello(nonce, prev_rank);
        let prev = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CollError::Remote(format!(
                    "rank {prev_rank} at {} did not connect within CHD_FAKE_PAIR_TIMEOUT_MS",
                    peers[prev_rank]
                )));
            }
            let mut p = libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, 100) as i32;
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
                continue;
            }
            let Ok((mut s, from)) = listener.accept() else {
                continue;
            };
            let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
            let mut got = vec![0u8; want.len()];
            if s.read_exact(&mut got).is_ok() && got == want {
                break (s, from);
            }
        };
        let ring = Ring {
            rank,
            nranks,
            next: Some((next, next_addr)),
            prev: Some(prev),
            timeout,
        };
        for s in ring.streams() {
            let _ = s.set_read_timeout(Some(timeout));
            let _ = s.set_write_timeout(Some(timeout));
            let _ = s.set_nodelay(true);
        }
        Ok(ring)
    }

    fn streams(&self) -> impl Iterator<Item = &TcpStream> {
        self.next.iter().chain(self.prev.iter()).map(|(s, _)| s)
    }

    /// Shuts both connections down: a thread blocked on them returns, and the peers see the
    /// connection close.
    pub fn shutdown(&self) {
        for s in self.streams() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn prev_rank(&self) -> usize {
        (self.rank + self.nranks - 1) % self.nranks
    }

    fn next_rank(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    fn io_error(&self, rank: usize, addr: SocketAddr, dir: &str, e: &std::io::Error) -> CollError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => CollError::System(format!(
                "{dir} rank {rank} at {addr}: no progress within CHD_FAKE_PAIR_TIMEOUT_MS ({} ms)",
                self.timeout.as_millis()
            )),
            ErrorKind::UnexpectedEof => CollError::Remote(format!(
                "{dir} rank {rank} at {addr}: the peer closed the connection (exited or aborted)"
            )),
            _ => CollError::Remote(format!("{dir} rank {rank} at {addr}: {e}")),
        }
    }

    /// Sends `send` to the next rank while receiving `recv.len()` bytes from the previous one
    /// (concurrently, so that large messages cannot deadlock on full socket buffers).
    pub fn exchange(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CollError> {
        let (Some((next, next_addr)), Some((prev, prev_addr))) = (&self.next, &self.prev) else {
            return Ok(());
        };
        let (next_rank, prev_rank) = (self.next_rank(), self.prev_rank());
        std::thread::scope(|scope| {
            let sender = scope.spawn(move || {
                let mut w = next;
                w.write_all(send)
                    .and_then(|()| w.flush())
                    .map_err(|e| self.io_error(next_rank, *next_addr, "sending to", &e))
            });
            let mut r = prev;
            let got = r
                .read_exact(recv)
                .map_err(|e| self.io_error(prev_rank, *prev_addr, "receiving from", &e));
            if got.is_err() {
                // Unblock the sender: the operation failed anyway.
                let _ = next.shutdown(Shutdown::Write);
            }
            let sent = sender.join().unwrap_or(Err(CollError::Internal));
            got.and(sent)
        })
    }

    /// Point-to-point send: writes `data` to the next rank (for 2 ranks, the peer: this
    /// connection is the one the peer reads with [`Ring::recv_prev`]).
    pub fn send_next(&self, data: &[u8]) -> Result<(), CollError> {
        let Some((next, next_addr)) = &self.next else {
            return Ok(());
        };
        let mut w = next;
        w.write_all(data)
            .and_then(|()| w.flush())
            .map_err(|e| self.io_error(self.next_rank(), *next_addr, "sending to", &e))
    }

    /// Point-to-point receive: reads `buf.len()` bytes from the previous rank (for 2 ranks,
    /// the peer's [`Ring::send_next`]).
    pub fn recv_prev(&self, buf: &mut [u8]) -> Result<(), CollError> {
        let Some((prev, prev_addr)) = &self.prev else {
            return Ok(());
        };
        let mut r = prev;
        r.read_exact(buf)
            .map_err(|e| self.io_error(self.prev_rank(), *prev_addr, "receiving from", &e))
    }

    /// Every rank's `item` (all the same length), index = rank: `nranks - 1` ring steps.
    pub fn allgather_small(&self, item: &[u8]) -> Result<Vec<Vec<u8>>, CollError> {
        let n = self.nranks;
        let mut all = vec![Vec::new(); n];
        all[self.rank] = item.to_vec();
        for step in 0..n.saturating_sub(1) {
            let send_idx = (self.rank + n - step) % n;
            let recv_idx = (self.rank + n - step - 1) % n;
            let mut got = vec![0u8; item.len()];
            self.exchange(&all[send_idx].clone(), &mut got)?;
            all[recv_idx] = got;
        }
        Ok(all)
    }

    /// Ring allgather in place: `buf` holds `nranks` blocks of `block` bytes, this rank's
    /// block already in place; on return every block holds its rank's data.
    pub fn allgather(&self, buf: &mut [u8], block: usize) -> Result<(), CollError> {
        let n = self.nranks;
        for step in 0..n.saturating_sub(1) {
            let send_idx = (self.rank + n - step) % n;
            let recv_idx = (self.rank + n - step - 1) % n;
            let (send, recv) = two_blocks(buf, block, send_idx, recv_idx);
            self.exchange(send, recv)?;
        }
        Ok(())
    }

    /// Ring all-reduce in place over `buf` (`count` elements of `elem`): reduce-scatter, then
    /// allgather, each `nranks - 1` steps of about `bytes / nranks`.
    pub fn allreduce(&self, buf: &mut [u8], elem: Elem, op: RedOp) -> Result<(), CollError> {
        let n = self.nranks;
        if n < 2 || buf.is_empty() {
            return Ok(());
        }
        let size = elem.size();
        let count = buf.len() / size;
        // Chunk c covers elements [c * per, min((c + 1) * per, count)).
        let per = count.div_ceil(n);
        let span = |c: usize| {
            let lo = (c * per).min(count) * size;
            let hi = ((c + 1) * per).min(count) * size;
            lo..hi
        };
        let mut tmp = vec![0u8; per * size];
        for step in 0..n - 1 {
            let send_idx = (self.rank + n - step) % n;
            let recv_idx = (self.rank + n - step - 1) % n;
            let (s, r) = (span(send_idx), span(recv_idx));
            let got = &mut tmp[..r.len()];
            self.exchange(&buf[s], got)?;
            reduce_into(&mut buf[r], got, elem, op);
        }
        for step in 0..n - 1 {
            let send_idx = (self.rank + 1 + n - step) % n;
            let recv_idx = (self.rank + n - step) % n;
            let (s, r) = (span(send_idx), span(recv_idx));
            let (send, recv) = split_ranges(buf, s, r);
            self.exchange(send, recv)?;
        }
        Ok(())
    }
}

/// Disjoint blocks `a` (shared) and `b` (mutable) of `buf`, `block` bytes each.
fn two_blocks(buf: &mut [u8], block: usize, a: usize, b: usize) -> (&[u8], &mut [u8]) {
    split_ranges(buf, a * block..(a + 1) * block, b * block..(b + 1) * block)
}

/// Disjoint ranges of `buf`: `a` shared, `b` mutable.
fn split_ranges(
    buf: &mut [u8],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> (&[u8], &mut [u8]) {
    if a.start <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::ifname::{choose, interfaces, IfSpec};

    fn lo() -> IfAddr {
        choose(Some(&IfSpec::parse("=lo")), &interfaces()).expect("lo")
    }

    /// Three ranks on loopback threads.
    fn rings(n: usize) -> Vec<Ring> {
        let nonce = [7u8; NONCE_LEN];
        let iface = lo();
        let (listeners, addrs): (Vec<_>, Vec<_>) = (0..n).map(|_| listen(&iface).unwrap()).unzip();
        let t = Duration::from_secs(5);
        std::thread::scope(|s| {
            let handles: Vec<_> = listeners
                .into_iter()
                .enumerate()
                .map(|(r, l)| {
                    let (iface, addrs) = (iface.clone(), addrs.clone());
                    s.spawn(move || Ring::connect(l, &iface, &addrs, r, &nonce, t).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn three_ranks_gather_and_sum() {
        let n = 3;
        let rings = rings(n);
        let block = 1000;
        let results: Vec<(Vec<u8>, Vec<u8>)> = std::thread::scope(|s| {
            let hs: Vec<_> = rings
                .iter()
                .map(|ring| {
                    s.spawn(move || {
                        let mut buf = vec![0u8; block * n];
                        buf[ring.rank * block..(ring.rank + 1) * block].fill(ring.rank as u8 + 1);
                        ring.allgather(&mut buf, block).unwrap();
                        // 7 elements of i32: rank r contributes r + 1 + i.
                        let mut sum: Vec<u8> = (0..7i32)
                            .flat_map(|i| (ring.rank as i32 + 1 + i).to_le_bytes())
                            .collect();
                        ring.allreduce(&mut sum, Elem::I32, RedOp::Sum).unwrap();
                        (buf, sum)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want_gather: Vec<u8> = (0..n).flat_map(|r| vec![r as u8 + 1; block]).collect();
        let want_sum: Vec<u8> = (0..7i32).flat_map(|i| (6 + 3 * i).to_le_bytes()).collect();
        for (gather, sum) in results {
            assert_eq!(gather, want_gather);
            assert_eq!(sum, want_sum);
        }
    }

    /// With 2 ranks each direction has its own connection: rank 0's next is rank 1's prev,
    /// and rank 1's next is rank 0's prev, so both ways can run at once.
    #[test]
    fn two_ranks_send_and_receive_both_ways() {
        let rings = rings(2);
        let len = 3 << 20;
        let got: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = rings
                .iter()
                .map(|ring| {
                    s.spawn(move || {
                        let mine = vec![ring.rank as u8 + 10; len];
                        let mut theirs = vec![0u8; len];
                        std::thread::scope(|s2| {
                            let tx = s2.spawn(|| ring.send_next(&mine));
                            ring.recv_prev(&mut theirs).unwrap();
                            tx.join().unwrap().unwrap();
                        });
                        theirs
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got[0].iter().all(|&b| b == 11), "rank 0 got rank 1's bytes");
        assert!(got[1].iter().all(|&b| b == 10), "rank 1 got rank 0's bytes");
    }

    #[test]
    fn a_closed_peer_is_a_remote_error_naming_it() {
        let mut rings = rings(2);
        let gone = rings.pop().unwrap();
        drop(gone);
        let mut buf = vec![0u8; 2 << 20];
        let err = rings[0].allgather(&mut buf, 1 << 20).unwrap_err();
        assert!(
            matches!(&err, CollError::Remote(w) if w.contains("rank 1 at 127.0.0.1:")),
            "{err:?}"
        );
    }
}
