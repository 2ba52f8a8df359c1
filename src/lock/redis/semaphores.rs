//! Semaphores on the Redis backend: the
//! scripts `semaphore.lua` and `sem_*.lua`, whose data model is in
//! docs/design.md ("Semaphores"). All keys of one semaphore share the
//! `{name}` hash tag, so each script touches one node, on a single Redis,
//! a Sentinel set's master or a Redis Cluster alike.

use crate::lock::LaggingWrite;
use crate::lock::semaphore::ProbedSemaphore;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use redis::{Script, ScriptInvocation};
use tokio::time::Instant;

use super::events;
use super::history;
use super::{FENCE_LUA, Grant, GrantKind, PROBE_LUA, RedisBackend};
use crate::lock::history::{BrokenLease, HistoryEntry};
use crate::lock::semaphore::{
    Limit, Permit, PermitInfo, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo,
};
use crate::lock::{
    ExtendTtl, Kind, Lease, LockError, LockName, Meta, Released, Token, Ttl, unix_millis,
};

/// The shared part of the semaphore scripts (`prune`, `now_ms`, ...),
/// after the history's (`tell`, which `prune` calls).
pub(super) const SEMAPHORE_LUA: &str = concat!(
    include_str!("scripts/history.lua"),
    include_str!("scripts/tell.lua"),
    include_str!("scripts/semaphore.lua")
);

static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FENCE_LUA}{SEMAPHORE_LUA}{}",
        include_str!("scripts/sem_acquire.lua")
    ))
});
static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{SEMAPHORE_LUA}{}",
        include_str!("scripts/sem_release.lua")
    ))
});
static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{SEMAPHORE_LUA}{}",
        include_str!("scripts/sem_extend.lua")
    ))
});
const SEM_INSPECT_LUA: &str = include_str!("scripts/sem_inspect.lua");
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{SEMAPHORE_LUA}{SEM_INSPECT_LUA}")));
/// A semaphore's history: its permits as `sem_inspect.lua` reads them,
/// then its history list.
static HISTORY: LazyLock<Script> =
    LazyLock::new(|| history::read_script(SEMAPHORE_LUA, SEM_INSPECT_LUA, "kept"));
/// An admin's break of permits (`sem_break.lua`).
static BREAK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{SEMAPHORE_LUA}{}",
        include_str!("scripts/sem_break.lua")
    ))
});
/// A semaphore's probe: the marker, the fence counter (`KEYS[3]`), then the
/// permits as `sem_inspect.lua` reads them, in one step.
static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PROBE_LUA}{SEMAPHORE_LUA}local function read_semaphore()\n{SEM_INSPECT_LUA}\nend\n\
         local read = read_semaphore()\n\
         table.insert(read, 1, redis.call('GET', KEYS[3]) or '')\n\
         return read\n"
    ))
});

/// The keys of semaphore `N` under prefix `P`: `Psem:{N}:permits`,
/// `Psem:{N}:holders`, `Psem:{N}:fence`, and the release channel
/// `Psem:{N}:released`.
struct SemKeys {
    permits: String,
    holders: String,
    fence: String,
    released: String,
    history: String,
}

impl SemKeys {
    fn new(prefix: &str, name: &LockName) -> Self {
        let base = super::joined(&[prefix, "sem:{", name.as_str(), "}"]);
        Self {
            permits: super::joined(&[&base, ":permits"]),
            holders: super::joined(&[&base, ":holders"]),
            fence: super::joined(&[&base, ":fence"]),
            history: super::joined(&[&base, ":history"]),
            released: events::channel(prefix, Kind::Semaphore, name),
        }
    }
}

/// A permit's record in the holders hash.
#[derive(serde::Deserialize)]
struct Record {
    fence: String,
    #[serde(default)]
    owner: String,
    #[serde(default)]
    granted_at_ms: Option<u64>,
    #[serde(default)]
    meta: String,
}

