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
use serde::Deserialize;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::trim;
    use crate::connect::wire::pod_wire;
    use crate::reconcile::common::{Health, pod_health};
    use serde_json::json;

    /// A pod as the API server serves it: a running agent pod with two containers.
    fn served() -> serde_json::Value {
        let container = |name: &str| {
            json!({"name": name, "image": "registry.example/agent:1.2.3",
                "args": ["--serve"], "env": [{"name": "A", "value": "b"}],
                "resources": {"limits": {"memory": "512Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/autonomic"}]})
        };
        let status = |name: &str, restarts: i32| {
            json!({"name": name, "ready": true, "restartCount": restarts, "started": true,
                "image": "registry.example/agent:1.2.3",
                "imageID": "registry.example/agent@sha256:0123456789abcdef0123456789abcdef",
                "containerID": "containerd://0123456789abcdef0123456789abcdef",
                "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})
        };
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "triage", "namespace": "team-a", "uid": "u-1",
                "labels": {"autonomic.sh/agent": "triage"},
                "annotations": {"autonomic.sh/spec-hash": "abc",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}"},
                "managedFields": [{"manager": "autonomic-manager", "operation": "Apply"}],
                "ownerReferences": [{"apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
                    "name": "triage", "uid": "a-1", "controller": true}]},
            "spec": {"nodeName": "node-1", "restartPolicy": "Always",
                "containers": [container("runtime"), container("agentlet")],
                "volumes": [{"name": "config", "secret": {"secretName": "triage-config"}}]},
            "status": {"phase": "Running", "qosClass": "Burstable",
                "hostIP": "10.0.0.1", "podIP": "10.1.0.7", "startTime": "2026-12-02T10:00:00Z",
                "conditions": [{"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [status("runtime", 2), status("agentlet", 0)]}
        })
    }

    fn read(v: serde_json::Value) -> PodView {
        let mut pod: PodView = serde_json::from_value(v).unwrap();
        trim(&mut pod);
        pod
    }

    /// A served pod reads into everything the manager reads of it, in every state.
    #[test]
    fn a_served_pod_reads_into_what_the_manager_uses() {
        let pod = read(served());
        assert_eq!(
            pod_wire(&pod),
            json!({"name": "triage", "phase": "Running", "ready": true, "restarts": 2,
                "node": "node-1", "containers": [
                    {"name": "runtime", "ready": true, "state": "running", "reason": ""},
                    {"name": "agentlet", "ready": true, "state": "running", "reason": ""}]})
        );
        assert_eq!(pod_health(&pod), Health::Ready);
        assert_eq!(
            pod.metadata.owner_references.as_ref().unwrap()[0].uid,
            "a-1"
        );
        assert_eq!(pod.metadata.managed_fields, None);
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["autonomic.sh/spec-hash"]
        );

        let mut crashing = served();
        crashing["status"]["containerStatuses"][0]["ready"] = json!(false);
        crashing["status"]["containerStatuses"][0]["state"] = json!({"waiting":
            {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}});
        let pod = read(crashing);
        assert_eq!(
            pod_health(&pod),
            Health::Error("container runtime: CrashLoopBackOff: back-off 5m0s".into())
        );
        assert_eq!(
            pod_wire(&pod)["containers"][0],
            json!({"name": "runtime", "ready": false, "state": "waiting",
                "reason": "CrashLoopBackOff"})
        );

        let mut failed = served();
        failed["status"]["phase"] = json!("Failed");
        failed["status"]["containerStatuses"][1]["state"] =
            json!({"terminated": {"exitCode": 3, "reason": "Error"}});
        assert_eq!(
            pod_health(&read(failed)),
            Health::Failed("container agentlet exited with code 3 (Error)".into())
        );

        let mut pending = served();
        pending["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]});
        assert!(
            matches!(pod_health(&read(pending)), Health::Pending(m) if m.contains("0/1 nodes"))
        );
    }
}
