//! Extractors whose rejections are problem documents, like every other
//! error lockd answers.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::problem::{ApiError, Kind};
use crate::lock::LockName;

/// The `{name}` path segment, parsed as a [`LockName`].
pub struct LockPath(pub LockName);

impl<S: Send + Sync> FromRequestParts<S> for LockPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                ApiError::invalid(format!("invalid lock name in path: {}", e.body_text()))
            })?;
        Ok(Self(LockName::parse(&raw)?))
    }
}

/// An optional JSON body: an empty body gives `T::default()`. Any other body
/// must be a JSON object of `T`, whatever its `Content-Type`, so that
/// `curl -d '{"ttl_ms":1500}'` works without `-H`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(Kind::PayloadTooLarge, "the request body is over 64 KiB")
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", e.body_text()))
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(Self)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// The query string, parsed as `T`. A `token` parameter is refused on every
/// route: URLs end up in access logs, proxies and browser history.
pub struct StrictQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let has_token = query
            .split('&')
            .any(|pair| pair.split('=').next() == Some("token"));
        if has_token {
            return Err(ApiError::invalid(
                "a token must never be sent in the URL (URLs end up in logs); \
                 send it in the Lock-Token header or in the JSON body",
            ));
        }
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Self(q))
            .map_err(|e| ApiError::invalid(format!("invalid query string: {}", e.body_text())))
    }
}
