//! `--url` of `chd advise`, `chd check` and `chd ledger`: GET one page of a node's `chd
//! serve` over `http://` or `https://` (ureq, rustls with the ring provider), with the CA
//! bundle, client certificate and basic auth a node with `--web.config.file` asks for. No
//! redirects, no proxies, a cap on the body; an error names the URL and the cause.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine as _;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

/// The port of `chd serve` (`server.listen`'s default), used when a URL names none.
pub const DEFAULT_PORT: u16 = 9863;
/// The page read when a URL has no path.
pub const DEFAULT_PATH: &str = "/api/v1/calibration";
/// The environment variable `--user`'s password is read from without `--password-file`.
pub const PASSWORD_ENV: &str = "CHD_PASSWORD";
/// The largest answer read (a 640-CPU ledger is tens of MiB).
pub const BODY_LIMIT: u64 = 256 << 20;
/// How long a connection, each read and each write may take.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the whole request may take.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(300);

/// How to reach a node, as the command line gave it (checked by [`get`]).
#[derive(Debug, Clone, Default)]
pub struct ClientRequest {
    /// PEM certificates trusted instead of the Mozilla roots compiled into chd.
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain and its key (PEM), for a server that asks for one.
    pub cert: Option<(PathBuf, PathBuf)>,
    /// The basic auth user; the password is in `password_file` or [`PASSWORD_ENV`].
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// A node's page: `--url` and how to reach it.
#[derive(Debug, Clone)]
pub struct Remote {
    pub url: String,
    pub client: ClientRequest,
}

/// A URL with its default port and path filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    pub https: bool,
}

/// `http://HOST[:PORT][/PATH]` or `https://...`, with port [`DEFAULT_PORT`] and path
/// [`DEFAULT_PATH`] where absent; credentials in the URL are refused (they would show in
/// `ps`: use `--user`).
pub fn normalize(url: &str) -> anyhow::Result<Target> {
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        bail!("{url}: not an http:// or https:// URL");
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        bail!(
            "{url}: credentials in the URL are refused (they show in ps): give --user NAME \
             and --password-file FILE or {PASSWORD_ENV}"
        );
    }
    if authority.is_empty() || authority.starts_with(':') {
        bail!("{url}: no host");
    }
    // An IPv6 literal is bracketed (`[::1]:9863`); its colons are not a port's.
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close + 1..].starts_with(':'),
        None => authority.contains(':'),
    };
    let path = if path.is_empty() || path == "/" {
        DEFAULT_PATH
    } else {
        path
    };
    let scheme = if https { "https" } else { "http" };
    let url = if has_port {
        format!("{scheme}://{authority}{path}")
    } else {
        format!("{scheme}://{authority}:{DEFAULT_PORT}{path}")
    };
    Ok(Target { url, https })
}

/// Basic auth credentials; the password is never printed.
struct Credentials {
    user: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <password>)", self.user)
    }
}

impl Credentials {
    fn header(&self) -> String {
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// The credentials of `request`: `--user` with the first line of `--password-file`, else
/// `env_password` (the value of [`PASSWORD_ENV`]; empty counts as unset).
fn credentials(
    request: &ClientRequest,
    env_password: Option<String>,
) -> anyhow::Result<Option<Credentials>> {
    let env_password = env_password.filter(|p| !p.is_empty());
    let Some(user) = &request.user else {
        if request.password_file.is_some() {
            bail!("--password-file without --user: give --user NAME");
        }
        if env_password.is_some() {
            bail!("{PASSWORD_ENV} is set but --user is not: give --user NAME (or unset {PASSWORD_ENV})");
        }
        return Ok(None);
    };
    if user.is_empty() || user.contains(':') {
        bail!("--user {user:?}: a basic auth user name is not empty and has no ':'");
    }
    let password = match &request.password_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --password-file {}", path.display()))?;
            let line = text.lines().next().unwrap_or_default();
            if line.is_empty() {
                bail!(
                    "--password-file {}: its first line is empty",
                    path.display()
                );
            }
            line.to_string()
        }
        None => env_password.with_context(|| {
            format!("--user {user}: no password: give --password-file FILE or set {PASSWORD_ENV}")
        })?,
    };
    Ok(Some(Credentials {
        user: user.clone(),
        password,
    }))
}

