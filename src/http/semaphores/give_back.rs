//! `DELETE /semaphores/{name}`: give a permit back.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};

use crate::http::auth::Caller;
use crate::http::breaks::{self, Broken, Delete, ForceQuery};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema, ReleaseBody};
use crate::http::problem::{
    ApiError, BodyRefusals, KeyRefusals, Kind as Problems, Problem, StoreError,
};
use crate::lock::{Kind, Locks, Subject};
use crate::metrics::Metrics;

use super::problem::{PERMIT_NOT_HELD, permit_not_held};

/// Give back the permit the token holds: the next waiter, on any lockd
/// instance, is woken at once.
#[utoipa::path(
    delete,
    path = "/semaphores/{name}",
    operation_id = "releasePermit",
    tag = "semaphores",
    params(
        ("name" = LockNameSchema, Path, description = "Semaphore name"),
        ("Lock-Token" = Option<LockTokenSchema>, Header, description = "The permit's token (a give-back; none with force=true)"),
        ("force" = Option<bool>, Query, description = "`true`: break live permits whatever their token (an admin key's; never without API keys but in --dev)"),
        ("fence" = Option<u64>, Query, description = "With force=true: the fence of the one permit to break; absent: every live one"),
    ),
    request_body(content = Option<ReleaseBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Broken (force=true): whose permits ended", body = Broken),
        (status = 204, description = "Given back"),
        (status = 400, description = "No token, or an invalid body or query (a token with force=true)", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`permit-not-held`: the token holds no permit here (given back already, run out, or broken); with force=true, no live permit matched", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no semaphores", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
#[allow(clippy::too_many_arguments)]
pub async fn give_back(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    caller: Option<Extension<Caller>>,
    StrictQuery(query): StrictQuery<ForceQuery>,
    JsonBody(body): JsonBody<ReleaseBody>,
) -> Result<Response, ApiError> {
    if let Delete::Break(fence) = query.parse()? {
        let given = (&headers, body.token.as_deref());
        let subject = (Subject::new(Kind::Semaphore, name), fence);
        let nothing = |detail| ApiError::new(Problems::Leased(&PERMIT_NOT_HELD), detail);
        let caller = caller.map(|Extension(c)| c);
        let broken =
            breaks::break_leases(&locks, &metrics, deadline, given, caller, subject, nothing);
        return broken.await.map(Json::into_response);
    }
    let token = holder_token(&headers, body.token.as_deref())?;
    let outcome = within(deadline, locks.give_back_permit(&name, &token)).await;
    metrics.observe_permit_release(&name, &outcome);
    match outcome.map_err(timeout_or)? {
        Some(_) => Ok(StatusCode::NO_CONTENT.into_response()),
        None => Err(permit_not_held()),
    }
}
