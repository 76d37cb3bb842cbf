//! Pieces every reconciler shares: labels, ownership, the spec hash that decides when a
//! pod must be recreated, pod health, and the `Ready` condition. All pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use kube::Resource;

use crate::crd::{Kind, PhaseStatus, Reason};
use crate::store::{MANAGED_BY, MANAGER, PodView};

/// The most of a pod's context summary an Agent's status shows: the store cuts it to
/// this when it reads the pod (TRUST.md §3).
pub use crate::store::CONTEXT_SUMMARY_MAX;
/// Hash of what the pod was built from; a different hash means "recreate".
pub use crate::store::SPEC_HASH;

/// Labels on every object created for custom resource `name` of `kind`.
pub fn labels(kind: Kind, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (kind.label_key().to_owned(), name.to_owned()),
    ])
}

/// Metadata for a child `name` of `owner`: namespace, labels, controller owner reference.
pub fn child_meta<K>(owner: &K, kind: Kind, name: String) -> ObjectMeta
where
    K: Resource<DynamicType = ()>,
{
    let owner_ref = OwnerReference {
        controller: Some(true),
        block_owner_deletion: Some(true),
        ..owner.owner_ref(&()).unwrap_or_default()
    };
    ObjectMeta {
        name: Some(name),
        namespace: owner.meta().namespace.clone(),
        labels: Some(labels(
            kind,
            owner.meta().name.as_deref().unwrap_or_default(),
        )),
        owner_references: Some(vec![owner_ref]),
        ..ObjectMeta::default()
    }
}

/// 64-bit FNV-1a: stable across Rust releases (unlike `DefaultHasher`), so an upgrade of
/// the manager does not recreate every pod.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Hex hash of a value's JSON form.
/// The container securityContext of every container the manager creates: what the
/// restricted Pod Security Standard asks for, so agents and tools run in a namespace that
/// enforces it. A fixed non-root uid (65532, distroless's `nonroot`) rather than only
/// `runAsNonRoot`: many images default to root and would otherwise not start at all. A
/// Runtime whose image truly needs more says so in its own `securityContext`.
pub fn restricted_security() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod-level half: seccomp `RuntimeDefault` for every container that does not say
/// otherwise. Nothing else at pod level, so a Runtime's own container securityContext
/// (e.g. root) is not contradicted by a pod-level `runAsNonRoot`.
pub fn restricted_pod_security() -> PodSecurityContext {
    PodSecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn spec_hash<T: serde::Serialize>(value: &T) -> String {
    let json = serde_json::to_vec(value).unwrap_or_default();
    format!("{:016x}", fnv1a(&json))
}

pub fn pod_spec_hash(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(SPEC_HASH)
        .map(String::as_str)
}

/// Container waiting reasons that mean the pod will not come up without a change, and
/// the condition reason each becomes.
const ERROR_REASONS: [(&str, Reason); 6] = [
    ("CrashLoopBackOff", Reason::CrashLoopBackOff),
    ("ImagePullBackOff", Reason::ImagePullBackOff),
    ("ErrImagePull", Reason::ErrImagePull),
    (
        "CreateContainerConfigError",
        Reason::CreateContainerConfigError,
    ),
    ("CreateContainerError", Reason::CreateContainerError),
    ("InvalidImageName", Reason::InvalidImageName),
];

/// What a pod's status says about the workload. Every state but `Ready` and `Succeeded`
/// carries its cause (the condition reason) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Running and every container ready.
    Ready,
    /// On its way; the message says what it waits for.
    Pending(Reason, String),
    /// Stuck: a container cannot start or keeps crashing.
    Error(Reason, String),
    Succeeded,
    Failed(Reason, String),
}

