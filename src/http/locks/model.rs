//! The JSON and query shapes of `/locks/{name}`. Every duration is in
//! milliseconds (`_ms`), every time is RFC 3339 UTC.

use std::borrow::Cow;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::lock::listing::{MAX_CURSOR_LEN, PageSize};
use crate::lock::semaphore::PermitInfo;
use crate::lock::{Lease, LockInfo, LockName, Meta, Mode, Owner, Token};

/// The OpenAPI schema of a lock name (component `LockName`), as
/// [`LockName::parse`] accepts it: 1 to 200 characters of `[A-Za-z0-9._:@-]`,
/// other than `.` and `..`. Only a schema: the handlers parse a [`LockName`].
pub struct LockNameSchema;

impl PartialSchema for LockNameSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A lock name: 1 to {} characters of ASCII letters, digits and `._-:@`, other than `.` and `..`",
                LockName::MAX_LEN
            )))
            .min_length(Some(1))
            .max_length(Some(LockName::MAX_LEN))
            .pattern(Some(format!(
                r"^(?!\.{{1,2}}$)[A-Za-z0-9._:@-]{{1,{}}}$",
                LockName::MAX_LEN
            )))
            .examples([json!("orders:1")])
            .into()
    }
}

impl ToSchema for LockNameSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("LockName")
    }
}

/// The OpenAPI schema of a client-chosen lock token (component
/// `LockToken`), as [`Token::parse`] accepts it: 16 to 128 characters of
/// `[A-Za-z0-9_-]`. Tokens that lockd generates have the same form.
pub struct LockTokenSchema;

impl PartialSchema for LockTokenSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A lock token: {} to {} characters of ASCII letters, digits, `_` and `-`",
                Token::MIN_LEN,
                Token::MAX_LEN
            )))
            .min_length(Some(Token::MIN_LEN))
            .max_length(Some(Token::MAX_LEN))
            .pattern(Some(format!(
                "^[A-Za-z0-9_-]{{{},{}}}$",
                Token::MIN_LEN,
                Token::MAX_LEN
            )))
            .examples([json!("job-42-attempt-1-7f3a9c")])
            .into()
    }
}

impl ToSchema for LockTokenSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("LockToken")
    }
}

/// The OpenAPI schema of an owner label (component `OwnerLabel`), as
/// [`Owner::parse`] accepts it: up to 256 characters (Unicode scalar
/// values), none of them a control character (general category `Cc`:
/// U+0000 to U+001F and U+007F to U+009F).
pub struct OwnerLabelSchema;

impl PartialSchema for OwnerLabelSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A label for the holder: up to {} characters, no control characters",
                Owner::MAX_LEN
            )))
            .max_length(Some(Owner::MAX_LEN))
            .pattern(Some(r"^[^\u0000-\u001F\u007F-\u009F]*$"))
            .examples([json!("billing-worker-3")])
            .into()
    }
}

impl ToSchema for OwnerLabelSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("OwnerLabel")
    }
}

/// The OpenAPI schema of `prefix` (component `NamePrefix`): what
/// [`crate::lock::listing::NamePrefix::parse`] accepts.
pub struct NamePrefixSchema;

impl PartialSchema for NamePrefixSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "The start of the names to list: up to {} characters of ASCII letters, digits and `._-:@`; empty or absent lists every name (every name of the API key's prefixes)",
                LockName::MAX_LEN
            )))
            .max_length(Some(LockName::MAX_LEN))
            .pattern(Some(format!(
                r"^[A-Za-z0-9._:@-]{{0,{}}}$",
                LockName::MAX_LEN
            )))
            .examples([json!("billing:")])
            .into()
    }
}

impl ToSchema for NamePrefixSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("NamePrefix")
    }
}

/// The OpenAPI schema of `limit` (component `PageLimit`).
pub struct PageLimitSchema;

impl PartialSchema for PageLimitSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .description(Some(format!(
                "The most items of the page, from 1 to {}; default {}",
                PageSize::MAX,
                PageSize::DEFAULT.get()
            )))
            .minimum(Some(1))
            .maximum(Some(PageSize::MAX))
            .default(Some(json!(PageSize::DEFAULT.get())))
            .examples([json!(100)])
            .into()
    }
}

impl ToSchema for PageLimitSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("PageLimit")
    }
}

