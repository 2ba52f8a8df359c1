//! Listing in memory: a walk of the ordered maps of holders and
//! semaphores, from the last name listed (the [`Position::After`] of the
//! cursor). The names under a prefix are next to each other in the map,
//! so a page starts where the last one ended and stops at the first name
//! past the prefix.

use std::ops::Bound;

use tokio::time::Instant;

use super::MemoryBackend;
use crate::lock::Kind;
use crate::lock::listing::{NamePrefix, PageSize, Position, ScanPage};
use crate::lock::{LockError, LockName};

/// How many entries one page may look at, per name it may list: expired
/// entries not yet swept are skipped, within this bound.
const LOOKS_PER_NAME: usize = 4;

impl MemoryBackend {
    /// As [`crate::lock::Node::scan`]: the live names under `prefix` after
    /// `at`, in order.
    ///
    /// # Errors
    /// [`LockError::BadCursor`] when `at` is neither the start nor a name
    /// under `prefix`.
    pub fn scan(
        &self,
        kind: Kind,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<ScanPage, LockError> {
        let after = match at {
            Position::Start => None,
            Position::After(last) => Some(
                LockName::parse(last)
                    .ok()
                    .filter(|n| prefix.covers(n.as_str()))
                    .ok_or(LockError::BadCursor)?,
            ),
            _ => return Err(LockError::BadCursor),
        };
        let from = match &after {
            Some(last) => Bound::Excluded(last.as_str()),
            None => Bound::Included(prefix.as_str()),
        };
        // The semaphores' clock (as `now_us` in `semaphores`).
        let now = Instant::now();
        let at_us = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        let budget = limit.get() * LOOKS_PER_NAME;
        let mut state = self.state();
        let mut names = Vec::new();
        let mut looked = 0;
        let mut last = None;
        let mut more = false;
        let mut visit = |name: &str, live: bool| {
            if names.len() == limit.get() || looked == budget {
                more = true;
                return false;
            }
            looked += 1;
            last = Some(name.to_owned());
            if live && let Ok(name) = LockName::parse(name) {
                names.push(name);
            }
            true
        };
        let range = (from, Bound::Unbounded);
        match kind {
            Kind::Lock => {
                // The exclusive holders and the shared leases, merged in
                // name order (a name is in one of them at a time, or
                // briefly in both: listed once).
                let super::State {
                    holders, shared, ..
                } = &mut *state;
                let mut exclusive = holders.range::<str, _>(range).peekable();
                let mut shared = shared.range_mut::<str, _>(range).peekable();
                loop {
                    let next_exclusive = exclusive.peek().map(|(n, _)| n.as_str());
                    let next_shared = shared.peek().map(|(n, _)| n.as_str());
                    let name = match (next_exclusive, next_shared) {
                        (None, None) => break,
                        (Some(e), Some(s)) => e.min(s).to_owned(),
                        (Some(e), None) => e.to_owned(),
                        (None, Some(s)) => s.to_owned(),
                    };
                    let mut live = false;
                    if exclusive.peek().is_some_and(|(n, _)| **n == name) {
                        live |= exclusive.next().is_some_and(|(_, h)| h.expires > now);
                    }
                    if shared.peek().is_some_and(|(n, _)| **n == name) {
                        live |= shared
                            .next()
                            .is_some_and(|(_, lock)| lock.live_leases(at_us) > 0);
                    }
                    if !prefix.covers(&name) || !visit(&name, live) {
                        break;
                    }
                }
            }
            Kind::Semaphore => {
                for (name, permits) in state.semaphores.range_mut::<str, _>(range) {
                    if !prefix.covers(name) || !visit(name, permits.live(at_us) > 0) {
                        break;
                    }
                }
            }
            Kind::Run => {
                for (name, record) in state.runs.range::<str, _>(range) {
                    if !prefix.covers(name) || !visit(name, record.forget_at > now) {
                        break;
                    }
                }
            }
        }
        Ok(ScanPage {
            names,
            next: last.filter(|_| more).map(Position::After),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::lock::{AcquireRequest, LockNode, Token, Ttl};

    fn request(name: &str, ttl_ms: u64) -> AcquireRequest {
        AcquireRequest {
            name: LockName::parse(name).expect("valid name"),
            token: Token::generate(),
            ttl: Ttl::from_millis(ttl_ms, u64::MAX, "ttl_ms").expect("valid ttl"),
            owner: None,
            meta: None,
            token_generated: true,
            mode: crate::lock::Mode::Exclusive,
            waits_until: None,
            renew_only: false,
        }
    }

    /// Every page in order, as a client following the cursors would.
    fn walk(store: &MemoryBackend, prefix: &str, limit: usize) -> Vec<Vec<String>> {
        let prefix = NamePrefix::parse(prefix).expect("prefix");
        let limit = PageSize::new(limit).expect("limit");
        let mut at = Position::Start;
        let mut pages = Vec::new();
        loop {
            let page = store.scan(Kind::Lock, &prefix, &at, limit).expect("scan");
            assert!(page.names.len() <= limit.get());
            pages.push(page.names.iter().map(ToString::to_string).collect());
            match page.next {
                Some(next) => at = next,
                None => return pages,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_walk_lists_the_live_names_under_the_prefix_once_in_order() {
        let store = MemoryBackend::new();
        for name in ["a:1", "a:2", "a:3", "a:4", "a:5", "b:1", "a", "c:1"] {
            store.acquire(&request(name, 1000)).await.expect("free");
        }
        store.acquire(&request("a:0", 10)).await.expect("free");
        tokio::time::advance(std::time::Duration::from_millis(20)).await;
        let pages = walk(&store, "a:", 2);
        let all: Vec<String> = pages.concat();
        assert_eq!(all, ["a:1", "a:2", "a:3", "a:4", "a:5"]);
        assert!(pages.iter().all(|p| p.len() <= 2));
        let every: BTreeSet<String> = walk(&store, "", 3).concat().into_iter().collect();
        assert_eq!(every.len(), 8, "{every:?}");
        assert_eq!(walk(&store, "z", 5), [Vec::<String>::new()]);
    }

    #[test]
    fn a_position_of_another_store_or_prefix_is_refused() {
        let store = MemoryBackend::new();
        let prefix = NamePrefix::parse("a:").expect("prefix");
        for at in [
            Position::After("b:1".into()),
            Position::After("{x}".into()),
            Position::Scan {
                cursor: Some(1),
                pending: vec![],
            },
        ] {
            assert!(matches!(
                store.scan(Kind::Lock, &prefix, &at, PageSize::DEFAULT),
                Err(LockError::BadCursor)
            ));
        }
    }
}
