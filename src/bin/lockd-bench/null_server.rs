//! `null-server`: a bare axum server that answers lockd's acquire and
//! release routes with fixed answers: no middleware, no logging, no
//! metrics, no lock logic. `GET /readyz` answers 200, so that a load
//! balancer's health check passes (bench/replicas.sh puts haproxy in front).
//!
//! Running `cycle` against it measures what the HTTP exchange alone costs
//! on this machine (client, server and kernel on the same cores): no HTTP
//! service, lockd included, can run more cycles per second here. With
//! `--redis-url` each request also sends raw-cycle's command to Redis
//! (`SET NX PX` on acquire, the compare-and-delete script on release) over
//! one shared multiplexed connection: the floor for any lock service that
//! speaks HTTP in front of Redis.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use redis::Script;
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::client::BenchError;
use crate::raw::RELEASE;

/// The Redis behind the server, if any.
#[derive(Clone)]
struct Backend {
    redis: Option<MultiplexedConnection>,
    release: Arc<Script>,
}

/// Serves until the process is stopped (SIGTERM or Ctrl-C).
pub async fn run(listen: SocketAddr, redis_url: Option<&str>) -> Result<Value, BenchError> {
    let redis = match redis_url {
        Some(url) => Some(
            redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        ),
        None => None,
    };
    let backend = Backend {
        redis,
        release: Arc::new(Script::new(RELEASE)),
    };
    let app = Router::new()
        .route("/locks/{name}", post(acquire).delete(release))
        .route("/readyz", get(|| async { "ready" }))
        .with_state(backend);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("null-server listening on {}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(json!({ "scenario": "null-server" }))
}

async fn acquire(State(backend): State<Backend>, Path(name): Path<String>) -> Response {
    let token = format!("{:032x}", rand::random::<u128>());
    if let Some(mut conn) = backend.redis {
        let set: Result<Option<String>, _> = redis::cmd("SET")
            .arg(&name)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut conn)
            .await;
        match set {
            Ok(Some(_)) => {}
            Ok(None) => return StatusCode::CONFLICT.into_response(),
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    }
    let grant = json!({ "name": name, "token": token, "fence": 1, "ttl_ms": 10_000 });
    (StatusCode::CREATED, axum::Json(grant)).into_response()
}

async fn release(
    State(backend): State<Backend>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> StatusCode {
    let Some(mut conn) = backend.redis else {
        return StatusCode::NO_CONTENT;
    };
    let token = headers
        .get("lock-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let deleted: Result<i64, _> = backend
        .release
        .key(&name)
        .arg(token)
        .invoke_async(&mut conn)
        .await;
    match deleted {
        Ok(1) => StatusCode::NO_CONTENT,
        Ok(_) => StatusCode::NOT_FOUND,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}
