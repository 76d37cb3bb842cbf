use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A tool agents can call: a pod `<tool>-tool` behind a Service `<tool>`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "autonomic.sh",
    version = "v1alpha1",
    kind = "Tool",
    namespaced,
    status = "ToolStatus",
    shortname = "tl",
    category = "autonomic",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// Container image serving the tool.
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// Entrypoint override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub command: Option<Vec<String>>,
    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Vec<String>>,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub env: Option<Vec<EnvVar>>,
    /// Port the tool listens on; the Service exposes the same port.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Remove the tool's pod (the Service stays) until this is false again.
    #[serde(default)]
    pub disabled: bool,
}

fn default_port() -> i32 {
    8080
}

/// Lifecycle phase of a Tool.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ToolPhase {
    Pending,
    Ready,
    Error,
    Disabled,
}

/// Observed state of a Tool, written by the manager.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolStatus {
    pub observed_generation: Option<i64>,
    #[schemars(schema_with = "super::phase_schema::<ToolPhase>")]
    pub phase: Option<ToolPhase>,
    pub message: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    pub pod_name: Option<String>,
    /// `http://<tool>.<namespace>.svc:<port>`.
    pub endpoint: Option<String>,
}
