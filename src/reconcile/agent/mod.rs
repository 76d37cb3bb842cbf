//! Agent → pod (`agentlet` + `runtime`) and Secret `<agent>-agent`.
//!
//! `plan` is pure: from the Agent, what it references and its current pod, it says what
//! to do with the pod and which phase the Agent is in. `reconcile` does the I/O. The pod
//! and the Secret it wants are built in [`pod`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::common;
use super::offer;
use super::problem::{self, Problem};
use super::roll::Admit;
use super::{Context, Outcome};
use crate::cluster::{Error, Refused};
use crate::crd::{
    Agent, AgentPhase, AgentStatus, Key, Kind, Memory, MemoryRef, Reason, Runtime, Tool,
};
use crate::store::PodView;
use crate::store::{Health, pod_health};

mod pod;

pub use pod::{AgentletDefaults, admitted_pod, desired_pod, desired_secret, secret_name};

/// What the Agent references, looked up.
pub struct Refs {
    pub runtime: Option<Arc<Runtime>>,
    pub tools: Vec<Arc<Tool>>,
    pub memories: Vec<Arc<Memory>>,
}

/// Looks up what the Agent references; the error names what is missing or invalid.
pub fn resolve(agent: &Agent, ctx: &Context) -> Result<Refs, Problem> {
    let ns = agent.namespace().unwrap_or_default();
    // A stub's spec is the default, not the user's (TRUST.md §3): nothing to resolve.
    problem::check_spec_size(&agent.metadata)?;
    problem::check_label_value(Kind::Agent, &agent.name_any())?;
    let runtime = match &agent.spec.runtime.reference {
        None => None,
        Some(name) => {
            let rt = ctx
                .store
                .runtimes
                .get(&ns, name)
                .ok_or_else(|| Problem::RuntimeNotFound {
                    name: name.to_string(),
                    namespace: ns.clone(),
                })?;
            problem::check_reference_size(Kind::Runtime, name, &rt.metadata)?;
            if rt.spec.image.as_deref().is_none_or(str::is_empty)
                && agent.spec.runtime.image.is_none()
            {
                return Err(Problem::RuntimeInvalid {
                    name: name.to_string(),
                });
            }
            Some(rt)
        }
    };
    let tools = agent
        .spec
        .tools
        .iter()
        .map(|t| {
            ctx.store
                .tools
                .get(&ns, t)
                .ok_or_else(|| Problem::ToolNotFound {
                    name: t.clone(),
                    namespace: ns.clone(),
                })
                .and_then(|tool| {
                    problem::check_reference_size(Kind::Tool, t, &tool.metadata)?;
                    Ok(tool)
                })
        })
        .collect::<Result<_, _>>()?;
    let memories = agent
        .spec
        .memory
        .iter()
        .map(|m| {
            ctx.store
                .memories
                .get(&ns, m)
                .ok_or_else(|| Problem::MemoryNotFound {
                    name: m.clone(),
                    namespace: ns.clone(),
                })
                .and_then(|memory| {
                    problem::check_reference_size(Kind::Memory, m, &memory.metadata)?;
                    Ok(memory)
                })
        })
        .collect::<Result<_, _>>()?;
    // What the pod would be given: the ServiceAccount, the Secrets of its env and its
    // Runtime's (TRUST.md §2).
    offer::service_account(ctx, &ns, agent.spec.service_account_name.as_deref())?;
    offer::env(ctx, &ns, agent.spec.runtime.env.as_deref())?;
    if let Some(rt) = &runtime {
        offer::env(ctx, &ns, rt.spec.env.as_deref())?;
    }
    Ok(Refs {
        runtime,
        tools,
        memories,
    })
}
/// What to do with the pod.
#[derive(Debug, PartialEq)]
pub enum PodAction {
    Keep,
    Create,
    /// Delete the current pod (it is recreated on the next pass unless paused/terminal).
    Delete,
    /// Delete the current pod because it was built from another spec: a roll, which
    /// waits for a slot of the roll budget (`roll`).
    Recreate,
}

/// The decision for one pass.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub action: PodAction,
    pub phase: AgentPhase,
    /// The cause: the `Ready` condition's and the Event's reason.
    pub reason: Reason,
    pub message: String,
}

fn plan_of(
    action: PodAction,
    phase: AgentPhase,
    reason: Reason,
    message: impl Into<String>,
) -> Plan {
    Plan {
        action,
        phase,
        reason,
        message: message.into(),
    }
}

