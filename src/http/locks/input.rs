//! Turns the raw query, headers and body of a request into the lock core's
//! parsed types, with the rules shared by every route: a value may come from
//! one place only, and a token never from the URL.

use std::time::Duration;

use axum::http::HeaderMap;

use super::model::{AcquireBody, AcquireQuery};
use crate::http::problem::ApiError;
use crate::lock::{AcquireRequest, ExtendTtl, LockName, Owner, Token, Ttl};

/// The header that carries a lock token on PATCH and DELETE.
pub const LOCK_TOKEN: &str = "lock-token";

/// The TTL rules of this server.
#[derive(Debug, Clone, Copy)]
pub struct TtlPolicy {
    /// The TTL when a request gives none.
    pub default: Ttl,
    /// The largest TTL a request may ask for, in milliseconds.
    pub max_ms: u64,
}

impl TtlPolicy {
    /// The TTL from a query's text or a body's integer (at most one of them),
    /// or the default.
    ///
    /// # Errors
    /// 400 when both are given or the value is out of range.
    pub fn resolve(&self, query: Option<&str>, body: Option<u64>) -> Result<Ttl, ApiError> {
        Ok(self.given(query, body)?.unwrap_or(self.default))
    }

    /// The TTL an extend asks for: the one given in the query or the body
    /// (at most one of them), or else the lock's own TTL, with the default
    /// for a lock that records none.
    ///
    /// # Errors
    /// As for [`Self::resolve`].
    pub fn resolve_extend(
        &self,
        query: Option<&str>,
        body: Option<u64>,
    ) -> Result<ExtendTtl, ApiError> {
        Ok(match self.given(query, body)? {
            Some(ttl) => ExtendTtl::To(ttl),
            None => ExtendTtl::Own {
                fallback: self.default,
            },
        })
    }

    fn given(&self, query: Option<&str>, body: Option<u64>) -> Result<Option<Ttl>, ApiError> {
        match (query, body) {
            (Some(_), Some(_)) => Err(given_twice("ttl_ms")),
            (Some(text), None) => Ok(Some(Ttl::parse_text(text, self.max_ms, "ttl_ms")?)),
            (None, Some(ms)) => Ok(Some(Ttl::from_millis(ms, self.max_ms, "ttl_ms")?)),
            (None, None) => Ok(None),
        }
    }
}

/// The wait rules of this server.
#[derive(Debug, Clone, Copy)]
pub struct WaitPolicy {
    /// The longest wait a request may ask for, in milliseconds.
    pub max_ms: u64,
}

impl WaitPolicy {
    /// The wait from a query's text or a body's integer (at most one of
    /// them), or zero.
    ///
    /// # Errors
    /// 400 when both are given, or the value is not an integer in
    /// `0..=max_ms`.
    pub fn resolve(&self, query: Option<&str>, body: Option<u64>) -> Result<Duration, ApiError> {
        let out_of_range = || {
            ApiError::invalid(format!(
                "wait_ms must be an integer number of milliseconds from 0 to {}",
                self.max_ms
            ))
        };
        let ms = match (query, body) {
            (Some(_), Some(_)) => return Err(given_twice("wait_ms")),
            (Some(text), None) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse::<u64>().map_err(|_| out_of_range())?
            }
            (Some(_), None) => return Err(out_of_range()),
            (None, Some(ms)) => ms,
            (None, None) => 0,
        };
        if ms > self.max_ms {
            return Err(out_of_range());
        }
        Ok(Duration::from_millis(ms))
    }
}

fn given_twice(field: &str) -> ApiError {
    ApiError::invalid(format!(
        "`{field}` was given both in the query string and in the body; give it once"
    ))
}

/// Builds an acquire request from the query, the headers and the body. A
/// token of the client's choosing may come in the `Lock-Token` header or the
/// body; without one, lockd generates one.
///
/// # Errors
/// 400 when a parameter is given twice or a value is invalid.
pub fn acquire_request(
    name: LockName,
    query: AcquireQuery,
    headers: &HeaderMap,
    body: AcquireBody,
    ttl: &TtlPolicy,
) -> Result<AcquireRequest, ApiError> {
    let ttl = ttl.resolve(query.ttl_ms.as_deref(), body.ttl_ms)?;
    let owner = match (query.owner, body.owner) {
        (Some(_), Some(_)) => return Err(given_twice("owner")),
        (q, b) => q.or(b).map(|o| Owner::parse(&o)).transpose()?,
    };
    let given = given_token(headers, body.token.as_deref())?;
    let token_generated = given.is_none();
    let token = given.unwrap_or_else(Token::generate);
    Ok(AcquireRequest {
        name,
        token,
        ttl,
        owner,
        token_generated,
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
