//! HTTP Basic authentication (RFC 7617) against the bcrypt hashes of `basic_auth_users`, as
//! exporter-toolkit does it (`web/handler.go`, `web/cache.go`), with its costs bounded
//! (issue 30). An unknown user is checked against a decoy, the configured hash of the highest
//! cost, so the answer takes as long as the slowest known user's (no user enumeration by
//! timing). Successful verifications are cached, so a scraper every 15 s costs one bcrypt,
//! not one per scrape; so are failed ones, so a client repeating a wrong password costs one
//! bcrypt, not one per request ([`Refusal::Repeated`]). Both caches are bounded
//! ([`CACHE_ENTRIES`], [`FAILURE_ENTRIES`]) and hold SHA-256 digests of (user, hash,
//! password), never passwords; a changed hash or a removed user no longer matches. Every
//! other check runs on one thread of its own behind a bounded queue
//! ([`super::bcrypt_worker`]): a request that finds no room, or whose client address has a
//! check pending already, is answered at once ([`Refusal::Busy`], 503), and a cached valid
//! login never waits for anyone's bcrypt. bcrypt's own comparison is constant-time (the
//! `bcrypt` crate compares with `subtle::ConstantTimeEq`). Passwords over 72 bytes are refused,
//! as Go's bcrypt does, rather than truncated.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use base64::Engine;
use hyper::header::HeaderValue;

use super::bcrypt_worker::{BcryptWorker, Verify};

/// Longest password bcrypt reads; Go's bcrypt refuses longer ones (`ErrPasswordTooLong`)
/// where the `bcrypt` crate's `verify` would cut them.
const MAX_PASSWORD_BYTES: usize = 72;

/// Most verified credentials remembered; at the cap one is forgotten for each new one.
pub const CACHE_ENTRIES: usize = 100;

/// Most failed credentials remembered (32 bytes each); at the cap the oldest is forgotten.
pub const FAILURE_ENTRIES: usize = 1024;

/// Why a request was not let in (`reason` of `chd_http_auth_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Basic` header, or one that does not decode to `user:password`.
    Missing,
    /// bcrypt ran and the password did not match (an unknown user's included), or it is
    /// longer than bcrypt reads.
    Wrong,
    /// Credentials that failed before, answered from the cache of failures without bcrypt.
    Repeated,
    /// Not checked: the bcrypt queue is full, or a check from the same address is pending
    /// (answered 503, to be retried).
    Busy,
}

impl Refusal {
    /// Every refusal, in the order of their labels' documentation.
    pub const ALL: [Refusal; 4] = [
        Refusal::Missing,
        Refusal::Wrong,
        Refusal::Repeated,
        Refusal::Busy,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Wrong => "wrong",
            Refusal::Repeated => "repeated",
            Refusal::Busy => "busy",
        }
    }
}

