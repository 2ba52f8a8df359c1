//! Parsed input types for the lock core: a value of one of these types is
//! always valid, so the backends never re-check their input
//! ("parse, don't validate").

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Why a raw value could not become a [`LockName`], [`Ttl`], [`Token`],
/// [`Owner`] or [`Meta`]. The message is safe to show to the caller: it never repeats a
/// token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    /// The lock name is empty, too long, `.` or `..`, or has a character
    /// outside `[A-Za-z0-9._-:@]`.
    #[error(
        "a name (of a lock, a semaphore or a run) must be 1 to {max} characters of ASCII letters, digits and `._-:@`, other than `.` and `..`",
        max = LockName::MAX_LEN
    )]
    Name,
    /// The TTL is not an integer number of milliseconds in `1..=max_ms`.
    #[error("{field} must be an integer number of milliseconds from 1 to {max_ms}")]
    Ttl {
        /// The field that carried the TTL, such as `ttl_ms`.
        field: &'static str,
        /// The largest TTL allowed, in milliseconds.
        max_ms: u64,
    },
    /// The token is not 16 to 128 characters of `[A-Za-z0-9_-]`.
    #[error(
        "token must be {min} to {max} characters of ASCII letters, digits, `_` and `-`",
        min = Token::MIN_LEN,
        max = Token::MAX_LEN
    )]
    Token,
    /// The owner label is too long or has control characters.
    #[error(
        "owner must be at most {max} characters with no control characters",
        max = Owner::MAX_LEN
    )]
    Owner,
    /// The holder metadata is not a JSON object, or is larger than the
    /// server allows.
    #[error(
        "meta must be a JSON object of at most {max_bytes} bytes as compact JSON (--max-meta-bytes), such as {{\"host\": \"web-1\", \"pid\": 4242}}; nothing was written"
    )]
    Meta {
        /// The largest metadata allowed, in bytes of compact JSON.
        max_bytes: usize,
    },
    /// A listing's `prefix` is too long or has a character no name can
    /// hold.
    #[error(
        "prefix must be at most {max} characters of ASCII letters, digits and `._-:@`",
        max = LockName::MAX_LEN
    )]
    Prefix,
    /// A listing's `limit` is not a decimal integer in `1..=1000`.
    #[error(
        "limit must be an integer from 1 to {max}",
        max = super::listing::PageSize::MAX
    )]
    PageSize,
    /// A lock's `mode` is not `exclusive` or `shared`.
    #[error(
        "mode must be \"exclusive\" (one holder, the default) or \"shared\" (many holders at once, no exclusive one)"
    )]
    Mode,
    /// A listing's `cursor` is not one lockd gave for this listing.
    #[error(
        "cursor is not one this listing gave: pass `next_cursor` from the previous page as it is, with the same prefix"
    )]
    Cursor,
}

/// The name of a lock: 1 to 200 characters of ASCII letters, digits and
/// `._-:@`.
///
/// The alphabet keeps names safe inside a Redis key with a `{name}` hash tag
/// (no braces), inside a URL path segment (nothing to escape) and in logs (no
/// control characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// The longest name accepted, in characters.
    pub const MAX_LEN: usize = 200;

    /// Parses a lock name.
    ///
    /// # Errors
    /// [`InvalidInput::Name`] when the name is empty, longer than
    /// [`Self::MAX_LEN`] or has a character outside the alphabet.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        // `.` and `..` are refused: HTTP clients rewrite such path segments.
        let ok = !raw.is_empty() && raw != "." && raw != ".." && Self::fits(raw);
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput::Name)
        }
    }

    /// Whether `raw` is at most [`Self::MAX_LEN`] characters of the names'
    /// alphabet (ASCII letters, digits and `._-:@`): the rule a name and
    /// the prefix of a listing share.
    pub(crate) fn fits(raw: &str) -> bool {
        raw.len() <= Self::MAX_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:@".contains(&b))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a lock is held: by one holder ([`Mode::Exclusive`], a writer) or by
/// any number of holders at once ([`Mode::Shared`], readers), never both.
/// Every grant of a name, in either mode, takes its fence from the name's
/// one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// One holder at a time: the lock as it always was.
    #[default]
    Exclusive,
    /// Many holders at once, each with its own token, lease and fence,
    /// while no exclusive holder is live and no exclusive request waits.
    Shared,
}

