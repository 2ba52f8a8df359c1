//! Latency percentiles.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// The percentiles of `samples` (nearest-rank).
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            if samples.is_empty() {
                return 0.0;
            }
            let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            samples[rank - 1].as_secs_f64() * 1000.0
        };
        Self {
            samples: samples.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            p999_ms: at(0.999),
            max_ms: at(1.0),
        }
    }

    /// One table row.
    pub fn row(&self, label: &str) -> String {
        format!(
            "{label:<34} {:>7} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            self.samples, self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        )
    }

    /// The table header matching [`Latency::row`].
    pub fn header() -> String {
        format!(
            "{:<34} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "", "n", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
        )
    }
}
