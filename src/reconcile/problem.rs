//! Why a custom resource cannot get what it asks for: the reconcile layer's domain
//! errors, one enum for the four kinds. `Display` is the status message; [`Problem::reason`]
//! the `Ready` condition's (and the Event's) reason. Transient failures (the API server
//! unreachable) are not here: they are `cluster::Error` and retried.

use super::podsecurity::Violation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cluster::Refused;
use crate::crd::{Kind, Reason};
use crate::store::{Oversized, PodView, controller_of};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error(
        "name {name:?} is {len} characters; a {kind} name must be at most 63 (it becomes a label value)",
        len = name.len()
    )]
    NameTooLong { kind: Kind, name: String },
    #[error(
        "name {name:?} cannot name a Service: use at most 63 lowercase letters, digits and '-', starting with a letter"
    )]
    NotAServiceName { name: String },
    #[error("Runtime {name:?} not found in namespace {namespace}")]
    RuntimeNotFound { name: String, namespace: String },
    #[error("Runtime {name:?} is invalid: no image")]
    RuntimeInvalid { name: String },
    #[error("Tool {name:?} not found in namespace {namespace}")]
    ToolNotFound { name: String, namespace: String },
    #[error("Memory {name:?} not found in namespace {namespace}")]
    MemoryNotFound { name: String, namespace: String },
    #[error("no runtime image: set spec.runtime.image or reference a Runtime that has one")]
    NoRuntimeImage,
    #[error(
        "no agentlet image: set spec.agentlet.image or AUTONOMIC_AGENTLET_IMAGE on the manager"
    )]
    NoAgentletImage,
    /// A Runtime's or Tool's `spec.image` is unset or blank.
    #[error("spec.image is not set")]
    NoImage,
    #[error("spec.port {0} is not in 1..65535")]
    PortOutOfRange(i32),
    #[error("set either spec.url or spec.secretRef, not both")]
    UrlAndSecretRef,
    #[error("set spec.url or spec.secretRef")]
    NoUrl,
    #[error("spec.url is empty")]
    EmptyUrl,
    #[error("Secret {secret:?} has no key {key:?}")]
    SecretKeyMissing { secret: String, key: String },
    #[error("key {key:?} of Secret {secret:?} is not UTF-8 text")]
    SecretNotText { secret: String, key: String },
    /// The pod's name is held by a pod of a stranger (not managed by us).
    #[error("pod {pod:?} exists and is not owned by this {kind}")]
    PodNotOwned { pod: String, kind: Kind },
    /// The pod's name is held by the pod of another of our custom resources.
    #[error(
        "pod {pod:?} belongs to {holder_kind} {holder:?}: the {kind}'s pod has the same name; it is left alone until the {holder_kind} gives it up"
    )]
    PodNameTaken {
        pod: String,
        kind: Kind,
        holder_kind: Kind,
        holder: String,
    },
    /// TRUST.md §2: a ServiceAccount not offered to agents, missing, or the manager's own.
    #[error("ServiceAccount {0:?}: not found or not offered to agents")]
    ServiceAccountNotAllowed(String),
    #[error("ServiceAccount {0:?} is the manager's own: never lent to agents")]
    ManagersServiceAccount(String),
    /// TRUST.md §2: one message for a missing Secret and one not offered, so that a
    /// tenant learns nothing of Secrets it was not offered.
    #[error("Secret {0:?}: not found or not offered to agents")]
    SecretNotAllowed(String),
    /// TRUST.md §1: the pod would break its namespace's Pod Security Standards level.
    #[error(transparent)]
    PodSecurity(#[from] Violation),
    /// TRUST.md §3: the spec is over `AUTONOMIC_MAX_SPEC_BYTES`; the store kept none of
    /// it, so nothing is made from it.
    #[error(
        "spec is {} bytes as JSON, over the bound of {} (AUTONOMIC_MAX_SPEC_BYTES)",
        .0.bytes,
        .0.max
    )]
    SpecTooLarge(Oversized),
    /// An Agent references a Runtime, Tool or Memory whose spec is over the bound: what
    /// the Agent would take from it (its template, endpoint, backend) is not known.
    #[error(
        "{kind} {name:?} is not reconciled: its spec is over the bound of AUTONOMIC_MAX_SPEC_BYTES"
    )]
    ReferenceTooLarge { kind: Kind, name: String },
    /// A write the API server refused, or a same-named child that is not ours.
    #[error(transparent)]
    Refused(#[from] Refused),
}