impl Mode {
    /// The mode's name in the API: `exclusive` or `shared`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
        }
    }

    /// The other mode: the one a token holds when it is refused with
    /// [`super::LockError::ModeMismatch`] for asking for this one.
    pub fn other(self) -> Self {
        match self {
            Self::Exclusive => Self::Shared,
            Self::Shared => Self::Exclusive,
        }
    }

    /// Parses the API's name of a mode.
    ///
    /// # Errors
    /// [`InvalidInput::Mode`] for anything but `exclusive` and `shared`.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        match raw {
            "exclusive" => Ok(Self::Exclusive),
            "shared" => Ok(Self::Shared),
            _ => Err(InvalidInput::Mode),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lease length in whole milliseconds, from 1 to a configured maximum.
///
/// A zero or negative TTL never reaches Redis: `PEXPIRE key 0` would delete
/// the lock instead of extending it (field case C03).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ttl(u64);

impl Ttl {
    /// The longest TTL lockd ever grants, whatever the settings say: 365
    /// days, in milliseconds. It keeps every expiry time far inside what
    /// Redis and RFC 3339 timestamps can hold.
    pub const CEILING_MS: u64 = 365 * 24 * 60 * 60 * 1000;

    /// The shortest TTL: 1 ms.
    pub const MIN: Self = Self(1);

    /// The longest TTL: [`Self::CEILING_MS`] (365 days).
    pub const MAX: Self = Self(Self::CEILING_MS);

    /// A TTL of `ms` milliseconds when `ms` is in `1..=CEILING_MS`; usable
    /// in constants (the settings' defaults).
    pub const fn new(ms: u64) -> Option<Self> {
        if ms >= 1 && ms <= Self::CEILING_MS {
            Some(Self(ms))
        } else {
            None
        }
    }

    /// Parses a TTL in milliseconds, accepting `1..=max_ms` (and never more
    /// than [`Self::CEILING_MS`]).
    ///
    /// # Errors
    /// [`InvalidInput::Ttl`] naming `field` when `ms` is 0 or above `max_ms`.
    pub fn from_millis(ms: u64, max_ms: u64, field: &'static str) -> Result<Self, InvalidInput> {
        let max_ms = max_ms.min(Self::CEILING_MS);
        if (1..=max_ms).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidInput::Ttl { field, max_ms })
        }
    }

    /// Parses the decimal text of a TTL in milliseconds, as found in a query
    /// string: `"1500"` is accepted, `"1.5"`, `"-5"` and `""` are not.
    ///
    /// # Errors
    /// [`InvalidInput::Ttl`] naming `field` when the text is not a decimal
    /// integer in `1..=max_ms`.
    pub fn parse_text(text: &str, max_ms: u64, field: &'static str) -> Result<Self, InvalidInput> {
        let digits_only = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        let ms = digits_only
            .then(|| text.parse::<u64>().ok())
            .flatten()
            .ok_or(InvalidInput::Ttl { field, max_ms })?;
        Self::from_millis(ms, max_ms, field)
    }

    /// The TTL in milliseconds (always at least 1).
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// The TTL as a [`Duration`].
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

