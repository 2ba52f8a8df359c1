//! The JSON and query shapes of `/semaphores/{name}`, in the conventions of
//! `/locks/{name}`: every duration in milliseconds (`_ms`), every time RFC
//! 3339 UTC, a token never in a URL.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::locks::model::{
    AcquireBody, AcquireQuery, LockNameSchema, LockTokenSchema, rfc3339,
};
use crate::lock::semaphore::{Permit, SemaphoreInfo};
use crate::lock::{LockName, Meta};

/// Body of `POST /semaphores/{name}`. `limit` is required (here or in the
/// query). lockd also takes a token of your choosing here, as `token`, in
/// place of the `Lock-Token` header; this document shows only the header,
/// since a token given in both is refused.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeBody {
    /// The most holders at once, from 1 to the server's maximum (default
    /// 10000). A JSON integer. The first permit sets it; while any permit
    /// is held, a request with another limit is refused (409
    /// `limit-mismatch`).
    #[schema(value_type = u64, required = true, minimum = 1, example = 5)]
    pub limit: Option<u64>,
    /// The permit's lease length in milliseconds, from 1 to the server's
    /// maximum (default 3600000). Default: the server's default TTL
    /// (30000).
    #[schema(minimum = 1, example = 30000)]
    pub ttl_ms: Option<u64>,
    /// A token of your choosing, as the `Lock-Token` header (out of the
    /// document; see above).
    #[schema(ignore)]
    pub token: Option<String>,
    /// A label for the holder, up to 256 characters with no control
    /// characters, shown by GET.
    #[schema(value_type = Option<crate::http::locks::model::OwnerLabelSchema>)]
    pub owner: Option<String>,
    /// How long to wait for a permit when all are held, in milliseconds,
    /// from 0 to the server's maximum (default 60000). 0 (the default)
    /// fails at once with 409. A waiter is woken by a permit given back or
    /// running out.
    #[schema(minimum = 0, example = 5000)]
    pub wait_ms: Option<u64>,
    /// Holder metadata: a JSON object of at most `--max-meta-bytes` bytes
    /// as compact JSON (default 1024), kept with the lease and shown by
    /// GET, listing and watches; never used for decisions.
    #[schema(value_type = Option<Object>, example = json!({"host": "web-1", "pid": 4242}))]
    pub meta: Option<serde_json::Value>,
}

impl TakeBody {
    /// The limit, and the fields a lock's acquire has too.
    pub fn split(self) -> (Option<u64>, AcquireBody) {
        let Self {
            limit,
            ttl_ms,
            token,
            owner,
            wait_ms,
            meta,
        } = self;
        (
            limit,
            AcquireBody {
                ttl_ms,
                token,
                owner,
                wait_ms,
                mode: None,
                meta,
            },
        )
    }
}

/// Query parameters of `POST /semaphores/{name}` (out of the OpenAPI
/// document, as for locks). A parameter may not be given both here and in
/// the body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeQuery {
    /// The limit, as decimal digits.
    pub limit: Option<String>,
    /// Lease length in milliseconds, as decimal digits.
    pub ttl_ms: Option<String>,
    /// A label for the holder.
    pub owner: Option<String>,
    /// How long to wait, in milliseconds, as decimal digits.
    pub wait_ms: Option<String>,
}

impl TakeQuery {
    /// The limit, and the parameters a lock's acquire has too.
    pub fn split(self) -> (Option<String>, AcquireQuery) {
        let Self {
            limit,
            ttl_ms,
            owner,
            wait_ms,
        } = self;
        (
            limit,
            AcquireQuery {
                ttl_ms,
                owner,
                wait_ms,
                mode: None,
            },
        )
    }
}

/// A permit granted (201), or renewed (200: the token held one already;
/// same fence, lease reset).
#[derive(Debug, Serialize, ToSchema)]
pub struct PermitGrant {
    /// The semaphore's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The secret proving this permit: send it to extend and give it back.
    /// Keep it out of URLs and logs.
    #[schema(value_type = LockTokenSchema)]
    pub token: String,
    /// The permit's fencing token: larger than that of every earlier permit
    /// of this semaphore (a renewal keeps it). Below 2^53.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What is left of the lease, in milliseconds, counted as for a lock.
    pub ttl_ms: u64,
    /// When the lease ends at the earliest (RFC 3339, UTC), as for a lock.
    pub expires_at: String,
    /// The semaphore's limit.
    #[schema(minimum = 1)]
    pub limit: u32,
}

