//! A small object cache of one type, and the gate that opens once every watch listed.
//!
//! One cache per type may be fed by several watch streams (one per watched namespace);
//! a re-list of one stream only prunes objects of its own namespace.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use kube::{Resource, ResourceExt};

/// `(namespace, name)`.
pub type ObjKey = (String, String);

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the cache keeps of an object: the object less what nothing here reads (server-side
/// apply's field ownership and kubectl's copy of the last applied object, which can double
/// an object's size). One pod, Agent and Secret are cached per Agent, so this is most of
/// the manager's memory; pods are cached as the slim [`super::PodView`].
pub fn trim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The latest state of every watched object of one type.
pub struct Cache<K> {
    objects: RwLock<BTreeMap<ObjKey, Arc<K>>>,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Cache {
            objects: RwLock::new(BTreeMap::new()),
        }
    }
}

impl<K: ResourceExt> Cache<K> {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every object of one namespace, in name order.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let start = (namespace.to_owned(), String::new());
        objects
            .range(start..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|(_, o)| o.clone())
            .collect()
    }

    pub fn all(&self) -> Vec<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.values().cloned().collect()
    }

    /// How many objects are cached.
    pub fn count(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn insert(&self, mut obj: K) -> Arc<K> {
        let key = (obj.namespace().unwrap_or_default(), obj.name_any());
        trim(&mut obj);
        let obj = Arc::new(obj);
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.insert(key, obj.clone());
        obj
    }

    pub(super) fn remove(&self, key: &ObjKey) -> Option<Arc<K>> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.remove(key)
    }

    /// Removes the objects of `scope` (a namespace, or all) not in `seen`.
    pub(super) fn prune(&self, scope: Option<&str>, seen: &HashSet<ObjKey>) -> Vec<Arc<K>> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<ObjKey> = objects
            .keys()
            .filter(|k| scope.is_none_or(|ns| k.0 == ns) && !seen.contains(*k))
            .cloned()
            .collect();
        stale.iter().filter_map(|k| objects.remove(k)).collect()
    }
}

/// Counts watch streams that have finished their first list; readiness waits for all.
#[derive(Default)]
pub struct SyncGate {
    expected: AtomicUsize,
    synced: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl SyncGate {
    pub fn expect(&self) {
        self.expected.fetch_add(1, Ordering::SeqCst);
    }
    pub(super) fn mark(&self) {
        self.synced.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
    pub fn is_synced(&self) -> bool {
        let expected = self.expected.load(Ordering::SeqCst);
        expected > 0 && self.synced.load(Ordering::SeqCst) >= expected
    }
    /// Completes once every watch stream has finished its first list.
    pub async fn wait(&self) {
        loop {
            let changed = self.changed.notified();
            if self.is_synced() {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_gate_opens_when_every_expected_stream_has_listed() {
        let gate = Arc::new(SyncGate::default());
        gate.expect();
        gate.expect();
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait().await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        gate.mark();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "open after one of two lists");
        gate.mark();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("open after both lists")
            .unwrap();
        // Once open, it stays open.
        gate.wait().await;
    }
}