/// The OpenAPI schema of `cursor` (component `ListCursor`): base64url
/// without padding, and opaque.
pub struct CursorSchema;

impl PartialSchema for CursorSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "An opaque cursor: the `next_cursor` of the previous page, passed as it is, with the same `prefix`. Its content is not part of the API",
            ))
            .min_length(Some(1))
            .max_length(Some(MAX_CURSOR_LEN))
            .pattern(Some(format!("^[A-Za-z0-9_-]{{1,{MAX_CURSOR_LEN}}}$")))
            .into()
    }
}

impl ToSchema for CursorSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ListCursor")
    }
}

/// Body of `POST /locks/{name}`. Every field is optional, and so is the body.
/// lockd also takes a token of your choosing here, as `token`, in place of
/// the `Lock-Token` header; this document shows only the header, since a
/// token given in both is refused.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// Lease length in milliseconds, from 1 to the server's maximum
    /// (default 3600000). A JSON integer: `"1500"` is refused. Default: the
    /// server's default TTL (30000).
    #[schema(minimum = 1, example = 30000)]
    pub ttl_ms: Option<u64>,
    /// A token of your choosing, 16 to 128 characters of `[A-Za-z0-9_-]`,
    /// as the `Lock-Token` header (out of the document; see above).
    #[schema(ignore)]
    pub token: Option<String>,
    /// A label for the holder, up to 256 characters with no control
    /// characters, shown by GET.
    #[schema(value_type = Option<OwnerLabelSchema>)]
    pub owner: Option<String>,
    /// How long to wait for a held lock, in milliseconds, from 0 to the
    /// server's maximum (default 60000). 0 (the default) fails at once with
    /// 409. While waiting, the request is woken by the holder's release or
    /// lease expiry; the lease counts from the grant.
    #[schema(minimum = 0, example = 5000)]
    pub wait_ms: Option<u64>,
    /// `exclusive` (the default: one holder) or `shared` (any number of
    /// holders at once, while no exclusive holder is live and no exclusive
    /// request waits). A token keeps the mode it was granted in: asking
    /// for the other one is 409 `mode-mismatch`.
    #[schema(value_type = Option<LockMode>)]
    pub mode: Option<String>,
    /// Holder metadata: a JSON object of at most `--max-meta-bytes` bytes
    /// as compact JSON (default 1024), kept with the lease and shown by
    /// GET, listing and watches; never used for decisions. A renewal
    /// replaces it (or keeps it, given none).
    #[schema(value_type = Option<Object>, example = json!({"host": "web-1", "pid": 4242}))]
    pub meta: Option<serde_json::Value>,
}

/// The mode of a lock (component `LockMode`): `exclusive` or `shared`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// One holder at a time.
    Exclusive,
    /// Many holders at once, none of them exclusive.
    Shared,
}

impl From<Mode> for LockMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Exclusive => Self::Exclusive,
            Mode::Shared => Self::Shared,
        }
    }
}

/// Query parameters of `POST /locks/{name}`, for curl and webhook configs. A
/// parameter may not be given both here and in the body. Out of the OpenAPI
/// document, which shows the body's fields only (the operation's
/// description says so).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireQuery {
    /// Lease length in milliseconds, as decimal digits.
    pub ttl_ms: Option<String>,
    /// A label for the holder, up to 256 characters with no control
    /// characters.
    pub owner: Option<String>,
    /// How long to wait for a held lock, in milliseconds, as decimal digits.
    pub wait_ms: Option<String>,
    /// `exclusive` or `shared`.
    pub mode: Option<String>,
}

/// Body of `PATCH /locks/{name}`; optional. lockd also takes the holder's
/// token here, as `token`, in place of the `Lock-Token` header; this
/// document shows only the header, since a token given in both is refused.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    /// The holder's token, when it is not sent in the `Lock-Token` header
    /// (out of the document; see above).
    #[schema(ignore)]
    pub token: Option<String>,
    /// The new lease length in milliseconds, counted from now; it also
    /// becomes the lock's own TTL. Default: the lock's own TTL (the one it
    /// was granted with, or last extended to).
    #[schema(minimum = 1, example = 30000)]
    pub ttl_ms: Option<u64>,
}

