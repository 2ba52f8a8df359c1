//! Redlock: one lock over N independent Redis masters, as described on the
//! Redis page "Distributed Locks with Redis"
//! (<https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>).
//!
//! - **Quorum** is ⌊N/2⌋+1: any two quorums share a node, so two clients
//!   can never both hold a quorum of the same lock.
//! - **Acquire** sends the single-node acquire script to every node at once,
//!   each call bounded by its own timeout far below the TTL. The lock is
//!   granted when a quorum said yes and the validity time
//!   `ttl − elapsed − drift` (drift = ttl × factor + 2 ms) is still
//!   positive; the answer reports the validity, not the TTL. Otherwise the
//!   partial grants are compare-and-deleted on every node at once, and a node
//!   that did not answer gets the delete again in the background until it
//!   answers or the lease would have run out. When the quorum granted but
//!   no validity was left, the answer is [`LockError::LeaseSpent`] (503:
//!   nothing is held), since nobody else holds the lock; a refusal by
//!   other holders is [`LockError::Held`].
//! - **Extend** succeeds when a quorum extended within the new validity; a
//!   partial extend is not rolled back, it runs out with its TTL.
//! - **Release** goes to every node, whether or not it granted.
//! - **Listing** walks the nodes one after another; a lock is listed when a
//!   quorum agrees on its holder (as an inspect), once, during the walk of
//!   the lowest-index agreeing node (see `listing`).
//!
//! The fan-out to every node and the count of their answers is `tally`;
//! the walk of the nodes for a listing is `listing`.
//!
//! # Fencing tokens
//! Each node keeps its own counter. A grant reports the largest counter among
//! the nodes that granted it. Unless every node granted with the same
//! counter, it first writes that fence back to every node that answered,
//! granting or not, raising the lower counters. So after a grant, every node
//! that answered (at least a quorum) stands at or above its fence, and the
//! next grant's quorum shares a node with them, whose `INCR` gives a larger
//! fence, provided that node kept its data. With 3 nodes that all answered,
//! fences survive any one node losing its data between two grants; if a
//! node was down during a grant, no other node may lose its data before the
//! next one. The lock itself has the same limit: a node of an exact-majority
//! quorum that restarts empty within the lease lets a second client in. That
//! is the limit Martin Kleppmann's critique ("How to do distributed
//! locking") points at; antirez's answer ("Is Redlock safe?") asks for
//! delayed restarts (a restarted node stays out for a TTL) or
//! `appendfsync always` to avoid it.

use crate::lock::ProbedLock;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    AcquireRequest, Acquired, ChangeListener, ExtendTtl, Kind, Lease, LeaseLeft, LockError,
    LockInfo, LockName, LockNode, LockStore, Mode, Released, RunStore, SemaphoreStore, Store,
    Subject, Token, Ttl, WaitInterest,
};

mod listing;
mod tally;

use super::history::{self, BrokenLease, HistoryEntry};
use super::listing::{LockEntry, NamePrefix, Page, PageSize, Position};
use super::reaper::{Attempt, Reap, Reaper};
use tally::{Counting, Tally, agreed, fan_out};

/// The clock drift allowance added to every validity computation, on top
/// of `ttl × drift_factor` (the Redis page's "2 milliseconds").
const DRIFT_BASE: Duration = Duration::from_millis(2);

/// Locks held on a quorum of independent nodes: the [`Store`] over several
/// [`LockNode`]s.
pub struct Redlock {
    nodes: Arc<Vec<Arc<dyn LockNode>>>,
    /// Background deletes under way, by lock name and token. A later acquire
    /// with the same token (a waiter retrying, a client re-acquiring) stops
    /// them first, so they cannot delete its new grant.
    reaper: Arc<Reaper>,
    quorum: usize,
    drift_factor: f64,
    /// How long a release is retried on a node that did not answer: the
    /// longest lease a client may hold.
    max_ttl: Ttl,
}

/// The majority needed among `n` nodes: ⌊n/2⌋+1.
pub fn quorum(n: usize) -> usize {
    n / 2 + 1
}

