//! What the manager knows of the cluster: one cache per watched type, filled by the
//! watches (`watch`), read by the reconcilers and the connector instead of the API
//! server. Tests build a `Store` in memory and fill it by hand.
//!
//! Layers: `crd` ← `store` ← `reconcile` ← `connect`; nothing here writes to the cluster.

mod cache;
pub(crate) mod list;
mod namespace;
mod offer;
mod pod;
pub(crate) mod proto;
mod secret;
mod spec;
pub mod watch;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use cache::{Cache, Latch, ObjKey, SyncGate, trim};
pub use namespace::{NamespaceView, SHELL_DISABLED, SHELL_LABEL};
pub use offer::{OFFER_SELECTOR, OfferedSecret, OfferedServiceAccount};
pub use pod::{CONTEXT_SUMMARY_MAX, Health, PodView, SPEC_HASH, pod_health};
pub use secret::SecretView;
pub use spec::Oversized;

use crate::crd::{Agent, Key, Kind, Memory, Runtime, Tool};

/// The label every object the manager creates carries, and its value.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "autonomic";
/// Label selector for everything the manager creates: the child watches see only these.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=autonomic";

/// The latest state of every watched object.
#[derive(Default)]
pub struct Store {
    pub agents: Cache<Agent>,
    pub tools: Cache<Tool>,
    pub runtimes: Cache<Runtime>,
    pub memories: Cache<Memory>,
    /// Pods, Services and Secrets labelled as ours; pods and Secrets slim.
    pub pods: Cache<PodView>,
    pub services: Cache<Service>,
    pub secrets: Cache<SecretView>,
    /// What the admin offered to agents (TRUST.md §2), by name only.
    pub offered_secrets: Cache<OfferedSecret>,
    pub offered_service_accounts: Cache<OfferedServiceAccount>,
    /// The namespaces' labels of TRUST.md §1 and §2 (pod security, references).
    pub namespaces: Cache<NamespaceView>,
    /// Opens once every watch has listed.
    pub synced: SyncGate,
    /// Opens once the watches the wire form reads (the custom resources and pods) have
    /// listed: the first snapshot waits for this one, not for Secrets and Services.
    pub wire_synced: SyncGate,
    /// Opens when the lists the wire form does not read (Secrets, Services) may start,
    /// after `wire_synced`: the application opens it once the first snapshot is out, so
    /// that they do not slow it, or after a bound (`lib.rs`).
    pub later: Latch,
}

impl Store {
    /// An empty store whose Agents, Tools, Runtimes and Memories are kept as stubs when
    /// their spec is larger than `max_spec_bytes` as JSON (`AUTONOMIC_MAX_SPEC_BYTES`,
    /// TRUST.md §3; see `spec`). The bound is the caches' own, since they are what every
    /// watch writes through (`Cache::insert`); the application builds its store here,
    /// from its configuration. `Store::default()` has the default bound, 256 KiB.
    pub fn with_max_spec_bytes(max_spec_bytes: u64) -> Store {
        let mut store = Store::default();
        store.agents.max_spec_bytes = max_spec_bytes;
        store.tools.max_spec_bytes = max_spec_bytes;
        store.runtimes.max_spec_bytes = max_spec_bytes;
        store.memories.max_spec_bytes = max_spec_bytes;
        store
    }

    /// Pod `name` of `ns` if the object with uid `owner` controls it: a same-named pod
    /// of someone else's is never read as ours.
    pub fn owned_pod(&self, ns: &str, name: &str, owner: Option<&str>) -> Option<Arc<PodView>> {
        self.pods
            .get(ns, name)
            .filter(|p| is_owned_by(&p.metadata, owner))
    }

    /// The Agents of `ns` for which `uses` holds.
    pub fn agents_where(&self, ns: &str, uses: impl Fn(&Agent) -> bool) -> Vec<Arc<Agent>> {
        let mut agents = self.agents.in_namespace(ns);
        agents.retain(|a| uses(a));
        agents
    }

    /// The key of every custom resource.
    pub fn keys(&self) -> Vec<Key> {
        let mut keys = Vec::new();
        keys.extend(self.agents.all().iter().map(|a| Key::of(Kind::Agent, &**a)));
        keys.extend(self.tools.all().iter().map(|t| Key::of(Kind::Tool, &**t)));
        keys.extend(
            self.runtimes
                .all()
                .iter()
                .map(|r| Key::of(Kind::Runtime, &**r)),
        );
        keys.extend(
            self.memories
                .all()
                .iter()
                .map(|m| Key::of(Kind::Memory, &**m)),
        );
        keys
    }
}

/// The kind and name of the custom resource that controls `meta`, if it is ours.
pub fn controller_of(meta: &ObjectMeta) -> Option<(Kind, &str)> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true) && r.api_version == crate::crd::API_VERSION)
        .and_then(|r| Some((Kind::parse(&r.kind)?, r.name.as_str())))
}

/// Whether `child` is controlled by the object with `uid`.
pub fn is_owned_by(child: &ObjectMeta, uid: Option<&str>) -> bool {
    let Some(uid) = uid else { return false };
    child
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_of_finds_our_kinds_only() {
        let meta: ObjectMeta = serde_saphyr::from_str(
            "{name: x, ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: r, uid: '1', controller: true}, {apiVersion: autonomic.sh/v1alpha1, kind: Tool, name: t, uid: '2', controller: true}]}",
        )
        .unwrap();
        assert_eq!(controller_of(&meta), Some((Kind::Tool, "t")));
        assert!(is_owned_by(&meta, Some("2")));
        assert!(!is_owned_by(&meta, Some("3")));
    }
}
