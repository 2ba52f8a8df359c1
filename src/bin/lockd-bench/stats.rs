//! Latency percentiles.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// Answers counted by status (`"201"`, `"409"`, ...; `"no answer"` for a
/// connection error).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally(pub BTreeMap<String, u64>);

impl Tally {
    /// Counts one answer.
    pub fn count(&mut self, status: Option<u16>) {
        let key = status.map_or_else(|| "no answer".to_owned(), |s| s.to_string());
        *self.0.entry(key).or_default() += 1;
    }

    /// Adds another tally.
    pub fn merge(&mut self, other: &Tally) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_default() += v;
        }
    }

    /// Answers that are errors: 5xx, other 4xx than `expected`, no answer.
    pub fn errors(&self, expected: &[&str]) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| !k.starts_with('2') && !expected.contains(&k.as_str()))
            .map(|(_, v)| v)
            .sum()
    }

    /// `201: 1000, 409: 3`.
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

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

/// Bytes in MiB, for tables.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