pub fn pod_health(pod: &PodView) -> Health {
    let Some(status) = pod.status.as_ref() else {
        return Health::Pending(Reason::Scheduling, "pod created, not yet scheduled".into());
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    match phase {
        "Succeeded" => return Health::Succeeded,
        "Failed" => {
            let reason = match status.reason.as_deref() {
                Some("Evicted") => Reason::Evicted,
                _ => Reason::PodFailed,
            };
            let why = status
                .reason
                .clone()
                .or_else(|| terminated_reason(pod))
                .unwrap_or_else(|| "pod failed".into());
            return Health::Failed(reason, why);
        }
        _ => {}
    }
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for cs in containers {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let waiting = w.reason.as_deref().unwrap_or_default();
            if let Some((_, reason)) = ERROR_REASONS.iter().find(|(r, _)| *r == waiting) {
                let msg = w.message.as_deref().unwrap_or_default();
                return Health::Error(
                    *reason,
                    format!("container {}: {waiting}: {msg}", cs.name)
                        .trim_end_matches([' ', ':'])
                        .to_owned(),
                );
            }
        }
    }
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    if phase == "Running" && !statuses.is_empty() && statuses.iter().all(|c| c.ready) {
        return Health::Ready;
    }
    // Say what it is waiting for, most specific first.
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(c) = unschedulable {
        return Health::Pending(
            Reason::Unschedulable,
            format!(
                "unschedulable: {}",
                c.message.as_deref().unwrap_or_default()
            ),
        );
    }
    let waiting = statuses.iter().find_map(|cs| {
        let w = cs.state.as_ref()?.waiting.as_ref()?;
        Some(format!(
            "container {}: {}",
            cs.name,
            w.reason.as_deref().unwrap_or("waiting")
        ))
    });
    if let Some(w) = waiting {
        return Health::Pending(Reason::ContainerCreating, w);
    }
    if let Some(cs) = statuses.iter().find(|c| !c.ready) {
        return Health::Pending(
            Reason::ContainersNotReady,
            format!("container {} not ready", cs.name),
        );
    }
    // Scheduled (or not yet), no container status yet.
    let reason = if phase == "Pending" {
        Reason::Scheduling
    } else {
        Reason::ContainersNotReady
    };
    Health::Pending(reason, format!("pod {phase}"))
}

fn terminated_reason(pod: &PodView) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find_map(|cs| {
            let t = cs.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code != 0).then(|| {
                format!(
                    "container {} exited with code {} ({})",
                    cs.name,
                    t.exit_code,
                    t.reason.as_deref().unwrap_or("Error")
                )
            })
        })
}

/// The `Ready` condition for a new status, as the Kubernetes API conventions have it:
/// status `True`/`False`, or `Unknown` while the object is being deleted (its state is
/// then no longer the manager's to say); a CamelCase `reason` that names the cause; the
/// `observedGeneration` it was computed from; `lastTransitionTime` kept while the status
/// (True/False/Unknown) does not flip, so an unchanged status compares equal and no write
/// happens, and a change of reason alone does not move it. An empty message becomes the
/// reason: Kubernetes 1.20 turns `""` inside a custom resource into `null` on a merge
/// patch and then refuses it as not a string.
pub fn ready_condition(
    previous: &[Condition],
    ready: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
) -> Vec<Condition> {
    let status = match (ready, reason) {
        (_, Reason::Deleting) => "Unknown",
        (true, _) => "True",
        (false, _) => "False",
    };
    let since = previous
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    let reason = reason.as_str();
    vec![Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: if message.is_empty() { reason } else { message }.into(),
        observed_generation: generation,
        last_transition_time: since,
    }]
}