fn problem(why: &Problem) -> Plan {
    plan_of(
        PodAction::Keep,
        AgentPhase::Error,
        why.reason(),
        why.to_string(),
    )
}

/// Decides the pod action and the phase. `desired` is the pod the Agent should have or
/// why it cannot have one; `current` is the pod named after the Agent, if any.
pub fn plan(agent: &Agent, desired: &Result<Pod, Problem>, current: Option<&PodView>) -> Plan {
    use AgentPhase::*;
    if agent.metadata.deletion_timestamp.is_some() {
        return plan_of(
            PodAction::Keep,
            Terminating,
            Reason::Deleting,
            "deletion requested",
        );
    }
    let owned = current.filter(|p| crate::store::is_owned_by(&p.metadata, agent.uid().as_deref()));
    if let Some(p) = current
        && owned.is_none()
    {
        // The pod of an earlier Agent of this name, which the garbage collector removes.
        if crate::store::controller_of(&p.metadata) == Some((Kind::Agent, &agent.name_any())) {
            return plan_of(
                PodAction::Keep,
                Pending,
                Reason::PodTerminating,
                "waiting for the pod of an earlier Agent of this name to go",
            );
        }
        // Never deleted: whoever has the name keeps it.
        return problem(&problem::pod_not_ours(Kind::Agent, p));
    }
    let desired = match desired {
        // A broken spec leaves a running pod alone: a typo must not take an agent down.
        Err(why) => return problem(why),
        Ok(d) => d,
    };
    let terminating = owned.is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    if agent.spec.paused {
        let action = if owned.is_some() && !terminating {
            PodAction::Delete
        } else {
            PodAction::Keep
        };
        return plan_of(action, Paused, Reason::Paused, "paused");
    }
    let status = agent.status.as_ref();
    // A finished agent stays finished while its pod goes away, and is not restarted.
    if agent.finished() && (owned.is_none() || terminating) {
        let phase = status.and_then(|s| s.phase).unwrap_or(Succeeded);
        let message = status.and_then(|s| s.message.clone()).unwrap_or_default();
        let reason = status
            .and_then(|s| crate::crd::PhaseStatus::ready_reason(s))
            .and_then(Reason::parse)
            .unwrap_or(if phase == Succeeded {
                Reason::Completed
            } else {
                Reason::PodFailed
            });
        return plan_of(PodAction::Keep, phase, reason, message);
    }
    let Some(pod) = owned else {
        return plan_of(PodAction::Create, Pending, Reason::Creating, "creating pod");
    };
    if terminating {
        return plan_of(
            PodAction::Keep,
            Pending,
            Reason::PodTerminating,
            "waiting for the previous pod to terminate",
        );
    }
    if pod.spec_hash.as_deref() != common::pod_spec_hash(&desired.metadata) {
        return plan_of(
            PodAction::Recreate,
            Pending,
            Reason::Recreating,
            "spec changed: recreating pod",
        );
    }
    by_health(agent, pod)
}

/// The plan from the pod's health alone: the Agent's own pod, built from its spec.
pub fn by_health(agent: &Agent, pod: &PodView) -> Plan {
    use AgentPhase::*;
    let always = agent.spec.restart_policy == crate::crd::RestartPolicy::Always;
    match pod_health(pod) {
        Health::Ready => plan_of(
            PodAction::Keep,
            Active,
            Reason::Running,
            "running and ready",
        ),
        Health::Pending(r, m) => plan_of(PodAction::Keep, Pending, r, m),
        Health::Error(r, m) => plan_of(PodAction::Keep, Error, r, m),
        Health::Succeeded if !always => plan_of(
            PodAction::Keep,
            Succeeded,
            Reason::Completed,
            "all containers exited 0",
        ),
        Health::Failed(r, m) if !always => plan_of(PodAction::Keep, Failed, r, m),
        // restartPolicy Always never ends on its own: an evicted pod is replaced.
        Health::Succeeded | Health::Failed(..) => plan_of(
            PodAction::Delete,
            Pending,
            Reason::Replacing,
            "pod ended: replacing it",
        ),
    }
}

