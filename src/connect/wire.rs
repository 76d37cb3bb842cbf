//! The resource wire form (PROTOCOL.md §5): what a snapshot or delta says about one
//! custom resource and the pods it owns. Pure: built from cached objects.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::crd::{Agent, Kind, Memory, Runtime, Tool};
use crate::reconcile::Context;
use crate::reconcile::{common, tool};

/// `someField` → `some_field`, only for keys that are plain camelCase identifiers, so
/// data keys such as `hugepages-2Mi` or `nvidia.com/gpu` pass unchanged.
fn snake_key(key: &str) -> String {
    let identifier = key.starts_with(|c: char| c.is_ascii_lowercase())
        && key.chars().all(|c| c.is_ascii_alphanumeric());
    if !identifier {
        return key.to_owned();
    }
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Frames are snake_case (§3); the object's spec and status are re-keyed to match.
pub fn snake_case(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (snake_key(&k), snake_case(v)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(snake_case).collect()),
        other => other,
    }
}

fn pod_wire(pod: &Pod) -> Value {
    let status = pod.status.as_ref();
    let containers: Vec<Value> = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            let state = c.state.as_ref();
            let (state_name, reason) = match state {
                Some(s) if s.running.is_some() => ("running", String::new()),
                Some(s) if s.terminated.is_some() => (
                    "terminated",
                    s.terminated
                        .as_ref()
                        .and_then(|t| t.reason.clone())
                        .unwrap_or_default(),
                ),
                Some(s) => (
                    "waiting",
                    s.waiting
                        .as_ref()
                        .and_then(|w| w.reason.clone())
                        .unwrap_or_default(),
                ),
                None => ("waiting", String::new()),
            };
            json!({"name": c.name, "ready": c.ready, "state": state_name, "reason": reason})
        })
        .collect();
    let ready = matches!(common::pod_health(pod), common::Health::Ready);
    json!({
        "name": pod.name_any(),
        "phase": status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into()),
        "ready": ready,
        "restarts": status
            .and_then(|s| s.container_statuses.as_ref())
            .map(|cs| cs.iter().map(|c| i64::from(c.restart_count)).sum::<i64>())
            .unwrap_or(0),
        "node": pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "containers": containers,
    })
}

struct Common<'a, S> {
    kind: Kind,
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &'a dyn erased::Spec,
    status: Option<&'a S>,
    phase: Option<String>,
    message: Option<String>,
    ready: bool,
    pods: Vec<Value>,
}

/// A tiny indirection so `Common` can hold any spec type without generics everywhere.
mod erased {
    pub trait Spec {
        fn to_value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Spec for T {
        fn to_value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or_default()
        }
    }
}

fn build<S: Serialize>(c: Common<'_, S>) -> Value {
    let status = c
        .status
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or(json!({}));
    json!({
        "kind": c.kind.as_str(),
        "namespace": c.meta.namespace.clone().unwrap_or_default(),
        "name": c.meta.name.clone().unwrap_or_default(),
        "uid": c.meta.uid.clone().unwrap_or_default(),
        "generation": c.meta.generation.unwrap_or(0),
        "resource_version": c.meta.resource_version.clone().unwrap_or_default(),
        "created_at": c.meta.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        "labels": c.meta.labels.clone().unwrap_or_default(),
        "phase": c.phase.unwrap_or_default(),
        "ready": c.ready,
        "message": c.message.unwrap_or_default(),
        "spec": snake_case(c.spec.to_value()),
        "status": snake_case(status),
        "pods": c.pods,
    })
}

fn owned_pod(ctx: &Context, ns: &str, name: &str, uid: Option<String>) -> Vec<Value> {
    ctx.pods
        .get(ns, name)
        .filter(|p| common::is_owned_by(&p.metadata, uid.as_deref()))
        .map(|p| vec![pod_wire(&p)])
        .unwrap_or_default()
}

pub fn agent(ctx: &Context, a: &Agent) -> Value {
    let ns = a.namespace().unwrap_or_default();
    let st = a.status.as_ref();
    build(Common {
        kind: Kind::Agent,
        meta: &a.metadata,
        spec: &a.spec,
        status: st,
        phase: st.and_then(|s| s.phase).map(|p| format!("{p:?}")),
        message: st.and_then(|s| s.message.clone()),
        ready: st.and_then(|s| s.phase) == Some(crate::crd::AgentPhase::Active),
        pods: owned_pod(ctx, &ns, &a.name_any(), a.uid()),
    })
}

