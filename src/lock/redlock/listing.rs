//! Redlock's listing: the nodes are walked one after another (each with
//! its own walk, `SCAN` on Redis), and each name a node's step finds is
//! read on every node at once. A name is listed when a quorum of nodes
//! agrees on its holder (the rule of `GET /locks/{name}`), and only during
//! the walk of the lowest-index node among the agreeing ones that was not
//! skipped, so that it is listed once however many nodes hold it.
//!
//! A node that does not answer during its turn is skipped (marked in the
//! cursor): a lock held on a quorum is still on at least one node that was
//! walked as long as no more than `N - quorum` nodes are skipped; past
//! that, the listing answers [`LockError::QuorumUnavailable`].

use super::Redlock;
use super::tally::{Counting, agreed, fan_out};
use crate::lock::Kind;
use crate::lock::listing::{LockEntry, NamePrefix, Page, PageSize, Position};
use crate::lock::{LockError, LockInfo, Token};

/// The most nodes a listing walks: one bit each in the cursor.
const MAX_NODES: usize = 64;

/// One page of the walk (see the module's documentation).
pub(super) async fn list_locks(
    redlock: &Redlock,
    prefix: &NamePrefix,
    at: &Position,
    limit: PageSize,
) -> Result<Page<LockEntry>, LockError> {
    let n = redlock.nodes.len();
    if n > MAX_NODES {
        return Err(LockError::Unsupported(
            "listing is limited to Redlock over at most 64 nodes",
        ));
    }
    let (index, skipped, inner) = match at {
        Position::Start => (0, 0_u64, Position::Start),
        Position::Node { index, skipped, at }
            if *index < n
                && skipped.checked_shr(n as u32).unwrap_or(0) == 0
                && skipped & (1 << index) == 0
                && !matches!(**at, Position::Node { .. }) =>
        {
            (*index, *skipped, (**at).clone())
        }
        _ => return Err(LockError::BadCursor),
    };
    let (names, next, skipped) = match redlock.nodes[index]
        .scan(Kind::Lock, prefix, &inner, limit)
        .await
    {
        Ok(page) => (page.names, page.next, skipped),
        Err(e) if e.is_transient() => {
            let skipped = skipped | (1 << index);
            let walked = n - skipped.count_ones() as usize;
            if walked < redlock.quorum {
                return Err(LockError::QuorumUnavailable {
                    answered: walked,
                    needed: redlock.quorum,
                });
            }
            tracing::debug!(node = index, error = %e, "a Redlock node skipped in a listing");
            (Vec::new(), None, skipped)
        }
        Err(e) => return Err(e),
    };
    let mut items = Vec::new();
    if !names.is_empty() {
        let answers = fan_out(&redlock.nodes, Counting::Every, |_, node| {
            Some(node.holders(&names))
        })
        .await;
        answers.told(redlock.quorum)?;
        let by_node = answers.by_node();
        for (k, name) in names.into_iter().enumerate() {
            let holders: Vec<Option<&(Token, LockInfo)>> = by_node
                .iter()
                .map(|found| {
                    found
                        .and_then(|found| found.get(k))
                        .and_then(Option::as_ref)
                })
                .collect();
            let Some((info, agreeing)) = agreed(&holders, redlock.quorum) else {
                continue;
            };
            let first = (0..n).find(|&i| agreeing[i] && skipped & (1 << i) == 0);
            if first == Some(index) {
                items.push(LockEntry { name, info });
            }
        }
    }
    let next = match next {
        Some(at) => Some(Position::Node {
            index,
            skipped,
            at: Box::new(at),
        }),
        None => (index + 1 < n).then(|| Position::Node {
            index: index + 1,
            skipped,
            at: Box::new(Position::Start),
        }),
    };
    Ok(Page { items, next })
}