/// The plan of an Agent whose stale pod waits for a roll slot: the pod is kept, and so
/// are the phase and readiness it gives; the reason and message say it waits. A pod that
/// ended is replaced at once (nothing running is taken down).
pub fn wait_to_roll(agent: &Agent, pod: &PodView, max: usize) -> Plan {
    let now = by_health(agent, pod);
    if now.action != PodAction::Keep {
        return now;
    }
    Plan {
        reason: Reason::WaitingToRoll,
        message: format!("spec changed: waiting to roll ({max} at a time)"),
        ..now
    }
}

/// Whether an Agent in this phase is done with any roll: its new pod is `Active`, or it
/// no longer wants a pod.
fn roll_over(phase: AgentPhase) -> bool {
    use AgentPhase::*;
    matches!(phase, Active | Paused | Terminating | Succeeded | Failed)
}

/// How often an Agent waiting for a roll slot looks again, besides being woken when a
/// slot frees (the queue holds one wake-up per key, so this never piles up).
const ROLL_RECHECK: Duration = Duration::from_secs(30);

/// Brings an Agent's config Secret and pod to what its spec asks, within the roll
/// budget, and writes the status they give it.
pub async fn reconcile(ctx: &Context, agent: Arc<Agent>) -> Result<Outcome, Error> {
    let ns = agent.namespace().unwrap_or_default();
    let name = agent.name_any();
    let refs = resolve(&agent, ctx);
    let level = ctx.pod_security(&ns);
    let desired = refs.as_ref().map_err(Clone::clone).and_then(|r| {
        let agentlet = AgentletDefaults {
            image: ctx.config.agentlet_image.as_deref(),
            resources: &ctx.config.agentlet_resources,
        };
        admitted_pod(&agent, r.runtime.as_deref(), &agentlet, level)
    });
    let refused = write_config_secret(ctx, &agent, &refs).await?;
    let mut current = ctx.store.pods.get(&ns, &name);
    let mut plan = plan(&agent, &desired, current.as_deref());
    if let Some(why) = refused {
        // Without its config Secret the pod cannot start: leave the pod alone, say why.
        plan = problem(&why.into());
    }
    let mut requeue = None;
    if let Some(waiting) = roll_budget(ctx, &agent, &plan, current.as_deref()) {
        plan = waiting;
        requeue = Some(ROLL_RECHECK);
    }
    if let Some(slowly) = act(ctx, &agent, &desired, &mut plan, &mut current).await? {
        requeue = Some(slowly);
    }
    let status = status_of(&agent, &refs, plan, current.as_deref());
    ctx.kube
        .write_status(&*agent, agent.status.as_ref(), &status)
        .await?;
    Ok(Outcome { requeue })
}

/// Writes the Agent's config Secret when its references resolve and it is not being
/// deleted: why the API server refused it, if it did.
async fn write_config_secret(
    ctx: &Context,
    agent: &Agent,
    refs: &Result<Refs, Problem>,
) -> Result<Option<Refused>, Error> {
    let Ok(refs) = refs else { return Ok(None) };
    if agent.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let ns = agent.namespace().unwrap_or_default();
    let cached = ctx.store.secrets.get(&ns, &secret_name(&agent.name_any()));
    Ok(ctx
        .kube
        .write_secret(&desired_secret(agent, refs), cached.as_deref())
        .await?
        .refused())
}

/// The roll budget: a stale pod is recreated only with a slot, else the plan that waits
/// for one (returned). An Agent done rolling, or no longer waiting to, frees its slot
/// for the next in line.
fn roll_budget(
    ctx: &Context,
    agent: &Agent,
    plan: &Plan,
    current: Option<&PodView>,
) -> Option<Plan> {
    let key = Key::of(Kind::Agent, agent);
    if plan.action == PodAction::Recreate {
        if ctx.rolls.admit(&key) == Admit::Wait
            && let Some(pod) = current
        {
            return Some(wait_to_roll(agent, pod, ctx.rolls.max()));
        }
    } else if roll_over(plan.phase) || !ctx.rolls.is_rolling(&key) {
        // (Mid-roll and not yet Active, it keeps its slot.)
        for next in ctx.rolls.release(&key) {
            ctx.queue.add(next);
        }
    }
    None
}

