//! `PATCH /semaphores/{name}`: extend a permit's lease.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;

use super::model::{PermitExtendBody, PermitExtended};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{ExtendQuery, LockNameSchema, LockTokenSchema};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Extend the lease of the permit the token holds, to `ttl_ms` from now
/// (default: the permit's own TTL). A permit that was given back or ran
/// out is gone: 404, and nothing is created.
#[utoipa::path(
    patch,
    path = "/semaphores/{name}",
    operation_id = "extendPermit",
    tag = "semaphores",
    params(
        ("name" = LockNameSchema, Path, description = "Semaphore name"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The permit's token"),
    ),
    request_body(content = Option<PermitExtendBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Extended", body = PermitExtended),
        (status = 400, description = "No token, or an invalid TTL or body; nothing was changed", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`permit-not-held`: the token holds no permit here (given back, or run out)", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no semaphores", body = Problem, content_type = "application/problem+json"),
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
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<ExtendQuery>,
    JsonBody(body): JsonBody<PermitExtendBody>,
) -> Result<Json<PermitExtended>, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let ttl = limits
        .ttl
        .resolve_extend(query.ttl_ms.as_deref(), body.ttl_ms)?;
    let outcome = within(deadline, locks.extend_permit(&name, &token, ttl)).await;
    metrics.observe_permit_extend(&name, &outcome);
    match outcome.map_err(timeout_or)? {
        Some(permit) => Ok(Json(PermitExtended::new(&name, &permit))),
        None => Err(super::problem::permit_not_held()),
    }
}