impl Problem {
    /// The cause, CamelCase, for the `Ready` condition and the Event.
    pub fn reason(&self) -> Reason {
        use Problem::*;
        match self {
            NameTooLong { .. } | NotAServiceName { .. } => Reason::InvalidName,
            RuntimeNotFound { .. } => Reason::RuntimeNotFound,
            RuntimeInvalid { .. } => Reason::RuntimeInvalid,
            ToolNotFound { .. } => Reason::ToolNotFound,
            MemoryNotFound { .. } => Reason::MemoryNotFound,
            NoRuntimeImage => Reason::NoRuntimeImage,
            NoAgentletImage => Reason::NoAgentletImage,
            NoImage => Reason::NoImage,
            PortOutOfRange(_) | UrlAndSecretRef | NoUrl | EmptyUrl => Reason::InvalidSpec,
            SecretKeyMissing { .. } | SecretNotText { .. } => Reason::SecretInvalid,
            PodNotOwned { .. } => Reason::PodNotOwned,
            PodNameTaken { .. } => Reason::PodNameTaken,
            PodSecurity(_) => Reason::PodSecurityViolation,
            ServiceAccountNotAllowed(_) | ManagersServiceAccount(_) => {
                Reason::ServiceAccountNotAllowed
            }
            SecretNotAllowed(_) => Reason::SecretNotAllowed,
            SpecTooLarge(_) | ReferenceTooLarge { .. } => Reason::SpecTooLarge,
            Refused(r) => refused_reason(r),
        }
    }
}

fn refused_reason(r: &Refused) -> Reason {
    match r {
        Refused::NotOurs { kind, .. } => match kind.as_str() {
            "Secret" => Reason::SecretNotOwned,
            "Service" => Reason::ServiceNotOwned,
            _ => Reason::PodNotOwned,
        },
        Refused::Invalid { kind, .. } => match kind.as_str() {
            "Secret" => Reason::SecretRejected,
            "Service" => Reason::ServiceRejected,
            _ => Reason::PodRejected,
        },
    }
}

/// Why pod `pod`, which has the name `kind`'s pod should have, is not its own: it is the
/// pod of another of our custom resources (an Agent `x-tool` and a Tool `x` both want
/// `x-tool`), or a stranger's.
pub fn pod_not_ours(kind: Kind, pod: &PodView) -> Problem {
    let name = pod.metadata.name.clone().unwrap_or_default();
    match controller_of(&pod.metadata) {
        Some((holder_kind, holder)) => Problem::PodNameTaken {
            pod: name,
            kind,
            holder_kind,
            holder: holder.to_owned(),
        },
        None => Problem::PodNotOwned { pod: name, kind },
    }
}

/// TRUST.md §3: whether the store kept the object, whose metadata is `meta`, as a stub
/// (its spec over `AUTONOMIC_MAX_SPEC_BYTES`). Every kind's validation asks this first:
/// a stub's spec is its kind's default, not the user's.
pub fn check_spec_size(meta: &ObjectMeta) -> Result<(), Problem> {
    match Oversized::of(meta) {
        Some(size) => Err(Problem::SpecTooLarge(size)),
        None => Ok(()),
    }
}

