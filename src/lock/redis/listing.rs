//! Listing on the Redis backend (see [`crate::lock::listing`]): a walk of
//! the keyspace with `SCAN cursor MATCH pattern COUNT n`, never `KEYS`, on
//! the server (or a Sentinel set's master), or on each master of a Redis
//! Cluster one after another, in the order of the first slot each serves.
//! The pattern matches the key that stands for a lock (`P{N}`) or a
//! semaphore (`Psem:{N}:permits`) only; the holders of the names found are
//! then read together, each by its inspect script, sent at once on one
//! multiplexed connection (one round trip).
//!
//! A page makes at most [`MAX_SCANS`] `SCAN` calls, each asking for about
//! the names the page still has room for, so its cost is bounded by the
//! page size whatever the size of the keyspace (and a page may come back
//! short). A call may return a few more keys than its `COUNT` (a hash
//! bucket is returned whole): names beyond the page are carried in the
//! cursor, and listed first on the next page.

use std::collections::HashSet;

use futures_util::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{FromRedisValue, ScriptInvocation};
use tokio::time::Instant;

use super::RedisBackend;
use super::events::glob_escape;
use super::pool::{Conn, cluster_nodes};
use super::runs::run_of;
use super::semaphores::semaphore_of;
use crate::lock::listing::{NamePrefix, PageSize, Position, ScanPage};
use crate::lock::run::RunInfo;
use crate::lock::semaphore::SemaphoreInfo;
use crate::lock::{Kind, LockError, LockName};

/// The most `SCAN` calls one page makes.
const MAX_SCANS: usize = 8;

/// The least `COUNT` of a `SCAN` call: a page with little room left still
/// looks at this many keys, so that a walk over a keyspace where few keys
/// match takes fewer pages.
const MIN_COUNT: usize = 100;

/// The most bytes of names a cursor carries (names found by a `SCAN` call
/// that did not fit in the page), well within
/// [`crate::lock::listing::MAX_CURSOR_LEN`] once encoded.
const PENDING_BYTES: usize = 4096;

/// Where the walk of one node stands.
struct NodeWalk {
    /// The `SCAN` cursor to continue from; `None` once the node's `SCAN`
    /// is over.
    cursor: Option<u64>,
    /// Names found and not yet listed.
    pending: Vec<LockName>,
}

impl NodeWalk {
    fn fresh() -> Self {
        Self {
            cursor: Some(0),
            pending: Vec::new(),
        }
    }

    /// Whether nothing is left of this node.
    fn over(&self) -> bool {
        self.cursor.is_none() && self.pending.is_empty()
    }

    /// The walk of a position's cursor and pending names, which must be
    /// names under `prefix`.
    fn resume(
        cursor: Option<u64>,
        pending: &[String],
        prefix: &NamePrefix,
    ) -> Result<Self, LockError> {
        let pending = pending
            .iter()
            .map(|name| {
                LockName::parse(name)
                    .ok()
                    .filter(|n| prefix.covers(n.as_str()))
                    .ok_or(LockError::BadCursor)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let walk = Self { cursor, pending };
        if walk.over() {
            // Never written: a walk that is over has no position.
            return Err(LockError::BadCursor);
        }
        Ok(walk)
    }

    fn pending_text(&self) -> Vec<String> {
        self.pending.iter().map(ToString::to_string).collect()
    }
}

/// One page being filled.
struct Filling<'a> {
    kind: Kind,
    key_prefix: &'a str,
    prefix: &'a NamePrefix,
    pattern: String,
    limit: usize,
    names: Vec<LockName>,
    seen: HashSet<LockName>,
    calls: usize,
}

impl Filling<'_> {
    fn full(&self) -> bool {
        self.names.len() >= self.limit
    }

    fn out_of_calls(&self) -> bool {
        self.calls >= MAX_SCANS
    }

    fn push(&mut self, name: LockName) {
        if self.seen.insert(name.clone()) {
            self.names.push(name);
        }
    }

