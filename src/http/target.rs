//! Checks of the request line and of the message framing, on every route,
//! before anything else looks at the request: a refused request reads no
//! body and writes nothing.
//!
//! - A `#fragment` in the request target (marked by [`crate::framing`]):
//!   400. A fragment never leaves a well-behaved client (RFC 9110 §4.2.4),
//!   and hyper would drop it silently.
//! - A path or query string that is not UTF-8 once percent-decoded (such
//!   as `owner=%FF%FE`): 400, rather than values patched with U+FFFD.
//! - A malformed percent-escape in the query string (`%`, `%G0`, `a%2`):
//!   400, rather than the characters taken literally (so that `%25` and
//!   `%` would name the same owner).
//! - A name with a `/` under `/locks/` or `/semaphores/` (`/locks/a/b`):
//!   400 naming the rule, rather than 404; a sub-resource
//!   (`/locks/{name}/events`) is a route.
//! - A `token` in the query string: 400. URLs end up in access logs,
//!   proxies and browser history.
//! - A `Transfer-Encoding` other than `chunked` alone (such as `gzip,
//!   chunked`): 400, with the connection closed, since lockd would
//!   otherwise read the coded bytes as the body.
//! - A `Content-Length` over the body limit ([`BODY_LIMIT`], 65 KiB): 413,
//!   with the connection closed, before reading the body (and before
//!   `100 Continue`). A chunked body over it is cut as it is read
//!   ([`super::deadline`]).

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use percent_encoding::percent_decode_str;
use tower_service::Service;

use super::deadline::closing;
use super::extract::BODY_LIMIT;
use super::problem::ApiError;
use crate::framing::FragmentInTarget;

/// A check made of a request before anything else serves it: the answer
/// to give instead, or `None` to pass it on. Implemented by this module's
/// rules ([`Malformed`]) and by the browser policy of `http::browsers`.
pub trait Check: Clone {
    /// The answer to `request` if it is refused.
    fn refusal(&self, request: &Request) -> Option<Response>;
}

/// The rules above, as a [`Check`].
#[derive(Debug, Clone, Copy)]
pub struct Malformed;

impl Check for Malformed {
    fn refusal(&self, request: &Request) -> Option<Response> {
        refusal(request)
    }
}

/// The layer that refuses a request whose target or framing breaks the
/// rules above with a 400 problem document, and passes the others on.
pub fn refuse_malformed<S>(inner: S) -> Refusing<S, Malformed> {
    Refusing::new(inner, Malformed)
}

/// A service that answers a request itself when its [`Check`] refuses it,
/// and passes the others to `inner`.
///
/// A plain tower service rather than `axum::middleware::from_fn`: a check
/// needs no `await`, so a request passes without a boxed future or a clone
/// of the service below, for the whole time it is served (a parked
/// waiter's included).
#[derive(Debug, Clone)]
pub struct Refusing<S, C> {
    inner: S,
    check: C,
}

impl<S, C> Refusing<S, C> {
    /// `inner` behind `check`.
    pub fn new(inner: S, check: C) -> Self {
        Self { inner, check }
    }
}

impl<S, C> Service<Request> for Refusing<S, C>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    C: Check,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match self.check.refusal(&request) {
            Some(refused) => Either::Left(ready(Ok(refused))),
            None => Either::Right(self.inner.call(request)),
        }
    }
}

/// The answer to `request`, if it breaks a rule above: 400, or 413 for a
/// declared body over the limit.
fn refusal(request: &Request) -> Option<Response> {
    // The body is not read, and its framing is not one lockd takes, or it
    // is too long to read: the connection cannot carry another request.
    if let Some(refusal) = transfer_coding(request.headers()) {
        return Some(closing(refusal.into_response()));
    }
    if declared_length(request.headers()).is_some_and(|length| length > BODY_LIMIT as u64) {
        return Some(closing(ApiError::payload_too_large().into_response()));
    }
    target(request).err().map(IntoResponse::into_response)
}

/// The body length a `Content-Length` header declares, when it is one
/// number (hyper refuses a head with a malformed or conflicting one).
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// 400 unless the `Transfer-Encoding` is absent or `chunked` alone.
fn transfer_coding(headers: &HeaderMap) -> Option<ApiError> {
    let mut values = headers.get_all(header::TRANSFER_ENCODING).iter();
    let first = values.next()?;
    let plain = values.next().is_none()
        && first
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked");
    (!plain).then(|| {
        ApiError::invalid(
            "the only transfer coding accepted is `chunked` alone; send the body plain, \
             with Content-Length or Transfer-Encoding: chunked",
        )
    })
}

