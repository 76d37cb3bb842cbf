//! What "the snapshot equals the cluster" means in the fault and restart tests: every
//! custom resource of the watched namespaces as `Kind/namespace/name` → its uid,
//! resourceVersion, phase and the pods it owns (name and phase), read once from the API
//! server and once from the wire form the control plane received (a snapshot, or a
//! snapshot with the deltas after it applied). A stale cache shows as an old
//! resourceVersion, a missed creation or deletion as a key too few or too many.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use super::fake_cp::Received;
use autonomic_manager::crd::{Agent, Memory, Runtime, Tool};

pub type State = BTreeMap<String, String>;

fn entry(uid: &str, rv: &str, phase: &str, mut pods: Vec<String>) -> String {
    pods.sort();
    format!("uid={uid} rv={rv} phase={phase} pods=[{}]", pods.join(","))
}

/// The cluster's state of the four kinds in `namespaces`, as the API server has it now.
pub async fn of_cluster(client: &Client, namespaces: &[&str]) -> State {
    let mut state = State::new();
    for ns in namespaces {
        // Owned pods by their controller: (kind, owner name) → "name:phase".
        let mut pods: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let all: Api<Pod> = Api::namespaced(client.clone(), ns);
        for p in all.list(&ListParams::default()).await.expect("list pods") {
            let Some(owner) = p
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
            else {
                continue;
            };
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            pods.entry((owner.kind.clone(), owner.name.clone()))
                .or_default()
                .push(format!("{}:{phase}", p.name_any()));
        }
        for ar in [
            ApiResource::erase::<Agent>(&()),
            ApiResource::erase::<Tool>(&()),
            ApiResource::erase::<Runtime>(&()),
            ApiResource::erase::<Memory>(&()),
        ] {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            for o in api.list(&ListParams::default()).await.expect("list") {
                let name = o.name_any();
                let phase = o.data["status"]["phase"].as_str().unwrap_or("").to_owned();
                let owned = pods
                    .get(&(ar.kind.clone(), name.clone()))
                    .cloned()
                    .unwrap_or_default();
                state.insert(
                    format!("{}/{ns}/{name}", ar.kind),
                    entry(
                        &o.uid().unwrap_or_default(),
                        &o.resource_version().unwrap_or_default(),
                        &phase,
                        owned,
                    ),
                );
            }
        }
    }
    state
}

fn key_of(r: &Value) -> String {
    format!(
        "{}/{}/{}",
        r["kind"].as_str().unwrap_or(""),
        r["namespace"].as_str().unwrap_or(""),
        r["name"].as_str().unwrap_or("")
    )
}

fn entry_of(r: &Value) -> String {
    let pods = r["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}:{}",
                p["name"].as_str().unwrap_or(""),
                p["phase"].as_str().unwrap_or("")
            )
        })
        .collect();
    entry(
        r["uid"].as_str().unwrap_or(""),
        r["resource_version"].as_str().unwrap_or(""),
        r["phase"].as_str().unwrap_or(""),
        pods,
    )
}

/// The state a snapshot frame describes.
pub fn of_snapshot(snapshot: &Received) -> State {
    assert_eq!(snapshot.frame_type(), Some("snapshot"));
    snapshot
        .resources()
        .into_iter()
        .map(|r| (key_of(r), entry_of(r)))
        .collect()
}

/// The state the control plane holds after connection `conn`'s frames up to now: its
/// last snapshot with every later delta applied (upserts and removals). None before a
/// snapshot arrived on it.
pub fn model(frames: &[Received], conn: usize) -> Option<State> {
    let on: Vec<&Received> = frames.iter().filter(|r| r.conn == conn).collect();
    let start = on
        .iter()
        .rposition(|r| r.frame_type() == Some("snapshot"))?;
    let mut state = of_snapshot(on[start]);
    for r in &on[start + 1..] {
        if r.frame_type() != Some("delta") {
            continue;
        }
        let changes = r.json().and_then(|j| j["changes"].as_array().cloned());
        for c in changes.into_iter().flatten() {
            match c["op"].as_str() {
                Some("upsert") => {
                    state.insert(key_of(&c["resource"]), entry_of(&c["resource"]));
                }
                Some("remove") => {
                    state.remove(&key_of(&c));
                }
                other => panic!("a delta change with op {other:?}: {c}"),
            }
        }
    }
    Some(state)
}

/// The differences of two states, one line each (empty when equal).
pub fn diff(seen: &State, cluster: &State) -> String {
    let mut out = String::new();
    for (k, v) in cluster {
        match seen.get(k) {
            None => out += &format!("missing  {k}: {v}\n"),
            Some(s) if s != v => out += &format!("stale    {k}: {s}\n      now {k}: {v}\n"),
            _ => {}
        }
    }
    for (k, v) in seen {
        if !cluster.contains_key(k) {
            out += &format!("gone     {k}: {v}\n");
        }
    }
    out
}

/// A kind of the four, for callers that build keys.
pub fn kind_of<K: Resource<DynamicType = ()>>() -> String {
    K::kind(&()).into_owned()
}
