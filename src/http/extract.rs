//! Extractors whose rejections are problem documents, like every other
//! error lockd answers.

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::limits::Limits;
use super::problem::{ApiError, Kind};
use crate::lock::LockName;
use crate::lock::run::MAX_RESULT_BYTES;

/// The largest request body accepted. [`JsonBody`] reads at most this much
/// (the router's `DefaultBodyLimit`); the `/locks` deadline layer reads the
/// body under the same limit, and the router refuses a longer declared
/// `Content-Length` before reading.
/// A run's largest result ([`MAX_RESULT_BYTES`]) with the rest of its `PUT`
/// body fits.
pub const BODY_LIMIT: usize = MAX_RESULT_BYTES + 1024;

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

/// An optional JSON body: an empty body gives `T::default()`. Any other
/// body must be a JSON object of `T` (the JSON `null` included: the OpenAPI
/// document shows an optional object, not a nullable one), whatever its `Content-Type`, so
/// that `curl -d '{"ttl_ms":1500}'` works without `-H`. Arrays are refused
/// (serde would otherwise fill the fields by position), and so are
/// compressed bodies (415), and so is a key given twice in any object of
/// the body (400), as a query parameter given twice is: serde would
/// otherwise keep the last.
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
    Limits: FromRef<S>,
{
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
        let Unique(value) = serde_json::from_slice(&bytes).map_err(|e| {
            // A key given twice is named only when it may be echoed.
            let words = e.to_string();
            match words.split_once("duplicate key `") {
                Some((_, rest)) if !rest.split('`').next().is_some_and(echoable) => {
                    ApiError::invalid(NOT_ECHOED_FIELD)
                }
                _ => ApiError::invalid(format!("invalid JSON body: {words}")),
            }
        })?;
        if !value.is_object() {
            return Err(ApiError::invalid(
                "the JSON body must be an object, or left out",
            ));
        }
        match T::deserialize(&value) {
            Ok(body) => Ok(Self(body)),
            Err(e) => Err(body_refusal::<T>(&value, &e, &Limits::from_ref(state))),
        }
    }
}

/// The 400 of a body whose field at fault has a name that may not be
/// echoed ([`echoable`]).
const NOT_ECHOED_FIELD: &str = "invalid JSON body: a field's name is not one this route takes, \
                                or is given twice (not echoed: it is empty or over 64 characters, or has \
                                whitespace, `:`, `,` or a quote in it)";

/// The 400 of a body object that `T` refused: naming the field at fault
/// (the first that `T` refuses on its own), with the rule of that field
/// when [`Limits::rule`] has one (so `{"ttl_ms": -1}` is told the TTLs
/// allowed, as `?ttl_ms=-1` is), else serde's words; a field the route
/// does not take (`ttl_ms` on `DELETE`) is named as unknown, whatever its
/// value.
fn body_refusal<T: DeserializeOwned>(
    value: &Value,
    error: &serde_json::Error,
    limits: &Limits,
) -> ApiError {
    let culprit = value.as_object().and_then(|fields| {
        fields.iter().find_map(|(key, field)| {
            let alone = Value::Object(Map::from_iter([(key.clone(), field.clone())]));
            T::deserialize(&alone).err().map(|e| (key, e))
        })
    });
    match culprit {
        Some((key, e))
            if !e.to_string().starts_with("unknown field")
                && let Some(rule) = limits.rule(key) =>
        {
            ApiError::invalid(rule)
        }
        Some((key, e)) if echoable(key) => {
            ApiError::invalid(format!("invalid JSON body: `{key}`: {e}"))
        }
        Some(_) => ApiError::invalid(NOT_ECHOED_FIELD),
        None => ApiError::invalid(format!("invalid JSON body: {error}")),
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
            .map_err(|e| ApiError::invalid(query_refusal(&e.body_text())))
    }
}

/// The most characters of a client's parameter name that a `detail`
/// echoes.
const ECHOED_NAME_CHARS: usize = 64;

