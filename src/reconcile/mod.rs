//! The reconcile loop: watches feed caches and a work queue; a few workers take keys
//! off the queue and run the reconciler of their kind.

pub mod agent;
pub mod common;
pub mod demand;
pub mod memory;
pub mod queue;
pub mod runtime;
pub mod tool;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::Error;
use crate::cache::{self, Cache, Change, SyncGate};
use crate::config::Config;
use crate::crd::{Agent, Kind, Memory, Runtime, Tool};
use crate::metrics::Metrics;
use crate::pod::PodView;
pub use queue::{Key, Queue};

pub const FIELD_MANAGER: &str = "autonomic-manager";
const WORKERS: usize = 4;
/// Every object is looked at again this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(300);

/// A custom resource whose wire form changed (its own change, or one of its pods').
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    pub key: Key,
    /// The custom resource itself is gone.
    pub removed: bool,
    pub uid: String,
}

/// Which custom resource a watched object's change concerns.
trait Watched {
    fn changed(&self, removed: bool) -> Option<Changed>;
}

macro_rules! watched_cr {
    ($($ty:ty => $kind:expr),*) => {$(
        impl Watched for $ty {
            fn changed(&self, removed: bool) -> Option<Changed> {
                Some(Changed {
                    key: Context::key_of($kind, self),
                    removed,
                    uid: self.uid().unwrap_or_default(),
                })
            }
        }
    )*};
}
watched_cr!(Agent => Kind::Agent, Tool => Kind::Tool, Runtime => Kind::Runtime, Memory => Kind::Memory);

impl Watched for PodView {
    fn changed(&self, _removed: bool) -> Option<Changed> {
        let (kind, owner) = common::controller_of(&self.metadata)?;
        let ns = self.namespace().unwrap_or_default();
        Some(Changed {
            key: Key::new(kind, ns, owner),
            removed: false,
            uid: String::new(),
        })
    }
}

impl Watched for Service {
    fn changed(&self, _: bool) -> Option<Changed> {
        None
    }
}

impl Watched for Secret {
    fn changed(&self, _: bool) -> Option<Changed> {
        None
    }
}

/// What a reconcile asks of the loop afterwards.
#[derive(Debug, Default)]
pub struct Outcome {
    pub requeue: Option<Duration>,
}

/// Everything a reconciler reads and writes through.
pub struct Context {
    pub client: Client,
    pub config: Arc<Config>,
    pub agents: Arc<Cache<Agent>>,
    pub tools: Arc<Cache<Tool>>,
    pub runtimes: Arc<Cache<Runtime>>,
    pub memories: Arc<Cache<Memory>>,
    /// Pods, Services and Secrets labelled as ours.
    pub pods: Arc<Cache<PodView>>,
    pub services: Arc<Cache<Service>>,
    pub secrets: Arc<Cache<Secret>>,
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    pub synced: Arc<SyncGate>,
    /// The control-plane connection's shared state (idle when unmanaged).
    pub link: Arc<crate::connect::Link>,
    /// What each Agent demanded last: which Tools an Agent change concerns.
    pub demand: demand::Index,
    recorder: Recorder,
}

/// The parts of a status that `write_status` reports on.
pub trait PhaseStatus: Serialize + PartialEq {
    fn phase_name(&self) -> Option<String>;
    fn message_text(&self) -> &str;
    /// Whether the phase deserves a Warning event.
    fn is_warning(&self) -> bool;
}

macro_rules! phase_status {
    ($($ty:ty => [$($warn:pat_param),+]);*) => {$(
        impl PhaseStatus for $ty {
            fn phase_name(&self) -> Option<String> {
                self.phase.map(|p| format!("{p:?}"))
            }
            fn message_text(&self) -> &str {
                self.message.as_deref().unwrap_or_default()
            }
            fn is_warning(&self) -> bool {
                matches!(self.phase, $(Some($warn))|+)
            }
        }
    )*};
}
use crate::crd::{
    AgentPhase, AgentStatus, MemoryPhase, MemoryStatus, RuntimePhase, RuntimeStatus, ToolPhase,
    ToolStatus,
};
phase_status!(
    AgentStatus => [AgentPhase::Error, AgentPhase::Failed];
    ToolStatus => [ToolPhase::Error];
    RuntimeStatus => [RuntimePhase::Invalid];
    MemoryStatus => [MemoryPhase::Error]
);

