//! `GET /locks/{name}/events`, `GET /semaphores/{name}/events` and
//! `GET /runs/{key}/events`: a watch as a Server-Sent Events stream (see
//! [`crate::lock::service::watch`]).
//!
//! Each event is `event: KIND`, `id: FENCE-SEQ` and one `data:` line of
//! JSON. The first is `state`; then one per change: `acquired`,
//! `extended`, `released`, `expired` (for a run: `started`, `extended`,
//! `completed`, `abandoned`, `expired`), and `state` again when changes may
//! have been missed. A comment line goes out when the stream has been idle
//! for the keep-alive interval (15 s by default), so that proxies keep it
//! open. The stream ends at shutdown, or once `?wait_ms` ([`WatchQuery`])
//! has passed. Never a token.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::HeaderName;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt as _};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{LockPath, StrictQuery};
use super::limits::Limits;
use super::locks::model::{LockMode, LockNameSchema, rfc3339};
use super::problem::{ApiError, KeyRefusals, Problem};
use super::semaphores::model::PermitStatus;
use crate::lock::service::watch::{LeaseView, RunStage, Sequenced, Snapshot, Watch, WatchEvent};
use crate::lock::{Kind, LockError, Locks, Meta, Subject};

/// `data` of a lock's `state` event: what `GET /locks/{name}` shows, or
/// `held: false`. Never the token.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockState {
    /// The lock's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// Whether the lock is held.
    pub held: bool,
    /// The holder's fencing token; absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The holder's remaining lease in milliseconds; absent when free (or
    /// set by a foreign client without a TTL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// When the lease ends (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The holder's label (`null` when it gave none, as `GET` shows it);
    /// absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub owner: Option<Option<String>>,
    /// The holder's metadata (`null` when it gave none); absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Option<serde_json::Value>>,
    /// When the holder was granted the lock (RFC 3339, UTC; `null` when not
    /// recorded); absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub granted_at: Option<Option<String>>,
    /// `exclusive` or `shared` (the fields above then describe the shared
    /// lease that ends last); absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// How many leases hold it (1 when exclusive); absent when free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_count: Option<usize>,
}

/// `data` of a semaphore's `state` event: what `GET /semaphores/{name}`
/// shows, or `held: false` with no permits. Never a token.
#[derive(Debug, Serialize, ToSchema)]
pub struct SemaphoreState {
    /// The semaphore's name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// Whether any permit is held.
    pub held: bool,
    /// The limit the permits were granted under; absent when none is held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// How many permits are held.
    pub holders: usize,
    /// The held permits, by fence.
    pub permits: Vec<PermitStatus>,
}

/// `data` of a run's `state` event: what `GET /runs/{key}` shows of it
/// (without the result), or `state` `unknown`. Never a token.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunWatchState {
    /// The run's key.
    #[schema(value_type = LockNameSchema)]
    pub key: String,
    /// `running`, `done`, `pending` (started before, no attempt holds it),
    /// or `unknown` (never started, or its retention ended).
    pub state: &'static str,
    /// The live attempt's fencing token, or the completing one's when
    /// done; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// Running: what is left of the attempt's lease, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Running: when the attempt's lease ends (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    /// Running: the holder's label, `null` when it gave none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub owner: Option<Option<String>>,
    /// Running: the holder's metadata, `null` when it gave none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Option<serde_json::Value>>,
}

/// The events of a run's watch, as for [`LockEvents`]: `started` is a new
/// attempt, `completed` the run done, `abandoned` an attempt ended by its
/// holder, `expired` an attempt whose lease ran out.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum RunEvents {
    /// First, and again whenever changes may have been missed.
    #[schema(rename = "state")]
    State(RunWatchState),
    /// A new attempt.
    #[schema(rename = "started")]
    Started(LeaseEvent),
    /// The attempt's lease was reset.
    #[schema(rename = "extended")]
    Extended(LeaseEvent),
    /// The attempt completed the run.
    #[schema(rename = "completed")]
    Completed(EndedEvent),
    /// The attempt was abandoned: the next start runs the job.
    #[schema(rename = "abandoned")]
    Abandoned(EndedEvent),
    /// The attempt's lease ran out unfinished.
    #[schema(rename = "expired")]
    Expired(EndedEvent),
    /// An admin broke the attempt: the next start runs the job.
    #[schema(rename = "broken")]
    Broken(EndedEvent),
}

