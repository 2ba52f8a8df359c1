//! `PATCH /runs/{key}`: extend a run's attempt.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;

use super::model::{RunAttempt, RunExtendBody};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{ExtendQuery, LockNameSchema, LockTokenSchema};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Reset the lease of the attempt your token holds to `ttl_ms` from now
/// (default: its own TTL), as for a lock. Never starts an attempt.
///
/// `ttl_ms` may come in the query string instead of the body, and the
/// token as `token` in the body instead of the `Lock-Token` header.
#[utoipa::path(
    patch,
    path = "/runs/{key}",
    operation_id = "extendRun",
    tag = "runs",
    params(
        ("key" = LockNameSchema, Path, description = "The run's key"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The attempt's token"),
    ),
    request_body(content = Option<RunExtendBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Extended; `token` is the one you sent", body = RunAttempt),
        (status = 400, description = "No token, or an invalid TTL or body; nothing was changed", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`run-not-found`: the run is unknown, or its retention ended", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not-run-owner`: the token does not hold the live attempt (its lease ran out, it was abandoned or taken over), or the run is done; nothing was changed", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
#[allow(clippy::too_many_arguments)]
pub async fn extend(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(key): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<ExtendQuery>,
    JsonBody(body): JsonBody<RunExtendBody>,
) -> Result<Json<RunAttempt>, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let ttl = limits
        .ttl
        .resolve_extend(query.ttl_ms.as_deref(), body.ttl_ms)?;
    let outcome = within(
        deadline,
        locks.extend_run(&key, &token, ttl, limits.run_retention),
    )
    .await;
    metrics.observe_run_end(&key, &outcome, "extended");
    let attempt = outcome.map_err(timeout_or)??;
    Ok(Json(RunAttempt::new(
        &key,
        token.expose().to_owned(),
        &attempt,
    )))
}
