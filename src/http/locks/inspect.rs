//! `GET /locks/{name}`: who holds a lock, without its token.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};

use super::model::{LockNameSchema, NoQuery, Status};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{LockPath, StrictQuery};
use crate::http::problem::{ApiError, Kind, Problem};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Show the holder's fence, remaining lease and owner label. Never the token.
#[utoipa::path(
    get,
    path = "/locks/{name}",
    tag = "locks",
    params(("name" = LockNameSchema, Path, description = "Lock name")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The lock is held", body = Status),
        (status = 400, description = "Invalid lock name", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "With API keys on: no key, an unknown key, or a malformed `Authorization` header (`WWW-Authenticate` says which); nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "With API keys on: the key lacks the permission this method needs, or the lock name is outside its prefixes; nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "With API keys on: the key is over its `requests_per_second`; `retry_after_ms` and `Retry-After` say when to retry", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The lock is free", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Redis refused the operation (`backend-error`: a wrong password, or a key of the wrong type written by another client), or a bug (`internal`); the server log says why", body = Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn inspect(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
) -> Result<Json<Status>, ApiError> {
    let outcome = within(deadline, locks.inspect(&name)).await;
    metrics.observe_inspect(&outcome);
    match outcome.map_err(timeout_or)? {
        Some(info) => Ok(Json(Status::new(&name, info))),
        None => Err(ApiError::new(
            Kind::LockNotHeld,
            "nobody holds the lock: it is free",
        )),
    }
}
