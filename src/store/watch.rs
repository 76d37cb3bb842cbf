//! The watches: one stream per watched type and namespace, each feeding its cache in the
//! [`Store`] and telling a listener what it saw. Who listens (the work queue's routing,
//! the connector's deltas) is the application's choice, not this module's.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::cache::ObjKey;
use super::{Cache, MANAGED_SELECTOR, PodView, SecretView, Store, controller_of};
use crate::crd::{Agent, Key, Kind, Memory, Runtime, Tool};

/// Objects per list request of the initial (and every re-) list, by kind. A page's body
/// is held whole, twice over, while it is read (kube copies it into one buffer, then into
/// a string): about 7 KB a pod as served, 1 KB an Agent or Secret. Pages of 500 pods
/// raised the peak with 1 000 Agents by half (BENCHMARKS.md); pages of 100 made a fresh
/// manager's lists of 10 000 Agents, pods and Secrets 300 round trips. The lists run
/// at once, one per kind: the pods' is the longest.
const LIST_PAGE: u32 = 500;
const LIST_PAGE_PODS: u32 = 200;

/// Secrets per list request. Any namespace user can label Secrets of up to 1 MiB as
/// ours, and a page is held whole (its JSON, then the decoded objects) before the cache
/// takes it: a page of 100 such Secrets took a starting manager to a 273 MiB peak, past
/// its 128Mi limit, at every restart (`tests/hostile.rs`). 8 keep a page under 20 MiB;
/// the cost is a list request per 8 Secrets (one per Agent) at start and relist: on the
/// test bed 2.5 ms each, 0.31 ms a Secret against 0.18 ms at 100 a page.
const SECRET_PAGE: u32 = 8;

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
            Object::Service(_) | Object::Secret(_) => None,
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
    fn spawn<K>(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        selector: Option<&str>,
        cache: fn(&Store) -> &Cache<K>,
        wrap: for<'o> fn(&'o K) -> Object<'o>,
    ) where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
        let api: Api<K> = match &self.scope {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let kind = K::kind(&());
        let page = match kind.as_ref() {
            "Secret" => SECRET_PAGE,
            "Pod" => LIST_PAGE_PODS,
            _ => LIST_PAGE,
        };
        // The wire form reads the custom resources and pods, never Secrets or Services:
        // the first snapshot need not wait for their lists (the Secrets' is the longest,
        // in pages of SECRET_PAGE).
        let wire = !matches!(kind.as_ref(), "Secret" | "Service");
        let mut config = watcher::Config::default().page_size(page);
        if let Some(selector) = selector {
            config = config.labels(selector);
        }
        let span = tracing::info_span!(
            "watch",
            kind = %K::kind(&()),
            namespace = self.scope.as_deref().unwrap_or("*"),
        );
        let listener = self.listener.clone();
        let on_change = move |obj: &K, removed| {
            listener(Seen {
                object: wrap(obj),
                removed,
            })
        };
        let fed = drive(
            api,
            config,
            wire,
            self.scope.clone(),
            self.store.clone(),
            cache,
            on_change,
        );
        tasks.spawn(fed.instrument(span));
    }
}

/// Feeds one cache from one watch stream until the stream ends (it never does on its
/// own: the watcher retries with backoff). `on_change` runs for every change, in order,
/// with `true` for a removal.
///
/// The stream is counted in the sync gate when `drive` is called, not when its future
/// first runs: otherwise the gate could say "synced" while a spawned stream has not
/// started (a Tool decided before the Agent watch listed would see no users).
fn drive<K>(
    api: Api<K>,
    config: watcher::Config,
    wire: bool,
    scope: Option<String>,
    store: Arc<Store>,
    cache: fn(&Store) -> &Cache<K>,
    on_change: impl Fn(&K, bool) + Send,
) -> impl Future<Output = ()> + Send
where
    K: Resource<DynamicType = ()>
        + ResourceExt
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    store.synced.expect();
    if wire {
        store.wire_synced.expect();
    }
    async move {
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
            let c = cache(&store);
            match event {
                Event::Init => seen.clear(),
                Event::InitApply(obj) => {
                    seen.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
                    on_change(&c.insert(obj), false);
                }
                Event::InitDone => {
                    for gone in c.prune(scope.as_deref(), &seen) {
                        on_change(&gone, true);
                    }
                    seen.clear();
                    if first_sync {
                        first_sync = false;
                        store.synced.mark();
                        if wire {
                            store.wire_synced.mark();
                        }
                    }
                }
                Event::Apply(obj) => on_change(&c.insert(obj), false),
                Event::Delete(obj) => {
                    let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                    let gone = c.remove(&key).unwrap_or_else(|| Arc::new(obj));
                    on_change(&gone, true);
                }
            }
        }
    }
}