impl PermitGrant {
    /// The answer for `permit`, taken with `token`.
    pub fn new(name: &LockName, token: String, permit: &Permit) -> Self {
        Self {
            name: name.to_string(),
            token,
            fence: permit.lease.fence,
            ttl_ms: permit.lease.ttl.as_millis(),
            expires_at: rfc3339(permit.lease.expires_at),
            limit: permit.limit.get(),
        }
    }
}

/// A permit after an extend.
#[derive(Debug, Serialize, ToSchema)]
pub struct PermitExtended {
    /// The semaphore's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The permit's fencing token (unchanged by an extend).
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What is left of the new lease, in milliseconds.
    pub ttl_ms: u64,
    /// When the new lease ends at the earliest (RFC 3339, UTC).
    pub expires_at: String,
    /// The semaphore's limit.
    #[schema(minimum = 1)]
    pub limit: u32,
}

impl PermitExtended {
    /// The answer for an extended `permit`.
    pub fn new(name: &LockName, permit: &Permit) -> Self {
        Self {
            name: name.to_string(),
            fence: permit.lease.fence,
            ttl_ms: permit.lease.ttl.as_millis(),
            expires_at: rfc3339(permit.lease.expires_at),
            limit: permit.limit.get(),
        }
    }
}

/// Body of `PATCH /semaphores/{name}`; optional. The holder's token may
/// come here as `token` in place of the `Lock-Token` header.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PermitExtendBody {
    /// The holder's token, when not in the `Lock-Token` header (out of the
    /// document).
    #[schema(ignore)]
    pub token: Option<String>,
    /// The new lease length in milliseconds, counted from now; it also
    /// becomes the permit's own TTL. Default: the permit's own TTL (the one
    /// it was granted with, or last extended to).
    #[schema(minimum = 1, example = 30000)]
    pub ttl_ms: Option<u64>,
}

/// One held permit, as anyone may see it: never its token.
#[derive(Debug, Serialize, ToSchema)]
pub struct PermitStatus {
    /// The permit's fencing token.
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
    /// When the permit was granted (RFC 3339, UTC).
    pub granted_at: Option<String>,
}

/// A semaphore with at least one permit held. Never a token.
#[derive(Debug, Serialize, ToSchema)]
pub struct SemaphoreStatus {
    /// The semaphore's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The limit the permits were granted under.
    pub limit: u32,
    /// How many permits are held (at most `limit`).
    pub holders: usize,
    /// The held permits, the first to run out first.
    pub permits: Vec<PermitStatus>,
}

impl SemaphoreStatus {
    /// The answer for a semaphore with permits held.
    pub fn new(name: &LockName, info: SemaphoreInfo) -> Self {
        let now = SystemTime::now();
        let permits: Vec<PermitStatus> = info
            .permits
            .into_iter()
            .map(|p| PermitStatus {
                fence: p.fence,
                owner: p.owner,
                meta: p.meta.as_ref().map(Meta::to_value),
                ttl_ms: u64::try_from(p.remaining.as_millis()).unwrap_or(u64::MAX),
                expires_at: rfc3339(now + p.remaining),
                granted_at: p.granted_at.map(rfc3339),
            })
            .collect();
        Self {
            name: name.to_string(),
            limit: info.limit.get(),
            holders: permits.len(),
            permits,
        }
    }
}

/// One page of `GET /semaphores`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SemaphoreList {
    /// Semaphores with at least one permit held, each as
    /// `GET /semaphores/{name}` shows it, at most `limit`; possibly fewer,
    /// even none, with `next_cursor` set: follow it until it is `null`.
    pub semaphores: Vec<SemaphoreStatus>,
    /// The `cursor` of the next page (opaque); `null` on the last page.
    #[schema(required = true, value_type = Option<crate::http::locks::model::CursorSchema>)]
    pub next_cursor: Option<String>,
}
