//! `names`: what locks used once leave in Redis. Takes and releases
//! `--count` distinct names, then reads Redis's `used_memory` and `DBSIZE`
//! before, right after, and once the fence retention has passed (lockd
//! must run with `--fence-retention-ms` shorter than `--settle-seconds`).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, Lockd, fresh_name};
use crate::stats::mib;

/// Redis's `used_memory` (bytes) and `DBSIZE` now.
async fn redis_usage(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<(u64, u64), BenchError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or("no used_memory in INFO memory")?;
    let keys: u64 = redis::cmd("DBSIZE").query_async(conn).await?;
    Ok((used, keys))
}

/// Runs the scenario and prints a table.
pub async fn run(
    lockd: &Lockd,
    count: usize,
    clients: usize,
    settle: Duration,
    redis_url: &str,
) -> Result<Value, BenchError> {
    let mut conn = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    let before = redis_usage(&mut conn).await?;
    let prefix = fresh_name("names");
    let started = Instant::now();
    let clients = clients.max(1);
    let workers: Vec<_> = (0..clients)
        .map(|c| {
            let (lockd, prefix) = (lockd.clone(), prefix.clone());
            tokio::spawn(async move {
                for i in (c..count).step_by(clients) {
                    let name = format!("{prefix}:{i}");
                    let grant = lockd
                        .acquire(&name, 10_000, 0)
                        .await?
                        .ok_or("a fresh name was held")?;
                    lockd.release(&name, &grant.token).await?;
                }
                Ok::<_, BenchError>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    let took = started.elapsed();
    let after = redis_usage(&mut conn).await?;
    tokio::time::sleep(settle).await;
    let settled = redis_usage(&mut conn).await?;

    println!("{count} distinct names taken and released in {took:?}");
    println!("                      used_memory      DBSIZE");
    for (label, (used, keys)) in [
        ("before", before),
        ("right after", after),
        ("after the retention", settled),
    ] {
        println!("  {label:<20} {:>8.2} MiB {keys:>10}", mib(used));
    }
    let per_name = after.0.saturating_sub(before.0) as f64 / count as f64;
    println!("  kept per name until the retention passes: {per_name:.0} bytes");
    Ok(json!({
        "scenario": "names",
        "names": count,
        "seconds": took.as_secs_f64(),
        "used_memory_before": before.0,
        "used_memory_after": after.0,
        "used_memory_settled": settled.0,
        "dbsize_before": before.1,
        "dbsize_after": after.1,
        "dbsize_settled": settled.1,
    }))
}