impl Redlock {
    /// Redlock over `nodes` (each one bounded by its own timeout), with
    /// `drift_factor` (such as 0.01) of the TTL allowed for clock drift.
    /// `max_ttl` bounds how long a release is retried on a node that did not
    /// answer.
    pub fn new(nodes: Vec<Arc<dyn LockNode>>, drift_factor: f64, max_ttl: Ttl) -> Self {
        Self {
            quorum: quorum(nodes.len()),
            reaper: Arc::default(),
            nodes: Arc::new(nodes),
            drift_factor,
            max_ttl,
        }
    }

    /// The validity left of a lease of `ttl` after `elapsed`, or `None` when
    /// nothing is left.
    fn validity(&self, ttl: Ttl, elapsed: Duration) -> Option<Ttl> {
        let drift = ttl.as_duration().mul_f64(self.drift_factor) + DRIFT_BASE;
        let left = ttl.as_duration().checked_sub(elapsed)?.checked_sub(drift)?;
        let ms = u64::try_from(left.as_millis()).ok()?;
        Ttl::from_millis(ms, ttl.as_millis(), "validity").ok()
    }

    /// `Ok` for a lock; a semaphore or a run is refused as
    /// [`Store::semaphores`] and [`Store::runs`] refuse them.
    fn keeps(&self, subject: &Subject) -> Result<(), LockError> {
        match subject.kind() {
            Kind::Lock => Ok(()),
            Kind::Semaphore => self.semaphores().map(|_| ()),
            Kind::Run => self.runs().map(|_| ()),
        }
    }

    /// Compare-and-deletes `token` on every node at once. A node that did
    /// not answer gets the delete again in the background (the
    /// [`Reaper`]), until it answers or `ttl` has passed, so a node that
    /// hung during a refused acquire does not keep the grant once it is
    /// back.
    async fn release_everywhere(
        &self,
        name: &LockName,
        token: &Token,
        ttl: Ttl,
    ) -> Tally<Released> {
        let answers = fan_out(&self.nodes, Counting::Every, |_, n| {
            Some(n.release(name, token))
        })
        .await;
        let unanswered = answers.unanswered();
        if !unanswered.is_empty() {
            let stop = self.reaper.register(name, token, ttl.as_duration());
            for node in unanswered {
                let node = self.nodes[node].clone();
                let (name, token, stop) = (name.clone(), token.clone(), stop.clone());
                tokio::spawn(async move {
                    let reap = Reap::after_a_pause(ttl.as_duration());
                    reap.run(Some(&stop), || async {
                        match node.release(&name, &token).await {
                            Err(e) if e.is_transient() => Attempt::Retry(e),
                            _ => Attempt::Done,
                        }
                    })
                    .await
                });
            }
        }
        answers
    }
}

/// When a refused lock can be free on a quorum: the `k`-th shortest of the
/// holders' remaining leases, where `k` more nodes must free up. A node
/// whose key has no TTL ([`LeaseLeft::NoTtl`]) sorts after every lease
/// that ends: when the `k`-th is such a node, no end can be told.
fn retry_after(mut held: Vec<LeaseLeft>, free_now: usize, quorum: usize) -> LeaseLeft {
    held.sort_unstable();
    let missing = quorum.saturating_sub(free_now);
    match missing {
        // A quorum was free, but the validity ran out: try again soon.
        0 => LeaseLeft::AtMost(Duration::from_millis(10)),
        k => held
            .get(k - 1)
            .or(held.last())
            .copied()
            .unwrap_or(LeaseLeft::AtMost(Duration::from_secs(1))),
    }
}

/// Why Redlock has no semaphores. A permit granted on a majority of the
/// nodes over-grants for any limit of 2 or more: with limit 2 on 3 nodes,
/// clients A, B and C can win nodes {1,2}, {2,3} and {1,3}, each node then
/// holds exactly 2 permits, within its limit, and all three clients hold a
/// majority. Any two majorities share a node, which is what makes a lock
/// safe, but a node's count of N permits cannot tell which N of the
/// majorities it belongs to. So Redlock refuses semaphores rather than
/// over-grant (docs/semaphores.md, "Redlock").
/// Why Redlock mode has no watches (`GET /locks/{name}/events`): each node
/// publishes its own changes, in its own order, and no node's stream says
/// what a majority holds; a watch would have to read every node at every
/// change to say it.
pub const NO_REDLOCK_WATCH: &str = "watches are not available in Redlock mode: each independent node reports its own changes, and no single stream of them tells what a majority of nodes holds; use a single Redis, Sentinel or a Redis Cluster to watch locks, or poll GET /locks/{name}";

