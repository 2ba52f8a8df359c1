//! `contended`: `clients` clients on `names` locks, each holding a lock for
//! `hold` and waiting for it with `wait_ms`. Checks mutual exclusion as it
//! goes: the grants of one name must never overlap, and fences must grow in
//! grant order.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::client::{BenchError, Lockd, fresh_name};
use crate::stats::{Latency, Tally};

/// One hold as the client saw it: from the 201's arrival to the moment the
/// release was sent. It lies inside the server-side hold, so two that
/// overlap mean two holders at once.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    pub fence: u64,
    pub granted: Instant,
    pub released: Instant,
}

/// The shape of the load.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub clients: usize,
    pub names: usize,
    pub hold: Duration,
    pub wait_ms: u64,
    pub ttl_ms: u64,
    pub duration: Duration,
}

/// Runs the load and prints a table.
pub async fn run(lockd: &Lockd, load: Load) -> Result<Value, BenchError> {
    let names: Vec<String> = (0..load.names.max(1))
        .map(|_| fresh_name("contended"))
        .collect();
    let started = Instant::now();
    let workers: Vec<_> = (0..load.clients.max(1))
        .map(|_| {
            let (lockd, names) = (lockd.clone(), names.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut waits = Vec::new();
                let mut holds: Vec<(usize, Hold)> = Vec::new();
                while started.elapsed() < load.duration {
                    let i = rand::random_range(0..names.len());
                    let asked = Instant::now();
                    let attempt = lockd
                        .try_acquire(&names[i], load.ttl_ms, load.wait_ms)
                        .await;
                    tally.count(attempt.status);
                    let Some(grant) = attempt.grant else {
                        continue;
                    };
                    waits.push(grant.at - asked);
                    tokio::time::sleep(load.hold).await;
                    let released = Instant::now();
                    tally.count(lockd.try_release(&names[i], &grant.token).await);
                    holds.push((
                        i,
                        Hold {
                            fence: grant.fence,
                            granted: grant.at,
                            released,
                        },
                    ));
                }
                (tally, waits, holds)
            })
        })
        .collect();
    let mut tally = Tally::default();
    let mut waits = Vec::new();
    let mut by_name: BTreeMap<usize, Vec<Hold>> = BTreeMap::new();
    for worker in workers {
        let (t, w, h) = worker.await?;
        tally.merge(&t);
        waits.extend(w);
        for (i, hold) in h {
            by_name.entry(i).or_default().push(hold);
        }
    }
    let elapsed = started.elapsed();
    let grants: usize = by_name.values().map(Vec::len).sum();
    let violations: usize = by_name.values_mut().map(|h| violations(h)).sum();
    let rate = grants as f64 / elapsed.as_secs_f64();
    let errors = tally.errors(&["409"]);
    let wait = Latency::of(waits);
    println!(
        "contended: {} clients on {} names, hold {:?}, wait_ms {}, {elapsed:.1?}: {rate:.0} grants/s",
        load.clients, load.names, load.hold, load.wait_ms
    );
    println!("  answers: {}", tally.line());
    println!("{}", Latency::header());
    println!("{}", wait.row("acquire, waiting included"));
    println!("  mutual-exclusion violations: {violations}; errors: {errors}");
    Ok(json!({
        "scenario": "contended",
        "clients": load.clients,
        "names": load.names,
        "hold_ms": load.hold.as_secs_f64() * 1000.0,
        "wait_ms": load.wait_ms,
        "seconds": elapsed.as_secs_f64(),
        "grants_per_second": rate,
        "answers": tally,
        "errors": errors,
        "violations": violations,
        "latency": { "acquire": wait },
    }))
}

/// Sorts one name's holds by grant time and counts the pairs in which the
/// later grant came before the earlier hold was released (overlap) or did
/// not have a larger fence.
pub fn violations(holds: &mut [Hold]) -> usize {
    holds.sort_by_key(|h| h.granted);
    holds
        .windows(2)
        .filter(|pair| pair[1].granted < pair[0].released || pair[1].fence <= pair[0].fence)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(fence: u64, from_ms: u64, to_ms: u64, zero: Instant) -> Hold {
        Hold {
            fence,
            granted: zero + Duration::from_millis(from_ms),
            released: zero + Duration::from_millis(to_ms),
        }
    }

    #[test]
    fn overlaps_and_fences_going_backwards_are_violations() {
        let zero = Instant::now();
        let mut fine = vec![
            hold(2, 10, 20, zero),
            hold(1, 0, 5, zero),
            hold(3, 20, 30, zero),
        ];
        assert_eq!(violations(&mut fine), 0);
        let mut overlap = vec![hold(1, 0, 15, zero), hold(2, 10, 20, zero)];
        assert_eq!(violations(&mut overlap), 1);
        let mut backwards = vec![hold(5, 0, 5, zero), hold(4, 10, 20, zero)];
        assert_eq!(violations(&mut backwards), 1);
    }
}