fn target(request: &Request) -> Result<(), ApiError> {
    if request.extensions().get::<FragmentInTarget>().is_some() {
        return Err(ApiError::invalid(
            "the request target has a #fragment; a fragment is for the client alone \
             and must not be sent (percent-encode a `#` that belongs in a value as %23)",
        ));
    }
    let uri = request.uri();
    if percent_decode_str(uri.path()).decode_utf8().is_err() {
        return Err(ApiError::invalid(
            "the path is not UTF-8 once percent-decoded",
        ));
    }
    if let Some(rule) = name_with_a_slash(uri.path()) {
        return Err(ApiError::invalid(rule));
    }
    let query = uri.query().unwrap_or("");
    if let Some(bad) = malformed_escape(query) {
        return Err(ApiError::invalid(format!(
            "the query string has a malformed percent-escape at {bad:?}: `%` must be \
             followed by two hex digits (send a literal `%` as %25)"
        )));
    }
    // `&`, `=` and `+` are ASCII, so the whole query decodes to UTF-8 exactly
    // when each of its names and values does.
    if percent_decode_str(query).decode_utf8().is_err() {
        return Err(ApiError::invalid(
            "the query string is not UTF-8 once percent-decoded",
        ));
    }
    if url::form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "token") {
        // Reads (`GET`, `HEAD`) take no token: the usual hint would mislead.
        let instead = if request.method().is_safe() {
            "this request takes no token: drop it"
        } else {
            "send it in the Lock-Token header or in the JSON body"
        };
        return Err(ApiError::invalid(format!(
            "a token must never be sent in the URL (URLs end up in logs); {instead}"
        )));
    }
    Ok(())
}

/// The sub-resources of a lock or a semaphore: `/locks/{name}/events`
/// and `/locks/{name}/history`.
const SUB_RESOURCES: [&str; 2] = ["events", "history"];

/// The sub-resources of a run: `/runs/{key}/result`,
/// `/runs/{key}/events` and `/runs/{key}/history`.
const RUN_SUB_RESOURCES: [&str; 3] = ["result", "events", "history"];

/// The rule a path under `/locks/`, `/semaphores/` or `/runs/` breaks when
/// its name holds a `/` (`/locks/a/b`), which no route takes: a name is one
/// path segment. A sub-resource (`/locks/a/events`) is a route; the rule
/// names them, for a mistyped one (`/locks/a/historyx`).
fn name_with_a_slash(path: &str) -> Option<&'static str> {
    // A mistyped sub-resource (`/locks/a/historyx`) breaks the same rule:
    // the answer names the routes under a name too.
    let (rest, subs, rule) = match path.strip_prefix("/runs/") {
        Some(rest) => (
            rest,
            &RUN_SUB_RESOURCES[..],
            "a run's key is one path segment and cannot contain `/`: keys are 1 to 200 of A-Z \
             a-z 0-9 . _ - : @ (use `:` to group keys, as in jobs:nightly); the routes under a \
             key are /result, /events and /history",
        ),
        None => (
            path.strip_prefix("/locks/")
                .or_else(|| path.strip_prefix("/semaphores/"))?,
            &SUB_RESOURCES[..],
            "a lock or semaphore name is one path segment and cannot contain `/`: names are 1 \
             to 200 of A-Z a-z 0-9 . _ - : @ (use `:` to group names, as in jobs:nightly); the \
             routes under a name are /events and /history",
        ),
    };
    let (name, after) = rest.split_once('/')?;
    (name.is_empty() || !subs.contains(&after)).then_some(rule)
}

/// The first malformed percent-escape of `query` (a `%` not followed by two
/// hex digits), from the `%` on, at most 3 characters.
fn malformed_escape(query: &str) -> Option<&str> {
    let bytes = query.as_bytes();
    let at = bytes.iter().enumerate().position(|(i, b)| {
        *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })?;
    let end = (at + 3).min(query.len());
    Some(query.get(at..end).unwrap_or(&query[at..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_percent_escape_is_found() {
        for bad in ["%", "a=%", "owner=%G0", "owner=a%2", "x=%%41", "a=%2g"] {
            assert!(malformed_escape(bad).is_some(), "{bad}");
        }
        for good in ["", "owner=%25", "owner=a%2Fb%41", "a=1&b=%e2%82%ac"] {
            assert_eq!(malformed_escape(good), None, "{good}");
        }
        assert_eq!(malformed_escape("owner=a%2"), Some("%2"));
        assert_eq!(malformed_escape("owner=%G0x"), Some("%G0"));
    }

    #[test]
    fn a_name_with_a_slash_is_refused_and_sub_resources_are_not() {
        for bad in [
            "/locks/a/b",
            "/locks/a/b/c",
            "/semaphores/a/b",
            "/locks/a/",
            "/locks//events",
            "/locks/a/events/x",
            "/locks/a/b/events",
        ] {
            assert!(name_with_a_slash(bad).is_some(), "{bad}");
        }
        for good in [
            "/locks/a",
            "/locks",
            "/locks/",
            "/locks/a/events",
            "/semaphores/a/events",
            "/healthz",
        ] {
            assert_eq!(name_with_a_slash(good), None, "{good}");
        }
        // A mistyped sub-resource is told the routes there are (found by
        // a new-user trial).
        let rule = name_with_a_slash("/locks/a/historyx").expect("refused");
        assert!(rule.contains("/events and /history"), "{rule}");
        let rule = name_with_a_slash("/runs/a/results").expect("refused");
        assert!(rule.contains("/result, /events and /history"), "{rule}");
    }
}
