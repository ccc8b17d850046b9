//! The HTTP server (hyper 1 on tokio): `/metrics`, `/healthz`, the `/matrix` heatmap page, the
//! calibration ledger at `/api/v1/calibration` (JSON, `docs/calibration.schema.json`) and a
//! small index page at `/`.
//! Encoding and compression run on the blocking pool so a large scrape never stalls the
//! reactor; they read the store only and never wait for a probe. Responses are gzipped when
//! the client asks for it ([`super::content_coding`]). Connections are bounded
//! ([`super::connections`]): at most `max_connections` at once, and each must send a
//! complete request head within `header_timeout` of being accepted or of its previous
//! response (hyper starts its header timer as soon as a connection awaits a request, so
//! this is also the keep-alive idle timeout).
//!
//! With a web config file ([`super::web_settings`]) connections speak TLS and requests need
//! basic auth. The TLS handshake runs inside the connection's slot while it counts as idle
//! (so it can be evicted for a newer connection) and must finish within `header_timeout`:
//! a client that opens TCP and never handshakes holds a slot no longer than one that never
//! sends its request head. Every path, `/healthz` included, needs the credentials when
//! `basic_auth_users` is set, as in exporter-toolkit.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{
    HeaderValue, ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE,
    RETRY_AFTER, VARY, WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::basic_auth::{BasicAuth, Refusal};
use super::connections::{Busy, Limit, ServerMetrics, Ticket};
use super::content_coding::{self, Acceptable, Coding};
use super::page_cache::Page;
use super::scrape::Exposition;
use super::web_settings::WebSettings;
use super::Format;

/// The server's bounds (`[server]` keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// Most connections open at once (`server.max_connections`).
    pub max_connections: usize,
    /// Longest wait for a complete request head (`server.header_timeout`).
    pub header_timeout: Duration,
    /// The exporters' web config file: TLS and basic auth (`server.web_config_file`).
    pub web_config_file: Option<PathBuf>,
}

const INDEX: &str = "<!doctype html>
<html><head><title>chd</title></head><body>
<h1>chd</h1>
<p>Calibration prober and exporter for accelerator nodes.</p>
<ul><li><a href=\"/metrics\">/metrics</a></li><li><a href=\"/matrix\">/matrix</a> (heatmaps)</li><li><a href=\"/api/v1/calibration\">/api/v1/calibration</a> (ledger)</li><li><a href=\"/healthz\">/healthz</a></li></ul>
</body></html>
";

const TEXT: &str = "text/plain; charset=utf-8";

/// A response body sent as the chunks it was made of: a scrape's cached part goes out from
/// the snapshot's own buffer, uncopied.
#[derive(Debug, Default)]
pub struct Chunks(VecDeque<Bytes>);

impl Chunks {
    fn one(bytes: impl Into<Bytes>) -> Chunks {
        Chunks(VecDeque::from([bytes.into()]))
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|c| c.len() as u64).sum())
    }
}