/// Body of `DELETE /locks/{name}`; optional, and an empty object when
/// sent. lockd also takes the holder's token here, as `token`, in place of
/// the `Lock-Token` header; this document shows only the header, since a
/// token given in both is refused.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The holder's token, when it is not sent in the `Lock-Token` header
    /// (out of the document; see above).
    #[schema(ignore)]
    pub token: Option<String>,
}

/// Query parameters of `PATCH /locks/{name}`; out of the OpenAPI document,
/// as for [`AcquireQuery`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendQuery {
    /// The new lease length in milliseconds, as decimal digits; it also
    /// becomes the lock's own TTL. Default: the lock's own TTL.
    pub ttl_ms: Option<String>,
}

/// Query parameters of `DELETE /locks/{name}`: none are taken.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// A granted lock (201), or a renewed one (200, same token and fence).
#[derive(Debug, Serialize, ToSchema)]
pub struct Grant {
    /// The lock's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The secret proving ownership: send it to extend and release. Keep it
    /// out of URLs and logs.
    #[schema(value_type = LockTokenSchema)]
    pub token: String,
    /// How the lease holds the lock: `exclusive` or `shared`.
    pub mode: LockMode,
    /// The fencing token: larger than every earlier grant of this lock, and
    /// unique to this grant (a renewal keeps it). Below 2^53. Pass it to the
    /// storage you write to, so it can refuse a stale holder.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What is left of the lease, in milliseconds: the TTL asked for, less
    /// the time since lockd sent the request to Redis (and, with Redlock,
    /// less the clock drift allowance).
    pub ttl_ms: u64,
    /// When the lease ends at the earliest (RFC 3339, UTC): the moment lockd
    /// sent the request to Redis, plus the TTL (with Redlock, plus
    /// `ttl_ms`). Redis started the lease after that, so the true expiry is
    /// at or slightly after this time: finish your work before it.
    pub expires_at: String,
}

/// A lease after an extend.
#[derive(Debug, Serialize, ToSchema)]
pub struct Extended {
    /// The lock's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The holder's fencing token (unchanged by an extend).
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What is left of the new lease, in milliseconds, counted as for a
    /// grant.
    pub ttl_ms: u64,
    /// When the new lease ends at the earliest (RFC 3339, UTC), counted as
    /// for a grant: the true expiry is at or slightly after it.
    pub expires_at: String,
}

/// What anyone may see of a held lock. Never the token.
#[derive(Debug, Serialize, ToSchema)]
pub struct Status {
    /// The lock's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// Always `true` (a free lock answers 404).
    pub held: bool,
    /// The holder's fencing token.
    pub fence: Option<u64>,
    /// The holder's remaining lease in milliseconds; `null` when a foreign
    /// client set the key without a TTL.
    pub ttl_ms: Option<u64>,
    /// When the lease ends (RFC 3339, UTC); `null` as for `ttl_ms`.
    pub expires_at: Option<String>,
    /// The holder's label, if it gave one.
    pub owner: Option<String>,
    /// The holder's metadata (the JSON object it gave as `meta`), `null`
    /// when it gave none.
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
    /// When the holder was granted the lock (RFC 3339, UTC).
    pub granted_at: Option<String>,
    /// How it is held: `exclusive` (one holder, described above) or
    /// `shared` (the fields above describe the shared lease that ends
    /// last; `holders` lists them all).
    pub mode: LockMode,
    /// How many leases hold it: 1 when exclusive.
    pub holder_count: usize,
    /// For a shared lock, each shared lease, the earliest to end first
    /// (never a token); empty when exclusive.
    pub holders: Vec<SharedHolder>,
    /// Whether an exclusive request waits for the shared leases to end:
    /// no new shared lease is granted meanwhile.
    pub writer_waiting: bool,
}

/// One shared lease of a lock, as `GET /locks/{name}` shows it: never its
/// token.
#[derive(Debug, Serialize, ToSchema)]
pub struct SharedHolder {
    /// The lease's fencing token.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// The holder's label, if it gave one.
    pub owner: Option<String>,
    /// The holder's metadata (the JSON object it gave as `meta`), `null`
    /// when it gave none.
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
    /// The lease left, in milliseconds.
    pub ttl_ms: u64,
    /// When the lease ends (RFC 3339, UTC).
    pub expires_at: String,
    /// When the lease was granted (RFC 3339, UTC).
    pub granted_at: Option<String>,
}