pub const NO_REDLOCK_SEMAPHORES: &str = "semaphores are not available in Redlock mode: a permit granted on a majority of independent nodes can be granted to more holders than the limit; use a single Redis, Sentinel or a Redis Cluster for semaphores";

/// Why Redlock mode has no runs (`/runs/{key}`): a run's promise is that a
/// done key is never run again, but a Redlock node restarted without its
/// data forgets the result, and a majority that no longer holds it would
/// make the done key look new. Redlock keeps leases that end anyway; a run's
/// result must outlive them (docs/runs.md, "Redlock").
pub const NO_REDLOCK_RUNS: &str = "runs are not available in Redlock mode: a node restarted without its data forgets a done run, and a majority of such nodes would run the job again; use a single Redis, Sentinel or a Redis Cluster for runs";

#[async_trait]
impl LockStore for Redlock {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        if req.mode == Mode::Shared {
            return Err(LockError::Unsupported(SHARED_UNSUPPORTED));
        }
        self.reaper.stop(&req.name, &req.token).await;
        let started = Instant::now();
        let sent_wall = SystemTime::now();
        let answers = fan_out(&self.nodes, Counting::Now, |_, n| Some(n.acquire(req))).await;

        // Why a quorum's grant is not a lease, when it is not.
        let mut spent = None;
        if answers.granted() >= self.quorum {
            let granted: Vec<u64> = answers.oks().map(|a| a.lease().fence).collect();
            let renewed = answers.oks().any(|a| matches!(a, Acquired::Renewed(_)));
            // The largest fence any node gave, a node in its restart delay
            // included: a larger fence is never wrong.
            let fence = granted.iter().copied().max().unwrap_or(0);
            // When every node answered and granted the same fence, all
            // counters already stand at it. Otherwise the fence is written
            // back to every node that answered, granting or not, so that
            // any later quorum meets a node at or above it.
            let consistent =
                granted.len() == self.nodes.len() && granted.iter().all(|f| *f == fence);
            // How many nodes hold the fence (and the grant) now.
            let took = if consistent {
                granted.len()
            } else {
                let answering = answers.answering();
                let raised = fan_out(&self.nodes, Counting::As(answers.counts()), |i, n| {
                    answering[i].then(|| n.raise_fence(&req.name, &req.token, fence))
                })
                .await;
                raised.counted_oks().filter(|held| **held).count()
            };
            let validity = self.validity(req.ttl, started.elapsed());
            if took >= self.quorum
                && let Some(validity) = validity
            {
                let lease = Lease {
                    fence,
                    ttl: validity,
                    set_to: req.ttl,
                    expires_at: sent_wall + validity.as_duration(),
                };
                return Ok(if renewed {
                    Acquired::Renewed(lease)
                } else {
                    Acquired::Granted(lease)
                });
            }
            // A quorum granted, and nobody else holds the lock: what is
            // missing is the validity (the lease ran out, less the drift,
            // before the quorum's answers were in) or a quorum that took
            // the fence (a node that did not answer in time, or restarted
            // without the grant, in between: as for any round that too
            // few nodes answered). Either way nothing is held once the
            // partial grants are released, and the answer says so, not
            // "held".
            spent = Some(if validity.is_none() {
                LockError::LeaseSpent {
                    ttl: req.ttl.as_duration(),
                }
            } else {
                LockError::QuorumUnavailable {
                    answered: took,
                    needed: self.quorum,
                }
            });
        }

