//! Shared leases of locks in memory: the same answers as the Redis
//! scripts (`shared.lua` and the lock scripts around it). A name's shared
//! leases are kept as a semaphore's permits are
//! ([`crate::lock::semaphore::Permits`], with no limit to speak of), beside
//! the exclusive holders, and with them the exclusive requests waiting for
//! them to end (the writer rule: no new shared lease while one waits).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{MemoryBackend, State, lease};
use crate::lock::history::BrokenLease;
use crate::lock::semaphore::{Limit, PermitRequest, Permits, Taken};
use crate::lock::{
    AcquireRequest, Acquired, Change, ExtendTtl, Kind, Lease, LeaseLeft, LockError, LockInfo,
    LockName, Mode, Released, Token, unix_millis,
};

/// The shared leases of one name, and the exclusive requests waiting for
/// them.
#[derive(Default)]
pub(super) struct SharedLock {
    leases: Permits,
    /// Token -> when its exclusive request stops waiting.
    writers: HashMap<String, Instant>,
}

impl SharedLock {
    /// Whether nothing is left: no live lease and no waiting writer.
    pub(super) fn is_spent(&mut self, now: Instant, at_us: u64) -> bool {
        self.writers.retain(|_, until| *until > now);
        self.writers.is_empty() && self.leases.live(at_us) == 0
    }

    /// How many shared leases are live at `at_us` (the semaphores' clock).
    pub(super) fn live_leases(&mut self, at_us: u64) -> usize {
        self.leases.live(at_us)
    }

    /// Ends the live shared leases whose fence is `fence` (every one with
    /// `None`), whatever their token: an admin's break. The waiting
    /// writers go with the last one, as at a release.
    pub(super) fn break_leases(&mut self, at_us: u64, fence: Option<u64>) -> Vec<BrokenLease> {
        let broken = self.leases.break_held(at_us, fence, Some(Mode::Shared));
        if self.leases.live(at_us) == 0 {
            self.writers.clear();
        }
        broken
    }

    /// Forgets `token`'s wait (its request was granted).
    pub(super) fn forget_writer(&mut self, token: &Token) {
        self.writers.remove(token.expose());
    }

    /// How long until the last waiting writer stops waiting; `None` when
    /// none waits.
    fn writer_waits(&mut self, now: Instant) -> Option<Duration> {
        self.writers.retain(|_, until| *until > now);
        self.writers.values().max().map(|until| *until - now)
    }
}

/// A limit no count of shared leases reaches.
fn no_limit() -> Limit {
    Limit::new(u64::from(u32::MAX), u32::MAX)
        .unwrap_or_else(|_| unreachable!("u32::MAX is in range"))
}

impl State {
    /// The shared leases of `name`, created empty when absent.
    pub(super) fn shared_of(&mut self, name: &LockName) -> &mut SharedLock {
        self.shared.entry(name.as_str().to_owned()).or_default()
    }

    /// Records that `req` (an exclusive request) waits, when it does:
    /// until its wait ends, or a second after `last` (the end of the last
    /// shared lease it waits for), whichever is first, as `note_writer` of
    /// `shared.lua` does.
    pub(super) fn note_writer(&mut self, req: &AcquireRequest, now: Instant, last: Duration) {
        if let Some(until) = req.waits_until.filter(|until| *until > now) {
            let until = until.min(now + last + Duration::from_secs(1));
            self.shared_of(&req.name)
                .writers
                .insert(req.token.expose().to_owned(), until);
        }
    }
}

impl MemoryBackend {
    /// Tells of the shared leases of `name` that ran out.
    pub(super) fn tell_ended_shared(&self, name: &LockName, shared: &mut SharedLock) {
        for fence in shared.leases.take_ended() {
            self.tell(Kind::Lock, name, &Change::Expired { fence });
        }
    }

    /// For an exclusive request: its refusal when shared leases are live
    /// (a mode mismatch when its token holds one; otherwise held until the
    /// last ends, the request noted as a waiting writer), or `None`.
    pub(super) fn refuse_beside_shared(
        &self,
        state: &mut State,
        req: &AcquireRequest,
        now: Instant,
    ) -> Option<LockError> {
        let at = self.now_us();
        let shared = state.shared.get_mut(req.name.as_str())?;
        let last = shared.leases.last_ends_in(at);
        self.tell_ended_shared(&req.name, shared);
        let last = last?;
        if shared.leases.holds(at, &req.token) {
            return Some(LockError::ModeMismatch { held: Mode::Shared });
        }
        state.note_writer(req, now, last);
        Some(LockError::Held {
            left: LeaseLeft::AtMost(last),
        })
    }

