//! API keys: who may use which locks. No HTTP in here; the middleware in
//! [`crate::http::auth`] asks [`Auth`].
//!
//! The keys file (`--auth-keys-file`, TOML) lists keys; `lockd keygen`
//! writes its entries:
//!
//! ```toml
//! [[keys]]
//! id = "billing-worker"
//! secret_sha256 = "<64 hex digits: SHA-256 of the secret>"
//! prefixes = ["billing:"]          # or ["*"] for every lock name
//! permissions = ["acquire", "extend", "release", "read"]
//! requests_per_second = 50         # optional: a rate limit for this key
//! ```
//!
//! Only the SHA-256 of a secret is stored, never the secret. A client sends
//! the secret as `Authorization: Bearer <secret>` (RFC 6750). The presented
//! secret is hashed and compared with every key's hash in constant time
//! (`subtle`), so neither the comparison nor which key matched shows in the
//! time taken.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// `POST /locks/{name}`: take a lock (or renew one's own).
    Acquire,
    /// `PATCH /locks/{name}`: extend a lease.
    Extend,
    /// `DELETE /locks/{name}`: release a lock.
    Release,
    /// `GET /locks/{name}` and `GET /semaphores/{name}`: see who holds a
    /// lock or permits; `GET /locks` and `GET /semaphores`: list them;
    /// `GET .../events`: watch them.
    Read,
    /// `GET /metrics` on the main listener.
    Metrics,
    /// `DELETE /locks/{name}?force=true` (and a semaphore's, a run's):
    /// break a lease whatever its token. Nothing else: an operator's key
    /// takes `read` beside it to see what it breaks.
    Admin,
}

impl Permission {
    /// The word used in the keys file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::Read => "read",
            Self::Metrics => "metrics",
            Self::Admin => "admin",
        }
    }
}

/// One API key, as the keys file gives it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// A name for the key, unique in the file; logged with each request.
    pub id: String,
    /// The SHA-256 of the secret, as 64 hex digits.
    pub secret_sha256: String,
    /// The lock-name prefixes the key may use, such as `billing:`; `*` is
    /// every name.
    pub prefixes: Vec<String>,
    /// What the key may do.
    pub permissions: Vec<Permission>,
    /// Most requests per second for this key (a burst of as many is
    /// allowed); beyond it, 429. Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u32>,
}

impl KeyEntry {
    /// The entry as a `[[keys]]` table of a keys file, after a blank line,
    /// as `lockd keygen` appends it.
    pub fn to_toml(&self) -> String {
        // A JSON string is a valid TOML basic string; quoting a `str`
        // cannot fail.
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let list = |items: &mut dyn Iterator<Item = &str>| {
            format!("[{}]", items.map(quote).collect::<Vec<_>>().join(", "))
        };
        let rate = self
            .requests_per_second
            .map(|r| format!("requests_per_second = {r}\n"))
            .unwrap_or_default();
        format!(
            "\n[[keys]]\nid = {}\nsecret_sha256 = {}\nprefixes = {}\npermissions = {}\n{rate}",
            quote(&self.id),
            quote(&self.secret_sha256),
            list(&mut self.prefixes.iter().map(String::as_str)),
            list(&mut self.permissions.iter().map(|p| p.as_str())),
        )
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

/// A checked key.
#[derive(Debug, Clone)]
pub struct Key {
    /// The key's id.
    pub id: Arc<str>,
    digest: [u8; 32],
    prefixes: Vec<String>,
    permissions: HashSet<Permission>,
    /// GCRA over `requests_per_second` (the `governor` crate).
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
}

impl Key {
    /// Counts one request against the key's rate limit: `Err(wait)` when it
    /// is over, `wait` being how long until one more is allowed.
    ///
    /// # Errors
    /// The wait, when the key is over its limit.
    pub fn spend(&self) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Whether the key has `permission`.
    pub fn may(&self, permission: Permission) -> bool {
        self.permissions.contains(&permission)
    }

    /// Whether `name` falls under one of the key's prefixes.
    pub fn covers(&self, name: &str) -> bool {
        self.prefixes
            .iter()
            .any(|p| p == "*" || name.starts_with(p.as_str()))
    }

    /// The names this key may list: every name with the prefix `*`, else
    /// those under its prefixes.
    pub fn list_scope(&self) -> ListScope {
        if self.prefixes.iter().any(|p| p == "*") {
            ListScope::Every
        } else {
            ListScope::Under(self.prefixes.clone())
        }
    }
}

/// The names a caller may list (`GET /locks`, `GET /semaphores`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListScope {
    /// Every name: API keys are off, or the key has the prefix `*`.
    Every,
    /// Only names under these prefixes (a key's).
    Under(Vec<String>),
}

/// A listing asked for a prefix outside the caller's (403).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this API key may not list this prefix: it is outside the key's prefixes")]
pub struct OutsideScope;

impl ListScope {
    /// The prefixes a listing that asks for `asked` (empty: no prefix)
    /// walks, one after another. [`ListScope::Every`]: `asked` alone.
    /// [`ListScope::Under`]: `asked` alone when it lies under one of the
    /// prefixes (it starts with one), or with no prefix asked, the
    /// prefixes themselves, sorted, without those under another (so that
    /// no name is listed twice).
    ///
    /// # Errors
    /// [`OutsideScope`] when `asked` lies under none of the prefixes.
    pub fn prefixes(&self, asked: &str) -> Result<Vec<String>, OutsideScope> {
        let ListScope::Under(mine) = self else {
            return Ok(vec![asked.to_owned()]);
        };
        if !asked.is_empty() {
            return if mine.iter().any(|p| asked.starts_with(p.as_str())) {
                Ok(vec![asked.to_owned()])
            } else {
                Err(OutsideScope)
            };
        }
        let mut walk: Vec<String> = mine
            .iter()
            .filter(|p| !mine.iter().any(|q| q != *p && p.starts_with(q.as_str())))
            .cloned()
            .collect();
        walk.sort();
        walk.dedup();
        Ok(walk)
    }
}

/// Why the keys file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The file could not be read.
    #[error("cannot read the keys file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("invalid keys file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (never a secret: the file holds none).
        message: String,
    },
}

