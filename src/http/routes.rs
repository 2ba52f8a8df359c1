//! The route table and the layers around it.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use super::locks::{acquire, extend, inspect, release};
use super::problem::ApiError;
use super::state::AppState;
use super::{ops, problem};

/// The largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

/// How much longer than the longest wait a request may take before it is
/// answered 503.
pub const REQUEST_TIMEOUT_MARGIN: Duration = Duration::from_secs(30);

/// Builds the router with every route and layer.
pub fn router(state: AppState) -> Router {
    let request_timeout = Duration::from_millis(state.wait.max_ms) + REQUEST_TIMEOUT_MARGIN;
    Router::new()
        .route(
            "/locks/{name}",
            get(inspect::inspect)
                .post(acquire::acquire)
                .patch(extend::extend)
                .delete(release::release),
        )
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        // Refuses a declared Content-Length over the limit before reading
        // (and before `100 Continue`); DefaultBodyLimit catches chunked
        // bodies as they are read.
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(middleware::from_fn(refuse_token_in_url))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(middleware::from_fn(problem::normalize))
        .layer(middleware::from_fn_with_state(state.clone(), track_http))
        .layer(
            // The span names the path only: a query string could carry a
            // token that a careless client put there.
            TraceLayer::new_for_http().make_span_with(|req: &Request| {
                tracing::info_span!("http", method = %req.method(), path = %req.uri().path())
            }),
        )
        .with_state(state)
}

/// Counts and times every request by method, route template (never the raw
/// path, which would make one series per lock name) and status.
async fn track_http(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let m = &state.metrics;
    m.http_requests
        .with_label_values(&[method, route.as_str(), status.as_str()])
        .inc();
    m.http_duration
        .with_label_values(&[method, route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
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

/// Refuses, on every route, a query string with a `token` parameter
/// (percent-encoded or not): URLs end up in access logs, proxies and
/// browser history.
async fn refuse_token_in_url(request: Request, next: Next) -> Response {
    let query = request.uri().query().unwrap_or("");
    if url::form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "token") {
        return ApiError::invalid(
            "a token must never be sent in the URL (URLs end up in logs); \
             send it in the Lock-Token header or in the JSON body",
        )
        .into_response();
    }
    next.run(request).await
}
