//! Per-instance wait queues: who waits for which lock or semaphore (one
//! queue per [`Subject`]), in arrival order.
//!
//! Only the head of a subject's queue retries; the others sleep until they
//! become head. A release event wakes the head only, so one release costs one
//! retry per lockd instance, not one per waiter (no thundering herd).
//!
//! Each waiter has its own [`Notify`]. `notify_one` stores a permit when the
//! waiter is not parked yet, so a wake-up that arrives between a failed
//! attempt and the next `notified().await` is never lost.
//!
//! A store that subscribes to change events subject by subject (sharded
//! pub/sub on a Redis Cluster) is told through its [`WaitInterest`] when a
//! subject gets its first waiter that found it held, and when its last waiter
//! leaves; a wait that got a free lock at its first try costs no
//! subscription.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lock::{Change, ChangeListener, Subject, WaitInterest};

struct Waiter {
    id: u64,
    wake: Arc<Notify>,
}

/// The waiters of one lock, and what they know of its holder.
#[derive(Default)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// When the holder's lease ends, as the last failed try learned it.
    lease_end: Option<Instant>,
    /// Whether the store was told that this lock is waited for.
    subscribed: bool,
    /// Whether the head should look before it retries (see
    /// [`ChangeListener::subscribed`]).
    look: bool,
}

/// The wait queues of one lockd instance.
pub struct WaitQueues {
    queues: Mutex<HashMap<Subject, Queue>>,
    waiting: AtomicUsize,
    next_id: AtomicU64,
    max_waiters: usize,
    /// The store's, when it subscribes lock by lock.
    interest: OnceLock<Arc<dyn WaitInterest>>,
}

/// The queue is full: `max_waiters` requests are waiting already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl WaitQueues {
    /// Queues that hold at most `max_waiters` waiters in all.
    pub fn new(max_waiters: usize) -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            max_waiters,
            interest: OnceLock::new(),
        }
    }

    /// Tells `interest` from now on which locks are waited for (see
    /// [`WaitInterest`]). Set once; a second call is ignored.
    pub fn tell(&self, interest: Arc<dyn WaitInterest>) {
        let _ = self.interest.set(interest);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Subject, Queue>> {
        // Every critical section leaves the map consistent before it can
        // panic, so a poisoned mutex is safe to use.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the back of `subject`'s queue. The place leaves the queue when it
    /// is dropped, and wakes the next waiter if it was the head.
    ///
    /// # Errors
    /// [`QueueFull`] when `max_waiters` requests are waiting already.
    pub fn join(self: &Arc<Self>, subject: &Subject) -> Result<Place, QueueFull> {
        let reserved = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_waiters).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(QueueFull);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        self.lock()
            .entry(subject.clone())
            .or_default()
            .waiters
            .push_back(Waiter {
                id,
                wake: wake.clone(),
            });
        Ok(Place {
            queues: self.clone(),
            subject: subject.clone(),
            id,
            wake,
        })
    }

    /// Wakes the head of `subject`'s queue, if anyone waits: it was
    /// released.
    pub fn wake(&self, subject: &Subject) {
        if let Some(head) = self.lock().get(subject).and_then(|q| q.waiters.front()) {
            head.wake.notify_one();
        }
    }

    /// Wakes the head of `subject`'s queue to look whether it is still
    /// held before it retries: a subscription to its releases was (re)made.
    pub fn wake_to_look(&self, subject: &Subject) {
        if let Some(queue) = self.lock().get_mut(subject)
            && let Some(head) = queue.waiters.front()
        {
            head.wake.notify_one();
            queue.look = true;
        }
    }

    /// Wakes the head of every queue: release events may have been missed
    /// (the event connection was re-established).
    pub fn wake_all(&self) {
        for head in self.lock().values().filter_map(|q| q.waiters.front()) {
            head.wake.notify_one();
        }
    }

    /// How many requests wait now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// How many requests wait for `subject` now.
    #[cfg(test)]
    fn waiting_for(&self, subject: &Subject) -> usize {
        self.lock().get(subject).map_or(0, |q| q.waiters.len())
    }

    /// Calls `each(subject, waiters)` for every lock and semaphore that
    /// has waiters now (for metrics, read at scrape time).
    pub fn for_each_queue(&self, mut each: impl FnMut(&Subject, usize)) {
        for (subject, queue) in self.lock().iter() {
            if !queue.waiters.is_empty() {
                each(subject, queue.waiters.len());
            }
        }
    }
}

impl ChangeListener for WaitQueues {
    fn changed(&self, subject: &Subject, change: &Change) {
        if change.wakes_waiters() {
            self.wake(subject);
        }
    }

    fn resync(&self) {
        self.wake_all();
    }

    fn subscribed(&self, subject: &Subject) {
        self.wake_to_look(subject);
    }
}

/// A place in a subject's queue.
pub struct Place {
    queues: Arc<WaitQueues>,
    subject: Subject,
    id: u64,
    wake: Arc<Notify>,
}

impl Place {
    /// Whether this place is at the head of its queue (the one that retries).
    pub fn is_head(&self) -> bool {
        self.queues
            .lock()
            .get(&self.subject)
            .and_then(|q| q.waiters.front())
            .is_some_and(|w| w.id == self.id)
    }

