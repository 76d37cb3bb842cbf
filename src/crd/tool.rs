use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The name of a Tool's pod: `<tool>-tool`.
pub fn tool_pod_name(tool: &str) -> String {
    format!("{tool}-tool")
}

/// A tool agents can call: an on-demand pod `<tool>-tool` behind a Service `<tool>`. The
/// pod runs while an Agent of the namespace that lists the Tool wants to run, and is
/// removed `idleSeconds` after the last one stops; the Service stays throughout.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    doc = "A Tool is a service agents call: a Service that always exists and a pod that runs while an Agent of the namespace that lists the Tool wants to run (or always, with alwaysOn), removed idleSeconds after the last one stops. status.endpoint is the URL agents get.",
    group = "autonomic.sh",
    version = "v1alpha1",
    kind = "Tool",
    namespaced,
    status = "ToolStatus",
    shortname = "tl",
    category = "autonomic",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Users","type":"integer","jsonPath":".status.users"}"#,
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
    /// Environment variables. A `valueFrom.secretKeyRef` names a Secret the admin labelled
    /// `autonomic.sh/agents=allowed` (any, in a namespace labelled
    /// `autonomic.sh/references=any`); else `Error`, `SecretNotAllowed`, no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub env: Option<Vec<EnvVar>>,
    /// Port the tool listens on; the Service exposes the same port.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Remove the tool's pod (the Service stays) until this is false again, whatever
    /// the demand.
    #[serde(default)]
    pub disabled: bool,
    /// Keep the pod running even while no Agent uses the tool.
    #[serde(default)]
    pub always_on: bool,
    /// Seconds the pod stays after the last Agent using the tool stops wanting to run; a
    /// user that returns within them keeps the same pod. 0 removes it at once.
    #[serde(default = "default_idle_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub idle_seconds: i64,
}

fn default_port() -> i32 {
    8080
}

/// The defaults the schema applies, so a `ToolSpec` built in code means what the same
/// object read from YAML does.
impl Default for ToolSpec {
    fn default() -> Self {
        ToolSpec {
            image: String::new(),
            command: None,
            args: None,
            env: None,
            port: default_port(),
            disabled: false,
            always_on: false,
            idle_seconds: DEFAULT_IDLE_SECONDS,
        }
    }
}

pub const DEFAULT_IDLE_SECONDS: i64 = 300;

fn default_idle_seconds() -> i64 {
    DEFAULT_IDLE_SECONDS
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
    /// Agents of the namespace that list this Tool and want to run (not paused, not
    /// finished, not being deleted).
    pub users: Option<i64>,
    /// When the last user stopped while the pod ran: the pod is removed `idleSeconds`
    /// after this unless a user returns. Set once per idle period; absent while the tool
    /// is in use, has no pod, is `alwaysOn` or `disabled`.
    pub idle_since: Option<Time>,
}
