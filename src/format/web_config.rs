//! The web configuration file Prometheus exporters share (`--web.config.file`): YAML in the
//! schema of prometheus/exporter-toolkit's `web.Config` (`web/tls_config.go`,
//! `docs/web-configuration.md`, checked at commit 0089e786c388f128bd417609a8ba66c20b35176e).
//! Every key of that schema is known here, so what chd cannot honour is refused by name
//! one level up (`exposition::web_config`), and any other key is refused while reading, as
//! the toolkit's `yaml.UnmarshalStrict` does. Values stay as written (strings, lists).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole file. An empty file (or one of comments only) is every key absent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfigFile {
    pub tls_server_config: Option<TlsServerConfig>,
    pub http_server_config: Option<HttpServerConfig>,
    /// User name -> bcrypt hash.
    pub basic_auth_users: Option<BTreeMap<String, String>>,
    /// The toolkit's request rate limiter (`interval`, `burst`); kept raw, chd refuses it.
    pub rate_limit: Option<serde_yaml::Value>,
}

/// `tls_server_config`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsServerConfig {
    /// Inline PEM certificate chain (instead of `cert_file`).
    pub cert: Option<String>,
    /// Inline PEM private key (instead of `key_file`).
    pub key: Option<String>,
    /// Inline PEM client CA certificates (instead of `client_ca_file`).
    pub client_ca: Option<String>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Go's `tls.ClientAuthType` by name, e.g. `RequireAndVerifyClientCert`.
    pub client_auth_type: Option<String>,
    pub client_ca_file: Option<PathBuf>,
    pub client_allowed_sans: Option<Vec<String>>,
    /// `TLS10` .. `TLS13`.
    pub min_version: Option<String>,
    pub max_version: Option<String>,
    /// Go's cipher suite names (`tls.CipherSuites()`), for TLS 1.2 and below.
    pub cipher_suites: Option<Vec<String>>,
    pub prefer_server_cipher_suites: Option<bool>,
    /// `CurveP256`, `CurveP384`, `CurveP521`, `X25519`.
    pub curve_preferences: Option<Vec<String>>,
}

/// `http_server_config`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServerConfig {
    pub http2: Option<bool>,
    /// Extra response headers, by the toolkit's header names.
    pub headers: Option<BTreeMap<String, String>>,
}

/// Why a web config file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigFileError {
    // The source is not repeated in the message: error chains (`{:#}`) print it after.
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", path.display())]
    Yaml {
        path: PathBuf,
        source: serde_yaml::Error,
    },
}

impl WebConfigFile {
    /// Parse the text of a web config file (`path` only names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<WebConfigFile, WebConfigFileError> {
        let yaml = |source| WebConfigFileError::Yaml {
            path: path.to_path_buf(),
            source,
        };
        // An empty document is no mapping at all; the toolkit reads it as all defaults.
        if serde_yaml::from_str::<serde_yaml::Value>(text).map_err(yaml)? == serde_yaml::Value::Null
        {
            return Ok(WebConfigFile::default());
        }
        serde_yaml::from_str(text).map_err(yaml)
    }

    /// Read and parse the file at `path`.
    pub fn read(path: &Path) -> Result<WebConfigFile, WebConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| WebConfigFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        WebConfigFile::parse(path, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WebConfigFile, String> {
        WebConfigFile::parse(Path::new("web.yml"), text).map_err(|e| match e {
            WebConfigFileError::Yaml { source, .. } => source.to_string(),
            other => other.to_string(),
        })
    }

    #[test]
    fn reads_the_toolkit_sample_shape() {
        let f = parse(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  \
             min_version: TLS12\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n\
             http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n\
             basic_auth_users:\n  alice: $2y$10$abc\n",
        )
        .unwrap();
        let tls = f.tls_server_config.unwrap();
        assert_eq!(tls.cert_file, Some(PathBuf::from("server.crt")));
        assert_eq!(
            tls.client_auth_type.as_deref(),
            Some("RequireAndVerifyClientCert")
        );
        assert_eq!(f.http_server_config.unwrap().http2, Some(false));
        assert_eq!(f.basic_auth_users.unwrap()["alice"], "$2y$10$abc");
    }

    #[test]
    fn empty_and_comment_only_files_are_all_defaults() {
        assert_eq!(parse("").unwrap(), WebConfigFile::default());
        assert_eq!(parse("# nothing yet\n").unwrap(), WebConfigFile::default());
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let e = parse("tls_server_config:\n  certfile: a\n").unwrap_err();
        assert!(e.contains("certfile"), "{e}");
        let e = parse("basic_auth:\n  a: b\n").unwrap_err();
        assert!(e.contains("basic_auth"), "{e}");
    }
}