/// Whether a parameter name a client sent (a query parameter's, a body
/// field's) may be echoed in a `detail`: not empty, at most
/// [`ECHOED_NAME_CHARS`] characters, and no whitespace, `:`, `,` or quote
/// (`` ` `` or `"`). One that is not may hold `: ` (so where it ends in
/// serde's words cannot be told), or a quote that ends the detail's
/// quoted part early: the access log masks a detail's quoted parts, and
/// would keep what stood outside them (a token put in a name, say).
fn echoable(name: &str) -> bool {
    !name.is_empty()
        && name.chars().nth(ECHOED_NAME_CHARS).is_none()
        && !name.contains(|c: char| c.is_whitespace() || matches!(c, ':' | ',' | '`' | '"'))
}

/// The words of a refused query string, from axum's rejection text
/// (`Failed to deserialize query string: PATH: serde's words`), naming the
/// parameter at fault.
fn query_refusal(text: &str) -> String {
    let words = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text);
    const NOT_PLAIN: &str = "invalid query string: a parameter's name is not one this route \
                             takes (not echoed: it is empty or over 64 characters, or has whitespace, \
                             `:`, `,` or a quote in it)";
    let plain = echoable;
    let whole = words;
    let words = match words.split_once(": ") {
        Some((path, rest)) if plain(path) => rest,
        Some(_) => return NOT_PLAIN.to_owned(),
        None => words,
    };
    let quoted = |s: &str| s.split('`').nth(1).map(str::to_owned);
    let named = |rest: &str| quoted(rest).filter(|name| plain(name));
    if let Some(rest) = words.strip_prefix("duplicate field ") {
        let Some(name) = named(rest) else {
            return NOT_PLAIN.to_owned();
        };
        return format!("the query parameter `{name}` is given twice; give it once");
    }
    if let Some(rest) = words.strip_prefix("unknown field ") {
        let Some(name) = named(rest) else {
            return NOT_PLAIN.to_owned();
        };
        let takes = match rest.split_once(", expected ") {
            Some((_, expected)) => expected
                .strip_prefix("one of ")
                .unwrap_or(expected)
                .to_owned(),
            None => "none".to_owned(),
        };
        return format!("unknown query parameter `{name}`; this route takes {takes}");
    }
    if whole.contains("unknown field `") || whole.contains("duplicate field `") {
        // A name with `: ` in it, cut where it is not serde's.
        return NOT_PLAIN.to_owned();
    }
    format!("invalid query string: {words}")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_query_names_its_parameter() {
        assert_eq!(
            query_refusal("Failed to deserialize query string: duplicate field `ttl_ms`"),
            "the query parameter `ttl_ms` is given twice; give it once"
        );
        assert_eq!(
            query_refusal(
                "Failed to deserialize query string: foo: unknown field `foo`, expected one of `ttl_ms`, `owner`"
            ),
            "unknown query parameter `foo`; this route takes `ttl_ms`, `owner`"
        );
        assert_eq!(
            query_refusal(
                "Failed to deserialize query string: fence: unknown field `fence`, there are no fields"
            ),
            "unknown query parameter `fence`; this route takes none"
        );
        assert_eq!(
            query_refusal(
                "Failed to deserialize query string: wait_ms: invalid digit found in string"
            ),
            "invalid query string: invalid digit found in string"
        );
    }

    /// A parameter's name that is not plain is not echoed: it could not be
    /// told from serde's words, and would stand outside any quotes, where
    /// the access log keeps a detail's text (found by a new-user trial).
    #[test]
    fn a_name_that_is_not_plain_is_not_echoed() {
        for name in [
            "a: SECRET1",
            "a SECRET1",
            "x, expected SECRET1",
            "Lock-Token: SECRET1",
            "token SECRET1",
            "a.b: SECRET1",
        ] {
            let text = format!(
                "Failed to deserialize query string: {name}: unknown field `{name}`, expected one of `ttl_ms`"
            );
            let words = query_refusal(&text);
            assert!(!words.contains("SECRET1"), "{name}: {words}");
            assert!(words.starts_with("invalid query string: "), "{words}");
        }
        // An empty name (`?=5`) is told as such, not as a long or odd one.
        let words = query_refusal(
            "Failed to deserialize query string: unknown field ``, expected one of `ttl_ms`",
        );
        assert!(words.contains("it is empty or"), "{words}");
    }
}
