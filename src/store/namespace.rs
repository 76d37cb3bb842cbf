//! What the manager reads of a namespace: the labels by which the admin sets its pod
//! security level (TRUST.md §1, `autonomic.sh/pod-security`), lifts the offer rule
//! (§2, `autonomic.sh/references: any`) and refuses shells (§5,
//! `autonomic.sh/shell: disabled`). Watched cluster-wide, or each watched
//! namespace by name when only some are (RBAC then grants those names alone).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::crd::{POD_SECURITY_LABEL, PodSecurityLevel};

/// The namespace label by which the admin lets a namespace's objects reference any
/// ServiceAccount and Secret there, offered or not, and its one value.
pub const REFERENCES_LABEL: &str = "autonomic.sh/references";
pub const REFERENCES_ANY: &str = "any";

/// The namespace label by which the admin refuses shells into a namespace's agents, and
/// its one value.
pub const SHELL_LABEL: &str = "autonomic.sh/shell";
pub const SHELL_DISABLED: &str = "disabled";

/// A namespace: its labels, those of this page alone (serde skips its spec and status;
/// the cache drops its annotations).
#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Namespace)]
#[serde(from = "Served")]
pub struct NamespaceView {
    pub metadata: ObjectMeta,
}

#[derive(Deserialize)]
struct Served {
    metadata: ObjectMeta,
}

impl From<Served> for NamespaceView {
    fn from(mut n: Served) -> Self {
        if let Some(labels) = n.metadata.labels.as_mut() {
            labels.retain(|k, _| {
                [POD_SECURITY_LABEL, REFERENCES_LABEL, SHELL_LABEL].contains(&k.as_str())
            });
        }
        if n.metadata.labels.as_ref().is_some_and(BTreeMap::is_empty) {
            n.metadata.labels = None;
        }
        NamespaceView {
            metadata: n.metadata,
        }
    }
}

impl NamespaceView {
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// The namespace's level: its label if that names a level, else `default`.
    pub fn pod_security(this: Option<&Self>, default: PodSecurityLevel) -> PodSecurityLevel {
        PodSecurityLevel::of_namespace(this.and_then(|n| n.metadata.labels.as_ref()), default)
    }

    /// Whether the admin lifted the offer rule here (`autonomic.sh/references: any`).
    pub fn references_any(this: Option<&Self>) -> bool {
        this.and_then(|n| n.label(REFERENCES_LABEL)) == Some(REFERENCES_ANY)
    }

    /// Whether the admin refused shells here (`autonomic.sh/shell: disabled`).
    pub fn shell_disabled(&self) -> bool {
        self.label(SHELL_LABEL) == Some(SHELL_DISABLED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_keeps_the_three_labels_of_trust_md_and_nothing_else() {
        let served = r#"{"metadata": {"name": "t", "labels": {"team": "a",
            "autonomic.sh/pod-security": "privileged", "autonomic.sh/references": "any",
            "autonomic.sh/shell": "disabled"},
            "annotations": {"big": "x"}}, "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"}}"#;
        let n: NamespaceView = serde_json::from_str(served).unwrap();
        let labels = n.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.len(), 3);
        assert!(n.shell_disabled());
        assert_eq!(
            NamespaceView::pod_security(Some(&n), PodSecurityLevel::Restricted),
            PodSecurityLevel::Privileged
        );
        assert!(NamespaceView::references_any(Some(&n)));

        let plain: NamespaceView =
            serde_json::from_str(r#"{"metadata": {"name": "u", "labels": {"team": "a"}}}"#)
                .unwrap();
        assert_eq!(plain.metadata.labels, None);
        assert!(!NamespaceView::references_any(Some(&plain)));
        assert!(!plain.shell_disabled());
        // Unknown (not watched, or the watch refused): the admin's default, no lift.
        assert_eq!(
            NamespaceView::pod_security(None, PodSecurityLevel::Baseline),
            PodSecurityLevel::Baseline
        );
        assert!(!NamespaceView::references_any(None));
        let other: NamespaceView = serde_json::from_str(
            r#"{"metadata": {"name": "v", "labels": {"autonomic.sh/references": "some"}}}"#,
        )
        .unwrap();
        assert!(!NamespaceView::references_any(Some(&other)));
    }
}
