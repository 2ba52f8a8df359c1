//! The fencing-token rule, shared by every backend (the Redis scripts
//! restate it in Lua).
//!
//! A grant's fence is the larger of the stored counter plus one and the
//! store's clock in microseconds since the Unix epoch:
//!
//! ```text
//! fence = max(counter + 1, clock_us)        counter = fence, kept for
//!                                           fence_retention_ms
//! ```
//!
//! - Fences of one lock strictly increase while the counter is kept
//!   (`counter + 1`).
//! - When the counter is gone (it expired after `fence_retention_ms`, Redis
//!   restarted without persistence, `FLUSHALL`, a failover to a replica that
//!   missed the last grant), the clock takes over: the next fence is above
//!   every earlier one as long as the clock reads more than the last fence.
//!   A fence runs ahead of the clock only by the grants of the same lock
//!   made within one microsecond of each other, which cannot happen (each
//!   grant after the first needs a release or an expiry in between, each a
//!   script of several microseconds), so in practice the condition is: the
//!   store's clock has not stepped back by more than the time since that
//!   lock's last grant.
//! - Fences stay below 2^53 (exact in JavaScript and in every JSON parser)
//!   until the year 2255; a counter at or above it is refused.
//!
//! This is Kleppmann's fencing token ("How to do distributed locking"),
//! made to survive the loss of the counter by tying it to a clock, as
//! hybrid logical clocks do.

use std::time::{Duration, SystemTime};

/// The largest fence: 2^53 − 1, the largest integer a double holds exactly.
pub const MAX_FENCE: u64 = (1 << 53) - 1;

/// The shortest `fence_retention_ms`: one second.
pub const MIN_RETENTION: Duration = Duration::from_secs(1);

/// The default `fence_retention_ms`: one hour.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3600);

/// Why no fence could be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// The stored counter is at or above [`MAX_FENCE`]: a foreign client
    /// wrote it, since lockd's fences stay below it.
    #[error("the fence counter {0} is at or above 2^53 - 1")]
    Exhausted(u64),
}

/// The fence of a new grant, from the stored counter (`None` when there is
/// none: never granted, expired, or lost) and the store's clock in
/// microseconds since the Unix epoch.
///
/// # Errors
/// [`FenceError::Exhausted`] when the fence would pass [`MAX_FENCE`].
pub fn next_fence(stored: Option<u64>, clock_us: u64) -> Result<u64, FenceError> {
    let fence = stored
        .map_or(0, |c| c.saturating_add(1))
        .max(clock_us.min(MAX_FENCE));
    if fence > MAX_FENCE {
        return Err(FenceError::Exhausted(stored.unwrap_or(fence)));
    }
    Ok(fence)
}

/// Microseconds since the Unix epoch of a wall-clock time (0 before 1970).
pub fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_clock_gives_the_fence_when_there_is_no_counter() {
        assert_eq!(
            next_fence(None, 1_700_000_000_000_000),
            Ok(1_700_000_000_000_000)
        );
    }

    #[test]
    fn the_counter_gives_the_fence_when_it_is_ahead_of_the_clock() {
        assert_eq!(next_fence(Some(41), 0), Ok(42));
        assert_eq!(next_fence(Some(1_000), 1_000), Ok(1_001));
    }

    #[test]
    fn an_old_plain_counter_is_overtaken_by_the_clock() {
        assert_eq!(
            next_fence(Some(4), 1_764_000_000_000_000),
            Ok(1_764_000_000_000_000)
        );
    }

    #[test]
    fn fences_stay_below_two_to_the_53() {
        assert_eq!(next_fence(Some(MAX_FENCE - 1), 0), Ok(MAX_FENCE));
        assert_eq!(
            next_fence(Some(MAX_FENCE), 0),
            Err(FenceError::Exhausted(MAX_FENCE))
        );
        assert_eq!(
            next_fence(Some(u64::MAX), 0),
            Err(FenceError::Exhausted(u64::MAX))
        );
        // The clock alone never passes it.
        assert_eq!(next_fence(None, u64::MAX), Ok(MAX_FENCE));
        // Today's clock is far below it: 2^53 µs is in the year 2255.
        let now = unix_micros(SystemTime::now());
        assert!(now < MAX_FENCE / 4, "{now}");
    }

    /// One step of a store's life, for one lock.
    #[derive(Debug, Clone)]
    enum Step {
        /// A grant, this many microseconds after the previous step. Two
        /// grants of one lock are at least a microsecond apart: a release
        /// or an expiry, each a script of its own, comes between them.
        Grant { after_us: u64 },
        /// The counter is lost: a restart without persistence, FLUSHALL, a
        /// failover to a replica that missed the last grant, or the
        /// retention passing.
        Lose,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (1u64..5_000_000).prop_map(|after_us| Step::Grant { after_us }),
            1 => Just(Step::Lose),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// For any sequence of grants, clock readings that never go back,
        /// and losses of the stored counter, starting from an old plain
        /// counter or none, fences strictly increase (and so no two grants
        /// share one).
        #[test]
        fn fences_strictly_increase_through_grants_and_losses(
            start_us in 1_000_000u64..(1 << 52),
            old_counter in proptest::option::of(0u64..1_000_000),
            steps in proptest::collection::vec(step(), 1..200),
        ) {
            let mut clock = start_us;
            let mut stored = old_counter;
            let mut last = old_counter;
            for step in steps {
                match step {
                    Step::Grant { after_us } => {
                        clock += after_us;
                        let fence = next_fence(stored, clock).expect("below 2^53");
                        if let Some(last) = last {
                            prop_assert!(fence > last, "fence {} after {}", fence, last);
                        }
                        prop_assert!(fence <= MAX_FENCE);
                        stored = Some(fence);
                        last = Some(fence);
                    }
                    Step::Lose => stored = None,
                }
            }
        }
    }
}
