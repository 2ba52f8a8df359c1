//! `DELETE /runs/{key}`: abandon a run's attempt.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};

use super::model::AbandonBody;
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema, NoQuery};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Abandon the attempt your token holds: the job failed. Nothing is
/// stored, so a failure is never replayed: the next start runs the job
/// (attempt + 1).
#[utoipa::path(
    delete,
    path = "/runs/{key}",
    operation_id = "abandonRun",
    tag = "runs",
    params(
        ("key" = LockNameSchema, Path, description = "The run's key"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The attempt's token"),
    ),
    request_body(content = Option<AbandonBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 204, description = "Abandoned: the next start is a new attempt"),
        (status = 400, description = "No token, or an invalid body", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`run-not-found`: the run is unknown, or its retention ended", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not-run-owner`: the token does not hold the live attempt, or the run is done; nothing was changed", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
#[allow(clippy::too_many_arguments)]
pub async fn abandon(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(key): LockPath,
    headers: HeaderMap,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
    JsonBody(body): JsonBody<AbandonBody>,
) -> Result<StatusCode, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let outcome = within(
        deadline,
        locks.abandon_run(&key, &token, limits.run_retention),
    )
    .await;
    metrics.observe_run_end(&key, &outcome, "abandoned");
    outcome.map_err(timeout_or)??;
    Ok(StatusCode::NO_CONTENT)
}
