//! RFC 9457 problem details: the one shape of every error lockd answers.
//!
//! Domain errors ([`LockError`], [`InvalidInput`]) become an [`ApiError`],
//! mapped to a status and a problem type in one place. [`as_problem`] gives
//! the errors produced by layers below the handlers (router 404/405, body
//! limit 413, timeout) the same shape, and [`with_request_id`] writes the
//! request's ID into a problem document (the telemetry layer calls both).
//!
//! A leaf: it imports nothing else from `http`.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::{IntoResponses, ToSchema};

use crate::lock::{InvalidInput, LaggingWrite, LeaseLeft, LockError, Mode};

/// The media type of a problem document (RFC 9457 §3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "urn:lockd:problem:lock-held",
    "title": "Lock is held",
    "status": 409,
    "detail": "the lock is held by another holder; it frees in at most 2500 ms",
    "retry_after_ms": 2500,
    "request_id": "3f1c1b6e-5a0e-4a8e-9d6b-2f7f1f3e9a10"
}))]
pub struct Problem {
    /// A URI naming the kind of problem, `urn:lockd:problem:<slug>`;
    /// docs/api.md lists every slug.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request. Never carries internal error text
    /// or a lock token.
    pub detail: String,
    /// For `lock-held`, `semaphore-full` and the 503 kinds: milliseconds to wait before
    /// trying again (also sent, rounded up to seconds, as `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For `semaphore-full`: the semaphore's limit; for `limit-mismatch`:
    /// the limit its permits are held under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// For `quorum-unavailable`: how many Redis nodes answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_answered: Option<usize>,
    /// For `quorum-unavailable`: how many must answer (the quorum).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_needed: Option<usize>,
    /// The request's ID (the `x-request-id` response header): quote it when
    /// reporting a problem; the server's log lines carry it too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl Problem {
    /// The problem's slug: `lock-held` for `urn:lockd:problem:lock-held`.
    pub fn slug(&self) -> &str {
        self.problem_type
            .strip_prefix(TYPE_PREFIX)
            .unwrap_or(&self.problem_type)
    }

    /// The document as a response: status, `Content-Type` and body; the
    /// problem itself is kept in the response's extensions.
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response.extensions_mut().insert(self);
        response
    }
}

/// The refusals of the API-key check in front of `/locks/{name}`, as each
/// of its operations documents them.
#[derive(IntoResponses)]
pub enum KeyRefusals {
    /// 401 `unauthorized`.
    #[response(
        status = 401,
        description = "With API keys on: no key, an unknown key, or a malformed `Authorization` header (`WWW-Authenticate` says which); nothing was written",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    /// 403 `forbidden`.
    #[response(
        status = 403,
        description = "With API keys on: the key lacks the permission this method needs, or the lock name is outside its prefixes; nothing was written",
        content_type = "application/problem+json"
    )]
    Forbidden(Problem),
    /// 429 `rate-limited`.
    #[response(
        status = 429,
        description = "With API keys on: the key is over its `requests_per_second`; `retry_after_ms` and `Retry-After` say when to retry",
        content_type = "application/problem+json"
    )]
    RateLimited(Problem),
}

/// The refusals of a request body, as each operation that takes one
/// documents them.
#[derive(IntoResponses)]
pub enum BodyRefusals {
    /// 413 `payload-too-large`.
    #[response(
        status = 413,
        description = "Body over 65 KiB",
        content_type = "application/problem+json"
    )]
    PayloadTooLarge(Problem),
    /// 415 `unsupported-media-type`.
    #[response(
        status = 415,
        description = "The body is compressed (`Content-Encoding`); nothing was written",
        content_type = "application/problem+json"
    )]
    UnsupportedMediaType(Problem),
}

/// The 500 of every operation that reaches the lock store.
#[derive(IntoResponses)]
pub enum StoreError {
    /// 500 `backend-error` or `internal`.
    #[response(
        status = 500,
        description = "Redis refused the operation (`backend-error`: a wrong password, or a key of the wrong type written by another client), or a bug (`internal`); the server log says why",
        content_type = "application/problem+json"
    )]
    Refused(Problem),
}

/// The start of every problem type URI.
const TYPE_PREFIX: &str = "urn:lockd:problem:";