impl KeysError {
    /// What is wrong, without the file's name: for a refusal of an entry
    /// the caller made itself (`lockd keygen`'s flags), where the file is
    /// not at fault.
    pub fn message(&self) -> String {
        match self {
            Self::Parse { message, .. } => message.clone(),
            Self::Read { .. } => self.to_string(),
        }
    }
}

/// The keys of one keys file.
#[derive(Debug, Default)]
pub struct KeyRing {
    keys: Vec<Key>,
}

impl KeyRing {
    /// Parses and checks a keys file's text. `path` is only for messages.
    ///
    /// # Errors
    /// [`KeysError::Parse`] for bad TOML, an unknown field or permission, an
    /// empty or repeated id, a hash that is not 64 hex digits, a hash used
    /// twice, a key with no prefix or no permission, or an empty prefix.
    pub fn parse(text: &str, path: &Path) -> Result<Self, KeysError> {
        let bad = |message: String| KeysError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let file: KeysFile = toml_parse(text).map_err(bad)?;
        let mut ids = HashSet::new();
        let mut digests = HashSet::new();
        let mut keys = Vec::with_capacity(file.keys.len());
        for entry in file.keys {
            let key = check_entry(entry).map_err(bad)?;
            if !ids.insert(key.id.clone()) {
                return Err(bad(format!("the id {:?} is used twice", key.id)));
            }
            if !digests.insert(key.digest) {
                return Err(bad(format!(
                    "key {:?} has the same secret_sha256 as an earlier key",
                    key.id
                )));
            }
            keys.push(key);
        }
        Ok(Self { keys })
    }

    /// Reads and parses `path`.
    ///
    /// # Errors
    /// As [`KeyRing::parse`], and [`KeysError::Read`].
    pub fn load(path: &Path) -> Result<Self, KeysError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeysError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Whether a key has the id `id`.
    pub fn has_id(&self, id: &str) -> bool {
        self.keys.iter().any(|k| &*k.id == id)
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none (every request is then refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key whose secret is `secret`, if any. The secret's SHA-256 is
    /// compared with every key's in constant time, and every key is looked
    /// at whatever matched.
    pub fn find(&self, secret: &str) -> Option<&Key> {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.digest.ct_eq(&digest)) {
                found = Some(key);
            }
        }
        found
    }
}

fn toml_parse(text: &str) -> Result<KeysFile, String> {
    use figment::Figment;
    use figment::providers::{Format as _, Toml};
    Figment::from(Toml::string(text))
        .extract::<KeysFile>()
        .map_err(|e| one_line(&e.to_string()))
}

