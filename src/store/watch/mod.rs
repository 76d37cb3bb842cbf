//! The watches: one stream per watched type and namespace, each feeding its cache in the
//! [`Store`] and telling a listener what it saw. Who listens (the work queue's routing,
//! the connector's deltas) is the application's choice, not this module's.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Service;
use kube::{Client, Resource, ResourceExt};
use tracing::Instrument;

use super::list::Listed;
use super::{
    Cache, MANAGED_SELECTOR, NamespaceView, OFFER_SELECTOR, OfferedSecret, OfferedServiceAccount,
    PodView, SecretView, Store, controller_of,
};
use crate::crd::{Agent, Key, Kind, Memory, Runtime, Tool};

mod feed;

use feed::{Source, drive};

/// One object a watch saw, of any watched type.
#[derive(Clone, Copy)]
pub enum Object<'a> {
    Agent(&'a Agent),
    Tool(&'a Tool),
    Runtime(&'a Runtime),
    Memory(&'a Memory),
    Pod(&'a PodView),
    Service(&'a Service),
    Secret(&'a SecretView),
    /// An offer made or withdrawn (TRUST.md §2).
    OfferedSecret(&'a OfferedSecret),
    OfferedServiceAccount(&'a OfferedServiceAccount),
    /// A namespace's labels set (TRUST.md §1, §2).
    Namespace(&'a NamespaceView),
}

/// What a watch saw: an object now in the cache, or one that left it.
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    pub object: Object<'a>,
    pub removed: bool,
}

/// A custom resource whose wire form changed (its own change, or one of its pods').
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    pub key: Key,
    /// The custom resource itself is gone.
    pub removed: bool,
    /// The custom resource's uid; empty when the change came from a pod.
    pub uid: String,
}

impl Seen<'_> {
    /// The custom resource whose wire form this changes, if any: pods show in their
    /// owner's; Services and Secrets do not show.
    pub fn changed(&self) -> Option<Changed> {
        fn own<K: ResourceExt>(kind: Kind, obj: &K, removed: bool) -> Changed {
            Changed {
                key: Key::of(kind, obj),
                removed,
                uid: obj.uid().unwrap_or_default(),
            }
        }
        let removed = self.removed;
        match self.object {
            Object::Agent(a) => Some(own(Kind::Agent, a, removed)),
            Object::Tool(t) => Some(own(Kind::Tool, t, removed)),
            Object::Runtime(r) => Some(own(Kind::Runtime, r, removed)),
            Object::Memory(m) => Some(own(Kind::Memory, m, removed)),
            Object::Pod(p) => {
                let (kind, owner) = controller_of(&p.metadata)?;
                Some(Changed {
                    key: Key::new(kind, p.namespace().unwrap_or_default(), owner),
                    removed: false,
                    uid: String::new(),
                })
            }
            Object::Service(_)
            | Object::Secret(_)
            | Object::OfferedSecret(_)
            | Object::OfferedServiceAccount(_)
            | Object::Namespace(_) => None,
        }
    }
}

/// Hears every change of every watch, in each stream's order.
pub type Listener = Arc<dyn Fn(Seen<'_>) + Send + Sync>;

/// Starts one watch per type and watched namespace (`namespaces` empty: the cluster).
pub fn spawn(
    store: &Arc<Store>,
    client: &Client,
    namespaces: &[String],
    listener: &Listener,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    for scope in scopes {
        let w = Watch {
            store,
            client,
            scope,
            listener,
        };
        w.spawn(tasks, None, |s| &s.agents, |o| Object::Agent(o));
        w.spawn(tasks, None, |s| &s.tools, |o| Object::Tool(o));
        w.spawn(tasks, None, |s| &s.runtimes, |o| Object::Runtime(o));
        w.spawn(tasks, None, |s| &s.memories, |o| Object::Memory(o));
        let ours = Some(MANAGED_SELECTOR);
        w.spawn(tasks, ours, |s| &s.pods, |o| Object::Pod(o));
        w.spawn(tasks, ours, |s| &s.services, |o| Object::Service(o));
        w.spawn(tasks, ours, |s| &s.secrets, |o| Object::Secret(o));
        let offered = Some(OFFER_SELECTOR);
        w.spawn(
            tasks,
            offered,
            |s| &s.offered_secrets,
            |o| Object::OfferedSecret(o),
        );
        w.spawn(
            tasks,
            offered,
            |s| &s.offered_service_accounts,
            |o| Object::OfferedServiceAccount(o),
        );
        // The namespaces themselves, for their labels: all of them, or each watched one
        // by name (the chart grants no more).
        let named = Source::cluster_scoped(client, w.scope.clone());
        w.feed(tasks, named, |s| &s.namespaces, |o| Object::Namespace(o));
    }
}

/// What every watch of one scope shares.
struct Watch<'a> {
    store: &'a Arc<Store>,
    client: &'a Client,
    scope: Option<String>,
    listener: &'a Listener,
}

impl Watch<'_> {
    /// A namespaced kind's watch in this scope, with `selector`.
    fn spawn<K>(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        selector: Option<&str>,
        cache: fn(&Store) -> &Cache<K>,
        wrap: for<'o> fn(&'o K) -> Object<'o>,
    ) where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Listed
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let source = Source::namespaced(self.client, self.scope.clone(), selector);
        self.feed(tasks, source, cache, wrap);
    }

    /// Feeds `cache` from `source`, telling the listener, on a task of its own.
    fn feed<K>(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        source: Source,
        cache: fn(&Store) -> &Cache<K>,
        wrap: for<'o> fn(&'o K) -> Object<'o>,
    ) where
        K: Resource<DynamicType = ()> + Clone + Listed + Debug + Send + Sync + 'static,
    {
        let kind = K::kind(&());
        // The wire form reads the custom resources and pods, never Secrets, Services,
        // ServiceAccounts or namespaces: the first snapshot need not wait for their lists.
        let wire = !matches!(
            kind.as_ref(),
            "Secret" | "Service" | "ServiceAccount" | "Namespace"
        );
        let span = tracing::info_span!(
            "watch",
            kind = %kind,
            namespace = self.scope.as_deref().unwrap_or("*"),
        );
        let listener = self.listener.clone();
        let on_change = move |obj: &K, removed| {
            listener(Seen {
                object: wrap(obj),
                removed,
            })
        };
        let fed = drive(source, wire, self.store.clone(), cache, on_change);
        tasks.spawn(fed.instrument(span));
    }
}
