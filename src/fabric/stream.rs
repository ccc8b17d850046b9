//! Bytes over one rail, as iperf3 measures TCP: several streams, each bound to the rail's
//! interface and address, carry a planned number of bytes to the peer's listener on its rail;
//! the receiver confirms what it got. The time runs from the moment every stream is connected
//! to the last confirmation. A rail that stops carrying is cut at the deadline and measured on
//! what it confirmed; one that carries nothing is an error, not a zero.
//!
//! Each header is the planned byte count (8 bytes, big-endian); each confirmation the bytes
//! received (8 bytes). The listener lives for one run and is closed with it.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::rails::Rail;
use super::wire::Measured;

/// What one write hands the kernel.
const CHUNK: usize = 1 << 20;

/// How long a stream may go without progress before it counts as stalled.
const IDLE: Duration = Duration::from_secs(10);

/// How long connecting one stream may take.
const CONNECT: Duration = Duration::from_secs(5);

/// The receiving end on one rail: accepts streams until dropped.
pub struct Listener {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Listen on `rail`'s address (port chosen by the kernel); the receiving streams run on
    /// the rail's CPUs.
    pub fn bind(rail: &Rail) -> io::Result<Listener> {
        let listener = TcpListener::bind(SocketAddr::new(rail.address, 0))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let cpus = rail.cpus.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fabric-rx-{}", rail.name))
            .spawn(move || accept_loop(listener, flag, &cpus))?;
        Ok(Listener {
            port,
            stop,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, stop: Arc<AtomicBool>, cpus: &[u32]) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let stop = stop.clone();
                let cpus = cpus.to_vec();
                let _ = std::thread::Builder::new()
                    .name("fabric-rx-stream".into())
                    .spawn(move || {
                        pin(&cpus);
                        if let Err(e) = sink(conn, &stop) {
                            tracing::debug!("fabric stream ended: {e}");
                        }
                    });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => {
                tracing::warn!("fabric listener: {e}");
                std::thread::sleep(Duration::from_millis(100))
            }
        }
    }
}

/// Read the header, then up to that many bytes or to the sender's end, and confirm them.
fn sink(mut conn: TcpStream, stop: &AtomicBool) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(IDLE))?;
    let mut header = [0u8; 8];
    conn.read_exact(&mut header)?;
    let planned = u64::from_be_bytes(header);
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    while got < planned && !stop.load(Ordering::Relaxed) {
        let want = (planned - got).min(CHUNK as u64) as usize;
        match conn.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    conn.write_all(&got.to_be_bytes())
}

/// Pin the calling stream thread to `cpus` (none: unbound); a failure costs the placement,
/// not the transfer.
fn pin(cpus: &[u32]) {
    if let Err(e) = crate::affinity::pin_this_thread(cpus) {
        tracing::warn!("a fabric stream runs unbound: binding it to CPUs {cpus:?} failed: {e}");
    }
}

/// Stream `bytes` in `streams` parallel connections from `from` (on interface `rail`) to `to`,
/// each on `cpus` (none: unbound), cut at `deadline` after the start.
pub fn send(
    rail: &str,
    from: IpAddr,
    to: SocketAddr,
    bytes: u64,
    streams: u32,
    cpus: &[u32],
    deadline: Duration,
) -> Measured {
    let streams = streams.max(1);
    let mut conns = Vec::new();
    for i in 0..streams {
        match connect(rail, from, to) {
            Ok(c) => conns.push(c),
            Err(e) => {
                return Measured {
                    bytes: 0,
                    seconds: None,
                    error: Some(format!(
                        "stream {} of {streams} from {from} ({rail}) to {to}: {e}",
                        i + 1
                    )),
                }
            }
        }
    }
    let per = bytes / u64::from(streams);
    let start_line = Arc::new(Barrier::new(conns.len() + 1));
    let cut = Arc::new(AtomicBool::new(false));
    let workers: Vec<JoinHandle<io::Result<u64>>> = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| {
            let planned = if i == 0 {
                bytes - per * (u64::from(streams) - 1)
            } else {
                per
            };
            let start_line = start_line.clone();
            let cut = cut.clone();
            let cpus = cpus.to_vec();
            std::thread::spawn(move || {
                pin(&cpus);
                start_line.wait();
                pour(conn, planned, &cut)
            })
        })
        .collect();
    start_line.wait();
    let start = Instant::now();
    let watchdog = {
        let cut = cut.clone();
        std::thread::spawn(move || {
            let step = Duration::from_millis(20);
            while !cut.load(Ordering::Relaxed) {
                if start.elapsed() >= deadline {
                    cut.store(true, Ordering::Relaxed);
                    return true;
                }
                std::thread::sleep(step);
            }
            false
        })
    };
    let mut confirmed = 0u64;
    let mut errors = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        match w.join() {
            Ok(Ok(n)) => confirmed += n,
            Ok(Err(e)) => errors.push(format!("stream {}: {e}", i + 1)),
            Err(_) => errors.push(format!("stream {}: panicked", i + 1)),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let was_cut = cut.swap(true, Ordering::Relaxed);
    let timed_out = watchdog.join().unwrap_or(false) || was_cut;
    let mut error = (!errors.is_empty()).then(|| errors.join("; "));
    if confirmed < bytes && error.is_none() {
        error = Some(if timed_out {
            format!(
                "cut at the {:.0} s deadline after {confirmed} of {bytes} bytes",
                deadline.as_secs_f64()
            )
        } else {
            format!("the receiver confirmed {confirmed} of {bytes} bytes")
        });
    }
    Measured {
        bytes: confirmed,
        seconds: (confirmed > 0).then_some(seconds),
        error,
    }
}

