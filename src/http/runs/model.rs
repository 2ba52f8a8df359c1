//! The JSON and query shapes of `/runs/{key}`, in the conventions of
//! `/locks/{name}`: every duration in milliseconds (`_ms`), every time RFC
//! 3339 UTC, a token never in a URL.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::locks::model::{
    AcquireBody, AcquireQuery, LockNameSchema, LockTokenSchema, OwnerLabelSchema, rfc3339,
};
use crate::lock::run::{Attempt, DoneRun, RunInfo, RunResult};
use crate::lock::{LockName, Meta};

/// Body of `POST /runs/{key}`; every field is optional, and so is the
/// body. lockd also takes a token of your choosing here, as `token`, in
/// place of the `Lock-Token` header; this document shows only the header,
/// since a token given in both is refused.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The attempt's lease in milliseconds, from 1 to the server's maximum
    /// (default 3600000). Default: the server's default TTL (30000). Run
    /// the job within it, or extend it (PATCH).
    #[schema(minimum = 1, example = 60000)]
    pub ttl_ms: Option<u64>,
    /// A token of your choosing, as the `Lock-Token` header (out of the
    /// document; see above).
    #[schema(ignore)]
    pub token: Option<String>,
    /// A label for the attempt's holder, shown by GET.
    #[schema(value_type = Option<OwnerLabelSchema>)]
    pub owner: Option<String>,
    /// How long to wait while another attempt runs, in milliseconds, from 0
    /// to the server's maximum (default 60000). 0 (the default) answers 409
    /// at once. A waiter gets 200 with the result when the attempt
    /// completes, or 201 (an attempt of its own) when it is abandoned or
    /// runs out.
    #[schema(minimum = 0, example = 5000)]
    pub wait_ms: Option<u64>,
    /// A fingerprint of the job's input, 1 to 128 printable ASCII
    /// characters (a hash of the payload, say): a start with another
    /// fingerprint than the run's first gets 422 and changes nothing.
    #[schema(min_length = 1, max_length = 128, example = "sha256:9f86d081884c7d65")]
    pub fingerprint: Option<String>,
    /// Holder metadata: a JSON object of at most `--max-meta-bytes` bytes
    /// as compact JSON (default 1024), kept with the lease and shown by
    /// GET, listing and watches; never used for decisions.
    #[schema(value_type = Option<Object>, example = json!({"host": "web-1", "pid": 4242}))]
    pub meta: Option<serde_json::Value>,
}

impl StartBody {
    /// The fingerprint, and the fields a lock's acquire has too.
    pub fn split(self) -> (Option<String>, AcquireBody) {
        let Self {
            ttl_ms,
            token,
            owner,
            wait_ms,
            fingerprint,
            meta,
        } = self;
        (
            fingerprint,
            AcquireBody {
                ttl_ms,
                token,
                owner,
                wait_ms,
                mode: None,
                meta,
            },
        )
    }
}

/// Query parameters of `POST /runs/{key}` (out of the OpenAPI document, as
/// for locks). A parameter may not be given both here and in the body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartQuery {
    /// Lease length in milliseconds, as decimal digits.
    pub ttl_ms: Option<String>,
    /// A label for the holder.
    pub owner: Option<String>,
    /// How long to wait, in milliseconds, as decimal digits.
    pub wait_ms: Option<String>,
    /// The fingerprint of the job's input.
    pub fingerprint: Option<String>,
}

impl StartQuery {
    /// The fingerprint, and the parameters a lock's acquire has too.
    pub fn split(self) -> (Option<String>, AcquireQuery) {
        let Self {
            ttl_ms,
            owner,
            wait_ms,
            fingerprint,
        } = self;
        (
            fingerprint,
            AcquireQuery {
                ttl_ms,
                owner,
                wait_ms,
                mode: None,
            },
        )
    }
}

