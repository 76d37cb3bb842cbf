use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A memory store agents can use: reconciles into a Secret `<memory>-memory` with the
/// keys `backend` and `url`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    doc = "A Memory is a store agents can use (a backend and its URL, inline or from a Secret). It becomes a Secret with the keys backend and url that the Agents listing it get in their configuration.",
    group = "autonomic.sh",
    version = "v1alpha1",
    kind = "Memory",
    plural = "memories",
    namespaced,
    status = "MemoryStatus",
    shortname = "mem",
    category = "autonomic",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Backend","type":"string","jsonPath":".spec.backend"}"#,
    printcolumn = r#"{"name":"Secret","type":"string","jsonPath":".status.secretName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MemorySpec {
    /// Free-form name of the store: redis, postgres, s3, …
    #[schemars(length(min = 1, max = 63))]
    pub backend: String,
    /// Connection URL. Exactly one of `url` and `secretRef` must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub url: Option<String>,
    /// Read the URL from a key of an existing Secret in this namespace, one the admin
    /// labelled `autonomic.sh/agents=allowed` (any, in a namespace labelled
    /// `autonomic.sh/references=any`); else `Pending`, `SecretNotAllowed`, the same for a
    /// missing Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
}

/// A key of a Secret in the Memory's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Lifecycle phase of a Memory.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MemoryPhase {
    Pending,
    Bound,
    Error,
}

/// Observed state of a Memory, written by the manager.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStatus {
    pub observed_generation: Option<i64>,
    #[schemars(schema_with = "super::phase_schema::<MemoryPhase>")]
    pub phase: Option<MemoryPhase>,
    pub message: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The Secret holding `backend` and `url`.
    pub secret_name: Option<String>,
}
