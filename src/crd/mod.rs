//! The `autonomic.sh/v1alpha1` custom resources (RESOURCES.md) and their CRD YAML.

mod agent;
mod memory;
mod runtime;
mod tool;

pub use agent::*;
pub use memory::*;
pub use runtime::*;
pub use tool::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub const GROUP: &str = "autonomic.sh";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "autonomic.sh/v1alpha1";

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
