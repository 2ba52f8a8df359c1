//! [`Change`]: what one message on a lock's (or a semaphore's) change
//! channel says.
//!
//! Every script that changes a lease publishes one message on the channel
//! of its lock or semaphore (`P{N}:released`, `Psem:{N}:released`, named
//! for the first message they carried), in the same atomic step as the
//! change, so the messages of one channel arrive in the order of the
//! changes. A message is one line of text, its fields separated by single
//! spaces:
//!
//! | message | when |
//! | --- | --- |
//! | `acquired FENCE TTL_MS GRANTED_AT_MS OWNER` | a new lease (`OWNER` may be empty, and may hold spaces; the holder's metadata, when given, follows on a second line as compact JSON) |
//! | `shared FENCE TTL_MS GRANTED_AT_MS OWNER` | a new shared lease of a lock, beside the others (see [`super::Mode`]) |
//! | `extended FENCE TTL_MS AT_MS` | a lease reset to `TTL_MS` from `AT_MS` (Unix ms of the lockd that sent it): an extend, or a holder's renewing acquire |
//! | `released FENCE` | a lease ended by its holder (for a run: its attempt abandoned) |
//! | `completed FENCE` | a run's attempt completed it: the run is done |
//! | `expired FENCE` | a semaphore's permit that ran out, forgotten by the script that found it so (before that script's own change) |
//! | `broken FENCE BY` | a lease an admin ended whatever its token (`BY`: the id of the API key, `dev` in `--dev` without keys; may be empty) |
//! | `probe MARKER` | no change: a watcher's marker (see [`super::service::watch`]) |
//!
//! An empty message, or one this version does not know, is
//! [`Change::Unknown`]: something changed (an older lockd publishes empty
//! messages), and whoever cares must look.

/// One message on a change channel, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new lease (of a lock, or one permit of a semaphore).
    Acquired {
        /// The new lease's fencing token.
        fence: u64,
        /// Its TTL in milliseconds, from the moment of the grant.
        ttl_ms: u64,
        /// When it was granted, in Unix milliseconds of the granting lockd.
        granted_at_ms: u64,
        /// The holder's label, when given.
        owner: Option<String>,
        /// The holder's metadata, when given (after a newline: an owner
        /// label holds no control character).
        meta: Option<super::Meta>,
        /// A lock's mode: a shared lease leaves the other shared leases
        /// held; an exclusive one (and every permit or attempt, whose
        /// messages say `acquired`) is [`super::Mode::Exclusive`].
        mode: super::Mode,
    },
    /// The lease with this fence now lasts `ttl_ms` from `at_ms`.
    Extended {
        /// The lease's fencing token.
        fence: u64,
        /// Its new TTL in milliseconds.
        ttl_ms: u64,
        /// When the extend was sent, in Unix milliseconds of the lockd that
        /// sent it (`None` in a message of a lockd that did not say).
        at_ms: Option<u64>,
    },
    /// The lease with this fence was released by its holder.
    Released {
        /// The lease's fencing token.
        fence: u64,
    },
    /// The run's attempt with this fence completed it: the run is done.
    Completed {
        /// The completing attempt's fencing token.
        fence: u64,
    },
    /// The lease with this fence was broken: an admin ended it whatever
    /// its token (`DELETE ...?force=true`).
    Broken {
        /// The lease's fencing token.
        fence: u64,
        /// The id of the API key that broke it, when known.
        by: Option<String>,
    },
    /// The lease with this fence ran out, and a script that found it so
    /// forgot it (a semaphore's permits; a lock's key just expires).
    Expired {
        /// The lease's fencing token.
        fence: u64,
    },
    /// A watcher's marker: every message published before it has arrived.
    Probe(String),
    /// Something changed, but the message does not say what.
    Unknown,
}

