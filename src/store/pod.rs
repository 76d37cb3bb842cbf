//! A pod as the manager reads it: what it watches, caches and decides from.
//!
//! k8s-openapi's `Pod` carries the whole API (every volume source, probe and security
//! setting). Watching pods through it costs a few kilobytes per pod in the cache even
//! when the spec is dropped, and the serde code for its whole type tree in the binary,
//! instantiated once per way it is parsed (lists, watch events). The manager reads
//! little of a pod: this type is that, and serde skips the rest while parsing. Pods are
//! still written as k8s-openapi `Pod`s.

use k8s_openapi::api::core::v1::{ContainerState, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer};

use crate::crd::Reason;

#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Pod)]
#[serde(from = "Served")]
pub struct PodView {
    /// Without its annotations: the two the manager reads are below (a map's node on
    /// the heap holds eleven entries however few it has: half a kilobyte a pod).
    pub metadata: ObjectMeta,
    /// The `autonomic.sh/spec-hash` annotation: what the pod was built from.
    pub spec_hash: Option<Box<str>>,
    /// The `autonomic.sh/context-summary` annotation, which the agent may set, cut to
    /// [`CONTEXT_SUMMARY_MAX`] bytes when read (TRUST.md §3).
    pub context_summary: Option<Box<str>>,
    pub spec: Option<PodViewSpec>,
    pub status: Option<PodViewStatus>,
}

/// The annotation holding the hash of what a pod was built from.
pub const SPEC_HASH: &str = "autonomic.sh/spec-hash";
/// The annotation an agent may set on its pod to summarise its context.
const CONTEXT_SUMMARY: &str = "autonomic.sh/context-summary";
/// The most of [`CONTEXT_SUMMARY`] kept, in bytes (cut on a character boundary): what
/// an Agent's `status.contextSummary` shows. A pod's annotations may hold 256 KiB, and
/// anyone who may label a pod as ours may set them.
pub const CONTEXT_SUMMARY_MAX: usize = 4096;

/// A pod as served (as JSON, or as protobuf by `super::proto`), read into [`PodView`].
#[derive(Default, Deserialize)]
pub(super) struct Served {
    pub metadata: ObjectMeta,
    pub spec: Option<PodViewSpec>,
    pub status: Option<PodViewStatus>,
}

impl From<Served> for PodView {
    fn from(mut p: Served) -> Self {
        let mut annotations = p.metadata.annotations.take().unwrap_or_default();
        let context_summary = annotations.remove(CONTEXT_SUMMARY).map(|mut s| {
            let keep = crate::text::cap_utf8(&s, CONTEXT_SUMMARY_MAX).len();
            s.truncate(keep);
            // What was cut goes back to the allocator, not only out of sight.
            s.into_boxed_str()
        });
        PodView {
            spec_hash: annotations.remove(SPEC_HASH).map(String::into_boxed_str),
            context_summary,
            metadata: p.metadata,
            spec: p.spec,
            status: p.status,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodViewSpec {
    pub node_name: Option<Box<str>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodViewStatus {
    pub phase: Option<Box<str>>,
    pub reason: Option<Box<str>>,
    pub message: Option<Box<str>>,
    pub start_time: Option<Time>,
    /// Only a `PodScheduled` condition that is not true: the one condition the manager
    /// reads (why a pod is unschedulable). A running pod has four or five more.
    #[serde(default, deserialize_with = "unscheduled_only")]
    pub conditions: Option<Box<[PodCondition]>>,
    pub container_statuses: Option<Box<[ContainerView]>>,
    pub init_container_statuses: Option<Box<[ContainerView]>>,
}

/// One container's status: its name, readiness, restarts and state.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
    pub state: Option<ContainerState>,
}

fn unscheduled_only<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<[PodCondition]>>, D::Error> {
    let conditions: Option<Vec<PodCondition>> = Option::deserialize(d)?;
    Ok(conditions.and_then(unscheduled))
}

/// Of a pod's conditions, a `PodScheduled` that is not true, if any.
pub(super) fn unscheduled(mut conditions: Vec<PodCondition>) -> Option<Box<[PodCondition]>> {
    conditions.retain(|c| c.type_ == "PodScheduled" && c.status != "True");
    Some(conditions.into_boxed_slice()).filter(|c| !c.is_empty())
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

/// The [`Health`] a pod's status gives: its phase when it ended, a stuck container,
/// ready, or what it waits for.
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
            let why = (status.reason.as_deref().map(str::to_owned))
                .or_else(|| terminated_reason(pod))
                .unwrap_or_else(|| "pod failed".into());
            return Health::Failed(reason, why);
        }
        _ => {}
    }
    if let Some(stuck) = stuck(status) {
        return stuck;
    }
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    if phase == "Running" && !statuses.is_empty() && statuses.iter().all(|c| c.ready) {
        return Health::Ready;
    }
    waiting_for(status, phase)
}

/// A container that cannot start or keeps crashing (a waiting reason of
/// [`ERROR_REASONS`]), init containers first.
fn stuck(status: &PodViewStatus) -> Option<Health> {
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
                return Some(Health::Error(
                    *reason,
                    format!("container {}: {waiting}: {msg}", cs.name)
                        .trim_end_matches([' ', ':'])
                        .to_owned(),
                ));
            }
        }
    }
    None
}

/// What a pod neither ready nor stuck waits for, most specific first.
fn waiting_for(status: &PodViewStatus, phase: &str) -> Health {
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> PodView {
        serde_saphyr::from_str(yaml).unwrap()
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

    fn served(summary: &str) -> PodView {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "annotations": {
                "autonomic.sh/context-summary": summary, "autonomic.sh/spec-hash": "h", "other": "x".repeat(100_000)}},
        }))
        .unwrap()
    }

    /// The summary is cut when read, on a character boundary, its cut part freed; what
    /// fits is kept as it is; other annotations are not kept at all.
    #[test]
    fn the_context_summary_is_cut_to_4_kib_when_read() {
        let short = served("triaging issue #42");
        assert_eq!(short.context_summary.as_deref(), Some("triaging issue #42"));
        assert_eq!(short.spec_hash.as_deref(), Some("h"));
        assert_eq!(short.metadata.annotations, None);
        let exact = "s".repeat(CONTEXT_SUMMARY_MAX);
        assert_eq!(served(&exact).context_summary.as_deref(), Some(&*exact));
        // 250 KiB of two-byte characters, the bound falling inside one of them.
        let huge = format!("a{}", "é".repeat(125 << 10));
        let cut = served(&huge).context_summary.unwrap();
        assert_eq!(cut.len(), CONTEXT_SUMMARY_MAX - 1);
        assert!(huge.starts_with(&*cut));
    }
}
