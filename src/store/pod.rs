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
pub struct PodView {
    pub metadata: ObjectMeta,
    pub spec: Option<PodViewSpec>,
    pub status: Option<PodViewStatus>,
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
