//! Basic-auth load on a running `chd serve` (issue 30): keep-alive HTTP/1.1 clients, a flood
//! of clients looping wrong passwords (each from its own loopback address, or all from
//! 127.0.0.1), and a valid scraper whose latencies are measured meanwhile. Shared by
//! tests/serve/serve_auth.rs and benches/login_flood.rs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;

/// The `Authorization` value for `user:password`.
pub fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

/// A web config file's text with these users, bcrypt at `cost` (no TLS: plain HTTP).
pub fn web_config(users: &[(&str, &str)], cost: u32) -> String {
    let mut y = String::from("basic_auth_users:\n");
    for (user, password) in users {
        y.push_str(&format!(
            "  {user}: {}\n",
            bcrypt::hash(password, cost).unwrap()
        ));
    }
    y
}

/// One keep-alive HTTP/1.1 connection.
pub struct KeepAlive {
    reader: BufReader<TcpStream>,
}

/// A response: status and body.
pub type Reply = (u16, Vec<u8>);

impl KeepAlive {
    /// Connect to `addr`, from `from` when given (any 127.0.0.0/8 address is local).
    pub fn connect(addr: SocketAddr, from: Option<IpAddr>) -> std::io::Result<KeepAlive> {
        let stream = match from {
            None => TcpStream::connect_timeout(&addr, Duration::from_secs(10))?,
            Some(ip) => {
                let socket =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                socket.bind(&SocketAddr::new(ip, 0).into())?;
                socket.connect_timeout(&addr.into(), Duration::from_secs(10))?;
                socket.into()
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.set_nodelay(true)?;
        Ok(KeepAlive {
            reader: BufReader::new(stream),
        })
    }

    /// GET `path` with `authorization`; the status and body (by its Content-Length).
    pub fn get(&mut self, path: &str, authorization: Option<&str>) -> std::io::Result<Reply> {
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        write!(
            self.reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: chd\r\n{auth}\r\n"
        )?;
        self.read_reply()
    }

    /// Send `raw` as is (a whole request, or a part of one).
    pub fn send(&mut self, raw: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(raw)
    }

    /// Read one response.
    pub fn read_reply(&mut self) -> std::io::Result<Reply> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| bad("no status line"))?;
        let mut length = 0usize;
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().map_err(|_| bad("content-length"))?;
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body)?;
        Ok((status, body))
    }
}

/// Clients looping wrong passwords until stopped.
pub struct Flood {
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<BTreeMap<String, u64>>>,
}

/// How the flood's clients pick where they come from and what they send.
#[derive(Debug, Clone, Copy)]
pub enum Attack {
    /// All from 127.0.0.1, every request the same wrong password (issue 30's reproduction).
    SamePassword,
    /// Each client from its own address (127.0.1.N), every request a new wrong password: no
    /// cache helps, every request needs a bcrypt check.
    FreshPasswords,
}

impl Flood {
    /// Start `clients` clients against `addr` as `user`.
    pub fn start(addr: SocketAddr, clients: usize, user: &str, attack: Attack) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..clients)
            .map(|n| {
                let stop = stop.clone();
                let user = user.to_string();
                std::thread::spawn(move || {
                    let from = match attack {
                        Attack::SamePassword => None,
                        Attack::FreshPasswords => {
                            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + n as u8)))
                        }
                    };
                    let mut outcomes = BTreeMap::new();
                    let mut conn = None;
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let password = match attack {
                            Attack::SamePassword => "wrong".to_string(),
                            Attack::FreshPasswords => format!("wrong-{n}-{i}"),
                        };
                        if conn.is_none() {
                            conn = KeepAlive::connect(addr, from).ok();
                        }
                        let outcome = match conn
                            .as_mut()
                            .map(|c| c.get("/metrics", Some(&basic(&user, &password))))
                        {
                            Some(Ok((status, _))) => status.to_string(),
                            Some(Err(_)) | None => {
                                conn = None;
                                std::thread::sleep(Duration::from_millis(5));
                                "error".to_string()
                            }
                        };
                        *outcomes.entry(outcome).or_insert(0) += 1;
                    }
                    outcomes
                })
            })
            .collect();
        Flood { stop, clients }
    }

    /// Stop the clients; how many answers of each status (or `error`) they got.
    pub fn stop(self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = BTreeMap::new();
        for c in self.clients {
            for (k, v) in c.join().expect("flood client") {
                *total.entry(k).or_insert(0) += v;
            }
        }
        total
    }
}

/// `count` valid scrapes of `/metrics` on one keep-alive connection, stopping early after
/// `budget`: the latency of each and its status.
pub fn timed_scrapes(
    addr: SocketAddr,
    authorization: &str,
    count: usize,
    budget: Duration,
) -> Vec<(Duration, u16)> {
    let started = Instant::now();
    let mut conn = KeepAlive::connect(addr, None).expect("connect the scraper");
    let mut out = Vec::new();
    while out.len() < count && started.elapsed() < budget {
        let t = Instant::now();
        let status = match conn.get("/metrics", Some(authorization)) {
            Ok((status, _)) => status,
            Err(_) => {
                conn = KeepAlive::connect(addr, None).expect("reconnect the scraper");
                0
            }
        };
        out.push((t.elapsed(), status));
    }
    out
}

/// The median, 99th percentile and largest of `times`.
pub fn summary(times: &[Duration]) -> (Duration, Duration, Duration) {
    let mut t = times.to_vec();
    t.sort();
    if t.is_empty() {
        return (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    }
    let at = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), t[t.len() - 1])
}
