//! What wraps every request: a request ID, a tracing span with one access
//! log line, HTTP metrics, and problem documents for errors raised below
//! the handlers ([`normalize`]).
//!
//! The request ID comes from the client's `x-request-id` header when it is
//! usable (1 to 128 visible ASCII characters), or is a fresh UUID. It is
//! returned in the response's `x-request-id`, named in the request's log
//! lines and given as `request_id` in problem documents.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, Method};
use axum::middleware::{self, Next};
use axum::response::Response;
use percent_encoding::percent_decode_str;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::Span;
use tracing::field::Empty;

use super::problem::{self, Problem};
use crate::metrics::Metrics;

/// The request ID header.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The most characters of a lock name from the path put in the span.
const MAX_LOGGED_NAME: usize = 200;

/// The longest client-chosen request ID kept.
const MAX_REQUEST_ID: usize = 128;

/// Puts the layers around `app`; `metrics` counts its requests.
pub fn wrap(app: Router, metrics: Arc<Metrics>) -> Router {
    app.layer(middleware::from_fn(normalize))
        .layer(middleware::from_fn_with_state(metrics, track_http))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(())
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
        .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
        .layer(middleware::from_fn(drop_unusable_request_id))
}

/// The request's ID, once [`SetRequestIdLayer`] has run.
pub fn request_id(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
}

/// Middleware: turns any error response that is not already a problem
/// document (router 404 and 405, body-limit 413, timeout 503) into one
/// ([`problem::as_problem`]), and writes the request's ID into every
/// problem document.
pub async fn normalize(request: Request, next: Next) -> Response {
    let request_id = request_id(&request).map(str::to_owned);
    let response = problem::as_problem(next.run(request).await);
    match request_id {
        Some(id) => problem::with_request_id(response, id),
        None => response,
    }
}

/// Removes a client's `x-request-id` that is empty, too long or not
/// visible ASCII, so that a fresh one replaces it.
async fn drop_unusable_request_id(mut request: Request, next: Next) -> Response {
    let usable = request.headers().get(X_REQUEST_ID).is_none_or(|v| {
        let b = v.as_bytes();
        (1..=MAX_REQUEST_ID).contains(&b.len()) && b.iter().all(|c| (0x21..=0x7e).contains(c))
    });
    if !usable {
        request.headers_mut().remove(X_REQUEST_ID);
    }
    next.run(request).await
}

/// The request's span. It names the method, route template, lock name
/// (recorded by the `LockPath` extractor), request ID, the API key's id
/// (recorded by the key check), and, once answered, status, result and
/// latency. It never names the query string, a lock token or a secret.
fn request_span(request: &Request) -> Span {
    let route = route_of(request);
    // The name from the path, percent-decoded as the handler parses it (so
    // `x%3Ay` is logged as `x:y`, the lock it is), here so that a request
    // refused before its handler ran (a token in the URL, a body over the
    // limit) is still found by lock name.
    let lock = (route == "/locks/{name}")
        .then(|| request.uri().path().rsplit('/').next())
        .flatten()
        .map(logged_name);
    tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        lock = lock.as_deref(),
        request_id = request_id(request).unwrap_or(""),
        key = Empty,
        status = Empty,
        result = Empty,
        detail = Empty,
        latency_ms = Empty,
    )
}

/// A raw path segment as the lock name it stands for: percent-decoded
/// (left raw when that is not UTF-8, which is refused anyway), and cut to
/// [`MAX_LOGGED_NAME`] characters.
fn logged_name(raw: &str) -> String {
    let decoded = percent_decode_str(raw).decode_utf8();
    let name = decoded.as_deref().unwrap_or(raw);
    match name.char_indices().nth(MAX_LOGGED_NAME) {
        Some((end, _)) => name[..end].to_owned(),
        None => name.to_owned(),
    }
}

fn route_of(request: &Request) -> &str {
    request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
}