/// An Agent's reference `name` to a `kind` (Runtime, Tool, Memory) whose metadata is
/// `meta`: refused when the store kept that object as a stub.
pub fn check_reference_size(kind: Kind, name: &str, meta: &ObjectMeta) -> Result<(), Problem> {
    match Oversized::of(meta) {
        Some(_) => Err(Problem::ReferenceTooLarge {
            kind,
            name: name.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Label values (and so our names, which are label values) are at most 63 characters.
pub fn check_label_value(kind: Kind, name: &str) -> Result<(), Problem> {
    if name.len() > 63 {
        return Err(Problem::NameTooLong {
            kind,
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each problem: its message (kept from the String era: tests and users grep them)
    /// and its reason.
    #[test]
    fn messages_and_reasons() {
        let s = String::from;
        let cases = [
            (
                Problem::NameTooLong {
                    kind: Kind::Agent,
                    name: "a".repeat(64),
                },
                "a Agent name must be at most 63",
                Reason::InvalidName,
            ),
            (
                Problem::NotAServiceName { name: s("1x") },
                "cannot name a Service",
                Reason::InvalidName,
            ),
            (
                Problem::RuntimeNotFound {
                    name: s("py"),
                    namespace: s("n"),
                },
                "Runtime \"py\" not found in namespace n",
                Reason::RuntimeNotFound,
            ),
            (
                Problem::RuntimeInvalid { name: s("py") },
                "Runtime \"py\" is invalid: no image",
                Reason::RuntimeInvalid,
            ),
            (
                Problem::ToolNotFound {
                    name: s("t"),
                    namespace: s("n"),
                },
                "Tool \"t\" not found in namespace n",
                Reason::ToolNotFound,
            ),
            (
                Problem::MemoryNotFound {
                    name: s("m"),
                    namespace: s("n"),
                },
                "Memory \"m\" not found in namespace n",
                Reason::MemoryNotFound,
            ),
            (
                Problem::NoRuntimeImage,
                "no runtime image",
                Reason::NoRuntimeImage,
            ),
            (
                Problem::NoAgentletImage,
                "no agentlet image",
                Reason::NoAgentletImage,
            ),
            (Problem::NoImage, "spec.image is not set", Reason::NoImage),
            (
                Problem::PortOutOfRange(0),
                "spec.port 0 is not in 1..65535",
                Reason::InvalidSpec,
            ),
            (Problem::UrlAndSecretRef, "not both", Reason::InvalidSpec),
            (
                Problem::SecretKeyMissing {
                    secret: s("c"),
                    key: s("k"),
                },
                "Secret \"c\" has no key \"k\"",
                Reason::SecretInvalid,
            ),
            (
                Problem::PodNotOwned {
                    pod: s("x"),
                    kind: Kind::Agent,
                },
                "pod \"x\" exists and is not owned by this Agent",
                Reason::PodNotOwned,
            ),
            (
                Problem::PodNameTaken {
                    pod: s("x-tool"),
                    kind: Kind::Agent,
                    holder_kind: Kind::Tool,
                    holder: s("x"),
                },
                "pod \"x-tool\" belongs to Tool \"x\"",
                Reason::PodNameTaken,
            ),
            (
                Violation {
                    rule: "privileged",
                    level: crate::crd::PodSecurityLevel::Restricted,
                    place: super::super::podsecurity::Place::Container(s("runtime")),
                    field: s("securityContext.privileged=true"),
                    must: None,
                }
                .into(),
                "container \"runtime\": securityContext.privileged=true is not allowed under restricted",
                Reason::PodSecurityViolation,
            ),
            (
                Problem::SpecTooLarge(Oversized {
                    bytes: 1 << 20,
                    max: 256 << 10,
                }),
                "spec is 1048576 bytes as JSON, over the bound of 262144 (AUTONOMIC_MAX_SPEC_BYTES)",
                Reason::SpecTooLarge,
            ),
            (
                Problem::ReferenceTooLarge {
                    kind: Kind::Runtime,
                    name: s("big"),
                },
                "Runtime \"big\" is not reconciled: its spec is over the bound of AUTONOMIC_MAX_SPEC_BYTES",
                Reason::SpecTooLarge,
            ),
            (
                Refused::NotOurs {
                    kind: s("Secret"),
                    name: s("a-agent"),
                }
                .into(),
                "Secret \"a-agent\" exists and is not owned by the manager",
                Reason::SecretNotOwned,
            ),
            (
                Refused::Invalid {
                    kind: s("Pod"),
                    name: s("a"),
                    message: s("quantities must match"),
                }
                .into(),
                "Pod \"a\" refused: quantities must match",
                Reason::PodRejected,
            ),
            (
                Refused::Invalid {
                    kind: s("Service"),
                    name: s("t"),
                    message: s("no"),
                }
                .into(),
                "Service \"t\" refused",
                Reason::ServiceRejected,
            ),
        ];
        for (problem, text, reason) in cases {
            assert!(problem.to_string().contains(text), "{problem}");
            assert_eq!(problem.reason(), reason, "{problem}");
        }
    }
}