impl RedisBackend {
    /// Takes one permit of `req.name`, or renews the one `req.token` holds.
    /// The inner `Err` is a refusal: full, or another limit held.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when Redis
    /// fails: the permit may or may not have been granted.
    pub async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        let keys = SemKeys::new(&self.prefix, &req.name);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let mut call = TAKE.prepare_invoke();
        call.key(&keys.permits)
            .key(&keys.holders)
            .key(&keys.fence)
            .arg(req.token.expose())
            .arg(req.limit.get())
            .arg(req.ttl.as_millis())
            .arg(req.owner.as_ref().map_or("", |o| o.as_str()))
            .arg(unix_millis(sent_wall))
            .arg(self.fence_retention_ms)
            .arg(&keys.released)
            .arg(self.events.publish())
            .arg(req.meta.as_ref().map_or("", |m| m.as_str()));
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let (status, value, limit): (i64, String, i64) =
            match self.run_on(&call, &mut sent_on).await {
                Ok(answer) => answer,
                Err(e) => {
                    self.undo_if_stalled(&e, sent_on, req.token_generated, || {
                        self.permit_undo(&keys, req)
                    });
                    return Err(e);
                }
            };
        let limit = stored_limit(limit)?;
        if status == 1 || status == 2 {
            // As for a lock: a new permit short of acks is given back; a
            // renewal stands.
            let undo = (status == 1).then(|| self.permit_undo(&keys, req));
            self.check_replicas(sent_on, &keys.permits, undo, LaggingWrite::Lease)
                .await?;
        }
        match status {
            0 => Ok(Err(Refusal::Full {
                retry_after: Duration::from_millis(stored_number(&value)?),
                limit,
            })),
            3 => Ok(Err(Refusal::LimitMismatch { held: limit })),
            1 | 2 => {
                let lease = Lease::left(stored_number(&value)?, req.ttl, sent, sent_wall).ok_or(
                    LockError::LeaseSpent {
                        ttl: req.ttl.as_duration(),
                    },
                )?;
                let permit = Permit { lease, limit };
                Ok(Ok(if status == 1 {
                    PermitOutcome::Granted(permit)
                } else {
                    PermitOutcome::Renewed(permit)
                }))
            }
            other => Err(LockError::Backend(format!(
                "semaphore script answered status {other}"
            ))),
        }
    }

    /// Gives back the permit `token` holds, and tells when it was granted;
    /// `None` when it holds none (given back, or run out).
    ///
    /// # Errors
    /// As for [`Self::take_permit`].
    pub async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        let keys = SemKeys::new(&self.prefix, name);
        let call = self.give_back_call(&keys, token);
        let mut sent_on = None;
        let (released, granted_at_ms): (i64, u64) = self.run_on(&call, &mut sent_on).await?;
        if released == 1 {
            self.check_replicas(sent_on, &keys.permits, None, LaggingWrite::Release)
                .await?;
        }
        Ok((released == 1).then(|| Released {
            granted_at: (granted_at_ms > 0)
                .then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(granted_at_ms)),
            ..Released::default()
        }))
    }

    /// The permit `req` grants, and the give-back script that undoes it.
    fn permit_undo(
        &self,
        keys: &SemKeys,
        req: &PermitRequest,
    ) -> (Grant, ScriptInvocation<'static>) {
        let grant = Grant {
            kind: GrantKind::Permit,
            name: req.name.clone(),
            ttl: req.ttl,
        };
        (grant, self.give_back_call(keys, &req.token))
    }

    /// The give-back script of `token`'s permit.
    fn give_back_call(&self, keys: &SemKeys, token: &Token) -> ScriptInvocation<'static> {
        let mut call = GIVE_BACK.prepare_invoke();
        call.key(&keys.permits)
            .key(&keys.holders)
            .arg(token.expose())
            .arg(&keys.released)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        call
    }

    /// Resets the lease of the permit `token` holds to `ttl`; `None` when
    /// it holds none. Never recreates a permit.
    ///
    /// # Errors
    /// As for [`Self::take_permit`].
    pub async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        let keys = SemKeys::new(&self.prefix, name);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let (given, fallback) = match ttl {
            ExtendTtl::To(ttl) => (ttl.as_millis().to_string(), ttl),
            ExtendTtl::Own { fallback } => (String::new(), fallback),
        };
        let mut call = EXTEND.prepare_invoke();
        call.key(&keys.permits)
            .key(&keys.holders)
            .arg(token.expose())
            .arg(given)
            .arg(&keys.released)
            .arg(self.events.publish())
            .arg(fallback.as_millis())
            .arg(unix_millis(sent_wall));
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let (status, fence, limit, ttl_ms): (i64, String, i64, u64) =
            self.run_on(&call, &mut sent_on).await?;
        if status != 1 {
            return Ok(None);
        }
        self.check_replicas(sent_on, &keys.permits, None, LaggingWrite::Lease)
            .await?;
        let set_to = Ttl::from_millis(ttl_ms, Ttl::CEILING_MS, "ttl_ms").unwrap_or(fallback);
        let Some(lease) = Lease::left(stored_number(&fence)?, set_to, sent, sent_wall) else {
            return Ok(None);
        };
        Ok(Some(Permit {
            lease,
            limit: stored_limit(limit)?,
        }))
    }

    /// The semaphore's limit and live permits (never a token), or `None`
    /// when no permit is held.
    ///
    /// # Errors
    /// As for [`Self::take_permit`].
    pub async fn inspect_semaphore(
        &self,
        name: &LockName,
    ) -> Result<Option<SemaphoreInfo>, LockError> {
        let read_at = Instant::now();
        let answer: Vec<redis::Value> = self.run(&self.inspect_semaphore_call(name)).await?;
        semaphore_of(answer, read_at)
    }

    /// As [`Self::inspect_semaphore`], and a watcher's `marker` published
    /// on the semaphore's change channel in the same step (see
    /// [`crate::lock::LockNode::probe`]).
    ///
    /// # Errors
    /// As for [`Self::take_permit`].
    pub async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
        let keys = SemKeys::new(&self.prefix, name);
        let mut call = PROBE.prepare_invoke();
        call.key(&keys.permits)
            .key(&keys.holders)
            .key(&keys.fence)
            .arg(&keys.released)
            .arg(self.events.publish())
            .arg(marker);
        let read_at = Instant::now();
        let mut answer: Vec<redis::Value> = self.run(&call).await?;
        let counter = if answer.is_empty() {
            None
        } else {
            redis::from_redis_value::<String>(answer.remove(0))
                .ok()
                .and_then(|c| c.parse().ok())
        };
        Ok(ProbedSemaphore {
            info: semaphore_of(answer, read_at)?,
            counter,
        })
    }

    /// The history of semaphore `name` (see
    /// [`crate::lock::Node::history`]).
    ///
    /// # Errors
    /// As for [`Self::take_permit`].
    pub(super) async fn semaphore_history(
        &self,
        name: &LockName,
    ) -> Result<Vec<HistoryEntry>, LockError> {
        let keys = SemKeys::new(&self.prefix, name);
        let mut call = HISTORY.prepare_invoke();
        call.key(&keys.permits).key(&keys.holders);
        self.with_history(&mut call, &keys.history);
        let read_at = Instant::now();
        let mut answer: Vec<redis::Value> = self.run(&call).await?;
        let kept = history::kept_of(&mut answer)?;
        let live: Vec<u64> = semaphore_of(answer, read_at)?
            .map(|info| info.permits.iter().map(|p| p.fence).collect())
            .unwrap_or_default();
        Ok(history::settled(&kept, &live))
    }

    /// Breaks one permit of semaphore `name` (by `fence`) or every one
    /// (see [`crate::lock::Node::break_leases`]).
    ///
    /// # Errors
    /// As for [`Self::take_permit`].
    pub(super) async fn break_permits(
        &self,
        name: &LockName,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        let keys = SemKeys::new(&self.prefix, name);
        let mut call = BREAK.prepare_invoke();
        call.key(&keys.permits)
            .key(&keys.holders)
            .arg(fence.map(|f| f.to_string()).unwrap_or_default())
            .arg(by)
            .arg(&keys.released)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        let answer: Vec<String> = self.run(&call).await?;
        Ok(history::broken_of(&answer))
    }

    /// The inspect script of semaphore `name`.
    pub(super) fn inspect_semaphore_call(&self, name: &LockName) -> ScriptInvocation<'static> {
        let keys = SemKeys::new(&self.prefix, name);
        let mut call = INSPECT.prepare_invoke();
        call.key(&keys.permits).key(&keys.holders);
        call
    }
}