fn api_status(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl Context {
    pub fn new(client: Client, config: Arc<Config>, metrics: Arc<Metrics>) -> Arc<Self> {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(config.pod_name.clone()),
        };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            agents: Default::default(),
            tools: Default::default(),
            runtimes: Default::default(),
            memories: Default::default(),
            pods: Default::default(),
            services: Default::default(),
            secrets: Default::default(),
            queue: Default::default(),
            metrics,
            synced: Default::default(),
            link: Default::default(),
            demand: Default::default(),
        })
    }

    /// The wall clock every reconcile reads: the one source of "now" for decisions that
    /// are persisted (a Tool's `status.idleSince`). The pure decisions take it as an
    /// argument, so their tests set it.
    pub fn now(&self) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::now()
    }

    fn api<T>(&self, ns: &str) -> Api<T>
    where
        T: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Server-side applies a child. The outer error is transient; the inner one says the
    /// API server refused it or a same-named object belongs to someone else (we never
    /// take over or delete what is not ours).
    ///
    /// `cached` is the watch cache's copy: when it is ours and already holds every field
    /// of `obj`, nothing is sent (most reconciles of an Agent change nothing, and a GET
    /// plus an apply each would double the API server's work). A change made to the
    /// child since arrives as a watch event that requeues the owner.
    pub async fn apply<T>(
        &self,
        ns: &str,
        obj: &T,
        cached: Option<&T>,
    ) -> Result<Result<(), String>, Error>
    where
        T: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Debug
            + Serialize
            + DeserializeOwned,
    {
        let api: Api<T> = self.api(ns);
        let name = obj.name_any();
        let kind = T::kind(&());
        let owner = obj.owner_references().first().map(|r| r.uid.as_str());
        if let Some(cached) = cached
            && common::is_owned_by(cached.meta(), owner)
            && common::holds(
                &serde_json::to_value(cached).unwrap_or_default(),
                &serde_json::to_value(obj).unwrap_or_default(),
            )
        {
            return Ok(Ok(()));
        }
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube(format!("unable to get {kind} {ns}/{name}"), e))?;
        if let Some(existing) = existing
            && !common::is_owned_by(existing.meta(), owner)
        {
            return Ok(Err(format!(
                "{kind} {name:?} exists and is not owned by the manager"
            )));
        }
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch(&name, &pp, &Patch::Apply(obj)).await {
            Ok(_) => Ok(Ok(())),
            Err(e) if matches!(api_status(&e), Some(400 | 403 | 422)) => {
                Ok(Err(format!("{kind} {name:?} refused: {}", api_message(&e))))
            }
            Err(e) => Err(Error::kube(
                format!("unable to apply {kind} {ns}/{name}"),
                e,
            )),
        }
    }

    /// Creates a pod; an already existing one is fine (the watch will show it). The inner
    /// error is the API server's refusal, to report as the owner's `Error`.
    pub async fn create_pod(&self, pod: &Pod) -> Result<Result<(), String>, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        // Api::create, but reading the answer as the slim PodView: the manager never
        // parses a whole k8s-openapi Pod (see pod.rs).
        let create = async {
            let body = serde_json::to_vec(pod).map_err(kube::Error::SerdeError)?;
            let mut req = kube::core::Request::new(Pod::url_path(&(), Some(&ns)))
                .create(&PostParams::default(), body)
                .map_err(kube::Error::BuildRequest)?;
            req.extensions_mut().insert("create");
            self.client.request::<PodView>(req).await
        };
        match create.await {
            Ok(_) => {
                tracing::info!(pod = %name, namespace = %ns, "pod created");
                Ok(Ok(()))
            }
            // Ours and not yet in the cache is fine; someone else's is never touched.
            Err(e) if api_status(&e) == Some(409) => {
                let owner = pod.owner_references().first().map(|r| r.uid.as_str());
                let existing = self
                    .api::<PodView>(&ns)
                    .get_opt(&name)
                    .await
                    .map_err(|e| Error::kube(format!("unable to get pod {ns}/{name}"), e))?;
                match existing {
                    Some(p) if !common::is_owned_by(&p.metadata, owner) => Ok(Err(format!(
                        "pod {name:?} exists and is not owned by the manager"
                    ))),
                    _ => Ok(Ok(())),
                }
            }
            Err(e) if matches!(api_status(&e), Some(400 | 403 | 422)) => {
                Ok(Err(format!("pod {name:?} refused: {}", api_message(&e))))
            }
            Err(e) => Err(Error::kube(format!("unable to create pod {ns}/{name}"), e)),
        }
    }

    /// Deletes exactly this pod (by uid): a pod recreated meanwhile is left alone.
    pub async fn delete_pod(&self, pod: &PodView) -> Result<(), Error> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api::<PodView>(&ns).delete(&name, &dp).await {
            Ok(_) => {
                tracing::info!(pod = %name, namespace = %ns, "pod deleted");
                Ok(())
            }
            Err(e) if matches!(api_status(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(Error::kube(format!("unable to delete pod {ns}/{name}"), e)),
        }
    }

    pub async fn get_secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, Error> {
        self.api::<Secret>(ns)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("unable to get Secret {ns}/{name}"), e))
    }

    /// Writes `status` through the status subresource when it differs from `old`, and
    /// records a Kubernetes Event when the phase changes.
    pub async fn write_status<K, S>(
        &self,
        obj: &K,
        old: Option<&S>,
        status: &S,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned,
        S: PhaseStatus,
    {
        if old == Some(status) {
            return Ok(());
        }
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        let kind = K::kind(&());
        // A merge patch of the whole status: unset fields are sent as null and removed.
        let patch = serde_json::json!({ "status": status });
        match self
            .api::<K>(&ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Deleted meanwhile: nothing to report on.
            Err(e) if api_status(&e) == Some(404) => return Ok(()),
            Err(e) => {
                return Err(Error::kube(
                    format!("unable to update status of {kind} {ns}/{name}"),
                    e,
                ));
            }
        }
        let phase = status.phase_name().unwrap_or_default();
        if old.and_then(|o| o.phase_name()).as_deref() != Some(phase.as_str()) {
            let message = status.message_text();
            tracing::info!(%kind, namespace = %ns, %name, %phase, status_message = %message, "phase changed");
            let event = KubeEvent {
                type_: if status.is_warning() {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: phase.clone(),
                note: Some(common::cap_utf8(message, 1000).to_owned()).filter(|m| !m.is_empty()),
                action: "Reconcile".into(),
                secondary: None,
            };
            self.publish(obj, event).await;
        }
        Ok(())
    }

    async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, event: KubeEvent) {
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::debug!(error = %e, "unable to record event");
        }
    }

    pub(crate) fn key_of<K: ResourceExt>(kind: Kind, obj: &K) -> Key {
        Key::new(kind, obj.namespace().unwrap_or_default(), obj.name_any())
    }

    /// Queues the Agents of `ns` for which `uses` holds.
    fn queue_agents(&self, ns: &str, uses: impl Fn(&Agent) -> bool) {
        for a in self.agents.in_namespace(ns) {
            if uses(&a) {
                self.queue.add(Self::key_of(Kind::Agent, &*a));
            }
        }
    }

    /// Maps a change of any watched object to the custom resources to reconcile.
    fn on_agent(&self, a: &Agent, removed: bool) {
        self.queue.add(Self::key_of(Kind::Agent, a));
        let ns = a.namespace().unwrap_or_default();
        // Runtime agent counts; there are few Runtimes per namespace.
        for rt in self.runtimes.in_namespace(&ns) {
            self.queue.add(Self::key_of(Kind::Runtime, &*rt));
        }
        // The Tools whose demand this change moved: listed before or now, not both.
        let now = if removed {
            Vec::new()
        } else {
            demand::demanded(a)
        };
        for tool in self.demand.update(&ns, &a.name_any(), now) {
            self.queue.add(Key::new(Kind::Tool, ns.clone(), tool));
        }
    }

    fn on_tool(&self, t: &Tool, removed: bool) {
        self.queue.add(Self::key_of(Kind::Tool, t));
        // Agents read a Tool's existence and spec (its endpoint), never its status.
        if !self.demand.tool_changed(t, removed) {
            return;
        }
        let name = t.name_any();
        self.queue_agents(&t.namespace().unwrap_or_default(), |a| {
            a.spec.tools.contains(&name)
        });
    }

    fn on_runtime(&self, rt: &Runtime) {
        self.queue.add(Self::key_of(Kind::Runtime, rt));
        let name = rt.name_any();
        self.queue_agents(&rt.namespace().unwrap_or_default(), |a| {
            a.spec.runtime.reference.as_deref() == Some(&name)
        });
    }

    fn on_memory(&self, m: &Memory) {
        self.queue.add(Self::key_of(Kind::Memory, m));
        let name = m.name_any();
        self.queue_agents(&m.namespace().unwrap_or_default(), |a| {
            a.spec.memory.contains(&name)
        });
    }

    fn on_child<K: ResourceExt>(&self, obj: &K) {
        if let Some((kind, owner)) = common::controller_of(obj.meta()) {
            let ns = obj.namespace().unwrap_or_default();
            self.queue.add(Key::new(kind, ns, owner));
        }
    }

    /// Queues every custom resource.
    pub fn queue_all(&self) {
        for a in self.agents.all() {
            self.queue.add(Self::key_of(Kind::Agent, &*a));
        }
        for t in self.tools.all() {
            self.queue.add(Self::key_of(Kind::Tool, &*t));
        }
        for r in self.runtimes.all() {
            self.queue.add(Self::key_of(Kind::Runtime, &*r));
        }
        for m in self.memories.all() {
            self.queue.add(Self::key_of(Kind::Memory, &*m));
        }
    }
}

