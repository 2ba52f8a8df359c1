//! `POST /runs/{key}`: start a run's attempt, or get its result.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::input::start_request;
use super::model::{RunAttempt, RunDone, StartBody, Started as StartedAnswer};
use crate::http::deadline::Deadline;
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::run::Started;
use crate::lock::{LockError, Locks};
use crate::metrics::Metrics;

/// Start the job of `key` once: the first caller gets an attempt (201) and
/// runs the job, then stores its result (`PUT /runs/{key}/result`); every
/// later caller gets that result (200, `state` `done`) and does not run
/// it. While an attempt runs, another caller gets 409 at once, or, with
/// `wait_ms`, waits: for the result when the attempt completes, or for an
/// attempt of its own when it is abandoned or its lease runs out.
///
/// `ttl_ms`, `owner`, `wait_ms` and `fingerprint` may come in the query
/// string instead of the body, and a token of your choosing as `token` in
/// the body instead of the `Lock-Token` header. This document shows each
/// in one place only, since a value given in both is refused.
#[utoipa::path(
    post,
    path = "/runs/{key}",
    operation_id = "startRun",
    tag = "runs",
    params(
        ("key" = LockNameSchema, Path, description = "The run's key (a delivery id, an event id, a cron slot): the alphabet of lock names; a run and a lock of the same name are unrelated"),
        ("Lock-Token" = Option<LockTokenSchema>, Header, nullable = false, description = "A token of your choosing; without one, lockd generates one. Sending the token of the live attempt again renews it (200): a retry after a lost answer"),
    ),
    request_body(content = Option<StartBody>, description = "Optional; an empty body takes the defaults"),
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "A new attempt: run the job, then PUT its result (or DELETE to abandon it)", body = RunAttempt),
        (status = 200, description = "`state` `done`: the job ran; replay `result` and do not run it. `state` `running`: your token held the live attempt already (same fence, lease reset)", body = StartedAnswer),
        (status = 400, description = "An invalid key, TTL, token, owner, fingerprint or body; nothing was written", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 409, description = "`run-in-progress`: another attempt runs the job (after `wait_ms`, if given); `retry_after_ms` and `Retry-After` say when its lease ends", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 422, description = "`fingerprint-mismatch`: the key was first used with another fingerprint; nothing was changed", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "`not-implemented`: this server runs Redlock, which keeps no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time, too many requests are waiting, or the service is shutting down; see `Retry-After`", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(key): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<super::model::StartQuery>,
    JsonBody(body): JsonBody<StartBody>,
) -> Result<Response, ApiError> {
    let wait = limits
        .wait
        .resolve(query.wait_ms.as_deref(), body.wait_ms)?;
    let request = start_request(key, query, &headers, body, &limits)?;
    // As for a lock's acquire: the headers are not kept through a wait.
    drop(headers);
    let (key, token) = (request.key.clone(), request.token.clone());
    // Giving up here is safe: an attempt started after it is abandoned.
    let limit = deadline.remaining() + wait;
    // Counted as cancelled if the client goes away before the answer.
    let pending = metrics.pending_run_start(&key);
    let outcome = tokio::time::timeout(limit, locks.start_run(request, wait))
        .await
        .unwrap_or(Err(LockError::TimedOut));
    pending.finish(&outcome);
    let outcome = outcome.map_err(|e| match e {
        LockError::TimedOut => ApiError::timeout(),
        other => other.into(),
    })??;
    Ok(match outcome {
        Started::New { attempt, .. } => (
            StatusCode::CREATED,
            Json(RunAttempt::new(&key, token.expose().to_owned(), &attempt)),
        )
            .into_response(),
        Started::Renewed(attempt) => Json(StartedAnswer::Running(RunAttempt::new(
            &key,
            token.expose().to_owned(),
            &attempt,
        )))
        .into_response(),
        Started::Done(done) => Json(StartedAnswer::Done(RunDone::new(&key, &done))).into_response(),
    })
}
