//! `lockd-bench`: drives a running lockd over HTTP and measures it.
//!
//! Scenarios:
//! - `cycle`: `--clients` workers take and release locks of their own
//!   (no contention) for `--seconds`, as fast as they go or at `--rate`
//!   cycles/s in all; reports cycles/s, latency and answers by status.
//!   `--names reused` (each client one name, every cycle) or `distinct` (a
//!   new name every cycle); `--kind lock`, `shared` (shared locks) or
//!   `run` (a run's start and complete). With `--semaphore-limit N`,
//!   permits of semaphores of limit N instead of locks.
//! - `raw-cycle`: the same commands straight on Redis (`SET NX PX` and a
//!   compare-and-delete script), the baseline for `cycle`.
//! - `script-chain` (`chain`): lockd's own acquire and release scripts run
//!   back to back on one Redis by one client, through lockd's lock core in
//!   this process: the chain a drain of waiters is compared with.
//! - `contended`: `--clients` clients on `--names` locks, holding each for
//!   `--hold-ms` and waiting with `--wait-ms`; checks that grants of one
//!   name never overlap and fences grow in grant order.
//! - `handoff`: the time from one holder's release (its 204) to the next
//!   waiter's grant (its 201), with server-side waiting, beside a client that
//!   polls with `wait_ms` 0 every `--poll-interval-ms`, in the same run.
//! - `waiters`: parks `--count` waiters on one lock, then reports the
//!   server's resident memory and its Redis connection count, then drains
//!   them one by one (each releases at once) and checks that grants never
//!   overlapped and fences grew in grant order.
//! - `readers`: `--count` readers (shared) queue behind a writer on a fresh
//!   lock, the writer releases; reports, over `--rounds`, the time from the
//!   release sent to the first reader's 201 and to the last's, and checks
//!   that every reader was granted with a fence of its own above the
//!   writer's.
//!
//! - `names`: takes and releases `--count` distinct names, then reports
//!   Redis's `used_memory` and `DBSIZE` before, right after, and once the
//!   fence retention has passed.
//!
//! - `null-server` (`null_server`): serves the acquire and release routes with fixed
//!   answers and nothing behind them, so that `cycle` against it measures
//!   the HTTP exchange alone: the ceiling for any HTTP service here. With
//!   `--redis-url`, each request also sends raw-cycle's command to Redis:
//!   the ceiling for any lock service speaking HTTP in front of Redis.
//!   `GET /readyz` answers 200, for a load balancer's health check.
//!
//! - `etcd-cycle` (`etcd`): the same uncontended cycles as `cycle`, on
//!   etcd's lock API, for comparison.
//!
//! Figures are printed as a table (`stats`: the latency percentiles and
//! counts), and written as JSON with `--json`. `client` is the HTTP client
//! every scenario shares.

use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::json;

mod chain;
mod client;
mod contended;
mod cycle;
mod etcd;
mod handoff;
mod names;
mod null_server;
mod raw;
mod readers;
mod stats;
mod waiters;

