//! How `--url` reaches a node's `chd serve` (TLS trust, client certificate, basic auth): one
//! flag set flattened into `chd advise`, `chd check` and `chd ledger`, translated into
//! `commands::fetch::ClientRequest` (which checks it).

use std::path::PathBuf;

use clap::Args;

use crate::commands::fetch::{ClientRequest, Remote};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Reaching a node (--url)")]
pub struct ClientArgs {
    /// With an https:// --url: trust the CA certificates of this PEM file (the node's
    /// tls_server_config CA) instead of the Mozilla root certificates compiled into chd
    /// (webpki-roots; the system's store is not read: for a CA it holds, give
    /// /etc/ssl/certs/ca-certificates.crt).
    #[arg(long, value_name = "FILE", requires = "url")]
    pub ca_file: Option<PathBuf>,
    /// With an https:// --url: present this client certificate (PEM, the chain from the leaf
    /// up), for a node whose web config sets client_ca_file; needs --key-file.
    #[arg(long, value_name = "FILE", requires = "url", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The private key of --cert-file (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Basic auth as NAME (the node's basic_auth_users); the password is the first line of
    /// --password-file, else the environment variable CHD_PASSWORD (never a flag: it would
    /// show in ps). Over plain http:// it goes in clear text (chd warns).
    #[arg(long, value_name = "NAME", requires = "url")]
    pub user: Option<String>,
    /// The file whose first line is --user's password (a trailing newline is not part of it).
    #[arg(long, value_name = "FILE", requires = "user")]
    pub password_file: Option<PathBuf>,
}

impl ClientArgs {
    /// The first of these flags given, if any. (clap's `requires = "url"` holds only while no
    /// flag that conflicts with `--url` is given, so [`crate::cli::Cli::check_usage`] asks.)
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.ca_file.is_some(), "--ca-file"),
            (self.cert_file.is_some(), "--cert-file"),
            (self.key_file.is_some(), "--key-file"),
            (self.user.is_some(), "--user"),
            (self.password_file.is_some(), "--password-file"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// `url` reached as these flags say.
    pub fn remote(&self, url: &str) -> Remote {
        Remote {
            url: url.to_string(),
            client: ClientRequest {
                ca_file: self.ca_file.clone(),
                cert: self.cert_file.clone().zip(self.key_file.clone()),
                user: self.user.clone(),
                password_file: self.password_file.clone(),
            },
        }
    }
}
