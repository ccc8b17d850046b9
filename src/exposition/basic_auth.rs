//! HTTP Basic authentication (RFC 7617) against the bcrypt hashes of `basic_auth_users`, as
//! exporter-toolkit does it (`web/handler.go`, `web/cache.go`): an unknown user is checked
//! against a configured hash all the same, so the answer takes as long as for a known user
//! with a wrong password; one bcrypt runs at a time (it is CPU-bound: ~50 ms at cost 10);
//! and successful verifications are cached, so a scraper every 15 s costs one bcrypt, not
//! one per scrape. The cache is bounded ([`CACHE_ENTRIES`]) and holds SHA-256 digests of
//! (user, hash, password), not passwords; a changed hash or a removed user no longer
//! matches. bcrypt's own comparison is constant-time (the `bcrypt` crate compares with
//! `subtle::ConstantTimeEq`). Passwords over 72 bytes are refused, as Go's bcrypt does,
//! rather than truncated.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use hyper::header::HeaderValue;

/// Longest password bcrypt reads; Go's bcrypt refuses longer ones (`ErrPasswordTooLong`)
/// where the `bcrypt` crate's `verify` would cut them.
const MAX_PASSWORD_BYTES: usize = 72;

/// Most verified credentials remembered; at the cap one is forgotten for each new one.
pub const CACHE_ENTRIES: usize = 100;

/// The verifier with its cache, shared by every connection and kept across reloads.
#[derive(Default)]
pub struct BasicAuth {
    verified: Mutex<HashSet<[u8; 32]>>,
    bcrypt: Mutex<()>,
}

/// User and password of an `Authorization: Basic` header.
fn credentials(header: &HeaderValue) -> Option<(String, Vec<u8>)> {
    let value = header.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

/// Digest of one (user, hash, password), each length-prefixed so no two triples collide.
fn cache_key(user: &str, hash: &str, password: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user.as_bytes(), hash.as_bytes(), password] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part);
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

impl BasicAuth {
    fn cache(&self) -> MutexGuard<'_, HashSet<[u8; 32]>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, key: [u8; 32]) {
        let mut cache = self.cache();
        if cache.len() >= CACHE_ENTRIES {
            if let Some(old) = cache.iter().next().copied() {
                cache.remove(&old);
            }
        }
        cache.insert(key);
    }

    /// How many verified credentials are remembered.
    pub fn cached(&self) -> usize {
        self.cache().len()
    }

    /// Whether `authorization` names one of `users` with its password. `users` must not be
    /// empty (no users: no authentication, decided by the caller). bcrypt runs on the
    /// blocking pool.
    pub async fn authorized(
        self: &Arc<Self>,
        users: &BTreeMap<String, String>,
        authorization: Option<&HeaderValue>,
    ) -> bool {
        let Some((user, password)) = authorization.and_then(credentials) else {
            return false;
        };
        let (hash, known) = match users.get(&user) {
            Some(h) => (h.clone(), true),
            // An unknown user costs a bcrypt too (no user enumeration by timing).
            None => match users.values().next() {
                Some(h) => (h.clone(), false),
                None => return false,
            },
        };
        let key = cache_key(&user, &hash, &password);
        if known && self.cache().contains(&key) {
            return true;
        }
        let me = self.clone();
        let verify = move || {
            let matches = {
                let _one_at_a_time = me.bcrypt.lock().unwrap_or_else(|p| p.into_inner());
                password.len() <= MAX_PASSWORD_BYTES
                    && bcrypt::verify(&password, &hash).unwrap_or(false)
            };
            let ok = matches && known;
            if ok {
                me.remember(key);
            }
            ok
        };
        tokio::task::spawn_blocking(verify).await.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_pass: &str) -> HeaderValue {
        let token = base64::engine::general_purpose::STANDARD.encode(user_pass);
        HeaderValue::from_str(&format!("Basic {token}")).unwrap()
    }

    fn users() -> BTreeMap<String, String> {
        // Cost 4, the least bcrypt allows: these tests check logic, not hashing time.
        [
            ("alice".to_string(), bcrypt::hash("s3cret", 4).unwrap()),
            ("bob".to_string(), bcrypt::hash("hunter2", 4).unwrap()),
        ]
        .into()
    }

    #[tokio::test]
    async fn right_password_passes_and_is_cached_wrong_ones_are_not() {
        let auth = Arc::new(BasicAuth::default());
        let users = users();
        assert!(auth.authorized(&users, Some(&basic("alice:s3cret"))).await);
        assert_eq!(auth.cached(), 1);
        assert!(auth.authorized(&users, Some(&basic("alice:s3cret"))).await);
        assert_eq!(auth.cached(), 1, "a second success is a cache hit");
        assert!(!auth.authorized(&users, Some(&basic("alice:hunter2"))).await);
        assert!(!auth.authorized(&users, Some(&basic("alice:"))).await);
        assert!(!auth.authorized(&users, Some(&basic("carol:s3cret"))).await);
        // bob's password for an unknown user is checked against some hash but never passes.
        assert!(!auth.authorized(&users, Some(&basic("carol:hunter2"))).await);
        assert!(!auth.authorized(&users, None).await);
        assert_eq!(auth.cached(), 1, "failures are never remembered");
    }

    #[tokio::test]
    async fn a_changed_hash_invalidates_the_cached_success() {
        let auth = Arc::new(BasicAuth::default());
        let mut users = users();
        assert!(auth.authorized(&users, Some(&basic("alice:s3cret"))).await);
        users.insert("alice".into(), bcrypt::hash("new one", 4).unwrap());
        assert!(!auth.authorized(&users, Some(&basic("alice:s3cret"))).await);
        assert!(auth.authorized(&users, Some(&basic("alice:new one"))).await);
        users.remove("alice");
        assert!(!auth.authorized(&users, Some(&basic("alice:new one"))).await);
    }

    #[test]
    fn the_header_is_parsed_as_rfc_7617_says() {
        let h = |s: &str| credentials(&HeaderValue::from_str(s).unwrap());
        // "alice:pa:ss" -> the password keeps its colon.
        assert_eq!(
            h("basic YWxpY2U6cGE6c3M="),
            Some(("alice".into(), b"pa:ss".to_vec()))
        );
        assert_eq!(h("Bearer YWxpY2U6cGE6c3M="), None);
        assert_eq!(h("Basic not-base64!"), None);
        assert_eq!(h("Basic YWxpY2U="), None, "no colon");
    }

    #[test]
    fn the_cache_stays_bounded() {
        let auth = BasicAuth::default();
        for i in 0..(CACHE_ENTRIES as u64 * 3) {
            auth.remember(cache_key("u", "h", &i.to_le_bytes()));
        }
        assert_eq!(auth.cached(), CACHE_ENTRIES);
    }

    #[tokio::test]
    async fn passwords_beyond_72_bytes_are_refused_not_truncated() {
        let auth = Arc::new(BasicAuth::default());
        let long = "x".repeat(72);
        let users: BTreeMap<_, _> = [("u".to_string(), bcrypt::hash(&long, 4).unwrap())].into();
        assert!(
            auth.authorized(&users, Some(&basic(&format!("u:{long}"))))
                .await
        );
        assert!(
            !auth
                .authorized(&users, Some(&basic(&format!("u:{long}y"))))
                .await
        );
    }
}
