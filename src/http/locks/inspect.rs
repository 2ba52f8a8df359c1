//! `GET /locks/{name}`: who holds a lock, without its token.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};

use super::model::{LockNameSchema, NoQuery, Status};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{LockPath, StrictQuery};
use crate::http::problem::{ApiError, KeyRefusals, Kind, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Show the holder's fence, remaining lease and owner label. Never the token.
#[utoipa::path(
    get,
    path = "/locks/{name}",
    operation_id = "inspectLock",
    tag = "locks",
    params(("name" = LockNameSchema, Path, description = "Lock name")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The lock is held", body = Status),
        (status = 400, description = "Invalid lock name", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "The lock is free", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
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
