//! The work queue: one entry per object, however many events arrive for it.
//!
//! A key is never handed to two workers at once; a key that changes while it is being
//! reconciled is run again right after. Failures retry with capped exponential backoff.
//! Namespaces take turns: the waiting keys are served one namespace's at a time, in
//! turn, each namespace's in the order they came (fair queuing by namespace, the tenants'
//! unit in TRUST.md), so a burst of thousands of Agents in one namespace does not hold
//! back another's single change (it waits for one key of each namespace with work, not
//! for the burst).
//! A key has at most one pending wake-up (`add_after`): the earliest asked for wins, so a
//! Tool in its idle grace that is reconciled many times still holds one timer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::crd::Key;

#[derive(Default)]
struct Inner {
    ready: Ready,
    queued: HashSet<Key>,
    active: HashSet<Key>,
    /// Changed while active: run again once done.
    dirty: HashSet<Key>,
    failures: HashMap<Key, u32>,
    /// The one pending wake-up of a key: when, and the timer task to cancel if an earlier
    /// one replaces it.
    wakeups: HashMap<Key, (Instant, AbortHandle)>,
}

/// The keys waiting to run: one lane per namespace, and the namespaces with waiting keys
/// in the order they are served. A namespace has a lane, never empty, exactly while it is
/// in `turns`.
#[derive(Default)]
struct Ready {
    lanes: HashMap<String, VecDeque<Key>>,
    turns: VecDeque<String>,
    len: usize,
}

impl Ready {
    fn push_back(&mut self, key: Key) {
        self.len += 1;
        if let Some(lane) = self.lanes.get_mut(&key.namespace) {
            lane.push_back(key);
        } else {
            self.turns.push_back(key.namespace.clone());
            self.lanes
                .insert(key.namespace.clone(), VecDeque::from([key]));
        }
    }

    /// The next key of the namespace whose turn it is; that namespace then waits for
    /// every other one with waiting keys.
    fn pop_front(&mut self) -> Option<Key> {
        let namespace = self.turns.pop_front()?;
        let lane = self.lanes.get_mut(&namespace)?;
        let key = lane.pop_front();
        if lane.is_empty() {
            // A namespace's lane goes with its last key: a start fills one lane with
            // every object of a namespace, and an emptied one would keep its room.
            self.lanes.remove(&namespace);
        } else {
            self.turns.push_back(namespace);
        }
        self.len -= usize::from(key.is_some());
        key
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn shrink_to(&mut self, room: usize) {
        self.lanes.shrink_to(room);
        self.turns.shrink_to(room);
    }
}

#[derive(Default)]
pub struct Queue {
    inner: Mutex<Inner>,
    notify: Notify,
}

/// The room an emptied queue keeps.
const RETAINED: usize = 64;

const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(120);

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Schedules `key`; a key already waiting is not added twice.
    pub fn add(&self, key: Key) {
        let mut inner = self.lock();
        if inner.active.contains(&key) {
            inner.dirty.insert(key);
        } else if inner.queued.insert(key.clone()) {
            inner.ready.push_back(key);
            drop(inner);
            self.notify.notify_one();
        }
    }

    /// Schedules `key` after `delay` (on tokio's clock). A key has at most one pending
    /// wake-up: a later one than the pending is dropped, an earlier one replaces it (its
    /// timer is cancelled). Whoever runs at the earlier time asks again if it needs to.
    pub fn add_after(self: &Arc<Self>, key: Key, delay: Duration) {
        let at = Instant::now() + delay;
        let mut inner = self.lock();
        if inner
            .wakeups
            .get(&key)
            .is_some_and(|(pending, _)| *pending <= at)
        {
            return;
        }
        let queue = Arc::downgrade(self);
        let timer = tokio::spawn({
            let key = key.clone();
            async move {
                tokio::time::sleep_until(at).await;
                if let Some(queue) = queue.upgrade() {
                    queue.wake(key, at);
                }
            }
        });
        if let Some((_, old)) = inner.wakeups.insert(key, (at, timer.abort_handle())) {
            old.abort();
        }
    }