    /// Walks one node from `walk`, with `scan(cursor, count)` sending one
    /// `SCAN` to it, until the page is full, the calls are spent or the
    /// node is over.
    async fn walk<F, Fut>(&mut self, walk: &mut NodeWalk, mut scan: F) -> Result<(), LockError>
    where
        F: FnMut(u64, usize, String) -> Fut,
        Fut: Future<Output = Result<(u64, Vec<String>), LockError>>,
    {
        let room = self.limit.saturating_sub(self.names.len());
        let now: Vec<LockName> = walk.pending.drain(..room.min(walk.pending.len())).collect();
        for name in now {
            self.push(name);
        }
        if !walk.pending.is_empty() {
            return Ok(());
        }
        // After a call that returned far more than the page's room, the
        // same cursor is asked again for the room alone.
        let mut tight = false;
        while let Some(cursor) = walk.cursor {
            if self.full() || self.out_of_calls() {
                break;
            }
            let room = self.limit - self.names.len();
            let count = if tight { room } else { room.max(MIN_COUNT) };
            let (next, keys) = scan(cursor, count, self.pattern.clone()).await?;
            self.calls += 1;
            let mut found: Vec<LockName> = keys
                .iter()
                .filter_map(|key| name_of_key(self.kind, self.key_prefix, self.prefix, key))
                .filter(|name| !self.seen.contains(name))
                .collect();
            found.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
            found.dedup();
            let over: usize = found.iter().skip(room).map(|n| n.as_str().len() + 3).sum();
            if over > PENDING_BYTES && !tight {
                tight = true;
                continue;
            }
            tight = false;
            walk.cursor = (next != 0).then_some(next);
            let later = found.split_off(room.min(found.len()));
            for name in found {
                self.push(name);
            }
            if over > PENDING_BYTES {
                // Even a call for the room alone returned more names than
                // a cursor can carry (huge hash buckets): they are listed
                // now, past the page size, rather than lost.
                for name in later {
                    self.push(name);
                }
            } else {
                walk.pending = later;
            }
            if !walk.pending.is_empty() {
                break;
            }
        }
        Ok(())
    }
}

/// `host:port` as the cluster connection's routing wants it.
fn by_address(node: &str) -> Result<RoutingInfo, LockError> {
    let (host, port) = node
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .ok_or_else(|| LockError::Backend(format!("cluster node address {node:?}")))?;
    Ok(RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    }))
}

fn scan_cmd(cursor: u64, count: usize, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count);
    cmd
}

