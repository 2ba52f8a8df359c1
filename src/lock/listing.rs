//! Listing the held locks (or semaphores) whose names start with a prefix,
//! page by page: the parsed inputs ([`NamePrefix`], [`PageSize`]), where a
//! walk stands ([`Position`], one shape per backend) and the opaque
//! [`Cursor`] a client carries from one page to the next.
//!
//! Each backend walks its own keyspace: a Redis server (or each master of
//! a Redis Cluster, one after another) with `SCAN cursor MATCH pattern
//! COUNT n`, never `KEYS`; the memory backend its ordered map; Redlock its
//! nodes one after another (see [`super::redlock`]). A page costs a bounded
//! number of calls whatever the size of the keyspace, so it may come back
//! short (even empty) with a next cursor: a client follows `next_cursor`
//! until it is `null`. A name held for the whole walk is listed; one freed
//! before the walk began is not; one taken or freed during the walk may or
//! may not be. A name may be listed twice (Redis's `SCAN` may return a key
//! twice while its table grows, and a Cluster failover restarts the walk of
//! that master): clients that count names keep them in a set.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::semaphore::SemaphoreInfo;
use super::{InvalidInput, Kind, LockInfo, LockName};

/// The start of the names to list: 0 to [`LockName::MAX_LEN`] characters
/// of the names' alphabet (`[A-Za-z0-9._:@-]`); empty lists every name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NamePrefix(String);

impl NamePrefix {
    /// Parses a prefix.
    ///
    /// # Errors
    /// [`InvalidInput::Prefix`] when it is longer than a name may be or has
    /// a character no name can hold.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if LockName::fits(raw) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput::Prefix)
        }
    }

    /// The prefix as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` starts with this prefix.
    pub fn covers(&self, name: &str) -> bool {
        name.starts_with(&self.0)
    }
}

impl fmt::Display for NamePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The most items of one page: 1 to [`PageSize::MAX`], by default
/// [`PageSize::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PageSize(usize);

impl PageSize {
    /// The largest page: 1000 items.
    pub const MAX: usize = 1000;
    /// The page size when none is asked for: 100 items.
    pub const DEFAULT: Self = Self(100);

    /// A page of `n` items when `n` is in `1..=MAX`.
    pub fn new(n: usize) -> Option<Self> {
        (1..=Self::MAX).contains(&n).then_some(Self(n))
    }

    /// Parses the decimal text of a page size, as found in a query string:
    /// `"50"` is accepted, `"0"`, `"1001"`, `"+5"`, `"5.0"` and `""` are
    /// not.
    ///
    /// # Errors
    /// [`InvalidInput::PageSize`] when the text is not a decimal integer in
    /// `1..=MAX`.
    pub fn parse_text(text: &str) -> Result<Self, InvalidInput> {
        let digits_only =
            !text.is_empty() && text.len() <= 4 && text.bytes().all(|b| b.is_ascii_digit());
        digits_only
            .then(|| text.parse::<usize>().ok())
            .flatten()
            .and_then(Self::new)
            .ok_or(InvalidInput::PageSize)
    }

    /// The size as a number.
    pub fn get(self) -> usize {
        self.0
    }
}

