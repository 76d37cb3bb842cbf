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
/// [`super::SecretView`]. What the objects hold is kept in as little room as it takes
/// ([`fit`]).
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
    fit(&mut meta.owner_references);
    fit(&mut meta.finalizers);
}

/// Gives back a list's unused room. serde reads a list by growing it, so one to three
/// entries take the room of four: a Secret's one owner reference (104 bytes) held 416.
/// (The lists of an Agent, a pod and a Secret of their own are boxed slices, read to fit.)
/// Cached objects live as long as their object does, one Agent, pod and Secret each per
/// Agent, so the room is given back once, when they are kept. The Tools, Runtimes and
/// Memories, a few per namespace, are left as read.
pub(super) fn fit<T>(list: &mut Option<Vec<T>>) {
    if let Some(list) = list {
        list.shrink_to_fit();
    }
}
/// The latest state of every watched object of one type.
pub struct Cache<K> {
    objects: RwLock<BTreeMap<Slot, Arc<K>>>,
    /// `AUTONOMIC_MAX_SPEC_BYTES`: an Agent, Tool, Runtime or Memory whose spec is larger
    /// as JSON is kept as a stub (TRUST.md §3, [`super::spec`]). Every cache has one, the
    /// default until [`super::Store::with_max_spec_bytes`] sets the four kinds'; the
    /// other kinds' caches never read it.
    pub(super) max_spec_bytes: u64,
}

/// A cache entry's key: `namespace`, a NUL, `name`, in one allocation (a pair of strings
/// is two, and twice the room in the map's nodes). NUL sorts before every character a
/// namespace or name may hold, so the keys sort as `(namespace, name)` pairs would, and
/// one namespace's objects are one range.
pub(super) type Slot = Box<str>;

pub(super) fn slot(namespace: &str, name: &str) -> Slot {
    let mut s = String::with_capacity(namespace.len() + 1 + name.len());
    s.push_str(namespace);
    s.push('\0');
    s.push_str(name);
    s.into_boxed_str()
}

/// The slot of an object.
pub(super) fn slot_of<K: ResourceExt>(obj: &K) -> Slot {
    slot(
        obj.meta().namespace.as_deref().unwrap_or_default(),
        &obj.name_any(),
    )
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Cache {
            objects: RwLock::new(BTreeMap::new()),
            max_spec_bytes: crate::crd::DEFAULT_MAX_SPEC_BYTES,
        }
    }
}

impl<K: ResourceExt + Resource<DynamicType = ()>> Cache<K> {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.get(&slot(namespace, name)).cloned()
    }

    /// Every object of one namespace, in name order.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let start = slot(namespace, "");
        objects
            .range(start.clone()..)
            .take_while(|(k, _)| k.starts_with(&*start))
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

    /// Keeps `obj`, trimmed ([`trim`]) and, for the four custom resources, its spec within
    /// `max_spec_bytes` ([`super::spec`]); returns it as kept.
    pub fn insert(&self, mut obj: K) -> Arc<K>
    where
        K: 'static,
    {
        let key = slot_of(&obj);
        trim(&mut obj);
        super::spec::bound(&mut obj, self.max_spec_bytes);
        let obj = Arc::new(obj);
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.insert(key, obj.clone());
        obj
    }

    pub(super) fn remove(&self, key: &Slot) -> Option<Arc<K>> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.remove(key)
    }

    /// Removes the objects a stream `holds` (its namespace's, or all) not in `seen`.
    pub(super) fn prune(&self, holds: impl Fn(&str) -> bool, seen: &HashSet<Slot>) -> Vec<Arc<K>> {
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<Slot> = objects
            .keys()
            .filter(|k| holds(k) && !seen.contains(*k))
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
    pub(crate) fn mark(&self) {
        self.synced.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
    pub fn is_synced(&self) -> bool {
        let expected = self.expected.load(Ordering::SeqCst);
        expected > 0 && self.synced.load(Ordering::SeqCst) >= expected
    }
    /// Completes once every watch stream has finished its first list.
    pub async fn wait(&self) {
        wait_until(&self.changed, || self.is_synced()).await;
    }
}

/// Opens once, for good; waiters wake when it does.
#[derive(Default)]
pub struct Latch {
    open: std::sync::atomic::AtomicBool,
    opened: tokio::sync::Notify,
}

impl Latch {
    pub fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.opened.notify_waiters();
    }
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }
    pub async fn wait(&self) {
        wait_until(&self.opened, || self.is_open()).await;
    }
}

