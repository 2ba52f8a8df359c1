//! Extractors whose rejections are problem documents, like every other
//! error lockd answers.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::problem::{ApiError, Kind};
use crate::lock::LockName;

/// The largest request body accepted. [`JsonBody`] reads at most this much
/// (the router's `DefaultBodyLimit`); the `/locks` deadline layer reads the
/// body under the same limit, and the router refuses a longer declared
/// `Content-Length` before reading.
pub const BODY_LIMIT: usize = 64 * 1024;

/// The `{name}` path segment, parsed as a [`LockName`].
pub struct LockPath(pub LockName);

impl<S: Send + Sync> FromRequestParts<S> for LockPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(format!("invalid name in path: {}", e.body_text())))?;
        // The request's span already names the lock, from the path,
        // percent-decoded as here.
        Ok(Self(LockName::parse(&raw)?))
    }
}

/// An optional JSON body: an empty body, or the JSON `null` (which the
/// OpenAPI document allows for an optional body), gives `T::default()`. Any
/// other body must be a JSON object of `T`, whatever its `Content-Type`, so
/// that `curl -d '{"ttl_ms":1500}'` works without `-H`. Arrays are refused
/// (serde would otherwise fill the fields by position), and so are
/// compressed bodies (415), and so is a key given twice in any object of
/// the body (400), as a query parameter given twice is: serde would
/// otherwise keep the last.
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
                ApiError::payload_too_large()
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", e.body_text()))
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        let Unique(value) = serde_json::from_slice(&bytes)
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

/// A JSON value in which no object has a key twice: deserializing one with
/// a duplicate key fails with ``duplicate key `<key>` ``.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Unique, E> {
        Ok(Unique(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Unique, E> {
        Ok(Unique(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Unique, E> {
        Ok(Unique(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Unique, E> {
        Ok(Unique(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Unique, E> {
        Ok(Unique(Value::String(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Unique, E> {
        Ok(Unique(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Unique, E> {
        Ok(Unique(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Unique(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key `{key}`; give each key once"
                )));
            }
            let Unique(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Unique(Value::Object(object)))
    }
}
