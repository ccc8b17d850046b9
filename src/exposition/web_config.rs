//! The web config file (`server.web_config_file`, `--web.config.file`) validated into what the
//! server uses: a rustls `ServerConfig` when `tls_server_config` is given, the basic-auth
//! users and the extra response headers. The semantics follow prometheus/exporter-toolkit
//! (`web/tls_config.go`, `web/handler.go` at commit 0089e786c388f128bd417609a8ba66c20b35176e):
//! relative paths are relative to the file's directory, `min_version` defaults to TLS12,
//! `prefer_server_cipher_suites` to true, a client CA without a client auth type is an error.
//! Whatever rustls (ring provider) or chd cannot honour is refused with the key and why:
//! TLS 1.0/1.1, CBC and RSA key-exchange suites, P-521, client certificates that are asked
//! for but not verified, `client_allowed_sans`, `http2: true`, `rate_limit`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use hyper::header::{HeaderName, HeaderValue};
use rustls::crypto::{ring as provider, CryptoProvider, SupportedKxGroup};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::format::web_config::{HttpServerConfig, TlsServerConfig, WebConfigFile};

pub use crate::format::web_config::WebConfigFileError;

/// A validated web config.
#[derive(Debug)]
pub struct WebConfig {
    /// TLS, when `tls_server_config` is given.
    pub tls: Option<Arc<ServerConfig>>,
    /// User name -> bcrypt hash; empty: no authentication.
    pub users: BTreeMap<String, String>,
    /// Added to every response (`http_server_config.headers`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The files it was built from (the config and the certificates it names), whose change
    /// reloads it.
    pub files: Vec<PathBuf>,
}

/// Why a web config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error(transparent)]
    File(#[from] WebConfigFileError),
    #[error("{}: {key}: {why}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        why: String,
    },
}

/// Errors of one file: each names its key.
struct Refuse<'a>(&'a Path);

impl Refuse<'_> {
    fn key(&self, key: impl Into<String>, why: impl Into<String>) -> WebConfigError {
        WebConfigError::Key {
            path: self.0.to_path_buf(),
            key: key.into(),
            why: why.into(),
        }
    }
}

/// Extra headers the toolkit allows (`extraHTTPHeaders` in `web/handler.go`), with the values
/// it allows (empty: any).
const EXTRA_HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Go's names of the TLS 1.2 suites the ring provider implements.
fn tls12_suite(name: &str) -> Option<SupportedCipherSuite> {
    use provider::cipher_suite::*;
    Some(match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ => return None,
    })
}

/// Go's TLS 1.3 suite names: accepted and without effect, as in Go, where `cipher_suites`
/// configures TLS 1.2 and below only.
const TLS13_SUITES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

fn version(
    refuse: &Refuse,
    key: &str,
    value: Option<&str>,
    default: u8,
) -> Result<u8, WebConfigError> {
    match value {
        None => Ok(default),
        Some("TLS12") => Ok(2),
        Some("TLS13") => Ok(3),
        Some(v @ ("TLS10" | "TLS11")) => Err(refuse.key(
            key,
            format!("{v}: rustls implements TLS 1.2 and 1.3 only (TLS12, TLS13)"),
        )),
        Some(v) => Err(refuse.key(
            key,
            format!("unknown TLS version {v:?} (TLS10, TLS11, TLS12, TLS13)"),
        )),
    }
}

/// PEM from a file (relative to the config's directory) or inline text, not both.
fn pem_source(
    refuse: &Refuse,
    dir: &Path,
    (file_key, file): (&str, Option<&PathBuf>),
    (inline_key, inline): (&str, Option<&String>),
    files: &mut Vec<PathBuf>,
) -> Result<Option<Vec<u8>>, WebConfigError> {
    let file = file.filter(|p| !p.as_os_str().is_empty());
    let inline = inline.filter(|s| !s.is_empty());
    match (file, inline) {
        (Some(_), Some(_)) => Err(refuse.key(
            file_key,
            format!("give {file_key} or {inline_key}, not both"),
        )),
        (Some(f), None) => {
            let path = dir.join(f);
            let bytes = std::fs::read(&path)
                .map_err(|e| refuse.key(file_key, format!("reading {}: {e}", path.display())))?;
            files.push(path);
            Ok(Some(bytes))
        }
        (None, Some(text)) => Ok(Some(text.clone().into_bytes())),
        (None, None) => Ok(None),
    }
}

