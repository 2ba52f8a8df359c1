//! `cycle`: uncontended acquire-and-release cycles on distinct names.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, Lockd, fresh_name};
use crate::stats::Latency;

/// Runs `clients` workers for `duration`, each taking and releasing a lock
/// of its own name in a loop, and prints the rate and the cycle latency.
pub async fn run(lockd: &Lockd, clients: usize, duration: Duration) -> Result<Value, BenchError> {
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let lockd = lockd.clone();
            tokio::spawn(async move {
                let name = fresh_name("cycle");
                let mut samples = Vec::new();
                while started.elapsed() < duration {
                    let begun = Instant::now();
                    let grant = lockd
                        .acquire(&name, 10_000, 0)
                        .await?
                        .ok_or("an uncontended lock was held")?;
                    lockd.release(&name, &grant.token).await?;
                    samples.push(begun.elapsed());
                }
                Ok::<_, BenchError>(samples)
            })
        })
        .collect();
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await??);
    }
    let elapsed = started.elapsed();
    let rate = samples.len() as f64 / elapsed.as_secs_f64();
    let latency = Latency::of(samples);
    println!("cycle: {clients} clients, {elapsed:.1?}: {rate:.0} acquire+release cycles/s");
    println!("{}", Latency::header());
    println!("{}", latency.row("acquire + release"));
    Ok(json!({
        "scenario": "cycle",
        "clients": clients,
        "seconds": elapsed.as_secs_f64(),
        "cycles_per_second": rate,
        "latency": latency,
    }))
}