    /// Records when the holder's lease ends, as a failed try learned it, for
    /// every waiter of this lock to report. The first time for this lock,
    /// tells the store's [`WaitInterest`] that it is waited for.
    pub fn note_lease_end(&self, at: Instant) {
        if let Some(queue) = self.queues.lock().get_mut(&self.subject) {
            queue.lease_end = Some(at);
            if !queue.subscribed
                && let Some(interest) = self.queues.interest.get()
            {
                queue.subscribed = true;
                interest.waiting(&self.subject);
            }
        }
    }

    /// Whether the head was woken to look before it retries (and forgets
    /// it: it looks once).
    pub fn take_look(&self) -> bool {
        self.queues
            .lock()
            .get_mut(&self.subject)
            .is_some_and(|q| std::mem::take(&mut q.look))
    }

    /// When the holder's lease ends, as the last failed try of any waiter of
    /// this lock learned it.
    pub fn lease_end(&self) -> Option<Instant> {
        self.queues
            .lock()
            .get(&self.subject)
            .and_then(|q| q.lease_end)
    }

    /// Completes when this waiter is woken: it became head, or, as head, the
    /// lock was released. A wake-up sent before this is called is not lost.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut queues = self.queues.lock();
        if let Some(queue) = queues.get_mut(&self.subject) {
            let was_head = queue.waiters.front().is_some_and(|w| w.id == self.id);
            queue.waiters.retain(|w| w.id != self.id);
            match queue.waiters.front() {
                None => {
                    if queue.subscribed
                        && let Some(interest) = self.queues.interest.get()
                    {
                        interest.idle(&self.subject);
                    }
                    queues.remove(&self.subject);
                }
                Some(next) if was_head => next.wake.notify_one(),
                Some(_) => {}
            }
        }
        drop(queues);
        self.queues.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LockName;

    /// The lock named `name`.
    fn lock(name: &str) -> Subject {
        Subject::lock(LockName::parse(name).expect("a name"))
    }
    use std::time::Duration;

    #[tokio::test]
    async fn places_are_served_in_arrival_order() {
        let queues = Arc::new(WaitQueues::new(10));
        let first = queues.join(&lock("k")).expect("room");
        let second = queues.join(&lock("k")).expect("room");
        let other = queues.join(&lock("other")).expect("room");
        assert!(first.is_head());
        assert!(!second.is_head());
        assert!(other.is_head());
        assert_eq!(queues.waiting(), 3);
        drop(first);
        assert!(second.is_head());
        // The new head was woken when the old one left.
        tokio::time::timeout(Duration::from_secs(1), second.woken())
            .await
            .expect("woken");
        drop((second, other));
        assert_eq!(queues.waiting(), 0);
        assert_eq!(queues.waiting_for(&lock("k")), 0);
    }

    #[tokio::test]
    async fn a_release_wakes_the_head_only() {
        let queues = Arc::new(WaitQueues::new(10));
        let head = queues.join(&lock("k")).expect("room");
        let next = queues.join(&lock("k")).expect("room");
        queues.wake(&lock("k"));
        tokio::time::timeout(Duration::from_secs(1), head.woken())
            .await
            .expect("head woken");
        let next_woken = tokio::time::timeout(Duration::from_millis(50), next.woken()).await;
        assert!(
            next_woken.is_err(),
            "a waiter behind the head must sleep on"
        );
    }

    #[test]
    fn the_queue_refuses_waiters_beyond_the_limit() {
        let queues = Arc::new(WaitQueues::new(2));
        let a = queues.join(&lock("a")).expect("room");
        let _b = queues.join(&lock("b")).expect("room");
        assert!(queues.join(&lock("c")).is_err());
        drop(a);
        assert!(queues.join(&lock("c")).is_ok());
    }

    /// Records what a store is told, in order.
    #[derive(Default)]
    struct Told(Mutex<Vec<String>>);

    impl WaitInterest for Told {
        fn waiting(&self, subject: &Subject) {
            let name = subject.name().as_str();
            self.0.lock().expect("told").push(format!("+{name}"));
        }
        fn idle(&self, subject: &Subject) {
            let name = subject.name().as_str();
            self.0.lock().expect("told").push(format!("-{name}"));
        }
    }

    #[test]
    fn the_store_hears_of_a_lock_once_from_its_first_held_try_to_its_last_waiter() {
        let queues = Arc::new(WaitQueues::new(10));
        let told = Arc::new(Told::default());
        queues.tell(told.clone());
        // A wait that got its lock at once never subscribes.
        drop(queues.join(&lock("free")).expect("room"));
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        a.note_lease_end(Instant::now());
        b.note_lease_end(Instant::now());
        drop(a);
        assert_eq!(*told.0.lock().expect("told"), ["+k"]);
        drop(b);
        // A new episode subscribes again.
        let c = queues.join(&lock("k")).expect("room");
        c.note_lease_end(Instant::now());
        drop(c);
        assert_eq!(*told.0.lock().expect("told"), ["+k", "-k", "+k", "-k"]);
    }

    #[test]
    fn a_waiter_leaving_from_the_middle_keeps_the_order() {
        let queues = Arc::new(WaitQueues::new(10));
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        let c = queues.join(&lock("k")).expect("room");
        drop(b);
        drop(a);
        assert!(c.is_head());
    }
}
