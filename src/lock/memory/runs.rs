//! Runs in memory: the same answers as the Redis scripts (`run_*.lua`),
//! one record per key, kept until its retention ends.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{MemoryBackend, SWEEP_EVERY, State, lease, next_fence_in};
use crate::lock::history::BrokenLease;
use crate::lock::run::{
    Attempt, Completed, DoneRun, LastEnd, ProbedRun, RunInfo, RunMiss, RunResult, StartRefusal,
    StartRequest, Started,
};
use crate::lock::{
    Change, ExtendTtl, Kind, LeaseLeft, LockError, LockName, Token, Ttl, unix_millis,
};

/// A run's record, as the Redis backend's `run:{K}:record` hash and its
/// `:attempt` key together.
pub(super) struct RunRecord {
    stage: Stage,
    /// The live or last attempt's fence and number.
    fence: u64,
    attempt: u64,
    owner: Option<String>,
    meta: Option<crate::lock::Meta>,
    started_at: SystemTime,
    /// The attempt's own TTL, for an extend that names none.
    ttl: Ttl,
    fingerprint: Option<String>,
    /// When the record is forgotten (its retention ends).
    pub(super) forget_at: Instant,
}

/// Where a run stands.
enum Stage {
    /// An attempt holds it until `expires` (after that, its lease ran out).
    Running { token: Token, expires: Instant },
    /// Abandoned by its last attempt.
    Abandoned,
    /// Done.
    Done {
        result: RunResult,
        completed_at: SystemTime,
        /// The completing token, so that its retry gets the same answer.
        by: Token,
    },
}

impl RunRecord {
    /// Whether `token` holds the live attempt at `now`.
    fn held_by(&self, token: &Token, now: Instant) -> bool {
        matches!(&self.stage, Stage::Running { token: t, expires } if t == token && *expires > now)
    }

    fn done(&self) -> Option<DoneRun> {
        match &self.stage {
            Stage::Done {
                result,
                completed_at,
                ..
            } => Some(DoneRun {
                result: result.clone(),
                completed_at: *completed_at,
                fence: self.fence,
                attempt: self.attempt,
            }),
            _ => None,
        }
    }

    /// The miss of a call by a token that does not hold the live attempt.
    fn miss(&self) -> RunMiss {
        RunMiss::NotOwner {
            done: matches!(self.stage, Stage::Done { .. }),
        }
    }
}

impl State {
    /// The record of `key`, dropping a forgotten one first.
    fn run(&mut self, key: &LockName, now: Instant) -> Option<&mut RunRecord> {
        if self
            .runs
            .get(key.as_str())
            .is_some_and(|r| r.forget_at <= now)
        {
            self.runs.remove(key.as_str());
        }
        self.runs.get_mut(key.as_str())
    }
}