/// Completes once `ready` holds, checked again at each `notify_waiters` of `changed`
/// (registered before each check, so a change between the check and the wait is seen).
async fn wait_until(changed: &tokio::sync::Notify, ready: impl Fn() -> bool) {
    loop {
        let notified = changed.notified();
        if ready() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lists read from the API server's text are kept without their unused room: one
    /// entry takes the room of one, not of the four serde grew it to. (The lists of the
    /// types of our own are boxed slices: no room to spare by type.)
    #[test]
    fn kept_lists_hold_no_unused_room() {
        use crate::crd::Agent;
        use crate::store::{PodView, SecretView};
        let meta = r#"{"name":"o","namespace":"n","ownerReferences":[{"apiVersion":"v1",
            "kind":"K","name":"o","uid":"u"}],"finalizers":["f"]}"#;
        let agent: Agent = serde_json::from_str(&format!(
            r#"{{"apiVersion":"autonomic.sh/v1alpha1","kind":"Agent","metadata":{meta},"spec":{{}}}}"#
        ))
        .unwrap();
        let pod: PodView = serde_json::from_str(&format!(r#"{{"metadata":{meta}}}"#)).unwrap();
        let secret: SecretView =
            serde_json::from_str(&format!(r#"{{"metadata":{meta}}}"#)).unwrap();
        let (agents, pods, secrets) = (Cache::default(), Cache::default(), Cache::default());
        let (agent, pod, secret) = (
            agents.insert(agent),
            pods.insert(pod),
            secrets.insert(secret),
        );
        for meta in [&agent.metadata, &pod.metadata, &secret.metadata] {
            let owners = meta.owner_references.as_ref().map(Vec::capacity);
            assert_eq!(owners, Some(1));
            assert_eq!(meta.finalizers.as_ref().map(Vec::capacity), Some(1));
        }
    }

    /// The slot musl's allocator (mallocng: the static binary's) takes for `n` bytes: the
    /// smallest of its size classes, in 16-byte units, that holds them and a header
    /// (musl's `size_to_class`).
    fn musl_slot(n: usize) -> usize {
        const CLASSES: [usize; 48] = [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 31, 36, 42, 50, 63, 72, 84, 102,
            127, 146, 170, 204, 255, 292, 340, 409, 511, 584, 682, 818, 1023, 1169, 1364, 1637,
            2047, 2340, 2730, 3276, 4095, 4680, 5460, 6552, 8191,
        ];
        let need = ((n + 3) >> 4) + 1;
        16 * CLASSES.into_iter().find(|&c| c >= need).unwrap()
    }

    /// Three objects are cached per Agent, each one allocation (its `Arc`: two counts and
    /// the object), and its size picks the slot musl gives it. Each type fits the slot
    /// below the one it took before its strings and lists were boxed: an Agent 672 bytes,
    /// not 800; a pod 576, not 672; a Secret 400, not 496 (3 MiB at 10 000 Agents). A
    /// field more can move a type up a class: this test says so.
    #[test]
    fn cached_objects_fit_their_allocator_slots() {
        use crate::crd::Agent;
        use crate::store::{PodView, SecretView};
        assert_eq!(
            (musl_slot(16), musl_slot(668), musl_slot(669)),
            (32, 672, 800)
        );
        let slot = |object: usize| musl_slot(2 * size_of::<usize>() + object);
        assert_eq!(slot(size_of::<Agent>()), 672);
        assert_eq!(slot(size_of::<PodView>()), 576);
        assert_eq!(slot(size_of::<SecretView>()), 400);
    }

    /// One namespace's objects are its own, however its name compares with others'.
    #[test]
    fn a_namespace_is_one_range_and_prunes_alone() {
        use crate::store::SecretView;
        let cache: Cache<SecretView> = Cache::default();
        for (ns, name) in [("a", "x"), ("a", "y"), ("a-b", "x"), ("ab", "x"), ("", "z")] {
            let mut s = SecretView::default();
            s.metadata.namespace = Some(ns.into());
            s.metadata.name = Some(name.into());
            cache.insert(s);
        }
        let names = |v: Vec<Arc<SecretView>>| -> Vec<String> {
            v.iter()
                .map(|s| format!("{}/{}", s.namespace().unwrap(), s.name_any()))
                .collect()
        };
        assert_eq!(names(cache.in_namespace("a")), ["a/x", "a/y"]);
        assert_eq!(names(cache.in_namespace("a-b")), ["a-b/x"]);
        assert!(cache.get("a", "x").is_some() && cache.get("a-", "bx").is_none());
        let seen = HashSet::from([slot("a", "y")]);
        let in_a = |k: &str| k.starts_with(&*slot("a", ""));
        assert_eq!(names(cache.prune(in_a, &seen)), ["a/x"]);
        assert_eq!(cache.count(), 4);
        assert_eq!(names(cache.prune(|_| true, &HashSet::new())).len(), 4);
    }

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
