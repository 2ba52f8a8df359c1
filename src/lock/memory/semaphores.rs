//! Semaphores in memory: the same answers as
//! the Redis scripts, by [`crate::lock::semaphore::Permits`].

use crate::lock::semaphore::ProbedSemaphore;
use std::time::SystemTime;

use tokio::time::Instant;

use super::{MemoryBackend, SWEEP_EVERY, State, lease, next_fence_in};
use crate::lock::semaphore::{
    Permit, PermitOutcome, PermitRequest, Permits, Refusal, SemaphoreInfo, Taken,
};
use crate::lock::{
    Change, ExtendTtl, Kind, LockError, LockName, Released, Token, Ttl, unix_millis,
};

impl MemoryBackend {
    /// Microseconds since this store began: the clock of
    /// [`crate::lock::semaphore::Permits`].
    pub(super) fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// As [`crate::lock::redis::RedisBackend::take_permit`].
    ///
    /// # Errors
    /// Never: the result has the shape of the Redis backend's.
    pub fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        let (now, at) = (Instant::now(), self.now_us());
        let retention = self.fence_retention;
        let mut state = self.state();
        let state = &mut *state;
        let permits = state
            .semaphores
            .entry(req.name.as_str().to_owned())
            .or_default();
        let fences = &mut state.semaphore_fences;
        let granted_at = SystemTime::now();
        let taken = permits.take(at, req, granted_at, || {
            next_fence_in(fences, &req.name, now, retention)
        });
        self.tell_ended(&req.name, permits);
        let ttl_ms = req.ttl.as_millis();
        let change = match taken {
            Taken::Granted(fence) => Some(Change::Acquired {
                fence,
                ttl_ms,
                granted_at_ms: unix_millis(granted_at),
                owner: req.owner.as_ref().map(|o| o.as_str().to_owned()),
                meta: req.meta.clone(),
                mode: crate::lock::Mode::Exclusive,
            }),
            Taken::Renewed(fence) => Some(Change::Extended {
                fence,
                ttl_ms,
                at_ms: Some(unix_millis(granted_at)),
            }),
            Taken::Refused(_) => None,
        };
        if let Some(change) = change {
            // Told under the state's lock, so that changes are told in order.
            self.tell(Kind::Semaphore, &req.name, &change);
        }
        if matches!(taken, Taken::Granted(_)) {
            state.grants += 1;
            if state.grants.is_multiple_of(SWEEP_EVERY) {
                // Semaphores used once, whose permits all ran out.
                state.semaphores.retain(|_, permits| permits.live(at) > 0);
            }
        }
        let permit = |fence| Permit {
            lease: lease(fence, req.ttl),
            limit: req.limit,
        };
        Ok(match taken {
            Taken::Granted(fence) => Ok(PermitOutcome::Granted(permit(fence))),
            Taken::Renewed(fence) => Ok(PermitOutcome::Renewed(permit(fence))),
            Taken::Refused(refusal) => Err(refusal),
        })
    }

    /// As [`crate::lock::redis::RedisBackend::give_back_permit`].
    ///
    /// # Errors
    /// Never.
    pub fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        let at = self.now_us();
        let mut state = self.state();
        let Some(permits) = state.semaphores.get_mut(name.as_str()) else {
            return Ok(None);
        };
        let gone = permits.give_back(at, token);
        self.tell_ended(name, permits);
        if permits.live(at) == 0 {
            state.semaphores.remove(name.as_str());
        }
        if let Some((fence, _)) = gone {
            self.tell(Kind::Semaphore, name, &Change::Released { fence });
        }
        drop(state);
        Ok(gone.map(|(_, granted_at)| Released {
            granted_at: Some(granted_at),
            ..Released::default()
        }))
    }

    /// As [`crate::lock::redis::RedisBackend::extend_permit`].
    ///
    /// # Errors
    /// Never.
    pub fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        let at = self.now_us();
        let mut state = self.state();
        let Some(permits) = state.semaphores.get_mut(name.as_str()) else {
            return Ok(None);
        };
        let given = match ttl {
            ExtendTtl::To(ttl) => Some(ttl.as_millis()),
            ExtendTtl::Own { .. } => None,
        };
        let extended = permits.extend(at, token, given);
        self.tell_ended(name, permits);
        if let Some((fence, _, ttl_ms)) = extended {
            // As the script publishes: a shorter lease frees it sooner.
            self.tell(
                Kind::Semaphore,
                name,
                &Change::Extended {
                    fence,
                    ttl_ms,
                    at_ms: Some(unix_millis(SystemTime::now())),
                },
            );
        }
        drop(state);
        Ok(extended.map(|(fence, limit, ttl_ms)| Permit {
            lease: lease(
                fence,
                Ttl::from_millis(ttl_ms, Ttl::CEILING_MS, "ttl_ms").unwrap_or(Ttl::MIN),
            ),
            limit,
        }))
    }

    /// How many permits are live now, over every semaphore.
    pub fn permit_count(&self) -> usize {
        let at = self.now_us();
        self.state()
            .semaphores
            .values_mut()
            .map(|permits| permits.live(at))
            .sum()
    }

    /// As [`crate::lock::redis::RedisBackend::inspect_semaphore`].
    ///
    /// # Errors
    /// Never.
    pub fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError> {
        let mut state = self.state();
        Ok(self.inspect_in(&mut state, name))
    }

    /// The semaphore `name` of `state` now, telling the permits that ran
    /// out ([`Self::tell_ended`]).
    pub(super) fn inspect_in(&self, state: &mut State, name: &LockName) -> Option<SemaphoreInfo> {
        let at = self.now_us();
        let permits = state.semaphores.get_mut(name.as_str())?;
        let info = permits.inspect(at);
        self.tell_ended(name, permits);
        info
    }

    /// Tells the listener of the permits of `permits` (of semaphore
    /// `name`) that ran out, as the scripts publish them: `expired FENCE`,
    /// before the change that found them so.
    pub(super) fn tell_ended(&self, name: &LockName, permits: &mut Permits) {
        for fence in permits.take_ended() {
            self.tell(Kind::Semaphore, name, &Change::Expired { fence });
        }
    }

    /// As [`crate::lock::redis::RedisBackend::probe_semaphore`]: an inspect,
    /// and `marker` told in the same step.
    ///
    /// # Errors
    /// Never.
    pub fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
        let mut state = self.state();
        let info = self.inspect_in(&mut state, name);
        let now = Instant::now();
        let counter = state
            .semaphore_fences
            .get(name.as_str())
            .filter(|c| c.forget_at > now)
            .map(|c| c.fence);
        self.tell(Kind::Semaphore, name, &Change::Probe(marker.to_owned()));
        drop(state);
        Ok(ProbedSemaphore { info, counter })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lock::semaphore::Limit;

    #[tokio::test]
    async fn memory_semaphores_answer_as_the_redis_ones() {
        let store = MemoryBackend::new();
        let name = LockName::parse("pool").expect("name");
        let req = |token: &Token, limit| PermitRequest {
            name: name.clone(),
            token: token.clone(),
            limit: Limit::new(limit, 100).expect("limit"),
            ttl: Ttl::from_millis(60, 1_000, "ttl_ms").expect("ttl"),
            owner: None,
            meta: None,
            token_generated: true,
        };
        let (a, b) = (Token::generate(), Token::generate());
        let Ok(Ok(PermitOutcome::Granted(first))) = store.take_permit(&req(&a, 1)) else {
            panic!("A's permit");
        };
        let Ok(Ok(PermitOutcome::Renewed(again))) = store.take_permit(&req(&a, 1)) else {
            panic!("A's retry");
        };
        assert_eq!(again.lease.fence, first.lease.fence);
        assert!(matches!(
            store.take_permit(&req(&b, 1)),
            Ok(Err(Refusal::Full { .. }))
        ));
        tokio::time::sleep(Duration::from_millis(80)).await;
        let Ok(Ok(PermitOutcome::Granted(next))) = store.take_permit(&req(&b, 1)) else {
            panic!("A's permit ran out: B gets one");
        };
        assert!(next.lease.fence > first.lease.fence);
        assert!(store.give_back_permit(&name, &a).expect("memory").is_none());
        assert!(store.give_back_permit(&name, &b).expect("memory").is_some());
        assert_eq!(store.inspect_semaphore(&name).expect("memory"), None);
    }
}
