//! The roll budget: at most `AUTONOMIC_ROLL_MAX` Agents mid-roll at once.
//!
//! An Agent is *mid-roll* from the moment its pod is deleted because the pod it should
//! have changed (its spec hash: a Runtime edit, a new default agentlet image) until its
//! new pod is `Active`, or the Agent is paused, finished, deleted or gone. An Agent whose
//! pod is stale asks for a slot ([`Rolls::admit`]); without one it keeps its pod and
//! waits in line (first come, first served). A slot that frees wakes the Agents at the
//! head of the line. Only recreations count: an Agent's first pod, a pod replaced because
//! it ended or was deleted by someone else, are not rolls.
//!
//! An Agent whose new pod never becomes `Active` (the edit broke the image) keeps its
//! slot: a bad change stops after `max` Agents instead of breaking them all, and the fix
//! (another edit) lets them through first, as they already hold slots.
//!
//! The state is the leader's memory. A restarted or new leader starts with an empty
//! budget: Agents that were mid-roll finish on their own (their pods are created as
//! first pods), so right after a failover up to twice `max` Agents may be mid-roll, for
//! as long as the old leader's last ones take to start.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use crate::crd::Key;

/// The answer to [`Rolls::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Recreate the pod now: the Agent holds a slot until [`Rolls::release`].
    Go,
    /// Keep the current pod; the Agent is woken when a slot frees.
    Wait,
}

#[derive(Default)]
struct Inner {
    rolling: HashSet<Key>,
    /// In the order they first asked.
    waiting: VecDeque<Key>,
}

pub struct Rolls {
    max: usize,
    inner: Mutex<Inner>,
}

impl Rolls {
    /// `max` is at least 1 (the configuration refuses 0).
    pub fn new(max: usize) -> Self {
        Rolls {
            max: max.max(1),
            inner: Mutex::default(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key`'s pod is stale: may it be recreated now? An Agent already holding a slot
    /// may; otherwise it joins the line (once) and goes when its place in the line is
    /// within the free slots, so a newcomer never passes one that was woken for a slot.
    pub fn admit(&self, key: &Key) -> Admit {
        let mut inner = self.lock();
        if inner.rolling.contains(key) {
            return Admit::Go;
        }
        let free = self.max.saturating_sub(inner.rolling.len());
        let place = match inner.waiting.iter().position(|k| k == key) {
            Some(p) => p,
            None => {
                inner.waiting.push_back(key.clone());
                inner.waiting.len() - 1
            }
        };
        if place < free {
            inner.waiting.remove(place);
            inner.rolling.insert(key.clone());
            Admit::Go
        } else {
            Admit::Wait
        }
    }

    /// `key` is no longer mid-roll nor waiting (its new pod is `Active`, it no longer
    /// needs a roll, it is paused, finished or gone). Returns the Agents to wake: those at
    /// the head of the line that a slot now awaits, when this call changed anything.
    pub fn release(&self, key: &Key) -> Vec<Key> {
        let mut inner = self.lock();
        let was_rolling = inner.rolling.remove(key);
        let place = inner.waiting.iter().position(|k| k == key);
        if let Some(p) = place {
            inner.waiting.remove(p);
        }
        if !was_rolling && place.is_none() {
            return Vec::new();
        }
        let free = self.max.saturating_sub(inner.rolling.len());
        inner.waiting.iter().take(free).cloned().collect()
    }

    pub fn is_rolling(&self, key: &Key) -> bool {
        self.lock().rolling.contains(key)
    }

    /// How many Agents are mid-roll now.
    #[cfg(test)]
    pub fn rolling(&self) -> usize {
        self.lock().rolling.len()
    }

    /// How many Agents wait for a slot.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Kind;

    fn k(i: usize) -> Key {
        Key::new(Kind::Agent, "n", format!("a{i}"))
    }

    #[test]
    fn at_most_max_roll_and_the_line_goes_in_order() {
        let r = Rolls::new(2);
        assert_eq!(r.admit(&k(0)), Admit::Go);
        assert_eq!(r.admit(&k(1)), Admit::Go);
        // Asking again while rolling: still yes, no second slot taken.
        assert_eq!(r.admit(&k(0)), Admit::Go);
        for i in 2..6 {
            assert_eq!(r.admit(&k(i)), Admit::Wait, "a{i}");
        }
        // Asking again while waiting does not move one back in line.
        assert_eq!(r.admit(&k(3)), Admit::Wait);
        assert_eq!((r.rolling(), r.waiting()), (2, 4));
        // a0 is Active: one slot, and the head of the line is woken.
        assert_eq!(r.release(&k(0)), [k(2)]);
        // A later one that asks first does not take the woken one's slot.
        assert_eq!(r.admit(&k(4)), Admit::Wait);
        assert_eq!(r.admit(&k(2)), Admit::Go);
        assert_eq!((r.rolling(), r.waiting()), (2, 3));
        // Both rolling finish: the next two are woken, in order.
        assert_eq!(r.release(&k(1)), [k(3)]);
        assert_eq!(r.release(&k(2)), [k(3), k(4)]);
        assert_eq!(r.admit(&k(4)), Admit::Go);
        assert_eq!(r.admit(&k(3)), Admit::Go);
        assert_eq!(r.admit(&k(5)), Admit::Wait);
    }

    #[test]
    fn leaving_the_line_or_releasing_twice() {
        let r = Rolls::new(1);
        assert_eq!(r.admit(&k(0)), Admit::Go);
        assert_eq!(r.admit(&k(1)), Admit::Wait);
        assert_eq!(r.admit(&k(2)), Admit::Wait);
        // a1 no longer needs a roll (its spec went back, it was deleted): it leaves the
        // line; nothing is free, nobody is woken.
        assert!(r.release(&k(1)).is_empty());
        assert_eq!(r.waiting(), 1);
        // Releasing what holds nothing changes nothing and wakes nobody.
        assert!(r.release(&k(7)).is_empty());
        assert_eq!(r.release(&k(0)), [k(2)]);
        assert!(r.release(&k(0)).is_empty());
        assert_eq!(r.admit(&k(2)), Admit::Go);
        assert_eq!((r.rolling(), r.waiting()), (1, 0));
    }

    #[test]
    fn a_stuck_roll_keeps_its_slot() {
        // An Agent whose new pod never gets Active is never released: the others wait.
        let r = Rolls::new(1);
        assert_eq!(r.admit(&k(0)), Admit::Go);
        for _ in 0..3 {
            assert_eq!(r.admit(&k(1)), Admit::Wait);
            assert_eq!(r.admit(&k(0)), Admit::Go);
        }
        assert_eq!(r.rolling(), 1);
        assert_eq!(Rolls::new(0).max(), 1);
    }
}
