//! The reaper: lockd's one background compare-and-delete of a grant that
//! nobody will use, retried with [`crate::backoff`] until it is done or the
//! grant's lease must have ended by itself. It serves
//!
//! - Redlock, for the partial grants of a refused acquire and the nodes a
//!   release did not reach (see [`super::redlock`]);
//! - the service, for a grant whose caller went away (see
//!   [`super::service`]);
//! - the single-Redis store, for an acquire that timed out (see
//!   [`super::redis`]), whose first delete goes on the connection that
//!   carried the acquire, so that Redis runs it after the acquire.
//!
//! Each attempt is the caller's: a compare-and-delete of the grant's own
//! token, which can only delete that grant. A later acquire with the same
//! token (a waiter retrying, a client re-acquiring) would be deleted too,
//! so such an acquire first calls [`Reaper::stop`], which waits for an
//! attempt under way and lets no other start.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{LockError, LockName, Token};
use crate::backoff::{Backoff, ExponentialBackoff};

/// The pauses between the attempts of a reap: 50 ms doubling up to 1 s.
pub const BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// What one delete attempt learned.
#[derive(Debug)]
pub enum Attempt {
    /// The store answered: the grant is deleted, or was never made, or has
    /// run out. Nothing is left to do.
    Done,
    /// No answer (or one that says to try again): retry while the grant's
    /// lease may last.
    Retry(LockError),
}

/// How a reap ended.
#[derive(Debug)]
pub enum Reaped {
    /// An attempt got an answer.
    Done,
    /// [`Reaper::stop`] stopped it: the token is being granted again.
    Stopped,
    /// No attempt got an answer before the retries ran out; the last
    /// attempt's error. The grant, if made, ends with its lease.
    GaveUp(LockError),
}

/// When a reap's attempts are made.
#[derive(Debug, Clone)]
pub struct Reap {
    /// Whether the first attempt is made at once (else after a first
    /// pause: the caller made it already).
    pub at_once: bool,
    /// How long attempts are retried, counted from the end of the first
    /// attempt made at once, else from the start: the longest the grant's
    /// lease can last (zero: no retry).
    pub retry_for: Duration,
    /// The pauses before each retry.
    pub backoff: Backoff,
}

impl Reap {
    /// A reap whose first attempt is made at once, then retried for
    /// `retry_for` with [`BACKOFF`].
    pub fn at_once(retry_for: Duration) -> Self {
        Self {
            at_once: true,
            retry_for,
            backoff: BACKOFF.pauses(),
        }
    }

    /// A reap whose first attempt comes after a first pause of
    /// [`BACKOFF`] (its caller just made one), retried for `retry_for`
    /// from now.
    pub fn after_a_pause(retry_for: Duration) -> Self {
        Self {
            at_once: false,
            retry_for,
            backoff: BACKOFF.pauses(),
        }
    }

    /// Makes attempts (`attempt()`, each a compare-and-delete) until one is
    /// [`Attempt::Done`], the retries run out, or `stop` is stopped. An
    /// attempt under way is never cut short by a stop.
    pub async fn run<F, Fut>(mut self, stop: Option<&Stop>, attempt: F) -> Reaped
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Attempt>,
    {
        let mut last = None;
        if self.at_once {
            match attempt().await {
                Attempt::Done => return Reaped::Done,
                Attempt::Retry(e) => last = Some(e),
            }
        }
        let give_up = Instant::now() + self.retry_for;
        while Instant::now() < give_up {
            self.backoff.wait().await;
            let _busy = match stop {
                Some(stop) => Some(stop.busy.lock().await),
                None => None,
            };
            if stop.is_some_and(|s| s.stopped.load(Ordering::SeqCst)) {
                return Reaped::Stopped;
            }
            match attempt().await {
                Attempt::Done => return Reaped::Done,
                Attempt::Retry(e) => last = Some(e),
            }
        }
        Reaped::GaveUp(
            last.unwrap_or_else(|| LockError::Unavailable("no delete was tried in time".into())),
        )
    }
}

