//! Caps on the `/locks` requests served at once: past them, 503
//! `overloaded` with `Retry-After`, at once, before the body is read, so a
//! flood of requests costs little and cannot exhaust memory or sockets
//! behind it.
//!
//! There are two rooms, and a request takes a slot in one of them only:
//! - **acquires and inspects** (`POST`, `GET`): `--max-requests` plus
//!   `--max-waiters`, so that waiting acquires (which may each hold a slot
//!   for their whole `wait_ms`) can never take the room kept for the
//!   others, and the others can never take the room kept for the waiters;
//! - **extends and releases** (`PATCH`, `DELETE`): another `--max-requests`
//!   of their own. However many acquires flood in or wait, a holder can
//!   still extend its lease and release its lock, rather than lose the
//!   lease to a waiter. They are short (one Redis call each, never a wait),
//!   so the same size as the non-waiting part of the other room is ample.
//!
//! `/healthz`, `/readyz` and `/metrics` are not capped, so probes and
//! scrapes still answer under overload.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::problem::{ApiError, Kind};

/// How long an overloaded client is asked to wait.
const RETRY: Duration = Duration::from_secs(1);

/// Room for requests in flight: one room for acquires and inspects, one of
/// their own for the holders' extends and releases.
#[derive(Debug, Clone)]
pub struct Admission {
    /// `POST` and `GET`: `max_requests + max_waiters` slots.
    acquires: Arc<Semaphore>,
    /// `PATCH` and `DELETE`: `max_requests` slots.
    holders: Arc<Semaphore>,
}

impl Admission {
    /// Room for `max_requests + max_waiters` acquires and inspects at once,
    /// and for `max_requests` extends and releases besides.
    pub fn new(max_requests: usize, max_waiters: usize) -> Self {
        let acquires = max_requests
            .saturating_add(max_waiters)
            .min(Semaphore::MAX_PERMITS);
        Self {
            acquires: Arc::new(Semaphore::new(acquires)),
            holders: Arc::new(Semaphore::new(max_requests.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// The room a request with `method` takes its slot in.
    fn room(&self, method: &Method) -> &Arc<Semaphore> {
        if *method == Method::PATCH || *method == Method::DELETE {
            &self.holders
        } else {
            &self.acquires
        }
    }
}

/// A slot for a request of `method` in its room, held until dropped.
///
/// # Errors
/// [`Overloaded`] when the room is full.
pub fn admit(admission: &Admission, method: &Method) -> Result<OwnedSemaphorePermit, Overloaded> {
    admission
        .room(method)
        .clone()
        .try_acquire_owned()
        .map_err(|_| Overloaded)
}

/// A request's room is full: 503 `overloaded` with `Retry-After`.
#[derive(Debug, Clone, Copy)]
pub struct Overloaded;

impl IntoResponse for Overloaded {
    fn into_response(self) -> Response {
        ApiError::new(
            Kind::Overloaded,
            "this instance is serving as many requests of this kind as it allows; retry shortly",
        )
        .retry_after(RETRY)
        .into_response()
    }
}
