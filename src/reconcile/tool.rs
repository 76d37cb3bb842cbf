//! Tool → on-demand pod `<tool>-tool` and Service `<tool>`.
//!
//! `plan` is pure: from the Tool, its current pod, its demand (how many Agents want it,
//! when the last one left) and the time, it says what to do with the pod and which phase
//! the Tool is in. `reconcile` does the I/O around it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodSpec, Probe, Service, ServicePort, ServiceSpec,
    TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::common;
use super::offer;
use super::podsecurity::{self, Level};
use super::problem::{self, Problem};
use super::{Context, Outcome, demand};
use crate::cluster::{Error, Refused};
use crate::crd::{Kind, Reason, Tool, ToolPhase, ToolStatus, tool_pod_name as pod_name};
use crate::store::Health;
use crate::store::{Oversized, PodView};

/// The message of a Tool without users and without a pod.
pub const IDLE: &str = "idle: no Agent uses this tool";

/// `http://<tool>.<namespace>.svc:<port>`.
pub fn endpoint(tool: &Tool) -> String {
    format!(
        "http://{}.{}.svc:{}",
        tool.name_any(),
        tool.namespace().unwrap_or_default(),
        tool.spec.port
    )
}

/// What a schema cannot check: the name must serve as a Service name (DNS-1035 label).
/// And first, that the store kept the spec (TRUST.md §3): a stub makes no Service.
pub fn validate(tool: &Tool) -> Result<(), Problem> {
    problem::check_spec_size(&tool.metadata)?;
    let name = tool.name_any();
    let dns1035 = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !dns1035 {
        return Err(Problem::NotAServiceName { name });
    }
    if tool.spec.image.trim().is_empty() {
        return Err(Problem::NoImage);
    }
    if !(1..=65535).contains(&tool.spec.port) {
        return Err(Problem::PortOutOfRange(tool.spec.port));
    }
    Ok(())
}

fn selector(tool: &str) -> BTreeMap<String, String> {
    common::labels(Kind::Tool, tool)
}

pub fn desired_pod(tool: &Tool) -> Pod {
    let name = tool.name_any();
    let port = tool.spec.port;
    let spec = PodSpec {
        containers: vec![Container {
            name: "tool".into(),
            image: Some(tool.spec.image.clone()),
            command: tool.spec.command.clone(),
            args: tool.spec.args.clone(),
            env: tool.spec.env.clone(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: port,
                ..Default::default()
            }]),
            // Ready means the endpoint accepts connections, not merely that a process runs.
            readiness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(port),
                    ..Default::default()
                }),
                period_seconds: Some(2),
                ..Default::default()
            }),
            security_context: Some(common::restricted_security()),
            ..Default::default()
        }],
        security_context: Some(common::restricted_pod_security()),
        ..Default::default()
    };
    let mut meta = common::child_meta(tool, Kind::Tool, pod_name(&name));
    meta.annotations = Some(BTreeMap::from([(
        common::SPEC_HASH.to_owned(),
        common::spec_hash(&spec),
    )]));
    Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    }
}