impl SharedHolder {
    fn new(lease: &PermitInfo, now: SystemTime) -> Self {
        Self {
            fence: lease.fence,
            owner: lease.owner.clone(),
            meta: lease.meta.as_ref().map(Meta::to_value),
            ttl_ms: millis(lease.remaining),
            expires_at: rfc3339(now + lease.remaining),
            granted_at: lease.granted_at.map(rfc3339),
        }
    }
}

/// A held lock in a listing: what `GET /locks/{name}` shows, never the
/// token.
#[derive(Debug, Serialize, ToSchema)]
pub struct ListedLock {
    /// The lock's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The holder's fencing token.
    pub fence: Option<u64>,
    /// The holder's remaining lease in milliseconds; `null` when a foreign
    /// client set the key without a TTL.
    pub ttl_ms: Option<u64>,
    /// When the lease ends (RFC 3339, UTC); `null` as for `ttl_ms`.
    pub expires_at: Option<String>,
    /// The holder's label, if it gave one.
    pub owner: Option<String>,
    /// The holder's metadata (the JSON object it gave as `meta`), `null`
    /// when it gave none.
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
    /// When the holder was granted the lock (RFC 3339, UTC).
    pub granted_at: Option<String>,
    /// `exclusive` or `shared` (the fields above then describe the shared
    /// lease that ends last).
    pub mode: LockMode,
    /// How many leases hold it: 1 when exclusive.
    pub holder_count: usize,
}

impl ListedLock {
    /// The item of a held lock.
    pub fn new(name: &LockName, info: LockInfo) -> Self {
        let Status {
            name,
            fence,
            ttl_ms,
            expires_at,
            owner,
            meta,
            granted_at,
            mode,
            holder_count,
            ..
        } = Status::new(name, info);
        Self {
            name,
            fence,
            ttl_ms,
            expires_at,
            owner,
            meta,
            granted_at,
            mode,
            holder_count,
        }
    }
}

/// One page of `GET /locks`.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockList {
    /// Held locks, at most `limit`; possibly fewer, even none, with
    /// `next_cursor` set: follow it until it is `null`.
    pub locks: Vec<ListedLock>,
    /// The `cursor` of the next page (opaque); `null` on the last page.
    #[schema(required = true, value_type = Option<CursorSchema>)]
    pub next_cursor: Option<String>,
}

/// A time as RFC 3339 UTC with milliseconds. Times past the end of year
/// 9999, which RFC 3339 cannot write, are clamped to it (TTLs are capped far
/// below that, so this is only a guard).
pub fn rfc3339(t: SystemTime) -> String {
    const LAST_RFC3339_SECOND: u64 = 253_402_300_799;
    let last = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(LAST_RFC3339_SECOND);
    humantime::format_rfc3339_millis(t.min(last)).to_string()
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Grant {
    /// The answer for `lease`, taken with `token` in `mode`.
    pub fn new(name: &LockName, token: String, mode: Mode, lease: &Lease) -> Self {
        Self {
            name: name.to_string(),
            token,
            mode: mode.into(),
            fence: lease.fence,
            ttl_ms: lease.ttl.as_millis(),
            expires_at: rfc3339(lease.expires_at),
        }
    }
}

impl Extended {
    /// The answer for an extended `lease`.
    pub fn new(name: &LockName, lease: &Lease) -> Self {
        Self {
            name: name.to_string(),
            fence: lease.fence,
            ttl_ms: lease.ttl.as_millis(),
            expires_at: rfc3339(lease.expires_at),
        }
    }
}

impl Status {
    /// The answer for a held lock.
    pub fn new(name: &LockName, info: LockInfo) -> Self {
        let now = SystemTime::now();
        Self {
            name: name.to_string(),
            held: true,
            fence: info.fence,
            ttl_ms: info.remaining.map(millis),
            expires_at: info.remaining.map(|r| rfc3339(now + r)),
            owner: info.owner,
            meta: info.meta.as_ref().map(Meta::to_value),
            granted_at: info.granted_at.map(rfc3339),
            mode: info.mode.into(),
            holder_count: info.shared.len().max(1),
            holders: info
                .shared
                .iter()
                .map(|l| SharedHolder::new(l, now))
                .collect(),
            writer_waiting: info.writer_waiting,
        }
    }
}
