//! The lock core's error type. The HTTP layer maps it to problem documents
//! in one place (`http::problem`).

use std::time::Duration;

/// What can go wrong with a lock operation.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another holder has the lock. `left` is the holder's remaining
    /// lease: how long until the lock can be free without a release, or
    /// that it has no end (a key set without a TTL).
    #[error("the lock is held by another holder")]
    Held {
        /// The holder's remaining lease.
        left: LeaseLeft,
    },
    /// Nobody holds the lock (it was released, or its lease ran out).
    #[error("nobody holds the lock")]
    NotHeld,
    /// The lock is held under another token.
    #[error("the lock is held under another token")]
    NotOwner,
    /// The lock stayed held for the whole wait. `left` is the holder's
    /// remaining lease when the wait ended, as the waiters last learned it.
    #[error("the lock was not granted within the wait")]
    WaitTimedOut {
        /// The holder's remaining lease.
        left: LeaseLeft,
    },
    /// The request's token holds the lock in the other mode (`held`): a
    /// shared holder asking for exclusive (an upgrade) or the reverse.
    /// Answered at once, never waited on: the wait would be for its own
    /// lease. Nothing is changed.
    #[error("this token holds the lock in the other mode")]
    ModeMismatch {
        /// The mode the token holds the lock in.
        held: super::Mode,
    },
    /// The store granted or renewed the lease, but its answer arrived
    /// after the lease (`ttl`) had run out: nothing is held (a new grant
    /// is released again). A TTL shorter than the store's round trip, most
    /// often a `ttl_ms` of a few ms. With Redlock: a quorum granted, but
    /// its validity (`ttl − elapsed − drift`) was not positive. Transient:
    /// a faster round trip, or a longer TTL, gets a lease.
    #[error("the lease ran out before the store's answer arrived")]
    LeaseSpent {
        /// The lease asked for.
        ttl: Duration,
    },
    /// The instance's wait queues are full (`max_waiters`).
    #[error("too many requests are waiting")]
    TooManyWaiters,
    /// The instance has `max_watchers` watches open already.
    #[error("too many watches are open")]
    TooManyWatchers,
    /// The service is shutting down and ended the wait.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The request's own time limit ran out before the operation finished
    /// (the HTTP layer's `--request-timeout-ms`): it may or may not have
    /// taken effect.
    #[error("the request timed out")]
    TimedOut,
    /// The caller went away (hung up, gave up) during a wait: the wait ended
    /// without another try. Nobody reads this answer; a grant made for the
    /// caller is released (see [`super::service`]).
    #[error("the caller went away")]
    Cancelled,
    /// The backend could not be reached or did not answer in time: the
    /// operation may or may not have taken effect. The text is for logs only;
    /// it never reaches a client.
    #[error("lock backend unavailable: {0}")]
    Unavailable(String),
    /// Fewer replicas than `--min-replicas-acked` acknowledged the write
    /// (`WAIT`) within `--replica-ack-timeout-ms`. With `undone`, it was a
    /// new grant and was compare-and-deleted; otherwise (an extend, or a
    /// renewal by acquire) the write may stand on the master alone, and the
    /// holder should count on its lease's old expiry.
    #[error("{acked} of {needed} replicas acknowledged the write")]
    ReplicationLagging {
        /// How many replicas acknowledged.
        acked: usize,
        /// How many must (`--min-replicas-acked`).
        needed: usize,
        /// Which write fell short.
        write: LaggingWrite,
    },
    /// Redlock: too few nodes answered to reach or to tell a quorum.
    #[error("{answered} of the nodes answered; {needed} are needed")]
    QuorumUnavailable {
        /// How many nodes answered.
        answered: usize,
        /// The quorum.
        needed: usize,
    },
    /// The store cannot do this at all (semaphores in Redlock mode). The
    /// text is safe to show the caller.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A listing's cursor holds a position this store cannot continue
    /// from (one written by another kind of store, or out of its range).
    /// Answered 400, as a malformed cursor is.
    #[error("the cursor does not fit this store")]
    BadCursor,
    /// The backend answered with an error that retrying will not cure (a key
    /// of the wrong type written by a foreign client, a wrong password, a bad
    /// URL). The text is for logs only; it never reaches a client.
    #[error("lock backend error: {0}")]
    Backend(String),
}

