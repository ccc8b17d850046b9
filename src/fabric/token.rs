//! The shared secret of one fabric launch and the proofs built from it: each side of a
//! rendezvous connection answers the other's random challenge with HMAC-SHA256 over it, so
//! the token never crosses the wire and a replayed answer does not fit a new challenge.

use std::fmt;
use std::path::Path;

use ring::hmac;

/// Shortest token accepted, in bytes.
pub const MIN_LEN: usize = 16;

/// The token (never printed: `Debug` hides it).
pub struct Token(hmac::Key);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "no token: give --token-file FILE or set CHD_FABRIC_TOKEN (the same secret on every \
         rank, e.g. from a Kubernetes Secret)"
    )]
    Missing,
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the token from {from} is {len} bytes; at least {MIN_LEN} are needed")]
    TooShort { from: String, len: usize },
}

impl Token {
    /// The token from `file` (surrounding whitespace trimmed), else from `env_value`.
    pub fn load(file: Option<&Path>, env_value: Option<String>) -> Result<Token, TokenError> {
        let (secret, from) = match (file, env_value) {
            (Some(path), _) => (
                std::fs::read_to_string(path).map_err(|source| TokenError::Read {
                    path: path.display().to_string(),
                    source,
                })?,
                path.display().to_string(),
            ),
            (None, Some(v)) => (v, "CHD_FABRIC_TOKEN".to_string()),
            (None, None) => return Err(TokenError::Missing),
        };
        let secret = secret.trim();
        if secret.len() < MIN_LEN {
            return Err(TokenError::TooShort {
                from,
                len: secret.len(),
            });
        }
        Ok(Token::from_secret(secret.as_bytes()))
    }

    pub fn from_secret(secret: &[u8]) -> Token {
        Token(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// The proof of knowing the token for `challenge`, bound to what it is for (`role`) and
    /// who answers (`rank`).
    pub fn prove(&self, role: &str, challenge: &str, rank: u32) -> String {
        let tag = hmac::sign(&self.0, Self::message(role, challenge, rank).as_bytes());
        hex(tag.as_ref())
    }

    /// Whether `proof` is [`Token::prove`]'s answer (compared in constant time).
    pub fn verify(&self, role: &str, challenge: &str, rank: u32, proof: &str) -> bool {
        let Some(bytes) = unhex(proof) else {
            return false;
        };
        hmac::verify(
            &self.0,
            Self::message(role, challenge, rank).as_bytes(),
            &bytes,
        )
        .is_ok()
    }

    fn message(role: &str, challenge: &str, rank: u32) -> String {
        format!("chd-fabric-1 {role} {challenge} {rank}")
    }
}

/// A fresh random challenge.
pub fn challenge() -> String {
    let bytes: [u8; 32] = rand::random();
    hex(&bytes)
}

fn hex(bytes: &[u8]) -> String {
    crate::format::hex::encode(bytes)
}

/// A proof's bytes; none for what is not one (odd, not hex, longer than a SHA-256 tag's 64
/// bytes can be).
fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() > 128 || text.trim().len() != text.len() {
        return None;
    }
    crate::format::hex::decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_fits_only_its_token_challenge_role_and_rank() {
        let t = Token::from_secret(b"0123456789abcdef");
        let c = challenge();
        let p = t.prove("rank", &c, 1);
        assert!(t.verify("rank", &c, 1, &p));
        assert!(!t.verify("rank", &c, 2, &p));
        assert!(!t.verify("root", &c, 1, &p));
        assert!(!t.verify("rank", &challenge(), 1, &p));
        assert!(!Token::from_secret(b"fedcba9876543210").verify("rank", &c, 1, &p));
        assert!(!t.verify("rank", &c, 1, "zz"));
        assert_ne!(challenge(), challenge());
    }

    #[test]
    fn tokens_come_from_a_file_or_the_environment_and_are_long_enough() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "  0123456789abcdef0123\n").unwrap();
        assert!(Token::load(Some(&f), None).is_ok());
        assert!(Token::load(None, Some("0123456789abcdef".into())).is_ok());
        assert!(matches!(Token::load(None, None), Err(TokenError::Missing)));
        let e = Token::load(None, Some("short".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CHD_FABRIC_TOKEN is 5 bytes"), "{e}");
        assert!(matches!(
            Token::load(Some(&dir.path().join("none")), None),
            Err(TokenError::Read { .. })
        ));
        assert_eq!(
            format!("{:?}", Token::from_secret(b"secret-secret-secret")),
            "Token(..)"
        );
    }
}
