//! The one route list (`Routes`), and what is built from it: the router
//! with its layers ([`router`]) and the OpenAPI document ([`document`]).
//! Each route is a handler with its `#[utoipa::path]`, registered with
//! `utoipa_axum::routes!`, so a route cannot be served without being
//! documented, nor documented without being served.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use axum::{Extension, Router, middleware};
use tower_http::timeout::TimeoutLayer;
use tower_layer::{Stack, layer_fn};
use utoipa::OpenApi as _;
use utoipa::openapi::OpenApi;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter, UtoipaMethodRouterExt as _};
use utoipa_axum::routes;

use super::browsers::Browsers;
use super::extract::BODY_LIMIT;
use super::limits::Limits;
use super::locks::{acquire, extend, inspect, list, release};
use super::openapi::{self, ApiDoc};
use super::state::AppState;
use super::{admission, auth, deadline, history, ops, pages, target, telemetry, watch};
use super::{runs, semaphores};
use crate::config::LimitSettings;
use crate::metrics::Metrics;

/// Every route of the API, grouped by the layers they get. A group is an
/// [`OpenApiRouter`]: the handlers and their OpenAPI operations together.
struct Routes {
    /// `/locks/{name}`, `/semaphores/{name}`, `/runs/{key}` (and its
    /// `/result`) and the listings `/locks` and `/semaphores`; their handlers keep their time limits themselves
    /// ([`deadline`]).
    locks: OpenApiRouter<AppState>,
    /// `/locks/{name}/events` and `/semaphores/{name}/events`: streams
    /// that last until the client leaves or shutdown, so they get the key
    /// check alone, with no deadline and no admission slot (their own cap
    /// is `--max-watchers`).
    watches: OpenApiRouter<AppState>,
    /// `/healthz`, `/readyz` and `/openapi.json`.
    ops: OpenApiRouter<AppState>,
    /// `/metrics`, which `--metrics-listen` moves off the main router (it
    /// stays in the document). A method router, so that its key check is a
    /// route layer of the method alone.
    metrics: UtoipaMethodRouter<AppState>,
}

impl Routes {
    /// The route list.
    fn new() -> Self {
        Self {
            locks: OpenApiRouter::new()
                .routes(routes!(acquire::acquire))
                .routes(routes!(inspect::inspect, extend::extend, release::release))
                .routes(routes!(list::list))
                .routes(routes!(semaphores::list::list))
                .routes(routes!(semaphores::take::take))
                .routes(routes!(
                    semaphores::inspect::inspect,
                    semaphores::extend::extend,
                    semaphores::give_back::give_back
                ))
                .routes(routes!(
                    runs::start::start,
                    runs::inspect::inspect,
                    runs::extend::extend,
                    runs::abandon::abandon
                ))
                .routes(routes!(runs::complete::complete))
                .routes(routes!(runs::list::list))
                .routes(routes!(history::lock_history))
                .routes(routes!(history::semaphore_history))
                .routes(routes!(history::run_history)),
            watches: OpenApiRouter::new()
                .routes(routes!(watch::lock_events))
                .routes(routes!(watch::semaphore_events))
                .routes(routes!(watch::run_events)),
            ops: OpenApiRouter::new()
                .routes(routes!(ops::healthz))
                .routes(routes!(ops::readyz))
                .routes(routes!(ops::openapi)),
            metrics: routes!(ops::metrics),
        }
    }
}

/// A time limit past which the request is answered 503 (`timeout`, once
/// normalized).
fn timeout(limit: Duration) -> TimeoutLayer {
    TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limit)
}

/// The OpenAPI document of a server with `limits`: [`ApiDoc`] with every
/// route of the list, `/metrics` included, its headers and open
/// endpoints declared ([`openapi::annotate`]), fitted to the limits
/// ([`openapi::fit`]).
pub fn document(limits: &Limits) -> OpenApi {
    let Routes {
        locks,
        watches,
        ops,
        metrics,
    } = Routes::new();
    let mut doc = OpenApiRouter::<AppState>::with_openapi(ApiDoc::openapi())
        .merge(locks)
        .merge(watches)
        .merge(ops)
        .routes(metrics)
        .into_openapi();
    openapi::annotate(&mut doc);
    openapi::fit(&mut doc, limits);
    doc
}