/// A response body that keeps its connection marked busy until hyper has taken all of it
/// (a refused login's answer leaves it idle: it was never busy).
pub struct ReplyBody {
    inner: Chunks,
    _busy: Option<Busy>,
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response in `coding`, or 406 when `accept` allows neither gzip nor identity.
fn reply(
    status: StatusCode,
    content_type: &str,
    body: Vec<u8>,
    accept: Acceptable,
    vary: &'static str,
) -> Response<Chunks> {
    let Some(coding) = accept.choose(body.len()) else {
        return plain(
            StatusCode::NOT_ACCEPTABLE,
            TEXT,
            "neither gzip nor identity is acceptable\n",
        );
    };
    let body = match coding {
        Coding::Gzip => content_coding::gzip(&body),
        Coding::Identity => body,
    };
    coded(status, content_type, Chunks::one(body), coding, vary)
}

/// A response whose body is already in `coding`.
fn coded(
    status: StatusCode,
    content_type: &str,
    body: Chunks,
    coding: Coding,
    vary: &'static str,
) -> Response<Chunks> {
    let mut r = Response::builder()
        .status(status)
        .header(CONTENT_TYPE, content_type)
        .header(VARY, HeaderValue::from_static(vary));
    if let Some(value) = coding.header_value() {
        r = r.header(CONTENT_ENCODING, value);
    }
    r.body(body)
        .unwrap_or_else(|_| Response::new(Chunks::default()))
}

/// A response without content negotiation (errors).
fn plain(status: StatusCode, content_type: &str, body: &'static str) -> Response<Chunks> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, content_type)
        .body(Chunks::one(Bytes::from_static(body.as_bytes())))
        .unwrap_or_else(|_| Response::new(Chunks::default()))
}

/// The most a connection buffers (hyper's `max_buf_size`): its read buffer, which a request
/// head must fit in (a longer head is answered 431), and the response bytes it holds before
/// writing. Requests to chd are a few hundred bytes; hyper's default (~400 KiB) let each
/// connection that sends a long head without ending it hold that much, 4 GiB at the largest
/// `server.max_connections` (10,000) against the DaemonSet's 1 GiB limit. At 16 KiB it is
/// 160 MiB (with TLS, rustls' own per-connection buffers come on top; this does not bound
/// them).
pub const MAX_BUF_BYTES: usize = 16 * 1024;

/// Renders a page on demand (`/matrix`'s HTML, the ledger's JSON), or hands back the one it
/// kept (`page_cache`); called on the blocking pool.
pub type PageRenderer = Arc<dyn Fn() -> Arc<Page> + Send + Sync>;

/// Requests encoded or rendered on the blocking pool at once (`/metrics`, `/matrix`); more
/// wait for a turn holding no thread. Without the bound a burst of concurrent scrapes (up to
/// `server.max_connections`) starts a pool thread each: under 50 concurrent scrapers chd ran
/// 129 threads, each with a malloc arena of its own (tests/load.rs). The work is CPU-bound,
/// so more at once only queue on the cores; and with at most this many, state saves and
/// password checks always find a pool thread instead of queueing behind scrapes.
pub const CONCURRENT_RENDERS: usize = 4;

/// The pages rendered from the store when asked for; a page left `None` is not found.
#[derive(Clone, Default)]
pub struct Pages {
    /// `/matrix`: the heatmaps (HTML).
    pub matrix: Option<PageRenderer>,
    /// `/api/v1/calibration`: the node's calibration ledger (JSON).
    pub calibration: Option<PageRenderer>,
}

struct Site {
    exposition: Arc<Exposition>,
    pages: Pages,
    auth: BasicAuth,
    /// [`CONCURRENT_RENDERS`] permits.
    renders: Arc<tokio::sync::Semaphore>,
    metrics: ServerMetrics,
}

impl Site {
    /// Run `work` on the blocking pool once one of the [`CONCURRENT_RENDERS`] turns is free.
    async fn render<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        // The semaphore is never closed, so a permit always comes.
        let _turn = self.renders.clone().acquire_owned().await.ok();
        tokio::task::spawn_blocking(work).await
    }
}

/// `render`'s page on the blocking pool as `content_type`, or 500 when rendering failed.
async fn rendered(
    site: &Site,
    render: Option<PageRenderer>,
    content_type: &'static str,
    what: &'static str,
    accept: Acceptable,
) -> Response<Chunks> {
    let Some(render) = render else {
        return plain(StatusCode::NOT_FOUND, TEXT, "not found\n");
    };
    let work = move || {
        let page = render();
        let body = page.body();
        match accept.choose(body.len()) {
            None => plain(
                StatusCode::NOT_ACCEPTABLE,
                TEXT,
                "neither gzip nor identity is acceptable\n",
            ),
            Some(Coding::Gzip) => coded(
                StatusCode::OK,
                content_type,
                Chunks::one(page.gzip()),
                Coding::Gzip,
                "Accept-Encoding",
            ),
            Some(Coding::Identity) => coded(
                StatusCode::OK,
                content_type,
                Chunks::one(body),
                Coding::Identity,
                "Accept-Encoding",
            ),
        }
    };
    match site.render(work).await {
        Ok(r) => r,
        Err(_) => {
            tracing::error!("rendering {what} failed");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                TEXT,
                "rendering the page failed\n",
            )
        }
    }
}