impl Change {
    /// Parses one message (never fails: what is not understood is
    /// [`Change::Unknown`]).
    pub fn parse(message: &[u8]) -> Self {
        let Ok(text) = std::str::from_utf8(message) else {
            return Self::Unknown;
        };
        let (kind, rest) = text.split_once(' ').unwrap_or((text, ""));
        let parsed = match kind {
            "acquired" | "shared" => {
                let mode = if kind == "shared" {
                    super::Mode::Shared
                } else {
                    super::Mode::Exclusive
                };
                let mut fields = rest.splitn(4, ' ');
                let mut number = || fields.next().and_then(|f| f.parse::<u64>().ok());
                match (number(), number(), number()) {
                    (Some(fence), Some(ttl_ms), Some(granted_at_ms)) => {
                        let (owner, meta) = match fields.next() {
                            Some(rest) => rest.split_once('\n').unwrap_or((rest, "")),
                            None => ("", ""),
                        };
                        let owner = Some(owner).filter(|o| !o.is_empty()).map(str::to_owned);
                        Some(Self::Acquired {
                            fence,
                            ttl_ms,
                            granted_at_ms,
                            owner,
                            meta: super::Meta::from_stored(meta),
                            mode,
                        })
                    }
                    _ => None,
                }
            }
            "extended" => {
                let mut fields = rest.split(' ');
                let mut number = || fields.next().map(|f| f.parse::<u64>().ok());
                match (number(), number(), number(), number()) {
                    (Some(Some(fence)), Some(Some(ttl_ms)), at, None) => match at {
                        None => Some(Self::Extended {
                            fence,
                            ttl_ms,
                            at_ms: None,
                        }),
                        Some(Some(at_ms)) => Some(Self::Extended {
                            fence,
                            ttl_ms,
                            at_ms: Some(at_ms),
                        }),
                        Some(None) => None,
                    },
                    _ => None,
                }
            }
            "released" => rest.parse().ok().map(|fence| Self::Released { fence }),
            "expired" => rest.parse().ok().map(|fence| Self::Expired { fence }),
            "completed" => rest.parse().ok().map(|fence| Self::Completed { fence }),
            "broken" => {
                let (fence, by) = rest.split_once(' ').unwrap_or((rest, ""));
                fence.parse().ok().map(|fence| Self::Broken {
                    fence,
                    by: Some(by).filter(|b| !b.is_empty()).map(str::to_owned),
                })
            }
            "probe" if !rest.is_empty() => Some(Self::Probe(rest.to_owned())),
            _ => None,
        };
        parsed.unwrap_or(Self::Unknown)
    }

    /// The message text of this change, as the scripts write it.
    pub fn encode(&self) -> String {
        match self {
            Self::Acquired {
                fence,
                ttl_ms,
                granted_at_ms,
                owner,
                meta,
                mode,
            } => format!(
                "{} {fence} {ttl_ms} {granted_at_ms} {}{}",
                match mode {
                    super::Mode::Exclusive => "acquired",
                    super::Mode::Shared => "shared",
                },
                owner.as_deref().unwrap_or(""),
                meta.as_ref()
                    .map(|m| format!("\n{}", m.as_str()))
                    .unwrap_or_default()
            ),
            Self::Extended {
                fence,
                ttl_ms,
                at_ms: Some(at_ms),
            } => format!("extended {fence} {ttl_ms} {at_ms}"),
            Self::Extended {
                fence,
                ttl_ms,
                at_ms: None,
            } => format!("extended {fence} {ttl_ms}"),
            Self::Released { fence } => format!("released {fence}"),
            Self::Expired { fence } => format!("expired {fence}"),
            Self::Completed { fence } => format!("completed {fence}"),
            Self::Broken { fence, by } => format!("broken {fence} {}", by.as_deref().unwrap_or("")),
            Self::Probe(marker) => format!("probe {marker}"),
            Self::Unknown => String::new(),
        }
    }

    /// The fence of the lease the change is about, when it names one.
    pub fn fence(&self) -> Option<u64> {
        match self {
            Self::Acquired { fence, .. }
            | Self::Extended { fence, .. }
            | Self::Released { fence }
            | Self::Completed { fence }
            | Self::Broken { fence, .. }
            | Self::Expired { fence } => Some(*fence),
            Self::Probe(_) | Self::Unknown => None,
        }
    }

