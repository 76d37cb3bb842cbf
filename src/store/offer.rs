//! What the cluster admin offered to agents (TRUST.md §2): the ServiceAccounts and
//! Secrets labelled `autonomic.sh/agents: allowed`, watched by that label and kept as
//! their names alone. The manager never holds an offered Secret's data for this: an
//! offer is a name, and whether the name is in the cache is the whole question.

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// The label by which an admin offers a ServiceAccount or Secret to agents, as the
/// selector of the offer watches.
pub const OFFER_SELECTOR: &str = "autonomic.sh/agents=allowed";

/// An offered Secret: its metadata, never its data (serde skips every other field).
#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Secret)]
pub struct OfferedSecret {
    pub metadata: ObjectMeta,
}

/// An offered ServiceAccount: its metadata.
#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = ServiceAccount)]
pub struct OfferedServiceAccount {
    pub metadata: ObjectMeta,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offered_secret_keeps_no_data() {
        let served = r#"{"metadata": {"name": "s", "namespace": "ns",
            "labels": {"autonomic.sh/agents": "allowed"}},
            "data": {"url": "cmVkaXM6Ly94"}, "stringData": {"k": "v"}, "type": "Opaque"}"#;
        let s: OfferedSecret = serde_json::from_str(served).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("s"));
        assert!(!format!("{s:?}").contains("cmVkaXM6Ly94"));
    }
}
