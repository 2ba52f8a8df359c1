//! Operational routes: health, readiness, metrics and the OpenAPI document.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;
use utoipa::openapi::OpenApi;

use super::limits::Limits;
use super::problem::{ApiError, Problem};
use crate::lock::{Kind, LockError, Locks};
use crate::metrics::{Metrics, Scrape};

/// A health answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` for `/healthz`, `ready` for `/readyz`.
    pub status: &'static str,
}

/// Liveness: 200 while the process runs.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "ops",
    responses((status = 200, description = "The process runs", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: 200 when the lock backend answers PING; 503 when it does not,
/// or from the moment a shutdown begins.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "ops",
    responses(
        (status = 200, description = "Redis answers", body = Health),
        (status = 503, description = "Redis does not answer, or the service is shutting down", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn readyz(
    State(stopping): State<CancellationToken>,
    State(locks): State<Arc<Locks>>,
) -> Result<Json<Health>, ApiError> {
    if stopping.is_cancelled() {
        return Err(LockError::ShuttingDown.into());
    }
    // Any failure is "not ready": a Redis that refuses lockd (a wrong
    // password) is as unusable as one that is down.
    locks.ping().await.map_err(|e| match e {
        LockError::Backend(why) => LockError::Unavailable(why),
        other => other,
    })?;
    Ok(Json(Health { status: "ready" }))
}

/// Prometheus metrics in text format 0.0.4.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "ops",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 401, description = "With API keys on (and no `--metrics-listen`): no key, an unknown key, or a malformed `Authorization` header", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "With API keys on: the key lacks the `metrics` permission", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "With API keys on: the key is over its `requests_per_second`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn metrics(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut scrape = Scrape {
                permits_held: locks.permits_held(limits.request_timeout).await,
                shared_held: locks.shared_held(limits.request_timeout).await,
                watchers: locks.watching(),
                ..Scrape::default()
            };
            locks.for_each_queue(Kind::Lock, |name, n| {
                scrape.lock_waiters.push((name.to_owned(), n))
            });
            locks.for_each_queue(Kind::Semaphore, |name, n| {
                scrape.semaphore_waiters.push((name.to_owned(), n));
            });
            locks.for_each_queue(Kind::Run, |key, n| {
                scrape.run_waiters.push((key.to_owned(), n));
            });
            metrics.render(&scrape)
        },
    )
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "ops",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub async fn openapi(Extension(doc): Extension<Arc<OpenApi>>) -> Json<OpenApi> {
    // Built once by the router, from its route list (see `routes::document`).
    Json(OpenApi::clone(&doc))
}
