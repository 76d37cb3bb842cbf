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

/// The prefix of the annotations the manager reads (`autonomic.sh/spec-hash`,
/// `autonomic.sh/context-summary`, on its pods).
const OUR_ANNOTATIONS: &str = "autonomic.sh/";

/// What the cache keeps of an object: the object less what nothing here reads (server-side
/// apply's field ownership, annotations but our own — kubectl's copy of the last applied
/// object can double an object's size —, a pod's labels, which the manager selects by but
/// never reads). One pod, Agent and Secret are cached per Agent, so this is most of the
/// manager's memory; pods and Secrets are cached as the slim [`super::PodView`] and
/// [`super::SecretView`].
pub fn trim<K: Resource<DynamicType = ()>>(obj: &mut K) {
    let pod = K::kind(&()) == "Pod";
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    meta.self_link = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with(OUR_ANNOTATIONS));
    }
    // An empty map still holds a node on the heap.
    if meta.annotations.as_ref().is_some_and(|a| a.is_empty()) {
        meta.annotations = None;
    }
    if pod {
        meta.labels = None;
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

impl<K: ResourceExt + Resource<DynamicType = ()>> Cache<K> {
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