fn tls(
    refuse: &Refuse,
    dir: &Path,
    t: &TlsServerConfig,
    files: &mut Vec<PathBuf>,
) -> Result<ServerConfig, WebConfigError> {
    let cert = pem_source(
        refuse,
        dir,
        ("tls_server_config.cert_file", t.cert_file.as_ref()),
        ("tls_server_config.cert", t.cert.as_ref()),
        files,
    )?
    .ok_or_else(|| {
        refuse.key(
            "tls_server_config.cert_file",
            "missing one of cert or cert_file",
        )
    })?;
    let key = pem_source(
        refuse,
        dir,
        ("tls_server_config.key_file", t.key_file.as_ref()),
        ("tls_server_config.key", t.key.as_ref()),
        files,
    )?
    .ok_or_else(|| {
        refuse.key(
            "tls_server_config.key_file",
            "missing one of key or key_file",
        )
    })?;
    let client_ca = pem_source(
        refuse,
        dir,
        (
            "tls_server_config.client_ca_file",
            t.client_ca_file.as_ref(),
        ),
        ("tls_server_config.client_ca", t.client_ca.as_ref()),
        files,
    )?;

    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<_, _>>()
        .map_err(|e| refuse.key("tls_server_config.cert_file", format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(refuse.key("tls_server_config.cert_file", "no CERTIFICATE block in it"));
    }
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
        refuse.key(
            "tls_server_config.key_file",
            format!("no PEM private key (PKCS#1, PKCS#8 or SEC1): {e}"),
        )
    })?;

    let min = version(
        refuse,
        "tls_server_config.min_version",
        t.min_version.as_deref(),
        2,
    )?;
    let max = version(
        refuse,
        "tls_server_config.max_version",
        t.max_version.as_deref(),
        3,
    )?;
    if min > max {
        return Err(refuse.key(
            "tls_server_config.min_version",
            "min_version is above max_version",
        ));
    }
    let versions: Vec<&'static SupportedProtocolVersion> =
        [(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect();

    let mut crypto: CryptoProvider = provider::default_provider();
    if let Some(names) = &t.cipher_suites {
        let mut tls12 = Vec::new();
        for name in names {
            match tls12_suite(name) {
                Some(s) => tls12.push(s),
                None if TLS13_SUITES.contains(&name.as_str()) => {}
                None => {
                    return Err(refuse.key(
                        "tls_server_config.cipher_suites",
                        format!(
                            "{name}: not a cipher suite rustls implements (its TLS 1.2 suites are \
                             the ECDHE_ECDSA and ECDHE_RSA ones WITH_AES_128_GCM_SHA256, \
                             WITH_AES_256_GCM_SHA384 and WITH_CHACHA20_POLY1305_SHA256)"
                        ),
                    ))
                }
            }
        }
        if !tls12.is_empty() {
            // TLS 1.3 suites are not configurable (Go's rule), so all of them stay.
            let mut suites: Vec<_> = crypto
                .cipher_suites
                .iter()
                .copied()
                .filter(|s| s.tls13().is_some())
                .collect();
            suites.extend(tls12);
            crypto.cipher_suites = suites;
        }
    }
    if let Some(names) = &t.curve_preferences {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for name in names {
            groups.push(match name.as_str() {
                "X25519" => provider::kx_group::X25519,
                "CurveP256" => provider::kx_group::SECP256R1,
                "CurveP384" => provider::kx_group::SECP384R1,
                "CurveP521" => {
                    return Err(refuse.key(
                        "tls_server_config.curve_preferences",
                        "CurveP521: rustls' ring provider has no P-521 key exchange \
                         (X25519, CurveP256, CurveP384)",
                    ))
                }
                other => {
                    return Err(refuse.key(
                        "tls_server_config.curve_preferences",
                        format!("unknown curve {other:?} (X25519, CurveP256, CurveP384)"),
                    ))
                }
            });
        }
        if !groups.is_empty() {
            crypto.kx_groups = groups;
        }
    }
    if t.client_allowed_sans.is_some() {
        return Err(refuse.key(
            "tls_server_config.client_allowed_sans",
            "chd does not match client certificate SANs; restrict clients by the CA in \
             client_ca_file instead",
        ));
    }
    let crypto = Arc::new(crypto);

    let auth = t.client_auth_type.as_deref().unwrap_or("");
    let verify = |optional: bool| -> Result<_, WebConfigError> {
        let Some(pem) = &client_ca else {
            return Err(refuse.key(
                "tls_server_config.client_auth_type",
                format!("{auth} needs client_ca_file (or client_ca) to verify against"),
            ));
        };
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(pem) {
            let c = c.map_err(|e| {
                refuse.key("tls_server_config.client_ca_file", format!("not PEM: {e}"))
            })?;
            roots.add(c).map_err(|e| {
                refuse.key("tls_server_config.client_ca_file", format!("a bad CA: {e}"))
            })?;
        }
        if roots.is_empty() {
            return Err(refuse.key(
                "tls_server_config.client_ca_file",
                "no CERTIFICATE block in it",
            ));
        }
        let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crypto.clone());
        let builder = if optional {
            builder.allow_unauthenticated()
        } else {
            builder
        };
        builder
            .build()
            .map_err(|e| refuse.key("tls_server_config.client_ca_file", e.to_string()))
    };
    let verifier = match auth {
        "" | "NoClientCert" => {
            if client_ca.is_some() {
                return Err(refuse.key(
                    "tls_server_config.client_ca_file",
                    "a client CA without a client_auth_type (use RequireAndVerifyClientCert)",
                ));
            }
            None
        }
        "RequireAndVerifyClientCert" => Some(verify(false)?),
        "VerifyClientCertIfGiven" => Some(verify(true)?),
        "RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert" => {
            return Err(refuse.key(
                "tls_server_config.client_auth_type",
                format!(
                    "{auth}: chd verifies every client certificate it asks for; use \
                     RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file"
                ),
            ))
        }
        other => {
            return Err(refuse.key(
                "tls_server_config.client_auth_type",
                format!(
                    "unknown client auth type {other:?} (NoClientCert, \
                     VerifyClientCertIfGiven, RequireAndVerifyClientCert)"
                ),
            ))
        }
    };

    let builder = ServerConfig::builder_with_provider(crypto)
        .with_protocol_versions(&versions)
        .map_err(|e| refuse.key("tls_server_config.cipher_suites", e.to_string()))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        refuse.key(
            "tls_server_config.key_file",
            format!("the key does not fit the certificate: {e}"),
        )
    })?;
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    // chd serves HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn http(
    refuse: &Refuse,
    h: &HttpServerConfig,
) -> Result<Vec<(HeaderName, HeaderValue)>, WebConfigError> {
    if h.http2 == Some(true) {
        return Err(refuse.key(
            "http_server_config.http2",
            "chd serves HTTP/1.1 only; set http2: false or leave the key out",
        ));
    }
    let mut headers = Vec::new();
    for (name, value) in h.headers.iter().flatten() {
        let key = format!("http_server_config.headers.{name}");
        let Some((_, allowed)) = EXTRA_HEADERS.iter().find(|(n, _)| n == name) else {
            return Err(refuse.key(
                key,
                format!(
                    "this header can not be configured (only {})",
                    EXTRA_HEADERS.map(|(n, _)| n).join(", ")
                ),
            ));
        };
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            return Err(refuse.key(key, format!("{value:?}: expected one of {allowed:?}")));
        }
        if value.is_empty() {
            continue;
        }
        let v = HeaderValue::from_str(value)
            .map_err(|_| refuse.key(key.clone(), "not a valid header value"))?;
        let n = HeaderName::from_str(name)
            .map_err(|_| refuse.key(key.clone(), "not a valid header name"))?;
        headers.push((n, v));
    }
    Ok(headers)
}

