//! The resource wire form (PROTOCOL.md §5): what a snapshot or delta says about one
//! custom resource and the pods it owns. Pure: built from cached objects.

use kube::ResourceExt;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::Context;
use crate::crd::PhaseStatus;
use crate::crd::{Agent, Kind, Memory, Runtime, Tool};
use crate::reconcile::{common, tool};
use crate::store::PodView;

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

pub(crate) fn pod_wire(pod: &PodView) -> Value {
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

/// The wire form of one custom resource: its metadata, spec and status, the phase and
/// message the status carries, `ready` when the phase is `ready_phase`, and its pods.
fn build<K, P, S>(
    kind: Kind,
    obj: &K,
    spec: &P,
    status: Option<&S>,
    ready_phase: &str,
    pods: Vec<Value>,
) -> Value
where
    K: ResourceExt,
    P: Serialize,
    S: PhaseStatus,
{
    let meta = obj.meta();
    let phase = status.and_then(PhaseStatus::phase_name).unwrap_or_default();
    json!({
        "kind": kind.as_str(),
        "namespace": meta.namespace.clone().unwrap_or_default(),
        "name": meta.name.clone().unwrap_or_default(),
        "uid": meta.uid.clone().unwrap_or_default(),
        "generation": meta.generation.unwrap_or(0),
        "resource_version": meta.resource_version.clone().unwrap_or_default(),
        "created_at": meta.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        "labels": meta.labels.clone().unwrap_or_default(),
        "ready": phase == ready_phase,
        "phase": phase,
        "message": status.map(PhaseStatus::message_text).unwrap_or_default(),
        "spec": snake_case(serde_json::to_value(spec).unwrap_or_default()),
        "status": snake_case(status.map(|s| serde_json::to_value(s).unwrap_or_default()).unwrap_or(json!({}))),
        "pods": pods,
    })
}

fn owned_pod(ctx: &Context, ns: &str, name: &str, uid: Option<String>) -> Vec<Value> {
    ctx.store
        .owned_pod(ns, name, uid.as_deref())
        .map(|p| vec![pod_wire(&p)])
        .unwrap_or_default()
}

pub fn agent(ctx: &Context, a: &Agent) -> Value {
    let pods = owned_pod(
        ctx,
        &a.namespace().unwrap_or_default(),
        &a.name_any(),
        a.uid(),
    );
    build(Kind::Agent, a, &a.spec, a.status.as_ref(), "Active", pods)
}

pub fn tool(ctx: &Context, t: &Tool) -> Value {
    let pod = tool::pod_name(&t.name_any());
    let pods = owned_pod(ctx, &t.namespace().unwrap_or_default(), &pod, t.uid());
    let mut v = build(Kind::Tool, t, &t.spec, t.status.as_ref(), "Ready", pods);
    v["demand"] = tool_demand(t);
    v
}

/// Why a Tool's pod runs or not, for the dashboard (from its spec and status):
/// `users` (Agents that want it), `state` — `disabled`, `always_on`, `in_use`, `grace`
/// (no users; the pod stays until `idle_until` unless one returns) or `idle` (no users,
/// no pod) — and, in the grace, `idle_since` and `idle_until` (RFC 3339, else null).
pub fn tool_demand(t: &Tool) -> Value {
    let status = t.status.as_ref();
    let users = status.and_then(|s| s.users).unwrap_or(0);
    let since = status.and_then(|s| s.idle_since.as_ref()).map(|s| s.0);
    let state = if t.spec.disabled {
        "disabled"
    } else if t.spec.always_on {
        "always_on"
    } else if users > 0 {
        "in_use"
    } else if since.is_some() {
        "grace"
    } else {
        "idle"
    };
    let (since, until) = match since.filter(|_| state == "grace") {
        Some(s) => {
            let grace = k8s_openapi::jiff::SignedDuration::from_secs(t.spec.idle_seconds);
            let until = s.checked_add(grace).unwrap_or(s);
            (json!(time_text(s)), json!(time_text(until)))
        }
        None => (Value::Null, Value::Null),
    };
    json!({"users": users, "state": state, "idle_since": since, "idle_until": until})
}

/// A time as the API server writes one: RFC 3339 to the second, UTC.
fn time_text(t: k8s_openapi::jiff::Timestamp) -> String {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t))
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub fn runtime(r: &Runtime) -> Value {
    build(
        Kind::Runtime,
        r,
        &r.spec,
        r.status.as_ref(),
        "Ready",
        vec![],
    )
}

