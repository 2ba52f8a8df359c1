//! One backoff for every retry loop of lockd: capped exponential, with
//! optional jitter, as linkerd2-proxy's `linkerd-exp-backoff`
//! (`ExponentialBackoff { min, max, jitter }`).
//!
//! Pause `n` (from 0) is `min(min × 2^n, max)`; with a jitter `j` above 0,
//! a random extra of up to `j ×` that pause is added, the sum still capped
//! at `max`.

use std::time::Duration;

/// The shape of a backoff: its first pause, its largest, and its jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialBackoff {
    min: Duration,
    max: Duration,
    jitter: f64,
}

impl ExponentialBackoff {
    /// Pauses from `min`, doubling up to `max`, without jitter.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            jitter: 0.0,
        }
    }

    /// The same, with up to `jitter` (a fraction, such as 0.1, of each
    /// pause; negative counts as 0) added at random to each pause.
    #[must_use]
    pub fn with_jitter(self, jitter: f64) -> Self {
        Self {
            jitter: jitter.max(0.0),
            ..self
        }
    }

    /// A fresh sequence of pauses, starting at `min`.
    pub fn pauses(self) -> Backoff {
        Backoff {
            shape: self,
            next: self.min.min(self.max),
        }
    }
}

/// One sequence of pauses of an [`ExponentialBackoff`].
#[derive(Debug, Clone)]
pub struct Backoff {
    shape: ExponentialBackoff,
    next: Duration,
}

impl Backoff {
    /// The next pause (and doubles the one after it, up to the cap).
    pub fn next_pause(&mut self) -> Duration {
        let base = self.next;
        let max = self.shape.max;
        self.next = base.checked_mul(2).unwrap_or(max).min(max);
        if self.shape.jitter > 0.0 {
            let extra = base.mul_f64(self.shape.jitter * rand::random::<f64>());
            (base + extra).min(max)
        } else {
            base
        }
    }

    /// Starts again from the first pause (after a success).
    pub fn reset(&mut self) {
        self.next = self.shape.min.min(self.shape.max);
    }

    /// Sleeps for the next pause.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_up_to_the_cap_and_reset() {
        let mut pauses = ExponentialBackoff::new(50 * MS, 1000 * MS).pauses();
        let got: Vec<u32> = (0..7)
            .map(|_| u32::try_from(pauses.next_pause().as_millis()).unwrap_or(u32::MAX))
            .collect();
        assert_eq!(got, [50, 100, 200, 400, 800, 1000, 1000]);
        pauses.reset();
        assert_eq!(pauses.next_pause(), 50 * MS);
    }

    #[test]
    fn jitter_adds_at_most_its_share_and_never_passes_the_cap() {
        let mut pauses = ExponentialBackoff::new(100 * MS, 300 * MS)
            .with_jitter(0.5)
            .pauses();
        for base in [100, 200, 300, 300] {
            let pause = pauses.next_pause();
            assert!(pause >= base * MS, "{pause:?} under {base} ms");
            assert!(pause <= (base * 3 / 2).min(300) * MS, "{pause:?}");
        }
    }

    #[test]
    fn a_huge_cap_does_not_overflow() {
        let mut pauses = ExponentialBackoff::new(Duration::MAX / 3, Duration::MAX).pauses();
        assert_eq!(pauses.next_pause(), Duration::MAX / 3);
        assert_eq!(pauses.next_pause(), Duration::MAX / 3 * 2);
        // Doubling that overflows: the cap.
        assert_eq!(pauses.next_pause(), Duration::MAX);
        assert_eq!(pauses.next_pause(), Duration::MAX);
    }
}
