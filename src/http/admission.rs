//! A cap on the `/locks` requests served at once: past it, 503
//! `overloaded` with `Retry-After`, at once, before the body is read, so a
//! flood of requests costs little and cannot exhaust memory or sockets
//! behind it.
//!
//! The cap is `--max-requests` plus `--max-waiters`: waiting acquires (which
//! may each hold a slot for their whole `wait_ms`) can never take the room
//! kept for the others, and the others can never take the room kept for the
//! waiters. `/healthz`, `/readyz` and `/metrics` are not capped, so probes
//! and scrapes still answer under overload.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::problem::{ApiError, Kind};
use super::state::AppState;

/// How long an overloaded client is asked to wait.
const RETRY: Duration = Duration::from_secs(1);

/// Room for requests in flight.
#[derive(Debug, Clone)]
pub struct Admission {
    slots: Arc<Semaphore>,
}

impl Admission {
    /// Room for `max_requests + max_waiters` requests at once.
    pub fn new(max_requests: usize, max_waiters: usize) -> Self {
        let room = max_requests
            .saturating_add(max_waiters)
            .min(Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(room)),
        }
    }
}

/// Middleware: serves the request if there is room, else 503 `overloaded`.
pub async fn admit(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Ok(_slot) = state.admission.slots.clone().try_acquire_owned() else {
        return ApiError::new(
            Kind::Overloaded,
            "this instance is serving as many requests as it allows; retry shortly",
        )
        .retry_after(RETRY)
        .into_response();
    };
    next.run(request).await
}
