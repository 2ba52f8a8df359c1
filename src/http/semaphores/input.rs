//! Turns a permit request's query, headers and body into the lock core's
//! [`PermitRequest`], with the rules of a lock's acquire (a value from one
//! place only, a token never from the URL) and a required `limit`.

use axum::http::HeaderMap;

use super::model::{TakeBody, TakeQuery};
use crate::http::limits::{Limits, limit_rule};
use crate::http::locks::input::acquire_request;
use crate::http::problem::ApiError;
use crate::lock::LockName;
use crate::lock::semaphore::{Limit, PermitRequest};

/// Builds a permit request from the query, the headers and the body (the
/// caller resolves `wait_ms`).
///
/// # Errors
/// 400 when `limit` is missing, not an integer from 1 to `max_limit`, or
/// given twice, or when any other value is invalid (as for a lock).
pub fn permit_request(
    name: LockName,
    query: TakeQuery,
    headers: &HeaderMap,
    body: TakeBody,
    limits: &Limits,
) -> Result<PermitRequest, ApiError> {
    let max_limit = limits.max_semaphore_limit;
    let (query_limit, query) = query.split();
    let (body_limit, body) = body.split();
    let invalid = || ApiError::invalid(limit_rule(max_limit));
    let raw = match (query_limit, body_limit) {
        (Some(_), Some(_)) => return Err(ApiError::given_twice("limit")),
        (Some(text), None) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse::<u64>().map_err(|_| invalid())?
        }
        (Some(_), None) => return Err(invalid()),
        (None, Some(n)) => n,
        (None, None) => {
            return Err(ApiError::invalid(format!(
                "limit is required: the most holders of this semaphore at once, from 1 to {max_limit}"
            )));
        }
    };
    let limit = Limit::new(raw, max_limit).map_err(|_| invalid())?;
    let lease = acquire_request(name, query, headers, body, limits)?;
    Ok(PermitRequest {
        name: lease.name,
        token: lease.token,
        limit,
        ttl: lease.ttl,
        owner: lease.owner,
        meta: lease.meta,
        token_generated: lease.token_generated,
    })
}