/// Digests of recent failures, the oldest forgotten first.
#[derive(Default)]
struct Failures {
    keys: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl Failures {
    fn insert(&mut self, key: [u8; 32]) {
        if !self.keys.insert(key) {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > FAILURE_ENTRIES {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }
}

/// The verifier with its caches, shared by every connection and kept across reloads.
pub struct BasicAuth {
    verified: Mutex<HashSet<[u8; 32]>>,
    failed: Mutex<Failures>,
    verify: Verify,
    /// Started at the first check that needs it; `None` if the thread could not start.
    worker: OnceLock<Option<BcryptWorker>>,
}

impl Default for BasicAuth {
    fn default() -> BasicAuth {
        BasicAuth::with_verifier(Arc::new(|password, hash| {
            bcrypt::verify(password, hash).unwrap_or(false)
        }))
    }
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

/// The hash an unknown user is checked against: the configured one of the highest cost (the
/// first of them), so an unknown name costs as long as the slowest known one.
fn decoy(users: &BTreeMap<String, String>) -> Option<&String> {
    let cost = |h: &String| bcrypt::HashParts::from_str(h).map_or(0, |p| p.get_cost());
    users
        .values()
        .fold(None, |best: Option<&String>, h| match best {
            Some(b) if cost(b) >= cost(h) => Some(b),
            _ => Some(h),
        })
}

impl BasicAuth {
    /// A verifier that checks passwords with `verify` (bcrypt in chd; tests give their own).
    pub fn with_verifier(verify: Verify) -> BasicAuth {
        BasicAuth {
            verified: Mutex::new(HashSet::new()),
            failed: Mutex::new(Failures::default()),
            verify,
            worker: OnceLock::new(),
        }
    }

    fn cache(&self) -> MutexGuard<'_, HashSet<[u8; 32]>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failures(&self) -> MutexGuard<'_, Failures> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
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

    fn worker(&self) -> Option<&BcryptWorker> {
        self.worker
            .get_or_init(|| match BcryptWorker::start(self.verify.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::error!("cannot start the bcrypt thread, refusing logins: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// How many verified credentials are remembered.
    pub fn cached(&self) -> usize {
        self.cache().len()
    }

    /// How many failed credentials are remembered.
    pub fn cached_failures(&self) -> usize {
        self.failures().order.len()
    }

    /// Whether `authorization` names one of `users` with its password, for a request from
    /// `peer`; `Err` says why not. `users` must not be empty (no users: no authentication,
    /// decided by the caller). Waits only for this request's own bcrypt, if it needs one.
    pub async fn check(
        &self,
        users: &BTreeMap<String, String>,
        authorization: Option<&HeaderValue>,
        peer: IpAddr,
    ) -> Result<(), Refusal> {
        let (user, password) = authorization
            .and_then(credentials)
            .ok_or(Refusal::Missing)?;
        let (hash, known) = match users.get(&user) {
            Some(h) => (h, true),
            None => (decoy(users).ok_or(Refusal::Wrong)?, false),
        };
        let key = cache_key(&user, hash, &password);
        if known && self.cache().contains(&key) {
            return Ok(());
        }
        if self.failures().keys.contains(&key) {
            return Err(Refusal::Repeated);
        }
        if password.len() > MAX_PASSWORD_BYTES {
            self.failures().insert(key);
            return Err(Refusal::Wrong);
        }
        let answer = self
            .worker()
            .ok_or(Refusal::Busy)?
            .submit(peer, hash.clone(), password)
            .map_err(|_| Refusal::Busy)?;
        let matches = answer.await.map_err(|_| Refusal::Busy)?;
        if matches && known {
            self.remember(key);
            Ok(())
        } else {
            self.failures().insert(key);
            Err(Refusal::Wrong)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::bcrypt_worker::gate::Gate;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

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

    async fn check(
        auth: &BasicAuth,
        users: &BTreeMap<String, String>,
        up: &str,
    ) -> Result<(), Refusal> {
        auth.check(users, Some(&basic(up)), PEER).await
    }

    #[tokio::test]
    async fn right_password_passes_and_is_cached_wrong_ones_are_cached_as_failures() {
        let auth = BasicAuth::default();
        let users = users();
        assert_eq!(check(&auth, &users, "alice:s3cret").await, Ok(()));
        assert_eq!(auth.cached(), 1);
        assert_eq!(check(&auth, &users, "alice:s3cret").await, Ok(()));
        assert_eq!(auth.cached(), 1, "a second success is a cache hit");
        assert_eq!(
            check(&auth, &users, "alice:hunter2").await,
            Err(Refusal::Wrong)
        );
        assert_eq!(check(&auth, &users, "alice:").await, Err(Refusal::Wrong));
        assert_eq!(
            check(&auth, &users, "carol:s3cret").await,
            Err(Refusal::Wrong)
        );
        // bob's password for an unknown user is checked against some hash but never passes.
        assert_eq!(
            check(&auth, &users, "carol:hunter2").await,
            Err(Refusal::Wrong)
        );
        assert_eq!(auth.check(&users, None, PEER).await, Err(Refusal::Missing));
        assert_eq!(
            auth.check(&users, Some(&HeaderValue::from_static("Bearer x")), PEER)
                .await,
            Err(Refusal::Missing)
        );
        assert_eq!(auth.cached(), 1, "failures are not successes");
        assert_eq!(auth.cached_failures(), 4);
        // The same wrong credentials again: answered from the failures, no bcrypt.
        assert_eq!(
            check(&auth, &users, "alice:hunter2").await,
            Err(Refusal::Repeated)
        );
        assert_eq!(
            check(&auth, &users, "carol:hunter2").await,
            Err(Refusal::Repeated)
        );
        assert_eq!(auth.cached_failures(), 4);
        assert_eq!(check(&auth, &users, "alice:s3cret").await, Ok(()));
    }

    #[tokio::test]
    async fn a_changed_hash_invalidates_the_cached_success_and_failure() {
        let auth = BasicAuth::default();
        let mut users = users();
        assert_eq!(check(&auth, &users, "alice:s3cret").await, Ok(()));
        assert_eq!(
            check(&auth, &users, "alice:new one").await,
            Err(Refusal::Wrong)
        );
        users.insert("alice".into(), bcrypt::hash("new one", 4).unwrap());
        assert_eq!(
            check(&auth, &users, "alice:s3cret").await,
            Err(Refusal::Wrong)
        );
        assert_eq!(check(&auth, &users, "alice:new one").await, Ok(()));
        users.remove("alice");
        assert_eq!(
            check(&auth, &users, "alice:new one").await,
            Err(Refusal::Wrong)
        );
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
    fn the_caches_stay_bounded() {
        let auth = BasicAuth::default();
        for i in 0..(CACHE_ENTRIES as u64 * 3) {
            auth.remember(cache_key("u", "h", &i.to_le_bytes()));
        }
        assert_eq!(auth.cached(), CACHE_ENTRIES);
        for i in 0..(FAILURE_ENTRIES as u64 * 3) {
            auth.failures()
                .insert(cache_key("u", "h", &i.to_le_bytes()));
        }
        assert_eq!(auth.cached_failures(), FAILURE_ENTRIES);
        assert_eq!(auth.failures().keys.len(), FAILURE_ENTRIES);
        // The oldest went first.
        let newest = cache_key("u", "h", &(FAILURE_ENTRIES as u64 * 3 - 1).to_le_bytes());
        let oldest = cache_key("u", "h", &0u64.to_le_bytes());
        assert!(auth.failures().keys.contains(&newest));
        assert!(!auth.failures().keys.contains(&oldest));
    }

    #[tokio::test]
    async fn passwords_beyond_72_bytes_are_refused_not_truncated() {
        let auth = BasicAuth::default();
        let long = "x".repeat(72);
        let users: BTreeMap<_, _> = [("u".to_string(), bcrypt::hash(&long, 4).unwrap())].into();
        assert_eq!(check(&auth, &users, &format!("u:{long}")).await, Ok(()));
        assert_eq!(
            check(&auth, &users, &format!("u:{long}y")).await,
            Err(Refusal::Wrong)
        );
    }

    #[tokio::test]
    async fn an_unknown_user_is_checked_against_the_costliest_hash() {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let auth = BasicAuth::with_verifier(Arc::new(move |_, hash| {
            log.lock().unwrap().push(hash.to_string());
            false
        }));
        let cheap = bcrypt::hash("a", 4).unwrap();
        let dear = bcrypt::hash("b", 6).unwrap();
        // The cheap hash's user sorts first, where the old decoy (the first hash) was.
        let users: BTreeMap<_, _> = [
            ("aaron".to_string(), cheap.clone()),
            ("zed".to_string(), dear.clone()),
            ("zoe".to_string(), bcrypt::hash("c", 5).unwrap()),
        ]
        .into();
        assert_eq!(check(&auth, &users, "mallory:x").await, Err(Refusal::Wrong));
        assert_eq!(check(&auth, &users, "aaron:x").await, Err(Refusal::Wrong));
        assert_eq!(*seen.lock().unwrap(), [dear, cheap]);
    }

    /// The future's output if it is ready at its first poll: answered without waiting.
    fn poll_once<F: std::future::Future>(f: F) -> Option<F::Output> {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    /// Issue 30: a valid login must not wait for other clients' failed checks. With the
    /// bcrypt thread held in a check and its queue full of wrong passwords from 30 clients,
    /// a cached valid login, a repeated wrong password and a new login from a full queue
    /// are all answered while not one of those checks has finished.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_login_waits_for_other_clients_failed_checks() {
        let gate = Arc::new(Gate::default());
        let bcrypt = |password: &[u8], hash: &str| bcrypt::verify(password, hash).unwrap_or(false);
        let auth = Arc::new(BasicAuth::with_verifier(gate.verifier(bcrypt)));
        let users = Arc::new(users());
        gate.set(true);
        assert_eq!(check(&auth, &users, "alice:s3cret").await, Ok(()));
        assert_eq!(
            check(&auth, &users, "alice:wrong").await,
            Err(Refusal::Wrong)
        );
        gate.set(false);
        let before = gate.finished();
        assert_eq!(gate.entered(), before, "no check held yet");

        // 30 clients, each from its own address, each with a new wrong password.
        let mut flood = Vec::new();
        for n in 0..30u8 {
            let (auth, users) = (auth.clone(), users.clone());
            flood.push(tokio::spawn(async move {
                let peer = IpAddr::from([10, 0, 0, n]);
                let header = basic(&format!("bob:wrong{n}"));
                auth.check(&users, Some(&header), peer).await
            }));
        }
        // Wait (by work, not time) until the bcrypt thread holds a check at the gate, so the
        // queue can only fill, then until it is full: a new address is refused. Each probe
        // comes from an address of its own and is polled once (one that was queued stays
        // queued, unanswered, and is skipped later).
        while gate.entered() == before {
            tokio::task::yield_now().await;
        }
        for probe in 0u16.. {
            let [hi, lo] = probe.to_be_bytes();
            let header = basic(&format!("bob:probe{probe}"));
            let peer = IpAddr::from([10, 1, hi, lo]);
            if poll_once(auth.check(&users, Some(&header), peer)) == Some(Err(Refusal::Busy)) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            poll_once(check(&auth, &users, "alice:s3cret")),
            Some(Ok(()))
        );
        assert_eq!(
            poll_once(check(&auth, &users, "alice:wrong")),
            Some(Err(Refusal::Repeated))
        );
        assert_eq!(
            poll_once(check(&auth, &users, "alice:new")),
            Some(Err(Refusal::Busy)),
            "a new check from a full queue is refused, not queued"
        );
        assert_eq!(gate.finished(), before, "something waited for a check");

        gate.set(true);
        let mut outcomes = Vec::new();
        for f in flood {
            outcomes.push(f.await.unwrap());
        }
        let wrong = outcomes
            .iter()
            .filter(|o| **o == Err(Refusal::Wrong))
            .count();
        let busy = outcomes
            .iter()
            .filter(|o| **o == Err(Refusal::Busy))
            .count();
        assert_eq!(wrong + busy, 30, "{outcomes:?}");
        assert!(
            wrong <= 1 + crate::exposition::bcrypt_worker::QUEUE,
            "at most the running check and the queue were checked: {outcomes:?}"
        );
    }
}