/// Counts and times every request by method, route template (never the raw
/// path, which would make one series per lock name) and status, counts the
/// requests in flight, and writes the access log line. A request dropped
/// before its answer (the client went away) is counted and logged with
/// status 499, as nginx does.
async fn track_http(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let mut pending = Pending {
        metrics: &metrics,
        method: method_label(request.method()),
        route: route_of(&request).to_owned(),
        started: Instant::now(),
        span: Span::current(),
        answered: false,
    };
    metrics.http_in_flight.inc();
    let response = next.run(request).await;
    pending.answered(&response);
    response
}

/// A request being served; see [`track_http`].
struct Pending<'a> {
    metrics: &'a Metrics,
    method: &'static str,
    route: String,
    started: Instant,
    span: Span,
    answered: bool,
}

impl Pending<'_> {
    fn answered(&mut self, response: &Response) {
        self.answered = true;
        let problem = response.extensions().get::<Problem>();
        let result = problem.map_or("ok", Problem::slug);
        // A client error's detail says what was wrong with the request; it
        // never carries a token. 5xx details stay out of the line (the
        // error itself is logged where it happened).
        let detail = problem
            .filter(|p| (400..500).contains(&p.status))
            .map(|p| mask_quoted(&p.detail));
        self.log(response.status().as_u16(), result, detail.as_deref());
    }

    fn log(&self, status: u16, result: &str, detail: Option<&str>) {
        let took = self.started.elapsed();
        let status_label = status.to_string();
        self.metrics
            .observe_http(self.method, &self.route, &status_label, took);
        let span = &self.span;
        span.record("status", status);
        span.record("result", result);
        if let Some(detail) = detail {
            span.record("detail", detail);
        }
        // Whole microseconds, shown in milliseconds.
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        span.record("latency_ms", f64::from(micros) / 1000.0);
        span.in_scope(|| tracing::info!(target: "lockd::access", "answered"));
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.metrics.http_in_flight.dec();
        if !self.answered {
            self.log(CLIENT_CLOSED, "client-closed", None);
        }
    }
}

/// `detail` with every part quoted in `"` or in `` ` `` replaced by `"…"`
/// or `` `…` ``: a JSON or query error quotes the value or the field name at
/// fault, and a client may have put a token in the wrong place (even as a
/// field name). The client gets the whole detail; the log does not.
fn mask_quoted(detail: &str) -> String {
    let mut out = String::with_capacity(detail.len());
    let mut open: Option<char> = None;
    for c in detail.chars() {
        match open {
            Some(quote) if c == quote => {
                out.push('…');
                out.push(c);
                open = None;
            }
            Some(_) => {}
            None => {
                out.push(c);
                if c == '"' || c == '`' {
                    open = Some(c);
                }
            }
        }
    }
    if open.is_some() {
        // An unclosed quote: everything after it is masked.
        out.push('…');
    }
    out
}

/// The status counted and logged for a request whose client went away
/// before the answer (nginx's "client closed request").
const CLIENT_CLOSED: u16 = 499;

/// The method as a metric label: the standard methods by name, anything
/// else as `other`, so that a client cannot create series at will.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_are_logged_percent_decoded_and_cut() {
        assert_eq!(logged_name("x%3Ay"), "x:y");
        assert_eq!(logged_name("x:y"), "x:y");
        assert_eq!(logged_name("bad%FF"), "bad%FF");
        let long = "é".repeat(MAX_LOGGED_NAME + 5);
        assert_eq!(logged_name(&long).chars().count(), MAX_LOGGED_NAME);
    }

    #[test]
    fn quoted_values_are_masked() {
        assert_eq!(
            mask_quoted(r#"invalid type: string "s3cret-token", expected u64"#),
            r#"invalid type: string "…", expected u64"#
        );
        assert_eq!(mask_quoted("no quotes"), "no quotes");
        assert_eq!(mask_quoted(r#"a "b" c "d"#), r#"a "…" c "…"#);
        assert_eq!(
            mask_quoted("unknown field `s3cret-as-a-name`, expected one of `token`"),
            "unknown field `…`, expected one of `…`"
        );
    }
}