        self.release_everywhere(&req.name, &req.token, req.ttl)
            .await;
        if let Some(spent) = spent {
            return Err(spent);
        }
        answers.told(self.quorum)?;
        let held = answers.held();
        let free = answers.answered() - held.len();
        Err(LockError::Held {
            left: retry_after(held, free, self.quorum),
        })
    }

    async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        let started = Instant::now();
        let sent_wall = SystemTime::now();
        let answers = fan_out(&self.nodes, Counting::Now, |_, n| {
            Some(n.extend(name, token, ttl))
        })
        .await;
        let extended: Vec<&Lease> = answers.counted_oks().collect();
        if extended.len() >= self.quorum {
            // The nodes set the TTL they were given, or the lock's own,
            // which they recorded alike at the grant: the shortest counts.
            let set_to = extended.iter().map(|l| l.set_to).min();
            if let Some(set_to) = set_to
                && let Some(validity) = self.validity(set_to, started.elapsed())
            {
                return Ok(Lease {
                    fence: extended.iter().map(|l| l.fence).max().unwrap_or(0),
                    ttl: validity,
                    set_to,
                    expires_at: sent_wall + validity.as_duration(),
                });
            }
            // The extension took longer than the lease: it is gone.
            return Err(LockError::NotHeld);
        }
        answers.told(self.quorum)?;
        Err(answers.verdict())
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        // Sent to every node, including those that did not grant: a node
        // that was down at acquire time may still hold a stale grant. A node
        // that does not answer gets it again in the background.
        // The release succeeds as the acquire does: when a quorum of nodes
        // still held the token (redsync's rule). Fewer means the lease was
        // over by Redlock's rule, and another holder may have the lock: the
        // copies found are deleted all the same, but the answer must not
        // tell the caller it held the lock until now.
        let answers = self.release_everywhere(name, token, self.max_ttl).await;
        let released: Vec<&Released> = answers.oks().collect();
        if released.len() >= self.quorum {
            // The earliest grant time recorded: the lock was held since then.
            return Ok(Released {
                granted_at: released.iter().filter_map(|r| r.granted_at).min(),
                mode: Mode::Exclusive,
            });
        }
        answers.told(self.quorum)?;
        // Too few confirmed, but the nodes that did not answer could make up
        // the quorum: whether the lease still held is theirs to tell. The
        // delete reaches them in the background.
        if released.len() + answers.unanswered().len() >= self.quorum {
            return Err(LockError::QuorumUnavailable {
                answered: released.len(),
                needed: self.quorum,
            });
        }
        Err(answers.verdict())
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        let answers = fan_out(&self.nodes, Counting::Every, |_, n| Some(n.holder(name))).await;
        answers.told(self.quorum)?;
        // The holder is the token a quorum of nodes agrees on; its fence is
        // the largest reported, its lease the shortest.
        let holders: Vec<Option<&(Token, LockInfo)>> = answers
            .by_node()
            .into_iter()
            .map(|h| h.and_then(Option::as_ref))
            .collect();
        Ok(agreed(&holders, self.quorum).map(|(info, _)| info))
    }

    /// A walk of the nodes one after another: a lock is listed once, when
    /// a quorum of nodes agrees on its holder.
    async fn list_locks(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<LockEntry>, LockError> {
        listing::list_locks(self, prefix, at, limit).await
    }

    /// Refused: see [`NO_REDLOCK_WATCH`] ([`Store::watchable`] says so
    /// before a watch starts).
    async fn probe(&self, _name: &LockName, _marker: &str) -> Result<ProbedLock, LockError> {
        Err(LockError::Unsupported(NO_REDLOCK_WATCH))
    }
}

#[async_trait]
impl Store for Redlock {
    fn locks(&self) -> &dyn LockStore {
        self
    }

    /// Refused: see [`NO_REDLOCK_SEMAPHORES`].
    fn semaphores(&self) -> Result<&dyn SemaphoreStore, LockError> {
        Err(LockError::Unsupported(NO_REDLOCK_SEMAPHORES))
    }

    /// Refused: see [`NO_REDLOCK_RUNS`].
    fn runs(&self) -> Result<&dyn RunStore, LockError> {
        Err(LockError::Unsupported(NO_REDLOCK_RUNS))
    }