/// `running` or `done`: where a run stands in an answer to a start.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// An attempt holds it.
    Running,
    /// It is done; the result is kept until its retention ends.
    Done,
    /// No attempt holds it and it is not done (GET only).
    Pending,
}

/// An attempt you hold (201: a new one, run the job; 200: your token held
/// it already, its lease reset).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunAttempt {
    /// The run's key.
    #[schema(value_type = LockNameSchema)]
    pub key: String,
    /// Always `running`.
    pub state: RunState,
    /// The attempt's token: send it to complete (PUT .../result), abandon
    /// (DELETE) or extend (PATCH). Keep it out of URLs and logs.
    #[schema(value_type = LockTokenSchema)]
    pub token: String,
    /// The attempt's fencing token: larger than every earlier attempt's of
    /// this key. Pass it to the storage the job writes to, so it can refuse
    /// a slow attempt that was taken over.
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What is left of the attempt's lease, in milliseconds, counted as for
    /// a lock's grant.
    pub ttl_ms: u64,
    /// When the attempt's lease ends at the earliest (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// Which attempt of this key it is: 1 for the first, 2 after one was
    /// abandoned or ran out, and so on.
    #[schema(minimum = 1)]
    pub attempt: u64,
}

impl RunAttempt {
    /// The answer for `attempt` of run `key`, held under `token`.
    pub fn new(key: &LockName, token: String, attempt: &Attempt) -> Self {
        Self {
            key: key.as_str().to_owned(),
            state: RunState::Running,
            token,
            fence: attempt.lease.fence,
            ttl_ms: attempt.lease.ttl.as_millis(),
            expires_at: rfc3339(attempt.lease.expires_at),
            attempt: attempt.number,
        }
    }
}

/// A done run: the job ran, and this is what it stored. Replay it; do not
/// run the job again.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunDone {
    /// The run's key.
    #[schema(value_type = LockNameSchema)]
    pub key: String,
    /// Always `done`.
    pub state: RunState,
    /// What the completing attempt stored: any JSON value.
    #[schema(value_type = Value)]
    pub result: Value,
    /// When it completed (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub completed_at: String,
    /// The completing attempt's fencing token.
    pub fence: u64,
    /// The completing attempt's number.
    pub attempt: u64,
}

impl RunDone {
    /// The answer for done run `key`.
    pub fn new(key: &LockName, done: &DoneRun) -> Self {
        Self {
            key: key.as_str().to_owned(),
            state: RunState::Done,
            result: stored(&done.result),
            completed_at: rfc3339(done.completed_at),
            fence: done.fence,
            attempt: done.attempt,
        }
    }
}

/// A stored result as a JSON value (`null` if it cannot be read: lockd
/// stored it from valid JSON, so only a foreign client's write can make it
/// so).
fn stored(result: &RunResult) -> Value {
    serde_json::from_str(result.as_json()).unwrap_or(Value::Null)
}

/// The answer to a start with 200: a renewed attempt, or a done run.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Started {
    /// `state` `running`: the token held the live attempt already.
    Running(RunAttempt),
    /// `state` `done`: the result to replay.
    Done(RunDone),
}

/// Body of `PUT /runs/{key}/result`. lockd also takes the attempt's token
/// here, as `token`, in place of the `Lock-Token` header.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    /// What the job produced, any JSON value (`null` included), at most
    /// the server's `--max-result-bytes` (default 65536) as compact JSON.
    /// Every later start of this key answers it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Value, required = true)]
    pub result: Option<Value>,
    /// How long to keep the result, in milliseconds, from 1 to the server's
    /// `--run-retention-ms` (default 86400000, 24 h), which is also the
    /// default; more is refused (400). After it the key is new again.
    #[schema(minimum = 1, example = 86_400_000)]
    pub retention_ms: Option<u64>,
    /// The attempt's token, when it is not sent in the `Lock-Token` header
    /// (out of the document).
    #[schema(ignore)]
    pub token: Option<String>,
}

