//! `GET /runs/{key}`: where a run stands, without its token.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};

use super::model::RunStatus;
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{LockPath, StrictQuery};
use crate::http::locks::model::{LockNameSchema, NoQuery};
use crate::http::problem::{ApiError, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// The run's state: `running` (the attempt's fence, number, lease left,
/// owner), `done` (the result and when), or `pending` (no attempt holds it:
/// the last was abandoned or ran out). Never a token.
#[utoipa::path(
    get,
    path = "/runs/{key}",
    operation_id = "inspectRun",
    tag = "runs",
    params(("key" = LockNameSchema, Path, description = "The run's key")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The run's state", body = RunStatus),
        (status = 400, description = "Invalid key", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`run-not-found`: the run is unknown, or its retention ended", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
pub async fn inspect(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    Extension(deadline): Extension<Deadline>,
    LockPath(key): LockPath,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
) -> Result<Json<RunStatus>, ApiError> {
    let outcome = within(deadline, locks.inspect_run(&key)).await;
    metrics.observe_inspect(&outcome);
    match outcome.map_err(timeout_or)? {
        Some(info) => Ok(Json(RunStatus::new(&key, info))),
        None => Err(super::problem::run_not_found()),
    }
}
