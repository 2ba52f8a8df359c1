//! `readers`: how soon a group of readers queued behind a writer gets in
//! at the writer's release.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, Lockd, fresh_name};
use crate::stats::Latency;

/// The lease of every grant: far longer than a round.
const TTL_MS: u64 = 10_000;

/// How long each reader may wait, in ms.
const WAIT_MS: u64 = 10_000;

/// One round: a writer holds a fresh lock, `count` readers queue behind
/// it, the writer releases. Returns the time from the release sent to the
/// first reader's 201 and to the last's. Every reader must be granted,
/// each with its own fence, all larger than the writer's.
async fn round(lockd: &Lockd, count: usize) -> Result<(Duration, Duration), BenchError> {
    let name = fresh_name("readers");
    let writer = lockd
        .acquire(&name, TTL_MS, 0)
        .await?
        .ok_or("a fresh lock is held")?;
    let readers = lockd.clone().with_shared(true);
    let asked: Vec<_> = (0..count)
        .map(|_| {
            let (readers, name) = (readers.clone(), name.clone());
            tokio::spawn(async move { readers.acquire(&name, TTL_MS, WAIT_MS).await })
        })
        .collect();
    lockd.until_waiting(count, Duration::from_secs(10)).await?;
    let sent = Instant::now();
    lockd.release(&name, &writer.token).await?;
    let mut grants = Vec::with_capacity(count);
    for reader in asked {
        grants.push(reader.await??.ok_or("a reader was not granted")?);
    }
    let mut fences: Vec<u64> = grants.iter().map(|g| g.fence).collect();
    fences.sort_unstable();
    fences.dedup();
    if fences.len() != count || fences.first().is_some_and(|f| *f <= writer.fence) {
        return Err("readers' fences are not distinct and above the writer's".into());
    }
    let first = grants.iter().map(|g| g.at).min().ok_or("no reader")?;
    let last = grants.iter().map(|g| g.at).max().ok_or("no reader")?;
    for grant in &grants {
        readers.release(&name, &grant.token).await?;
    }
    Ok((
        first.saturating_duration_since(sent),
        last.saturating_duration_since(sent),
    ))
}

/// Runs `rounds` rounds of `count` readers and prints a table.
pub async fn run(lockd: &Lockd, rounds: usize, count: usize) -> Result<Value, BenchError> {
    let (mut first, mut last) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (f, l) = round(lockd, count).await?;
        first.push(f);
        last.push(l);
    }
    let rows = [
        ("DELETE sent -> first reader's 201", Latency::of(first)),
        ("DELETE sent -> last reader's 201", Latency::of(last)),
    ];
    println!("{count} readers queued behind a writer, {rounds} rounds");
    println!("{}", Latency::header());
    for (label, latency) in &rows {
        println!("{}", latency.row(label));
    }
    Ok(json!({
        "scenario": "readers",
        "readers": count,
        "rounds": rounds,
        "first": rows[0].1,
        "last": rows[1].1,
    }))
}
