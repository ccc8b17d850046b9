//! `chd advise`: launch advice from a node's ledger (`chd::ledger::advice`), or with `--map`
//! a proposed launch map scored against it (`chd::ledger::score`), exit 1 when a rank is
//! below the threshold. The ledger comes from a recording, a state directory, a ledger file,
//! or a node's `/api/v1/calibration` (`--url`, plain HTTP).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use chd::format::calibration::{self, Ledger};
use chd::format::launch_map;
use chd::ledger::{advice, score};
use chd::store::unix_now;
use chd::topology::Roots;

use super::ledger::{ledger_of, Input};

/// Where the ledger comes from.
#[derive(Debug, Clone)]
pub enum Source {
    Local(Input),
    /// A ledger file (`chd ledger --out`), or `-` for stdin.
    File(PathBuf),
    /// `http://node:9863` (the path `/api/v1/calibration` is added when absent).
    Url(String),
}

/// What `chd advise` was asked.
#[derive(Debug, Clone)]
pub struct AdviseRequest {
    pub source: Source,
    pub json: bool,
    pub map: Option<PathBuf>,
    pub threshold: f64,
    pub roots: Roots,
}

/// How long `--url` waits to connect, and for each read.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// GET `url`'s calibration ledger over plain HTTP/1.1 (`Connection: close`).
pub(crate) fn fetch(url: &str) -> anyhow::Result<String> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!(
            "{url}: only http:// URLs are read (for TLS or basic auth fetch it with curl and \
             pass the file with --ledger FILE)"
        );
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = if path.is_empty() || path == "/" {
        "/api/v1/calibration"
    } else {
        path
    };
    let addr = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:9863")
    };
    let sock = std::net::ToSocketAddrs::to_socket_addrs(&addr)
        .with_context(|| format!("resolving {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&sock, HTTP_TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the answer of {addr}"))?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("{url}: not an HTTP answer");
    };
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("{url}{path}: {status}");
    }
    if head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    }) {
        bail!("{url}: chunked answers are not read (is it chd serve?)");
    }
    Ok(body.to_string())
}

fn load(request: &AdviseRequest) -> anyhow::Result<Ledger> {
    let (name, text) = match &request.source {
        Source::Local(input) => return ledger_of(input, None, &request.roots, unix_now()),
        Source::File(path) if path.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text)?;
            ("stdin".to_string(), text)
        }
        Source::File(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        ),
        Source::Url(url) => (url.clone(), fetch(url)?),
    };
    Ok(calibration::parse(&name, &text)?)
}

/// Run `chd advise`; `Ok(false)` when `--map` has a rank below the threshold.
pub fn run(request: &AdviseRequest) -> anyhow::Result<bool> {
    if !(0.0..=1.0).contains(&request.threshold) {
        bail!("--threshold {} is not between 0 and 1", request.threshold);
    }
    let ledger = load(request)?;
    let Some(map) = &request.map else {
        let advice = advice::advise(&ledger);
        if request.json {
            print!("{}", chd::ledger::to_json(&advice));
        } else {
            print!("{}", advice::render(&advice));
        }
        return Ok(true);
    };
    let text =
        std::fs::read_to_string(map).with_context(|| format!("reading {}", map.display()))?;
    let ranks = launch_map::parse(&map.display().to_string(), &text)?;
    let scored = score::score(&ledger, &ranks, request.threshold)?;
    if request.json {
        print!("{}", chd::ledger::to_json(&scored));
    } else {
        print!("{}", score::render(&scored));
    }
    Ok(scored.ok)
}
