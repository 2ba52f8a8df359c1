//! `cycle`: uncontended acquire-and-release cycles, each client on a random
//! name of its own, as fast as they go or at a fixed total rate.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until};

use crate::client::{BenchError, Lockd, fresh_name};
use crate::stats::{Latency, Tally};

/// How late the timer may wake a client before the delay counts as the
/// server's.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// What one client measured.
#[derive(Default)]
struct Measured {
    acquire: Vec<Duration>,
    release: Vec<Duration>,
    cycle: Vec<Duration>,
    tally: Tally,
}

/// Runs `clients` workers for `duration`. Without `rate`, each starts its
/// next cycle as soon as the last ended (closed loop: the peak rate). With
/// `rate` (cycles/s in all), each starts cycles on a fixed schedule, and
/// latency counts from the scheduled start, so a slow answer cannot hide
/// the requests it delayed.
pub async fn run(
    lockd: &Lockd,
    clients: usize,
    duration: Duration,
    rate: Option<f64>,
) -> Result<Value, BenchError> {
    let clients = clients.max(1);
    let period = rate.map(|r| Duration::from_secs_f64(clients as f64 / r.max(0.001)));
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|i| {
            let lockd = lockd.clone();
            tokio::spawn(async move {
                let name = fresh_name("cycle");
                let mut m = Measured::default();
                // Spread the clients' schedules over one period.
                let mut next = period.map(|p| started + p.mul_f64(i as f64 / clients as f64));
                while started.elapsed() < duration {
                    let begun = match next {
                        Some(at) => {
                            sleep_until(at).await;
                            next = period.map(|p| at + p);
                            // The timer wakes up to a millisecond late: that
                            // is the bench's, not the server's. A later start
                            // is a backlog (the server was slow): counted.
                            let woke = Instant::now();
                            if woke - at < TIMER_SLACK { woke } else { at }
                        }
                        None => Instant::now(),
                    };
                    let attempt = lockd.try_acquire(&name, 10_000, 0).await;
                    m.tally.count(attempt.status);
                    let Some(grant) = attempt.grant else {
                        continue;
                    };
                    m.acquire.push(grant.at - begun);
                    let releasing = Instant::now();
                    let status = lockd.try_release(&name, &grant.token).await;
                    m.tally.count(status);
                    m.release.push(releasing.elapsed());
                    m.cycle.push(begun.elapsed());
                }
                m
            })
        })
        .collect();
    let mut all = Measured::default();
    for worker in workers {
        let m = worker.await?;
        all.acquire.extend(m.acquire);
        all.release.extend(m.release);
        all.cycle.extend(m.cycle);
        all.tally.merge(&m.tally);
    }
    let elapsed = started.elapsed();
    let cycles = all.cycle.len();
    let achieved = cycles as f64 / elapsed.as_secs_f64();
    let errors = all.tally.errors(&[]);
    let (acquire, release, cycle) = (
        Latency::of(all.acquire),
        Latency::of(all.release),
        Latency::of(all.cycle),
    );
    let target = rate.map_or_else(
        || "as fast as possible".to_owned(),
        |r| format!("target {r:.0}/s"),
    );
    println!(
        "cycle: {clients} clients, {elapsed:.1?}, {target}: {achieved:.0} acquire+release cycles/s"
    );
    println!("  answers: {}", all.tally.line());
    println!("{}", Latency::header());
    println!("{}", acquire.row("acquire (201)"));
    println!("{}", release.row("release (204)"));
    println!("{}", cycle.row("acquire + release"));
    if errors > 0 {
        println!("  ERRORS: {errors}");
    }
    Ok(json!({
        "scenario": "cycle",
        "clients": clients,
        "seconds": elapsed.as_secs_f64(),
        "target_rate": rate,
        "cycles_per_second": achieved,
        "answers": all.tally,
        "errors": errors,
        "latency": { "acquire": acquire, "release": release, "cycle": cycle },
    }))
}