/// The PEM items of `path`.
fn pem_items(path: &Path, what: &str) -> anyhow::Result<Vec<PemItem<'static>>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))?;
    ureq::tls::parse_pem(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{what} {}: not PEM", path.display()))
}

fn certificates(path: &Path, what: &str) -> anyhow::Result<Vec<Certificate<'static>>> {
    let certs: Vec<_> = pem_items(path, what)?
        .into_iter()
        .filter_map(|item| match item {
            PemItem::Certificate(c) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        bail!("{what} {}: no PEM certificate in it", path.display());
    }
    Ok(certs)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKey<'static>> {
    pem_items(path, "--key-file")?
        .into_iter()
        .find_map(|item| match item {
            PemItem::PrivateKey(k) => Some(k),
            _ => None,
        })
        .with_context(|| format!("--key-file {}: no PEM private key in it", path.display()))
}

/// The TLS settings of `request`: its CA bundle (else the Mozilla roots of webpki-roots) and
/// client certificate.
fn tls_config(request: &ClientRequest) -> anyhow::Result<TlsConfig> {
    let roots = match &request.ca_file {
        Some(path) => RootCerts::Specific(Arc::new(certificates(path, "--ca-file")?)),
        None => RootCerts::WebPki,
    };
    let client = match &request.cert {
        Some((cert, key)) => Some(ClientCert::new_with_certs(
            &certificates(cert, "--cert-file")?,
            private_key(key)?,
        )),
        None => None,
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(roots)
        .client_cert(client)
        .build())
}

/// The rustls error under `e`, if the failure was TLS's.
fn rustls_error(e: &ureq::Error) -> Option<&rustls::Error> {
    match e {
        ureq::Error::Rustls(r) => Some(r),
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<rustls::Error>(),
        _ => None,
    }
}

/// What went wrong, in words a node's operator acts on.
fn cause(e: &ureq::Error, https: bool, client_cert: bool) -> String {
    use rustls::AlertDescription as Alert;
    if let Some(tls) = rustls_error(e) {
        return match tls {
            rustls::Error::InvalidCertificate(why) => format!(
                "TLS: the server's certificate is not trusted ({why}): give the CA that signed \
                 it with --ca-file"
            ),
            rustls::Error::AlertReceived(Alert::CertificateRequired) if !client_cert => {
                "TLS handshake failed: the server requires a client certificate: give \
                 --cert-file and --key-file"
                    .into()
            }
            rustls::Error::AlertReceived(
                alert @ (Alert::CertificateRequired
                | Alert::BadCertificate
                | Alert::UnknownCA
                | Alert::CertificateUnknown
                | Alert::HandshakeFailure),
            ) => format!(
                "TLS handshake failed: the server refused {} ({alert:?}): give --cert-file and \
                 --key-file of a certificate its client CA signed",
                if client_cert {
                    "the client certificate"
                } else {
                    "the handshake without a client certificate"
                }
            ),
            rustls::Error::InvalidMessage(_) if https => {
                format!(
                    "TLS handshake failed: the answer is not TLS ({tls}): is it plain HTTP? try \
                     http://"
                )
            }
            other => format!("TLS handshake failed: {other}"),
        };
    }
    match e {
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused (is chd serve listening there?)".into()
        }
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::BodyExceedsLimit(limit) if *limit >= 1 << 20 => {
            format!("the answer is larger than {} MiB", limit >> 20)
        }
        ureq::Error::BodyExceedsLimit(limit) => format!("the answer is larger than {limit} bytes"),
        ureq::Error::Protocol(p) if !https => format!(
            "not an HTTP answer ({p}): does the node serve TLS (--web.config.file)? try https://"
        ),
        ureq::Error::Io(io)
            if !https
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::InvalidData
                ) =>
        {
            format!(
                "no HTTP answer ({io}): does the node serve TLS (--web.config.file)? try https://"
            )
        }
        other => other.to_string(),
    }
}