/// Carries out the plan's pod action. A pod created replans from the pod as created; a
/// pod the API server refuses makes the plan the spec's problem, retried after the wait
/// returned.
async fn act(
    ctx: &Context,
    agent: &Agent,
    desired: &Result<Pod, Problem>,
    plan: &mut Plan,
    current: &mut Option<Arc<PodView>>,
) -> Result<Option<Duration>, Error> {
    match (&plan.action, desired) {
        (PodAction::Create, Ok(pod)) => {
            match ctx.kube.create_pod_read(pod).await? {
                // The status from the pod as created, not "creating pod": the pod's first
                // watch event then changes nothing, and no second status write follows.
                Ok(Some(created)) => {
                    *current = Some(Arc::new(created));
                    *plan = self::plan(agent, desired, current.as_deref());
                }
                Ok(None) => {}
                Err(why) => {
                    // The API server refused the pod itself (an invalid quantity, a
                    // quota): the spec's fault; retry slowly in case a quota frees up.
                    *plan = problem(&why.into());
                    return Ok(Some(Duration::from_secs(60)));
                }
            }
        }
        (PodAction::Delete | PodAction::Recreate, _) => {
            if let Some(pod) = current {
                ctx.kube.delete_pod(pod).await?;
            }
        }
        _ => {}
    }
    Ok(None)
}

/// The status the plan and the Agent's own pod (if `current` is it) give the Agent.
fn status_of(
    agent: &Agent,
    refs: &Result<Refs, Problem>,
    plan: Plan,
    current: Option<&PodView>,
) -> AgentStatus {
    let pod = current.filter(|p| crate::store::is_owned_by(&p.metadata, agent.uid().as_deref()));
    let old = agent.status.clone().unwrap_or_default();
    // The store cut the summary when it read the pod (TRUST.md §3); the cut here finds
    // nothing more to cut, and keeps a pod read otherwise (a test's) bounded too.
    let context_summary = pod
        .and_then(|p| p.context_summary.as_ref())
        .map(|s| crate::text::cap_utf8(s, common::CONTEXT_SUMMARY_MAX).into())
        .or(old.context_summary.clone());
    let keeps_pod = !matches!(plan.phase, AgentPhase::Paused) && pod.is_some();
    let own = AgentStatus {
        pod_name: keeps_pod.then(|| agent.name_any().into()),
        started_at: pod.and_then(|p| p.status.as_ref()?.start_time.clone()),
        memory_refs: memory_refs(agent, refs),
        context_summary,
        ..Default::default()
    };
    common::status(
        &agent.metadata,
        agent.status.as_ref(),
        plan.phase,
        plan.reason,
        plan.message,
        own,
    )
}

