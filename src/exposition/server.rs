//! The HTTP server (hyper 1 on tokio): `/metrics`, `/healthz`, the `/matrix` heatmap page and
//! a small index page at `/`.
//! Encoding runs on the blocking pool so a large scrape never stalls the reactor; it reads
//! the store only and never waits for a probe.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::{encode, Format};

const INDEX: &str = "<!doctype html>
<html><head><title>chd</title></head><body>
<h1>chd</h1>
<p>Calibration prober and exporter for accelerator nodes.</p>
<ul><li><a href=\"/metrics\">/metrics</a></li><li><a href=\"/matrix\">/matrix</a> (heatmaps)</li><li><a href=\"/healthz\">/healthz</a></li></ul>
</body></html>
";

fn response(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, content_type)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Renders an HTML page on demand (`/matrix`); called on the blocking pool.
pub type PageRenderer = Arc<dyn Fn() -> String + Send + Sync>;

async fn handle(
    registry: Arc<Registry>,
    matrix: Option<PageRenderer>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(response(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n",
        ));
    }
    let reply = match req.uri().path() {
        "/metrics" => {
            let format = Format::negotiate(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
            match tokio::task::spawn_blocking(move || encode(&registry, format)).await {
                Ok(Ok(body)) => response(StatusCode::OK, format.content_type(), body),
                Ok(Err(_)) | Err(_) => {
                    tracing::error!("encoding /metrics failed");
                    response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain; charset=utf-8",
                        "encoding metrics failed\n",
                    )
                }
            }
        }
        "/matrix" => match matrix {
            Some(render) => match tokio::task::spawn_blocking(move || render()).await {
                Ok(page) => response(StatusCode::OK, "text/html; charset=utf-8", page),
                Err(_) => {
                    tracing::error!("rendering /matrix failed");
                    response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain; charset=utf-8",
                        "rendering the matrix page failed\n",
                    )
                }
            },
            None => response(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "not found\n",
            ),
        },
        "/healthz" => response(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        "/" => response(StatusCode::OK, "text/html; charset=utf-8", INDEX),
        _ => response(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        ),
    };
    Ok(reply)
}

/// Serve `registry` (and the `matrix` page, when given) on `listener` until `shutdown` turns
/// true.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    matrix: Option<PageRenderer>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        let (stream, peer): (_, SocketAddr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let matrix = matrix.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(registry.clone(), matrix.clone(), req));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, "connection ended: {e}");
                    }
                }
                _ = conn_shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}