/// A TOML error on one line: its place and what was expected, without the
/// excerpt of the file and its caret.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with('|')
                && !l.split_once('|').is_some_and(|(n, _)| {
                    !n.trim().is_empty() && n.trim().bytes().all(|b| b.is_ascii_digit())
                })
                && *l != "in TOML source string"
        })
        .collect::<Vec<_>>()
        .join(": ")
        .replace(" in TOML source string", "")
        .replace("\"default.", "\"")
}

fn check_entry(entry: KeyEntry) -> Result<Key, String> {
    let id = entry.id.trim();
    if id.is_empty() || id.len() > 100 || id.chars().any(char::is_control) {
        return Err("every key needs an id of 1 to 100 printable characters".into());
    }
    let digest = decode_hex(&entry.secret_sha256).ok_or_else(|| {
        format!("key {id:?}: secret_sha256 must be 64 hex digits (the SHA-256 of the secret)")
    })?;
    if entry.prefixes.is_empty() || entry.prefixes.iter().any(String::is_empty) {
        return Err(format!(
            "key {id:?}: prefixes must list at least one non-empty prefix (\"*\" for every name)"
        ));
    }
    // A prefix no name can start with would let the key use nothing.
    if let Some(bad) = entry
        .prefixes
        .iter()
        .find(|p| *p != "*" && !crate::lock::LockName::fits(p))
    {
        return Err(format!(
            "key {id:?}: prefix {bad:?} can start no lock name (names are ASCII letters, digits and ._-:@, at most {} characters); give \"*\" alone for every name",
            crate::lock::LockName::MAX_LEN
        ));
    }
    if entry.permissions.is_empty() {
        return Err(format!("key {id:?}: permissions must list at least one"));
    }
    let limiter = match entry.requests_per_second {
        None => None,
        Some(rate) => {
            let rate = NonZeroU32::new(rate).ok_or_else(|| {
                format!(
                    "key {id:?}: requests_per_second must be at least 1 (leave it out for no limit)"
                )
            })?;
            Some(Arc::new(RateLimiter::direct(Quota::per_second(rate))))
        }
    };
    Ok(Key {
        id: Arc::from(id),
        digest,
        prefixes: entry.prefixes,
        permissions: entry.permissions.into_iter().collect(),
        limiter,
    })
}

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0_u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The SHA-256 of `secret`, as 64 lowercase hex digits: what a keys file
/// stores.
pub fn secret_sha256(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new secret: `lockd_` and 256 random bits in unpadded base64url.
pub fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "lockd_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The keys in force, and the file they came from, reloadable (SIGHUP).
#[derive(Debug)]
pub struct Auth {
    path: PathBuf,
    ring: RwLock<Arc<KeyRing>>,
}

impl Auth {
    /// Loads the keys file at `path`.
    ///
    /// # Errors
    /// As [`KeyRing::load`].
    pub fn load(path: &Path) -> Result<Self, KeysError> {
        let ring = KeyRing::load(path)?;
        if ring.is_empty() {
            tracing::warn!(file = %path.display(), "the keys file has no keys: every request that needs a key is refused");
        }
        Ok(Self {
            path: path.to_path_buf(),
            ring: RwLock::new(Arc::new(ring)),
        })
    }

    /// The keys in force now.
    pub fn keys(&self) -> Arc<KeyRing> {
        self.ring
            .read()
            .map_or_else(|p| p.into_inner().clone(), |ring| ring.clone())
    }

    /// Reads the keys file again. On success the new keys replace the old
    /// ones at once (requests in flight keep the keys they started with);
    /// on failure the old keys stay in force. Returns the number of keys.
    ///
    /// # Errors
    /// As [`KeyRing::load`].
    pub fn reload(&self) -> Result<usize, KeysError> {
        let ring = KeyRing::load(&self.path)?;
        let count = ring.len();
        let mut slot = self.ring.write().unwrap_or_else(|p| p.into_inner());
        *slot = Arc::new(ring);
        Ok(count)
    }

    /// The keys file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, secret: &str, prefixes: &[&str], perms: &str) -> String {
        format!(
            "[[keys]]\nid = \"{id}\"\nsecret_sha256 = \"{}\"\nprefixes = {prefixes:?}\npermissions = [{perms}]\n",
            secret_sha256(secret)
        )
    }

    #[test]
    fn a_key_lists_under_its_own_prefixes_only() {
        let under = |ps: &[&str]| ListScope::Under(ps.iter().map(|p| (*p).to_owned()).collect());
        let scope = under(&["b:", "a:", "a:x:", "b:"]);
        assert_eq!(
            scope.prefixes(""),
            Ok(vec!["a:".to_owned(), "b:".to_owned()])
        );
        assert_eq!(scope.prefixes("a:x:1"), Ok(vec!["a:x:1".to_owned()]));
        assert_eq!(scope.prefixes("a:"), Ok(vec!["a:".to_owned()]));
        assert_eq!(
            scope.prefixes("a"),
            Err(OutsideScope),
            "wider than the key's"
        );
        assert_eq!(scope.prefixes("c:"), Err(OutsideScope));
        assert_eq!(ListScope::Every.prefixes(""), Ok(vec![String::new()]));
        assert_eq!(ListScope::Every.prefixes("z"), Ok(vec!["z".to_owned()]));
        let text = entry("a", "secret-a", &["billing:"], "\"read\"")
            + &entry("b", "secret-b", &["x:", "*"], "\"read\"");
        let ring = KeyRing::parse(&text, Path::new("k.toml")).expect("valid");
        assert_eq!(
            ring.find("secret-a").map(Key::list_scope),
            Some(under(&["billing:"]))
        );
        assert_eq!(
            ring.find("secret-b").map(Key::list_scope),
            Some(ListScope::Every)
        );
    }

    #[test]
    fn finds_the_key_of_a_secret_and_only_that_one() {
        let text = entry("a", "secret-a", &["billing:"], "\"acquire\"")
            + &entry("b", "secret-b", &["*"], "\"read\", \"metrics\"");
        let ring = KeyRing::parse(&text, Path::new("k.toml")).expect("valid");
        assert_eq!(ring.len(), 2);
        let a = ring.find("secret-a").expect("a");
        assert_eq!(&*a.id, "a");
        assert!(a.may(Permission::Acquire) && !a.may(Permission::Release));
        assert!(a.covers("billing:invoice") && !a.covers("shipping:x") && !a.covers("billing"));
        let b = ring.find("secret-b").expect("b");
        assert!(b.covers("anything") && b.may(Permission::Metrics));
        assert!(ring.find("secret-c").is_none());
        assert!(ring.find("").is_none());
        assert!(ring.find(&secret_sha256("secret-a")).is_none());
    }

    #[test]
    fn refuses_malformed_files() {
        let good = entry("a", "s", &["x:"], "\"read\"");
        let cases = [
            good.clone() + &good,                  // same id
            good.replace("\"read\"", "\"write\""), // unknown permission
            good.replace("permissions = [\"read\"]", "permissions = []"),
            good.replace("[\"x:\"]", "[]"),           // no prefix
            good.replace("[\"x:\"]", "[\"\"]"),       // empty prefix
            good.replace("[\"x:\"]", "[\"a b\"]"),    // no name starts so
            good.replace("[\"x:\"]", "[\"x*\"]"),     // `*` only alone
            good.replace(&secret_sha256("s"), "abc"), // short hash
            good.replace(&secret_sha256("s"), &"zz".repeat(32)), // not hex
            good.replace("id = \"a\"", "id = \"\""),  // empty id
            good.clone() + "colour = \"red\"\n",      // unknown field
            good.clone() + &entry("b", "s", &["y:"], "\"read\""), // same secret
            "keys = 3".to_owned(),
        ];
        for text in cases {
            let outcome = KeyRing::parse(&text, Path::new("k.toml"));
            assert!(
                matches!(outcome, Err(KeysError::Parse { .. })),
                "accepted: {text}"
            );
        }
        assert!(
            KeyRing::parse("", Path::new("k.toml"))
                .expect("empty file")
                .is_empty()
        );
    }

    #[test]
    fn new_secrets_are_long_random_and_hash_to_64_hex_digits() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(a.starts_with("lockd_") && a.len() == 6 + 43, "{a}");
        let hash = secret_sha256(&a);
        assert_eq!(hash.len(), 64);
        assert_eq!(decode_hex(&hash), Some(Sha256::digest(a.as_bytes()).into()));
    }
}
