//! `raw-cycle`: the commands of an uncontended acquire and release, sent
//! straight to Redis with no lockd in between: `SET key token NX PX ttl`,
//! then a compare-and-delete script. The baseline lockd's `cycle` is
//! measured against, in the same run, with the same number of clients
//! (each on a connection of its own, as lockd's pool gives each request
//! one).

use std::time::Duration;

use redis::Script;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, fresh_name};
use crate::stats::{Latency, Tally};

/// The release script of the Redis docs' single-instance lock pattern.
pub const RELEASE: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// Runs `clients` workers for `duration` against the Redis at `url`.
pub async fn run(url: &str, clients: usize, duration: Duration) -> Result<Value, BenchError> {
    let client = redis::Client::open(url)?;
    let script = Script::new(RELEASE);
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..clients.max(1) {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let script = script.clone();
        workers.push(tokio::spawn(async move {
            let key = fresh_name("raw");
            let mut samples = Vec::new();
            let mut tally = Tally::default();
            while started.elapsed() < duration {
                let begun = Instant::now();
                let token = format!("{:032x}", rand::random::<u128>());
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await?;
                if set.is_none() {
                    tally.count(Some(409));
                    continue;
                }
                let deleted: i64 = script.key(&key).arg(&token).invoke_async(&mut conn).await?;
                tally.count(Some(if deleted == 1 { 204 } else { 404 }));
                samples.push(begun.elapsed());
            }
            Ok::<_, BenchError>((samples, tally))
        }));
    }
    let mut samples = Vec::new();
    let mut tally = Tally::default();
    for worker in workers {
        let (s, t) = worker.await??;
        samples.extend(s);
        tally.merge(&t);
    }
    let elapsed = started.elapsed();
    let rate = samples.len() as f64 / elapsed.as_secs_f64();
    let latency = Latency::of(samples);
    println!(
        "raw Redis cycle: {clients} clients, {elapsed:.1?}: {rate:.0} SET NX PX + release-script cycles/s"
    );
    println!("{}", Latency::header());
    println!("{}", latency.row("SET NX PX + release script"));
    Ok(json!({
        "scenario": "raw-cycle",
        "clients": clients,
        "seconds": elapsed.as_secs_f64(),
        "cycles_per_second": rate,
        "answers": tally,
        "latency": { "cycle": latency },
    }))
}