/// A kind's status: `own` (the kind's own fields) with the four every kind shares set
/// one way: the generation it was computed from, the phase, the message, and the `Ready`
/// condition (true in the kind's ready phase, its reason the cause; its transition time
/// kept while unchanged).
pub fn status<S: PhaseStatus>(
    meta: &ObjectMeta,
    old: Option<&S>,
    phase: S::Phase,
    reason: Reason,
    message: String,
    mut own: S,
) -> S {
    let conditions = ready_condition(
        old.map_or(&[][..], PhaseStatus::conditions),
        phase == S::READY,
        reason,
        &message,
        meta.generation,
    );
    own.set_head(meta.generation, phase, message, conditions);
    own
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> PodView {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    /// pod status → health, with the condition reason each state becomes.
    #[test]
    fn health_table() {
        use Reason::*;
        let cs = |state: &str| {
            format!(
                "{{metadata: {{name: p}}, status: {{phase: Pending, containerStatuses: [{{name: runtime, ready: false, restartCount: 0, image: i, imageID: '', state: {state}}}]}}}}"
            )
        };
        let cases = [
            (
                "metadata: {name: p}".to_owned(),
                Health::Pending(Scheduling, "pod created, not yet scheduled".into()),
            ),
            (
                "{metadata: {name: p}, status: {phase: Pending}}".to_owned(),
                Health::Pending(Scheduling, "pod Pending".into()),
            ),
            (
                "{metadata: {name: p}, status: {phase: Running, containerStatuses: [{name: a, ready: true, restartCount: 0, image: i, imageID: '', state: {running: {}}}]}}".to_owned(),
                Health::Ready,
            ),
            (
                cs("{waiting: {reason: ImagePullBackOff, message: 'Back-off pulling image x'}}"),
                Health::Error(
                    ImagePullBackOff,
                    "container runtime: ImagePullBackOff: Back-off pulling image x".into(),
                ),
            ),
            (
                cs("{waiting: {reason: ErrImagePull}}"),
                Health::Error(ErrImagePull, "container runtime: ErrImagePull".into()),
            ),
            (
                cs("{waiting: {reason: CrashLoopBackOff, message: 'back-off 10s'}}"),
                Health::Error(
                    CrashLoopBackOff,
                    "container runtime: CrashLoopBackOff: back-off 10s".into(),
                ),
            ),
            (
                cs("{waiting: {reason: CreateContainerConfigError, message: 'secret \"s\" not found'}}"),
                Health::Error(
                    CreateContainerConfigError,
                    "container runtime: CreateContainerConfigError: secret \"s\" not found".into(),
                ),
            ),
            (
                cs("{waiting: {reason: CreateContainerError}}"),
                Health::Error(CreateContainerError, "container runtime: CreateContainerError".into()),
            ),
            (
                cs("{waiting: {reason: InvalidImageName}}"),
                Health::Error(InvalidImageName, "container runtime: InvalidImageName".into()),
            ),
            (
                cs("{waiting: {reason: ContainerCreating}}"),
                Health::Pending(ContainerCreating, "container runtime: ContainerCreating".into()),
            ),
            (
                cs("{waiting: {reason: PodInitializing}}"),
                Health::Pending(ContainerCreating, "container runtime: PodInitializing".into()),
            ),
            (
                "{metadata: {name: p}, status: {phase: Running, containerStatuses: [{name: a, ready: false, restartCount: 0, image: i, imageID: '', state: {running: {}}}]}}".to_owned(),
                Health::Pending(ContainersNotReady, "container a not ready".into()),
            ),
            (
                "{metadata: {name: p}, status: {phase: Succeeded}}".to_owned(),
                Health::Succeeded,
            ),
            (
                "{metadata: {name: p}, status: {phase: Failed, containerStatuses: [{name: a, ready: false, restartCount: 0, image: i, imageID: '', state: {terminated: {exitCode: 3, reason: Error}}}]}}".to_owned(),
                Health::Failed(PodFailed, "container a exited with code 3 (Error)".into()),
            ),
            (
                "{metadata: {name: p}, status: {phase: Failed, reason: Evicted}}".to_owned(),
                Health::Failed(Evicted, "Evicted".into()),
            ),
            (
                "{metadata: {name: p}, status: {phase: Pending, conditions: [{type: PodScheduled, status: 'False', reason: Unschedulable, message: '0/1 nodes are available: 1 Insufficient memory.'}]}}".to_owned(),
                Health::Pending(
                    Unschedulable,
                    "unschedulable: 0/1 nodes are available: 1 Insufficient memory.".into(),
                ),
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(pod_health(&pod(&yaml)), want, "{yaml}");
        }
    }

    #[test]
    fn every_reason_is_camel_case_and_parses_back() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            let s = r.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(s.starts_with(|c: char| c.is_ascii_uppercase()), "{s}");
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
            assert_eq!(format!("{r:?}"), s);
            assert_eq!(Reason::parse(s), Some(r));
        }
        assert!(Reason::ErrImagePull.same_cause(Reason::ImagePullBackOff));
        assert!(!Reason::ErrImagePull.same_cause(Reason::CrashLoopBackOff));
    }

    #[test]
    fn ready_condition_keeps_transition_time_while_unchanged() {
        let first = ready_condition(&[], false, Reason::Creating, "m", Some(1));
        let again = ready_condition(&first, false, Reason::Creating, "m", Some(1));
        assert_eq!(first, again);
        // Another cause, the same status: the transition time stays.
        let moved = ready_condition(&first, false, Reason::Unschedulable, "u", Some(2));
        assert_eq!(
            (moved[0].reason.as_str(), moved[0].observed_generation),
            ("Unschedulable", Some(2))
        );
        assert_eq!(moved[0].last_transition_time, first[0].last_transition_time);
        let flipped = ready_condition(&first, true, Reason::Running, "", Some(1));
        assert_eq!(
            (flipped[0].status.as_str(), flipped[0].message.as_str()),
            ("True", "Running")
        );
        let deleting = ready_condition(&flipped, true, Reason::Deleting, "d", Some(1));
        assert_eq!(deleting[0].status, "Unknown");
    }
}