/// How long a refused lock's holder has left, as the store told it
/// ([`LockError::Held`], [`LockError::WaitTimedOut`]): a bound on the
/// lease, or none at all. Ordered from the soonest end to no end
/// ([`LeaseLeft::AtMost`] by its duration, then [`LeaseLeft::NoTtl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LeaseLeft {
    /// The lease ends within this long at the latest (at least 1 ms, to
    /// the millisecond): the lock frees then without a release.
    AtMost(Duration),
    /// The lock's key has no expiry (PTTL -1): a client other than lockd
    /// set it without a TTL, and it frees only when that client deletes
    /// it. A waiter looks again after [`NO_TTL_RETRY`].
    NoTtl,
}

/// How long to wait before trying again a lock held by a key with no TTL
/// ([`LeaseLeft::NoTtl`]): a suggestion, not a lease's end.
pub const NO_TTL_RETRY: Duration = Duration::from_secs(1);

impl LeaseLeft {
    /// How long to wait before trying again: the remaining lease
    /// ([`LeaseLeft::AtMost`]), or [`NO_TTL_RETRY`] for a key with no TTL.
    pub fn retry_after(self) -> Duration {
        match self {
            Self::AtMost(left) => left,
            Self::NoTtl => NO_TTL_RETRY,
        }
    }
}

/// The write that too few replicas acknowledged, for
/// [`LockError::ReplicationLagging`]: what the caller may count on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaggingWrite {
    /// A new grant (of a lock or a permit): it was deleted again, and
    /// nothing is held.
    GrantUndone,
    /// A new lease (an extend, or a renewal by the same token): it stands
    /// on the master, and the holder counts on the old expiry.
    Lease,
    /// A release (of a lock, or a permit given back): done on the master,
    /// but a failover now could bring the lease back; the caller releases
    /// again (a 404 then says it is gone).
    Release,
}

impl LockError {
    /// Whether trying again may cure it: the store, or a quorum of its
    /// nodes, did not answer in time, or the request's time ran out. The
    /// operation may or may not have taken effect. A node's answer
    /// ([`LockError::Held`], [`LockError::NotHeld`],
    /// [`LockError::NotOwner`]), a refusal ([`LockError::Backend`]) and the
    /// service's own refusals are not transient.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::LeaseSpent { .. }
                | Self::QuorumUnavailable { .. }
                | Self::ReplicationLagging { .. }
                | Self::TimedOut
        )
    }

    /// Whether a node answered the operation: anything but a transient
    /// failure or a refusal ([`LockError::Backend`]). Redlock counts these
    /// answers toward a quorum.
    pub fn is_answer(&self) -> bool {
        !(self.is_transient() || matches!(self, Self::Backend(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_to_answer_are_transient() {
        assert!(LockError::Unavailable("down".into()).is_transient());
        assert!(LockError::TimedOut.is_transient());
        let quorum = LockError::QuorumUnavailable {
            answered: 1,
            needed: 2,
        };
        assert!(quorum.is_transient());
        for answer in [
            LockError::NotHeld,
            LockError::NotOwner,
            LockError::Held {
                left: LeaseLeft::AtMost(Duration::from_millis(1)),
            },
            LockError::Held {
                left: LeaseLeft::NoTtl,
            },
        ] {
            assert!(!answer.is_transient() && answer.is_answer(), "{answer:?}");
        }
        let refused = LockError::Backend("WRONGTYPE".into());
        assert!(!refused.is_transient() && !refused.is_answer());
        assert!(!LockError::Cancelled.is_transient());
    }

    #[test]
    fn a_lease_with_no_ttl_suggests_a_retry_and_sorts_after_every_bound() {
        let ms = Duration::from_millis;
        assert_eq!(LeaseLeft::AtMost(ms(250)).retry_after(), ms(250));
        assert_eq!(LeaseLeft::NoTtl.retry_after(), NO_TTL_RETRY);
        assert!(LeaseLeft::AtMost(ms(1)) < LeaseLeft::AtMost(ms(2)));
        assert!(LeaseLeft::AtMost(Duration::MAX) < LeaseLeft::NoTtl);
    }
}