/// `data` of an `acquired` or `extended` event: one lease (a lock's holder,
/// or one permit). Never its token.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaseEvent {
    /// The lock's (or semaphore's) name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The lease's fencing token.
    pub fence: u64,
    /// The holder's label, `null` when it gave none.
    pub owner: Option<String>,
    /// The holder's metadata (the object it gave as `meta`), `null` when it
    /// gave none.
    #[schema(value_type = Option<Object>)]
    pub meta: Option<serde_json::Value>,
    /// The lease left in milliseconds when the event was sent.
    pub ttl_ms: u64,
    /// When the lease ends (RFC 3339, UTC).
    pub expires_at: String,
    /// When the lease was granted (RFC 3339, UTC), `null` when not known.
    pub granted_at: Option<String>,
    /// A lock's lease: `exclusive` or `shared` (absent for a permit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
}

/// `data` of a `released` event (its holder ended the lease), an
/// `expired` event (the lease ran out without a release) or a `broken` one
/// (an admin ended it).
#[derive(Debug, Serialize, ToSchema)]
pub struct EndedEvent {
    /// The lock's (or semaphore's) name.
    #[schema(value_type = LockNameSchema)]
    pub name: String,
    /// The ended lease's fencing token.
    pub fence: u64,
    /// A semaphore's permits still held after this one ended; for a lock,
    /// the shared leases still held after a shared one ended (absent when
    /// the lock is then free).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holders: Option<usize>,
    /// A `broken` event: the id of the API key that broke the lease
    /// (`dev` in `--dev` without keys); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broken_by: Option<String>,
}

/// The events of a lock's watch, by their `event:` field; each `data:`
/// line is the JSON object named here. Every event's `id:` is `FENCE-SEQ`:
/// the fence it is about (0 for a free lock's `state`) and its place in
/// this instance's sequence.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum LockEvents {
    /// First, and again whenever changes may have been missed.
    #[schema(rename = "state")]
    State(LockState),
    /// A new holder.
    #[schema(rename = "acquired")]
    Acquired(LeaseEvent),
    /// The holder's lease was reset (an extend, or its renewing acquire).
    #[schema(rename = "extended")]
    Extended(LeaseEvent),
    /// The holder released the lock.
    #[schema(rename = "released")]
    Released(EndedEvent),
    /// The holder's lease ran out.
    #[schema(rename = "expired")]
    Expired(EndedEvent),
    /// An admin broke the lease, whatever its token (`DELETE
    /// /locks/{name}?force=true`).
    #[schema(rename = "broken")]
    Broken(EndedEvent),
}

/// The events of a semaphore's watch, as for [`LockEvents`]; `acquired`,
/// `extended`, `released` and `expired` are about one permit.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum SemaphoreEvents {
    /// First, and again whenever changes may have been missed.
    #[schema(rename = "state")]
    State(SemaphoreState),
    /// A new permit.
    #[schema(rename = "acquired")]
    Acquired(LeaseEvent),
    /// A permit's lease was reset.
    #[schema(rename = "extended")]
    Extended(LeaseEvent),
    /// A permit was given back.
    #[schema(rename = "released")]
    Released(EndedEvent),
    /// A permit ran out.
    #[schema(rename = "expired")]
    Expired(EndedEvent),
    /// An admin broke a permit, whatever its token.
    #[schema(rename = "broken")]
    Broken(EndedEvent),
}

/// Watch a lock: a Server-Sent Events stream of its changes, from any
/// lockd instance on the same Redis. Never a token.
#[utoipa::path(
    get,
    path = "/locks/{name}/events",
    operation_id = "watchLock",
    tag = "locks",
    params(("name" = LockNameSchema, Path, description = "Lock name"), WatchQuery),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The stream: `state` first, then one event per change (see the schema for each event's `data`), until `wait_ms` has passed, the client leaves, or shutdown", body = LockEvents, content_type = "text/event-stream"),
        (status = 400, description = "Invalid lock name, or `wait_ms`", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no watches", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`too-many-watchers`, or Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn lock_events(
    State(locks): State<Arc<Locks>>,
    State(limits): State<Limits>,
    LockPath(name): LockPath,
    StrictQuery(query): StrictQuery<WatchQuery>,
) -> Result<Streamed<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    stream(&locks, &limits, Subject::lock(name), &query).await
}

/// Watch a semaphore: a Server-Sent Events stream of its permits' changes,
/// from any lockd instance on the same Redis. Never a token.
#[utoipa::path(
    get,
    path = "/semaphores/{name}/events",
    operation_id = "watchSemaphore",
    tag = "semaphores",
    params(("name" = LockNameSchema, Path, description = "Semaphore name"), WatchQuery),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The stream: `state` first, then one event per permit's change (see the schema for each event's `data`), until `wait_ms` has passed, the client leaves, or shutdown", body = SemaphoreEvents, content_type = "text/event-stream"),
        (status = 400, description = "Invalid name, or `wait_ms`", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no semaphores", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`too-many-watchers`, or Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn semaphore_events(
    State(locks): State<Arc<Locks>>,
    State(limits): State<Limits>,
    LockPath(name): LockPath,
    StrictQuery(query): StrictQuery<WatchQuery>,
) -> Result<Streamed<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    stream(&locks, &limits, Subject::semaphore(name), &query).await
}

