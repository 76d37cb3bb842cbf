//! The `autonomic.sh/v1alpha1` custom resources (RESOURCES.md) and their CRD YAML.

mod agent;
mod memory;
mod podsecurity;
mod reason;
mod runtime;
mod tool;

pub use agent::*;
pub use memory::*;
pub use podsecurity::{POD_SECURITY_LABEL, PodSecurityLevel};
pub use reason::Reason;
pub use runtime::*;
pub use tool::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub const API_VERSION: &str = "autonomic.sh/v1alpha1";
/// The API group of the custom resources.
pub const GROUP: &str = "autonomic.sh";

/// The default of `AUTONOMIC_MAX_SPEC_BYTES` (TRUST.md §3): 256 KiB, far above what a
/// spec written by hand holds, and a sixth of what the API server stores of one object
/// (1.5 MiB). A larger spec, as JSON, is not kept (`store::spec`) nor reconciled.
pub const DEFAULT_MAX_SPEC_BYTES: u64 = 256 << 10;

/// The four kinds of RESOURCES.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Kind {
    Agent,
    Tool,
    Runtime,
    Memory,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Agent, Kind::Tool, Kind::Runtime, Kind::Memory];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Agent => "Agent",
            Kind::Tool => "Tool",
            Kind::Runtime => "Runtime",
            Kind::Memory => "Memory",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The lowercase label key suffix: `autonomic.sh/<kind>`.
    pub fn label_key(self) -> &'static str {
        match self {
            Kind::Agent => "autonomic.sh/agent",
            Kind::Tool => "autonomic.sh/tool",
            Kind::Runtime => "autonomic.sh/runtime",
            Kind::Memory => "autonomic.sh/memory",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CRDs, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Agent::crd(), Tool::crd(), Runtime::crd(), Memory::crd()]
}

/// `crds/<name>.yaml` and its content, one file per kind.
pub fn crd_files() -> Vec<(String, String)> {
    crds()
        .iter()
        .map(|crd| {
            let yaml = serde_saphyr::to_string(crd).expect("a CRD always serializes");
            let name = crd.metadata.name.clone().unwrap_or_default();
            (format!("{name}.yaml"), format!("---\n{yaml}"))
        })
        .collect()
}

/// What `autonomic-manager crds` prints: `crds/` as committed, which tests/crds.rs holds
/// equal to [`crds_yaml`]. Embedded rather than generated at run time, so the binary
/// carries no schema generator or YAML writer.
pub const CRDS_YAML: &str = concat!(
    include_str!("../../crds/agents.autonomic.sh.yaml"),
    include_str!("../../crds/tools.autonomic.sh.yaml"),
    include_str!("../../crds/runtimes.autonomic.sh.yaml"),
    include_str!("../../crds/memories.autonomic.sh.yaml"),
);

/// The CRDs of [`CRDS_YAML`], read back: what `check` compares the installed ones with.
/// Read through JSON text, as the API server's answers are, so the binary holds one
/// reader of the CRD types and no schema generator (tests/crds.rs holds `crds/` equal to
/// the generated CRDs).
pub fn embedded_crds() -> Vec<CustomResourceDefinition> {
    CRDS_YAML
        .split("\n---\n")
        .map(|doc| doc.trim_start_matches("---\n"))
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| {
            let value: serde_json::Value =
                serde_saphyr::from_str(doc).expect("the embedded CRDs are YAML");
            serde_json::from_str(&value.to_string()).expect("the embedded CRDs are CRDs")
        })
        .collect()
}

/// Every CRD as the Rust types generate it, one YAML document each.
pub fn crds_yaml() -> String {
    crd_files().into_iter().map(|(_, yaml)| yaml).collect()
}

/// Schema of an optional phase: the enum alone. Status is written with absent fields
/// removed, so `null` is never stored, and an `enum` holding `null` is not a valid
/// structural schema.
pub(crate) fn phase_schema<T: schemars::JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    T::json_schema(generator)
}