/// Where a walk of one backend stands: the part of a [`Cursor`] the
/// backend reads. Each backend accepts its own shapes (and [`Self::Start`])
/// and refuses the others as [`super::LockError::BadCursor`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Position {
    /// The beginning.
    #[serde(rename = "0")]
    Start,
    /// One Redis server (or a Sentinel set's master): its `SCAN` cursor,
    /// and the names a `SCAN` call found that did not fit in the page (a
    /// call may return a few more keys than its `COUNT`), to list first.
    #[serde(rename = "r")]
    Scan {
        /// The `SCAN` cursor to continue from (0: from the start);
        /// `None` once the server's `SCAN` is over (names are pending).
        #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
        cursor: Option<u64>,
        /// Names found and not yet listed.
        #[serde(rename = "p", default, skip_serializing_if = "Vec::is_empty")]
        pending: Vec<String>,
    },
    /// One master of a Redis Cluster, walked in the order of the first
    /// slot each serves: the first slot of the master being walked, its
    /// address (when another master serves that slot now, after a
    /// failover, its walk starts again), its `SCAN` cursor and names
    /// pending as for [`Self::Scan`].
    #[serde(rename = "c")]
    Shard {
        /// The first slot the master serves.
        #[serde(rename = "s")]
        slot: u16,
        /// The master's `host:port`.
        #[serde(rename = "n")]
        node: String,
        /// Its `SCAN` cursor, as for [`Self::Scan`].
        #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
        cursor: Option<u64>,
        /// Names found and not yet listed.
        #[serde(rename = "p", default, skip_serializing_if = "Vec::is_empty")]
        pending: Vec<String>,
    },
    /// The memory backend: the last name listed (names are walked in
    /// order).
    #[serde(rename = "m")]
    After(String),
    /// Redlock: the node being walked (its index), the nodes skipped
    /// because they did not answer during their turn (a bit per node
    /// index), and where that node's walk stands.
    #[serde(rename = "q")]
    Node {
        /// The node's index.
        #[serde(rename = "i")]
        index: usize,
        /// Bit `i` set: node `i` was skipped.
        #[serde(rename = "k", default)]
        skipped: u64,
        /// The node's own position.
        #[serde(rename = "a")]
        at: Box<Position>,
    },
}

/// What one backend call of a walk found: names that may be held (their
/// holders are read next, and names gone by then are dropped), and where
/// the walk goes on, `None` when it is over.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanPage {
    /// The names found, at most the page size.
    pub names: Vec<LockName>,
    /// Where the walk continues; `None`: it is over.
    pub next: Option<Position>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items, at most the page size (possibly none, when `next` is
    /// `Some`).
    pub items: Vec<T>,
    /// Where the walk continues; `None`: it is over.
    pub next: Option<Position>,
}

/// One page of a walk over several prefixes, one after another (see
/// [`super::Locks::list_locks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walked<T> {
    /// The items, at most the page size.
    pub items: Vec<T>,
    /// Where the walk continues: the index of the prefix, and the store's
    /// position in it; `None` when it is over.
    pub next: Option<(usize, Position)>,
}

/// A held lock in a listing. Never its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockEntry {
    /// The lock's name.
    pub name: LockName,
    /// Its holder.
    pub info: LockInfo,
}

/// A semaphore in a listing. Never a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreEntry {
    /// The semaphore's name.
    pub name: LockName,
    /// Its limit and permits.
    pub info: SemaphoreInfo,
}

/// A run in a listing (every run still kept: running, done or pending).
/// Never a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEntry {
    /// The run's key.
    pub key: LockName,
    /// Where it stands.
    pub info: super::run::RunInfo,
}

/// The longest cursor accepted, in characters: far below the request head
/// limit, however many pending names it carries.
pub const MAX_CURSOR_LEN: usize = 8192;

/// The cursor format's version.
const CURSOR_VERSION: u8 = 1;

/// The opaque cursor of a listing: base64url (no padding) of a small JSON
/// document holding the format's version, what is kind, the prefix asked
/// for (a cursor serves only the listing it came from), which of the
/// caller's prefixes is being walked (see [`crate::auth::ListScope`]) and
/// the backend's [`Position`]. Clients must treat it as opaque; lockd
/// checks every part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    v: u8,
    k: Kind,
    q: String,
    s: usize,
    at: Position,
}

impl Cursor {
    /// The cursor of a walk of `kind` for prefix `asked` (empty: none),
    /// at the `scope`-th of the caller's prefixes and `at` in it.
    pub fn new(kind: Kind, asked: &str, scope: usize, at: Position) -> Self {
        Self {
            v: CURSOR_VERSION,
            k: kind,
            q: asked.to_owned(),
            s: scope,
            at,
        }
    }

