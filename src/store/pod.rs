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

#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Pod)]
#[serde(from = "Served")]
pub struct PodView {
    /// Without its annotations: the two the manager reads are below (a map's node on
    /// the heap holds eleven entries however few it has: half a kilobyte a pod).
    pub metadata: ObjectMeta,
    /// The `autonomic.sh/spec-hash` annotation: what the pod was built from.
    pub spec_hash: Option<String>,
    /// The `autonomic.sh/context-summary` annotation, which the agent may set, cut to
    /// [`CONTEXT_SUMMARY_MAX`] bytes when read (TRUST.md §3).
    pub context_summary: Option<String>,
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

/// A pod as served, read into [`PodView`].
#[derive(Deserialize)]
struct Served {
    metadata: ObjectMeta,
    spec: Option<PodViewSpec>,
    status: Option<PodViewStatus>,
}

impl From<Served> for PodView {
    fn from(mut p: Served) -> Self {
        let mut annotations = p.metadata.annotations.take().unwrap_or_default();
        let context_summary = annotations.remove(CONTEXT_SUMMARY).map(|mut s| {
            let keep = crate::text::cap_utf8(&s, CONTEXT_SUMMARY_MAX).len();
            s.truncate(keep);
            // What was cut goes back to the allocator, not only out of sight.
            s.shrink_to_fit();
            s
        });
        PodView {
            spec_hash: annotations.remove(SPEC_HASH),
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
    pub node_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodViewStatus {
    pub phase: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub start_time: Option<Time>,
    /// Only a `PodScheduled` condition that is not true: the one condition the manager
    /// reads (why a pod is unschedulable). A running pod has four or five more.
    #[serde(default, deserialize_with = "unscheduled_only")]
    pub conditions: Option<Vec<PodCondition>>,
    pub container_statuses: Option<Vec<ContainerView>>,
    pub init_container_statuses: Option<Vec<ContainerView>>,
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
) -> Result<Option<Vec<PodCondition>>, D::Error> {
    let conditions: Option<Vec<PodCondition>> = Option::deserialize(d)?;
    Ok(conditions
        .map(|mut c| {
            c.retain(|c| c.type_ == "PodScheduled" && c.status != "True");
            c
        })
        .filter(|c| !c.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(huge.starts_with(&cut));
        assert_eq!(cut.capacity(), cut.len());
    }
}
