//! Turns the raw query, headers and body of a request into the lock core's
//! parsed types, with the rules shared by every route: a value may come from
//! one place only, and a token never from the URL.

use axum::http::HeaderMap;

use super::model::{AcquireBody, AcquireQuery};
use crate::http::limits::Limits;
use crate::http::problem::ApiError;
use crate::lock::{AcquireRequest, LockName, Meta, Mode, Owner, Token};

/// The header that carries a lock token on PATCH and DELETE.
pub const LOCK_TOKEN: &str = "lock-token";

/// Builds an acquire request from the query, the headers and the body. A
/// token of the client's choosing may come in the `Lock-Token` header or the
/// body; without one, lockd generates one.
///
/// # Errors
/// 400 when a parameter is given twice or a value is invalid (`meta` not
/// an object, or over `--max-meta-bytes`).
pub fn acquire_request(
    name: LockName,
    query: AcquireQuery,
    headers: &HeaderMap,
    body: AcquireBody,
    limits: &Limits,
) -> Result<AcquireRequest, ApiError> {
    let ttl = limits.ttl.resolve(query.ttl_ms.as_deref(), body.ttl_ms)?;
    let meta = body
        .meta
        .map(|value| Meta::parse(&value, limits.max_meta_bytes))
        .transpose()?;
    let owner = match (query.owner, body.owner) {
        (Some(_), Some(_)) => return Err(ApiError::given_twice("owner")),
        (q, b) => q.or(b).map(|o| Owner::parse(&o)).transpose()?,
    };
    let mode = match (query.mode, body.mode) {
        (Some(_), Some(_)) => return Err(ApiError::given_twice("mode")),
        (q, b) => q.or(b).map(|m| Mode::parse(&m)).transpose()?,
    }
    .unwrap_or_default();
    let given = given_token(headers, body.token.as_deref())?;
    let token_generated = given.is_none();
    let token = given.unwrap_or_else(Token::generate);
    Ok(AcquireRequest {
        name,
        token,
        ttl,
        owner,
        meta,
        token_generated,
        mode,
        waits_until: None,
        renew_only: false,
    })
}

/// The token given in the `Lock-Token` header or as the body's `token`, if
/// any.
///
/// # Errors
/// 400 when it is given twice (two headers, or header and body) or is
/// malformed.
pub fn given_token(
    headers: &HeaderMap,
    body_token: Option<&str>,
) -> Result<Option<Token>, ApiError> {
    if headers.get_all(LOCK_TOKEN).iter().nth(1).is_some() {
        return Err(ApiError::invalid(
            "the Lock-Token header was given more than once; give it once",
        ));
    }
    let header = headers
        .get(LOCK_TOKEN)
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::invalid("the Lock-Token header is not ASCII"))
        })
        .transpose()?;
    match (header, body_token) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "the token was given both in the Lock-Token header and in the body; give it once",
        )),
        (Some(raw), None) | (None, Some(raw)) => Ok(Some(Token::parse(raw)?)),
        (None, None) => Ok(None),
    }
}

/// The holder's token, from the `Lock-Token` header or the body's `token`.
///
/// # Errors
/// 400 when there is none, when it is given twice, or when it is malformed.
pub fn holder_token(headers: &HeaderMap, body_token: Option<&str>) -> Result<Token, ApiError> {
    given_token(headers, body_token)?.ok_or_else(|| {
        ApiError::invalid(
            "no token: send the holder's token in the Lock-Token header or as `token` in the JSON body",
        )
    })
}
