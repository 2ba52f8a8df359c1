//! Checks of the request line and of the message framing, on every route,
//! before anything else looks at the request: a refused request reads no
//! body and writes nothing.
//!
//! - A `#fragment` in the request target (marked by [`crate::framing`]):
//!   400. A fragment never leaves a well-behaved client (RFC 9110 §4.2.4),
//!   and hyper would drop it silently.
//! - A path or query string that is not UTF-8 once percent-decoded (such
//!   as `owner=%FF%FE`): 400, rather than values patched with U+FFFD.
//! - A `token` in the query string: 400. URLs end up in access logs,
//!   proxies and browser history.
//! - A `Transfer-Encoding` other than `chunked` alone (such as `gzip,
//!   chunked`): 400, with the connection closed, since lockd would
//!   otherwise read the coded bytes as the body.
//! - A `Content-Length` over the body limit ([`BODY_LIMIT`], 64 KiB): 413,
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

/// The layer that refuses a request whose target or framing breaks the
/// rules above with a 400 problem document, and passes the others on.
///
/// A plain tower layer rather than `axum::middleware::from_fn`: the check
/// needs no `await`, so a request passes without a boxed future or a
/// clone of the service below, for the whole time it is served (a parked
/// waiter's included).
pub fn refuse_malformed<S>(inner: S) -> RefuseMalformed<S> {
    RefuseMalformed { inner }
}

/// The service [`refuse_malformed`] puts around another.
#[derive(Debug, Clone)]
pub struct RefuseMalformed<S> {
    inner: S,
}

impl<S> Service<Request> for RefuseMalformed<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match refusal(&request) {
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
    let query = uri.query().unwrap_or("");
    // `&`, `=` and `+` are ASCII, so the whole query decodes to UTF-8 exactly
    // when each of its names and values does.
    if percent_decode_str(query).decode_utf8().is_err() {
        return Err(ApiError::invalid(
            "the query string is not UTF-8 once percent-decoded",
        ));
    }
    if url::form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "token") {
        return Err(ApiError::invalid(
            "a token must never be sent in the URL (URLs end up in logs); \
             send it in the Lock-Token header or in the JSON body",
        ));
    }
    Ok(())
}