/// The kinds of problem lockd answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// 400: the request is malformed or a value is out of range.
    InvalidRequest,
    /// 401: no API key, or not a known one (with `WWW-Authenticate`).
    Unauthorized,
    /// 403: the API key may not do this, or not on this lock name.
    Forbidden,
    /// 403: a browser page of another origin called (see
    /// [`super::browsers`]).
    CrossOrigin,
    /// 421: a loopback listener was asked for a name not its own (see
    /// [`super::browsers`]).
    MisdirectedRequest,
    /// 429: the API key is over its `requests_per_second`.
    RateLimited,
    /// 404: nobody holds the lock.
    LockNotHeld,
    /// 409: another holder has the lock.
    LockHeld,
    /// 409: the lock is held under another token.
    NotLockOwner,
    /// 409: the token holds the lock in the other mode (an upgrade or a
    /// downgrade asked for).
    ModeMismatch,
    /// 404: no such route.
    RouteNotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 413: the body is over the limit.
    PayloadTooLarge,
    /// 415: the body is compressed.
    UnsupportedMediaType,
    /// 503: the lock backend did not answer.
    BackendUnavailable,
    /// 503: too few Redlock nodes answered.
    QuorumUnavailable,
    /// 503: too few replicas acknowledged the write (`--min-replicas-acked`).
    ReplicationLagging,
    /// 503: too many requests are waiting on this instance.
    TooManyWaiters,
    /// 503: `--max-watchers` watches are open on this instance.
    TooManyWatchers,
    /// 503: the service is shutting down.
    ShuttingDown,
    /// 503: this instance serves as many requests of the kind as it allows.
    Overloaded,
    /// 500: the lock store refused the operation (see the server log).
    BackendError,
    /// 503: the request took longer than the server allows.
    Timeout,
    /// 500: a bug; details are in the server log.
    Internal,
    /// 501: this store cannot do it (semaphores in Redlock mode).
    NotImplemented,
    /// A refusal of one kind of lease, defined in that kind's `http`
    /// folder (a semaphore's `semaphore-full`, say: see
    /// `http::semaphores::problem`), so that a new kind adds its problem
    /// types there and not here.
    Leased(&'static LeaseProblem),
}

/// A problem type that only one kind of lease answers with: its status,
/// the last part of its type URI, and its title.
#[derive(Debug, PartialEq, Eq)]
pub struct LeaseProblem {
    /// The HTTP status.
    pub status: StatusCode,
    /// The last part of the type URI (`semaphore-full`).
    pub slug: &'static str,
    /// The short title.
    pub title: &'static str,
}

impl Kind {
    /// Every kind but [`Kind::Leased`]: each kind of lease lists its own
    /// (`http::semaphores::problem::PROBLEMS`, `http::runs::problem::PROBLEMS`).
    /// The OpenAPI document's `Problem.type` lists them all.
    pub const COMMON: [Kind; 25] = [
        Self::InvalidRequest,
        Self::Unauthorized,
        Self::Forbidden,
        Self::CrossOrigin,
        Self::MisdirectedRequest,
        Self::RateLimited,
        Self::LockNotHeld,
        Self::LockHeld,
        Self::NotLockOwner,
        Self::ModeMismatch,
        Self::RouteNotFound,
        Self::MethodNotAllowed,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::BackendUnavailable,
        Self::QuorumUnavailable,
        Self::ReplicationLagging,
        Self::TooManyWaiters,
        Self::TooManyWatchers,
        Self::ShuttingDown,
        Self::Overloaded,
        Self::BackendError,
        Self::Timeout,
        Self::Internal,
        Self::NotImplemented,
    ];

