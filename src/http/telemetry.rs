//! What wraps every request: a request ID, a tracing span with one access
//! log line, HTTP metrics, and problem documents for errors raised below
//! the handlers.
//!
//! The request ID comes from the client's `x-request-id` header when it is
//! usable (1 to 128 visible ASCII characters), or is a fresh UUID. It is
//! returned in the response's `x-request-id`, named in the request's log
//! lines and given as `request_id` in problem documents.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, Method};
use axum::middleware::{self, Next};
use axum::response::Response;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::Span;
use tracing::field::Empty;

use super::problem::{self, Problem};
use super::state::AppState;

/// The request ID header.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The most bytes of a raw lock name from the path put in the span.
const MAX_LOGGED_NAME: usize = 200;

/// The longest client-chosen request ID kept.
const MAX_REQUEST_ID: usize = 128;

/// Puts the layers around `app` and gives it its state.
pub fn wrap(app: Router<AppState>, state: AppState) -> Router {
    app.layer(middleware::from_fn(problem::normalize))
        .layer(middleware::from_fn_with_state(state.clone(), track_http))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(access_log)
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
        .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
        .layer(middleware::from_fn(drop_unusable_request_id))
        .with_state(state)
}

/// The request's ID, once [`SetRequestIdLayer`] has run.
pub fn request_id(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
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
/// (recorded by the `LockPath` extractor), request ID, and, once answered,
/// status, result and latency. It never names the query string or a token.
fn request_span(request: &Request) -> Span {
    let route = route_of(request);
    // The raw name from the path, so that a request refused before its
    // handler ran (a token in the URL, a body over the limit) is still
    // found by lock name; the handler records the parsed name over it.
    let lock = (route == "/locks/{name}")
        .then(|| request.uri().path().rsplit('/').next())
        .flatten()
        .map(|raw| raw.get(..MAX_LOGGED_NAME).unwrap_or(raw));
    tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        lock,
        request_id = request_id(request).unwrap_or(""),
        status = Empty,
        result = Empty,
        latency_ms = Empty,
    )
}

/// Records the outcome in the span and writes one access log line
/// (target `lockd::access`, level info).
fn access_log(response: &Response, latency: Duration, span: &Span) {
    span.record("status", response.status().as_u16());
    let result = response
        .extensions()
        .get::<Problem>()
        .map_or("ok", Problem::slug);
    span.record("result", result);
    // Whole microseconds, shown in milliseconds.
    let micros = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
    span.record("latency_ms", f64::from(micros) / 1000.0);
    tracing::info!(target: "lockd::access", "answered");
}

fn route_of(request: &Request) -> &str {
    request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
}

/// Counts and times every request by method, route template (never the raw
/// path, which would make one series per lock name) and status, and counts
/// the requests in flight.
async fn track_http(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = route_of(&request).to_owned();
    let metrics = &state.metrics;
    metrics.http_in_flight.inc();
    // Decrements even when the client hangs up and the request is dropped.
    let _in_flight = InFlight(&metrics.http_in_flight);
    let response = next.run(request).await;
    let status = response.status();
    metrics.observe_http(method, &route, status.as_str(), started.elapsed());
    response
}

struct InFlight<'a>(&'a prometheus::IntGauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

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
