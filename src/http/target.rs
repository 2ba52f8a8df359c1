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

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use percent_encoding::percent_decode_str;

use super::problem::ApiError;
use crate::framing::FragmentInTarget;

/// Middleware: refuses a request whose target or framing breaks the rules
/// above with a 400 problem document.
pub async fn refuse_malformed(request: Request, next: Next) -> Response {
    if let Some(refusal) = transfer_coding(request.headers()) {
        let mut response = refusal.into_response();
        // The body was not read, and its framing is not one lockd takes:
        // the connection cannot carry another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    match target(&request) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
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