/// Watch a run: a Server-Sent Events stream of its attempts and its
/// completion, from any lockd instance on the same Redis, so that a
/// dashboard can follow a job. Never a token.
#[utoipa::path(
    get,
    path = "/runs/{key}/events",
    operation_id = "watchRun",
    tag = "runs",
    params(("key" = LockNameSchema, Path, description = "The run's key"), WatchQuery),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The stream: `state` first, then one event per change (see the schema for each event's `data`), until `wait_ms` has passed, the client leaves, or shutdown", body = RunEvents, content_type = "text/event-stream"),
        (status = 400, description = "Invalid key, or `wait_ms`", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no runs", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`too-many-watchers`, or Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn run_events(
    State(locks): State<Arc<Locks>>,
    State(limits): State<Limits>,
    LockPath(key): LockPath,
    StrictQuery(query): StrictQuery<WatchQuery>,
) -> Result<Streamed<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    stream(&locks, &limits, Subject::run(key), &query).await
}

/// The query of a watch.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// End the stream after this many milliseconds, from 0 to the
    /// server's `--max-wait-ms` (for a caller with a time limit of its
    /// own, such as a serverless function, or a long poll); without it
    /// the stream lasts until the client leaves or shutdown.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 3_600_000)]
    pub wait_ms: Option<String>,
}