    /// The cursor's text, for `next_cursor`.
    pub fn encode(&self) -> String {
        // Serializing plain data to JSON cannot fail.
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses a cursor given with a listing of `kind` for prefix `asked`
    /// (empty: none) over `scopes` prefixes: the prefix index and the
    /// backend's position.
    ///
    /// # Errors
    /// [`InvalidInput::Cursor`] when it is not one lockd wrote for this
    /// listing: too long, not base64url, not the expected JSON, another
    /// version, another kind or prefix, or a prefix index out of range.
    pub fn parse(
        raw: &str,
        kind: Kind,
        asked: &str,
        scopes: usize,
    ) -> Result<(usize, Position), InvalidInput> {
        if raw.is_empty() || raw.len() > MAX_CURSOR_LEN {
            return Err(InvalidInput::Cursor);
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(raw)
            .map_err(|_| InvalidInput::Cursor)?;
        let cursor: Self = serde_json::from_slice(&bytes).map_err(|_| InvalidInput::Cursor)?;
        // Only the canonical text of a cursor: base64 with stray trailing
        // bits decodes too.
        if cursor.v != CURSOR_VERSION
            || cursor.k != kind
            || cursor.q != asked
            || cursor.s >= scopes
            || cursor.encode() != raw
        {
            return Err(InvalidInput::Cursor);
        }
        Ok((cursor.s, cursor.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_take_the_names_alphabet_and_may_be_empty() {
        assert!(NamePrefix::parse("").is_ok());
        assert!(NamePrefix::parse(".").is_ok());
        assert!(NamePrefix::parse("billing:eu@1.x-y_z").is_ok());
        assert!(NamePrefix::parse(&"x".repeat(200)).is_ok());
        for bad in ["a*", "a b", "{x", "a}", "é", "a/b", "a?", "[a]", "a\\"] {
            assert_eq!(NamePrefix::parse(bad), Err(InvalidInput::Prefix), "{bad:?}");
        }
        assert!(NamePrefix::parse(&"x".repeat(201)).is_err());
    }

    #[test]
    fn page_sizes_are_1_to_1000_in_decimal_digits() {
        assert_eq!(PageSize::parse_text("1").map(PageSize::get), Ok(1));
        assert_eq!(PageSize::parse_text("1000").map(PageSize::get), Ok(1000));
        assert_eq!(PageSize::parse_text("0100").map(PageSize::get), Ok(100));
        for bad in [
            "",
            "0",
            "1001",
            "-1",
            "+5",
            "5.0",
            " 5",
            "1e2",
            "99999999999999999999",
        ] {
            assert_eq!(
                PageSize::parse_text(bad),
                Err(InvalidInput::PageSize),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_cursor_round_trips_and_serves_only_its_own_listing() {
        let at = Position::Node {
            index: 1,
            skipped: 1,
            at: Box::new(Position::Scan {
                cursor: Some(42),
                pending: vec!["a:1".into()],
            }),
        };
        let text = Cursor::new(Kind::Lock, "a:", 0, at.clone()).encode();
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(Cursor::parse(&text, Kind::Lock, "a:", 1), Ok((0, at)));
        for (kind, asked, scopes) in [
            (Kind::Semaphore, "a:", 1),
            (Kind::Lock, "b:", 1),
            (Kind::Lock, "", 1),
            (Kind::Lock, "a:", 0),
        ] {
            assert_eq!(
                Cursor::parse(&text, kind, asked, scopes),
                Err(InvalidInput::Cursor),
                "{kind:?} {asked:?} {scopes}"
            );
        }
    }

    #[test]
    fn a_cursor_lockd_did_not_write_is_refused() {
        let good = Cursor::new(Kind::Lock, "", 0, Position::Start).encode();
        let json = |s: &str| URL_SAFE_NO_PAD.encode(s);
        for bad in [
            String::new(),
            "!!!".into(),
            "x".repeat(MAX_CURSOR_LEN + 1),
            format!("{good}="),
            format!("{good}A"),
            json("{}"),
            json("null"),
            json(r#"{"v":2,"k":"l","q":"","s":0,"at":"0"}"#),
            json(r#"{"v":1,"k":"l","q":"","s":0,"at":"0","x":1}"#),
            json(r#"{"v":1,"k":"l","q":"","s":0,"at":{"r":{"c":-1}}}"#),
            json(r#"{"v":1,"k":"l","q":"","s":0,"at":{"r":{"c":1,"z":1}}}"#),
            json(r#"{"v":1,"k":"x","q":"","s":0,"at":"0"}"#),
        ] {
            assert_eq!(
                Cursor::parse(&bad, Kind::Lock, "", 1),
                Err(InvalidInput::Cursor),
                "{bad:?}"
            );
        }
        assert!(Cursor::parse(&good, Kind::Lock, "", 1).is_ok());
    }
}