pub fn memory(m: &Memory) -> Value {
    build(Kind::Memory, m, &m.spec, m.status.as_ref(), "Bound", vec![])
}

/// The wire form of one custom resource as cached now, if it exists.
pub fn of(ctx: &Context, kind: Kind, ns: &str, name: &str) -> Option<Value> {
    match kind {
        Kind::Agent => ctx.store.agents.get(ns, name).map(|a| agent(ctx, &a)),
        Kind::Tool => ctx.store.tools.get(ns, name).map(|t| tool(ctx, &t)),
        Kind::Runtime => ctx.store.runtimes.get(ns, name).map(|r| runtime(&r)),
        Kind::Memory => ctx.store.memories.get(ns, name).map(|m| memory(&m)),
    }
}

/// The changes noted since the last snapshot or delta, each as the object's newest
/// state, or its removal when it is gone; and when each was first marked, for
/// [`super::Link::deltas_written`] once the delta is out.
pub fn pending_changes(
    ctx: &Context,
) -> (
    Vec<crate::connect::frame::Change>,
    Vec<tokio::time::Instant>,
) {
    use crate::connect::frame::Change;
    ctx.link
        .take_pending()
        .into_iter()
        .map(|(c, marked)| {
            let current = (!c.removed)
                .then(|| of(ctx, c.key.kind, &c.key.namespace, &c.key.name))
                .flatten();
            let change = match current {
                Some(resource) => Change::Upsert { resource },
                None => Change::Remove {
                    kind: c.key.kind.as_str().to_owned(),
                    namespace: c.key.namespace,
                    name: c.key.name,
                    uid: c.uid,
                },
            };
            (change, marked)
        })
        .unzip()
}

/// Every watched custom resource, for a snapshot.
pub fn all(ctx: &Context) -> Vec<Value> {
    each(ctx).collect()
}

/// Every watched object's wire form, built one at a time.
fn each(ctx: &Context) -> impl Iterator<Item = Value> + '_ {
    let agents = ctx.store.agents.all().into_iter().map(|a| agent(ctx, &a));
    let tools = ctx.store.tools.all().into_iter().map(|t| tool(ctx, &t));
    let runtimes = ctx.store.runtimes.all().into_iter().map(|r| runtime(&r));
    let memories = ctx.store.memories.all().into_iter().map(|m| memory(&m));
    agents.chain(tools).chain(runtimes).chain(memories)
}

/// The `snapshot` frame's text in pieces of about `piece` bytes (whole resources; a
/// resource larger than `piece` is a piece of its own), written one resource at a time:
/// the same text as encoding a [`super::frame::Snapshot`], without holding every wire
/// form as a JSON tree at once (at 1 000 Agents that tree is several times the text's
/// size), nor the whole text: the session sends each piece as one fragment of the
/// message (RFC 6455 §5.4). At 10 000 Agents the text is 8 MB, which the whole message
/// held twice (the text, then the socket's write buffer, which keeps its size).
pub fn snapshot_pieces(
    ctx: &Context,
    seq: u64,
    piece: usize,
) -> Pieces<impl Iterator<Item = Value> + Send + '_> {
    Pieces::new(seq, each(ctx), piece)
}

/// The snapshot text in pieces: each is `(bytes, last)`.
pub struct Pieces<I: Iterator> {
    resources: std::iter::Peekable<I>,
    head: Option<String>,
    piece: usize,
    first: bool,
    done: bool,
}

