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
    /// The instance's wait queues are full (`max_waiters`).
    #[error("too many requests are waiting")]
    TooManyWaiters,
    /// The service is shutting down and ended the wait.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The backend could not be reached or did not answer in time: the
    /// operation may or may not have taken effect. The text is for logs only;
    /// it never reaches a client.
    #[error("lock backend unavailable: {0}")]
    Unavailable(String),
    /// Redlock: too few nodes answered to reach or to tell a quorum.
    #[error("{answered} of the nodes answered; {needed} are needed")]
    QuorumUnavailable {
        /// How many nodes answered.
        answered: usize,
        /// The quorum.
        needed: usize,
    },
    /// The backend answered with an error that retrying will not cure (a key
    /// of the wrong type written by a foreign client, a wrong password, a bad
    /// URL). The text is for logs only; it never reaches a client.
    #[error("lock backend error: {0}")]
    Backend(String),
}
