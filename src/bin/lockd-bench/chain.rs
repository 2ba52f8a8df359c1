//! `script-chain`: what a drain of parked waiters is measured against.
//! One client runs lockd's own acquire and release scripts back to back
//! on one Redis, through lockd's lock core (the Redis backend, default
//! settings, in this process): grant, release, grant, ... on one lock,
//! each script sent once the previous one answered. That is a drain's
//! chain of handoffs with no HTTP, no waiting and no release event in
//! between, so a drain can go at most this fast: issue 33 asks for at
//! least 0.8 of it.

use std::sync::Arc;
use std::time::Duration;

use lockd::config::StoreSettings;
use lockd::lock::redis::connect::{ConnectReport, RedisTls};
use lockd::lock::redis::{Endpoint, RedisBackend, RedisConfig};
use lockd::lock::{AcquireRequest, LockName, LockNode, Mode, Token, Ttl};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, fresh_name};

/// Runs `count` grants and releases of one fresh lock on the Redis at
/// `url`, one after the other, and prints the rate (handoffs per second).
pub async fn run(url: &str, count: usize) -> Result<Value, BenchError> {
    let defaults = StoreSettings::default();
    let tls = RedisTls::default();
    let backend = RedisBackend::new(&RedisConfig {
        endpoint: Endpoint::Server(url.to_owned()),
        report: Arc::new(ConnectReport::new("chain".into(), &tls)),
        tls,
        key_prefix: defaults.key_prefix.clone(),
        timeout: Duration::from_secs(5),
        pool_size: defaults.pool_size.get(),
        fence_retention: defaults.fence_retention,
        history_length: defaults.history_length,
        restart_delay: None,
        min_replicas_acked: 0,
        replica_ack_timeout: defaults.replica_ack_timeout,
        standalone: true,
    })
    .map_err(|e| e.to_string())?;
    let name = LockName::parse(&fresh_name("chain")).map_err(|e| e.to_string())?;
    let ttl = Ttl::from_millis(10_000, u64::MAX, "ttl_ms").map_err(|e| e.to_string())?;
    let request = |token: Token| AcquireRequest {
        name: name.clone(),
        token,
        ttl,
        owner: None,
        meta: None,
        token_generated: true,
        mode: Mode::Exclusive,
        // A drain's grants go to waiters, whose wait has time left.
        waits_until: Some(Instant::now() + Duration::from_secs(60)),
        renew_only: false,
    };
    // One round more, first and untimed: the scripts loaded, the
    // connection open.
    let mut started = Instant::now();
    for round in 0..=count {
        if round == 1 {
            started = Instant::now();
        }
        let token = Token::generate();
        backend
            .acquire(&request(token.clone()))
            .await
            .map_err(|e| e.to_string())?;
        backend
            .release(&name, &token)
            .await
            .map_err(|e| e.to_string())?;
    }
    let elapsed = started.elapsed();
    #[allow(clippy::cast_precision_loss)]
    let rate = count as f64 / elapsed.as_secs_f64();
    println!(
        "script chain: {count} grants and releases of one lock back to back, one client, in {elapsed:.1?}: {rate:.0} handoffs/s"
    );
    Ok(json!({
        "scenario": "script-chain",
        "handoffs": count,
        "seconds": elapsed.as_secs_f64(),
        "handoffs_per_second": rate,
    }))
}