/// The Memories the Agent references, as resolved; the ones its status holds when they
/// do not resolve.
fn memory_refs(agent: &Agent, refs: &Result<Refs, Problem>) -> Box<[MemoryRef]> {
    let Ok(refs) = refs else {
        return agent
            .status
            .as_ref()
            .map(|s| s.memory_refs.clone())
            .unwrap_or_default();
    };
    refs.memories
        .iter()
        .map(|m| MemoryRef {
            name: m.name_any(),
            secret_name: m.status.as_ref().and_then(|s| s.secret_name.clone()),
            phase: m
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    pub(super) static RESOURCES: std::sync::LazyLock<ResourceRequirements> =
        std::sync::LazyLock::new(crate::config::default_agentlet_resources);

    pub(super) fn al(image: Option<&str>) -> AgentletDefaults<'_> {
        AgentletDefaults {
            image,
            resources: &RESOURCES,
        }
    }

    pub(super) fn agent(yaml: &str) -> Agent {
        let mut a: Agent = serde_saphyr::from_str(yaml).unwrap();
        a.metadata.uid = Some("uid-a".into());
        a.metadata.generation = Some(1);
        a
    }

    /// The desired pod as the cache would hold it once it reports `health_yaml`.
    fn owned_pod(a: &Agent, health_yaml: &str) -> PodView {
        let mut served =
            serde_json::to_value(desired_pod(a, None, &al(Some("agentlet:1"))).unwrap()).unwrap();
        served["status"] = serde_saphyr::from_str(health_yaml).unwrap();
        serde_json::from_value(served).unwrap()
    }

    fn d_never(a: &Agent) -> Result<Pod, Problem> {
        desired_pod(a, None, &al(Some("agentlet:1")))
    }

    pub(super) const BASE: &str = "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: triage, namespace: team-a}, spec: {runtime: {image: 'rt:1', command: [sleep, '1000']}}}";

    #[test]
    fn phases() {
        use AgentPhase::*;
        let a = agent(BASE);
        let d = desired_pod(&a, None, &al(Some("agentlet:1")));
        assert_eq!(plan(&a, &d, None).action, PodAction::Create);
        assert_eq!(plan(&a, &d, None).phase, Pending);

        let ready = owned_pod(
            &a,
            "{phase: Running, containerStatuses: [{name: a, ready: true, restartCount: 0, image: i, imageID: ''}, {name: b, ready: true, restartCount: 0, image: i, imageID: ''}]}",
        );
        assert_eq!(
            plan(&a, &d, Some(&ready)),
            Plan {
                action: PodAction::Keep,
                phase: Active,
                reason: Reason::Running,
                message: "running and ready".into()
            }
        );

        let crash = owned_pod(
            &a,
            "{phase: Running, containerStatuses: [{name: runtime, ready: false, restartCount: 3, image: i, imageID: '', state: {waiting: {reason: CrashLoopBackOff}}}]}",
        );
        let p = plan(&a, &d, Some(&crash));
        assert_eq!((p.phase, p.reason), (Error, Reason::CrashLoopBackOff));

        let mut paused = a.clone();
        paused.spec.paused = true;
        assert_eq!(plan(&paused, &d, Some(&ready)).action, PodAction::Delete);
        assert_eq!(
            plan(&paused, &d, None),
            Plan {
                action: PodAction::Keep,
                phase: Paused,
                reason: Reason::Paused,
                message: "paused".into()
            }
        );

        let mut deleting = a.clone();
        deleting.metadata.deletion_timestamp =
            Some(ready.metadata.creation_timestamp.clone().unwrap_or(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            ));
        let p = plan(&deleting, &d, Some(&ready));
        assert_eq!((p.phase, p.reason), (Terminating, Reason::Deleting));

        let mut stranger = ready.clone();
        stranger.metadata.owner_references = None;
        let p = plan(&a, &d, Some(&stranger));
        assert_eq!(
            (p.action, p.phase, p.reason),
            (PodAction::Keep, Error, Reason::PodNotOwned)
        );
        assert!(p.message.contains("not owned"));

        // A Tool's pod has the Agent's pod's name: left alone, the Tool named.
        let tool: crate::crd::Tool = serde_saphyr::from_str(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Tool, metadata: {name: triage, namespace: team-a, uid: t1}, spec: {image: i}}",
        )
        .unwrap();
        let mut taken = ready.clone();
        taken.metadata = super::super::tool::desired_pod(&tool).metadata;
        let p = plan(&a, &d, Some(&taken));
        assert_eq!(
            (p.action, p.phase, p.reason),
            (PodAction::Keep, Error, Reason::PodNameTaken)
        );
        assert!(
            p.message.contains("belongs to Tool \"triage\""),
            "{}",
            p.message
        );
        // The pod of an earlier Agent of the same name: wait for it to go.
        let mut earlier = ready.clone();
        earlier.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-old".into();
        let p = plan(&a, &d, Some(&earlier));
        assert_eq!(
            (p.action, p.phase, p.reason),
            (PodAction::Keep, Pending, Reason::PodTerminating)
        );

        let broken: Result<Pod, Problem> = Err(Problem::ToolNotFound {
            name: "x".into(),
            namespace: "team-a".into(),
        });
        assert_eq!(
            plan(&a, &broken, Some(&ready)),
            Plan {
                action: PodAction::Keep,
                phase: Error,
                reason: Reason::ToolNotFound,
                message: "Tool \"x\" not found in namespace team-a".into()
            }
        );
    }

    #[test]
    fn spec_change_recreates_and_terminal_pods_stay_down() {
        use AgentPhase::*;
        let a = agent(BASE);
        let old = owned_pod(&a, "{phase: Running}");
        let mut changed = a.clone();
        changed.spec.runtime.image = Some("rt:2".into());
        let d = desired_pod(&changed, None, &al(Some("agentlet:1")));
        let p = plan(&changed, &d, Some(&old));
        assert_eq!(
            (p.action, p.reason),
            (PodAction::Recreate, Reason::Recreating)
        );
        // Waiting for a roll slot: the pod, its phase and readiness are kept.
        let ready = owned_pod(
            &a,
            "{phase: Running, containerStatuses: [{name: a, ready: true, restartCount: 0, image: i, imageID: ''}]}",
        );
        assert_eq!(
            wait_to_roll(&changed, &ready, 5),
            Plan {
                action: PodAction::Keep,
                phase: Active,
                reason: Reason::WaitingToRoll,
                message: "spec changed: waiting to roll (5 at a time)".into()
            }
        );
        let crash = owned_pod(
            &a,
            "{phase: Running, containerStatuses: [{name: runtime, ready: false, restartCount: 3, image: i, imageID: '', state: {waiting: {reason: CrashLoopBackOff}}}]}",
        );
        let p = wait_to_roll(&changed, &crash, 5);
        assert_eq!((p.phase, p.reason), (Error, Reason::WaitingToRoll));
        // An ended pod takes nothing down: replaced at once.
        let ended = owned_pod(&a, "{phase: Failed, reason: Evicted}");
        assert_eq!(wait_to_roll(&changed, &ended, 5).action, PodAction::Delete);

        let mut never = a.clone();
        never.spec.restart_policy = crate::crd::RestartPolicy::Never;
        let d = desired_pod(&never, None, &al(Some("agentlet:1")));
        let done = owned_pod(&never, "{phase: Succeeded}");
        let p = plan(&never, &d, Some(&done));
        assert_eq!((p.phase, p.reason), (Succeeded, Reason::Completed));
        let failed = owned_pod(&never, "{phase: Failed}");
        let p = plan(&never, &d, Some(&failed));
        assert_eq!((p.phase, p.reason), (Failed, Reason::PodFailed));
        // Once finished, a vanished pod is not recreated for the same generation.
        never.status = Some(AgentStatus {
            phase: Some(Succeeded),
            observed_generation: Some(1),
            ..Default::default()
        });
        assert_eq!(plan(&never, &d, None).action, PodAction::Keep);
        let mut going = done.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(plan(&never, &d, Some(&going)).phase, Succeeded);
        // With Always, an evicted pod is replaced.
        let d = desired_pod(&a, None, &al(Some("agentlet:1")));
        let evicted = owned_pod(&a, "{phase: Failed, reason: Evicted}");
        let p = plan(&a, &d, Some(&evicted));
        assert_eq!((p.action, p.reason), (PodAction::Delete, Reason::Replacing));
        let mut evicted_never = never.clone();
        evicted_never.status = None;
        let evicted = owned_pod(&never, "{phase: Failed, reason: Evicted}");
        let p = plan(&evicted_never, &d_never(&never), Some(&evicted));
        assert_eq!((p.phase, p.reason), (Failed, Reason::Evicted));
    }

    /// TRUST.md §1: a template that breaks the level gives no pod and `Error`
    /// `PodSecurityViolation` naming the container and the field; a pod the Agent has
    /// is left as it is (not recreated from the new spec, not deleted).
    #[test]
    fn a_pod_that_breaks_the_level_is_not_made_and_a_running_one_stays() {
        use crate::reconcile::podsecurity::Level;
        let rt: Runtime = serde_saphyr::from_str(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Runtime, metadata: {name: rt, namespace: team-a}, spec: {image: 'rt:1', securityContext: {privileged: true}}}",
        )
        .unwrap();
        let a = agent(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: triage, namespace: team-a}, spec: {runtime: {ref: rt}}}",
        );
        let d = admitted_pod(&a, Some(&rt), &al(Some("agentlet:1")), Level::Restricted);
        let running = owned_pod(
            &agent(BASE),
            "{phase: Running, containerStatuses: [{name: a, ready: true, restartCount: 0, image: i, imageID: ''}]}",
        );
        for current in [None, Some(&running)] {
            assert_eq!(
                plan(&a, &d, current),
                Plan {
                    action: PodAction::Keep,
                    phase: AgentPhase::Error,
                    reason: Reason::PodSecurityViolation,
                    message: "container \"runtime\": securityContext.privileged=true is not allowed under restricted".into()
                }
            );
        }
        // Where the admin allows it, the same Agent gets its pod.
        let d = admitted_pod(&a, Some(&rt), &al(Some("agentlet:1")), Level::Privileged);
        assert_eq!(plan(&a, &d, None).action, PodAction::Create);
    }

    /// A reconcile context on `store` and the default configuration, whose client
    /// answers nothing: for what reads the store alone (`resolve`).
    fn context(store: crate::store::Store) -> Arc<Context> {
        use tokio_tungstenite::tungstenite::http::{Request, Response};
        let service = tower::service_fn(|_: Request<kube::client::Body>| async {
            Err::<Response<kube::client::Body>, _>(std::io::Error::other("no API server here"))
        });
        let client = kube::Client::new(service, "team-a");
        Context::new(
            Arc::new(store),
            crate::cluster::Kube::new(client, "test"),
            Arc::new(crate::config::Config::parse(|_| None).unwrap()),
            Arc::default(),
        )
    }

    /// TRUST.md §3: an Agent whose spec is over the bound is kept as a stub, and refused:
    /// `Error`, `SpecTooLarge`, both sizes in the message; no pod made, a running one
    /// left as it is. One that references a Runtime, Tool or Memory kept as a stub is
    /// refused too (its template, endpoint or backend is not known); under the bound,
    /// the same objects resolve.
    #[tokio::test]
    async fn a_spec_over_the_bound_is_refused_and_a_running_pod_stays() {
        let max = 1024;
        let ctx = context(crate::store::Store::with_max_spec_bytes(max));
        let mut big = agent(BASE);
        big.spec.runtime.args = Some(["x".repeat(2000)].into());
        let bytes = serde_json::to_vec(&big.spec).unwrap().len();
        let stub = ctx.store.agents.insert(big);
        let why = resolve(&stub, &ctx)
            .err()
            .expect("a stub resolves to nothing");
        let refused = Plan {
            action: PodAction::Keep,
            phase: AgentPhase::Error,
            reason: Reason::SpecTooLarge,
            message: format!(
                "spec is {bytes} bytes as JSON, over the bound of 1024 (AUTONOMIC_MAX_SPEC_BYTES)"
            ),
        };
        let running = owned_pod(
            &agent(BASE),
            "{phase: Running, containerStatuses: [{name: a, ready: true, restartCount: 0, image: i, imageID: ''}]}",
        );
        for current in [None, Some(&running)] {
            assert_eq!(plan(&stub, &Err(why.clone()), current), refused);
        }
        // Cut down below the bound, the same Agent resolves.
        let small = ctx.store.agents.insert(agent(BASE));
        assert!(resolve(&small, &ctx).is_ok());

        let fill = "x".repeat(2000);
        let object = |kind: &str, name: &str, spec: serde_json::Value| {
            serde_json::json!({"apiVersion": "autonomic.sh/v1alpha1", "kind": kind,
                               "metadata": {"name": name, "namespace": "team-a"}, "spec": spec})
        };
        fn of<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
            serde_json::from_value(v).unwrap()
        }
        ctx.store.runtimes.insert(of(object(
            "Runtime",
            "rt",
            serde_json::json!({"image": "rt:1", "args": [fill]}),
        )));
        ctx.store.tools.insert(of(object(
            "Tool",
            "t",
            serde_json::json!({"image": "t:1", "args": [fill]}),
        )));
        ctx.store.memories.insert(of(object(
            "Memory",
            "m",
            serde_json::json!({"backend": fill, "url": "redis://r"}),
        )));
        for (spec, kind, name) in [
            ("{runtime: {ref: rt}}", "Runtime", "rt"),
            ("{runtime: {image: 'rt:1'}, tools: [t]}", "Tool", "t"),
            ("{runtime: {image: 'rt:1'}, memory: [m]}", "Memory", "m"),
        ] {
            let a = ctx.store.agents.insert(agent(&format!(
                "{{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {{name: user, namespace: team-a}}, spec: {spec}}}"
            )));
            let why = resolve(&a, &ctx).err().expect(kind);
            assert_eq!(why.reason(), Reason::SpecTooLarge, "{kind}");
            assert_eq!(
                why.to_string(),
                format!(
                    "{kind} \"{name}\" is not reconciled: its spec is over the bound of AUTONOMIC_MAX_SPEC_BYTES"
                )
            );
        }
    }

    #[test]
    fn long_names_are_refused_with_a_reason() {
        let name = "a".repeat(64);
        let a = agent(&format!(
            "{{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {{name: {name}, namespace: n}}, spec: {{}}}}"
        ));
        let err = problem::check_label_value(Kind::Agent, &a.name_any()).unwrap_err();
        assert_eq!(err.reason(), Reason::InvalidName);
        assert!(err.to_string().contains("at most 63"), "{err}");
    }
}