/// Authenticate (when the web config in force has users), serve, and add its extra headers.
/// The config is looked up for every request (a stat of its files), so a removed user or a
/// changed password takes effect on open keep-alive connections too. The connection is
/// marked busy (not evictable) only once the request is let in: one waiting for its bcrypt
/// check is idle, and a refused one never turns busy.
async fn handle(
    site: Arc<Site>,
    web: Option<Arc<WebSettings>>,
    peer: SocketAddr,
    ticket: Arc<Ticket>,
    req: Request<Incoming>,
) -> Response<ReplyBody> {
    let serve = |site: Arc<Site>, req| {
        let busy = ticket.busy();
        async move {
            route(site, req).await.map(|inner| ReplyBody {
                inner,
                _busy: Some(busy),
            })
        }
    };
    let Some(web) = web.map(|w| w.current()) else {
        return serve(site, req).await;
    };
    let allowed = if web.users.is_empty() {
        Ok(())
    } else {
        site.auth
            .check(
                &web.users,
                req.headers().get(AUTHORIZATION),
                peer.ip().to_canonical(),
            )
            .await
    };
    let mut response = match allowed {
        Ok(()) => serve(site, req).await,
        Err(refusal) => {
            site.metrics.auth_refused(refusal);
            refused(refusal).map(|inner| ReplyBody { inner, _busy: None })
        }
    };
    for (name, value) in &web.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

/// The answer to a request basic auth did not let in: 401, or 503 when its credentials were
/// not checked (the bcrypt queue was full), to be retried.
fn refused(refusal: Refusal) -> Response<Chunks> {
    if refusal == Refusal::Busy {
        let mut r = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "too many logins being checked, retry\n",
        );
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    }
    let mut r = plain(StatusCode::UNAUTHORIZED, TEXT, "unauthorized\n");
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
    r
}

async fn route(site: Arc<Site>, req: Request<Incoming>) -> Response<Chunks> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET and HEAD\n");
    }
    let accept = Acceptable::parse(
        req.headers()
            .get_all(ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    match req.uri().path() {
        "/metrics" => {
            let format = Format::negotiate(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
            let exposition = site.exposition.clone();
            let work = move || exposition.scrape(format, accept);
            match site.render(work).await {
                Ok(Ok(Some(scrape))) => coded(
                    StatusCode::OK,
                    format.content_type(),
                    Chunks(scrape.body.into()),
                    scrape.coding,
                    "Accept, Accept-Encoding",
                ),
                Ok(Ok(None)) => plain(
                    StatusCode::NOT_ACCEPTABLE,
                    TEXT,
                    "neither gzip nor identity is acceptable\n",
                ),
                Ok(Err(_)) | Err(_) => {
                    tracing::error!("encoding /metrics failed");
                    plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        TEXT,
                        "encoding metrics failed\n",
                    )
                }
            }
        }
        "/matrix" => {
            rendered(
                &site,
                site.pages.matrix.clone(),
                "text/html; charset=utf-8",
                "/matrix",
                accept,
            )
            .await
        }
        "/api/v1/calibration" => {
            rendered(
                &site,
                site.pages.calibration.clone(),
                "application/json",
                "/api/v1/calibration",
                accept,
            )
            .await
        }
        "/healthz" => reply(
            StatusCode::OK,
            TEXT,
            b"ok\n".to_vec(),
            accept,
            "Accept-Encoding",
        ),
        "/" => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            INDEX.as_bytes().to_vec(),
            accept,
            "Accept-Encoding",
        ),
        _ => plain(StatusCode::NOT_FOUND, TEXT, "not found\n"),
    }
}

