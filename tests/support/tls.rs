//! Test support for TLS: a throwaway PKI made with rcgen (a CA, a server certificate for
//! 127.0.0.1 and localhost, a client certificate from the CA and one from a stranger CA),
//! bcrypt hashes, web config files, and curl to talk to a server with them. curl must be
//! installed (scripts/test.sh checks); a missing curl fails the test with that message.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// The files of a test PKI, in one directory.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate from a CA the server does not trust.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    dir: &Path,
    name: &str,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> (PathBuf, PathBuf) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

impl Pki {
    /// Make a PKI in `dir`.
    pub fn new(dir: &Path) -> Pki {
        let authority = ca("chd test CA");
        let stranger = ca("stranger CA");
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, authority.pem()).unwrap();
        let (server_cert, server_key) = leaf(
            dir,
            "server",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &authority,
        );
        let (client_cert, client_key) = leaf(
            dir,
            "client",
            &["prometheus"],
            ExtendedKeyUsagePurpose::ClientAuth,
            &authority,
        );
        let (stranger_cert, stranger_key) = leaf(
            dir,
            "stranger",
            &["prometheus"],
            ExtendedKeyUsagePurpose::ClientAuth,
            &stranger,
        );
        Pki {
            dir: dir.to_path_buf(),
            ca,
            server_cert,
            server_key,
            client_cert,
            client_key,
            stranger_cert,
            stranger_key,
        }
    }
}

/// A bcrypt hash of `password` at cost 4 (bcrypt's least: tests check logic, not hashing).
pub fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash(password, 4).unwrap()
}

/// Write `text` as `name` in `dir`; returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Run curl with `args` (`-sS` added); panics with an install hint when curl is missing.
pub fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .arg("-sS")
        .args(["--max-time", "20"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("curl is required for this test (apt-get install curl): {e}"))
}

/// The HTTP status curl got (`-w %{http_code}`), or None when the request failed.
pub fn status(args: &[&str]) -> Option<u16> {
    let mut all = vec!["-o", "/dev/null", "-w", "%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(&all);
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}
