//! Runs on the Redis backend: the scripts `run.lua` and `run_*.lua`, whose
//! data model is in `run.lua`'s header and docs/design.md ("Runs"). All
//! keys of one run share the `{key}` hash tag, so each script touches one
//! node, on a single Redis, a Sentinel set's master or a Redis Cluster
//! alike.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use redis::{Script, ScriptInvocation, Value};
use tokio::time::Instant;

use super::events;
use super::history::{self, HISTORY_LUA};
use super::{FENCE_LUA, Grant, GrantKind, PROBE_LUA, RedisBackend};
use crate::lock::history::{BrokenLease, HistoryEntry};
use crate::lock::run::{
    Attempt, Completed, DoneRun, LastEnd, ProbedRun, RunInfo, RunMiss, RunResult, StartRefusal,
    StartRequest, Started,
};
use crate::lock::{
    ExtendTtl, Kind, LaggingWrite, Lease, LockError, LockName, Meta, Token, Ttl, unix_millis,
};

/// The shared part of the run scripts (`read_record`, `ms`).
const RUN_LUA: &str = include_str!("scripts/run.lua");

/// One run script: the history's part (a run's leases are its
/// attempts, each written to the history at its end from the run's
/// record: see `scripts/run.lua`), the shared part, then `body`.
fn script(body: &str, with_fence: bool) -> Script {
    let fence = if with_fence { FENCE_LUA } else { "" };
    Script::new(&format!("{fence}{HISTORY_LUA}{RUN_LUA}{body}"))
}

static START: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/run_start.lua"), true));
static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/run_complete.lua"), false));
static ABANDON: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/run_abandon.lua"), false));
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/run_extend.lua"), false));
const RUN_INSPECT_LUA: &str = include_str!("scripts/run_inspect.lua");
static INSPECT: LazyLock<Script> = LazyLock::new(|| script(RUN_INSPECT_LUA, false));
/// A run's history: the run as `run_inspect.lua` reads it, then `{kept,
/// record}`: its history list, and the fields of the live or last
/// attempt's entry that its record keeps (`{}` when the history is off).
static HISTORY: LazyLock<Script> = LazyLock::new(|| {
    history::read_script(
        &format!("{HISTORY_LUA}{RUN_LUA}"),
        RUN_INSPECT_LUA,
        "{kept, history_on and read_record({'fence', 'started_at_ms', 'ends_ms', 'owner', \
         'meta', 'state'}) or {}}",
    )
});
/// An admin's break of a run's attempt (`run_break.lua`).
static BREAK: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("scripts/run_break.lua"), false));
/// A run's probe: the marker, the fence counter (`KEYS[3]`), then the run as
/// `run_inspect.lua` reads it, in one step.
static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PROBE_LUA}{RUN_LUA}local function read_run()\n{RUN_INSPECT_LUA}\nend\n\
         local read = read_run()\n\
         if read.err then return read end\n\
         table.insert(read, 1, redis.call('GET', KEYS[3]) or '')\n\
         return read\n"
    ))
});

/// The keys of run `K` under prefix `P`: `Prun:{K}:attempt`,
/// `Prun:{K}:record`, `Prun:{K}:fence`, and the change channel
/// `Prun:{K}:released`.
struct RunKeys {
    attempt: String,
    record: String,
    fence: String,
    channel: String,
    history: String,
}

impl RunKeys {
    fn new(prefix: &str, key: &LockName) -> Self {
        let base = super::joined(&[prefix, "run:{", key.as_str(), "}"]);
        Self {
            attempt: super::joined(&[&base, ":attempt"]),
            record: super::joined(&[&base, ":record"]),
            fence: super::joined(&[&base, ":fence"]),
            history: super::joined(&[&base, ":history"]),
            channel: events::channel(prefix, Kind::Run, key),
        }
    }
}

/// A run script's answer, read field by field.
struct Answer(std::vec::IntoIter<Value>);

impl Answer {
    fn new(values: Vec<Value>) -> Self {
        Self(values.into_iter())
    }

    /// The next field as text (a bulk string or an integer).
    fn text(&mut self) -> Result<String, LockError> {
        match self.0.next() {
            Some(Value::BulkString(bytes)) => String::from_utf8(bytes)
                .map_err(|_| LockError::Backend("a run script answered bytes".into())),
            Some(Value::SimpleString(text)) => Ok(text),
            Some(Value::Int(n)) => Ok(n.to_string()),
            other => Err(LockError::Backend(format!(
                "a run script answered {other:?}"
            ))),
        }
    }

