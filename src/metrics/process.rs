//! Process metrics (`process_*`): the `prometheus` crate's collector, with
//! `process_cpu_seconds_total` to the clock tick instead of whole seconds
//! (the crate keeps it in an integer counter, which makes a CPU-rate panel
//! read 0 between jumps).

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::{Counter, MetricFamily};

/// The process collector with CPU time to the tick.
pub struct ProcessMetrics {
    inner: ProcessCollector,
}

impl ProcessMetrics {
    /// Metrics of this process.
    pub fn new() -> Self {
        Self {
            inner: ProcessCollector::for_self(),
        }
    }
}

impl Default for ProcessMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.inner.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.inner.collect();
        if let Some(seconds) = cpu_seconds() {
            for family in families
                .iter_mut()
                .filter(|f| f.name() == "process_cpu_seconds_total")
            {
                for metric in family.mut_metric() {
                    let mut counter = Counter::default();
                    counter.set_value(seconds);
                    metric.set_counter(counter);
                }
            }
        }
        families
    }
}

/// User and system CPU time of this process, in seconds, from
/// `/proc/self/stat`.
fn cpu_seconds() -> Option<f64> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second();
    (ticks > 0).then(|| (stat.utime + stat.stime) as f64 / ticks as f64)
}