/// A field that was given, as `Some` even when it is `null`.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// Body of `PATCH /runs/{key}`; optional, as for a lock's extend.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunExtendBody {
    /// The attempt's token, when it is not sent in the `Lock-Token` header
    /// (out of the document).
    #[schema(ignore)]
    pub token: Option<String>,
    /// The new lease length in milliseconds, counted from now. Default:
    /// the attempt's own TTL (the one it started with, or was last
    /// extended to).
    #[schema(minimum = 1, example = 60000)]
    pub ttl_ms: Option<u64>,
}

/// Body of `DELETE /runs/{key}`; optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbandonBody {
    /// The attempt's token, when it is not sent in the `Lock-Token` header
    /// (out of the document).
    #[schema(ignore)]
    pub token: Option<String>,
}

/// What anyone may see of a run (`GET /runs/{key}`). Never a token.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunStatus {
    /// The run's key.
    #[schema(value_type = LockNameSchema)]
    pub key: String,
    /// `running`, `done`, or `pending` (started before, no attempt holds
    /// it now: the next start is a new attempt).
    pub state: RunState,
    /// The live, completing or last attempt's fencing token.
    pub fence: u64,
    /// That attempt's number.
    pub attempt: u64,
    /// Running: what is left of the attempt's lease, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Running: when the attempt's lease ends (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    /// Running: the holder's label (`null` when it gave none, as for a
    /// lock).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub owner: Option<Option<String>>,
    /// Running: when the attempt was granted (RFC 3339, UTC; `null` when
    /// not recorded), as `granted_at` is for a lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub granted_at: Option<Option<String>>,
    /// Running: the attempt's holder metadata (`null` when it gave none,
    /// as for a lock).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Option<Value>>,
    /// Done: the stored result.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub result: Option<Value>,
    /// Done: when it completed (RFC 3339, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub completed_at: Option<String>,
    /// Pending: how the last attempt ended, `abandoned` or `expired`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<String>,
}

impl RunStatus {
    /// The status of run `key`, as `info` tells it.
    pub fn new(key: &LockName, info: RunInfo) -> Self {
        let mut status = Self {
            key: key.as_str().to_owned(),
            state: RunState::Pending,
            fence: 0,
            attempt: 0,
            ttl_ms: None,
            expires_at: None,
            owner: None,
            granted_at: None,
            meta: None,
            result: None,
            completed_at: None,
            last_attempt: None,
        };
        match info {
            RunInfo::Running {
                fence,
                attempt,
                remaining,
                owner,
                meta,
                started_at,
            } => {
                status.state = RunState::Running;
                (status.fence, status.attempt) = (fence, attempt);
                status.ttl_ms = Some(u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX));
                status.expires_at = Some(rfc3339(std::time::SystemTime::now() + remaining));
                status.owner = Some(owner);
                status.granted_at = Some(started_at.map(rfc3339));
                status.meta = Some(meta.as_ref().map(Meta::to_value));
            }
            RunInfo::Done(done) => {
                status.state = RunState::Done;
                (status.fence, status.attempt) = (done.fence, done.attempt);
                status.result = Some(stored(&done.result));
                status.completed_at = Some(rfc3339(done.completed_at));
            }
            RunInfo::Pending {
                attempt,
                fence,
                last,
            } => {
                (status.fence, status.attempt) = (fence, attempt);
                status.last_attempt = Some(last.as_str().to_owned());
            }
        }
        status
    }
}

/// One page of `GET /runs`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunList {
    /// Runs still kept (running, done or pending), each as `GET
    /// /runs/{key}` shows it, at most `limit`; possibly fewer, even none,
    /// with `next_cursor` set: follow it until it is `null`.
    pub runs: Vec<RunStatus>,
    /// The `cursor` of the next page (opaque); `null` on the last page.
    #[schema(required = true, value_type = Option<crate::http::locks::model::CursorSchema>)]
    pub next_cursor: Option<String>,
}