/// The secret that proves who holds a lock.
///
/// A token generated by lockd carries 192 random bits from the operating
/// system's CSPRNG (via `rand`'s thread RNG), written as 32 characters of
/// URL-safe base64. A client may choose its own token of 16 to 128 characters
/// of `[A-Za-z0-9_-]`, for idempotent retries.
///
/// `Debug` prints `Token(<redacted>)` so that a token cannot reach a log line
/// by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The shortest client-chosen token, in characters.
    pub const MIN_LEN: usize = 16;
    /// The longest client-chosen token, in characters.
    pub const MAX_LEN: usize = 128;

    /// Makes a fresh token with 192 random bits.
    pub fn generate() -> Self {
        let bytes: [u8; 24] = rand::random();
        Self(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// Parses a client-chosen token.
    ///
    /// # Errors
    /// [`InvalidInput::Token`] when the length or alphabet is wrong.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let ok = (Self::MIN_LEN..=Self::MAX_LEN).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput::Token)
        }
    }

    /// Wraps a value read from the store as it is, valid token or not (a
    /// foreign client may have written anything), so that holders can be
    /// compared across Redlock nodes. Never for client input.
    pub(crate) fn from_stored(raw: String) -> Self {
        Self(raw)
    }

    /// The token's text, to hand to its holder or to Redis. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// A free-form label naming the holder, shown by `GET /locks/{name}`: up to
/// 256 characters, no control characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner(String);

impl Owner {
    /// The longest label accepted, in characters.
    pub const MAX_LEN: usize = 256;

    /// Parses an owner label.
    ///
    /// # Errors
    /// [`InvalidInput::Owner`] when it is longer than [`Self::MAX_LEN`]
    /// characters or has a control character.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.chars().count() <= Self::MAX_LEN && !raw.chars().any(char::is_control) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput::Owner)
        }
    }

    /// The label as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Holder metadata: a JSON object the holder gives with its acquire (a
/// leader's address, a job's id), stored with the lease as compact JSON
/// and shown to observers (`GET`, listings, watches); lockd never decides
/// anything by it. At most `--max-meta-bytes` (default
/// [`Meta::DEFAULT_MAX_BYTES`], 1 KiB) of compact JSON.
#[derive(Clone, PartialEq, Eq)]
pub struct Meta(String);

impl Meta {
    /// The default and suggested largest metadata, in bytes of compact
    /// JSON: 1 KiB.
    pub const DEFAULT_MAX_BYTES: usize = 1024;
    /// The largest `--max-meta-bytes` may be: 64 KiB.
    pub const CEILING_BYTES: usize = 64 * 1024;

    /// Parses the metadata a request gave.
    ///
    /// # Errors
    /// [`InvalidInput::Meta`] when `value` is not a JSON object or its
    /// compact JSON is over `max_bytes` bytes.
    pub fn parse(value: &serde_json::Value, max_bytes: usize) -> Result<Self, InvalidInput> {
        let refused = InvalidInput::Meta { max_bytes };
        if !value.is_object() {
            return Err(refused);
        }
        let text = serde_json::to_string(value).map_err(|_| refused.clone())?;
        if text.len() > max_bytes {
            return Err(refused);
        }
        Ok(Self(text))
    }

    /// The metadata a store kept, as compact JSON text; `None` for an empty
    /// text (none was given) or one that is not a JSON object (a foreign
    /// client's value).
    pub fn from_stored(text: &str) -> Option<Self> {
        if text.is_empty() {
            return None;
        }
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        value.is_object().then(|| Self(text.to_owned()))
    }