    /// Whether a waiter should try again: a lease ended or changed its end
    /// (a grant or a marker frees nothing), or a run was completed (its
    /// waiters then get the result).
    pub fn wakes_waiters(&self) -> bool {
        matches!(
            self,
            Self::Extended { .. }
                | Self::Released { .. }
                | Self::Broken { .. }
                | Self::Expired { .. }
                | Self::Completed { .. }
                | Self::Unknown
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_parse_as_the_scripts_write_them() {
        assert_eq!(
            Change::parse(b"acquired 17 1500 1700000000000 host 1:42"),
            Change::Acquired {
                fence: 17,
                ttl_ms: 1500,
                granted_at_ms: 1_700_000_000_000,
                owner: Some("host 1:42".into()),
                meta: None,
                mode: crate::lock::Mode::Exclusive,
            }
        );
        assert_eq!(
            Change::parse(b"acquired 17 1500 1700000000000 host 1:42\n{\"pid\":42}"),
            Change::Acquired {
                fence: 17,
                ttl_ms: 1500,
                granted_at_ms: 1_700_000_000_000,
                owner: Some("host 1:42".into()),
                meta: crate::lock::Meta::from_stored(r#"{"pid":42}"#),
                mode: crate::lock::Mode::Exclusive,
            }
        );
        assert_eq!(
            Change::parse(b"shared 18 1500 1700000000000 r"),
            Change::Acquired {
                fence: 18,
                ttl_ms: 1500,
                granted_at_ms: 1_700_000_000_000,
                owner: Some("r".into()),
                meta: None,
                mode: crate::lock::Mode::Shared,
            }
        );
        assert_eq!(
            Change::parse(b"acquired 17 1500 0 "),
            Change::Acquired {
                fence: 17,
                ttl_ms: 1500,
                granted_at_ms: 0,
                owner: None,
                meta: None,
                mode: crate::lock::Mode::Exclusive,
            }
        );
        assert_eq!(
            Change::parse(b"extended 17 900 1700000000000"),
            Change::Extended {
                fence: 17,
                ttl_ms: 900,
                at_ms: Some(1_700_000_000_000),
            }
        );
        // An older lockd's, without the time.
        assert_eq!(
            Change::parse(b"extended 17 900"),
            Change::Extended {
                fence: 17,
                ttl_ms: 900,
                at_ms: None,
            }
        );
        assert_eq!(
            Change::parse(b"released 17"),
            Change::Released { fence: 17 }
        );
        assert_eq!(Change::parse(b"probe a.1"), Change::Probe("a.1".into()));
        assert_eq!(
            Change::parse(b"broken 17 ops-key"),
            Change::Broken {
                fence: 17,
                by: Some("ops-key".into())
            }
        );
        assert_eq!(
            Change::parse(b"broken 17 "),
            Change::Broken {
                fence: 17,
                by: None
            }
        );
    }

    #[test]
    fn what_is_not_understood_is_unknown() {
        for bad in [
            &b""[..],
            b"released",
            b"released ",
            b"released x",
            b"extended 1",
            b"extended 1 2 x",
            b"extended 1 2 3 4",
            b"acquired 1 2",
            b"probe",
            b"probe ",
            b"other 1",
            b"\xff",
        ] {
            assert_eq!(Change::parse(bad), Change::Unknown, "{bad:?}");
        }
        assert!(Change::Unknown.wakes_waiters());
        assert!(!Change::Probe("x".into()).wakes_waiters());
    }

    proptest! {
        #[test]
        fn encode_then_parse_is_the_same_change(
            fence in any::<u64>(),
            ttl_ms in any::<u64>(),
            granted_at_ms in any::<u64>(),
            owner in proptest::option::of("[^\\x00-\\x1f]{1,40}"),
            meta in proptest::option::of("[^\\x00-\\x1f]{0,40}"),
            kind in 0..7u8,
            by in proptest::option::of("[A-Za-z0-9_.-]{1,20}"),
        ) {
            let meta = meta.and_then(|m| crate::lock::Meta::parse(&serde_json::json!({ "m": m }), 1024).ok());
            let change = match kind {
                0 => Change::Acquired { fence, ttl_ms, granted_at_ms, owner, meta, mode: crate::lock::Mode::Exclusive },
                5 => Change::Acquired { fence, ttl_ms, granted_at_ms, owner, meta, mode: crate::lock::Mode::Shared },
                1 => Change::Extended { fence, ttl_ms, at_ms: Some(granted_at_ms) },
                2 => Change::Expired { fence },
                3 => Change::Completed { fence },
                6 => Change::Broken { fence, by },
                _ => Change::Released { fence },
            };
            prop_assert_eq!(Change::parse(change.encode().as_bytes()), change);
        }
    }
}