/// Asks nginx-style proxies not to buffer the stream.
const NO_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// A watch's answer: the stream, with [`NO_BUFFERING`].
type Streamed<S> = ([(HeaderName, &'static str); 1], Sse<S>);

/// Opens the watch and waits for its first event (the `state`) within the
/// request timeout, so that a store that does not answer is a 503 rather
/// than a stream that says nothing; a first read that fails (Redis down,
/// or not answering within its timeout) is a 503 at once.
async fn stream(
    locks: &Locks,
    limits: &Limits,
    subject: Subject,
    query: &WatchQuery,
) -> Result<Streamed<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    let until = match &query.wait_ms {
        Some(text) => Some(tokio::time::Instant::now() + limits.wait.resolve(Some(text), None)?),
        None => None,
    };
    let mut watch = locks.watch(&subject)?;
    let first = match tokio::time::timeout(limits.request_timeout, watch.first()).await {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None)) => return Err(LockError::ShuttingDown.into()),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => {
            return Err(
                LockError::Unavailable("no first read of a watched lock in time".into()).into(),
            );
        }
    };
    // The `state` first, whatever the wait: a stream of `wait_ms=0` (or one
    // whose wait passed before its body was first read) still says it.
    let state = futures_util::stream::once(std::future::ready(Ok(sse_event(&subject, &first))));
    let changes = futures_util::stream::unfold(
        (watch, subject),
        |(mut watch, subject): (Watch, Subject)| async move {
            let next = watch.next().await?;
            let event = sse_event(&subject, &next);
            Some((Ok(event), (watch, subject)))
        },
    )
    .take_until(async move {
        match until {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    });
    let events = state.chain(changes);
    let sse = Sse::new(events).keep_alive(
        KeepAlive::new()
            .interval(limits.watch_keepalive)
            .text("keep-alive"),
    );
    Ok(([(NO_BUFFERING, "no")], sse))
}

/// One event as Server-Sent Events: `event`, `id` and JSON `data`.
fn sse_event(subject: &Subject, sequenced: &Sequenced) -> Event {
    let event = &sequenced.event;
    let id = format!("{}-{}", event.fence(), sequenced.seq);
    let name = subject.name().to_string();
    let run = subject.kind() == Kind::Run;
    let (kind, data) = match event {
        WatchEvent::State(snapshot) => ("state", state_json(subject, name, snapshot)),
        WatchEvent::Acquired(lease) => (
            if run { "started" } else { "acquired" },
            lease_json(subject, name, lease),
        ),
        WatchEvent::Extended(lease) => ("extended", lease_json(subject, name, lease)),
        WatchEvent::Released { fence } => (
            if run { "abandoned" } else { "released" },
            ended_json(subject, name, *fence, sequenced),
        ),
        WatchEvent::Expired { fence } => ("expired", ended_json(subject, name, *fence, sequenced)),
        WatchEvent::Broken { fence, by } => {
            let mut data = ended(subject, name, *fence, sequenced);
            data.broken_by.clone_from(by);
            ("broken", to_json(&data))
        }
        WatchEvent::Completed { fence } => {
            ("completed", ended_json(subject, name, *fence, sequenced))
        }
    };
    Event::default().event(kind).id(id).data(data)
}

/// The time left until `at`, in milliseconds (0 once past).
fn left_ms(at: SystemTime, now: SystemTime) -> u64 {
    at.duration_since(now)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn state_json(subject: &Subject, name: String, snapshot: &Snapshot) -> String {
    let now = SystemTime::now();
    match subject.kind() {
        Kind::Run => {
            let attempt = snapshot.leases.first();
            let (state, fence) = match snapshot.run {
                Some(RunStage::Running) if attempt.is_some() => {
                    ("running", attempt.map(|a| a.fence))
                }
                Some(RunStage::Done { fence }) => ("done", Some(fence)),
                Some(RunStage::Pending | RunStage::Running) => ("pending", None),
                Some(RunStage::Unknown) | None => ("unknown", None),
            };
            let running = attempt.filter(|_| state == "running");
            to_json(&RunWatchState {
                key: name,
                state,
                fence,
                ttl_ms: running
                    .and_then(|a| a.expires_at)
                    .map(|at| left_ms(at, now)),
                expires_at: running.and_then(|a| a.expires_at).map(rfc3339),
                owner: running.map(|a| a.owner.clone()),
                meta: running.map(|a| a.meta.as_ref().map(Meta::to_value)),
            })
        }
        Kind::Lock => {
            // A shared lock: the lease that ends last, as GET shows it.
            let holder = snapshot.leases.iter().max_by_key(|l| l.expires_at);
            to_json(&LockState {
                name,
                held: holder.is_some(),
                fence: holder.map(|h| h.fence),
                ttl_ms: holder.and_then(|h| h.expires_at).map(|at| left_ms(at, now)),
                expires_at: holder.and_then(|h| h.expires_at).map(rfc3339),
                owner: holder.map(|h| h.owner.clone()),
                meta: holder.map(|h| h.meta.as_ref().map(Meta::to_value)),
                granted_at: holder.map(|h| h.granted_at.map(rfc3339)),
                mode: holder.map(|h| h.mode.into()),
                holder_count: holder.map(|_| snapshot.leases.len()),
            })
        }
        Kind::Semaphore => {
            let permits: Vec<PermitStatus> = snapshot
                .leases
                .iter()
                .map(|p| {
                    let expires_at = p.expires_at.unwrap_or(now);
                    PermitStatus {
                        fence: p.fence,
                        owner: p.owner.clone(),
                        meta: p.meta.as_ref().map(Meta::to_value),
                        ttl_ms: left_ms(expires_at, now),
                        expires_at: rfc3339(expires_at),
                        granted_at: p.granted_at.map(rfc3339),
                    }
                })
                .collect();
            to_json(&SemaphoreState {
                name,
                held: !permits.is_empty(),
                limit: snapshot.limit.map(|l| l.get()),
                holders: permits.len(),
                permits,
            })
        }
    }
}

fn lease_json(subject: &Subject, name: String, lease: &LeaseView) -> String {
    let now = SystemTime::now();
    let expires_at = lease.expires_at.unwrap_or(now);
    to_json(&LeaseEvent {
        name,
        fence: lease.fence,
        owner: lease.owner.clone(),
        meta: lease.meta.as_ref().map(Meta::to_value),
        ttl_ms: left_ms(expires_at, now),
        expires_at: rfc3339(expires_at),
        granted_at: lease.granted_at.map(rfc3339),
        mode: (subject.kind() == Kind::Lock).then(|| lease.mode.into()),
    })
}

fn ended_json(subject: &Subject, name: String, fence: u64, sequenced: &Sequenced) -> String {
    to_json(&ended(subject, name, fence, sequenced))
}

fn ended(subject: &Subject, name: String, fence: u64, sequenced: &Sequenced) -> EndedEvent {
    let holders = match subject.kind() {
        Kind::Semaphore => Some(sequenced.holders),
        Kind::Lock => Some(sequenced.holders).filter(|n| *n > 0),
        Kind::Run => None,
    };
    EndedEvent {
        name,
        fence,
        holders,
        broken_by: None,
    }
}

/// Serializing these plain structs cannot fail; an empty object stands in
/// should it ever.
fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "{}".into())
}

/// The keep-alive interval by default: a comment line after 15 s without
/// an event.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);