fn users(
    refuse: &Refuse,
    users: Option<&BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, WebConfigError> {
    let users = users.cloned().unwrap_or_default();
    for (user, hash) in &users {
        let key = format!("basic_auth_users.{user}");
        if user.contains(':') {
            return Err(refuse.key(
                key,
                "a user name with ':' can never log in (Basic credentials split at the first ':')",
            ));
        }
        bcrypt::HashParts::from_str(hash)
            .map_err(|e| refuse.key(key, format!("not a bcrypt hash: {e}")))?;
    }
    Ok(users)
}

impl WebConfig {
    /// Read and validate the file at `path`.
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let file = WebConfigFile::read(path)?;
        let refuse = Refuse(path);
        if file.rate_limit.is_some() {
            return Err(refuse.key(
                "rate_limit",
                "chd has no request rate limiter (its connections are bounded by \
                 server.max_connections)",
            ));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut files = vec![path.to_path_buf()];
        let tls = match &file.tls_server_config {
            Some(t) => Some(Arc::new(tls(&refuse, dir, t, &mut files)?)),
            None => None,
        };
        let headers = match &file.http_server_config {
            Some(h) => http(&refuse, h)?,
            None => Vec::new(),
        };
        Ok(WebConfig {
            tls,
            users: users(&refuse, file.basic_auth_users.as_ref())?,
            headers,
            files,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory with a self-signed certificate (`server.crt`, `server.key`) and `web.yml`.
    fn config(yaml: &str) -> (tempfile::TempDir, Result<WebConfig, WebConfigError>) {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join("server.crt"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, yaml).unwrap();
        let loaded = WebConfig::load(&path);
        (dir, loaded)
    }

    const TLS: &str = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";

    #[test]
    fn no_file_keys_means_plain_http_without_users() {
        let (_d, c) = config("# empty\n");
        let c = c.unwrap();
        assert!(c.tls.is_none() && c.users.is_empty() && c.headers.is_empty());
    }

    #[test]
    fn cipher_suites_and_curves_are_the_listed_ones_in_order_tls13_kept() {
        let (dir, c) = config(&format!(
            "{TLS}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, \
             TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_AES_128_GCM_SHA256]\n  \
             curve_preferences: [CurveP384, X25519]\n"
        ));
        let c = c.unwrap();
        let tls = c.tls.unwrap();
        let provider = tls.crypto_provider();
        let tls12: Vec<String> = provider
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_none())
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(
            tls12,
            [
                "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
            ]
        );
        assert_eq!(
            provider
                .cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some())
                .count(),
            3
        );
        let groups: Vec<String> = provider
            .kx_groups
            .iter()
            .map(|g| format!("{:?}", g.name()))
            .collect();
        assert_eq!(groups, ["secp384r1", "X25519"]);
        assert!(
            tls.ignore_client_order,
            "prefer_server_cipher_suites defaults to true"
        );
        assert_eq!(
            c.files,
            [
                dir.path().join("web.yml"),
                dir.path().join("server.crt"),
                dir.path().join("server.key")
            ]
        );
    }

    #[test]
    fn min_version_above_max_and_both_cert_sources_are_refused() {
        let (_d, c) = config(&format!(
            "{TLS}  min_version: TLS13\n  max_version: TLS12\n"
        ));
        assert!(c
            .unwrap_err()
            .to_string()
            .contains("tls_server_config.min_version"));
        let (_d, c) = config(&format!("{TLS}  cert: \"-----BEGIN CERTIFICATE-----\"\n"));
        let e = c.unwrap_err().to_string();
        assert!(
            e.contains("tls_server_config.cert_file") && e.contains("not both"),
            "{e}"
        );
    }

    #[test]
    fn inline_certificate_and_key_are_read_like_files() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let indent = |pem: String| {
            pem.lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        };
        let yaml = format!(
            "tls_server_config:\n  cert: |\n{}  key: |\n{}",
            indent(cert.pem()),
            indent(key.serialize_pem())
        );
        let path = dir.path().join("web.yml");
        std::fs::write(&path, yaml).unwrap();
        assert!(WebConfig::load(&path).unwrap().tls.is_some());
    }
}