    /// The metadata as compact JSON text, as it is stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The metadata as a JSON value (always an object).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Meta({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_the_documented_alphabet_only() {
        assert!(LockName::parse("orders:1").is_ok());
        assert!(LockName::parse("a.b-c_d:e@f").is_ok());
        assert!(LockName::parse(&"x".repeat(200)).is_ok());
        for bad in ["", ".", "..", "a b", "{x}", "a\nb", "é", "a/b", "a%20b"] {
            assert_eq!(LockName::parse(bad), Err(InvalidInput::Name), "{bad:?}");
        }
        assert!(LockName::parse(&"x".repeat(201)).is_err());
    }

    #[test]
    fn modes_parse_by_their_api_names_only() {
        assert_eq!(Mode::parse("exclusive"), Ok(Mode::Exclusive));
        assert_eq!(Mode::parse("shared"), Ok(Mode::Shared));
        for bad in ["", "Shared", "read", "write", " shared"] {
            assert_eq!(Mode::parse(bad), Err(InvalidInput::Mode), "{bad:?}");
        }
        assert_eq!(Mode::default(), Mode::Exclusive);
        assert_eq!(Mode::Shared.to_string(), "shared");
    }

    #[test]
    fn ttl_accepts_one_to_max_only() {
        assert_eq!(Ttl::from_millis(1, 10, "ttl_ms").map(Ttl::as_millis), Ok(1));
        assert_eq!(
            Ttl::from_millis(10, 10, "ttl_ms").map(Ttl::as_millis),
            Ok(10)
        );
        assert!(Ttl::from_millis(0, 10, "ttl_ms").is_err());
        assert!(Ttl::from_millis(11, 10, "ttl_ms").is_err());
        assert!(Ttl::from_millis(Ttl::CEILING_MS + 1, u64::MAX, "ttl_ms").is_err());
        assert!(Ttl::from_millis(Ttl::CEILING_MS, u64::MAX, "ttl_ms").is_ok());
        assert_eq!(Ttl::new(1), Some(Ttl::MIN));
        assert_eq!(Ttl::new(Ttl::CEILING_MS), Some(Ttl::MAX));
        assert_eq!(Ttl::new(0), None);
        assert_eq!(Ttl::new(Ttl::CEILING_MS + 1), None);
    }

    #[test]
    fn ttl_text_is_decimal_digits_only() {
        assert_eq!(
            Ttl::parse_text("1500", 3_600_000, "ttl_ms").map(Ttl::as_millis),
            Ok(1500)
        );
        for bad in [
            "",
            "0",
            "-5",
            "1.5",
            "+5",
            " 5",
            "1e3",
            "99999999999999999999999",
        ] {
            assert!(
                Ttl::parse_text(bad, 3_600_000, "ttl_ms").is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn generated_tokens_are_long_distinct_and_valid() {
        let a = Token::generate();
        let b = Token::generate();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 32);
        assert!(Token::parse(a.expose()).is_ok());
    }

    #[test]
    fn token_debug_never_shows_the_secret() {
        let t = Token::parse("abcdefghijklmnop").expect("valid token");
        assert!(!format!("{t:?}").contains("abcdefghijklmnop"));
    }

    #[test]
    fn client_tokens_are_checked() {
        assert!(Token::parse(&"a".repeat(15)).is_err());
        assert!(Token::parse(&"a".repeat(129)).is_err());
        assert!(Token::parse("abcdefghijklmnop!").is_err());
        assert!(Token::parse(&"a".repeat(128)).is_ok());
    }

    #[test]
    fn meta_is_a_json_object_within_the_limit() {
        let meta =
            Meta::parse(&serde_json::json!({"host": "web-1", "pid": 42}), 1024).expect("an object");
        assert_eq!(meta.as_str(), r#"{"host":"web-1","pid":42}"#);
        assert_eq!(Meta::from_stored(meta.as_str()), Some(meta.clone()));
        assert_eq!(meta.to_value()["pid"], 42);
        for bad in [
            serde_json::json!(null),
            serde_json::json!([1]),
            serde_json::json!("x"),
            serde_json::json!(1),
        ] {
            assert_eq!(
                Meta::parse(&bad, 1024),
                Err(InvalidInput::Meta { max_bytes: 1024 })
            );
        }
        // 1024 bytes exactly is accepted, 1025 refused.
        let fits = serde_json::json!({ "k": "x".repeat(1024 - 8) });
        assert_eq!(
            serde_json::to_string(&fits).map(|t| t.len()).ok(),
            Some(1024)
        );
        assert!(Meta::parse(&fits, 1024).is_ok());
        let over = serde_json::json!({ "k": "x".repeat(1024 - 7) });
        assert!(Meta::parse(&over, 1024).is_err());
        for stored in ["", "[1]", "not json", "null"] {
            assert_eq!(Meta::from_stored(stored), None, "{stored:?}");
        }
    }

    #[test]
    fn owner_rejects_control_characters_and_long_labels() {
        assert!(Owner::parse("host-1:4242").is_ok());
        assert!(Owner::parse(&"é".repeat(256)).is_ok());
        assert!(Owner::parse(&"é".repeat(257)).is_err());
        assert!(Owner::parse("a\nb").is_err());
    }
}