/// The first line of an error page, at most 200 characters.
fn first_line(body: &str) -> String {
    body.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}

/// GET `remote`: the body of a 200 answer as text.
pub fn get(remote: &Remote) -> anyhow::Result<String> {
    fetch(remote, std::env::var(PASSWORD_ENV).ok(), BODY_LIMIT)
}

/// [`get`] with [`PASSWORD_ENV`]'s value and the body's cap given.
fn fetch(remote: &Remote, env_password: Option<String>, limit: u64) -> anyhow::Result<String> {
    let target = normalize(&remote.url)?;
    let url = &target.url;
    // A failure to reach the node names the URL as given (short: NPD keeps 80 bytes of the
    // message), an answer's status the page it came from.
    let given = remote.url.as_str();
    let request = &remote.client;
    let credentials = credentials(request, env_password)?;
    if !target.https {
        if request.ca_file.is_some() || request.cert.is_some() {
            bail!("{given}: --ca-file, --cert-file and --key-file are for https:// URLs");
        }
        if credentials.is_some() {
            tracing::warn!(
                "{given}: basic auth over plain http://: the password goes in clear text"
            );
        }
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls_config(request)?)
        .http_status_as_error(false)
        .max_redirects(0)
        // Nodes are reached directly, as Prometheus reaches them: no HTTP(S)_PROXY.
        .proxy(None)
        .user_agent(concat!("chd/", env!("CARGO_PKG_VERSION")))
        .accept("application/json")
        .timeout_resolve(Some(IO_TIMEOUT))
        .timeout_connect(Some(IO_TIMEOUT))
        .timeout_per_read(Some(IO_TIMEOUT))
        .timeout_per_write(Some(IO_TIMEOUT))
        .timeout_global(Some(TOTAL_TIMEOUT))
        .build()
        .into();
    let mut get = agent.get(url);
    if let Some(c) = &credentials {
        get = get.header("Authorization", c.header());
    }
    let mut answer = get.call().map_err(|e| {
        anyhow::anyhow!(
            "{given}: {}",
            cause(&e, target.https, request.cert.is_some())
        )
    })?;
    let status = answer.status();
    if status != ureq::http::StatusCode::OK {
        let location = answer
            .headers()
            .get("location")
            .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
        let body = answer
            .body_mut()
            .with_config()
            .limit(64 << 10)
            .lossy_utf8(true)
            .read_to_string()
            .unwrap_or_default();
        let line = first_line(&body);
        if status.is_redirection() {
            bail!(
                "{url}: {status}: redirected to {} (redirects are not followed: give that URL)",
                location.as_deref().unwrap_or("nowhere (no Location)")
            );
        }
        if status == ureq::http::StatusCode::UNAUTHORIZED {
            let hint = if credentials.is_some() {
                "wrong user or password".to_string()
            } else {
                format!(
                    "the node asks for basic auth: give --user NAME and --password-file FILE or \
                     set {PASSWORD_ENV}"
                )
            };
            bail!("{url}: {status} ({hint}): {line}");
        }
        bail!("{url}: {status}: {line}");
    }
    answer
        .body_mut()
        .with_config()
        .limit(limit)
        .read_to_string()
        .map_err(|e| {
            anyhow::anyhow!(
                "{url}: reading the answer: {}",
                cause(&e, target.https, request.cert.is_some())
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> String {
        normalize(url).unwrap().url
    }

    #[test]
    fn a_bare_host_gets_chd_serves_port_and_the_calibration_page() {
        assert_eq!(
            target("http://node7"),
            "http://node7:9863/api/v1/calibration"
        );
        assert_eq!(
            target("https://node7/"),
            "https://node7:9863/api/v1/calibration"
        );
        assert_eq!(
            target("https://node7:443"),
            "https://node7:443/api/v1/calibration"
        );
        assert_eq!(
            target("http://10.0.0.7:9100/other?x=1"),
            "http://10.0.0.7:9100/other?x=1"
        );
        assert_eq!(
            target("http://node7?x=1"),
            "http://node7:9863?x=1",
            "a query keeps its place"
        );
        assert!(normalize("https://node").unwrap().https);
        assert!(!normalize("http://node").unwrap().https);
    }

    #[test]
    fn an_ipv6_literals_colons_are_not_a_port() {
        assert_eq!(
            target("http://[::1]"),
            "http://[::1]:9863/api/v1/calibration"
        );
        assert_eq!(
            target("https://[fe80::1]:9000/"),
            "https://[fe80::1]:9000/api/v1/calibration"
        );
    }

    #[test]
    fn other_schemes_credentials_in_the_url_and_no_host_are_refused() {
        for (url, says) in [
            ("node7:9863", "not an http:// or https://"),
            ("ftp://node7", "not an http:// or https://"),
            ("https://alice:pw@node7", "credentials in the URL"),
            ("http://", "no host"),
            ("http://:9863/", "no host"),
        ] {
            let e = normalize(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    fn request(user: Option<&str>, password_file: Option<PathBuf>) -> ClientRequest {
        ClientRequest {
            user: user.map(String::from),
            password_file,
            ..ClientRequest::default()
        }
    }

    #[test]
    fn the_password_is_the_files_first_line_else_the_environments() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\r\nignored\n").unwrap();
        let c = credentials(&request(Some("alice"), Some(file.clone())), None)
            .unwrap()
            .unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("alice", "s3cret"));
        // The file wins over the environment.
        let c = credentials(&request(Some("alice"), Some(file)), Some("env".into()))
            .unwrap()
            .unwrap();
        assert_eq!(c.password, "s3cret");
        let c = credentials(&request(Some("alice"), None), Some("from-env".into()))
            .unwrap()
            .unwrap();
        assert_eq!(c.password, "from-env");
        assert_eq!(c.header(), "Basic YWxpY2U6ZnJvbS1lbnY=");
        assert!(!format!("{c:?}").contains("from-env"), "Debug hides it");
        assert!(credentials(&request(None, None), None).unwrap().is_none());
        assert!(credentials(&request(None, None), Some(String::new()))
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_user_without_a_password_or_a_password_without_a_user_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\nsecond\n").unwrap();
        let missing = dir.path().join("missing");
        for (req, env, says) in [
            (request(Some("alice"), None), None, "no password"),
            (request(Some("alice"), None), Some(""), "no password"),
            (
                request(None, None),
                Some("pw"),
                "CHD_PASSWORD is set but --user is not",
            ),
            (
                request(None, Some(empty.clone())),
                None,
                "--password-file without --user",
            ),
            (
                request(Some("alice"), Some(empty)),
                None,
                "first line is empty",
            ),
            (
                request(Some("alice"), Some(missing)),
                None,
                "reading --password-file",
            ),
            (request(Some("a:b"), None), Some("pw"), "has no ':'"),
        ] {
            let e = credentials(&req, env.map(String::from)).unwrap_err();
            assert!(format!("{e:#}").contains(says), "{req:?}: {e:#}");
        }
    }

    #[test]
    fn tls_files_without_pem_in_them_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let req = ClientRequest {
            ca_file: Some(junk.clone()),
            ..ClientRequest::default()
        };
        let e = format!("{:#}", tls_config(&req).unwrap_err());
        assert!(e.contains("--ca-file") && e.contains("junk.pem"), "{e}");
        let req = ClientRequest {
            cert: Some((junk.clone(), junk)),
            ..ClientRequest::default()
        };
        let e = format!("{:#}", tls_config(&req).unwrap_err());
        assert!(
            e.contains("--cert-file") && e.contains("no PEM certificate"),
            "{e}"
        );
    }

    #[test]
    fn tls_flags_on_a_plain_http_url_are_an_error() {
        let remote = Remote {
            url: "http://127.0.0.1:1".into(),
            client: ClientRequest {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..ClientRequest::default()
            },
        };
        let e = fetch(&remote, None, BODY_LIMIT).unwrap_err().to_string();
        assert!(e.contains("are for https:// URLs"), "{e}");
    }

    /// A server on 127.0.0.1 that answers one connection with `answer` (after reading the
    /// request head), and the URL of `path` on it.
    fn canned(answer: &'static [u8], path: &str) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}{path}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(conn);
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut conn = reader.into_inner();
            conn.write_all(answer).unwrap();
            head
        });
        (url, server)
    }

    fn plain(url: &str) -> Remote {
        Remote {
            url: url.into(),
            client: ClientRequest::default(),
        }
    }

    #[test]
    fn a_chunked_answer_is_read_whole_and_the_request_names_chd() {
        let (url, server) = canned(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n\
              6\r\n{\"a\": \r\n2\r\n1}\r\n0\r\n\r\n",
            "/x",
        );
        assert_eq!(fetch(&plain(&url), None, BODY_LIMIT).unwrap(), "{\"a\": 1}");
        let head = server.join().unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /x http/1.1\r\n"), "{head}");
        assert!(head.contains("user-agent: chd/"), "{head}");
        assert!(head.contains("accept: application/json"), "{head}");
        assert!(!head.contains("authorization"), "{head}");
    }

    #[test]
    fn basic_auth_is_sent_as_rfc_7617_says() {
        let (url, server) = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", "/");
        let mut remote = plain(&url);
        remote.client.user = Some("alice".into());
        assert_eq!(
            fetch(&remote, Some("s3cret".into()), BODY_LIMIT).unwrap(),
            "{}"
        );
        let head = server.join().unwrap();
        assert!(head.starts_with("GET /api/v1/calibration "), "{head}");
        assert!(
            head.contains("authorization: Basic YWxpY2U6czNjcmV0\r\n"),
            "{head}"
        );
    }

    #[test]
    fn a_redirect_is_not_followed_and_names_its_location() {
        let (url, server) = canned(
            b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere:9863/\r\nContent-Length: 0\r\n\r\n",
            "/",
        );
        let e = fetch(&plain(&url), None, BODY_LIMIT)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("302 Found") && e.contains("redirected to https://elsewhere:9863/"),
            "{e}"
        );
        server.join().unwrap();
    }

    #[test]
    fn another_status_is_named_with_the_first_line_of_its_body() {
        let (url, server) = canned(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 23\r\n\r\n\nno ledger yet\nsecond\n\n",
            "/",
        );
        let e = fetch(&plain(&url), None, BODY_LIMIT)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("503 Service Unavailable: no ledger yet"), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn an_answer_over_the_cap_is_refused() {
        let (url, server) = canned(
            b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n0123456789012345678901234567890123456789",
            "/",
        );
        let e = fetch(&plain(&url), None, 16).unwrap_err().to_string();
        assert!(e.contains("larger than 16 bytes"), "{e}");
        server.join().unwrap();
    }

    #[test]
    fn nobody_listening_is_a_refused_connection() {
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", dead.local_addr().unwrap());
        drop(dead);
        let e = fetch(&plain(&url), None, BODY_LIMIT)
            .unwrap_err()
            .to_string();
        assert!(e.contains("connection refused"), "{e}");
        assert!(e.starts_with(&format!("{url}: connection refused")), "{e}");
    }

    #[test]
    fn an_error_page_is_named_by_its_first_line() {
        assert_eq!(first_line("\n  Unauthorized  \nmore"), "Unauthorized");
        assert_eq!(first_line(""), "");
        assert_eq!(first_line(&"x".repeat(500)).len(), 200);
    }
}
