//! The reconcile loop: the watches' changes are routed to keys on a work queue; a few
//! workers take keys off it and run the reconciler of their kind, reading the
//! [`Store`] and writing through [`Kube`].

pub mod agent;
pub mod common;
pub mod demand;
pub mod memory;
pub mod offer;
pub mod podsecurity;
pub mod problem;
pub mod queue;
pub mod roll;
pub mod runtime;
pub mod tool;

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use tracing::Instrument;

use crate::cluster::Kube;
use crate::config::Config;
use crate::crd::{Agent, Key, Kind, Memory, Runtime, Tool};
use crate::metrics::Metrics;
use crate::store::watch::{Object, Seen};
use crate::store::{NamespaceView, Store, controller_of};
pub use queue::Queue;

/// Reconciles run at once, each with at most one request in flight: as many as the
/// bench's direct reference keeps (32). With 4, a burst of 1 000 Agents on hollow nodes
/// made pods at 20-30 a second, each reconcile waiting on its Secret's, pod's and
/// status's round trips in turn, and the Agents became Active 1.6× later than as many
/// bare pods Running; the queue keeps one key to one worker, whatever their number.
const WORKERS: usize = 32;
/// Every object is looked at again this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(300);

/// What a reconcile asks of the loop afterwards.
#[derive(Debug, Default)]
pub struct Outcome {
    pub requeue: Option<Duration>,
}

/// What a reconciler reads and writes through.
pub struct Context {
    pub store: Arc<Store>,
    pub kube: Kube,
    pub config: Arc<Config>,
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    /// What each Agent demanded last: which Tools an Agent change concerns.
    pub demand: demand::Index,
    /// The Agents mid-roll and those waiting for a slot (`AUTONOMIC_ROLL_MAX`).
    pub rolls: roll::Rolls,
}

impl Context {
    pub fn new(
        store: Arc<Store>,
        kube: Kube,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Context {
            rolls: roll::Rolls::new(config.roll_max),
            store,
            kube,
            config,
            queue: Default::default(),
            metrics,
            demand: Default::default(),
        })
    }

    /// The wall clock every reconcile reads: the one source of "now" for decisions that
    /// are persisted (a Tool's `status.idleSince`). The pure decisions take it as an
    /// argument, so their tests set it.
    pub fn now(&self) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::now()
    }

    /// The Pod Security Standards level of the pods made in namespace `ns` (TRUST.md §1):
    /// the namespace's label `autonomic.sh/pod-security` when it names a level, else
    /// `AUTONOMIC_POD_SECURITY` (also while the namespaces are not yet listed, or may
    /// not be).
    pub fn pod_security(&self, ns: &str) -> podsecurity::Level {
        let namespace = self.store.namespaces.get("", ns);
        NamespaceView::pod_security(namespace.as_deref(), self.config.pod_security)
    }

    /// Whether namespace `ns` lets its objects reference any ServiceAccount and Secret
    /// of its own (TRUST.md §2, label `autonomic.sh/references: any`).
    pub fn references_any(&self, ns: &str) -> bool {
        NamespaceView::references_any(self.store.namespaces.get("", ns).as_deref())
    }

    /// Queues the custom resources a watched object's change concerns.
    pub fn route(&self, seen: Seen<'_>) {
        match seen.object {
            Object::Agent(a) => self.on_agent(a, seen.removed),
            Object::Tool(t) => self.on_tool(t, seen.removed),
            Object::Runtime(r) => self.on_runtime(r),
            Object::Memory(m) => self.on_memory(m),
            Object::Pod(p) => self.on_pod(&p.metadata),
            Object::Service(s) => self.on_child(&s.metadata),
            Object::Secret(s) => self.on_child(&s.metadata),
            Object::OfferedSecret(s) => self.on_offer(s.namespace().as_deref()),
            Object::OfferedServiceAccount(sa) => self.on_offer(sa.namespace().as_deref()),
            Object::Namespace(n) => self.on_offer(n.metadata.name.as_deref()),
        }
    }

    /// Queues the Agents of `ns` for which `uses` holds.
    fn queue_agents(&self, ns: &str, uses: impl Fn(&Agent) -> bool) {
        for a in self.store.agents_where(ns, uses) {
            self.queue.add(Key::of(Kind::Agent, &*a));
        }
    }

    fn on_agent(&self, a: &Agent, removed: bool) {
        self.queue.add(Key::of(Kind::Agent, a));
        let ns = a.namespace().unwrap_or_default();
        // Runtime agent counts; there are few Runtimes per namespace.
        for rt in self.store.runtimes.in_namespace(&ns) {
            self.queue.add(Key::of(Kind::Runtime, &*rt));
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
        self.queue.add(Key::of(Kind::Tool, t));
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
        self.queue.add(Key::of(Kind::Runtime, rt));
        let name = rt.name_any();
        self.queue_agents(&rt.namespace().unwrap_or_default(), |a| {
            a.spec.runtime.reference.as_deref() == Some(&name)
        });
    }

    fn on_memory(&self, m: &Memory) {
        self.queue.add(Key::of(Kind::Memory, m));
        let name = m.name_any();
        self.queue_agents(&m.namespace().unwrap_or_default(), |a| {
            a.spec.memory.contains(&name)
        });
    }

    fn on_child(&self, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
        if let Some((kind, owner)) = controller_of(meta) {
            let ns = meta.namespace.clone().unwrap_or_default();
            self.queue.add(Key::new(kind, ns, owner));
        }
    }

    /// An offer made or withdrawn (TRUST.md §2), or a namespace's labels set (§1, §2):
    /// every object of the namespace that makes pods or copies a Secret looks again.
    /// Both change rarely; which objects they concern (an Agent's Runtime's env, say) is
    /// their plan's to know.
    fn on_offer(&self, ns: Option<&str>) {
        let ns = ns.unwrap_or_default();
        let keys = (self.store.agents.in_namespace(ns).iter())
            .map(|a| Key::of(Kind::Agent, &**a))
            .chain(
                self.store
                    .tools
                    .in_namespace(ns)
                    .iter()
                    .map(|t| Key::of(Kind::Tool, &**t)),
            )
            .chain(
                (self.store.memories.in_namespace(ns).iter()).map(|m| Key::of(Kind::Memory, &**m)),
            )
            .collect::<Vec<_>>();
        for key in keys {
            self.queue.add(key);
        }
    }

    /// A pod's owner, and whoever else wants a pod of that name: an Agent `x-tool` and a
    /// Tool `x` both want pod `x-tool`. The one without it waits for a change of that pod
    /// (its removal above all) to try again.
    fn on_pod(&self, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
        self.on_child(meta);
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        let owner = controller_of(meta);
        let mut rivals = vec![(Kind::Agent, name)];
        if let Some(tool) = name.strip_suffix("-tool") {
            rivals.push((Kind::Tool, tool));
        }
        for (kind, rival) in rivals {
            let exists = match kind {
                Kind::Agent => self.store.agents.get(&ns, rival).is_some(),
                _ => self.store.tools.get(&ns, rival).is_some(),
            };
            if exists && owner != Some((kind, rival)) {
                self.queue.add(Key::new(kind, ns.clone(), rival));
            }
        }
    }

    /// Queues every custom resource.
    pub fn queue_all(&self) {
        for key in self.store.keys() {
            self.queue.add(key);
        }
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
            ctx.store.synced.wait().await;
            work(&ctx.queue, |key| run_one(&ctx, key)).await
        });
    }
    // Each reconcile runs in a span of its own ("reconcile", the key): the workers need none.
    let ctx = ctx.clone();
    let resync = async move {
        let mut tick = tokio::time::interval(RESYNC);
        tick.tick().await;
        loop {
            tick.tick().await;
            ctx.queue_all();
        }
    };
    tasks.spawn(resync.instrument(tracing::info_span!("resync")));
}