impl MemoryBackend {
    /// As [`crate::lock::redis::RedisBackend::start_run`].
    ///
    /// # Errors
    /// Never: the result has the shape of the Redis backend's.
    pub fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let keep = req.ttl.as_duration() + req.retention;
        let retention = self.fence_retention;
        let mut state = self.state();
        let state = &mut *state;
        let fingerprint = req.fingerprint.as_ref().map(|f| f.as_str().to_owned());
        let (took_over, number) = match state.run(&req.key, now) {
            Some(record) => {
                if let (Some(given), Some(kept)) = (&fingerprint, &record.fingerprint)
                    && given != kept
                {
                    return Ok(Err(StartRefusal::FingerprintMismatch));
                }
                if let Some(done) = record.done() {
                    return Ok(Ok(Started::Done(done)));
                }
                if let Stage::Running { token, expires } = &mut record.stage
                    && *expires > now
                {
                    if *token != req.token {
                        return Ok(Err(StartRefusal::InProgress {
                            left: LeaseLeft::AtMost(*expires - now),
                            waited: false,
                        }));
                    }
                    *expires = now + req.ttl.as_duration();
                    record.ttl = req.ttl;
                    if let Some(owner) = &req.owner {
                        record.owner = Some(owner.as_str().to_owned());
                    }
                    if let Some(meta) = &req.meta {
                        record.meta = Some(meta.clone());
                    }
                    record.forget_at = now + keep;
                    let (fence, number) = (record.fence, record.attempt);
                    self.tell(
                        Kind::Run,
                        &req.key,
                        &Change::Extended {
                            fence,
                            ttl_ms: req.ttl.as_millis(),
                            at_ms: Some(unix_millis(wall)),
                        },
                    );
                    return Ok(Ok(Started::Renewed(Attempt {
                        lease: lease(fence, req.ttl),
                        number,
                    })));
                }
                if record.fingerprint.is_none() {
                    record.fingerprint = fingerprint.clone();
                }
                (
                    matches!(record.stage, Stage::Running { .. }),
                    record.attempt + 1,
                )
            }
            None => (false, 1),
        };
        let fence = next_fence_in(&mut state.run_fences, &req.key, now, retention);
        state.grants += 1;
        if state.grants.is_multiple_of(SWEEP_EVERY) {
            state.sweep(now, self.now_us());
        }
        let kept_fingerprint = state
            .runs
            .get(req.key.as_str())
            .and_then(|r| r.fingerprint.clone())
            .or(fingerprint);
        state.runs.insert(
            req.key.as_str().to_owned(),
            RunRecord {
                stage: Stage::Running {
                    token: req.token.clone(),
                    expires: now + req.ttl.as_duration(),
                },
                fence,
                attempt: number,
                owner: req.owner.as_ref().map(|o| o.as_str().to_owned()),
                meta: req.meta.clone(),
                started_at: wall,
                ttl: req.ttl,
                fingerprint: kept_fingerprint,
                forget_at: now + keep,
            },
        );
        self.tell(
            Kind::Run,
            &req.key,
            &Change::Acquired {
                fence,
                ttl_ms: req.ttl.as_millis(),
                granted_at_ms: unix_millis(wall),
                owner: req.owner.as_ref().map(|o| o.as_str().to_owned()),
                meta: req.meta.clone(),
                mode: crate::lock::Mode::Exclusive,
            },
        );
        Ok(Ok(Started::New {
            attempt: Attempt {
                lease: lease(fence, req.ttl),
                number,
            },
            took_over,
        }))
    }

    /// As [`crate::lock::redis::RedisBackend::complete_run`].
    ///
    /// # Errors
    /// Never.
    pub fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let mut state = self.state();
        let Some(record) = state.run(key, now) else {
            return Ok(Err(RunMiss::Unknown));
        };
        if let Stage::Done { by, .. } = &record.stage {
            return Ok(match record.done() {
                Some(done) if by == token => Ok(Completed::Before(done)),
                _ => Err(record.miss()),
            });
        }
        if !record.held_by(token, now) {
            return Ok(Err(record.miss()));
        }
        // The Redis backend's resolution: whole milliseconds.
        let completed_at = SystemTime::UNIX_EPOCH + Duration::from_millis(unix_millis(wall));
        record.stage = Stage::Done {
            result: result.clone(),
            completed_at,
            by: token.clone(),
        };
        record.forget_at = now + retention.max(Duration::from_millis(1));
        let done = record.done();
        let fence = record.fence;
        self.tell(Kind::Run, key, &Change::Completed { fence });
        Ok(done.map(Completed::Now).ok_or(RunMiss::Unknown))
    }

    /// As [`crate::lock::redis::RedisBackend::abandon_run`].
    ///
    /// # Errors
    /// Never.
    pub fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let Some(record) = state.run(key, now) else {
            return Ok(Err(RunMiss::Unknown));
        };
        if !record.held_by(token, now) {
            return Ok(Err(record.miss()));
        }
        record.stage = Stage::Abandoned;
        record.forget_at = now + retention.max(Duration::from_millis(1));
        let fence = record.fence;
        self.tell(Kind::Run, key, &Change::Released { fence });
        Ok(Ok(()))
    }

    /// Ends the live attempt of run `key` (whose fence is `fence`, when
    /// given) whatever its token: an admin's break. The run is pending
    /// again, its record kept as long as it would have been.
    pub(super) fn break_run(
        &self,
        state: &mut State,
        key: &LockName,
        fence: Option<u64>,
        now: Instant,
    ) -> Vec<BrokenLease> {
        let Some(record) = state.run(key, now) else {
            return Vec::new();
        };
        let live = matches!(record.stage, Stage::Running { expires, .. } if expires > now);
        if !live || fence.is_some_and(|f| f != record.fence) {
            return Vec::new();
        }
        record.stage = Stage::Abandoned;
        vec![BrokenLease {
            fence: record.fence,
            mode: None,
            owner: record.owner.clone(),
            meta: record.meta.clone(),
        }]
    }

    /// As [`crate::lock::redis::RedisBackend::extend_run`].
    ///
    /// # Errors
    /// Never.
    pub fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError> {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let mut state = self.state();
        let Some(record) = state.run(key, now) else {
            return Ok(Err(RunMiss::Unknown));
        };
        if !record.held_by(token, now) {
            return Ok(Err(record.miss()));
        }
        let ttl = match ttl {
            ExtendTtl::To(ttl) => ttl,
            ExtendTtl::Own { .. } => record.ttl,
        };
        record.stage = Stage::Running {
            token: token.clone(),
            expires: now + ttl.as_duration(),
        };
        record.ttl = ttl;
        record.forget_at = now + ttl.as_duration() + retention;
        let (fence, number) = (record.fence, record.attempt);
        self.tell(
            Kind::Run,
            key,
            &Change::Extended {
                fence,
                ttl_ms: ttl.as_millis(),
                at_ms: Some(unix_millis(wall)),
            },
        );
        Ok(Ok(Attempt {
            lease: lease(fence, ttl),
            number,
        }))
    }

    /// As [`crate::lock::redis::RedisBackend::probe_run`]: the read and the
    /// marker under the state's lock, so that no change comes between them.
    ///
    /// # Errors
    /// Never.
    pub fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let info = Self::read_run(&mut state, key, now);
        let counter = state
            .run_fences
            .get(key.as_str())
            .filter(|c| c.forget_at > now)
            .map(|c| c.fence);
        self.tell(Kind::Run, key, &Change::Probe(marker.to_owned()));
        Ok(ProbedRun { info, counter })
    }

    /// As [`crate::lock::redis::RedisBackend::inspect_run`].
    ///
    /// # Errors
    /// Never.
    pub fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(Self::read_run(&mut state, key, now))
    }

    /// The state of run `key` at `now`.
    pub(super) fn read_run(state: &mut State, key: &LockName, now: Instant) -> Option<RunInfo> {
        let record = state.run(key, now)?;
        Some(match &record.stage {
            Stage::Done { .. } => RunInfo::Done(record.done()?),
            Stage::Running { expires, .. } if *expires > now => RunInfo::Running {
                fence: record.fence,
                attempt: record.attempt,
                remaining: *expires - now,
                owner: record.owner.clone(),
                meta: record.meta.clone(),
                started_at: Some(record.started_at),
            },
            stage => RunInfo::Pending {
                attempt: record.attempt,
                fence: record.fence,
                last: if matches!(stage, Stage::Abandoned) {
                    LastEnd::Abandoned
                } else {
                    LastEnd::Expired
                },
            },
        })
    }
}