    /// The kinds only a lock answers with (`/locks/...`).
    pub const OF_LOCKS: [Kind; 4] = [
        Self::LockNotHeld,
        Self::LockHeld,
        Self::NotLockOwner,
        Self::ModeMismatch,
    ];

    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        self.parts().0
    }

    /// The last part of this kind's type URI (`lock-held`).
    pub fn slug(self) -> &'static str {
        self.parts().1
    }

    /// The type URI of this kind, `urn:lockd:problem:<slug>`.
    pub fn type_uri(self) -> String {
        format!("{TYPE_PREFIX}{}", self.slug())
    }

    fn parts(self) -> (StatusCode, &'static str, &'static str) {
        use StatusCode as S;
        match self {
            Self::InvalidRequest => (S::BAD_REQUEST, "invalid-request", "Invalid request"),
            Self::Unauthorized => (S::UNAUTHORIZED, "unauthorized", "API key required"),
            Self::Forbidden => (S::FORBIDDEN, "forbidden", "Not allowed for this API key"),
            Self::CrossOrigin => (S::FORBIDDEN, "cross-origin", "Cross-origin request refused"),
            Self::MisdirectedRequest => (
                S::MISDIRECTED_REQUEST,
                "misdirected-request",
                "Host not served here",
            ),
            Self::RateLimited => (S::TOO_MANY_REQUESTS, "rate-limited", "Rate limit exceeded"),
            Self::LockNotHeld => (S::NOT_FOUND, "lock-not-held", "Lock is not held"),
            Self::LockHeld => (S::CONFLICT, "lock-held", "Lock is held"),
            Self::NotLockOwner => (
                S::CONFLICT,
                "not-lock-owner",
                "Token does not hold the lock",
            ),
            Self::ModeMismatch => (
                S::CONFLICT,
                "mode-mismatch",
                "Token holds the lock in the other mode",
            ),
            Self::RouteNotFound => (S::NOT_FOUND, "route-not-found", "No such route"),
            Self::MethodNotAllowed => (
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            Self::PayloadTooLarge => (
                S::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Request body too large",
            ),
            Self::UnsupportedMediaType => (
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported body encoding",
            ),
            Self::BackendUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "backend-unavailable",
                "Lock backend unavailable",
            ),
            Self::QuorumUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "quorum-unavailable",
                "Quorum unavailable",
            ),
            Self::ReplicationLagging => (
                S::SERVICE_UNAVAILABLE,
                "replication-lagging",
                "Too few replicas acknowledged",
            ),
            Self::TooManyWaiters => (
                S::SERVICE_UNAVAILABLE,
                "too-many-waiters",
                "Too many waiting requests",
            ),
            Self::TooManyWatchers => (
                S::SERVICE_UNAVAILABLE,
                "too-many-watchers",
                "Too many open watches",
            ),
            Self::ShuttingDown => (
                S::SERVICE_UNAVAILABLE,
                "shutting-down",
                "Service shutting down",
            ),
            Self::BackendError => (
                S::INTERNAL_SERVER_ERROR,
                "backend-error",
                "Lock store error",
            ),
            Self::Timeout => (S::SERVICE_UNAVAILABLE, "timeout", "Request timed out"),
            Self::Overloaded => (
                S::SERVICE_UNAVAILABLE,
                "overloaded",
                "Too many requests in flight",
            ),
            Self::Internal => (S::INTERNAL_SERVER_ERROR, "internal", "Internal error"),
            Self::NotImplemented => (S::NOT_IMPLEMENTED, "not-implemented", "Not available"),
            Self::Leased(p) => (p.status, p.slug, p.title),
        }
    }
}

/// An error answer: a [`Kind`], a detail for the caller and, for retryable
/// kinds, how long to wait.
#[derive(Debug)]
pub struct ApiError {
    kind: Kind,
    detail: String,
    retry_after: Option<Duration>,
    /// A status other than the kind's own, for client errors that no kind
    /// names (such as 415 from a layer).
    status: Option<StatusCode>,
    /// For `quorum-unavailable`: nodes that answered, and the quorum.
    nodes: Option<(usize, usize)>,
    /// For `unauthorized`: the `WWW-Authenticate` challenge.
    challenge: Option<&'static str>,
    /// For the semaphore refusals: the limit.
    limit: Option<u32>,
}

const TIMEOUT_DETAIL: &str = "the request took longer than the server allows";

const PAYLOAD_TOO_LARGE_DETAIL: &str = "the request body is over 65 KiB";

/// How long a caller should wait after a 503 before trying again.
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(1);

/// The detail's words for a lock (or a run's attempt) whose key has no TTL
/// ([`LeaseLeft::NoTtl`]): what holds it, and that no lease end is known.
pub const NO_TTL_HELD: &str = "its key has no TTL (set by a client other than lockd), so it frees only when that client deletes it";

/// The detail's ending for a retry after `left`: its suggested wait, in
/// whole seconds, for a key with no TTL; `None` for a lease that ends (the
/// detail then says when, in its own words).
pub fn no_ttl_retry(left: LeaseLeft) -> Option<String> {
    match left {
        LeaseLeft::AtMost(_) => None,
        LeaseLeft::NoTtl => Some(format!(
            "{NO_TTL_HELD}; retry after {} s",
            retry_after_secs(left.retry_after())
        )),
    }
}

