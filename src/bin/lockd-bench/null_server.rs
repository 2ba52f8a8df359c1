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
//!
//! `--writes lease` (and `lease-history`) sends instead the least Redis
//! work lockd's exclusive lease needs, each as one script
//! ([`LEASE_ACQUIRE`], [`LEASE_RELEASE`]): the lock, a fence from Redis's
//! clock kept in a counter, the holder's record and a change message at
//! the grant; the compare, the record's read, both deletes and a change
//! message at the release (and with `lease-history`, the ended lease
//! pushed to a history list that is kept the fence retention). No branch,
//! no shared-lease check, no metadata beyond one string: what lockd's
//! scripts cost Redis beyond it is their logic, not the writes its
//! features need (docs/performance.md).

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

/// The grant's writes of `--writes lease`: `SET NX PX` of the lock
/// (`KEYS[1]`), the next fence (`TIME`, then `SET ... GET PX` of the
/// counter `KEYS[2]` for the fence retention, `ARGV[3]` ms), the holder's
/// record as one string (`KEYS[3]`, `ARGV[4]`, for the TTL `ARGV[2]` ms)
/// and the change message on `ARGV[5]`. Returns 1 when granted, else 0.
pub const LEASE_ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now = redis.call('TIME')
  local fence = now[1] .. now[2]
  redis.call('SET', KEYS[2], fence, 'PX', ARGV[3], 'GET')
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[2])
  redis.call('PUBLISH', ARGV[5], 'acquired ' .. fence)
  return 1
end
return 0
";

/// The release's writes of `--writes lease`: compare the token (`ARGV[1]`)
/// with the lock (`KEYS[1]`), read the holder's record (`KEYS[2]`), delete
/// both, publish on `ARGV[2]`; with a retention (`ARGV[3]` ms, not empty)
/// push the record to the history list `KEYS[3]` and keep it that long.
/// Returns 1 when released, else 0.
pub const LEASE_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local record = redis.call('GET', KEYS[2])
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], 'released')
  if ARGV[3] ~= '' and record then
    redis.call('LPUSH', KEYS[3], record)
    redis.call('PEXPIRE', KEYS[3], ARGV[3])
  end
  return 1
end
return 0
";

/// What each request sends to Redis, with `--redis-url`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Writes {
    /// raw-cycle's commands: `SET NX PX`, then the compare-and-delete
    /// script.
    Floor,
    /// The least Redis work an exclusive lease of lockd needs, one script
    /// each way, with no history.
    Lease,
    /// The same, with each ended lease pushed to its name's history list.
    LeaseHistory,
}

/// The fence retention `--writes lease` keeps counters and histories for,
/// in ms: lockd's default (`--fence-retention-ms`).
const RETENTION_MS: u64 = 3_600_000;

/// The Redis behind the server, if any.
#[derive(Clone)]
struct Backend {
    redis: Option<MultiplexedConnection>,
    writes: Writes,
    release: Arc<Script>,
    lease_acquire: Arc<Script>,
    lease_release: Arc<Script>,
}

/// Serves until the process is stopped (SIGTERM or Ctrl-C).
pub async fn run(
    listen: SocketAddr,
    redis_url: Option<&str>,
    writes: Writes,
) -> Result<Value, BenchError> {
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
        writes,
        release: Arc::new(Script::new(RELEASE)),
        lease_acquire: Arc::new(Script::new(LEASE_ACQUIRE)),
        lease_release: Arc::new(Script::new(LEASE_RELEASE)),
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
    if let (Some(mut conn), Writes::Lease | Writes::LeaseHistory) =
        (backend.redis.clone(), backend.writes)
    {
        let record = json!({ "owner": "bench", "granted_at_ms": 1, "ttl_ms": 10_000 }).to_string();
        let granted: Result<i64, _> = backend
            .lease_acquire
            .key(format!("{{{name}}}"))
            .key(format!("{{{name}}}:fence"))
            .key(format!("{{{name}}}:holder"))
            .arg(&token)
            .arg(10_000)
            .arg(RETENTION_MS)
            .arg(record)
            .arg(format!("{{{name}}}:released"))
            .invoke_async(&mut conn)
            .await;
        match granted {
            Ok(1) => {}
            Ok(_) => return StatusCode::CONFLICT.into_response(),
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    } else if let Some(mut conn) = backend.redis {
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
    let deleted: Result<i64, _> = match backend.writes {
        Writes::Floor => {
            backend
                .release
                .key(&name)
                .arg(token)
                .invoke_async(&mut conn)
                .await
        }
        Writes::Lease | Writes::LeaseHistory => {
            let keep = if backend.writes == Writes::LeaseHistory {
                RETENTION_MS.to_string()
            } else {
                String::new()
            };
            backend
                .lease_release
                .key(format!("{{{name}}}"))
                .key(format!("{{{name}}}:holder"))
                .key(format!("{{{name}}}:history"))
                .arg(token)
                .arg(format!("{{{name}}}:released"))
                .arg(keep)
                .invoke_async(&mut conn)
                .await
        }
    };
    match deleted {
        Ok(1) => StatusCode::NO_CONTENT,
        Ok(_) => StatusCode::NOT_FOUND,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}
