//! Extractors whose rejections are problem documents, like every other
//! error lockd answers.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
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
        // The request's span already names the lock, from the path.
        Ok(Self(LockName::parse(&raw)?))
    }
}

/// An optional JSON body: an empty body, or the JSON `null` (which the
/// OpenAPI document allows for an optional body), gives `T::default()`. Any
/// other body must be a JSON object of `T`, whatever its `Content-Type`, so
/// that `curl -d '{"ttl_ms":1500}'` works without `-H`. Arrays are refused
/// (serde would otherwise fill the fields by position), and so are
/// compressed bodies (415).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let encoded = req
            .headers()
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if encoded {
            return Err(ApiError::new(
                Kind::UnsupportedMediaType,
                "compressed request bodies are not accepted; send plain JSON",
            ));
        }
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
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))?;
        if value.is_null() {
            return Ok(Self(T::default()));
        }
        if !value.is_object() {
            return Err(ApiError::invalid("the JSON body must be an object"));
        }
        serde_json::from_value(value)
            .map(Self)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// The query string, parsed as `T`; unknown parameters are refused. (A
/// `token` parameter never gets here: a layer refuses it on every route.)
pub struct StrictQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Self(q))
            .map_err(|e| ApiError::invalid(format!("invalid query string: {}", e.body_text())))
    }
}