impl<I: Iterator> Pieces<I> {
    fn new(seq: u64, resources: I, piece: usize) -> Self {
        Pieces {
            resources: resources.peekable(),
            head: Some(format!(r#"{{"type":"snapshot","seq":{seq},"resources":["#)),
            piece,
            first: true,
            done: false,
        }
    }
}

impl<I: Iterator<Item = V>, V: std::borrow::Borrow<Value>> Iterator for Pieces<I> {
    type Item = (Vec<u8>, bool);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut out = self.head.take().map(String::into_bytes).unwrap_or_default();
        loop {
            let Some(r) = self.resources.next() else {
                out.extend_from_slice(b"]}");
                self.done = true;
                return Some((out, true));
            };
            if !self.first {
                out.push(b',');
            }
            self.first = false;
            write_json(&mut out, r.borrow());
            if out.len() >= self.piece && self.resources.peek().is_some() {
                return Some((out, false));
            }
        }
    }
}

/// The whole `snapshot` frame's text of given wire forms (the benchmark times this).
pub fn snapshot_text_of<V: std::borrow::Borrow<Value>>(
    seq: u64,
    resources: impl Iterator<Item = V>,
) -> String {
    let mut pieces = Pieces::new(seq, resources, usize::MAX);
    let (text, _) = pieces.next().expect("one piece");
    String::from_utf8(text).expect("JSON text written from strings is UTF-8")
}

/// Appends `v` as compact JSON, byte for byte what `serde_json::to_string` writes.
///
/// Hand-written for speed in a crate built for size: serde's writer instantiated here is
/// about three times slower than at full speed, and musl's `memcpy` is slow for the
/// few-byte copies JSON is made of, so short runs are copied in a loop.
pub fn write_json(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => put(out, b"null"),
        Value::Bool(b) => put(out, if *b { b"true" } else { b"false" }),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => put_u64(out, u),
            (None, Some(i)) => {
                out.push(b'-');
                put_u64(out, i.unsigned_abs());
            }
            // Floats: serde_json's own formatting (ryu), as its writer does.
            _ => put(out, n.to_string().as_bytes()),
        },
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                write_json(out, item);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string: runs that need no escape are copied whole.
fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut rest = s.as_bytes();
    while let Some(i) = rest
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
    {
        put(out, &rest[..i]);
        match rest[i] {
            b'"' => put(out, b"\\\""),
            b'\\' => put(out, b"\\\\"),
            b'\n' => put(out, b"\\n"),
            b'\r' => put(out, b"\\r"),
            b'\t' => put(out, b"\\t"),
            0x08 => put(out, b"\\b"),
            0x0c => put(out, b"\\f"),
            b => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                put(out, b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        rest = &rest[i + 1..];
    }
    put(out, rest);
    out.push(b'"');
}

/// Short runs are copied in a plain loop: musl's `memcpy` is slow for a few bytes.
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.len() > 32 {
        out.extend_from_slice(bytes);
    } else {
        out.extend(bytes.iter().copied());
    }
}

/// Decimal digits without going through `fmt` and a `String`.
fn put_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    put(out, &digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_streamed_snapshot_is_the_encoded_frame() {
        use crate::connect::frame::{self, Frame, Snapshot};
        for n in [0, 1, 3] {
            let resources: Vec<Value> = (0..n)
                .map(|i| json!({"kind": "Agent", "name": format!("a{i}"), "spec": {"x": [1, "é"]}}))
                .collect();
            let text = snapshot_text_of(7, resources.iter());
            // In pieces of at least 20 bytes, each ending on a whole resource.
            let pieces: Vec<(Vec<u8>, bool)> = Pieces::new(7, resources.iter(), 20).collect();
            assert_eq!(pieces.len(), n.max(1));
            assert!(pieces.iter().rev().skip(1).all(|(_, last)| !last));
            assert!(pieces.last().unwrap().1);
            let joined: Vec<u8> = pieces.into_iter().flat_map(|(p, _)| p).collect();
            assert_eq!(String::from_utf8(joined).unwrap(), text);
            assert_eq!(
                text,
                frame::encode(&Frame::Snapshot(Snapshot { seq: 7, resources }))
            );
        }
    }

    #[test]
    fn a_tool_says_why_its_pod_runs_or_not() {
        let tool = |spec: &str, status: &str| -> Tool {
            serde_saphyr::from_str(&format!(
                "{{apiVersion: autonomic.sh/v1alpha1, kind: Tool, metadata: {{name: t, namespace: n}}, spec: {{image: i, idleSeconds: 60{spec}}}, status: {{phase: Pending{status}}}}}"
            ))
            .unwrap()
        };
        let d = |spec: &str, status: &str| tool_demand(&tool(spec, status));
        assert_eq!(
            d("", ""),
            json!({"users": 0, "state": "idle", "idle_since": null, "idle_until": null})
        );
        assert_eq!(d("", ", users: 2")["state"], "in_use");
        assert_eq!(d("", ", users: 2")["users"], 2);
        assert_eq!(
            d("", ", users: 0, idleSince: '2026-12-03T07:00:00Z'"),
            json!({"users": 0, "state": "grace", "idle_since": "2026-12-03T07:00:00Z",
                "idle_until": "2026-12-03T07:01:00Z"})
        );
        assert_eq!(d(", alwaysOn: true", ", users: 0")["state"], "always_on");
        assert_eq!(
            d(", disabled: true, alwaysOn: true", ", users: 3")["state"],
            "disabled"
        );
        // The status travels too, re-keyed like the rest of the frame.
        let status = snake_case(
            serde_json::to_value(tool("", ", users: 1, idleSince: '2026-12-03T07:00:00Z'").status)
                .unwrap(),
        );
        assert_eq!(
            (status["users"].clone(), status["idle_since"].clone()),
            (json!(1), json!("2026-12-03T07:00:00Z"))
        );
    }

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

    /// The hand-written writer is serde_json's, byte for byte, on what can trip a JSON
    /// writer: every escape, control bytes, non-ASCII, numbers of every kind, nesting.
    #[test]
    fn write_json_is_serde_json() {
        let mut controls = String::new();
        for b in 0u8..0x20 {
            controls.push(char::from(b));
        }
        let samples = [
            json!(null),
            json!(true),
            json!(false),
            json!(""),
            json!("plain"),
            json!("quote \" backslash \\ slash / tab \t nl \n cr \r bs \u{8} ff \u{c}"),
            json!(controls),
            json!("\u{7f} é ✓ 😀 \u{2028}"),
            json!([
                "a long run of text that needs no escaping at all, longer than 32 bytes",
                "x\"y"
            ]),
            json!([
                0,
                7,
                10,
                -1,
                -10,
                1234567890,
                i64::MAX,
                1.5,
                0.1,
                -2.0,
                -0.0,
                1e300,
                2.5e-8,
                u64::MAX,
                i64::MIN,
                100000000000000000000.0
            ]),
            json!({}),
            json!([]),
            json!({"b": {"c": [[], {}, [null]]}, "a": "z", "kéy\n": 1}),
        ];
        for v in samples {
            let mut out = Vec::new();
            write_json(&mut out, &v);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&v).unwrap()
            );
        }
    }
}

#[cfg(test)]
mod pod_tests {
    use super::pod_wire;
    use crate::reconcile::common::{Health, pod_health};
    use crate::store::{PodView, trim};
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
        // Annotations: the two the manager reads, out of the metadata's map.
        assert_eq!(pod.metadata.annotations, None);
        assert_eq!(pod.spec_hash.as_deref(), Some("abc"));
        assert_eq!(pod.context_summary, None);

        let mut crashing = served();
        crashing["status"]["containerStatuses"][0]["ready"] = json!(false);
        crashing["status"]["containerStatuses"][0]["state"] = json!({"waiting":
            {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}});
        let pod = read(crashing);
        assert_eq!(
            pod_health(&pod),
            Health::Error(
                crate::crd::Reason::CrashLoopBackOff,
                "container runtime: CrashLoopBackOff: back-off 5m0s".into()
            )
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
            Health::Failed(
                crate::crd::Reason::PodFailed,
                "container agentlet exited with code 3 (Error)".into()
            )
        );

        let mut pending = served();
        pending["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]});
        assert!(
            matches!(pod_health(&read(pending)), Health::Pending(_, m) if m.contains("0/1 nodes"))
        );
    }
}