impl RedisBackend {
    /// As [`crate::lock::Node::scan`], within the operation timeout.
    ///
    /// # Errors
    /// [`LockError::BadCursor`] for a position of another kind of store
    /// (or of a server where a cluster is, or the reverse);
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when Redis
    /// fails.
    pub async fn scan(
        &self,
        kind: Kind,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<ScanPage, LockError> {
        let attempt = async {
            let pooled = self.pool.get().await.map_err(|e| self.pool_error(e))?;
            let mut conn = (*pooled).clone();
            let held = (!self.shares_connections()).then_some(pooled);
            let mut page = Filling {
                kind,
                key_prefix: &self.prefix,
                prefix,
                pattern: match_pattern(kind, &self.prefix, prefix),
                limit: limit.get(),
                names: Vec::new(),
                seen: HashSet::new(),
                calls: 0,
            };
            let next = match &mut conn {
                Conn::Cluster(cluster, _) => self.scan_cluster(cluster, &mut page, at).await,
                Conn::Server(_) | Conn::Master(..) => {
                    let mut walk = match at {
                        Position::Start => NodeWalk::fresh(),
                        Position::Scan { cursor, pending } => {
                            NodeWalk::resume(*cursor, pending, prefix)?
                        }
                        _ => return Err(LockError::BadCursor),
                    };
                    let scanned = page
                        .walk(&mut walk, |cursor, count, pattern| {
                            let mut conn = conn.clone();
                            async move {
                                scan_cmd(cursor, count, &pattern)
                                    .query_async::<(u64, Vec<String>)>(&mut conn)
                                    .await
                                    .map_err(|e| self.error(&e))
                            }
                        })
                        .await;
                    scanned.map(|()| {
                        (!walk.over()).then(|| Position::Scan {
                            cursor: walk.cursor,
                            pending: walk.pending_text(),
                        })
                    })
                }
            };
            if matches!(&next, Err(e) if e.is_transient()) {
                self.discard(held);
            }
            Ok(ScanPage {
                names: page.names,
                next: next?,
            })
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| {
                LockError::Unavailable(format!("no answer from Redis in {:?}", self.timeout))
            })?
    }

    /// The walk over a cluster's masters, from `at`: each master's `SCAN`
    /// in turn, in the order of the first slot each serves, the masters as
    /// last read from `CLUSTER NODES`.
    async fn scan_cluster(
        &self,
        cluster: &mut ClusterConnection,
        page: &mut Filling<'_>,
        at: &Position,
    ) -> Result<Option<Position>, LockError> {
        let view = self
            .cluster_view()
            .ok_or_else(|| LockError::Backend("a cluster connection without its view".into()))?;
        let mut shards = view.shards();
        if shards.is_empty() {
            let listing = cluster_nodes(cluster).await.map_err(|e| self.error(&e))?;
            view.observe(&listing);
            shards = view.shards();
        }
        let (mut index, mut walk) = match at {
            Position::Start => (0, NodeWalk::fresh()),
            Position::Shard {
                slot,
                node,
                cursor,
                pending,
            } => {
                if *slot > 16_383 {
                    return Err(LockError::BadCursor);
                }
                let mut walk = NodeWalk::resume(*cursor, pending, page.prefix)?;
                match shards.iter().position(|(first, _)| first == slot) {
                    Some(i) if shards[i].1 == *node => (i, walk),
                    // Another master serves those slots now (a
                    // failover): a SCAN cursor means nothing on it, so
                    // its walk starts again.
                    Some(i) => {
                        walk.cursor = Some(0);
                        (i, walk)
                    }
                    // The slots were moved (a reshard): on with the next
                    // master in slot order, after the pending names.
                    None => {
                        walk.cursor = Some(0);
                        let next = shards
                            .iter()
                            .position(|(first, _)| first > slot)
                            .unwrap_or(shards.len());
                        (next, walk)
                    }
                }
            }
            _ => return Err(LockError::BadCursor),
        };
        while let Some((_, node)) = shards.get(index) {
            let route = by_address(node)?;
            page.walk(&mut walk, |cursor, count, pattern| {
                let mut cluster = cluster.clone();
                let route = route.clone();
                async move {
                    let value = cluster
                        .route_command(scan_cmd(cursor, count, &pattern), route)
                        .await
                        .map_err(|e| self.error(&e))?;
                    <(u64, Vec<String>)>::from_redis_value(value)
                        .map_err(|e| LockError::Backend(format!("SCAN answered {e}")))
                }
            })
            .await?;
            if !walk.over() {
                break;
            }
            index += 1;
            walk = NodeWalk::fresh();
            if page.full() || page.out_of_calls() {
                break;
            }
        }
        Ok(shards.get(index).map(|(slot, node)| Position::Shard {
            slot: *slot,
            node: node.clone(),
            cursor: walk.cursor,
            pending: walk.pending_text(),
        }))
    }

    /// Runs `calls` (scripts that read) at once on one pooled connection,
    /// which carries them together (a multiplexed connection; a cluster
    /// connection sends each to the master of its keys), within the
    /// operation timeout: each call's own answer, in order. A refusal of
    /// one call (its key of another type, written by a foreign client) is
    /// that call's error alone, where the connection's failure or the
    /// timeout fails them all.
    ///
    /// # Errors
    /// The first transient failure ([`LockError::is_transient`]), or the
    /// timeout.
    pub(super) async fn run_each<T: FromRedisValue>(
        &self,
        calls: &[ScriptInvocation<'static>],
    ) -> Result<Vec<Result<T, LockError>>, LockError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let attempt = async {
            let pooled = self.pool.get().await.map_err(|e| self.pool_error(e))?;
            let conn = (*pooled).clone();
            let held = (!self.shares_connections()).then_some(pooled);
            let answers = join_all(calls.iter().map(|call| {
                let mut conn = conn.clone();
                async move { call.invoke_async::<T>(&mut conn).await }
            }))
            .await;
            let mut each = Vec::with_capacity(answers.len());
            for answer in answers {
                match answer.map_err(|e| self.error(&e)) {
                    Err(e) if e.is_transient() => {
                        self.discard(held);
                        return Err(e);
                    }
                    answer => each.push(answer),
                }
            }
            self.report.connected();
            Ok(each)
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| {
                LockError::Unavailable(format!("no answer from Redis in {:?}", self.timeout))
            })?
    }

    /// As [`crate::lock::RunNode::runs`]: the runs `keys`, in their order,
    /// each by its inspect script, read together on one connection; a key
    /// whose read is refused is left out (a key of another type that a
    /// foreign client wrote: logged at `warn`).
    ///
    /// # Errors
    /// As for [`Self::scan`]: the first transient failure.
    pub async fn runs(&self, keys: &[LockName]) -> Result<Vec<Option<RunInfo>>, LockError> {
        let read_at = Instant::now();
        let calls: Vec<_> = keys.iter().map(|key| self.inspect_run_call(key)).collect();
        let answers = self.run_each::<Vec<redis::Value>>(&calls).await?;
        keys.iter()
            .zip(answers)
            .map(
                |(key, answer)| match unless_foreign(Kind::Run, key, answer) {
                    Some(answer) => run_of(answer, read_at),
                    None => Ok(None),
                },
            )
            .collect()
    }

    /// The semaphores `names`, in their order, read together, as
    /// [`Self::runs`] reads runs (a refused read left out).
    ///
    /// # Errors
    /// As for [`Self::scan`]: the first transient failure.
    pub async fn semaphores(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<SemaphoreInfo>>, LockError> {
        let read_at = Instant::now();
        let calls: Vec<_> = names
            .iter()
            .map(|name| self.inspect_semaphore_call(name))
            .collect();
        let answers = self.run_each::<Vec<redis::Value>>(&calls).await?;
        names
            .iter()
            .zip(answers)
            .map(
                |(name, answer)| match unless_foreign(Kind::Semaphore, name, answer) {
                    Some(answer) => semaphore_of(answer, read_at),
                    None => Ok(None),
                },
            )
            .collect()
    }
}

/// A listing's read of `name` (a `kind`): its answer, or `None` when
/// Redis refused it (a key of another type under lockd's prefix, written
/// by a foreign client): one such key must not fail the listing of every
/// other name for everyone. The key's name and the refusal are logged at
/// `warn`, so that an operator can find the key (`GET` of the name itself
/// still answers 500, as every refused read does).
pub(super) fn unless_foreign<T>(
    kind: Kind,
    name: &LockName,
    answer: Result<T, LockError>,
) -> Option<T> {
    match answer {
        Ok(answer) => Some(answer),
        Err(e) => {
            tracing::warn!(
                kind = kind.as_str(),
                name = %name,
                error = %e,
                "a listing leaves out a name whose keys Redis refused to read (a key of another type, written by a client other than lockd?)"
            );
            None
        }
    }
}

/// The `SCAN MATCH` pattern of the keys that stand for one held lock (or
/// semaphore) under key prefix `key_prefix` whose name starts with
/// `prefix`: `P{prefix*[}d]` for a lock, matching its key `P{N}` when it is
/// held exclusively and its `P{N}:shared` when shared leases hold it (its
/// `:fence`, `:meta`, `:readers` and `:writers` keys end with neither `}`
/// nor `d`), `Psem:{prefix*}:permits` for a semaphore, `Prun:{prefix*}:record`
/// for a run.
pub fn match_pattern(kind: Kind, key_prefix: &str, prefix: &NamePrefix) -> String {
    let (key_prefix, prefix) = (glob_escape(key_prefix), glob_escape(prefix.as_str()));
    match kind {
        Kind::Lock => format!("{key_prefix}{{{prefix}*[}}d]"),
        Kind::Semaphore => format!("{key_prefix}sem:{{{prefix}*}}:permits"),
        Kind::Run => format!("{key_prefix}run:{{{prefix}*}}:record"),
    }
}

/// The name of the lock (or semaphore) a key found by [`match_pattern`]
/// stands for, when it is one under `prefix`; `None` for any other key (a
/// foreign client's, say).
pub fn name_of_key(
    kind: Kind,
    key_prefix: &str,
    prefix: &NamePrefix,
    key: &str,
) -> Option<LockName> {
    let rest = key.strip_prefix(key_prefix)?;
    let name = match kind {
        Kind::Lock => {
            let rest = rest.strip_prefix('{')?;
            rest.strip_suffix('}')
                .or_else(|| rest.strip_suffix("}:shared"))?
        }
        Kind::Semaphore => rest.strip_prefix("sem:{")?.strip_suffix("}:permits")?,
        Kind::Run => rest.strip_prefix("run:{")?.strip_suffix("}:record")?,
    };
    LockName::parse(name)
        .ok()
        .filter(|n| prefix.covers(n.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_matches_the_lock_key_only_and_names_are_read_back() {
        let p = NamePrefix::parse("a:").expect("valid prefix");
        assert_eq!(match_pattern(Kind::Lock, "lockd:", &p), "lockd:{a:*[}d]");
        assert_eq!(
            match_pattern(Kind::Semaphore, "lockd:", &p),
            "lockd:sem:{a:*}:permits"
        );
        assert_eq!(match_pattern(Kind::Lock, "x*[", &p), "x\\*\\[{a:*[}d]");
        let name = |key| name_of_key(Kind::Lock, "lockd:", &p, key).map(|n| n.to_string());
        assert_eq!(name("lockd:{a:1}").as_deref(), Some("a:1"));
        assert_eq!(name("lockd:{a:1}:fence"), None);
        assert_eq!(name("lockd:{a:1}:meta"), None);
        assert_eq!(name("lockd:{a:1}:shared").as_deref(), Some("a:1"));
        assert_eq!(name("lockd:{a:1}:readers"), None);
        assert_eq!(name("lockd:{a:1}:writers"), None);
        assert_eq!(name("lockd:{b:1}"), None);
        assert_eq!(name("lockd:{a:}x}"), None);
        assert_eq!(name("other:{a:1}"), None);
        let sem = |key| name_of_key(Kind::Semaphore, "lockd:", &p, key).map(|n| n.to_string());
        assert_eq!(sem("lockd:sem:{a:pool}:permits").as_deref(), Some("a:pool"));
        assert_eq!(sem("lockd:sem:{a:pool}:holders"), None);
    }
}
