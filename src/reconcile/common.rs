//! Pieces every reconciler shares: labels, ownership, the spec hash that decides when a
//! pod must be recreated, pod health, and the `Ready` condition. All pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use kube::Resource;

use crate::crd::{Kind, PhaseStatus, Reason};
use crate::store::{MANAGED_BY, MANAGER};

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

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn every_reason_is_camel_case_and_parses_back() {
        let mut seen = std::collections::HashSet::new();
        for &r in Reason::ALL {
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
