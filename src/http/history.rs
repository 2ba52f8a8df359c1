//! `GET /locks/{name}/history`, `GET /semaphores/{name}/history` and
//! `GET /runs/{key}/history`: a name's last leases, newest first, and how
//! each ended (see [`crate::lock::history`]). Never a token.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::{Extension, State};
use serde::Serialize;
use utoipa::ToSchema;

use super::deadline::{Deadline, timeout_or, within};
use super::extract::{LockPath, StrictQuery};
use super::locks::model::{LockMode, LockNameSchema, NoQuery, rfc3339};
use super::problem::{ApiError, KeyRefusals, Problem, StoreError};
use crate::lock::history::{HistoryEntry, HistoryLength};
use crate::lock::{Kind, LockName, Locks, Meta, Subject};
use crate::metrics::Metrics;

/// One lease of a history (component `HistoryEntry`): never its token.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = HistoryEntry)]
pub struct Entry {
    /// Its fencing token.
    pub fence: u64,
    /// A lock's lease: `exclusive` or `shared` (absent for a permit or a
    /// run's attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// The holder's label, `null` when it gave none.
    pub owner: Option<String>,
    /// The holder's metadata at its grant, `null` when it gave none.
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
    /// When it was granted (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub granted_at: String,
    /// When its lease ends, or ended, by its last grant, renewal or
    /// extend (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// How it ended: `released` (by its holder; a permit given back),
    /// `expired` (its lease ran out), `broken` (by an admin), `abandoned`
    /// or `completed` (a run's attempt); `null` while it holds.
    #[schema(value_type = Option<String>, example = "released")]
    pub ended: Option<&'static str>,
    /// When it ended (RFC 3339, UTC); `null` while it holds.
    #[schema(format = DateTime)]
    pub ended_at: Option<String>,
    /// How long it was held, in milliseconds: from its grant to its end,
    /// or until now while it holds.
    pub held_ms: u64,
    /// A broken lease: the id of the API key that broke it (`dev` in
    /// `--dev` without keys); `null` otherwise.
    pub broken_by: Option<String>,
}

/// A name's history (200): its last leases, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct History {
    /// The lock's or semaphore's name (absent for a run).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<LockNameSchema>)]
    pub name: Option<String>,
    /// The run's key (absent for a lock or a semaphore).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<LockNameSchema>)]
    pub key: Option<String>,
    /// How many leases a name's history keeps on this server
    /// (`--history-length`; 0: none is kept).
    pub history_length: usize,
    /// The leases, newest first; empty when none is kept (never granted,
    /// or past `--fence-retention-ms`).
    pub entries: Vec<Entry>,
}

impl Entry {
    fn new(entry: HistoryEntry, now: SystemTime) -> Self {
        let held = entry.held_for(now);
        let (ended, ended_at, broken_by) = match entry.ended {
            Some(end) => (Some(end.how.as_str()), Some(rfc3339(end.at)), end.by),
            None => (None, None, None),
        };
        Self {
            fence: entry.fence,
            mode: entry.mode.map(Into::into),
            owner: entry.owner,
            meta: entry.meta.as_ref().map(Meta::to_value),
            granted_at: rfc3339(entry.granted_at),
            expires_at: rfc3339(entry.expires_at),
            ended,
            ended_at,
            held_ms: millis(held),
            broken_by,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Reads the history of `kind` named `name`.
async fn read(
    locks: &Locks,
    metrics: &Metrics,
    deadline: Deadline,
    length: HistoryLength,
    (kind, name): (Kind, LockName),
) -> Result<Json<History>, ApiError> {
    let outcome = within(deadline, locks.history(&Subject::new(kind, name.clone()))).await;
    metrics.observe_inspect(&outcome);
    let now = SystemTime::now();
    let entries = outcome
        .map_err(timeout_or)?
        .into_iter()
        .map(|e| Entry::new(e, now))
        .collect();
    let name = name.to_string();
    let (name, key) = match kind {
        Kind::Run => (None, Some(name)),
        Kind::Lock | Kind::Semaphore => (Some(name), None),
    };
    Ok(Json(History {
        name,
        key,
        history_length: length.get(),
        entries,
    }))
}

/// A lock's last leases, newest first: fence, mode, owner, meta, when
/// granted, and how and when each ended (`released`, `expired`, `broken`)
/// with how long it was held. Never a token.
#[utoipa::path(
    get,
    path = "/locks/{name}/history",
    operation_id = "lockHistory",
    tag = "locks",
    params(("name" = LockNameSchema, Path, description = "Lock name")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The history, newest first (empty when none is kept)", body = History),
        (status = 400, description = "Invalid lock name", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
pub async fn lock_history(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(length): State<HistoryLength>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
) -> Result<Json<History>, ApiError> {
    read(&locks, &metrics, deadline, length, (Kind::Lock, name)).await
}

/// A semaphore's last permits, newest first: fence, owner, meta, when
/// granted, and how and when each ended (`released`: given back,
/// `expired`, `broken`) with how long it was held. Never a token.
#[utoipa::path(
    get,
    path = "/semaphores/{name}/history",
    operation_id = "semaphoreHistory",
    tag = "semaphores",
    params(("name" = LockNameSchema, Path, description = "Semaphore name")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The history, newest first (empty when none is kept)", body = History),
        (status = 400, description = "Invalid semaphore name", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no semaphores", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
pub async fn semaphore_history(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(length): State<HistoryLength>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
) -> Result<Json<History>, ApiError> {
    read(&locks, &metrics, deadline, length, (Kind::Semaphore, name)).await
}

/// A run's last attempts, newest first: fence, owner, meta, when started,
/// and how and when each ended (`completed`, `abandoned`, `expired`,
/// `broken`) with how long it ran. Never a token.
#[utoipa::path(
    get,
    path = "/runs/{key}/history",
    operation_id = "runHistory",
    tag = "runs",
    params(("key" = LockNameSchema, Path, description = "The run's key")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The history, newest first (empty when none is kept)", body = History),
        (status = 400, description = "Invalid key", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
pub async fn run_history(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(length): State<HistoryLength>,
    Extension(deadline): Extension<Deadline>,
    LockPath(key): LockPath,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
) -> Result<Json<History>, ApiError> {
    read(&locks, &metrics, deadline, length, (Kind::Run, key)).await
}
