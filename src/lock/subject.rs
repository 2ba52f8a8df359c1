//! [`Subject`]: what a lease is of, a lock, a semaphore or a run of one
//! name. The
//! wait queues, the change listeners, the watches and the Redis change
//! channels all key on it. For Redis, `redis::events::channel` turns it
//! into its change channel, the one place channel names are built.

use std::fmt;

use super::LockName;

/// The kinds of lease lockd keeps. A lock and a semaphore of the same name
/// are two subjects: their leases, queues and changes never mix.
///
/// A listing's cursor names the kind it walks (`l` or `s`), so that a
/// cursor serves only the listing it came from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Kind {
    /// A lock: one holder at a time.
    #[serde(rename = "l")]
    Lock,
    /// A semaphore: at most `limit` holders, each holding a permit.
    #[serde(rename = "s")]
    Semaphore,
    /// A run: a job that runs once per key (see [`super::run`]).
    #[serde(rename = "r")]
    Run,
}

impl Kind {
    /// The kind's name in logs and metrics: `lock`, `semaphore` or `run`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Semaphore => "semaphore",
            Self::Run => "run",
        }
    }
}

/// A lock or a semaphore of a name: what is waited for, watched, or told
/// of a change.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subject {
    kind: Kind,
    name: LockName,
}

impl Subject {
    /// The subject of `kind` named `name`.
    pub fn new(kind: Kind, name: LockName) -> Self {
        Self { kind, name }
    }

    /// The lock named `name`.
    pub fn lock(name: LockName) -> Self {
        Self::new(Kind::Lock, name)
    }

    /// The semaphore named `name`.
    pub fn semaphore(name: LockName) -> Self {
        Self::new(Kind::Semaphore, name)
    }

    /// The run of key `key`.
    pub fn run(key: LockName) -> Self {
        Self::new(Kind::Run, key)
    }

    /// Which kind of lease it is of.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The name of the lock or semaphore.
    pub fn name(&self) -> &LockName {
        &self.name
    }
}

impl fmt::Display for Subject {
    /// `lock NAME` or `semaphore NAME`, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.name.as_str())
    }
}
