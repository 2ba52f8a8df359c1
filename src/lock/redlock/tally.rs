//! Redlock's one fan-out: an operation sent to every node at once, and the
//! [`Tally`] of what the nodes answered, with which of them count toward a
//! quorum. As go-redsync's `actOnPoolsAsync`, which every Redlock operation
//! of that library goes through; here the counting of answers is written
//! once too.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::join_all;

use std::cmp::Ordering;

use crate::lock::{LeaseLeft, LockError, LockInfo, LockNode, Token};

/// Which nodes' answers count toward a quorum.
#[derive(Debug, Clone)]
pub(super) enum Counting {
    /// Every node but those in their delayed restart (see
    /// `redis::restart`), read once every node answered: a node's
    /// restart is seen when lockd reconnects to it, which may have been
    /// during this call.
    Now,
    /// Every node: a release or an inspect counts any node's answer, as it
    /// always has (a delete done on any node is done; a release still needs
    /// a quorum of deletes to succeed).
    Every,
    /// As an earlier tally counted them: a follow-up call (raising the
    /// fences after a grant) counts the nodes its grant counted.
    As(Vec<bool>),
}

/// The answers of every node to one operation, in the order of the nodes:
/// `None` for a node that was not asked.
#[derive(Debug)]
pub(super) struct Tally<T> {
    answers: Vec<Option<Result<T, LockError>>>,
    counts: Vec<bool>,
}

/// Sends `ask(i, node)` to every node `i` at once (a node for which `ask`
/// gives `None` is not asked) and waits for all of them; each call is
/// bounded by its node's own timeout.
pub(super) async fn fan_out<'a, T, Fut>(
    nodes: &'a [Arc<dyn LockNode>],
    counting: Counting,
    ask: impl Fn(usize, &'a dyn LockNode) -> Option<Fut>,
) -> Tally<T>
where
    Fut: Future<Output = Result<T, LockError>> + 'a,
{
    let calls = nodes.iter().enumerate().map(|(i, node)| {
        let call = ask(i, node.as_ref());
        async move {
            match call {
                Some(call) => Some(call.await),
                None => None,
            }
        }
    });
    let answers = join_all(calls).await;
    let counts = match counting {
        Counting::Now => nodes.iter().map(|n| n.counts_for_quorum()).collect(),
        Counting::Every => vec![true; nodes.len()],
        Counting::As(counts) => counts,
    };
    Tally { answers, counts }
}

/// Whether an answer came from the node (as opposed to a timeout, a refused
/// connection or an error of the node's): see [`LockError::is_answer`].
fn answered<T>(answer: &Result<T, LockError>) -> bool {
    answer.as_ref().err().is_none_or(LockError::is_answer)
}

impl<T> Tally<T> {
    /// The answers of the nodes that count, as `(node, answer)`.
    fn counted(&self) -> impl Iterator<Item = (usize, &Result<T, LockError>)> {
        self.answers
            .iter()
            .enumerate()
            .filter(|(i, _)| self.counts[*i])
            .filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
    }

    /// Which nodes count toward a quorum in this tally.
    pub(super) fn counts(&self) -> Vec<bool> {
        self.counts.clone()
    }

    /// Every successful answer, from a node that counts or not.
    pub(super) fn oks(&self) -> impl Iterator<Item = &T> {
        self.answers
            .iter()
            .filter_map(|a| a.as_ref().and_then(|a| a.as_ref().ok()))
    }

    /// Each node's successful answer, by node (`None` for a node that
    /// failed or was not asked), whether it counts or not.
    pub(super) fn by_node(&self) -> Vec<Option<&T>> {
        self.answers
            .iter()
            .map(|a| a.as_ref().and_then(|a| a.as_ref().ok()))
            .collect()
    }

    /// The successful answers of the nodes that count.
    pub(super) fn counted_oks(&self) -> impl Iterator<Item = &T> {
        self.counted().filter_map(|(_, a)| a.as_ref().ok())
    }

    /// How many nodes that count did it (answered with success): granted,
    /// extended, released, raised, or answered a ping.
    pub(super) fn granted(&self) -> usize {
        self.counted_oks().count()
    }

    /// How many nodes that count answered at all (success, held, not held,
    /// not owner).
    pub(super) fn answered(&self) -> usize {
        self.counted().filter(|(_, a)| answered(a)).count()
    }

    /// Which nodes answered at all, whether they count or not.
    pub(super) fn answering(&self) -> Vec<bool> {
        self.answers
            .iter()
            .map(|a| a.as_ref().is_some_and(answered))
            .collect()
    }

    /// The nodes that did not answer in time (to retry a delete on).
    pub(super) fn unanswered(&self) -> Vec<usize> {
        (0..self.answers.len())
            .filter(|i| matches!(&self.answers[*i], Some(Err(e)) if e.is_transient()))
            .collect()
    }

    /// The remaining leases reported by the nodes that count and found the
    /// lock held by another token.
    pub(super) fn held(&self) -> Vec<LeaseLeft> {
        self.counted()
            .filter_map(|(_, a)| match a {
                Err(LockError::Held { left }) => Some(*left),
                _ => None,
            })
            .collect()
    }