pub fn desired_service(tool: &Tool) -> Service {
    let name = tool.name_any();
    Service {
        metadata: common::child_meta(tool, Kind::Tool, name.clone()),
        spec: Some(ServiceSpec {
            selector: Some(selector(&name)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: tool.spec.port,
                target_port: Some(IntOrString::Int(tool.spec.port)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A Tool's demand, as the caches say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Agents of the namespace that list the Tool and want to run.
    pub users: u32,
    /// When the last user left while the pod ran (`status.idleSince`), if recorded.
    pub idle_since: Option<Timestamp>,
}

/// What to do with the pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PodAction {
    Keep,
    Create,
    Delete,
    /// Keep the pod and look again at this time: the end of the idle grace.
    WaitUntil(Timestamp),
}

/// The decision for one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub action: PodAction,
    pub phase: ToolPhase,
    /// The cause: the `Ready` condition's and the Event's reason.
    pub reason: Reason,
    pub message: String,
    /// `status.idleSince` to record: set while the pod is kept only by the grace.
    pub idle_since: Option<Timestamp>,
}

fn plan_of(
    action: PodAction,
    phase: ToolPhase,
    reason: Reason,
    message: impl Into<String>,
) -> Plan {
    Plan {
        action,
        phase,
        reason,
        message: message.into(),
        idle_since: None,
    }
}

fn problem(why: &Problem) -> Plan {
    plan_of(
        PodAction::Keep,
        ToolPhase::Error,
        why.reason(),
        why.to_string(),
    )
}

/// The phase, reason and message a pod's health gives, or `None` when it ended.
fn by_health(tool: &Tool, pod: &PodView) -> Option<(ToolPhase, Reason, String)> {
    match crate::store::pod_health(pod) {
        Health::Ready => Some((
            ToolPhase::Ready,
            Reason::Serving,
            format!("serving at {}", endpoint(tool)),
        )),
        Health::Pending(r, m) => Some((ToolPhase::Pending, r, m)),
        Health::Error(r, m) => Some((ToolPhase::Error, r, m)),
        Health::Succeeded | Health::Failed(..) => None,
    }
}

/// `t` rounded up to a whole second: `status.idleSince` is a `metav1.Time`, stored to the
/// second, and rounding down would shorten the grace.
pub fn ceil_second(t: Timestamp) -> Timestamp {
    let whole = Timestamp::from_second(t.as_second()).unwrap_or(t);
    if whole < t {
        whole.checked_add(SignedDuration::from_secs(1)).unwrap_or(t)
    } else {
        whole
    }
}

/// Decides the pod action and the phase. `current` is the Tool's own pod `<tool>-tool`
/// (owned by it), if any; `now` is the wall clock.
///
/// The pod is wanted while the Tool is not disabled and has users or is `alwaysOn`.
/// Unwanted, a running pod is kept `idleSeconds` after the last user left (from
/// `demand.idle_since`, or from now when none is recorded), then deleted; a Tool with
/// neither users nor pod is `Pending` with the message [`IDLE`].
///
/// A pod that would break the namespace's Pod Security Standards `level` (TRUST.md §1)
/// is not created, and the Tool is `Error`: as for an invalid spec, the pod it has is
/// left as it is until the spec changes.
pub fn plan(
    tool: &Tool,
    current: Option<&PodView>,
    demand: Demand,
    now: Timestamp,
    level: Level,
) -> Plan {
    decide(tool, &desired_pod(tool), current, demand, now, level)
}

/// [`plan`] with the pod the Tool should have, `desired`, built.
fn decide(
    tool: &Tool,
    desired: &Pod,
    current: Option<&PodView>,
    demand: Demand,
    now: Timestamp,
    level: Level,
) -> Plan {
    use PodAction::*;
    use ToolPhase::*;
    if tool.metadata.deletion_timestamp.is_some() {
        return plan_of(Keep, Pending, Reason::Deleting, "deletion requested");
    }
    if let Err(why) = validate(tool) {
        return problem(&why);
    }
    if let Err(violation) = podsecurity::check(level, desired) {
        return problem(&violation.into());
    }
    let live = current.filter(|p| p.metadata.deletion_timestamp.is_none());
    // The pod was built from another spec than the Tool's now.
    let stale =
        current.is_some_and(|p| p.spec_hash.as_deref() != common::pod_spec_hash(&desired.metadata));
    if tool.spec.disabled {
        return plan_of(
            if live.is_some() { Delete } else { Keep },
            Disabled,
            Reason::Disabled,
            "disabled",
        );
    }
    let wanted = tool.spec.always_on || demand.users > 0;
    if !wanted {
        return unwanted(tool, live, stale, demand, now);
    }
    let Some(pod) = current else {
        return plan_of(Create, Pending, Reason::Creating, "creating pod");
    };
    if live.is_none() {
        return plan_of(
            Keep,
            Pending,
            Reason::PodTerminating,
            "waiting for the previous pod to terminate",
        );
    }
    if stale {
        return plan_of(
            Delete,
            Pending,
            Reason::Recreating,
            "spec changed: recreating pod",
        );
    }
    match by_health(tool, pod) {
        Some((phase, reason, message)) => plan_of(Keep, phase, reason, message),
        // A tool is a server: if it ends, it is replaced.
        None => plan_of(
            Delete,
            Pending,
            Reason::Replacing,
            "pod ended: replacing it",
        ),
    }
}

/// The plan of a Tool no one uses and not always on: a live pod is kept through the
/// idle grace, then removed; none is created.
fn unwanted(
    tool: &Tool,
    live: Option<&PodView>,
    stale: bool,
    demand: Demand,
    now: Timestamp,
) -> Plan {
    use PodAction::*;
    use ToolPhase::*;
    let Some(pod) = live else {
        return plan_of(Keep, Pending, Reason::Idle, IDLE);
    };
    // The grace: from the recorded start, unless it lies ahead of this clock (another
    // replica's clock ran ahead): then from now, so the pod never waits past a full
    // grace from the first look.
    let start = ceil_second(now);
    let since = demand.idle_since.filter(|s| *s <= start).unwrap_or(start);
    let grace = SignedDuration::from_secs(tool.spec.idle_seconds.clamp(0, 86_400));
    let until = since.checked_add(grace).unwrap_or(since);
    // Ended: not replaced for no one.
    let Some((phase, reason, state)) = by_health(tool, pod) else {
        return plan_of(Delete, Pending, Reason::Idle, IDLE);
    };
    // Past the grace, or built from an old spec (not rebuilt for no one).
    if now >= until || stale {
        return plan_of(Delete, Pending, Reason::Idle, IDLE);
    }
    Plan {
        action: WaitUntil(until),
        phase,
        reason,
        message: format!("{IDLE}: pod removed at {until} unless one returns ({state})"),
        idle_since: Some(since),
    }
}

/// Brings a Tool's Service and pod to what its spec and its users ask, and writes the
/// status they give it.
pub async fn reconcile(ctx: &Context, tool: Arc<Tool>) -> Result<Outcome, Error> {
    let ns = tool.namespace().unwrap_or_default();
    let name = tool.name_any();
    let uid = tool.uid();
    let current = ctx.store.owned_pod(&ns, &pod_name(&name), uid.as_deref());
    let demand = demand_of(ctx, &tool);
    let now = ctx.now();
    let level = ctx.pod_security(&ns);
    let mut plan = plan(&tool, current.as_deref(), demand, now, level);
    // The Secrets its env reads must be offered (TRUST.md §2); a pod being taken down
    // (disabled, idle) is taken down all the same.
    if tool.metadata.deletion_timestamp.is_none()
        && plan.action != PodAction::Delete
        && let Err(why) = offer::env(ctx, &ns, tool.spec.env.as_deref())
    {
        plan = problem(&why);
    }
    if let Some(why) = apply_service(ctx, &tool).await? {
        // Leave the pod alone and the grace as it was; say why.
        plan = Plan {
            idle_since: demand.idle_since,
            ..problem(&why.into())
        };
    }
    if plan.action == PodAction::Create
        && let Some(held) = name_held(ctx, &tool)
    {
        plan = held;
    }
    let requeue = act(ctx, &tool, &mut plan, current.as_deref(), now).await?;
    let idle_since = plan.idle_since;
    let status = status_of(&tool, plan, current.as_deref(), demand);
    ctx.kube
        .write_status(&*tool, tool.status.as_ref(), &status)
        .await?;
    ctx.demand.wrote_idle_since(&tool, idle_since);
    Ok(Outcome { requeue })
}

/// The Tool's users, and since when it has had none.
fn demand_of(ctx: &Context, tool: &Tool) -> Demand {
    // Demand comes from the Agent cache, complete here: workers start only once every
    // watch has listed (spawn_workers), so "no users" is never a guess.
    let ns = tool.namespace().unwrap_or_default();
    let recorded = tool
        .status
        .as_ref()
        .and_then(|s| s.idle_since.as_ref())
        .map(|t| t.0);
    Demand {
        users: demand::users(&ctx.store.agents.in_namespace(&ns), &tool.name_any()),
        // Our own last write wins over a cache that may not hold it yet.
        idle_since: ctx.demand.idle_since(tool).unwrap_or(recorded),
    }
}

/// Applies the Tool's Service, which exists whether or not the pod runs (not for a Tool
/// being deleted or invalid): why the API server refused it, if it did.
async fn apply_service(ctx: &Context, tool: &Tool) -> Result<Option<Refused>, Error> {
    if tool.metadata.deletion_timestamp.is_some() || validate(tool).is_err() {
        return Ok(None);
    }
    let ns = tool.namespace().unwrap_or_default();
    let cached = ctx.store.services.get(&ns, &tool.name_any());
    Ok(ctx
        .kube
        .apply(&ns, &desired_service(tool), cached.as_deref())
        .await?
        .refused())
}

/// The plan when the pod's name is held by another of our pods (an Agent named
/// `<tool>-tool`, or an earlier Tool's pod going): whoever has it keeps it; a watch
/// event of that pod requeues this Tool.
fn name_held(ctx: &Context, tool: &Tool) -> Option<Plan> {
    let ns = tool.namespace().unwrap_or_default();
    let name = tool.name_any();
    let holder = ctx.store.pods.get(&ns, &pod_name(&name))?;
    Some(
        if crate::store::controller_of(&holder.metadata) == Some((Kind::Tool, &name)) {
            plan_of(
                PodAction::Keep,
                ToolPhase::Pending,
                Reason::PodTerminating,
                "waiting for the pod of an earlier Tool of this name to go",
            )
        } else {
            problem(&problem::pod_not_ours(Kind::Tool, &holder))
        },
    )
}

/// Carries out the plan's pod action: when to look again (the idle grace's end, or
/// slowly after the API server refused the pod, which makes the plan that problem).
async fn act(
    ctx: &Context,
    tool: &Tool,
    plan: &mut Plan,
    current: Option<&PodView>,
    now: Timestamp,
) -> Result<Option<Duration>, Error> {
    match plan.action {
        PodAction::Create => {
            if let Some(why) = ctx.kube.create_pod(&desired_pod(tool)).await?.refused() {
                // The API server refused the pod itself; retry slowly (a quota may free up).
                *plan = problem(&why.into());
                return Ok(Some(Duration::from_secs(60)));
            }
        }
        PodAction::Delete => {
            if let Some(pod) = current {
                ctx.kube.delete_pod(pod).await?;
            }
        }
        PodAction::WaitUntil(at) => {
            let left = Duration::try_from(at.duration_since(now)).unwrap_or_default();
            // A little past the end, so the pass that wakes finds the grace over.
            return Ok(Some(left + Duration::from_millis(50)));
        }
        PodAction::Keep => {}
    }
    Ok(None)
}

/// The status the plan, the Tool's pod and its demand give it.
fn status_of(tool: &Tool, plan: Plan, current: Option<&PodView>, demand: Demand) -> ToolStatus {
    let phase = plan.phase;
    let valid = phase != ToolPhase::Error || current.is_some();
    // A stub's port is the default, not the user's: the endpoint stays as last written.
    let serving_at = if Oversized::of(&tool.metadata).is_some() {
        tool.status.as_ref().and_then(|s| s.endpoint.clone())
    } else {
        valid.then(|| endpoint(tool))
    };
    let keeps_pod = phase != ToolPhase::Disabled
        && plan.action != PodAction::Delete
        && current.is_some_and(|p| p.metadata.deletion_timestamp.is_none());
    let own = ToolStatus {
        pod_name: keeps_pod.then(|| pod_name(&tool.name_any())),
        endpoint: serving_at,
        users: Some(i64::from(demand.users)),
        idle_since: plan.idle_since.map(Time),
        ..Default::default()
    };
    common::status(
        &tool.metadata,
        tool.status.as_ref(),
        phase,
        plan.reason,
        plan.message,
        own,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, port: i32) -> Tool {
        let mut t: Tool = serde_saphyr::from_str(&format!(
            "{{apiVersion: autonomic.sh/v1alpha1, kind: Tool, metadata: {{name: '{name}', namespace: team-a}}, spec: {{image: 'srv:1', port: {port}}}}}"
        ))
        .unwrap();
        t.metadata.uid = Some("u".into());
        t
    }

    #[test]
    fn endpoint_service_and_pod() {
        let t = tool("search", 9000);
        assert_eq!(endpoint(&t), "http://search.team-a.svc:9000");
        let svc = desired_service(&t);
        assert_eq!(svc.metadata.name.as_deref(), Some("search"));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.ports.unwrap()[0].port, 9000);
        let pod = desired_pod(&t);
        assert_eq!(pod.metadata.name.as_deref(), Some("search-tool"));
        // The Service selects exactly the tool's pod.
        let pod_labels = pod.metadata.labels.unwrap();
        for (k, v) in spec.selector.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// TRUST.md §3: a Tool kept as a stub (its spec over the bound) makes nothing, even
    /// in use: no pod, no Service (`validate` refuses it); a running pod is left as it
    /// is; `Error`, `SpecTooLarge`, both sizes in the message.
    #[test]
    fn a_spec_over_the_bound_makes_nothing_and_keeps_a_running_pod() {
        let store = crate::store::Store::with_max_spec_bytes(512);
        let mut big = tool("search", 8080);
        big.spec.args = Some(vec!["x".repeat(1000)]);
        let bytes = serde_json::to_vec(&big.spec).unwrap().len();
        let stub = store.tools.insert(big);
        let message = format!(
            "spec is {bytes} bytes as JSON, over the bound of 512 (AUTONOMIC_MAX_SPEC_BYTES)"
        );
        assert_eq!(validate(&stub).unwrap_err().to_string(), message);
        let ready = pod(&tool("search", 8080), READY);
        for current in [None, Some(&ready)] {
            let demand = Demand {
                users: 1,
                idle_since: None,
            };
            assert_eq!(
                plan(&stub, current, demand, at(0), Level::Restricted),
                plan_of(
                    PodAction::Keep,
                    ToolPhase::Error,
                    Reason::SpecTooLarge,
                    message.clone()
                )
            );
        }
        // Under the bound, the same Tool is valid.
        assert!(validate(&store.tools.insert(tool("search", 8080))).is_ok());
    }

    /// The Tool's own pod as the cache would hold it once it reports `status_yaml`.
    fn pod(t: &Tool, status_yaml: &str) -> PodView {
        let mut served = serde_json::to_value(desired_pod(t)).unwrap();
        served["status"] = serde_saphyr::from_str(status_yaml).unwrap();
        serde_json::from_value(served).unwrap()
    }

    const READY: &str = "{phase: Running, containerStatuses: [{name: tool, ready: true}]}";
    const CRASH: &str = "{phase: Running, containerStatuses: [{name: tool, ready: false, state: {waiting: {reason: CrashLoopBackOff}}}]}";

    /// (what, tool, pod, users, recorded idle start, now, action, phase, message part,
    /// idle start recorded).
    type Case<'a> = (
        &'a str,
        &'a Tool,
        Option<&'a PodView>,
        u32,
        Option<i64>,
        Timestamp,
        PodAction,
        ToolPhase,
        &'a str,
        Option<i64>,
    );

    /// The decision table: (what, tool, pod, users, recorded idle start, now) → (action,
    /// phase, message part, idle start recorded). Times are seconds from an origin.
    #[test]
    fn the_demand_decides_the_pod() {
        use PodAction::*;
        use ToolPhase::*;
        let base = tool("search", 8080);
        let with = |f: &dyn Fn(&mut Tool)| {
            let mut t = base.clone();
            f(&mut t);
            t
        };
        let always = with(&|t| t.spec.always_on = true);
        let disabled = with(&|t| t.spec.disabled = true);
        let no_grace = with(&|t| t.spec.idle_seconds = 0);
        let invalid = with(&|t| t.spec.port = 0);
        let deleting = with(&|t| t.metadata.deletion_timestamp = Some(Time(at(0))));
        let ready = pod(&base, READY);
        let crash = pod(&base, CRASH);
        let failed = pod(&base, "{phase: Failed}");
        let mut going = ready.clone();
        going.metadata.deletion_timestamp = Some(Time(at(0)));
        let stale = pod(&with(&|t| t.spec.image = "srv:0".into()), READY);
        let serving = "serving at http://search.team-a.svc:8080";
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("no users, no pod: idle", &base, None, 0, None, at(0), Keep, Pending, IDLE, None),
            ("a user: create", &base, None, 1, None, at(0), Create, Pending, "creating pod", None),
            ("in use and ready", &base, Some(&ready), 2, None, at(0), Keep, Ready, serving, None),
            ("a user returns within the grace: same pod, grace over", &base, Some(&ready), 1, Some(0), at(10), Keep, Ready, serving, None),
            ("the last user left: the grace starts now", &base, Some(&ready), 0, None, at(0), WaitUntil(at(300)), Ready, "pod removed at", Some(0)),
            ("mid-second: the start rounds up, never shortening the grace", &base, Some(&ready), 0, None, at(0) + SignedDuration::from_millis(400), WaitUntil(at(301)), Ready, IDLE, Some(1)),
            ("within the grace: the recorded start holds (a restart decides the same)", &base, Some(&ready), 0, Some(0), at(299), WaitUntil(at(300)), Ready, IDLE, Some(0)),
            ("the grace is over: delete", &base, Some(&ready), 0, Some(0), at(300), Delete, Pending, IDLE, None),
            ("a start ahead of this clock: from now instead", &base, Some(&ready), 0, Some(5000), at(0), WaitUntil(at(300)), Ready, IDLE, Some(0)),
            ("idleSeconds 0: at once", &no_grace, Some(&ready), 0, None, at(0), Delete, Pending, IDLE, None),
            ("a crashing pod in its grace is still kept", &base, Some(&crash), 0, Some(0), at(1), WaitUntil(at(300)), Error, "CrashLoopBackOff", Some(0)),
            ("an ended pod in its grace is not replaced", &base, Some(&failed), 0, Some(0), at(1), Delete, Pending, IDLE, None),
            ("an old spec in its grace is not rebuilt", &base, Some(&stale), 0, Some(0), at(1), Delete, Pending, IDLE, None),
            ("removed pod still terminating, no users", &base, Some(&going), 0, None, at(0), Keep, Pending, IDLE, None),
            ("previous pod terminating, a user", &base, Some(&going), 1, None, at(0), Keep, Pending, "waiting for the previous pod", None),
            ("in use, the pod ended: replace", &base, Some(&failed), 1, None, at(0), Delete, Pending, "pod ended", None),
            ("in use, spec changed: recreate", &base, Some(&stale), 1, None, at(0), Delete, Pending, "spec changed", None),
            ("alwaysOn without users: create", &always, None, 0, None, at(0), Create, Pending, "creating pod", None),
            ("alwaysOn: no grace runs", &always, Some(&ready), 0, Some(0), at(999), Keep, Ready, serving, None),
            ("disabled wins over users", &disabled, Some(&ready), 3, None, at(0), Delete, Disabled, "disabled", None),
            ("disabled, no pod", &disabled, None, 3, Some(0), at(0), Keep, Disabled, "disabled", None),
            ("invalid spec", &invalid, None, 1, None, at(0), Keep, Error, "port", None),
            ("deletion requested", &deleting, Some(&ready), 1, None, at(0), Keep, Pending, "deletion requested", None),
        ];
        for (what, t, current, users, since, now, action, phase, part, recorded) in cases {
            let demand = Demand {
                users,
                idle_since: since.map(at),
            };
            let p = plan(t, current, demand, now, Level::Restricted);
            assert_eq!(
                (p.action, p.phase, p.idle_since),
                (action, phase, recorded.map(at)),
                "{what}: {p:?}"
            );
            assert!(p.message.contains(part), "{what}: {:?}", p.message);
        }
        // The message of a Tool without users or pod is exactly the spec's.
        let idle = plan(
            &base,
            None,
            Demand {
                users: 0,
                idle_since: None,
            },
            at(0),
            Level::Restricted,
        );
        assert_eq!(idle.message, IDLE);
    }

    /// The cause each decision gives, for the `Ready` condition and the Events.
    #[test]
    fn reasons_follow_the_cause() {
        let base = tool("search", 8080);
        let mut disabled = base.clone();
        disabled.spec.disabled = true;
        let mut deleting = base.clone();
        deleting.metadata.deletion_timestamp = Some(Time(at(0)));
        let mut invalid = base.clone();
        invalid.spec.image = " ".into();
        let ready = pod(&base, READY);
        let crash = pod(&base, CRASH);
        let stale = {
            let mut old = base.clone();
            old.spec.image = "srv:0".into();
            pod(&old, READY)
        };
        let failed = pod(&base, "{phase: Failed}");
        let demand = |users| Demand {
            users,
            idle_since: None,
        };
        let cases = [
            (&base, None, 0, Reason::Idle),
            (&base, None, 1, Reason::Creating),
            (&base, Some(&ready), 1, Reason::Serving),
            (&base, Some(&ready), 0, Reason::Serving),
            (&base, Some(&crash), 1, Reason::CrashLoopBackOff),
            (&base, Some(&stale), 1, Reason::Recreating),
            (&base, Some(&failed), 1, Reason::Replacing),
            (&disabled, Some(&ready), 1, Reason::Disabled),
            (&deleting, Some(&ready), 1, Reason::Deleting),
            (&invalid, None, 1, Reason::NoImage),
        ];
        for (i, (t, current, users, want)) in cases.into_iter().enumerate() {
            let p = plan(t, current, demand(users), at(0), Level::Restricted);
            assert_eq!(p.reason, want, "case {i}: {p:?}");
        }
    }

    /// TRUST.md §1: a Tool's pod passes every level; one that would not (no Tool field
    /// reaches a host namespace today, so the pod is built by hand) is not created, and a
    /// pod the Tool has stays, even one built from another spec.
    #[test]
    fn a_pod_that_breaks_the_level_is_not_made() {
        let t = tool("search", 8080);
        for level in Level::ALL {
            assert_eq!(
                podsecurity::check(level, &desired_pod(&t)),
                Ok(()),
                "{level}"
            );
        }
        let mut bad = desired_pod(&t);
        bad.spec.as_mut().unwrap().host_network = Some(true);
        let want = |users| Demand {
            users,
            idle_since: None,
        };
        let ready = pod(&t, READY);
        for current in [None, Some(&ready)] {
            let p = decide(&t, &bad, current, want(1), at(0), Level::Baseline);
            assert_eq!(
                (p.action, p.phase, p.reason),
                (
                    PodAction::Keep,
                    ToolPhase::Error,
                    Reason::PodSecurityViolation
                ),
                "{current:?}"
            );
            assert_eq!(
                p.message,
                "pod: spec.hostNetwork=true is not allowed under baseline"
            );
        }
        // The admin's `privileged`: made.
        let p = decide(&t, &bad, None, want(1), at(0), Level::Privileged);
        assert_eq!(p.action, PodAction::Create);
    }

    #[test]
    fn spec_defaults() {
        let t = tool("x", 80);
        assert_eq!((t.spec.always_on, t.spec.idle_seconds), (false, 300));
        let d = crate::crd::ToolSpec::default();
        assert_eq!((d.port, d.idle_seconds, d.always_on), (8080, 300, false));
        assert_eq!(ceil_second(at(7)), at(7));
        assert_eq!(ceil_second(at(7) + SignedDuration::from_nanos(1)), at(8));
    }

    #[test]
    fn names_that_cannot_be_services_are_refused() {
        for bad in ["1st", "a.b", "Upper", &"x".repeat(64), "trailing-"] {
            assert!(validate(&tool(bad, 80)).is_err(), "{bad}");
        }
        assert!(validate(&tool(&"x".repeat(63), 80)).is_ok());
        let err = validate(&tool("ok", 0)).unwrap_err();
        assert_eq!(
            (err.to_string().as_str(), err.reason()),
            ("spec.port 0 is not in 1..65535", Reason::InvalidSpec)
        );
        assert_eq!(
            validate(&tool("9lives", 80)).unwrap_err().reason(),
            Reason::InvalidName
        );
    }
}