impl ApiError {
    /// The answer to an acquire in `mode` that failed with `e`: as
    /// `From<LockError>`, but a shared request refused 409 `lock-held` is
    /// told that an exclusive holder or an exclusive request that waits
    /// keeps it out, and not that the lock frees within the lease left: a
    /// waiting writer goes first, and holds the lock for its own TTL
    /// after that (docs/locks.md, the writer rule). A key with no TTL is
    /// told as for an exclusive request.
    pub fn refused_acquire(e: LockError, mode: Mode) -> Self {
        let why =
            "the lock is held exclusively, or an exclusive request waits for it and goes first";
        match (e, mode) {
            (LockError::Held { left }, Mode::Shared) => Self::lock_held(
                left,
                |ms| format!("{why}; try again in {ms} ms"),
                |no_ttl| format!("the lock is held exclusively: {no_ttl}"),
            ),
            (LockError::WaitTimedOut { left }, Mode::Shared) => Self::lock_held(
                left,
                |ms| {
                    format!(
                        "the shared lease was not granted within wait_ms: {why}; try again in {ms} ms"
                    )
                },
                |no_ttl| format!("the shared lease was not granted within wait_ms: {no_ttl}"),
            ),
            (e, _) => e.into(),
        }
    }

    /// A 409 `lock-held` for a holder with `left` of its lease (see
    /// [`ApiError::held_for`]).
    fn lock_held(
        left: LeaseLeft,
        ends: impl FnOnce(u128) -> String,
        no_end: impl FnOnce(&str) -> String,
    ) -> Self {
        Self::held_for(Kind::LockHeld, left, ends, no_end)
    }

    /// An error of `kind` (a 409 of a lease held by another: `lock-held`,
    /// `run-in-progress`) for a holder with `left` of its lease, its
    /// `Retry-After` that lease (or the suggestion for a key with no TTL):
    /// `ends(ms)` words the detail of a lease that ends within `ms`,
    /// `no_end(words)` that of a key with no TTL ([`no_ttl_retry`]'s words).
    pub fn held_for(
        kind: Kind,
        left: LeaseLeft,
        ends: impl FnOnce(u128) -> String,
        no_end: impl FnOnce(&str) -> String,
    ) -> Self {
        let detail = match no_ttl_retry(left) {
            None => ends(left.retry_after().as_millis()),
            Some(words) => no_end(&words),
        };
        Self::new(kind, detail).retry_after(left.retry_after())
    }