    /// Refused: see [`NO_REDLOCK_WATCH`]; a semaphore is refused by
    /// [`Store::semaphores`].
    fn watchable(&self, subject: &Subject) -> Result<(), LockError> {
        match subject.kind() {
            Kind::Lock => Err(LockError::Unsupported(NO_REDLOCK_WATCH)),
            Kind::Semaphore => self.semaphores().map(|_| ()),
            Kind::Run => self.runs().map(|_| ()),
        }
    }

    /// Each node's history, merged ([`history::merge`]), once a quorum
    /// of nodes answered.
    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError> {
        self.keeps(subject)?;
        let answers = fan_out(&self.nodes, Counting::Every, |_, n| {
            Some(n.history(subject))
        })
        .await;
        answers.told(self.quorum)?;
        Ok(history::merge(answers.oks().cloned().collect()))
    }

    /// A break on every node (a node that does not answer keeps its copy
    /// until its lease ends, which no quorum then holds); the leases ended
    /// on any node, once a quorum answered.
    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        self.keeps(subject)?;
        let answers = fan_out(&self.nodes, Counting::Every, |_, n| {
            Some(n.break_leases(subject, fence, by))
        })
        .await;
        answers.told(self.quorum)?;
        let mut broken: Vec<BrokenLease> = Vec::new();
        for lease in answers.oks().flatten() {
            if !broken.iter().any(|b| b.fence == lease.fence) {
                broken.push(lease.clone());
            }
        }
        Ok(broken)
    }

    async fn ping(&self) -> Result<(), LockError> {
        let answers = fan_out(&self.nodes, Counting::Now, |_, n| Some(n.ping())).await;
        let up = answers.granted();
        if up >= self.quorum {
            Ok(())
        } else {
            Err(LockError::QuorumUnavailable {
                answered: up,
                needed: self.quorum,
            })
        }
    }

    /// Redlock's nodes are independent servers (never cluster nodes, which
    /// start-up refuses), each of which hears every release of its own.
    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>> {
        let interests: Vec<Arc<dyn WaitInterest>> = self
            .nodes
            .iter()
            .filter_map(|node| node.watch_releases(listener.clone(), stop.clone()))
            .collect();
        if interests.is_empty() {
            None
        } else {
            Some(Arc::new(EveryNode(interests)))
        }
    }
}

/// The [`WaitInterest`] of a Redlock: every node that subscribes subject
/// by subject is told (each node's own change messages wake the waiters).
struct EveryNode(Vec<Arc<dyn WaitInterest>>);

impl WaitInterest for EveryNode {
    fn waiting(&self, subject: &Subject) {
        for node in &self.0 {
            node.waiting(subject);
        }
    }

    fn idle(&self, subject: &Subject) {
        for node in &self.0 {
            node.idle(subject);
        }
    }
}

