//! The web config in force, reloaded as exporter-toolkit does (it re-reads the file for every
//! new TLS connection and its users for every request) but cheaper: each request looks at the
//! modification time, size and inode of the config file and of the certificate, key and CA
//! files it names, and only when one changed is the config read and validated again. So a
//! rotated certificate (cert-manager, a renewed Kubernetes Secret) takes effect for the next
//! connection, and a changed password hash or a removed user for the next request, open
//! keep-alive connections included, without a signal. A reload that fails is logged and the
//! config in force stays. So does one that would turn TLS on or off (the listener's scheme is
//! fixed at startup) or basic auth off (users -> none would open every path to anyone, which
//! a mistaken edit should not do silently): both take a restart, and are logged as warnings.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::web_config::{WebConfig, WebConfigError};

/// What a file looked like when it was last read.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f).ok().map(|m| {
                (
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.len(),
                    m.ino(),
                )
            })
        })
        .collect()
}

struct Loaded {
    config: Arc<WebConfig>,
    files: Vec<PathBuf>,
    stamps: Vec<Stamp>,
}

/// The web config file in force and its reloads.
pub struct WebSettings {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

impl WebSettings {
    /// Read and validate `path`; the error names the key at fault.
    pub fn load(path: &Path) -> Result<WebSettings, WebConfigError> {
        let config = WebConfig::load(path)?;
        let files = config.files.clone();
        Ok(WebSettings {
            path: path.to_path_buf(),
            loaded: Mutex::new(Loaded {
                stamps: stamps(&files),
                files,
                config: Arc::new(config),
            }),
        })
    }

    /// The config file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The config for a new connection or request, re-read first when one of its files
    /// changed.
    pub fn current(&self) -> Arc<WebConfig> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamps(&loaded.files);
        if now == loaded.stamps {
            return loaded.config.clone();
        }
        loaded.stamps = now;
        match WebConfig::load(&self.path) {
            Ok(c) if c.tls.is_some() != loaded.config.tls.is_some() => {
                tracing::warn!(
                    path = %self.path.display(),
                    "web config changed whether TLS is on; that takes a restart, keeping the \
                     config in force"
                );
            }
            Ok(c) if c.users.is_empty() && !loaded.config.users.is_empty() => {
                tracing::warn!(
                    path = %self.path.display(),
                    "web config has no basic_auth_users any more, which would turn basic auth \
                     off; that takes a restart, keeping the config in force"
                );
            }
            Ok(c) => {
                tracing::info!(path = %self.path.display(), "web config reloaded");
                loaded.files = c.files.clone();
                loaded.stamps = stamps(&loaded.files);
                loaded.config = Arc::new(c);
            }
            Err(e) => {
                tracing::warn!("web config not reloaded, keeping the one in force: {e}");
            }
        }
        loaded.config.clone()
    }
}
