use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A template for agents' `runtime` container. Reconciles into nothing by itself; a
/// change rolls the agents that use it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    doc = "A Runtime is a template for Agents' runtime container (image, command, env, resources, security context). It creates nothing by itself; changing it recreates the pods of the Agents that use it. status.agents counts them.",
    group = "autonomic.sh",
    version = "v1alpha1",
    kind = "Runtime",
    namespaced,
    status = "RuntimeStatus",
    shortname = "rt",
    category = "autonomic",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Agents","type":"integer","jsonPath":".status.agents"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    /// Container image; a Runtime without one is `Invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,
    /// Entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub command: Option<Vec<String>>,
    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Vec<String>>,
    /// Environment variables. A `valueFrom.secretKeyRef` names a Secret the admin labelled
    /// `autonomic.sh/agents=allowed` (any, in a namespace labelled
    /// `autonomic.sh/references=any`); else `Error`, `SecretNotAllowed`, no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub env: Option<Vec<EnvVar>>,
    /// Compute resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The runtime container's securityContext. Unset, the manager applies the
    /// restricted Pod Security Standard (non-root uid 65532, no privilege escalation, all
    /// capabilities dropped, seccomp `RuntimeDefault`). Set, under the namespace's level
    /// `restricted` (the default; the level is the namespace label
    /// `autonomic.sh/pod-security`, else the manager's `AUTONOMIC_POD_SECURITY`) it is
    /// merged over those values field by field; under `baseline` or `privileged` it is
    /// used as written. A field the level does not allow (`privileged`, `runAsUser: 0`
    /// under `restricted`, an added capability...) gets the Agent no pod: `Error`, reason
    /// `PodSecurityViolation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

/// Validity of a Runtime.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RuntimePhase {
    Ready,
    Invalid,
}

/// Observed state of a Runtime, written by the manager.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStatus {
    pub observed_generation: Option<i64>,
    #[schemars(schema_with = "super::phase_schema::<RuntimePhase>")]
    pub phase: Option<RuntimePhase>,
    pub message: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// How many Agents in the namespace use this Runtime.
    pub agents: Option<i64>,
}
