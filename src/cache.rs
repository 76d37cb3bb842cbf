//! A small object cache fed by kube's watcher: what the reconcilers read instead of
//! asking the API server, and what the connector turns into snapshots and deltas.
//!
//! One cache per type may be fed by several watch streams (one per watched namespace);
//! a re-list of one stream only prunes objects of its own namespace.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// `(namespace, name)`.
pub type ObjKey = (String, String);

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the cache keeps of an object: the object less what nothing here reads (server-side
/// apply's field ownership and kubectl's copy of the last applied object, which can double
/// an object's size). One pod, Agent and Secret are cached per Agent, so this is most of
/// the manager's memory; pods are cached as the slim [`crate::pod::PodView`].
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

    pub fn len(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&self, mut obj: K) -> Arc<K> {
        let key = (obj.namespace().unwrap_or_default(), obj.name_any());
        trim(&mut obj);
        let obj = Arc::new(obj);
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.insert(key, obj.clone());
        obj
    }

    fn remove(&self, key: &ObjKey) -> Option<Arc<K>> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.remove(key)
    }

    /// Removes the objects of `scope` (a namespace, or all) not in `seen`.
    fn prune(&self, scope: Option<&str>, seen: &HashSet<ObjKey>) -> Vec<Arc<K>> {
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
    fn mark(&self) {
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

/// What changed, for whoever listens (the work queue, the connector).
pub enum Change<'a, K> {
    Upsert(&'a Arc<K>),
    Remove(&'a Arc<K>),
}

/// Feeds `cache` from one watch stream until the stream ends (it never does on its own:
/// the watcher retries with backoff). `on_change` runs for every change, in order.
///
/// The stream is counted in `gate` when `drive` is called, not when its future first
/// runs: otherwise the gate could say "synced" while a spawned stream has not started
/// (a Tool decided before the Agent watch listed would see no users).
pub fn drive<K>(
    api: Api<K>,
    config: watcher::Config,
    scope: Option<String>,
    cache: Arc<Cache<K>>,
    gate: Arc<SyncGate>,
    on_change: impl Fn(Change<'_, K>) + Send,
) -> impl Future<Output = ()> + Send
where
    K: Resource + ResourceExt + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    gate.expect();
    drive_counted(api, config, scope, cache, gate, on_change)
}

async fn drive_counted<K>(
    api: Api<K>,
    config: watcher::Config,
    scope: Option<String>,
    cache: Arc<Cache<K>>,
    gate: Arc<SyncGate>,
    on_change: impl Fn(Change<'_, K>) + Send,
) where
    K: Resource + ResourceExt + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut first_sync = true;
    let mut seen: HashSet<ObjKey> = HashSet::new();
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(err) => {
                // The backoff wrapper already paces retries; the stream goes on.
                tracing::warn!(error = %err, "watch failed, retrying");
                continue;
            }
        };
        match event {
            Event::Init => seen.clear(),
            Event::InitApply(obj) => {
                seen.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
                let obj = cache.insert(obj);
                on_change(Change::Upsert(&obj));
            }
            Event::InitDone => {
                for gone in cache.prune(scope.as_deref(), &seen) {
                    on_change(Change::Remove(&gone));
                }
                seen.clear();
                if first_sync {
                    first_sync = false;
                    gate.mark();
                }
            }
            Event::Apply(obj) => {
                let obj = cache.insert(obj);
                on_change(Change::Upsert(&obj));
            }
            Event::Delete(obj) => {
                let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                let gone = cache.remove(&key).unwrap_or_else(|| Arc::new(obj));
                on_change(Change::Remove(&gone));
            }
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