/// A condition list entry; kept simple rather than `meta/v1.Condition` so an absent
/// `observedGeneration` is not mandatory in the schema.
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Identifies one custom resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Key {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of custom resource `obj` of `kind`.
    pub fn of<K: kube::ResourceExt>(kind: Kind, obj: &K) -> Self {
        Key::new(kind, obj.namespace().unwrap_or_default(), obj.name_any())
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// What every kind's status has: a phase (one of which is the ready one), a message,
/// the `Ready` condition and the generation it was computed from. The reconcilers build
/// these four fields one way (`reconcile::common::status`); the writer reports
/// on them.
pub trait PhaseStatus: serde::Serialize + PartialEq + Default {
    type Phase: Copy + std::fmt::Debug + PartialEq;
    /// The phase in which the object is `Ready`.
    const READY: Self::Phase;
    fn phase(&self) -> Option<Self::Phase>;
    fn phase_name(&self) -> Option<String> {
        self.phase().map(|p| format!("{p:?}"))
    }
    fn message_text(&self) -> &str;
    fn conditions(&self) -> &[Condition];
    /// The `Ready` condition's reason: the cause of the phase (the Events' reason too).
    fn ready_reason(&self) -> Option<&str> {
        self.conditions()
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.reason.as_str())
    }
    /// Whether the phase deserves a Warning event.
    fn is_warning(&self) -> bool;
    /// Sets the four shared fields.
    fn set_head(
        &mut self,
        generation: Option<i64>,
        phase: Self::Phase,
        message: String,
        conditions: Vec<Condition>,
    );
}

macro_rules! phase_status {
    ($($ty:ty, $phase:ty, ready: $ready:expr, warn: [$($warn:pat_param),+]);*) => {$(
        impl PhaseStatus for $ty {
            type Phase = $phase;
            const READY: $phase = $ready;
            fn phase(&self) -> Option<$phase> {
                self.phase
            }
            fn message_text(&self) -> &str {
                self.message.as_deref().unwrap_or_default()
            }
            fn conditions(&self) -> &[Condition] {
                &self.conditions
            }
            fn is_warning(&self) -> bool {
                matches!(self.phase, $(Some($warn))|+)
            }
            fn set_head(
                &mut self,
                generation: Option<i64>,
                phase: $phase,
                message: String,
                conditions: Vec<Condition>,
            ) {
                self.observed_generation = generation;
                self.phase = Some(phase);
                // An Agent's are boxed (`crd::agent`), the other kinds' are not.
                self.message = Some(message.into());
                self.conditions = conditions.into();
            }
        }
    )*};
}
phase_status!(
    AgentStatus, AgentPhase, ready: AgentPhase::Active, warn: [AgentPhase::Error, AgentPhase::Failed];
    ToolStatus, ToolPhase, ready: ToolPhase::Ready, warn: [ToolPhase::Error];
    RuntimeStatus, RuntimePhase, ready: RuntimePhase::Ready, warn: [RuntimePhase::Invalid];
    MemoryStatus, MemoryPhase, ready: MemoryPhase::Bound, warn: [MemoryPhase::Error]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_crds_read_back_as_the_generated_ones() {
        let json = |c: &[CustomResourceDefinition]| serde_json::to_value(c).unwrap();
        let embedded = embedded_crds();
        assert_eq!(embedded.len(), 4);
        assert_eq!(json(&embedded), json(&crds()));
    }

    /// The container fields an Agent's `runtime`, a Runtime and a Tool share (`command`,
    /// `args`, `env`; `resources` where the kind has it) are declared in each type, with
    /// docs that say what the field means there. They are not one struct under
    /// `#[serde(flatten)]`: that makes serde read every spec through a buffered copy of
    /// its fields (the cost paid per object on every list and watch event), and the
    /// schema generator writes flattened structs differently. This holds their schemas
    /// equal but for the description, so a bound changed in one is changed in all.
    #[test]
    fn the_shared_container_fields_have_one_schema() {
        let spec = |crd: &CustomResourceDefinition| {
            let v = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
            v["openAPIV3Schema"]["properties"]["spec"].clone()
        };
        let field = |props: &serde_json::Value, name: &str| {
            let mut f = props["properties"][name].clone();
            f.as_object_mut()
                .unwrap_or_else(|| panic!("no field {name}"))
                .remove("description");
            f
        };
        let agent = spec(&Agent::crd())["properties"]["runtime"].clone();
        let runtime = spec(&Runtime::crd());
        let tool = spec(&Tool::crd());
        for name in ["command", "args", "env"] {
            assert_eq!(field(&agent, name), field(&runtime, name), "{name}");
            assert_eq!(field(&agent, name), field(&tool, name), "{name}");
        }
        assert_eq!(field(&agent, "resources"), field(&runtime, "resources"));
        assert!(field(&agent, "env").to_string().contains("maxItems"));
    }
}