/// The stop switch of the reaps of one (lock, token): stoppable, and never
/// stopped half-way through an attempt.
#[derive(Debug, Default)]
pub struct Stop {
    stopped: AtomicBool,
    busy: tokio::sync::Mutex<()>,
}

/// The reaps under way that a later acquire may have to stop, by lock name
/// and token.
#[derive(Debug, Default)]
pub struct Reaper {
    pending: Mutex<HashMap<(String, String), Arc<Stop>>>,
}

impl Reaper {
    /// The stop switch for new reaps of `token` on `name`, which
    /// [`Reaper::stop`] finds for `lasting` (the longest they retry); the
    /// reaps then end by themselves.
    pub fn register(
        self: &Arc<Self>,
        name: &LockName,
        token: &Token,
        lasting: Duration,
    ) -> Arc<Stop> {
        let stop = Arc::new(Stop::default());
        let key = (name.as_str().to_owned(), token.expose().to_owned());
        self.lock().insert(key.clone(), stop.clone());
        let (this, registered) = (self.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::time::sleep(lasting).await;
            let mut pending = this.lock();
            if pending
                .get(&key)
                .is_some_and(|s| Arc::ptr_eq(s, &registered))
            {
                pending.remove(&key);
            }
        });
        stop
    }

    /// Stops the reaps of `token` on `name`, waiting for an attempt under
    /// way to finish: the caller is about to grant that token again.
    pub async fn stop(&self, name: &LockName, token: &Token) {
        let key = (name.as_str().to_owned(), token.expose().to_owned());
        let stop = self.lock().remove(&key);
        if let Some(stop) = stop {
            let _in_flight = stop.busy.lock().await;
            stop.stopped.store(true, Ordering::SeqCst);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Arc<Stop>>> {
        // Each critical section is one map operation: a poisoned lock still
        // holds a consistent map.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn reap(at_once: bool, retry_for_ms: u64) -> Reap {
        let retry_for = Duration::from_millis(retry_for_ms);
        if at_once {
            Reap::at_once(retry_for)
        } else {
            Reap::after_a_pause(retry_for)
        }
    }

    fn down() -> Attempt {
        Attempt::Retry(LockError::Unavailable("down".into()))
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_retried_until_answered() {
        let tries = AtomicUsize::new(0);
        let outcome = reap(true, 10_000)
            .run(None, || async {
                if tries.fetch_add(1, Ordering::SeqCst) < 3 {
                    down()
                } else {
                    Attempt::Done
                }
            })
            .await;
        assert!(matches!(outcome, Reaped::Done));
        assert_eq!(tries.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_stop_when_the_lease_must_have_ended() {
        let tries = AtomicUsize::new(0);
        let started = Instant::now();
        let outcome = reap(false, 1_000)
            .run(None, || async {
                tries.fetch_add(1, Ordering::SeqCst);
                down()
            })
            .await;
        assert!(matches!(outcome, Reaped::GaveUp(LockError::Unavailable(_))));
        // 50 + 100 + 200 + 400 + 800 ms: the fifth pause ends past 1 s.
        assert_eq!(tries.load(Ordering::SeqCst), 5);
        assert!(started.elapsed() >= Duration::from_secs(1));
        let once = reap(true, 0).run(None, || async { down() }).await;
        assert!(matches!(once, Reaped::GaveUp(_)), "no retry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_reap_before_its_next_attempt() {
        let reaper = Arc::new(Reaper::default());
        let name = LockName::parse("k").expect("valid");
        let token = Token::generate();
        let stop = reaper.register(&name, &token, Duration::from_secs(10));
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = tries.clone();
        let task = tokio::spawn(async move {
            reap(false, 10_000)
                .run(Some(&stop), || async {
                    counted.fetch_add(1, Ordering::SeqCst);
                    down()
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(tries.load(Ordering::SeqCst), 1);
        reaper.stop(&name, &token).await;
        let outcome = task.await.expect("task");
        assert!(matches!(outcome, Reaped::Stopped), "{outcome:?}");
        assert_eq!(tries.load(Ordering::SeqCst), 1, "no attempt after the stop");
    }
}
