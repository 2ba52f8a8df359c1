//! `DELETE /runs/{key}`: abandon a run's attempt.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};

use super::model::AbandonBody;
use super::problem::RUN_NOT_FOUND;
use crate::http::auth::Caller;
use crate::http::breaks::{self, Broken, Delete, ForceQuery};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema};
use crate::http::problem::{
    ApiError, BodyRefusals, KeyRefusals, Kind as Problems, Problem, StoreError,
};
use crate::lock::{Kind, Locks, Subject};
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
        ("Lock-Token" = Option<LockTokenSchema>, Header, description = "The attempt's token (an abandonment; none with force=true)"),
        ("force" = Option<bool>, Query, description = "`true`: break the live attempt whatever its token, as an abandonment (an admin key's; never without API keys but in --dev)"),
        ("fence" = Option<u64>, Query, description = "With force=true: break the attempt only if it has this fence"),
    ),
    request_body(content = Option<AbandonBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Broken (force=true): the attempt ended; the next start is a new attempt", body = Broken),
        (status = 204, description = "Abandoned: the next start is a new attempt"),
        (status = 400, description = "No token, or an invalid body or query (a token with force=true)", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`run-not-found`: the run is unknown, or its retention ended; with force=true, no attempt is live", body = Problem, content_type = "application/problem+json"),
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
    caller: Option<Extension<Caller>>,
    StrictQuery(query): StrictQuery<ForceQuery>,
    JsonBody(body): JsonBody<AbandonBody>,
) -> Result<Response, ApiError> {
    if let Delete::Break(fence) = query.parse()? {
        let given = (&headers, body.token.as_deref());
        let subject = (Subject::new(Kind::Run, key), fence);
        let nothing = |detail| ApiError::new(Problems::Leased(&RUN_NOT_FOUND), detail);
        let caller = caller.map(|Extension(c)| c);
        let broken =
            breaks::break_leases(&locks, &metrics, deadline, given, caller, subject, nothing);
        return broken.await.map(Json::into_response);
    }
    let token = holder_token(&headers, body.token.as_deref())?;
    let outcome = within(
        deadline,
        locks.abandon_run(&key, &token, limits.run_retention),
    )
    .await;
    metrics.observe_run_end(&key, &outcome, "abandoned");
    outcome.map_err(timeout_or)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}