    /// The next field as a number.
    fn number(&mut self) -> Result<u64, LockError> {
        let text = self.text()?;
        text.parse()
            .map_err(|_| LockError::Backend(format!("a run script answered {text:?}")))
    }

    /// The next field as a signed number (a PTTL, which is -1 for a key
    /// with no TTL).
    fn signed(&mut self) -> Result<i64, LockError> {
        let text = self.text()?;
        text.parse()
            .map_err(|_| LockError::Backend(format!("a run script answered {text:?}")))
    }

    /// The next field as a signed status.
    fn status(&mut self) -> Result<i64, LockError> {
        let text = self.text()?;
        text.parse()
            .map_err(|_| LockError::Backend(format!("a run script answered status {text:?}")))
    }

    /// A done run from the next three fields (completed at, result) after
    /// its fence and attempt.
    fn done(&mut self) -> Result<DoneRun, LockError> {
        let fence = self.number()?;
        let attempt = self.number()?;
        let completed_at = at_millis(self.number()?);
        let result = RunResult::from_json(self.text()?);
        Ok(DoneRun {
            result,
            completed_at,
            fence,
            attempt,
        })
    }
}

/// The wall-clock time `ms` Unix milliseconds name.
fn at_millis(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// A miss from a complete's, abandon's or extend's status.
fn miss(status: i64) -> Result<RunMiss, LockError> {
    match status {
        0 => Ok(RunMiss::Unknown),
        -1 => Ok(RunMiss::NotOwner { done: false }),
        -2 => Ok(RunMiss::NotOwner { done: true }),
        other => Err(LockError::Backend(format!(
            "a run script answered status {other}"
        ))),
    }
}

/// Milliseconds of a duration, for a script's argument.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisBackend {
    /// Starts an attempt of `req.key`, renews the one `req.token` holds, or
    /// answers a done run (see [`crate::lock::RunNode::start_run`]).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when Redis
    /// fails: the attempt may or may not have started.
    pub async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        let keys = RunKeys::new(&self.prefix, &req.key);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let mut call = START.prepare_invoke();
        call.key(&keys.attempt)
            .key(&keys.record)
            .key(&keys.fence)
            .arg(req.token.expose())
            .arg(req.ttl.as_millis())
            .arg(req.owner.as_ref().map_or("", |o| o.as_str()))
            .arg(unix_millis(sent_wall))
            .arg(self.fence_retention_ms)
            .arg(&keys.channel)
            .arg(self.events.publish())
            .arg(req.fingerprint.as_ref().map_or("", |f| f.as_str()))
            .arg(millis(req.retention))
            .arg(req.meta.as_ref().map_or("", |m| m.as_str()));
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let values: Vec<Value> = match self.run_on(&call, &mut sent_on).await {
            Ok(values) => values,
            Err(e) => {
                self.undo_if_stalled(&e, sent_on, req.token_generated, || {
                    self.attempt_undo(&keys, req)
                });
                return Err(e);
            }
        };
        let mut answer = Answer::new(values);
        let status = answer.status()?;
        if status == 1 || status == 2 {
            // As for a lock: a new attempt short of acks is abandoned; a
            // renewal stands.
            let undo = (status == 1).then(|| self.attempt_undo(&keys, req));
            self.check_replicas(sent_on, &keys.attempt, undo, LaggingWrite::Lease)
                .await?;
        }
        let lease = |fence| {
            Lease::left(fence, req.ttl, sent, sent_wall).ok_or(LockError::LeaseSpent {
                ttl: req.ttl.as_duration(),
            })
        };
        Ok(match status {
            4 => Err(StartRefusal::FingerprintMismatch),
            3 => Ok(Started::Done(answer.done()?)),
            0 => Err(StartRefusal::InProgress {
                // PTTL -1: a foreign client set the attempt's key with no TTL.
                left: super::lease_left(answer.signed()?),
                waited: false,
            }),
            1 => {
                let fence = answer.number()?;
                let number = answer.number()?;
                let took_over = answer.number()? == 1;
                Ok(Started::New {
                    attempt: Attempt {
                        lease: lease(fence)?,
                        number,
                    },
                    took_over,
                })
            }
            2 => {
                let fence = answer.number()?;
                let number = answer.number()?;
                Ok(Started::Renewed(Attempt {
                    lease: lease(fence)?,
                    number,
                }))
            }
            other => {
                return Err(LockError::Backend(format!(
                    "the run start script answered status {other}"
                )));
            }
        })
    }

    /// The attempt `req` starts, and the abandon script that undoes it.
    fn attempt_undo(
        &self,
        keys: &RunKeys,
        req: &StartRequest,
    ) -> (Grant, ScriptInvocation<'static>) {
        let grant = Grant {
            kind: GrantKind::Attempt,
            name: req.key.clone(),
            ttl: req.ttl,
        };
        (grant, self.abandon_call(keys, &req.token, req.retention))
    }

    /// The abandon script of `token`'s attempt, keeping the record for
    /// `retention`.
    fn abandon_call(
        &self,
        keys: &RunKeys,
        token: &Token,
        retention: Duration,
    ) -> ScriptInvocation<'static> {
        let mut call = ABANDON.prepare_invoke();
        call.key(&keys.attempt)
            .key(&keys.record)
            .arg(token.expose())
            .arg(millis(retention).max(1))
            .arg(&keys.channel)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        call
    }

    /// Completes the run whose attempt `token` holds (see
    /// [`crate::lock::RunNode::complete_run`]).
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        let keys = RunKeys::new(&self.prefix, key);
        let now = SystemTime::now();
        let mut call = COMPLETE.prepare_invoke();
        call.key(&keys.attempt)
            .key(&keys.record)
            .arg(token.expose())
            .arg(result.as_json())
            .arg(unix_millis(now))
            .arg(millis(retention).max(1))
            .arg(&keys.channel)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let values: Vec<Value> = self.run_on(&call, &mut sent_on).await?;
        let mut answer = Answer::new(values);
        let status = answer.status()?;
        // A retry after a 503 for short acks waits for them again: the
        // record it finds may still be on the master alone.
        if status == 1 || status == 2 {
            self.check_replicas(sent_on, &keys.record, None, LaggingWrite::Release)
                .await?;
        }
        match status {
            1 => Ok(Ok(Completed::Now(DoneRun {
                fence: answer.number()?,
                attempt: answer.number()?,
                result: result.clone(),
                completed_at: at_millis(unix_millis(now)),
            }))),
            2 => Ok(Ok(Completed::Before(answer.done()?))),
            other => Ok(Err(miss(other)?)),
        }
    }

    /// Abandons the attempt `token` holds (see
    /// [`crate::lock::RunNode::abandon_run`]); the record is kept for
    /// `--run-retention-ms` as the service passes it on start.
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        let keys = RunKeys::new(&self.prefix, key);
        let call = self.abandon_call(&keys, token, retention);
        let mut sent_on = None;
        let values: Vec<Value> = self.run_on(&call, &mut sent_on).await?;
        let status = Answer::new(values).status()?;
        if status == 1 {
            self.check_replicas(sent_on, &keys.attempt, None, LaggingWrite::Release)
                .await?;
            return Ok(Ok(()));
        }
        Ok(Err(miss(status)?))
    }

    /// Resets the lease of the attempt `token` holds (see
    /// [`crate::lock::RunNode::extend_run`]).
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError> {
        let keys = RunKeys::new(&self.prefix, key);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let (given, fallback) = match ttl {
            ExtendTtl::To(ttl) => (ttl.as_millis().to_string(), ttl),
            ExtendTtl::Own { fallback } => (String::new(), fallback),
        };
        let mut call = EXTEND.prepare_invoke();
        call.key(&keys.attempt)
            .key(&keys.record)
            .arg(token.expose())
            .arg(given)
            .arg(fallback.as_millis())
            .arg(millis(retention))
            .arg(&keys.channel)
            .arg(self.events.publish())
            .arg(unix_millis(sent_wall));
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let values: Vec<Value> = self.run_on(&call, &mut sent_on).await?;
        let mut answer = Answer::new(values);
        let status = answer.status()?;
        if status != 1 {
            return Ok(Err(miss(status)?));
        }
        self.check_replicas(sent_on, &keys.attempt, None, LaggingWrite::Lease)
            .await?;
        let fence = answer.number()?;
        let number = answer.number()?;
        let set_to =
            Ttl::from_millis(answer.number()?, Ttl::CEILING_MS, "ttl_ms").unwrap_or(fallback);
        let Some(lease) = Lease::left(fence, set_to, sent, sent_wall) else {
            return Ok(Err(RunMiss::NotOwner { done: false }));
        };
        Ok(Ok(Attempt { lease, number }))
    }

    /// The run's state, or `None` when it is unknown (see
    /// [`crate::lock::RunNode::inspect_run`]).
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        let read_at = Instant::now();
        let values: Vec<Value> = self.run(&self.inspect_run_call(key)).await?;
        run_of(values, read_at)
    }

    /// The inspect script of run `key`.
    pub(super) fn inspect_run_call(&self, key: &LockName) -> ScriptInvocation<'static> {
        let keys = RunKeys::new(&self.prefix, key);
        let mut call = INSPECT.prepare_invoke();
        call.key(&keys.attempt).key(&keys.record);
        call
    }

    /// The history of run `key` (see [`crate::lock::Node::history`]).
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub(super) async fn run_history(&self, key: &LockName) -> Result<Vec<HistoryEntry>, LockError> {
        let keys = RunKeys::new(&self.prefix, key);
        let mut call = HISTORY.prepare_invoke();
        call.key(&keys.attempt).key(&keys.record);
        self.with_history(&mut call, &keys.history);
        let read_at = Instant::now();
        let mut values: Vec<Value> = self.run(&call).await?;
        let (kept, record): (Vec<String>, Vec<Option<String>>) = history::last_of(&mut values)?;
        let live: Vec<u64> = match run_info(&mut Answer::new(values), read_at)? {
            Some(RunInfo::Running { fence, .. }) => vec![fence],
            _ => Vec::new(),
        };
        // The record is the entry of an attempt that has not ended (by a
        // completion, an abandonment or a break, which wrote its entry).
        let open = record.get(5).cloned().flatten().as_deref() == Some("running");
        let record = if open { record } else { Vec::new() };
        Ok(self.settle_history(&kept, &record, None, &live))
    }

    /// Breaks the live attempt of run `key` (see
    /// [`crate::lock::Node::break_leases`]): the run is pending again.
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub(super) async fn break_attempt(
        &self,
        key: &LockName,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        let keys = RunKeys::new(&self.prefix, key);
        let mut call = BREAK.prepare_invoke();
        call.key(&keys.attempt)
            .key(&keys.record)
            .arg(fence.map(|f| f.to_string()).unwrap_or_default())
            .arg(by)
            .arg(&keys.channel)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        let answer: Vec<String> = self.run(&call).await?;
        Ok(history::broken_of(&answer))
    }

    /// As [`Self::inspect_run`], with the run's fence counter, and a
    /// watcher's `marker` published on its change channel in the same step
    /// (see [`crate::lock::RunNode::probe_run`]).
    ///
    /// # Errors
    /// As for [`Self::start_run`].
    pub async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError> {
        let keys = RunKeys::new(&self.prefix, key);
        let mut call = PROBE.prepare_invoke();
        call.key(&keys.attempt)
            .key(&keys.record)
            .key(&keys.fence)
            .arg(&keys.channel)
            .arg(self.events.publish())
            .arg(marker);
        let read_at = Instant::now();
        let values: Vec<Value> = self.run(&call).await?;
        let mut answer = Answer::new(values);
        let counter = answer.text()?.parse().ok();
        Ok(ProbedRun {
            info: run_info(&mut answer, read_at)?,
            counter,
        })
    }
}