/// Why Redlock refuses shared mode (501): a shared lease over independent
/// masters would need each node's readers and writers kept together and
/// their majorities shown to intersect under restarts and hung nodes,
/// which lockd's Redlock tests do not yet prove.
const SHARED_UNSUPPORTED: &str = "shared locks are not available in Redlock mode: a shared lease over independent masters is not yet proven as safe as an exclusive one (node restarts, hung nodes); use exclusive locks here, or a single Redis, Sentinel or Redis Cluster for shared ones";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::memory::MemoryBackend;

    fn request(name: &str, token: &Token) -> AcquireRequest {
        AcquireRequest {
            name: LockName::parse(name).expect("valid name"),
            token: token.clone(),
            ttl: Ttl::from_millis(10_000, u64::MAX, "ttl_ms").expect("valid ttl"),
            owner: None,
            meta: None,
            token_generated: true,
            mode: Mode::Exclusive,
            waits_until: None,
            renew_only: false,
        }
    }

    fn cluster(n: usize) -> (Vec<Arc<MemoryBackend>>, Redlock) {
        let stores: Vec<Arc<MemoryBackend>> =
            (0..n).map(|_| Arc::new(MemoryBackend::new())).collect();
        let nodes = stores
            .iter()
            .map(|s| s.clone() as Arc<dyn LockNode>)
            .collect();
        (
            stores,
            Redlock::new(
                nodes,
                0.01,
                Ttl::from_millis(60_000, u64::MAX, "max").expect("valid"),
            ),
        )
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let quorums: Vec<usize> = (1..=5).map(quorum).collect();
        assert_eq!(quorums, [1, 2, 2, 3, 3]);
    }

    /// For every subset of nodes already held by someone else, the acquire
    /// succeeds exactly when the free nodes reach a quorum, and a refused
    /// acquire leaves nothing behind on the free nodes.
    #[tokio::test]
    async fn acquire_succeeds_exactly_when_the_free_nodes_reach_a_quorum() {
        for n in [3usize, 5] {
            for held_mask in 0u32..(1 << n) {
                let (stores, redlock) = cluster(n);
                let other = Token::generate();
                for (i, store) in stores.iter().enumerate() {
                    if held_mask & (1 << i) != 0 {
                        store.acquire(&request("k", &other)).await.expect("free");
                    }
                }
                let held = held_mask.count_ones() as usize;
                let outcome = redlock.acquire(&request("k", &Token::generate())).await;
                let expect_grant = n - held >= quorum(n);
                assert_eq!(
                    outcome.is_ok(),
                    expect_grant,
                    "n={n} held={held_mask:0n$b}: {outcome:?}"
                );
                if !expect_grant {
                    assert!(matches!(outcome, Err(LockError::Held { .. })));
                    let left: usize = stores.iter().map(|s| s.held_count()).sum();
                    assert_eq!(
                        left, held,
                        "n={n} held={held_mask:0n$b}: partial grants left"
                    );
                }
            }
        }
    }

    /// Each round, one node restarts empty and another is busy (held by a
    /// foreign token), so the granting quorum is the empty node and one
    /// other. Fences still grow: the grant writes its fence back to the
    /// quorum, and the next quorum shares a node with it.
    #[tokio::test]
    async fn fences_keep_growing_when_a_minority_of_nodes_loses_its_data() {
        let (stores, redlock) = cluster(3);
        let name = LockName::parse("k").expect("valid");
        let mut last = 0;
        for round in 0..12 {
            stores[round % 3].lose_data();
            let busy = &stores[(round + 1) % 3];
            let foreign = Token::generate();
            busy.acquire(&request("k", &foreign)).await.expect("free");
            let token = Token::generate();
            let granted = redlock
                .acquire(&request("k", &token))
                .await
                .expect("quorum");
            let fence = granted.lease().fence;
            assert!(fence > last, "round {round}: fence {fence} after {last}");
            last = fence;
            redlock.release(&name, &token).await.expect("held");
            busy.release(&name, &foreign).await.expect("held");
        }
    }

    #[tokio::test]
    async fn the_grant_reports_the_validity_not_the_ttl() {
        let (_, redlock) = cluster(3);
        let granted = redlock
            .acquire(&request("k", &Token::generate()))
            .await
            .expect("free");
        // 10 000 ms − drift (1 % + 2 ms) − elapsed.
        let ttl = granted.lease().ttl.as_millis();
        assert!(ttl <= 10_000 - 102 && ttl > 9_800, "validity {ttl}");
    }

    #[test]
    fn a_refused_lock_is_retried_when_enough_holders_have_expired() {
        let ms = |n| LeaseLeft::AtMost(Duration::from_millis(n));
        // 5 nodes, 3 held (100, 300, 200 ms left), 2 free: one more must free.
        assert_eq!(retry_after(vec![ms(100), ms(300), ms(200)], 2, 3), ms(100));
        // None free: three must free up, the third shortest lease.
        assert_eq!(retry_after(vec![ms(100), ms(300), ms(200)], 0, 2), ms(200));
        // A quorum was free: the validity ran out, try again soon.
        assert_eq!(retry_after(vec![], 3, 2), ms(10));
        // A key with no TTL on one node: the quorum frees with the others.
        let no_ttl = LeaseLeft::NoTtl;
        assert_eq!(retry_after(vec![no_ttl, ms(300), ms(200)], 0, 2), ms(300));
        // On two: a quorum of 2 never frees by itself.
        assert_eq!(retry_after(vec![no_ttl, no_ttl, ms(200)], 0, 2), no_ttl);
    }
}
