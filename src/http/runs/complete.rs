//! `PUT /runs/{key}/result`: complete a run with its result.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;

use super::input::completion;
use super::model::{CompleteBody, RunDone};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema, NoQuery};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Complete the run whose live attempt your token holds: store `result`
/// (kept for `retention_ms`), end the attempt, and answer every later
/// start of this key with it. Only the live attempt's token may: an
/// attempt whose lease ran out (and that another may have taken over) gets
/// 409 and changes nothing. The same token again answers the stored run
/// (a retry after a lost answer).
#[utoipa::path(
    put,
    path = "/runs/{key}/result",
    operation_id = "completeRun",
    tag = "runs",
    params(
        ("key" = LockNameSchema, Path, description = "The run's key"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The attempt's token"),
    ),
    request_body(content = CompleteBody),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Done: the result is stored", body = RunDone),
        (status = 400, description = "No token, no `result`, or an invalid body; nothing was changed", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`run-not-found`: the run is unknown, or its retention ended", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not-run-owner`: the token does not hold the live attempt (another does, it ran out, it was abandoned, or another attempt completed the run); nothing was changed", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time; PUT again with the same token", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
#[allow(clippy::too_many_arguments)]
pub async fn complete(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(key): LockPath,
    headers: HeaderMap,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
    JsonBody(body): JsonBody<CompleteBody>,
) -> Result<Json<RunDone>, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let (result, retention) = completion(&body, &limits)?;
    drop(body);
    let outcome = within(
        deadline,
        locks.complete_run(&key, &token, &result, retention),
    )
    .await;
    metrics.observe_run_complete(&key, &outcome);
    let done = outcome.map_err(timeout_or)??;
    Ok(Json(RunDone::new(&key, done.run())))
}