    /// A timer fired: queue the key if this is still its pending wake-up.
    fn wake(&self, key: Key, at: Instant) {
        let mut inner = self.lock();
        if inner
            .wakeups
            .get(&key)
            .is_some_and(|(pending, _)| *pending == at)
        {
            inner.wakeups.remove(&key);
            drop(inner);
            self.add(key);
        }
    }

    /// Keys with a pending wake-up.
    #[cfg(test)]
    fn pending_wakeups(&self) -> usize {
        self.lock().wakeups.len()
    }

    /// Waits for the next key and marks it active.
    pub async fn next(&self) -> Key {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if let Some(key) = inner.ready.pop_front() {
                    inner.queued.remove(&key);
                    inner.active.insert(key.clone());
                    let more = !inner.ready.is_empty();
                    if !more {
                        // A start queues every object at once; the emptied queue would
                        // keep room for all of them (about 0.2 MB per 1 000) for good.
                        // (Each namespace's lane went with its last key.)
                        inner.ready.shrink_to(RETAINED);
                        inner.queued.shrink_to(RETAINED);
                    }
                    drop(inner);
                    if more {
                        self.notify.notify_one();
                    }
                    return key;
                }
            }
            notified.await;
        }
    }

    /// Marks `key` finished. `Ok` resets its failure count; `Err` returns the delay
    /// before the retry.
    pub fn done(&self, key: &Key, ok: bool) -> Option<Duration> {
        let mut inner = self.lock();
        inner.active.remove(key);
        let retry = if ok {
            inner.failures.remove(key);
            None
        } else {
            let n = inner.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            Some(retry_delay(*n))
        };
        if inner.dirty.remove(key) && inner.queued.insert(key.clone()) {
            inner.ready.push_back(key.clone());
            drop(inner);
            self.notify.notify_one();
        }
        retry
    }

    /// Keys waiting to be reconciled.
    pub fn depth(&self) -> usize {
        self.lock().ready.len()
    }
}

