//! The HTTP request path: `Accept` / `Accept-Encoding` negotiation
//! (`exposition::{Format, content_coding::Acceptable}`) and the server
//! (`exposition::server::serve`) fed arbitrary bytes over a socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chd::exposition::connections::ServerMetrics;
use chd::exposition::content_coding::{Acceptable, Coding, MIN_GZIP_BYTES};
use chd::exposition::scrape::Exposition;
use chd::exposition::server::{self, ServerSettings};
use chd::exposition::Format;
use prometheus_client::registry::Registry;

/// Lines of the input are `Accept-Encoding` field lines (the first also the `Accept`
/// field). Whether a coding is acceptable does not depend on the body's length; gzip is
/// chosen only when some element names it (or `*`); field lines join like one list
/// (RFC 9110 §5.3); codings and parameter names are case-insensitive.
pub fn check_negotiation(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    let fields: Vec<&str> = text.split('\n').collect();
    let format = Format::negotiate(fields.first().copied());
    assert_eq!(
        format == Format::OpenMetrics,
        text.split('\n')
            .next()
            .is_some_and(|a| a.contains("application/openmetrics-text"))
    );
    assert!(!format.content_type().is_empty());
    let accept = Acceptable::parse(fields.iter().copied());
    let small = accept.choose(0);
    let large = accept.choose(MIN_GZIP_BYTES);
    assert_eq!(
        small.is_some(),
        large.is_some(),
        "acceptability changed with length"
    );
    if small == Some(Coding::Gzip) {
        assert_eq!(
            large,
            Some(Coding::Gzip),
            "identity refused for small, not large bodies"
        );
    }
    let lower = text.to_ascii_lowercase();
    if !lower.contains("gzip") && !lower.contains('*') {
        assert_ne!(
            large,
            Some(Coding::Gzip),
            "gzip chosen though {text:?} never names it"
        );
    }
    let joined = fields.join(",");
    assert_eq!(
        Acceptable::parse([joined.as_str()]),
        accept,
        "joined: {joined:?}"
    );
    let upper = text.to_ascii_uppercase();
    assert_eq!(
        Acceptable::parse(upper.split('\n')),
        accept,
        "upper case: {upper:?}"
    );
}

/// A server on a loopback port with the live registry `chd serve` has and a `/matrix`
/// page, started once per process on its own runtime.
fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut registry = Registry::default();
        let metrics = ServerMetrics::register(&mut registry, 64);
        let settings = ServerSettings {
            max_connections: 64,
            header_timeout: Duration::from_secs(2),
            web_config_file: None,
        };
        let matrix: server::PageRenderer = Arc::new(|| {
            Arc::new(chd::exposition::page_cache::Page::new(
                "<html><body>matrix</body></html>\n".repeat(64),
            ))
        });
        let (keep, shutdown) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let _keep = keep;
            runtime.block_on(server::serve(
                listener,
                Arc::new(Exposition::new(registry)),
                server::Pages {
                    matrix: Some(matrix),
                    calibration: None,
                },
                settings,
                None,
                metrics,
                shutdown,
            ));
        });
        addr
    })
}

/// What ends every exchange: a request that closes the connection after its response, so
/// the server answers what came before and hangs up without waiting for more. (Closing the
/// sending side instead would make hyper drop the connection before it answers.)
const LAST: &[u8] = b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: chd\r\nConnection: close\r\n\r\n";

/// Send `request` and read what comes back until the server closes, or for at most a
/// second (a request whose body never ends).
fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    // The server may close before taking everything (a bad request line): not an error.
    let _ = stream
        .write_all(request)
        .and_then(|()| stream.write_all(LAST));
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    response
}

/// The status code of a response head, if it has one.
fn status(response: &[u8]) -> Option<u16> {
    let rest = response
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| response.strip_prefix(b"HTTP/1.0 "))?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}

/// Whatever the bytes, the server answers with a well-formed status line or closes without
/// one, never with a 5xx, and still serves `/healthz` afterwards. (`exchange` adds the
/// blank line and request that end it, so a health check is the empty input.)
pub fn check_server(data: &[u8]) {
    let addr = server();
    let response = exchange(addr, data);
    if !response.is_empty() {
        let code = status(&response)
            .unwrap_or_else(|| panic!("no status line: {:?}", String::from_utf8_lossy(&response)));
        assert!(
            (100..500).contains(&code),
            "{code} for {:?}",
            String::from_utf8_lossy(data)
        );
    }
    let health = exchange(addr, b"");
    assert_eq!(
        status(&health),
        Some(200),
        "{:?}",
        String::from_utf8_lossy(&health)
    );
}
