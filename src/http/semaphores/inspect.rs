//! `GET /semaphores/{name}`: who holds permits, without their tokens.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};

use super::model::SemaphoreStatus;
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{LockPath, StrictQuery};
use crate::http::locks::model::{LockNameSchema, NoQuery};
use crate::http::problem::{ApiError, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// The semaphore's limit and its held permits (fence, owner, lease left,
/// grant time), never a token.
#[utoipa::path(
    get,
    path = "/semaphores/{name}",
    operation_id = "inspectSemaphore",
    tag = "semaphores",
    params(("name" = LockNameSchema, Path, description = "Semaphore name")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "At least one permit is held", body = SemaphoreStatus),
        (status = 400, description = "Invalid name", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`semaphore-free`: no permit is held", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "`not-implemented`: Redlock mode has no semaphores", body = Problem, content_type = "application/problem+json"),
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
) -> Result<Json<SemaphoreStatus>, ApiError> {
    let outcome = within(deadline, locks.inspect_semaphore(&name)).await;
    metrics.observe_inspect(&outcome);
    match outcome.map_err(timeout_or)? {
        Some(info) => Ok(Json(SemaphoreStatus::new(&name, info))),
        None => Err(super::problem::semaphore_free()),
    }
}
