//! Time limits of the `/locks` routes. A request gets `--request-timeout-ms`
//! in all, counted from its arrival: first for its body to arrive (so a
//! client that sends a body slowly cannot hold a connection), then for its
//! Redis work; an acquire gets its `wait_ms` on top. Past it: 503
//! `timeout`, and the outcome is counted in the lock metrics as
//! `unavailable`.
//!
//! These limits are the only ones on `/locks`: every wait of a request
//! there (the body, the lock core) is inside one, so no route-level
//! `TimeoutLayer` backs them up.

use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use http_body_util::LengthLimitError;
use tokio::time::Instant;

use super::extract::BODY_LIMIT;
use super::limits::Limits;
use super::problem::ApiError;
use crate::lock::LockError;

/// When a request's time is up, set on arrival.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// Time left, or zero.
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

/// Runs `work` until the deadline; past it, [`LockError::TimedOut`]
/// (counted as `unavailable`; [`timeout_or`] turns it into 503 `timeout`).
pub async fn within<T>(
    deadline: Deadline,
    work: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    tokio::time::timeout(deadline.remaining(), work)
        .await
        .unwrap_or_else(|_| Err(LockError::TimedOut))
}

/// The answer for an error from [`within`]: 503 `timeout` when the time ran
/// out, else as usual.
pub fn timeout_or(e: LockError) -> ApiError {
    match e {
        LockError::TimedOut => ApiError::timeout(),
        other => other.into(),
    }
}

/// Sets the request's [`Deadline`] and reads its whole body before it;
/// returns the request with the body read.
///
/// # Errors
/// The answer instead: 413 over [`BODY_LIMIT`], 400 when the body cannot
/// be read, 503 `timeout` when it is late.
pub async fn read_body_by_deadline(limits: &Limits, request: Request) -> Result<Request, Response> {
    let deadline = Deadline(Instant::now() + limits.request_timeout);
    let (mut parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(deadline.remaining(), to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => return Err(body_error(&e)),
        Err(_) => return Err(ApiError::timeout().into_response()),
    };
    parts.extensions.insert(deadline);
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// 413 when the body was over the limit (the rest of it was not read, so
/// the connection is closed), 400 when it could not be read.
fn body_error(e: &axum::Error) -> Response {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(inner) = source {
        if inner.is::<LengthLimitError>() {
            return closing(ApiError::payload_too_large().into_response());
        }
        source = inner.source();
    }
    ApiError::invalid("the request body could not be read").into_response()
}

/// `response` with `Connection: close`: the request's body was not read
/// (all of it), so the connection cannot carry another request.
pub fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