/// The document of a server with the default settings, as pretty JSON, as
/// committed in `openapi/openapi.json`.
pub fn pretty_json() -> String {
    let doc = Limits::from_settings(&LimitSettings::default())
        .map_err(|e| e.to_string())
        .and_then(|limits| {
            document(&limits)
                .to_pretty_json()
                .map_err(|e| e.to_string())
        });
    doc.unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Builds the main router. `/metrics` is on it unless `with_metrics` is
/// false (it is then served by [`metrics_router`] on its own address).
///
/// Every request must finish within the request timeout, an acquire within
/// its `wait_ms` more; past it: 503 `timeout`. On `/locks` the handlers
/// keep that limit themselves (see [`deadline`]), so that the outcome is
/// counted; the other routes get a `TimeoutLayer`.
pub fn router(state: AppState, with_metrics: bool) -> Router {
    let limits = state.limits;
    let doc = Arc::new(document(&limits));
    let Routes {
        locks,
        watches,
        mut ops,
        metrics,
    } = Routes::new();
    let locks = locks.route_layer(middleware::from_fn_with_state(state.clone(), gate_locks));
    let watches = watches.route_layer(middleware::from_fn_with_state(state.clone(), gate_watches));
    if with_metrics {
        ops = ops.routes(metrics.map(|route| {
            route.route_layer(middleware::from_fn_with_state(
                state.clone(),
                auth::guard_metrics,
            ))
        }));
    }
    let short = timeout(limits.request_timeout);
    // The browser pages (/docs, /ui), outside the document: their own list.
    let pages = pages::router(&doc, &state.metrics);
    let ops = ops
        .layer(Extension(doc))
        .merge(OpenApiRouter::from(pages))
        .layer(short);
    let served = locks.merge(watches).merge(ops);
    declare_routes(&state.metrics, served.get_openapi());
    let metrics = state.metrics.clone();
    // The target checks (a declared Content-Length over the limit among
    // them), then the body limit of axum's extractors.
    let browsers = state.browsers.clone();
    let mut app = Router::from(served).with_state(state);
    if let Some(cors) = browsers.cors() {
        app = app.layer(cors);
    }
    // The target checks, then who may call from a browser, then the body
    // limit of axum's extractors.
    let checks = Stack::new(
        Stack::new(DefaultBodyLimit::max(BODY_LIMIT), browsers.guard()),
        layer_fn(target::refuse_malformed),
    );
    telemetry::wrap(app, metrics, checks, pages::dress)
}

/// What every `/locks/{name}` request passes before its method router, in
/// one layer (each router layer clones and boxes every request once more):
/// a slot in its room ([`admission`]: an overloaded instance
/// refuses before anything else), the key check ([`auth`], before the body
/// is read, so a refused request's body is not), then the deadline and the
/// whole body ([`deadline`]).
///
/// The key check and the body's read are boxed: this future lives as long
/// as the request, through a wait of up to a minute, and an async fn is
/// as large as its largest step, so inline they would keep their room
/// (about 1.4 kB) for every parked waiter (docs/performance.md).
async fn gate_locks(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let _slot = match admission::admit(&state.admission, request.method()) {
        Ok(slot) => slot,
        Err(overloaded) => return overloaded.into_response(),
    };
    let request = match Box::pin(auth::guard_locks(state.auth.as_deref(), state.dev, request)).await
    {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    match Box::pin(deadline::read_body_by_deadline(&state.limits, request)).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    }
}

/// What a watch passes before its handler: the key check alone (the
/// `read` permission, and the name under the key's prefixes).
async fn gate_watches(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match auth::guard_locks(state.auth.as_deref(), state.dev, request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    }
}

/// Declares every operation of `doc` (the routes served) with the status it
/// answers when all goes well, so that their metric series exist from
/// start-up. That status is the operation's highest documented 2xx: 201
/// for an acquire (200 is a renewal), 204 for a release.
fn declare_routes(metrics: &Metrics, doc: &OpenApi) {
    for (route, item) in &doc.paths.paths {
        let operations = [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PATCH", &item.patch),
            ("DELETE", &item.delete),
            ("PUT", &item.put),
        ];
        for (method, operation) in operations {
            let success = operation.as_ref().and_then(|op| {
                op.responses
                    .responses
                    .keys()
                    .filter(|status| status.starts_with('2'))
                    .max()
            });
            if let Some(status) = success {
                metrics.declare_route(method, route, status);
            }
        }
    }
}

/// The router of `--metrics-listen`: `/metrics`, `/healthz` and `/readyz`,
/// so that a private address can carry everything a monitoring system
/// needs, including readiness during a shutdown.
///
/// `browsers` is the policy of its own address: the main listener's
/// allowed origins, and on loopback loopback names only.
pub fn metrics_router(state: AppState, browsers: &Browsers) -> Router {
    let app = Router::new()
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .layer(timeout(state.limits.request_timeout));
    let metrics = state.metrics.clone();
    let mut app = app.with_state(state);
    if let Some(cors) = browsers.cors() {
        app = app.layer(cors);
    }
    let checks = Stack::new(browsers.guard(), layer_fn(target::refuse_malformed));
    // No browser page on this address.
    telemetry::wrap(app, metrics, checks, |_| None)
}