/// One worker: takes keys off the queue and runs them, and lets the runtime's other tasks
/// run after each. A reconcile that finds nothing to change does no I/O and never waits,
/// and neither does taking a key while keys are waiting: without the yield, a start's
/// queue of every object held a runtime thread until it was drained, and the Lease's
/// renewal, the session's heartbeats and its deltas waited behind it (at 100 000 Agents,
/// a leader lost its Lease 35 s after its first snapshot and a delta waited 16 s).
async fn work<F: Future<Output = ()>>(queue: &Queue, mut run: impl FnMut(Key) -> F) -> ! {
    loop {
        let key = queue.next().await;
        run(key).await;
        tokio::task::yield_now().await;
    }
}

async fn run_one(ctx: &Arc<Context>, key: Key) {
    let span = tracing::info_span!("reconcile", kind = %key.kind, namespace = %key.namespace, object = %key.name);
    let started = tokio::time::Instant::now();
    let result = async {
        let (ns, name) = (&key.namespace, &key.name);
        match key.kind {
            Kind::Agent => match ctx.store.agents.get(ns, name) {
                Some(o) => agent::reconcile(ctx, o).await,
                None => {
                    // Gone: it no longer rolls nor waits to.
                    for next in ctx.rolls.release(&key) {
                        ctx.queue.add(next);
                    }
                    Ok(Outcome::default())
                }
            },
            Kind::Tool => match ctx.store.tools.get(ns, name) {
                Some(o) => tool::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
            Kind::Runtime => match ctx.store.runtimes.get(ns, name) {
                Some(o) => runtime::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
            Kind::Memory => match ctx.store.memories.get(ns, name) {
                Some(o) => memory::reconcile(ctx, o).await,
                None => Ok(Outcome::default()),
            },
        }
    }
    .instrument(span)
    .await;
    ctx.metrics
        .reconciled(key.kind, result.is_ok(), started.elapsed());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// A worker with a thousand keys that need no I/O lets another task run after each
    /// key, not after the thousand (one runtime thread, as a busy 2-core machine has in
    /// effect).
    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_lets_other_tasks_run_between_keys() {
        let queue = Arc::new(Queue::default());
        for n in 0..1000 {
            queue.add(Key::new(Kind::Agent, "ns", format!("a-{n}")));
        }
        let done = Arc::new(AtomicUsize::new(0));
        let worker = tokio::spawn({
            let (queue, done) = (queue.clone(), done.clone());
            async move {
                work(&queue, |key| {
                    queue.done(&key, true);
                    done.fetch_add(1, Relaxed);
                    std::future::ready(())
                })
                .await
            }
        });
        // Spawned after the worker, so it runs once the worker first gives way.
        let seen_at = tokio::spawn({
            let done = done.clone();
            async move { done.load(Relaxed) }
        })
        .await
        .unwrap();
        assert!(seen_at <= 1, "the other task ran after {seen_at} keys");
        worker.abort();
    }
}