/// One stream bound to the rail: to its interface where the process may (SO_BINDTODEVICE
/// needs CAP_NET_RAW), always to its address.
fn connect(rail: &str, from: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
    if let Err(e) = socket.bind_device(Some(rail.as_bytes())) {
        tracing::debug!("cannot bind a stream to {rail} ({e}); binding its address only");
    }
    socket.bind(&SockAddr::from(SocketAddr::new(from, 0)))?;
    socket.connect_timeout(&SockAddr::from(to), CONNECT)?;
    socket.set_tcp_nodelay(true)?;
    let stream: TcpStream = socket.into();
    stream.set_write_timeout(Some(IDLE))?;
    stream.set_read_timeout(Some(IDLE))?;
    Ok(stream)
}

/// Write the header and `planned` bytes (fewer once `cut`), then read the confirmation.
fn pour(mut conn: TcpStream, planned: u64, cut: &AtomicBool) -> io::Result<u64> {
    conn.write_all(&planned.to_be_bytes())?;
    let chunk = vec![0x5au8; CHUNK];
    let mut sent = 0u64;
    while sent < planned && !cut.load(Ordering::Relaxed) {
        let n = (planned - sent).min(CHUNK as u64) as usize;
        conn.write_all(&chunk[..n])?;
        sent += n as u64;
    }
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut confirmed = [0u8; 8];
    conn.read_exact(&mut confirmed)?;
    Ok(u64::from_be_bytes(confirmed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lo() -> Rail {
        Rail {
            name: "lo".into(),
            address: "127.0.0.1".parse().unwrap(),
            prefix: 8,
            cpus: Vec::new(),
            rdma_port: None,
            numa_node: None,
        }
    }

    #[test]
    fn streams_over_loopback_carry_every_byte() {
        let rx = Listener::bind(&lo()).unwrap();
        let to = SocketAddr::new(lo().address, rx.port());
        let m = send(
            "lo",
            lo().address,
            to,
            8 << 20,
            3,
            &[],
            Duration::from_secs(60),
        );
        assert_eq!(m.error, None);
        assert_eq!(m.bytes, 8 << 20);
        assert!(m.gbps().unwrap() > 0.0);
    }

    #[test]
    fn a_rail_with_no_listener_is_an_error_naming_it() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let to = SocketAddr::new(lo().address, port);
        let m = send(
            "lo",
            lo().address,
            to,
            1 << 20,
            2,
            &[],
            Duration::from_secs(5),
        );
        assert_eq!((m.bytes, m.gbps()), (0, None));
        let e = m.error.unwrap();
        assert!(e.contains("stream 1 of 2 from 127.0.0.1 (lo)"), "{e}");
    }

    #[test]
    fn a_deadline_cuts_the_transfer_and_measures_what_was_confirmed() {
        let rx = Listener::bind(&lo()).unwrap();
        let to = SocketAddr::new(lo().address, rx.port());
        // Far more than loopback carries in no time: cut at once.
        let m = send("lo", lo().address, to, 1 << 40, 1, &[], Duration::ZERO);
        assert!(m.bytes < 1 << 40);
        assert!(m.error.unwrap().contains("deadline"));
    }
}