/// 0.5 s, 1 s, 2 s, … capped at 2 min.
pub fn retry_delay(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    RETRY_BASE.saturating_mul(1 << exp).min(RETRY_CAP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Kind;

    fn key(n: &str) -> Key {
        Key::new(Kind::Agent, "ns", n)
    }

    #[tokio::test]
    async fn bursts_coalesce_into_one_entry() {
        let q = Queue::default();
        for _ in 0..100 {
            q.add(key("a"));
        }
        q.add(key("b"));
        assert_eq!(q.depth(), 2);
        assert_eq!(q.next().await, key("a"));
        assert_eq!(q.next().await, key("b"));
        assert_eq!(q.depth(), 0);
    }

    /// A burst in one namespace holds back another namespace's change by one key, not
    /// by the burst; each namespace's keys keep their order.
    #[tokio::test]
    async fn namespaces_take_turns() {
        let q = Queue::default();
        let in_ns = |ns: &str, n: usize| Key::new(Kind::Agent, ns, format!("a-{n}"));
        for n in 0..1000 {
            q.add(in_ns("burst", n));
        }
        q.add(in_ns("other", 0));
        q.add(in_ns("third", 0));
        q.add(in_ns("other", 1));
        let mut served = vec![];
        for _ in 0..7 {
            let k = q.next().await;
            q.done(&k, true);
            served.push(format!("{}/{}", k.namespace, k.name));
        }
        let expect = [
            "burst/a-0",
            "other/a-0",
            "third/a-0",
            "burst/a-1",
            "other/a-1",
        ];
        assert_eq!(served[..5], expect);
        assert_eq!(served[5..], ["burst/a-2", "burst/a-3"]);
        assert_eq!(q.depth(), 1000 - 4);
        // A namespace with work again joins the turns behind the ones waiting; a key
        // coming back (changed while it ran) goes to the end of its namespace's lane.
        let k = q.next().await;
        q.add(k.clone());
        q.add(in_ns("other", 2));
        q.done(&k, true);
        assert_eq!(q.next().await, in_ns("burst", 5));
        assert_eq!(q.next().await, in_ns("other", 2));
        assert_eq!(q.lock().ready.lanes["burst"].back(), Some(&k));
        // Drained, the lanes are gone with their last keys.
        while q.depth() > 0 {
            let k = q.next().await;
            q.done(&k, true);
        }
        let inner = q.lock();
        assert!(inner.ready.lanes.is_empty() && inner.ready.turns.is_empty());
    }

    #[tokio::test]
    async fn a_key_changed_while_active_runs_again_after() {
        let q = Queue::default();
        q.add(key("a"));
        let k = q.next().await;
        q.add(key("a"));
        q.add(key("a"));
        assert_eq!(q.depth(), 0, "never handed out twice at once");
        assert_eq!(q.done(&k, true), None);
        assert_eq!(q.depth(), 1);
        assert_eq!(q.next().await, key("a"));
    }

    #[tokio::test]
    async fn failures_back_off_and_reset_on_success() {
        let q = Queue::default();
        let k = key("a");
        let mut delays = vec![];
        for _ in 0..12 {
            q.add(k.clone());
            let k = q.next().await;
            delays.push(q.done(&k, false).unwrap());
        }
        assert_eq!(delays[0], Duration::from_millis(500));
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[2], Duration::from_secs(2));
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap(), RETRY_CAP);
        q.add(k.clone());
        let k = q.next().await;
        assert_eq!(q.done(&k, true), None);
        q.add(k.clone());
        let k = q.next().await;
        assert_eq!(q.done(&k, false), Some(Duration::from_millis(500)));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_waits_on_tokios_clock() {
        let q = Arc::new(Queue::default());
        q.add_after(key("a"), Duration::from_secs(30));
        tokio::task::yield_now().await;
        assert_eq!(q.depth(), 0);
        tokio::time::advance(Duration::from_secs(31)).await;
        tokio::task::yield_now().await;
        assert_eq!(q.next().await, key("a"));
    }

    /// Lets timer tasks that are due run, on the paused clock.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_wakeup_per_key_and_the_earliest_wins() {
        let q = Arc::new(Queue::default());
        let alive = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        // Later wake-ups than the pending one are dropped; earlier ones replace it.
        for secs in [30, 40, 10, 20, 10, 60] {
            q.add_after(key("a"), Duration::from_secs(secs));
        }
        q.add_after(key("b"), Duration::from_secs(15));
        settle().await;
        assert_eq!(q.pending_wakeups(), 2);
        assert_eq!(
            alive(),
            2,
            "one timer task per key, replaced ones cancelled"
        );
        assert_eq!(q.depth(), 0);

        tokio::time::advance(Duration::from_secs(9)).await;
        settle().await;
        assert_eq!(q.depth(), 0, "not before the earliest wake-up");
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(q.depth(), 1);
        assert_eq!(q.next().await, key("a"));
        assert_eq!(q.done(&key("a"), true), None);
        assert_eq!(q.pending_wakeups(), 1, "a's wake-up is spent; b's waits");

        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        assert_eq!(q.next().await, key("b"));
        q.done(&key("b"), true);

        // The dropped and replaced wake-ups (20, 30, 40, 60 s) never fire.
        tokio::time::advance(Duration::from_secs(120)).await;
        settle().await;
        assert_eq!((q.depth(), q.pending_wakeups(), alive()), (0, 0, 0));

        // After a wake-up fired, a new one can be set again.
        q.add_after(key("a"), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(6)).await;
        settle().await;
        assert_eq!(q.next().await, key("a"));
    }

    #[tokio::test]
    async fn waiting_workers_wake() {
        let q = Arc::new(Queue::default());
        let w = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::task::yield_now().await;
        q.add(key("z"));
        assert_eq!(w.await.unwrap(), key("z"));
    }
}
