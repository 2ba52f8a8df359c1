//! The lease keeper of `lockd exec`: takes the lock under a token of its
//! own, renews the lease at a third of the TTL, says when the lease is lost
//! for good, and releases the lock at the end. Every call goes through
//! [`Servers`]: to the server that answered last, then on to the next ones
//! while servers are unusable, so that one lockd going away does not lose
//! the lease.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use super::say;
use crate::backoff::ExponentialBackoff;
use crate::client::api::{AcquireParams, ClientError, RunStart, Target};
use crate::client::args::ExecArgs;
use crate::client::exit;
use crate::client::servers::{Failure, Servers, passed_note};
use crate::lock::Token;

/// How long the acquire may take beyond `--wait-ms`, over all the servers
/// it tries, before it counts as unanswered (a server itself answers 503
/// after its `--request-timeout-ms`, 10 s by default).
const ACQUIRE_MARGIN: Duration = Duration::from_secs(15);
/// The longest a renewal or the release may take, over all the servers it
/// tries.
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// The longest a release whose answer does not matter may take (after the
/// lease was lost, or when the acquire's outcome is unknown): the lease
/// ends by itself anyway, and the exit must not wait on a stuck server.
const QUIET_RELEASE_LIMIT: Duration = Duration::from_secs(1);
/// How long releasing may be retried when the server does not answer.
const RELEASE_FOR: Duration = Duration::from_secs(5);
/// The pauses between those retries: 100 ms doubling (within
/// [`RELEASE_FOR`], which ends them before any cap).
const RELEASE_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(100), RELEASE_FOR);

/// The lock, as this process holds it.
#[derive(Clone)]
pub(super) struct Holder {
    pub(super) servers: Servers,
    pub(super) name: String,
    /// Whether `name` is a semaphore (the lease is one of its permits).
    pub(super) semaphore: bool,
    /// Whether `name` is a run's key (the lease is its attempt).
    pub(super) once: bool,
    pub(super) token: Token,
}

