//! The route tables and the layers around them.

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::get;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa_scalar::{Scalar, Servable as _};

use super::extract::BODY_LIMIT;
use super::locks::{acquire, extend, inspect, release};
use super::state::AppState;
use super::{admission, auth, deadline, openapi, ops, target, telemetry};

/// The `/docs` page: the OpenAPI document (utoipa-scalar puts it in place
/// of `$spec`) rendered by Scalar's script, loaded from jsDelivr at a pinned
/// version with its Subresource Integrity hash.
const DOCS_HTML: &str = include_str!("docs.html");

/// How much later than a `/locks` handler's own limit the route's
/// `TimeoutLayer` cuts the request.
const BACKSTOP: Duration = Duration::from_secs(1);

/// Every route with its method and the status it answers when all goes
/// well: their metric series exist from start-up.
const ROUTES: &[(&str, &str, &str)] = &[
    ("POST", "/locks/{name}", "201"),
    ("PATCH", "/locks/{name}", "200"),
    ("DELETE", "/locks/{name}", "204"),
    ("GET", "/locks/{name}", "200"),
    ("GET", "/healthz", "200"),
    ("GET", "/readyz", "200"),
    ("GET", "/metrics", "200"),
    ("GET", "/openapi.json", "200"),
    ("GET", "/docs", "200"),
];

/// Builds the main router. `/metrics` is on it unless `with_metrics` is
/// false (it is then served by [`metrics_router`] on its own address).
///
/// Every request must finish within `request_timeout`, an acquire within
/// its `wait_ms` more; past it: 503 `timeout`. On `/locks` the handlers
/// keep that limit themselves (see [`deadline`]), so that the outcome is
/// counted; the `TimeoutLayer`s there are a backstop.
pub fn router(state: AppState, with_metrics: bool, request_timeout: Duration) -> Router {
    let max_wait = Duration::from_millis(state.limits.wait.max_ms);
    let timeout = |limit| TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limit);
    let locks = Router::new()
        .route(
            "/locks/{name}",
            axum::routing::post(acquire::acquire)
                .layer(timeout(max_wait + request_timeout + BACKSTOP))
                .merge(
                    get(inspect::inspect)
                        .patch(extend::extend)
                        .delete(release::release)
                        .layer(timeout(request_timeout + BACKSTOP)),
                ),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            deadline::read_body_by_deadline,
        ))
        // Outside the deadline layer: a refused request's body is not read.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::guard_locks,
        ))
        // Outermost: an overloaded instance refuses before anything else.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admission::admit,
        ));
    let short = timeout(request_timeout);
    let mut ops = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/openapi.json", get(ops::openapi));
    if with_metrics {
        ops = ops.route(
            "/metrics",
            get(ops::metrics).route_layer(middleware::from_fn_with_state(
                state.clone(),
                auth::guard_metrics,
            )),
        );
    }
    let ops = ops
        .merge(Router::from(
            Scalar::with_url(
                "/docs",
                openapi::document(state.limits.ttl.max_ms, state.limits.wait.max_ms),
            )
            .custom_html(DOCS_HTML),
        ))
        .layer(short);
    for (method, route, status) in ROUTES {
        if with_metrics || *route != "/metrics" {
            state.metrics.declare_route(method, route, status);
        }
    }
    let app = locks
        .merge(ops)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        // Refuses a declared Content-Length over the limit before reading
        // (and before `100 Continue`); DefaultBodyLimit catches chunked
        // bodies as they are read.
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(middleware::from_fn(target::refuse_malformed));
    let metrics = state.metrics.clone();
    telemetry::wrap(app.with_state(state), metrics)
}

/// The router of `--metrics-listen`: `/metrics`, `/healthz` and `/readyz`,
/// so that a private address can carry everything a monitoring system
/// needs, including readiness during a shutdown.
pub fn metrics_router(state: AppState, request_timeout: Duration) -> Router {
    let app = Router::new()
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(middleware::from_fn(target::refuse_malformed));
    let metrics = state.metrics.clone();
    telemetry::wrap(app.with_state(state), metrics)
}