/// The run a `run_inspect.lua` answer (`values`) tells of, read from a
/// request sent at `read_at`; `None` when the run is unknown.
///
/// # Errors
/// [`LockError::Backend`] when the answer is not of that shape.
pub(super) fn run_of(values: Vec<Value>, read_at: Instant) -> Result<Option<RunInfo>, LockError> {
    run_info(&mut Answer::new(values), read_at)
}

/// The run a `run_inspect.lua` answer tells of, read from a request sent
/// at `read_at`; `None` when the run is unknown.
///
/// # Errors
/// [`LockError::Backend`] when the answer is not of that shape.
fn run_info(answer: &mut Answer, read_at: Instant) -> Result<Option<RunInfo>, LockError> {
    Ok(match answer.status()? {
        0 => None,
        3 => Some(RunInfo::Done(answer.done()?)),
        1 => {
            let fence = answer.number()?;
            let attempt = answer.number()?;
            let remaining =
                Duration::from_millis(answer.number()?).saturating_sub(read_at.elapsed());
            let owner = Some(answer.text()?).filter(|o| !o.is_empty());
            let started_at = Some(answer.number()?).filter(|&ms| ms > 0).map(at_millis);
            let meta = Meta::from_stored(&answer.text()?);
            Some(RunInfo::Running {
                fence,
                attempt,
                remaining,
                owner,
                meta,
                started_at,
            })
        }
        2 => {
            let fence = answer.number()?;
            let attempt = answer.number()?;
            let last = if answer.text()? == "abandoned" {
                LastEnd::Abandoned
            } else {
                LastEnd::Expired
            };
            Some(RunInfo::Pending {
                attempt,
                fence,
                last,
            })
        }
        other => {
            return Err(LockError::Backend(format!(
                "the run inspect script answered status {other}"
            )));
        }
    })
}