/// One admitted connection: its TLS handshake (with a web config that has TLS), then HTTP.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    ticket: Ticket,
    site: Arc<Site>,
    web: Option<Arc<WebSettings>>,
    settings: Arc<ServerSettings>,
    metrics: ServerMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(tls) = web.as_ref().and_then(|w| w.current().tls.clone()) else {
        return http(stream, peer, ticket, site, web, settings, metrics, shutdown).await;
    };
    let handshake = tokio::time::timeout(
        settings.header_timeout,
        tokio_rustls::TlsAcceptor::from(tls).accept(stream),
    );
    let stream = tokio::select! {
        r = handshake => match r {
            Ok(Ok(stream)) => stream,
            // A client that closes before its hello (a TCP health check, a port scan)
            // closed the connection itself: not counted.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                tracing::debug!(%peer, "closed before the TLS handshake: {e}");
                return;
            }
            Ok(Err(e)) => {
                metrics.dropped("tls_handshake");
                tracing::debug!(%peer, "TLS handshake failed: {e}");
                return;
            }
            Err(_) => {
                metrics.dropped("tls_handshake");
                tracing::debug!(%peer, "no TLS handshake within server.header_timeout");
                return;
            }
        },
        _ = ticket.evicted() => {
            tracing::debug!(%peer, "connection closed for a newer one during its TLS handshake");
            return;
        }
        _ = shutdown.changed() => return,
    };
    http(stream, peer, ticket, site, web, settings, metrics, shutdown).await
}

/// Serve HTTP/1.1 on one admitted connection until it ends, is evicted, or the server
/// shuts down.
#[allow(clippy::too_many_arguments)]
async fn http<S>(
    stream: S,
    peer: SocketAddr,
    ticket: Ticket,
    site: Arc<Site>,
    web: Option<Arc<WebSettings>>,
    settings: Arc<ServerSettings>,
    metrics: ServerMetrics,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ticket = Arc::new(ticket);
    let service = {
        let ticket = ticket.clone();
        service_fn(move |req| {
            let response = handle(site.clone(), web.clone(), peer, ticket.clone(), req);
            async move { Ok::<_, Infallible>(response.await) }
        })
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_buf_size(MAX_BUF_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                if e.is_timeout() {
                    metrics.dropped("header_timeout");
                }
                tracing::debug!(%peer, "connection ended: {e}");
            }
        }
        _ = ticket.evicted() => {
            tracing::debug!(%peer, "connection closed for a newer one (server.max_connections)");
        }
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Serve `exposition` (and the `pages` given) on `listener` within `settings`'
/// bounds until `shutdown` turns true, with TLS and basic auth when `web` is given (loaded
/// from `settings.web_config_file`). `metrics` are the ones registered in `exposition`.
pub async fn serve(
    listener: TcpListener,
    exposition: Arc<Exposition>,
    pages: Pages,
    settings: ServerSettings,
    web: Option<Arc<WebSettings>>,
    metrics: ServerMetrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let site = Arc::new(Site {
        exposition,
        pages,
        auth: BasicAuth::default(),
        renders: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_RENDERS)),
        metrics: metrics.clone(),
    });
    let limit = Limit::new(settings.max_connections, metrics.clone());
    let settings = Arc::new(settings);
    loop {
        // At the cap with every connection busy, leave new ones in the listen backlog.
        tokio::select! {
            () = limit.room() => {}
            _ = shutdown.changed() => break,
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        let (stream, peer): (_, SocketAddr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ticket = loop {
            if let Some(t) = limit.admit() {
                break Some(t);
            }
            tokio::select! {
                () = limit.room() => {}
                _ = shutdown.changed() => break None,
            }
        };
        let Some(ticket) = ticket else { break };
        tokio::spawn(connection(
            stream,
            peer,
            ticket,
            site.clone(),
            web.clone(),
            settings.clone(),
            metrics.clone(),
            shutdown.clone(),
        ));
    }
}