/// The API server's own words, for a status message.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Objects per list request of the initial (and every re-) list.
const LIST_PAGE: u32 = 100;

/// Starts one watch per type and watched namespace, feeding the caches and the queue.
/// `notify` hears every change too (the connector's deltas).
pub fn spawn_watches(
    ctx: &Arc<Context>,
    notify: Arc<dyn Fn(Changed) + Send + Sync>,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    let scopes: Vec<Option<String>> = if ctx.config.namespaces.is_empty() {
        vec![None]
    } else {
        ctx.config.namespaces.iter().cloned().map(Some).collect()
    };
    for scope in scopes {
        macro_rules! watch {
            ($ty:ty, $cache:ident, $selector:expr, |$c:ident, $o:ident, $r:ident| $on:expr) => {{
                let api: Api<$ty> = match &scope {
                    Some(ns) => Api::namespaced(ctx.client.clone(), ns),
                    None => Api::all(ctx.client.clone()),
                };
                // Small pages: a list's page is held whole, at full size, before the
                // cache slims its objects; 500 pods (the default) is most of the peak.
                let mut wc = watcher::Config::default().page_size(LIST_PAGE);
                if let Some(sel) = $selector {
                    wc = wc.labels(sel);
                }
                let ctx2 = ctx.clone();
                let notify = notify.clone();
                tasks.spawn(cache::drive(
                    api,
                    wc,
                    scope.clone(),
                    ctx.$cache.clone(),
                    ctx.synced.clone(),
                    move |change| {
                        let ($o, $r) = match &change {
                            Change::Upsert(o) => (&***o, false),
                            Change::Remove(o) => (&***o, true),
                        };
                        let $c = &ctx2;
                        $on;
                        if let Some(changed) = $o.changed($r) {
                            notify(changed);
                        }
                    },
                ));
            }};
        }
        watch!(Agent, agents, None::<&str>, |c, o, r| c.on_agent(o, r));
        watch!(Tool, tools, None::<&str>, |c, o, r| c.on_tool(o, r));
        watch!(Runtime, runtimes, None::<&str>, |c, o, _r| c.on_runtime(o));
        watch!(Memory, memories, None::<&str>, |c, o, _r| c.on_memory(o));
        watch!(PodView, pods, Some(common::MANAGED_SELECTOR), |c, o, _r| c
            .on_child(o));
        watch!(
            Service,
            services,
            Some(common::MANAGED_SELECTOR),
            |c, o, _r| c.on_child(o)
        );
        watch!(
            Secret,
            secrets,
            Some(common::MANAGED_SELECTOR),
            |c, o, _r| c.on_child(o)
        );
    }
}