/// The semaphore a `sem_inspect.lua` answer tells of, read from a request
/// sent at `read_at`; `None` when no permit is held.
///
/// # Errors
/// [`LockError::Backend`] when the answer is not of that shape.
pub(super) fn semaphore_of(
    answer: Vec<redis::Value>,
    read_at: Instant,
) -> Result<Option<SemaphoreInfo>, LockError> {
    let mut answer = answer.into_iter();
    let limit: i64 = match answer.next() {
        Some(value) => {
            redis::from_redis_value(value).map_err(|e| LockError::Backend(e.to_string()))?
        }
        None => 0,
    };
    let Ok(limit) = Limit::new(u64::try_from(limit).unwrap_or(0), u32::MAX) else {
        return Ok(None);
    };
    let mut permits = Vec::new();
    while let (Some(left), Some(record)) = (answer.next(), answer.next()) {
        let left: i64 =
            redis::from_redis_value(left).map_err(|e| LockError::Backend(e.to_string()))?;
        let record: String =
            redis::from_redis_value(record).map_err(|e| LockError::Backend(e.to_string()))?;
        let record: Record = serde_json::from_str(&record)
            .map_err(|e| LockError::Backend(format!("semaphore permit record: {e}")))?;
        permits.push(PermitInfo {
            fence: record.fence.parse().unwrap_or(0),
            owner: Some(record.owner).filter(|o| !o.is_empty()),
            meta: Meta::from_stored(&record.meta),
            remaining: Duration::from_millis(u64::try_from(left).unwrap_or(0))
                .saturating_sub(read_at.elapsed()),
            granted_at: record
                .granted_at_ms
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        });
    }
    Ok(Some(SemaphoreInfo { limit, permits }))
}

/// A number a semaphore script answered as a string (a fence, a wait).
fn stored_number(raw: &str) -> Result<u64, LockError> {
    raw.parse()
        .map_err(|_| LockError::Backend(format!("semaphore script answered {raw:?}")))
}

/// A limit a semaphore script answered.
fn stored_limit(raw: i64) -> Result<Limit, LockError> {
    Limit::new(u64::try_from(raw).unwrap_or(0), u32::MAX)
        .map_err(|_| LockError::Backend(format!("semaphore limit {raw}")))
}
