//! Turns a start's query, headers and body into the lock core's
//! [`StartRequest`], with the rules of a lock's acquire (a value from one
//! place only, a token never from the URL) and the run's `fingerprint`;
//! and a complete's body into its result and retention.

use std::time::Duration;

use axum::http::HeaderMap;

use super::model::{CompleteBody, StartBody, StartQuery};
use crate::http::limits::Limits;
use crate::http::locks::input::acquire_request;
use crate::http::problem::{ApiError, Kind};
use crate::lock::LockName;
use crate::lock::run::{self, Fingerprint, RunResult, StartRequest};

/// Builds a start request from the query, the headers and the body (the
/// caller resolves `wait_ms`).
///
/// # Errors
/// 400 when a value is invalid or given twice (as for a lock), or the
/// fingerprint is not 1 to 128 printable ASCII characters.
pub fn start_request(
    key: LockName,
    query: StartQuery,
    headers: &HeaderMap,
    body: StartBody,
    limits: &Limits,
) -> Result<StartRequest, ApiError> {
    let (query_fingerprint, query) = query.split();
    let (body_fingerprint, body) = body.split();
    let fingerprint = match (query_fingerprint, body_fingerprint) {
        (Some(_), Some(_)) => return Err(ApiError::given_twice("fingerprint")),
        (q, b) => q
            .or(b)
            .map(|f| Fingerprint::parse(&f))
            .transpose()
            .map_err(ApiError::invalid)?,
    };
    let lease = acquire_request(key, query, headers, body, limits)?;
    Ok(StartRequest {
        key: lease.name,
        token: lease.token,
        ttl: lease.ttl,
        owner: lease.owner,
        meta: lease.meta,
        fingerprint,
        retention: limits.run_retention,
        token_generated: lease.token_generated,
    })
}

/// The result and retention of a complete's body.
///
/// # Errors
/// 400 when `result` is missing or `retention_ms` is 0 or over
/// `--run-retention-ms`; 413 when the
/// result, as compact JSON, is over `--max-result-bytes` (nothing is
/// changed: the attempt goes on).
pub fn completion(body: &CompleteBody, limits: &Limits) -> Result<(RunResult, Duration), ApiError> {
    let Some(result) = &body.result else {
        return Err(ApiError::invalid(
            "result is required: the job's outcome as any JSON value, which every later start of this key answers",
        ));
    };
    let longest = u64::try_from(limits.run_retention.as_millis()).unwrap_or(u64::MAX);
    if body.retention_ms.is_some_and(|ms| ms == 0 || ms > longest) {
        return Err(ApiError::invalid(
            limits.rule("retention_ms").unwrap_or_default(),
        ));
    }
    let json = serde_json::to_string(result)
        .map_err(|e| ApiError::invalid(format!("result cannot be stored: {e}")))?;
    if json.len() > limits.max_result_bytes {
        return Err(ApiError::new(
            Kind::PayloadTooLarge,
            format!(
                "the result is {} bytes of JSON, over this server's --max-result-bytes ({}); nothing was stored and the attempt goes on: store a smaller result (a reference to where the output is, say)",
                json.len(),
                limits.max_result_bytes
            ),
        ));
    }
    let retention = run::retention(body.retention_ms, limits.run_retention);
    Ok((RunResult::from_json(json), retention))
}
