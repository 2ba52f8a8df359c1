//! `waiters`: what many parked waiters cost the server.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, Lockd, fresh_name};
use crate::stats::mib;

/// Resident and peak resident memory of a process, in bytes, from
/// `/proc/PID/status` (`VmRSS`, `VmHWM`).
fn memory_of(pid: u32) -> Result<(u64, u64), BenchError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Clients connected to Redis, this probe's own connection excluded, and
/// those of them subscribed to any channel or pattern (`sub=`, `psub=` or
/// `ssub=` above 0 in `CLIENT LIST`).
async fn redis_clients(url: &str) -> Result<(usize, usize), BenchError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await?;
    let subscribed = list
        .lines()
        .filter(|line| {
            line.split(' ').any(|field| {
                ["sub=", "psub=", "ssub="].iter().any(|p| {
                    field
                        .strip_prefix(p)
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|n| n > 0)
                })
            })
        })
        .count();
    Ok((list.lines().count().saturating_sub(1), subscribed))
}

/// Runs the scenario and prints a table.
pub async fn run(
    lockd: &Lockd,
    server: &str,
    count: usize,
    pid: u32,
    redis_url: &str,
    settle: Duration,
) -> Result<Value, BenchError> {
    let (idle_rss, _) = memory_of(pid)?;
    let (idle_clients, _) = redis_clients(redis_url).await?;
    let name = fresh_name("waiters");
    let holder = lockd
        .acquire(&name, 120_000, 0)
        .await?
        .ok_or("a fresh lock is held")?;

    // The waiters' own client: its connections close when it is dropped.
    let waiters = Lockd::new(server)?;
    let parked = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for _ in 0..count {
        let (lockd, name) = (waiters.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let grant = lockd
                .acquire(&name, 10_000, 60_000)
                .await?
                .ok_or("a waiter was not granted within 60 s")?;
            // Release at once, so the next waiter is served.
            lockd.release(&name, &grant.token).await?;
            Ok::<_, BenchError>(grant)
        }));
    }
    lockd.until_waiting(count, Duration::from_secs(120)).await?;
    let park_time = parked.elapsed();
    let (rss, _) = memory_of(pid)?;
    let (clients, subscribed) = redis_clients(redis_url).await?;

    let draining = Instant::now();
    lockd.release(&name, &holder.token).await?;
    let mut grants = Vec::with_capacity(count);
    for task in tasks {
        grants.push(task.await??);
    }
    let drain_time = draining.elapsed();
    let (_, peak_rss) = memory_of(pid)?;
    // The waiters' connections close, as a finished client's would.
    drop(waiters);
    tokio::time::sleep(settle).await;
    let (settled_rss, _) = memory_of(pid)?;

    // Each waiter releases only after its 201 arrived, so the order in which
    // the 201s arrived is the grant order: fences must grow along it.
    grants.sort_by_key(|g| g.at);
    let violations = grants
        .windows(2)
        .filter(|pair| pair[1].fence <= pair[0].fence)
        .count();

    println!("{count} waiters parked on one lock in {park_time:?}");
    println!("  server RSS idle        {:>10.1} MiB", mib(idle_rss));
    println!("  server RSS, all parked {:>10.1} MiB", mib(rss));
    println!("  server peak RSS        {:>10.1} MiB", mib(peak_rss));
    println!(
        "  Redis connections      {clients:>10} (before: {idle_clients}; subscribed: {subscribed})"
    );
    println!(
        "  drained in {drain_time:?}: {:.0} handoffs/s, {violations} ordering violations",
        count as f64 / drain_time.as_secs_f64()
    );
    println!(
        "  server RSS {settle:?} after the drain {:>6.1} MiB",
        mib(settled_rss)
    );
    if violations > 0 {
        return Err(format!("{violations} grants overlapped or fences went backwards").into());
    }
    Ok(json!({
        "scenario": "waiters",
        "waiters": count,
        "park_seconds": park_time.as_secs_f64(),
        "idle_rss_bytes": idle_rss,
        "parked_rss_bytes": rss,
        "peak_rss_bytes": peak_rss,
        "redis_connections": clients,
        "redis_connections_before": idle_clients,
        "redis_subscribed_connections": subscribed,
        "drain_seconds": drain_time.as_secs_f64(),
        "handoffs_per_second": count as f64 / drain_time.as_secs_f64(),
        "settle_seconds": settle.as_secs_f64(),
        "settled_rss_bytes": settled_rss,
        "violations": violations,
    }))
}