    /// An error of `kind` with `detail` for the caller.
    pub fn new(kind: Kind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
            status: None,
            nodes: None,
            challenge: None,
            limit: None,
        }
    }

    /// A 401 `unauthorized` with the `WWW-Authenticate` challenge
    /// `challenge` (RFC 6750 §3).
    pub fn unauthorized(detail: impl Into<String>, challenge: &'static str) -> Self {
        let mut error = Self::new(Kind::Unauthorized, detail);
        error.challenge = Some(challenge);
        error
    }

    /// A 413 `payload-too-large`: the body is over the limit
    /// ([`super::extract::BODY_LIMIT`]).
    pub fn payload_too_large() -> Self {
        Self::new(Kind::PayloadTooLarge, PAYLOAD_TOO_LARGE_DETAIL)
    }

    /// A 503 `timeout`: the request took longer than the server allows.
    pub fn timeout() -> Self {
        Self::new(Kind::Timeout, TIMEOUT_DETAIL).retry_after(UNAVAILABLE_RETRY)
    }

    /// A 400 with `detail`.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(Kind::InvalidRequest, detail)
    }

    /// A 400: `field` was given both in the query string and in the body.
    pub fn given_twice(field: &str) -> Self {
        Self::invalid(format!(
            "`{field}` was given both in the query string and in the body; give it once"
        ))
    }

    /// The kind of problem.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The same error, naming the limit it was refused under (`limit`, for
    /// a semaphore's refusals).
    #[must_use]
    pub fn with_limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The same error, asking the client to wait `wait` before retrying
    /// (`retry_after_ms` and `Retry-After`).
    #[must_use]
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        Self::invalid(e.to_string())
    }
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Held { left } => Self::lock_held(
                left,
                |ms| format!("the lock is held by another holder; it frees in at most {ms} ms"),
                |no_ttl| format!("the lock is held by another holder: {no_ttl}"),
            ),
            LockError::WaitTimedOut { left } => Self::lock_held(
                left,
                |ms| format!("the lock was not granted within wait_ms; the holder's lease ends in at most {ms} ms"),
                |no_ttl| format!("the lock was not granted within wait_ms: {no_ttl}"),
            ),
            LockError::QuorumUnavailable { answered, needed } => {
                tracing::warn!(answered, needed, "Redlock quorum unavailable");
                let mut error = Self::new(
                    Kind::QuorumUnavailable,
                    format!(
                        "only {answered} of the Redis nodes that count towards a quorum answered in time (a node in its restart delay, --redlock-restart-delay-ms, answers but counts towards none); {needed} are needed to tell; try again shortly"
                    ),
                )
                .retry_after(UNAVAILABLE_RETRY);
                error.nodes = Some((answered, needed));
                error
            }
            LockError::ReplicationLagging {
                acked,
                needed,
                write,
            } => {
                tracing::warn!(acked, needed, ?write, "too few replicas acknowledged a write");
                let detail = match write {
                    LaggingWrite::GrantUndone => format!(
                        "only {acked} of the {needed} replicas lockd waits for acknowledged the grant in time, so it was undone and nothing is held; try again shortly"
                    ),
                    LaggingWrite::Lease => format!(
                        "only {acked} of the {needed} replicas lockd waits for acknowledged the new lease in time; count on the lease's old expiry, and extend again shortly"
                    ),
                    LaggingWrite::Release => format!(
                        "only {acked} of the {needed} replicas lockd waits for acknowledged the release in time: a failover now could bring the lease back; release again shortly (a 404 then says it is gone)"
                    ),
                };
                Self::new(Kind::ReplicationLagging, detail).retry_after(UNAVAILABLE_RETRY)
            }
            LockError::TooManyWaiters => Self::new(
                Kind::TooManyWaiters,
                "too many requests are waiting on this instance (for locks, permits and runs: --max-waiters); retry later or with wait_ms 0",
            )
            .retry_after(UNAVAILABLE_RETRY),
            LockError::TooManyWatchers => Self::new(
                Kind::TooManyWatchers,
                "too many watches are open on this instance; retry later or on another instance",
            )
            .retry_after(UNAVAILABLE_RETRY),
            LockError::LeaseSpent { ttl } => {
                tracing::warn!(
                    ttl_ms = ttl.as_millis(),
                    "the lease ran out before Redis's answer arrived"
                );
                Self::new(
                    Kind::BackendUnavailable,
                    format!(
                        "the lease of {} ms ran out before the lock store's answer arrived (the round trip took longer; with Redlock, the round trip and the clock drift allowance): nothing is held; try again, or ask for a longer ttl_ms",
                        ttl.as_millis()
                    ),
                )
                .retry_after(UNAVAILABLE_RETRY)
            }
            LockError::ShuttingDown => Self::new(
                Kind::ShuttingDown,
                "the service is shutting down; retry on another instance or shortly",
            )
            .retry_after(UNAVAILABLE_RETRY),
            LockError::NotHeld => Self::new(
                Kind::LockNotHeld,
                "this token holds no lease of this lock: it was released or its lease ran out (other holders, shared ones, may hold it still); nothing was changed",
            ),
            LockError::NotOwner => Self::new(
                Kind::NotLockOwner,
                "the lock is held under another token; nothing was changed",
            ),
            LockError::ModeMismatch { held } => Self::new(
                Kind::ModeMismatch,
                format!(
                    "this token holds the lock in {held} mode, and a token never changes mode: waiting would be for its own lease. Nothing was changed. To renew, ask again in {held} mode; to change mode, release (DELETE), then acquire again in the other mode, with wait_ms"
                ),
            ),
            LockError::Unavailable(why) => {
                tracing::warn!(error = %why, "lock backend unavailable");
                Self::new(
                    Kind::BackendUnavailable,
                    "the lock store could not be reached or did not answer in time; try again shortly",
                )
                .retry_after(UNAVAILABLE_RETRY)
            }
            LockError::TimedOut => ApiError::timeout(),
            // Nobody reads it (the caller went away); answered as an
            // unavailable store.
            LockError::Cancelled => {
                tracing::warn!(error = %e, "lock backend unavailable");
                Self::new(
                    Kind::BackendUnavailable,
                    "the lock store could not be reached or did not answer in time; try again shortly",
                )
                .retry_after(UNAVAILABLE_RETRY)
            }
            LockError::Unsupported(why) => Self::new(Kind::NotImplemented, why),
            LockError::BadCursor => InvalidInput::Cursor.into(),
            LockError::Backend(why) => {
                tracing::error!(error = %why, "lock backend error");
                Self::new(
                    Kind::BackendError,
                    "the lock store refused the operation; the server log says why",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (kind_status, _, title) = self.kind.parts();
        let status = self.status.unwrap_or(kind_status);
        let problem = Problem {
            problem_type: self.kind.type_uri(),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: self.detail,
            retry_after_ms: self
                .retry_after
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            nodes_answered: self.nodes.map(|(answered, _)| answered),
            nodes_needed: self.nodes.map(|(_, needed)| needed),
            limit: self.limit,
            request_id: None,
        };
        let mut response = problem.into_response();
        let headers = response.headers_mut();
        if let Some(challenge) = self.challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        if let Some(wait) = self.retry_after {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(wait)),
            );
        }
        response
    }
}

