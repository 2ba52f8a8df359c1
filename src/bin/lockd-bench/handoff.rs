//! `handoff`: how soon the next waiter gets a released lock.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, Grant, Lockd, fresh_name};
use crate::stats::Latency;

/// The lease of every grant: far longer than a round.
const TTL_MS: u64 = 10_000;

/// How the next holder asks for the lock.
#[derive(Clone, Copy)]
enum Waiter {
    /// One request with `wait_ms`, queued on the server.
    ServerSide,
    /// `wait_ms` 0 requests every interval until one is granted.
    Polling(Duration),
}

impl Waiter {
    async fn ask(self, lockd: Lockd, name: String) -> Result<Grant, BenchError> {
        match self {
            Self::ServerSide => lockd
                .acquire(&name, TTL_MS, 5_000)
                .await?
                .ok_or_else(|| "a waiter was not granted within 5 s".into()),
            Self::Polling(interval) => loop {
                if let Some(grant) = lockd.acquire(&name, TTL_MS, 0).await? {
                    return Ok(grant);
                }
                tokio::time::sleep(interval).await;
            },
        }
    }
}

/// Times `rounds` handoffs: the 204 of the holder's release to the 201 of
/// the next holder, who then holds for the next round. Fences must grow.
async fn time_handoffs(
    lockd: &Lockd,
    rounds: usize,
    waiter: Waiter,
) -> Result<(Vec<Duration>, Vec<Duration>), BenchError> {
    let name = fresh_name("handoff");
    let mut holder = lockd
        .acquire(&name, TTL_MS, 0)
        .await?
        .ok_or("a fresh lock is held")?;
    let mut from_204 = Vec::with_capacity(rounds);
    let mut from_request = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let next = tokio::spawn(waiter.ask(lockd.clone(), name.clone()));
        match waiter {
            Waiter::ServerSide => lockd.until_waiting(1, Duration::from_secs(5)).await?,
            // Release at a random phase of the polling interval.
            Waiter::Polling(interval) => {
                let phase = interval.mul_f64(rand::random::<f64>());
                tokio::time::sleep(interval / 2 + phase).await;
            }
        }
        let sent = Instant::now();
        let released = lockd.release(&name, &holder.token).await?;
        let grant = next.await??;
        if grant.fence <= holder.fence {
            return Err(format!("fence went from {} to {}", holder.fence, grant.fence).into());
        }
        from_204.push(grant.at.saturating_duration_since(released));
        from_request.push(grant.at.saturating_duration_since(sent));
        holder = grant;
    }
    lockd.release(&name, &holder.token).await?;
    Ok((from_204, from_request))
}

/// Runs the scenario and prints a table.
pub async fn run(
    lockd: &Lockd,
    rounds: usize,
    poll_rounds: usize,
    poll_interval: Duration,
) -> Result<Value, BenchError> {
    let (wait_204, wait_sent) = time_handoffs(lockd, rounds, Waiter::ServerSide).await?;
    let (poll_204, poll_sent) =
        time_handoffs(lockd, poll_rounds, Waiter::Polling(poll_interval)).await?;
    let poll_label = format!("polling every {} ms", poll_interval.as_millis());
    let rows = [
        ("wait_ms: 204 -> next 201", Latency::of(wait_204)),
        ("wait_ms: DELETE sent -> next 201", Latency::of(wait_sent)),
        ("poll: 204 -> next 201", Latency::of(poll_204)),
        ("poll: DELETE sent -> next 201", Latency::of(poll_sent)),
    ];
    println!("handoff latency ({poll_label} for the poll rows)");
    println!("{}", Latency::header());
    for (label, latency) in &rows {
        println!("{}", latency.row(label));
    }
    Ok(json!({
        "scenario": "handoff",
        "poll_interval_ms": poll_interval.as_millis() as u64,
        "server_wait": rows[0].1,
        "server_wait_from_release_sent": rows[1].1,
        "polling": rows[2].1,
        "polling_from_release_sent": rows[3].1,
    }))
}