    /// Takes a shared lease, or renews the one `req.token` holds (see
    /// `shared_acquire.lua`).
    pub(super) fn acquire_shared(
        &self,
        state: &mut State,
        req: &AcquireRequest,
        now: Instant,
    ) -> Result<Acquired, LockError> {
        if let Some(holder) = state.live(&req.name, now) {
            if holder.token == req.token {
                return Err(LockError::ModeMismatch {
                    held: Mode::Exclusive,
                });
            }
            return Err(LockError::Held {
                left: LeaseLeft::AtMost((holder.expires - now).max(Duration::from_millis(1))),
            });
        }
        let at = self.now_us();
        let retention = self.fence_retention;
        let State { shared, fences, .. } = state;
        let lock = shared.entry(req.name.as_str().to_owned()).or_default();
        let renewing = lock.leases.holds(at, &req.token);
        self.tell_ended_shared(&req.name, lock);
        if !renewing && req.renew_only {
            return Err(LockError::Held {
                left: LeaseLeft::AtMost(Duration::from_millis(1)),
            });
        }
        if !renewing && let Some(waits) = lock.writer_waits(now) {
            return Err(LockError::Held {
                left: LeaseLeft::AtMost(waits.max(Duration::from_millis(1))),
            });
        }
        let permit = PermitRequest {
            name: req.name.clone(),
            token: req.token.clone(),
            limit: no_limit(),
            ttl: req.ttl,
            owner: req.owner.clone(),
            meta: req.meta.clone(),
            token_generated: req.token_generated,
        };
        let granted_at = SystemTime::now();
        let taken = lock.leases.take(at, &permit, granted_at, || {
            super::next_fence_in(fences, &req.name, now, retention)
        });
        let ttl_ms = req.ttl.as_millis();
        match taken {
            Taken::Granted(fence) => {
                let change = Change::Acquired {
                    fence,
                    ttl_ms,
                    granted_at_ms: unix_millis(granted_at),
                    owner: req.owner.as_ref().map(|o| o.as_str().to_owned()),
                    meta: req.meta.clone(),
                    mode: crate::lock::Mode::Shared,
                };
                self.tell(Kind::Lock, &req.name, &change);
                Ok(Acquired::Granted(lease(fence, req.ttl)))
            }
            Taken::Renewed(fence) => {
                let change = Change::Extended {
                    fence,
                    ttl_ms,
                    at_ms: Some(unix_millis(granted_at)),
                };
                self.tell(Kind::Lock, &req.name, &change);
                Ok(Acquired::Renewed(lease(fence, req.ttl)))
            }
            Taken::Refused(_) => Err(LockError::Held {
                left: LeaseLeft::AtMost(Duration::from_millis(1)),
            }),
        }
    }

    /// Extends `token`'s shared lease of `name` (no exclusive holder is
    /// live).
    pub(super) fn extend_shared(
        &self,
        state: &mut State,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        let at = self.now_us();
        let lock = state
            .shared
            .get_mut(name.as_str())
            .ok_or(LockError::NotHeld)?;
        let asked = match ttl {
            ExtendTtl::To(ttl) => Some(ttl.as_millis()),
            ExtendTtl::Own { .. } => None,
        };
        let extended = lock.leases.extend(at, token, asked);
        self.tell_ended_shared(name, lock);
        // Not held under this token (as a permit), whoever else holds it.
        let Some((fence, _, ttl_ms)) = extended else {
            return Err(LockError::NotHeld);
        };
        let ttl = crate::lock::Ttl::new(ttl_ms).ok_or(LockError::NotHeld)?;
        let change = Change::Extended {
            fence,
            ttl_ms,
            at_ms: Some(unix_millis(SystemTime::now())),
        };
        self.tell(Kind::Lock, name, &change);
        Ok(lease(fence, ttl))
    }

    /// Releases `token`'s shared lease of `name` (no exclusive holder is
    /// live).
    pub(super) fn release_shared(
        &self,
        state: &mut State,
        name: &LockName,
        token: &Token,
    ) -> Result<Released, LockError> {
        let at = self.now_us();
        let lock = state
            .shared
            .get_mut(name.as_str())
            .ok_or(LockError::NotHeld)?;
        let given_back = lock.leases.give_back(at, token);
        if lock.leases.live(at) == 0 {
            // The last shared lease: the waiting writers are forgotten, as
            // `release.lua` does.
            lock.writers.clear();
        }
        self.tell_ended_shared(name, lock);
        let Some((fence, granted_at)) = given_back else {
            return Err(LockError::NotHeld);
        };
        self.tell(Kind::Lock, name, &Change::Released { fence });
        Ok(Released {
            granted_at: Some(granted_at),
            mode: Mode::Shared,
        })
    }

    /// Forgets that `token` waits for `name` exclusively, waking shared
    /// requests it kept out (as `release.lua` does).
    pub(super) fn withdraw_writer(&self, state: &mut State, name: &LockName, token: &Token) {
        let withdrawn = state
            .shared
            .get_mut(name.as_str())
            .is_some_and(|lock| lock.writers.remove(token.expose()).is_some());
        if withdrawn {
            self.tell(Kind::Lock, name, &Change::Unknown);
        }
    }

    /// The shared leases of `name`, as an observer sees them; `None` when
    /// none is live.
    pub(super) fn inspect_shared(
        &self,
        state: &mut State,
        name: &LockName,
        now: Instant,
    ) -> Option<LockInfo> {
        let at = self.now_us();
        let lock = state.shared.get_mut(name.as_str())?;
        let writer_waiting = lock.writer_waits(now).is_some();
        let leases = lock.leases.inspect(at).map(|info| info.permits);
        LockInfo::shared(leases.unwrap_or_default(), writer_waiting)
    }

    /// Whether an exclusive request waits for `name`'s shared leases.
    pub(super) fn writer_waits(&self, state: &mut State, name: &LockName, now: Instant) -> bool {
        state
            .shared
            .get_mut(name.as_str())
            .is_some_and(|lock| lock.writer_waits(now).is_some())
    }
}