pub fn tool(ctx: &Context, t: &Tool) -> Value {
    let ns = t.namespace().unwrap_or_default();
    let st = t.status.as_ref();
    build(Common {
        kind: Kind::Tool,
        meta: &t.metadata,
        spec: &t.spec,
        status: st,
        phase: st.and_then(|s| s.phase).map(|p| format!("{p:?}")),
        message: st.and_then(|s| s.message.clone()),
        ready: st.and_then(|s| s.phase) == Some(crate::crd::ToolPhase::Ready),
        pods: owned_pod(ctx, &ns, &tool::pod_name(&t.name_any()), t.uid()),
    })
}

pub fn runtime(r: &Runtime) -> Value {
    let st = r.status.as_ref();
    build(Common {
        kind: Kind::Runtime,
        meta: &r.metadata,
        spec: &r.spec,
        status: st,
        phase: st.and_then(|s| s.phase).map(|p| format!("{p:?}")),
        message: st.and_then(|s| s.message.clone()),
        ready: st.and_then(|s| s.phase) == Some(crate::crd::RuntimePhase::Ready),
        pods: vec![],
    })
}

pub fn memory(m: &Memory) -> Value {
    let st = m.status.as_ref();
    build(Common {
        kind: Kind::Memory,
        meta: &m.metadata,
        spec: &m.spec,
        status: st,
        phase: st.and_then(|s| s.phase).map(|p| format!("{p:?}")),
        message: st.and_then(|s| s.message.clone()),
        ready: st.and_then(|s| s.phase) == Some(crate::crd::MemoryPhase::Bound),
        pods: vec![],
    })
}

/// The wire form of one custom resource as cached now, if it exists.
pub fn of(ctx: &Context, kind: Kind, ns: &str, name: &str) -> Option<Value> {
    match kind {
        Kind::Agent => ctx.agents.get(ns, name).map(|a| agent(ctx, &a)),
        Kind::Tool => ctx.tools.get(ns, name).map(|t| tool(ctx, &t)),
        Kind::Runtime => ctx.runtimes.get(ns, name).map(|r| runtime(&r)),
        Kind::Memory => ctx.memories.get(ns, name).map(|m| memory(&m)),
    }
}

/// The changes noted since the last snapshot or delta, each as the object's newest
/// state, or its removal when it is gone.
pub fn pending_changes(ctx: &Context) -> Vec<crate::connect::frame::Change> {
    use crate::connect::frame::Change;
    ctx.link
        .take_dirty()
        .into_iter()
        .map(|c| {
            let current = (!c.removed)
                .then(|| of(ctx, c.key.kind, &c.key.namespace, &c.key.name))
                .flatten();
            match current {
                Some(resource) => Change::Upsert { resource },
                None => Change::Remove {
                    kind: c.key.kind.as_str().to_owned(),
                    namespace: c.key.namespace,
                    name: c.key.name,
                    uid: c.uid,
                },
            }
        })
        .collect()
}

/// Every watched custom resource, for a snapshot.
pub fn all(ctx: &Context) -> Vec<Value> {
    let mut out = Vec::new();
    out.extend(ctx.agents.all().iter().map(|a| agent(ctx, a)));
    out.extend(ctx.tools.all().iter().map(|t| tool(ctx, t)));
    out.extend(ctx.runtimes.all().iter().map(|r| runtime(r)));
    out.extend(ctx.memories.all().iter().map(|m| memory(m)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_snake_case_but_data_keys_do_not() {
        let v = snake_case(json!({
            "memoryRefs": [{"secretName": "x"}],
            "contextSummary": "s",
            "resources": {"limits": {"hugepages-2Mi": "1", "nvidia.com/gpu": 1}},
            "env": [{"name": "API_KEY", "value": "camelCaseValue"}]
        }));
        assert_eq!(v["memory_refs"][0]["secret_name"], "x");
        assert_eq!(v["context_summary"], "s");
        assert_eq!(v["resources"]["limits"]["hugepages-2Mi"], "1");
        assert_eq!(v["resources"]["limits"]["nvidia.com/gpu"], 1);
        assert_eq!(v["env"][0]["value"], "camelCaseValue");
    }
}