    /// The verdict of answers that were neither success nor failure, over
    /// every node: [`LockError::NotOwner`] when more nodes saw another token
    /// than saw none, else [`LockError::NotHeld`].
    pub(super) fn verdict(&self) -> LockError {
        let count = |f: fn(&LockError) -> bool| {
            self.answers
                .iter()
                .filter(|a| matches!(a, Some(Err(e)) if f(e)))
                .count()
        };
        let not_owner = count(|e| matches!(e, LockError::NotOwner));
        let not_held = count(|e| matches!(e, LockError::NotHeld));
        if not_owner > not_held {
            LockError::NotOwner
        } else {
            LockError::NotHeld
        }
    }

    /// `Ok` when at least `quorum` nodes that count answered, else
    /// [`LockError::QuorumUnavailable`] with how many did: the one quorum
    /// check of "could the nodes tell".
    pub(super) fn told(&self, quorum: usize) -> Result<(), LockError> {
        let answered = self.answered();
        if answered >= quorum {
            Ok(())
        } else {
            Err(LockError::QuorumUnavailable {
                answered,
                needed: quorum,
            })
        }
    }
}

/// The holder of a lock by Redlock's rule, from each node's holder (by
/// node; `None` for a node that found the lock free or did not answer):
/// the token a quorum of nodes agrees on. Its description takes the largest
/// fence reported, the shortest lease, the owner label and the earliest
/// grant time of the agreeing nodes; the second part tells which nodes
/// agree. `None` when no token has a quorum.
pub(super) fn agreed(
    holders: &[Option<&(Token, LockInfo)>],
    quorum: usize,
) -> Option<(LockInfo, Vec<bool>)> {
    for (token, _) in holders.iter().flatten() {
        let agreeing: Vec<bool> = holders
            .iter()
            .map(|h| h.is_some_and(|(t, _)| t == token))
            .collect();
        if agreeing.iter().filter(|a| **a).count() < quorum {
            continue;
        }
        let infos: Vec<&LockInfo> = holders
            .iter()
            .flatten()
            .filter(|(t, _)| t == token)
            .map(|(_, info)| info)
            .collect();
        let info = LockInfo::exclusive(
            infos.iter().filter_map(|i| i.fence).max(),
            infos
                .iter()
                .map(|i| i.remaining)
                .min_by(|a, b| match (a, b) {
                    (Some(a), Some(b)) => a.cmp(b),
                    (None, _) => Ordering::Greater,
                    (_, None) => Ordering::Less,
                })
                .flatten(),
            infos.iter().find_map(|i| i.owner.clone()),
            infos.iter().find_map(|i| i.meta.clone()),
            infos.iter().filter_map(|i| i.granted_at).min(),
        );
        return Some((info, agreeing));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tally(answers: Vec<Option<Result<u8, LockError>>>, counts: Vec<bool>) -> Tally<u8> {
        Tally { answers, counts }
    }

    #[test]
    fn only_the_nodes_that_count_make_a_quorum() {
        let t = tally(
            vec![
                Some(Ok(1)),
                Some(Ok(2)),
                Some(Err(LockError::Held {
                    left: LeaseLeft::AtMost(Duration::from_millis(5)),
                })),
                Some(Err(LockError::Unavailable("down".into()))),
                None,
            ],
            vec![false, true, true, true, true],
        );
        assert_eq!(t.oks().count(), 2, "every success");
        assert_eq!(t.granted(), 1, "the node in its restart delay is left out");
        assert_eq!(t.answered(), 2);
        assert_eq!(t.held(), [LeaseLeft::AtMost(Duration::from_millis(5))]);
        assert_eq!(t.answering(), [true, true, true, false, false]);
        assert_eq!(t.unanswered(), [3]);
        assert!(t.told(2).is_ok());
        assert!(matches!(
            t.told(3),
            Err(LockError::QuorumUnavailable {
                answered: 2,
                needed: 3
            })
        ));
    }

    #[test]
    fn the_holder_is_the_token_a_quorum_agrees_on() {
        let info = |fence: u64, ms: u64| {
            LockInfo::exclusive(
                Some(fence),
                Some(Duration::from_millis(ms)),
                None,
                None,
                None,
            )
        };
        let (a, b) = (Token::generate(), Token::generate());
        let (a1, a2, b3) = (
            (a.clone(), info(5, 900)),
            (a.clone(), info(7, 800)),
            (b, info(9, 100)),
        );
        let (held, agreeing) = agreed(&[Some(&a1), None, Some(&a2), Some(&b3)], 2).expect("quorum");
        assert_eq!(
            (held.fence, held.remaining),
            (Some(7), Some(Duration::from_millis(800)))
        );
        assert_eq!(agreeing, [true, false, true, false]);
        assert!(agreed(&[Some(&a1), None, Some(&b3)], 2).is_none());
        assert!(agreed(&[None, None, None], 2).is_none());
    }

    #[test]
    fn the_verdict_is_what_most_nodes_saw() {
        let t = tally(
            vec![
                Some(Err(LockError::NotOwner)),
                Some(Err(LockError::NotOwner)),
                Some(Err(LockError::NotHeld)),
            ],
            vec![true; 3],
        );
        assert!(matches!(t.verdict(), LockError::NotOwner));
        let t = tally(
            vec![
                Some(Err(LockError::NotOwner)),
                Some(Err(LockError::NotHeld)),
                Some(Err(LockError::Backend("x".into()))),
            ],
            vec![true; 3],
        );
        assert!(
            matches!(t.verdict(), LockError::NotHeld),
            "a tie is NotHeld"
        );
    }
}
