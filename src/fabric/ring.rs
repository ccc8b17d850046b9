//! The collective over all ranks on the host backend: a ring allgather or allreduce over TCP,
//! as NCCL's ring algorithm moves data (each rank sends one chunk to the next rank and receives
//! one from the previous, n - 1 steps for an allgather, 2(n - 1) for an allreduce's
//! reduce-scatter and allgather). Bus bandwidth as nccl-tests defines it: the algorithm
//! bandwidth (bytes over time) times (n - 1) / n for an allgather, 2(n - 1) / n for an
//! allreduce. The allreduce sums f32 values each rank filled with its rank + 1 and checks the
//! result, so bytes that arrive wrong are an error, not a fast run.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    AllGather,
    AllReduce,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::AllGather => "allgather",
            Op::AllReduce => "allreduce",
        }
    }

    /// Bus bandwidth over algorithm bandwidth for `n` ranks (nccl-tests' PERFORMANCE.md).
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllGather => (n - 1.0) / n,
            Op::AllReduce => 2.0 * (n - 1.0) / n,
        }
    }
}

/// One rank's two ring links: to the next rank, from the previous.
pub struct Links {
    next: TcpStream,
    prev: TcpStream,
}

/// Connect to `next` and accept the previous rank on `listener`, both within `timeout`.
pub fn link(listener: &TcpListener, next: SocketAddr, timeout: Duration) -> io::Result<Links> {
    let deadline = Instant::now() + timeout;
    let connector = std::thread::spawn(move || -> io::Result<TcpStream> {
        loop {
            match TcpStream::connect_timeout(&next, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    });
    listener.set_nonblocking(true)?;
    let prev = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the previous rank of the ring never connected",
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    };
    let next = connector
        .join()
        .map_err(|_| io::Error::other("the ring connector panicked"))??;
    for s in [&next, &prev] {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
    }
    Ok(Links { next, prev })
}

/// Run `op` over `bytes` (rounded down to whole f32 chunks, at least one value per rank) as
/// rank `me` of `n`; the seconds from the moment both neighbours answered to the end.
pub fn run(links: &mut Links, op: Op, bytes: u64, me: usize, n: usize) -> Result<f64, String> {
    let chunk = ((bytes / 4) as usize / n).max(1);
    let mut data = vec![(me + 1) as f32; chunk * n];
    // Both neighbours are here before the clock starts.
    exchange(links, &[1u8], &mut [0u8]).map_err(|e| format!("ring handshake: {e}"))?;
    let start = Instant::now();
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let mut writer = links.next.try_clone().map_err(|e| e.to_string())?;
    let sender = std::thread::spawn(move || -> io::Result<()> {
        for block in rx {
            writer.write_all(&block)?;
        }
        Ok(())
    });
    let index = |k: isize| k.rem_euclid(n as isize) as usize;
    let me = me as isize;
    let mut inbox = vec![0u8; chunk * 4];
    let mut step =
        |send: usize, recv: usize, reduce: bool, data: &mut Vec<f32>| -> Result<(), String> {
            let out: Vec<u8> = data[send * chunk..(send + 1) * chunk]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect();
            tx.send(out)
                .map_err(|_| "the ring's sender stopped".to_string())?;
            links
                .prev
                .read_exact(&mut inbox)
                .map_err(|e| format!("receiving from the previous rank: {e}"))?;
            for (i, b) in inbox.chunks_exact(4).enumerate() {
                let v = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                let slot = &mut data[recv * chunk + i];
                *slot = if reduce { *slot + v } else { v };
            }
            Ok(())
        };
    let steps = n as isize - 1;
    let outcome = (|| {
        if op == Op::AllReduce {
            for s in 0..steps {
                step(index(me - s), index(me - s - 1), true, &mut data)?;
            }
            for s in 0..steps {
                step(index(me + 1 - s), index(me - s), false, &mut data)?;
            }
        } else {
            for s in 0..steps {
                step(index(me - s), index(me - s - 1), false, &mut data)?;
            }
        }
        Ok::<(), String>(())
    })();
    // Dropping the channel's sender ends the writer's loop.
    drop(tx);
    let sent = sender
        .join()
        .map_err(|_| "the ring's sender panicked".to_string())?;
    outcome?;
    sent.map_err(|e| format!("sending to the next rank: {e}"))?;
    let seconds = start.elapsed().as_secs_f64();
    if op == Op::AllReduce {
        let want = (n * (n + 1) / 2) as f32;
        if let Some((i, v)) = data.iter().enumerate().find(|(_, v)| **v != want) {
            return Err(format!(
                "the allreduce's value {i} is {v}, not {want}: bytes arrived wrong"
            ));
        }
    }
    Ok(seconds)
}

fn exchange(links: &mut Links, out: &[u8], into: &mut [u8]) -> io::Result<()> {
    links.next.write_all(out)?;
    links.prev.read_exact(into)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` ranks in threads over loopback.
    fn ring_of(n: usize, op: Op, bytes: u64) -> Vec<Result<f64, String>> {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(me, l)| {
                let next = addrs[(me + 1) % n];
                std::thread::spawn(move || {
                    let mut links =
                        link(&l, next, Duration::from_secs(20)).map_err(|e| e.to_string())?;
                    run(&mut links, op, bytes, me, n)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn a_ring_allreduce_sums_right_and_an_allgather_completes_for_2_to_5_ranks() {
        for n in 2..=5 {
            for op in [Op::AllReduce, Op::AllGather] {
                for r in ring_of(n, op, 1 << 20) {
                    assert!(r.unwrap() > 0.0, "{n} ranks, {op:?}");
                }
            }
        }
    }

    #[test]
    fn bus_bandwidth_factors_are_nccl_tests() {
        assert_eq!(Op::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Op::AllGather.bus_factor(4), 0.75);
        assert_eq!(Op::AllReduce.bus_factor(8), 1.75);
    }
}
