//! `DELETE /locks/{name}`: release a lock, or, with `force=true` and an
//! admin key, break it (see [`crate::http::breaks`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};

use super::input::holder_token;
use super::model::{LockNameSchema, LockTokenSchema, ReleaseBody};
use crate::http::auth::Caller;
use crate::http::breaks::{self, Broken, Delete, ForceQuery};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Kind, Problem, StoreError};
use crate::lock::{Locks, Subject};
use crate::metrics::Metrics;

/// Release a lock you hold (compare-and-delete on the token); or, with
/// `force=true` and an API key with the `admin` permission, break it: end
/// its live lease (every shared lease, or the one of `fence`) whatever the
/// token. The broken holder's next extend or release gets 404, the next
/// grant's fence is larger, watchers get `broken`, and the history keeps
/// who broke it.
///
/// The token may come as `token` in the body instead of the `Lock-Token`
/// header. This document shows the header only, since a token given in
/// both is refused.
#[utoipa::path(
    delete,
    path = "/locks/{name}",
    operation_id = "releaseLock",
    tag = "locks",
    params(
        ("name" = LockNameSchema, Path, description = "Lock name"),
        ("Lock-Token" = Option<LockTokenSchema>, Header, description = "The holder's token (a release; none with force=true)"),
        ("force" = Option<bool>, Query, description = "`true`: break the live lease(s) whatever the token (an admin key's; never without API keys but in --dev)"),
        ("fence" = Option<u64>, Query, description = "With force=true: the fence of the one lease to break (a shared lease); absent: every live one"),
    ),
    request_body(content = Option<ReleaseBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Broken (force=true): whose leases ended", body = Broken),
        (status = 204, description = "Released"),
        (status = 400, description = "No token, or an invalid body or query (a token with force=true)", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "Nobody holds the lock: the lease ran out or it was released (or was broken); with force=true, no live lease matched", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another token holds the lock; nothing was changed", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
#[allow(clippy::too_many_arguments)]
pub async fn release(
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
        let subject = (Subject::lock(name), fence);
        let nothing = |detail| ApiError::new(Kind::LockNotHeld, detail);
        let caller = caller.map(|Extension(c)| c);
        let broken =
            breaks::break_leases(&locks, &metrics, deadline, given, caller, subject, nothing);
        return broken.await.map(Json::into_response);
    }
    let token = holder_token(&headers, body.token.as_deref())?;
    let outcome = within(deadline, locks.release(&name, &token)).await;
    metrics.observe_release(&name, &outcome);
    outcome.map_err(timeout_or)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
