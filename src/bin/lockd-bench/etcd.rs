//! `etcd-cycle`: the same uncontended cycles as `cycle`, on etcd's lock
//! API through its HTTP/JSON gateway (etcd v3.4 and later): for each
//! cycle a lease (`POST /v3/lease/grant`, a 10 s TTL, as `cycle`'s
//! grants), a lock held under it (`POST /v3/lock/lock`) and its release
//! (`POST /v3/lock/unlock`). The lease is left to expire, as a lockd lease
//! is. Each client keeps one name, like `cycle`; names and keys travel
//! base64-encoded, as the gateway wants them.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, fresh_name};
use crate::stats::{Latency, Tally};

/// How long one gateway request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One etcd client: the gateway's base URL over keep-alive connections.
#[derive(Clone)]
struct Etcd {
    http: reqwest::Client,
    base: String,
}

impl Etcd {
    /// `POST {base}{path}` with a JSON body: the status, and the JSON body
    /// of a 200.
    async fn post(&self, path: &str, body: Value) -> Result<Value, Option<u16>> {
        let answer = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .map_err(|e| e.status().map(|s| s.as_u16()))?;
        let status = answer.status().as_u16();
        if status != 200 {
            return Err(Some(status));
        }
        answer.json().await.map_err(|_| Some(status))
    }

    /// One cycle: lease, lock, unlock. `Err` with the status of the step
    /// that failed (`None`: no answer).
    async fn cycle(&self, name: &str) -> Result<(), Option<u16>> {
        let lease = self.post("/v3/lease/grant", json!({ "TTL": 10 })).await?;
        let id = lease["ID"].clone();
        let locked = self
            .post(
                "/v3/lock/lock",
                json!({ "name": STANDARD.encode(name), "lease": id }),
            )
            .await?;
        let key = locked["key"].clone();
        self.post("/v3/lock/unlock", json!({ "key": key })).await?;
        Ok(())
    }
}

/// Runs `clients` workers against the gateway at `endpoint`
/// (`http://host:port`) for `duration`, each starting its next cycle as
/// soon as the last ended.
pub async fn run(endpoint: &str, clients: usize, duration: Duration) -> Result<Value, BenchError> {
    let etcd = Etcd {
        http: reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()?,
        base: endpoint.trim_end_matches('/').to_owned(),
    };
    // A cycle that cannot work at all is an error, not a slow run.
    etcd.cycle(&fresh_name("etcd-probe"))
        .await
        .map_err(|status| format!("etcd's lock API at {endpoint} answered {status:?}"))?;
    let started = Instant::now();
    let workers: Vec<_> = (0..clients.max(1))
        .map(|_| {
            let etcd = etcd.clone();
            tokio::spawn(async move {
                let name = fresh_name("etcd-cycle");
                let (mut cycles, mut tally) = (Vec::new(), Tally::default());
                while started.elapsed() < duration {
                    let begun = Instant::now();
                    match etcd.cycle(&name).await {
                        Ok(()) => {
                            tally.count(Some(200));
                            cycles.push(begun.elapsed());
                        }
                        Err(status) => tally.count(status),
                    }
                }
                (cycles, tally)
            })
        })
        .collect();
    let (mut all, mut tally) = (Vec::new(), Tally::default());
    for worker in workers {
        let (cycles, t) = worker.await?;
        all.extend(cycles);
        tally.merge(&t);
    }
    let elapsed = started.elapsed();
    let achieved = all.len() as f64 / elapsed.as_secs_f64();
    let errors = tally.errors(&[]);
    let cycle = Latency::of(all);
    println!(
        "etcd-cycle: {clients} clients, {elapsed:.1?}: {achieved:.0} lease+lock+unlock cycles/s"
    );
    println!("  answers: {}", tally.line());
    println!("{}", Latency::header());
    println!("{}", cycle.row("lease + lock + unlock"));
    Ok(json!({
        "scenario": "etcd-cycle",
        "clients": clients,
        "seconds": elapsed.as_secs_f64(),
        "cycles_per_second": achieved,
        "answers": tally,
        "errors": errors,
        "latency": { "cycle": cycle },
    }))
}