/// Runs the workers and the periodic resync until the returned tasks are dropped.
///
/// Workers start only once every watch has listed: a reconcile that ran on half-filled
/// caches would see a Runtime, Tool or Memory "not found" and flap a steady Agent to
/// `Error` (and its Tools' demand to zero) at every restart and failover. What the
/// watches saw meanwhile waits in the queue.
pub fn spawn_workers(ctx: &Arc<Context>, tasks: &mut tokio::task::JoinSet<()>) {
    for _ in 0..WORKERS {
        let ctx = ctx.clone();
        tasks.spawn(async move {
            ctx.synced.wait().await;
            loop {
                let key = ctx.queue.next().await;
                run_one(&ctx, key).await;
            }
        });
    }
    let ctx = ctx.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(RESYNC);
        tick.tick().await;
        loop {
            tick.tick().await;
            ctx.queue_all();
        }
    });
}

async fn run_one(ctx: &Arc<Context>, key: Key) {
    let span = tracing::info_span!("reconcile", kind = %key.kind, namespace = %key.namespace, object = %key.name);
    let result = async {
        let (ns, name) = (&key.namespace, &key.name);
        match key.kind {
            Kind::Agent => match ctx.agents.get(ns, name) {
                Some(o) => agent::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
            Kind::Tool => match ctx.tools.get(ns, name) {
                Some(o) => tool::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
            Kind::Runtime => match ctx.runtimes.get(ns, name) {
                Some(o) => runtime::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
            Kind::Memory => match ctx.memories.get(ns, name) {
                Some(o) => memory::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
        }
    }
    .instrument(span)
    .await;
    ctx.metrics.reconciled(key.kind, result.is_ok());
    match result {
        Ok(outcome) => {
            ctx.queue.done(&key, true);
            if let Some(after) = outcome.requeue {
                ctx.queue.add_after(key, after);
            }
        }
        Err(err) => {
            let after = ctx
                .queue
                .done(&key, false)
                .unwrap_or(Duration::from_secs(1));
            tracing::warn!(%key, error = %err, retry_in_ms = after.as_millis() as u64, "reconcile failed");
            ctx.queue.add_after(key, after);
        }
    }
}
