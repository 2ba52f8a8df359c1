//! `cycle`: uncontended acquire-and-release cycles, as fast as they go or
//! at a fixed total rate. Each client reuses one name of its own
//! ([`Names::Reused`]) or takes a name never used before at every cycle
//! ([`Names::Distinct`]); a cycle takes and gives back an exclusive lock,
//! a shared one, or a run's attempt ([`Kind`]).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::{Instant, sleep, sleep_until};

use crate::client::{Attempt, BenchError, Lockd, fresh_name};
use crate::stats::{Latency, Tally};

/// How late the timer may wake a client before the delay counts as the
/// server's.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// The lease of every grant and attempt, in ms.
const TTL_MS: u64 = 10_000;

/// How long a run's result is kept when clients reuse their keys, in ms:
/// the least the server takes, so that the key is new again soon.
const REUSED_RUN_RETENTION_MS: u64 = 1;

/// How many keys each client takes in turn when it reuses run keys: a key
/// comes back after this many cycles, by when its result (kept 1 ms) is
/// gone.
const REUSED_RUN_KEYS: u64 = 8;

/// Which names the clients' cycles use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Names {
    /// Each client one name of its own at every cycle (`{run}:c{client}`),
    /// as a job that takes the same lock again and again (a few in turn
    /// for runs: see [`Kind::Run`]).
    Reused,
    /// A name never used before at every cycle (`{run}:c{client}-{n}`), as
    /// webhook deliveries each take their own.
    Distinct,
}

/// What a cycle takes and gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// An exclusive lock (a semaphore's permit with `--semaphore-limit`):
    /// `POST /locks/{name}`, then `DELETE /locks/{name}`.
    Lock,
    /// A shared lock: `POST /locks/{name}` with `mode: "shared"`, then
    /// `DELETE /locks/{name}`.
    Shared,
    /// A run: `POST /runs/{key}` (201, an attempt), then `PUT
    /// /runs/{key}/result`. A done run is not started again while its
    /// result is kept, so with reused names each client takes 8 keys of
    /// its own in turn (`{run}:c{client}-{0..7}`) and each result is kept
    /// 1 ms (`retention_ms`): the key is new again when it comes back. A
    /// start that still finds the run done (200, a replay) is counted
    /// apart and made again 1 ms later.
    Run,
}

impl Kind {
    /// The name shown in tables and JSON.
    fn label(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Shared => "shared",
            Self::Run => "run",
        }
    }
}

impl Names {
    /// The name shown in tables and JSON.
    fn label(self) -> &'static str {
        match self {
            Self::Reused => "reused",
            Self::Distinct => "distinct",
        }
    }
}

/// What `cycle` runs.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Concurrent clients.
    pub clients: usize,
    /// How long to run.
    pub duration: Duration,
    /// Cycles per second in all, on a fixed schedule; `None`: as fast as
    /// the clients go.
    pub rate: Option<f64>,
    /// Which names the cycles use.
    pub names: Names,
    /// What each cycle takes.
    pub kind: Kind,
}

/// What one client measured.
#[derive(Default)]
struct Measured {
    acquire: Vec<Duration>,
    release: Vec<Duration>,
    cycle: Vec<Duration>,
    tally: Tally,
    /// Starts of a reused run key that found its result still kept.
    replays: u64,
}

/// One client's grant: an acquire's or a run start's.
async fn take(lockd: &Lockd, kind: Kind, name: &str) -> Attempt {
    match kind {
        Kind::Lock | Kind::Shared => lockd.try_acquire(name, TTL_MS, 0).await,
        Kind::Run => lockd.try_start_run(name, TTL_MS).await,
    }
}

/// Gives back what [`take`] got: the answer's status.
async fn give_back(lockd: &Lockd, load: Load, name: &str, token: &str) -> Option<u16> {
    match load.kind {
        Kind::Lock | Kind::Shared => lockd.try_release(name, token).await,
        Kind::Run => {
            let retention = (load.names == Names::Reused).then_some(REUSED_RUN_RETENTION_MS);
            lockd.try_complete_run(name, token, retention).await
        }
    }
}

/// Runs `load.clients` workers for `load.duration`. Without a rate, each
/// starts its next cycle as soon as the last ended (closed loop: the peak
/// rate). With a rate (cycles/s in all), each starts cycles on a fixed
/// schedule, and latency counts from the scheduled start, so a slow answer
/// cannot hide the requests it delayed. `lockd` takes locks shared for
/// [`Kind::Shared`]; it may be set up for semaphores for [`Kind::Lock`].
pub async fn run(lockd: &Lockd, load: Load) -> Result<Value, BenchError> {
    let Load {
        clients,
        duration,
        rate,
        names,
        kind,
    } = load;
    let clients = clients.max(1);
    let load = Load { clients, ..load };
    let lockd = lockd.clone().with_shared(kind == Kind::Shared);
    let period = rate.map(|r| Duration::from_secs_f64(clients as f64 / r.max(0.001)));
    // One prefix per run: no name of an earlier run comes back.
    let prefix = fresh_name("cycle");
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|i| {
            let (lockd, prefix) = (lockd.clone(), prefix.clone());
            tokio::spawn(async move {
                let own = format!("{prefix}:c{i}");
                let mut n: u64 = 0;
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
                    let fresh;
                    let name: &str = match (names, kind) {
                        (Names::Reused, Kind::Lock | Kind::Shared) => &own,
                        (Names::Reused, Kind::Run) => {
                            n += 1;
                            fresh = format!("{own}-{}", n % REUSED_RUN_KEYS);
                            &fresh
                        }
                        (Names::Distinct, _) => {
                            n += 1;
                            fresh = format!("{own}-{n}");
                            &fresh
                        }
                    };
                    let attempt = take(&lockd, kind, name).await;
                    m.tally.count(attempt.status);
                    let Some(grant) = attempt.grant else {
                        if attempt.done {
                            m.replays += 1;
                            sleep(Duration::from_millis(REUSED_RUN_RETENTION_MS)).await;
                        }
                        continue;
                    };
                    m.acquire.push(grant.at - begun);
                    let releasing = Instant::now();
                    let status = give_back(&lockd, load, name, &grant.token).await;
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
        all.replays += m.replays;
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
    let (kind_label, names_label) = (kind.label(), names.label());
    println!(
        "cycle ({kind_label}, {names_label} names): {clients} clients, {elapsed:.1?}, {target}: \
         {achieved:.0} acquire+release cycles/s"
    );
    println!("  answers: {}", all.tally.line());
    if all.replays > 0 {
        println!(
            "  starts that found the run done (replays): {}",
            all.replays
        );
    }
    println!("{}", Latency::header());
    let (took, gave) = match kind {
        Kind::Lock | Kind::Shared => ("acquire (201)", "release (204)"),
        Kind::Run => ("start (201)", "complete (200)"),
    };
    println!("{}", acquire.row(took));
    println!("{}", release.row(gave));
    println!("{}", cycle.row("acquire + release"));
    if errors > 0 {
        println!("  ERRORS: {errors}");
    }
    Ok(json!({
        "scenario": "cycle",
        "kind": kind_label,
        "names": names_label,
        "clients": clients,
        "seconds": elapsed.as_secs_f64(),
        "target_rate": rate,
        "cycles_per_second": achieved,
        "answers": all.tally,
        "errors": errors,
        "replays": all.replays,
        "latency": { "acquire": acquire, "release": release, "cycle": cycle },
    }))
}