impl Holder {
    /// What the calls name: the lock, the semaphore, or the run (whose
    /// release abandons its attempt).
    pub(super) fn target(&self) -> Target<'_> {
        if self.once {
            Target::Run(&self.name)
        } else {
            Target::new(&self.name, self.semaphore)
        }
    }

    /// Takes the lock (or the permit, or the run's attempt): the lease, or
    /// for a done run its result.
    pub(super) async fn acquire(&self, args: &ExecArgs) -> Result<RunStart, Failure> {
        let owner = args.owner.clone().unwrap_or_else(default_owner);
        let meta = args.meta.clone().unwrap_or_else(default_meta);
        let params = AcquireParams {
            token: Some(self.token.expose()),
            ttl_ms: args.ttl_ms,
            wait_ms: args.wait_ms,
            owner: Some(&owner),
            meta: Some(&meta),
            limit: args.semaphore.limit,
            fingerprint: None,
            shared: args.shared,
        };
        if self.once {
            return self
                .servers
                .start_run(&self.name, &params, ACQUIRE_MARGIN)
                .await
                .map(|answered| answered.reply.value);
        }
        self.servers
            .acquire(self.target(), &params, ACQUIRE_MARGIN)
            .await
            .map(|answered| RunStart::Attempt(answered.reply.value))
    }

    /// Completes the run after the command exited 0, storing
    /// `{"exit_code": 0}`; retried for a while when no server answers.
    /// Returns the exit code: 0, or why the run is not done.
    pub(super) async fn complete_after_run(&self, ttl: Duration) -> u8 {
        let give_up = Instant::now() + RELEASE_FOR.min(ttl);
        let mut backoff = RELEASE_BACKOFF.pauses();
        let result = serde_json::json!({ "exit_code": 0 });
        loop {
            let failure = match self
                .servers
                .complete_run(&self.name, self.token.expose(), &result, CALL_LIMIT)
                .await
            {
                Ok(_) => return 0,
                Err(failure) => failure,
            };
            let tried = failure.tried();
            let why = match &failure.error {
                ClientError::RateLimited { answer, .. }
                | ClientError::Unavailable { answer, .. }
                | ClientError::ServerError { answer } => {
                    format!("{} answered {}{tried}", failure.who(), answer.status)
                }
                ClientError::Unreachable(e) => format!("{e}{tried}"),
                other => {
                    say(&format!(
                        "the command succeeded, but {} could not be marked done ({other}){tried}: its attempt's lease ran out first, so the job will run again",
                        self.name
                    ));
                    return exit::LEASE_LOST;
                }
            };
            let pause = backoff.next_pause();
            if Instant::now() + pause >= give_up {
                say(&format!(
                    "the command succeeded, but {} could not be marked done ({why}); the job will run again once its attempt's lease runs out",
                    self.name
                ));
                return exit::UNAVAILABLE;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Releases the lock if this token holds it, ignoring the answer: used
    /// when the outcome of the acquire is unknown or the lease was lost.
    pub(super) async fn release_quietly(&self) {
        let _ = self
            .servers
            .release(self.target(), self.token.expose(), QUIET_RELEASE_LIMIT)
            .await;
    }

    /// Releases the lock after the command ended, retrying for a while when
    /// the server does not answer, and says on stderr when it could not.
    pub(super) async fn release_after_run(&self, ttl: Duration) {
        let give_up = Instant::now() + RELEASE_FOR.min(ttl);
        let mut backoff = RELEASE_BACKOFF.pauses();
        loop {
            let failure = match self
                .servers
                .release(self.target(), self.token.expose(), CALL_LIMIT)
                .await
            {
                Ok(_) => return,
                Err(failure) => failure,
            };
            let tried = failure.tried();
            let why = match &failure.error {
                ClientError::NotHeld { .. } | ClientError::NotOwner { .. } if self.once => {
                    say(&format!(
                        "the attempt on {} had already run out when the command ended",
                        self.name
                    ));
                    return;
                }
                ClientError::NotHeld { .. } => {
                    say(&format!(
                        "the lease on {} had already run out when the command ended",
                        self.name
                    ));
                    return;
                }
                // Over the key's rate passes; so may a server error.
                ClientError::RateLimited { answer, .. }
                | ClientError::Unavailable { answer, .. }
                | ClientError::ServerError { answer } => {
                    format!("{} answered {}{tried}", failure.who(), answer.status)
                }
                ClientError::Unreachable(e) => format!("{e}{tried}"),
                other => {
                    let status = other.status().map(|s| s.to_string()).unwrap_or_default();
                    say(&format!("cannot release {}: {status}{tried}", self.name));
                    return;
                }
            };
            let pause = backoff.next_pause();
            if Instant::now() + pause >= give_up {
                say(&format!(
                    "cannot release {} ({why}); it frees when its lease runs out",
                    self.name
                ));
                return;
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// When the first lease ends at the earliest, by this process's clock.
///
/// The grant happened between sending the acquire (`sent`) and receiving
/// its answer (`received`). Without a wait that span is one round trip, and
/// `sent + ttl` is the safe end. After a long wait the grant came near the
/// end of it: then the end is counted from the answer, less a tenth of the
/// TTL for the answer's way back. Counting from `sent` there would take a
/// lease granted a moment ago for one already run out.
pub(super) fn lease_end(sent: Instant, received: Instant, ttl: Duration) -> Instant {
    (sent + ttl).max((received + ttl).checked_sub(ttl / 10).unwrap_or(received))
}

/// How long before the lease's end the command is stopped when no renewal
/// has succeeded: `kill_grace` (the time the command gets between SIGTERM
/// and SIGKILL), so that it is gone by the end, but at most half the TTL.
pub(super) fn stop_lead(ttl: Duration, kill_grace: Duration) -> Duration {
    kill_grace.min(ttl / 2)
}

/// Renews the lease when a third of it has passed, until aborted, through
/// the server that answered last (moving on to the next ones, within the
/// renewal's time, when it is unusable; saying so when another server
/// renewed). A renewal that fails for a while (5xx, no answer from any
/// server) is retried sooner. When the lease is lost for good, or no
/// renewal has succeeded by [`stop_lead`] before its end (so that the
/// command, stopped now, is gone by the time another holder can have the
/// lock), says why on `lost` and stops.
pub(super) async fn keep_renewing(
    holder: Holder,
    ttl: Duration,
    mut lease_end: Instant,
    kill_grace: Duration,
    lost: oneshot::Sender<String>,
) {
    let lead = stop_lead(ttl, kill_grace);
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let retry = (ttl / 10).max(Duration::from_millis(50));
    let mut next = lease_end.checked_sub(ttl * 2 / 3).unwrap_or(lease_end);
    // The reason of the failures since the last renewal that worked.
    let mut failing: Option<String> = None;
    loop {
        let stop_at = lease_end.checked_sub(lead).unwrap_or(lease_end);
        sleep_until(next.min(stop_at)).await;
        let sent = Instant::now();
        if sent >= stop_at {
            let why = failing.map_or_else(
                || "no renewal could be sent in time".to_owned(),
                |f| format!("the renewals failed: {f}"),
            );
            let message = if sent >= lease_end {
                // This process was stopped or starved past the lease's end.
                format!(
                    "the lease ran out {} ms ago with no renewal (was lockd exec paused?); {why}",
                    sent.duration_since(lease_end).as_millis()
                )
            } else {
                format!(
                    "the lease runs out in {} ms with no renewal (stopping the command now, so that it is gone before the lease runs out); {why}",
                    lease_end.duration_since(sent).as_millis()
                )
            };
            let _ = lost.send(message);
            return;
        }
        let timeout = (stop_at - sent).min(CALL_LIMIT);
        let answer = holder
            .servers
            .extend(
                holder.target(),
                holder.token.expose(),
                Some(ttl_ms),
                timeout,
            )
            .await;
        let failure = match answer {
            Ok(answered) => {
                if !answered.passed_over.is_empty() {
                    say(&format!(
                        "renewing through {} now{}",
                        holder.servers.current(),
                        passed_note(&answered.passed_over)
                    ));
                }
                if failing.take().is_some() {
                    say("renewed again");
                }
                lease_end = sent + ttl;
                next = sent + ttl / 3;
                continue;
            }
            Err(failure) => failure,
        };
        let tried = failure.tried();
        match &failure.error {
            ClientError::NotHeld { .. } => {
                let _ = lost.send(format!("renewal answered 404: the lease is gone{tried}"));
                return;
            }
            ClientError::NotOwner { .. } | ClientError::Held { .. } => {
                // The server's reason: another holder has a lock; a run's
                // attempt may also have been abandoned or broken.
                let why = failure
                    .error
                    .refusal()
                    .map(|answer| answer.problem.detail.as_str())
                    .filter(|detail| !detail.is_empty())
                    .unwrap_or("another holder has the lock");
                let _ = lost.send(format!("renewal answered 409: {why}{tried}"));
                return;
            }
            ClientError::Refused { answer } => {
                let why = &answer.problem.detail;
                let _ = lost.send(format!("renewal refused ({}): {why}{tried}", answer.status));
                return;
            }
            ClientError::RateLimited { answer, .. }
            | ClientError::Unavailable { answer, .. }
            | ClientError::ServerError { answer } => {
                let why = format!("{} answered {}{tried}", failure.who(), answer.status);
                failing = Some(report_failure(failing, why));
            }
            e => {
                failing = Some(report_failure(failing, format!("{e}{tried}")));
            }
        }
        next = Instant::now() + retry;
    }
}

/// Says on stderr that renewals began to fail (once per streak), and
/// returns the latest reason.
fn report_failure(before: Option<String>, why: String) -> String {
    if before.is_none() {
        say(&format!(
            "renewal failed ({why}); retrying until the lease ends"
        ));
    }
    why
}

/// `hostname:pid`.
pub(super) fn default_owner() -> String {
    format!("{}:{}", hostname(), std::process::id())
}

/// `{"host": hostname, "pid": pid}`.
pub(super) fn default_meta() -> serde_json::Map<String, serde_json::Value> {
    let mut meta = serde_json::Map::new();
    meta.insert("host".into(), hostname().into());
    meta.insert("pid".into(), std::process::id().into());
    meta
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_stopped_its_grace_before_the_lease_ends_at_most_half_a_ttl() {
        let s = Duration::from_secs;
        assert_eq!(stop_lead(s(30), s(5)), s(5));
        assert_eq!(stop_lead(s(4), s(5)), s(2));
        assert_eq!(stop_lead(s(30), Duration::ZERO), Duration::ZERO);
    }
}
