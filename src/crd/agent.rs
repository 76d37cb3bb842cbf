use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An AI agent: one pod with the `agentlet` sidecar and the `runtime` container, plus a
/// Secret `<agent>-agent` with its configuration.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    doc = "An Agent runs one AI agent: a pod with the runtime container (from a Runtime template and overrides) and the agentlet sidecar that connects it to the platform, plus a Secret with its configuration (Tools, Memory). status.phase says where it is (Pending, Active, Paused, Error, Succeeded, Failed, Terminating) and status.message why.",
    group = "autonomic.sh",
    version = "v1alpha1",
    kind = "Agent",
    namespaced,
    status = "AgentStatus",
    shortname = "ag",
    category = "autonomic",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".status.podName"}"#,
    printcolumn = r#"{"name":"Runtime","type":"string","jsonPath":".spec.runtime.ref"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
// The strings and lists of an Agent, spec and status, are `Box<str>` and `Box<[T]>`: read
// or built once, never grown, so they need no spare room, and they are 16 bytes where
// `String` and `Vec` are 24. Every Agent is cached (`store::cache`), one per agent: 112
// bytes less each, and the cached Agent takes musl's 672-byte slot, not the 800
// (`store::cache::tests::cached_objects_fit_their_allocator_slots`).
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// The `runtime` container: an optional Runtime template plus field overrides.
    #[serde(default)]
    pub runtime: AgentRuntime,
    /// The `agentlet` sidecar that connects the agent to the platform.
    #[serde(default)]
    pub agentlet: Agentlet,
    /// Names of Tools in this namespace whose endpoints are handed to the agent.
    #[serde(default, skip_serializing_if = "<[String]>::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub tools: Box<[String]>,
    /// Names of Memory stores in this namespace the agent may use.
    #[serde(default, skip_serializing_if = "<[String]>::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub memory: Box<[String]>,
    /// Stop the agent: its pod is removed until this is false again.
    #[serde(default)]
    pub paused: bool,
    /// What happens when a container exits: `Always` restarts it; with `OnFailure` or
    /// `Never` the agent can finish as `Succeeded` or `Failed`.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// ServiceAccount the agent pod runs as (default: the namespace's `default`): one the
    /// admin labelled `autonomic.sh/agents=allowed`, or any in a namespace labelled
    /// `autonomic.sh/references=any`; never the manager's own. Else `Error`,
    /// `ServiceAccountNotAllowed`, no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<Box<str>>,
}

/// The agent's `runtime` container. Fields set here override the Runtime template's.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRuntime {
    /// Name of a Runtime in the same namespace used as the template.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub reference: Option<Box<str>>,
    /// Container image; required here or in the Runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<Box<str>>,
    /// Entrypoint override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub command: Option<Box<[String]>>,
    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Box<[String]>>,
    /// Environment variables; an entry here replaces the template's entry of the same name.
    /// A `valueFrom.secretKeyRef` names a Secret the admin labelled
    /// `autonomic.sh/agents=allowed` (any, in a namespace labelled
    /// `autonomic.sh/references=any`); else `Error`, `SecretNotAllowed`, no pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub env: Option<Box<[EnvVar]>>,
    /// Compute resources of the runtime container.
    // Boxed: set on few Agents, and three maps wide (72 bytes) in every cached one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Box<ResourceRequirements>>,
}

/// The agentlet sidecar.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agentlet {
    /// Image; defaults to the manager's `AUTONOMIC_AGENTLET_IMAGE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<Box<str>>,
}

/// Pod restart policy of the agent.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }
}

impl Agent {
    /// Whether the Agent finished (`Succeeded` or `Failed`, which only `restartPolicy`
    /// `OnFailure` or `Never` reach) for its current generation: its pod is then never
    /// recreated, even when it goes away, until a spec change.
    pub fn finished(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            matches!(s.phase, Some(AgentPhase::Succeeded | AgentPhase::Failed))
                && s.observed_generation == self.metadata.generation
        })
    }
}

/// Lifecycle phase of an Agent.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AgentPhase {
    Pending,
    Active,
    Paused,
    Error,
    Terminating,
    Succeeded,
    Failed,
}

/// Observed state of an Agent, written by the manager.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The `metadata.generation` this status describes.
    pub observed_generation: Option<i64>,
    #[schemars(schema_with = "super::phase_schema::<AgentPhase>")]
    pub phase: Option<AgentPhase>,
    /// Human-readable detail of the phase; names what is missing or failing.
    pub message: Option<Box<str>>,
    #[serde(default)]
    pub conditions: Box<[Condition]>,
    /// The agent's pod.
    pub pod_name: Option<Box<str>>,
    /// When the pod started.
    pub started_at: Option<Time>,
    /// The Memory stores the agent uses, with the Secret that holds their connection data.
    #[serde(default)]
    pub memory_refs: Box<[MemoryRef]>,
    /// What the agent reports it is working on (from its pod's
    /// `autonomic.sh/context-summary` annotation, capped at 4 KiB).
    pub context_summary: Option<Box<str>>,
}

/// One Memory store used by an agent.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRef {
    pub name: String,
    pub secret_name: Option<String>,
    pub phase: Option<String>,
}
