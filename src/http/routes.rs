//! The route table and the layers around it.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use super::locks::{acquire, extend, inspect, release};
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
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let m = &state.metrics;
    m.http_requests
        .with_label_values(&[method.as_str(), route.as_str(), status.as_str()])
        .inc();
    m.http_duration
        .with_label_values(&[method.as_str(), route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}