/// `Retry-After` in whole seconds, rounded up (RFC 9110 §10.2.3), at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_millis()
        .div_ceil(1000)
        .clamp(1, u128::from(u64::MAX)) as u64
}

/// Rewrites a problem document's body with `request_id` in it; any other
/// response is returned as it is.
pub fn with_request_id(response: Response, request_id: String) -> Response {
    let Some(problem) = response.extensions().get::<Problem>() else {
        return response;
    };
    let problem = Problem {
        request_id: Some(request_id),
        ..problem.clone()
    };
    let (mut parts, _) = response.into_parts();
    let fresh = problem.into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    let (fresh_parts, body) = fresh.into_parts();
    parts.extensions = fresh_parts.extensions;
    Response::from_parts(parts, body)
}

/// Turns an error response that is not already a problem document (router
/// 404 and 405, body-limit 413, timeout 503) into one, keeping its status
/// and headers such as `Allow`; any other response is returned as it is.
pub fn as_problem(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (kind, detail) = match status {
        StatusCode::NOT_FOUND => (Kind::RouteNotFound, "no route matches this path"),
        StatusCode::METHOD_NOT_ALLOWED => (
            Kind::MethodNotAllowed,
            "this route does not take this method; see the Allow header",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (Kind::PayloadTooLarge, PAYLOAD_TOO_LARGE_DETAIL),
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::REQUEST_TIMEOUT => {
            (Kind::Timeout, TIMEOUT_DETAIL)
        }
        s if s.is_client_error() => (Kind::InvalidRequest, "the request was refused"),
        _ => (Kind::Internal, "internal error; see the server log"),
    };
    let (parts, _) = response.into_parts();
    let mut error = ApiError::new(kind, detail);
    if kind == Kind::Timeout {
        error = error.retry_after(UNAVAILABLE_RETRY);
    }
    if kind == Kind::InvalidRequest {
        error.status = Some(status);
    }
    let mut fresh = error.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            fresh.headers_mut().insert(name, value.clone());
        }
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // The body was not read, so the connection cannot carry another
        // request: tell the client not to reuse it.
        fresh
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    /// A lease that ran out before Redis's answer says so, not that the
    /// store could not be reached.
    #[test]
    fn a_lease_spent_before_the_answer_is_told_as_such() {
        let spent: ApiError = LockError::LeaseSpent {
            ttl: Duration::from_millis(1),
        }
        .into();
        assert_eq!(spent.kind, Kind::BackendUnavailable);
        assert!(
            spent
                .detail
                .starts_with("the lease of 1 ms ran out before the lock store's answer arrived"),
            "{}",
            spent.detail
        );
        assert!(spent.detail.contains("nothing is held"), "{}", spent.detail);
        assert_eq!(spent.retry_after, Some(UNAVAILABLE_RETRY));
    }

    #[test]
    fn a_key_with_no_ttl_suggests_a_retry_and_claims_no_lease_end() {
        let no_ttl = LeaseLeft::NoTtl;
        for (mode, e) in [
            (Mode::Exclusive, LockError::Held { left: no_ttl }),
            (Mode::Exclusive, LockError::WaitTimedOut { left: no_ttl }),
            (Mode::Shared, LockError::Held { left: no_ttl }),
            (Mode::Shared, LockError::WaitTimedOut { left: no_ttl }),
        ] {
            let error = ApiError::refused_acquire(e, mode);
            assert_eq!(error.kind, Kind::LockHeld);
            assert!(error.detail.contains("no TTL"), "{}", error.detail);
            assert!(!error.detail.contains(" ms"), "{}", error.detail);
            assert_eq!(error.retry_after, Some(Duration::from_secs(1)));
        }
        // A lease that ends is told as before.
        let held: ApiError = LockError::Held {
            left: LeaseLeft::AtMost(Duration::from_millis(2500)),
        }
        .into();
        assert_eq!(
            held.detail,
            "the lock is held by another holder; it frees in at most 2500 ms"
        );
        assert_eq!(held.retry_after, Some(Duration::from_millis(2500)));
    }
}