/// Measures a running lockd over HTTP.
#[derive(Debug, Parser)]
#[command(name = "lockd-bench", version, about)]
struct Cli {
    /// The lockd to measure.
    #[arg(long, env = "LOCKD_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// Also write the figures to this JSON file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// What to measure.
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Uncontended acquire and release cycles.
    Cycle {
        /// Concurrent clients, each on names of its own.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Cycles per second in all, on a fixed schedule [default: as fast
        /// as the clients go].
        #[arg(long)]
        rate: Option<f64>,
        /// Take and give back permits of semaphores of this limit (one
        /// semaphore per name) instead of locks; only with `--kind lock`.
        #[arg(long)]
        semaphore_limit: Option<u32>,
        /// Each client's one name at every cycle (`reused`; 8 keys in
        /// turn for runs, each result kept 1 ms), or a name never used
        /// before at every cycle (`distinct`).
        #[arg(long, value_enum, default_value_t = cycle::Names::Reused)]
        names: cycle::Names,
        /// What a cycle takes and gives back: an exclusive lock, a shared
        /// lock, or a run's attempt (start, then complete).
        #[arg(long, value_enum, default_value_t = cycle::Kind::Lock)]
        kind: cycle::Kind,
    },
    /// lockd's acquire and release scripts run back to back on one Redis
    /// by one client (through lockd's lock core, in this process): the
    /// chain a drain of parked waiters is measured against.
    ScriptChain {
        /// The Redis to run them on.
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
        /// Grants (each followed by its release).
        #[arg(long, default_value_t = 10_000)]
        count: usize,
    },
    /// Uncontended SET NX PX + release-script cycles straight on Redis.
    RawCycle {
        /// The Redis to measure.
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
        /// Concurrent clients, each on its own connection and key.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// The same cycles on etcd's lock API through its HTTP gateway: lease,
    /// lock, unlock.
    EtcdCycle {
        /// The etcd gateway (`--listen-client-urls` of etcd).
        #[arg(long, default_value = "http://127.0.0.1:2379")]
        endpoint: String,
        /// Concurrent clients, each on its own name.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Many clients on a few locks, waiting for them; checks mutual exclusion.
    Contended {
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// Locks they share.
        #[arg(long, default_value_t = 4)]
        names: usize,
        /// How long each holder keeps a lock, in ms.
        #[arg(long, default_value_t = 5)]
        hold_ms: u64,
        /// How long each acquire may wait, in ms.
        #[arg(long, default_value_t = 2000)]
        wait_ms: u64,
        /// The lease of each grant, in ms.
        #[arg(long, default_value_t = 10_000)]
        ttl_ms: u64,
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Release-to-grant latency with server-side waiting, beside polling.
    Handoff {
        /// Handoffs to time with server-side waiting.
        #[arg(long, default_value_t = 1000)]
        rounds: usize,
        /// Handoffs to time with a polling client.
        #[arg(long, default_value_t = 100)]
        poll_rounds: usize,
        /// The polling client's interval, in milliseconds.
        #[arg(long, default_value_t = 100)]
        poll_interval_ms: u64,
    },
    /// How soon readers queued behind a writer get in at its release.
    Readers {
        /// Rounds to time.
        #[arg(long, default_value_t = 100)]
        rounds: usize,
        /// Readers queued behind the writer each round.
        #[arg(long, default_value_t = 50)]
        count: usize,
    },
    /// Memory and Redis connections with many parked waiters.
    Waiters {
        /// Waiters to park on one lock.
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// The lockd process id, to read its memory from /proc.
        #[arg(long)]
        pid: u32,
        /// The Redis lockd uses, to count its connections.
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
        /// How long after the drain, with every waiter's connection
        /// closed, to read lockd's memory again, in seconds.
        #[arg(long, default_value_t = 20)]
        settle_seconds: u64,
    },
    /// What locks used once leave in Redis: memory and keys before, right
    /// after, and after the fence retention.
    Names {
        /// Distinct names to take and release, once each.
        #[arg(long, default_value_t = 100_000)]
        count: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// How long to wait before the last reading, in seconds: longer
        /// than lockd's --fence-retention-ms.
        #[arg(long, default_value_t = 5)]
        settle_seconds: u64,
        /// The Redis lockd uses.
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis_url: String,
    },
    /// A bare HTTP server with fixed answers: `cycle` against it measures
    /// the cost of HTTP alone on this machine.
    NullServer {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
        /// Also send each request's command to this Redis (`SET NX PX`, or
        /// the compare-and-delete script).
        #[arg(long)]
        redis_url: Option<String>,
        /// What each request sends to that Redis: raw-cycle's commands
        /// (`floor`), or the least Redis work an exclusive lease of lockd
        /// needs, without or with its history (`lease`, `lease-history`).
        #[arg(long, value_enum, default_value_t = null_server::Writes::Floor)]
        writes: null_server::Writes,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let lockd = match client::Lockd::new(&cli.server) {
        Ok(lockd) => lockd,
        Err(e) => {
            eprintln!("lockd-bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match cli.scenario {
        Scenario::Cycle {
            clients,
            seconds,
            rate,
            semaphore_limit,
            names,
            kind,
        } => {
            if semaphore_limit.is_some() && kind != cycle::Kind::Lock {
                eprintln!("lockd-bench: --semaphore-limit takes permits: only with --kind lock");
                return std::process::ExitCode::FAILURE;
            }
            let lockd = lockd.clone().with_semaphores(semaphore_limit);
            let load = cycle::Load {
                clients,
                duration: Duration::from_secs(seconds),
                rate,
                names,
                kind,
            };
            cycle::run(&lockd, load).await
        }
        Scenario::ScriptChain { redis_url, count } => chain::run(&redis_url, count).await,
        Scenario::RawCycle {
            redis_url,
            clients,
            seconds,
        } => raw::run(&redis_url, clients, Duration::from_secs(seconds)).await,
        Scenario::EtcdCycle {
            endpoint,
            clients,
            seconds,
        } => etcd::run(&endpoint, clients, Duration::from_secs(seconds)).await,
        Scenario::Contended {
            clients,
            names,
            hold_ms,
            wait_ms,
            ttl_ms,
            seconds,
        } => {
            let load = contended::Load {
                clients,
                names,
                hold: Duration::from_millis(hold_ms),
                wait_ms,
                ttl_ms,
                duration: Duration::from_secs(seconds),
            };
            contended::run(&lockd, load).await
        }
        Scenario::Handoff {
            rounds,
            poll_rounds,
            poll_interval_ms,
        } => {
            handoff::run(
                &lockd,
                rounds,
                poll_rounds,
                Duration::from_millis(poll_interval_ms),
            )
            .await
        }
        Scenario::Readers { rounds, count } => readers::run(&lockd, rounds, count).await,
        Scenario::Waiters {
            count,
            pid,
            redis_url,
            settle_seconds,
        } => {
            let settle = Duration::from_secs(settle_seconds);
            waiters::run(&lockd, &cli.server, count, pid, &redis_url, settle).await
        }
        Scenario::Names {
            count,
            clients,
            settle_seconds,
            redis_url,
        } => {
            names::run(
                &lockd,
                count,
                clients,
                Duration::from_secs(settle_seconds),
                &redis_url,
            )
            .await
        }
        Scenario::NullServer {
            listen,
            redis_url,
            writes,
        } => null_server::run(listen, redis_url.as_deref(), writes).await,
    };
    match result {
        Ok(figures) => {
            if let Some(path) = cli.json {
                let text = serde_json::to_string_pretty(&json!(figures)).unwrap_or_default();
                if let Err(e) = std::fs::write(&path, text) {
                    eprintln!("lockd-bench: cannot write {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockd-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
