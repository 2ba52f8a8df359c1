//! The lock core's error type. The HTTP layer maps it to problem documents
//! in one place (`http::problem`).

use std::time::Duration;

/// What can go wrong with a lock operation.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another holder has the lock. `retry_after` is the holder's remaining
    /// lease: the earliest moment the lock can be free without a release.
    #[error("the lock is held by another holder")]
    Held {
        /// The holder's remaining lease.
        retry_after: Duration,
    },
    /// Nobody holds the lock (it was released, or its lease ran out).
    #[error("nobody holds the lock")]
    NotHeld,
    /// The lock is held under another token.
    #[error("the lock is held under another token")]
    NotOwner,
    /// The lock stayed held for the whole wait. `retry_after` is the holder's
    /// remaining lease when the wait ended.
    #[error("the lock was not granted within the wait")]
    WaitTimedOut {
        /// The holder's remaining lease.
        retry_after: Duration,
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
                retry_after: Duration::from_millis(1),
            },
        ] {
            assert!(!answer.is_transient() && answer.is_answer(), "{answer:?}");
        }
        let refused = LockError::Backend("WRONGTYPE".into());
        assert!(!refused.is_transient() && !refused.is_answer());
        assert!(!LockError::Cancelled.is_transient());
    }
}
