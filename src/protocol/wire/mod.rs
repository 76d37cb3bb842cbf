//! The resource wire form (PROTOCOL.md §5): what a snapshot or delta says about one
//! custom resource and the pods it owns. Pure: built from cached objects.

use kube::ResourceExt;
use serde::Serialize;
use std::sync::Arc;

use crate::protocol::frame::Json;

use crate::crd::PhaseStatus;
use crate::crd::{Agent, Kind, Memory, Runtime, Tool};
use crate::store::PodView;
use crate::store::Store;
use crate::store::watch::Changed;
use crate::store::{Health, pod_health};

mod json;
mod snake;

use json::{put, put_bool, put_i64, write_str};
use snake::{Mask, write_snake, write_snake_with};

/// Appends one pod's wire form: its name, phase, readiness, restarts, node and each
/// container's state with the reason a waiting or terminated one gives. Keys in sorted
/// order, here and in [`write_resource`], as the JSON object they were first built as
/// wrote them.
fn write_pod(out: &mut Vec<u8>, pod: &PodView) {
    let status = pod.status.as_ref();
    let containers = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    put(out, b"{\"containers\":[");
    for (i, c) in containers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let state = c.state.as_ref();
        let (state_name, reason) = match state {
            Some(s) if s.running.is_some() => ("running", None),
            Some(s) if s.terminated.is_some() => (
                "terminated",
                s.terminated.as_ref().and_then(|t| t.reason.as_deref()),
            ),
            Some(s) => (
                "waiting",
                s.waiting.as_ref().and_then(|w| w.reason.as_deref()),
            ),
            None => ("waiting", None),
        };
        put(out, b"{\"name\":");
        write_str(out, &c.name);
        put(out, b",\"ready\":");
        put_bool(out, c.ready);
        put(out, b",\"reason\":");
        write_str(out, reason.unwrap_or_default());
        put(out, b",\"state\":");
        write_str(out, state_name);
        out.push(b'}');
    }
    put(out, b"],\"name\":");
    write_str(out, pod.metadata.name.as_deref().unwrap_or_default());
    put(out, b",\"node\":");
    write_str(
        out,
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default(),
    );
    put(out, b",\"phase\":");
    write_str(
        out,
        status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending"),
    );
    put(out, b",\"ready\":");
    put_bool(out, matches!(pod_health(pod), Health::Ready));
    put(out, b",\"restarts\":");
    put_i64(
        out,
        containers.iter().map(|c| i64::from(c.restart_count)).sum(),
    );
    out.push(b'}');
}

/// Appends the wire form of one custom resource: its kind, metadata, spec and status, the
/// phase and message the status carries, `ready` when the phase is its kind's ready one
/// ([`PhaseStatus::READY`]), its pod if it has one and, for a Tool, its `demand`.
fn write_resource<K, P, S>(
    out: &mut Vec<u8>,
    obj: &K,
    spec: &P,
    status: Option<&S>,
    pod: Option<&PodView>,
    demand: Option<&Demand>,
    mask: Mask,
) where
    K: kube::Resource<DynamicType = ()>,
    P: Serialize,
    S: PhaseStatus,
{
    let meta = obj.meta();
    let phase = status.and_then(PhaseStatus::phase_name).unwrap_or_default();
    let ready = status.and_then(PhaseStatus::phase) == Some(S::READY);
    fn text(s: &Option<String>) -> &str {
        s.as_deref().unwrap_or_default()
    }
    put(out, b"{\"created_at\":");
    let created = meta.creation_timestamp.as_ref().map(|t| t.0.to_string());
    write_str(out, text(&created));
    if let Some(demand) = demand {
        put(out, b",\"demand\":");
        demand.write(out);
    }
    put(out, b",\"generation\":");
    put_i64(out, meta.generation.unwrap_or(0));
    put(out, b",\"kind\":");
    write_str(out, &K::kind(&()));
    put(out, b",\"labels\":{");
    for (i, (k, v)) in meta.labels.iter().flatten().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, k);
        out.push(b':');
        write_str(out, v);
    }
    put(out, b"},\"message\":");
    write_str(
        out,
        status.map(PhaseStatus::message_text).unwrap_or_default(),
    );
    put(out, b",\"name\":");
    write_str(out, text(&meta.name));
    put(out, b",\"namespace\":");
    write_str(out, text(&meta.namespace));
    put(out, b",\"phase\":");
    write_str(out, &phase);
    put(out, b",\"pods\":[");
    if let Some(pod) = pod {
        write_pod(out, pod);
    }
    put(out, b"],\"ready\":");
    put_bool(out, ready);
    put(out, b",\"resource_version\":");
    write_str(out, text(&meta.resource_version));
    put(out, b",\"spec\":");
    write_snake_with(out, spec, Some(mask));
    put(out, b",\"status\":");
    match status {
        Some(status) => write_snake(out, status),
        None => put(out, b"{}"),
    }
    put(out, b",\"uid\":");
    write_str(out, text(&meta.uid));
    out.push(b'}');
}

/// A custom resource as cached.
pub enum Resource {
    Agent(Arc<Agent>),
    Tool(Arc<Tool>),
    Runtime(Arc<Runtime>),
    Memory(Arc<Memory>),
}

/// What writes itself as JSON text: a resource's wire form, or one already written.
pub trait WriteJson {
    fn write_json(&self, out: &mut Vec<u8>);
}

impl WriteJson for Json {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.get().as_bytes());
    }
}

impl<T: WriteJson + ?Sized> WriteJson for &T {
    fn write_json(&self, out: &mut Vec<u8>) {
        (**self).write_json(out);
    }
}

/// What the wire form is read from: the caches, and whether env values go as they are
/// (`AUTONOMIC_SEND_ENV_VALUES`) or masked (TRUST.md §4).
#[derive(Clone, Copy)]
pub struct Form<'a> {
    store: &'a Store,
    mask: Mask,
}

impl<'a> Form<'a> {
    pub fn new(store: &'a Store, send_env_values: bool) -> Self {
        Form {
            store,
            mask: Mask {
                env_values: !send_env_values,
            },
        }
    }
}

/// A resource's wire form as of the caches now (its pod is read when it is written).
pub struct Wire<'a> {
    form: Form<'a>,
    resource: Resource,
}

impl WriteJson for Wire<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        let store = self.form.store;
        let mask = self.form.mask;
        let owned = |meta: &kube::api::ObjectMeta, pod: &str| {
            store.owned_pod(
                meta.namespace.as_deref().unwrap_or_default(),
                pod,
                meta.uid.as_deref(),
            )
        };
        match &self.resource {
            Resource::Agent(a) => {
                let pod = owned(&a.metadata, &a.name_any());
                write_resource(
                    out,
                    &**a,
                    &a.spec,
                    a.status.as_ref(),
                    pod.as_deref(),
                    None,
                    mask,
                );
            }
            Resource::Tool(t) => {
                let pod = owned(&t.metadata, &crate::crd::tool_pod_name(&t.name_any()));
                let demand = Some(tool_demand(t));
                let (spec, status) = (&t.spec, t.status.as_ref());
                write_resource(
                    out,
                    &**t,
                    spec,
                    status,
                    pod.as_deref(),
                    demand.as_ref(),
                    mask,
                );
            }
            Resource::Runtime(r) => {
                write_resource(out, &**r, &r.spec, r.status.as_ref(), None, None, mask);
            }
            Resource::Memory(m) => {
                write_resource(out, &**m, &m.spec, m.status.as_ref(), None, None, mask);
            }
        }
    }
}

impl Wire<'_> {
    /// The wire form as text of its own, for a delta (a snapshot is written in pieces).
    fn json(&self) -> Option<Json> {
        let mut out = Vec::new();
        self.write_json(&mut out);
        String::from_utf8(out)
            .map(Json::written)
            .map_err(|e| e.to_string())
            .inspect_err(|e| tracing::error!(error = %e, "a wire form that is not UTF-8: left out"))
            .ok()
    }
}

/// Why a Tool's pod runs or not, for the dashboard (from its spec and status):
/// `users` (Agents that want it), `state` — `disabled`, `always_on`, `in_use`, `grace`
/// (no users; the pod stays until `idle_until` unless one returns) or `idle` (no users,
/// no pod) — and, in the grace, `idle_since` and `idle_until` (RFC 3339, else null).
pub struct Demand {
    users: i64,
    state: &'static str,
    /// `idle_since` and `idle_until`, in the grace.
    idle: Option<(String, String)>,
}

pub fn tool_demand(t: &Tool) -> Demand {
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
    let idle = since.filter(|_| state == "grace").map(|s| {
        let grace = k8s_openapi::jiff::SignedDuration::from_secs(t.spec.idle_seconds);
        let until = s.checked_add(grace).unwrap_or(s);
        (time_text(s), time_text(until))
    });
    Demand { users, state, idle }
}

impl Demand {
    /// Appends the object, keys in sorted order as the rest of the wire form.
    fn write(&self, out: &mut Vec<u8>) {
        let time = |out: &mut Vec<u8>, t: Option<&String>| match t {
            Some(t) => write_str(out, t),
            None => put(out, b"null"),
        };
        put(out, b"{\"idle_since\":");
        time(out, self.idle.as_ref().map(|(since, _)| since));
        put(out, b",\"idle_until\":");
        time(out, self.idle.as_ref().map(|(_, until)| until));
        put(out, b",\"state\":");
        write_str(out, self.state);
        put(out, b",\"users\":");
        put_i64(out, self.users);
        out.push(b'}');
    }
}

/// A time as the API server writes one: RFC 3339 to the second, UTC.
fn time_text(t: k8s_openapi::jiff::Timestamp) -> String {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t))
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The wire form of one custom resource as cached now, if it exists.
pub fn of(form: Form<'_>, kind: Kind, ns: &str, name: &str) -> Option<Json> {
    let store = form.store;
    let resource = match kind {
        Kind::Agent => Resource::Agent(store.agents.get(ns, name)?),
        Kind::Tool => Resource::Tool(store.tools.get(ns, name)?),
        Kind::Runtime => Resource::Runtime(store.runtimes.get(ns, name)?),
        Kind::Memory => Resource::Memory(store.memories.get(ns, name)?),
    };
    Wire { form, resource }.json()
}

/// The `pending` changes, each as the object's newest state, or its removal when it is
/// gone; and when each was first marked (the delta latency).
pub fn changes<T>(
    form: Form<'_>,
    pending: Vec<(Changed, T)>,
) -> (Vec<super::frame::Change>, Vec<T>) {
    use super::frame::Change;
    pending
        .into_iter()
        .map(|(c, marked)| {
            let current = (!c.removed)
                .then(|| of(form, c.key.kind, &c.key.namespace, &c.key.name))
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

/// Every watched custom resource, for a snapshot (the legacy HTTP transport's).
pub fn all(form: Form<'_>) -> Vec<Json> {
    each(form).filter_map(|w| w.json()).collect()
}

/// Every watched object, to be written one at a time.
fn each(form: Form<'_>) -> impl Iterator<Item = Wire<'_>> {
    let store = form.store;
    let wire = move |resource| Wire { form, resource };
    let agents = store.agents.all().into_iter().map(Resource::Agent);
    let tools = store.tools.all().into_iter().map(Resource::Tool);
    let runtimes = store.runtimes.all().into_iter().map(Resource::Runtime);
    let memories = store.memories.all().into_iter().map(Resource::Memory);
    agents
        .chain(tools)
        .chain(runtimes)
        .chain(memories)
        .map(wire)
}

/// The `snapshot` frame's text in pieces of about `piece` bytes (whole resources; a
/// resource larger than `piece` is a piece of its own), written one resource at a time:
/// the same text as encoding a [`super::frame::Snapshot`], without holding every wire
/// form as a JSON tree at once (at 1 000 Agents that tree is several times the text's
/// size), nor the whole text: the session sends each piece as one fragment of the
/// message (RFC 6455 §5.4). At 10 000 Agents the text is 8 MB, which the whole message
/// held twice (the text, then the socket's write buffer, which keeps its size).
pub fn snapshot_pieces(
    form: Form<'_>,
    seq: u64,
    piece: usize,
) -> Pieces<impl Iterator<Item = Wire<'_>> + Send + '_> {
    Pieces::new(seq, each(form), piece)
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

impl<I: Iterator<Item = V>, V: WriteJson> Iterator for Pieces<I> {
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
            r.write_json(&mut out);
            if out.len() >= self.piece && self.resources.peek().is_some() {
                return Some((out, false));
            }
        }
    }
}

/// The whole `snapshot` frame's text of the caches, as [`snapshot_pieces`] writes it
/// (the benchmark times this).
pub fn snapshot_text(form: Form<'_>, seq: u64) -> String {
    snapshot_text_of(seq, each(form))
}

/// The whole `snapshot` frame's text of given wire forms.
pub fn snapshot_text_of<V: WriteJson>(seq: u64, resources: impl Iterator<Item = V>) -> String {
    let mut pieces = Pieces::new(seq, resources, usize::MAX);
    let (text, _) = pieces.next().expect("one piece");
    String::from_utf8(text).expect("JSON text written from strings is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use snake::{MASKED, mask_url_password};
    /// Sample objects of every kind, with the parts the wire form reads: labels, odd
    /// keys, escapes, a status with conditions, a pod with a container in each state.
    fn samples() -> (Agent, PodView, Tool, Runtime, Memory) {
        let agent: Agent = serde_json::from_value(json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
            "metadata": {"name": "a-1", "namespace": "ns", "uid": "u-1", "generation": 3,
                "resourceVersion": "42", "creationTimestamp": "2026-12-03T07:00:00Z",
                "labels": {"team": "x\"y", "app.kubernetes.io/name": "agent"}},
            "spec": {"runtime": {"ref": "base", "image": "img:1", "command": ["sleep", "3600"],
                "env": [{"name": "A_B", "value": "line\nbreak"}],
                "resources": {"limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}, "requests": {"hugepages-2Mi": "2Mi"}}},
                "tools": ["t"], "restartPolicy": "OnFailure", "serviceAccountName": "sa"},
            "status": {"phase": "Active", "message": "pod Running", "podName": "a-1", "observedGeneration": 3,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "ok",
                    "lastTransitionTime": "2026-12-03T07:01:00Z", "observedGeneration": 3}]}
        }))
        .unwrap();
        let pod: PodView = serde_json::from_value(json!({
            "metadata": {"name": "a-1", "namespace": "ns", "uid": "p-1",
                "ownerReferences": [{"apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent", "name": "a-1", "uid": "u-1", "controller": true}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "agentlet"}, {"name": "runtime"}, {"name": "init"}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {"name": "agentlet", "ready": true, "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {"startedAt": "2026-12-03T07:00:30Z"}}},
                    {"name": "runtime", "ready": false, "restartCount": 3, "image": "i", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
                    {"name": "init", "ready": false, "restartCount": 1, "image": "i", "imageID": "", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
        }))
        .unwrap();
        let tool: Tool = serde_json::from_value(json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Tool",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u-2", "generation": 1, "resourceVersion": "7"},
            "spec": {"image": "tool:1", "idleSeconds": 60},
            "status": {"phase": "Ready", "users": 0, "idleSince": "2026-12-03T07:00:00Z"}
        }))
        .unwrap();
        let runtime: Runtime = serde_json::from_value(json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Runtime",
            "metadata": {"name": "base", "namespace": "ns"},
            "spec": {"image": "img:0"}
        }))
        .unwrap();
        let memory: Memory = serde_json::from_value(json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Memory",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u-3"},
            "spec": {"backend": "redis", "url": "redis://default:p@ss:w@m:6379/0?x=y", "secretRef": {"name": "s", "key": "k"}},
            "status": {"phase": "Bound", "message": "reachable"}
        }))
        .unwrap();
        (agent, pod, tool, runtime, memory)
    }

    /// The four samples' wire forms as the JSON trees they were built as before they were
    /// written directly (`0bb87a0`..`4cba6a1`), one a line; the env value and the url
    /// password masked since (TRUST.md §4).
    const BEFORE: &str = r#"{"created_at":"2026-12-03T07:00:00Z","generation":3,"kind":"Agent","labels":{"app.kubernetes.io/name":"agent","team":"x\"y"},"message":"pod Running","name":"a-1","namespace":"ns","phase":"Active","pods":[{"containers":[{"name":"agentlet","ready":true,"reason":"","state":"running"},{"name":"runtime","ready":false,"reason":"CrashLoopBackOff","state":"waiting"},{"name":"init","ready":false,"reason":"Completed","state":"terminated"}],"name":"a-1","node":"node-1","phase":"Running","ready":false,"restarts":4}],"ready":true,"resource_version":"42","spec":{"agentlet":{},"paused":false,"restart_policy":"OnFailure","runtime":{"command":["sleep","3600"],"env":[{"name":"A_B","value":"***"}],"image":"img:1","ref":"base","resources":{"limits":{"memory":"1Gi","nvidia.com/gpu":"1"},"requests":{"hugepages-2Mi":"2Mi"}}},"service_account_name":"sa","tools":["t"]},"status":{"conditions":[{"last_transition_time":"2026-12-03T07:01:00Z","message":"ok","observed_generation":3,"reason":"Running","status":"True","type":"Ready"}],"context_summary":null,"memory_refs":[],"message":"pod Running","observed_generation":3,"phase":"Active","pod_name":"a-1","started_at":null},"uid":"u-1"}
{"created_at":"","demand":{"idle_since":"2026-12-03T07:00:00Z","idle_until":"2026-12-03T07:01:00Z","state":"grace","users":0},"generation":1,"kind":"Tool","labels":{},"message":"","name":"t","namespace":"ns","phase":"Ready","pods":[],"ready":true,"resource_version":"7","spec":{"always_on":false,"disabled":false,"idle_seconds":60,"image":"tool:1","port":8080},"status":{"conditions":[],"endpoint":null,"idle_since":"2026-12-03T07:00:00Z","message":null,"observed_generation":null,"phase":"Ready","pod_name":null,"users":0},"uid":"u-2"}
{"created_at":"","generation":0,"kind":"Runtime","labels":{},"message":"","name":"base","namespace":"ns","phase":"","pods":[],"ready":false,"resource_version":"","spec":{"image":"img:0"},"status":{},"uid":""}
{"created_at":"","generation":0,"kind":"Memory","labels":{},"message":"reachable","name":"m","namespace":"ns","phase":"Bound","pods":[],"ready":true,"resource_version":"","spec":{"backend":"redis","secret_ref":{"key":"k","name":"s"},"url":"redis://default:***@m:6379/0?x=y"},"status":{"conditions":[],"message":"reachable","observed_generation":null,"phase":"Bound","secret_name":null},"uid":"u-3"}"#;

    #[test]
    fn each_kind_is_written_with_the_content_it_had_as_a_tree() {
        let (agent, pod, tool, runtime, memory) = samples();
        let store = Store::default();
        let form = Form::new(&store, false);
        let agent = store.agents.insert(agent);
        store.pods.insert(pod);
        store.tools.insert(tool);
        store.runtimes.insert(runtime);
        store.memories.insert(memory);
        let kinds = [
            (Kind::Agent, "a-1"),
            (Kind::Tool, "t"),
            (Kind::Runtime, "base"),
            (Kind::Memory, "m"),
        ];
        for ((kind, name), before) in kinds.into_iter().zip(BEFORE.lines()) {
            let before: Value = serde_json::from_str(before).unwrap();
            let written =
                of(form, kind, "ns", name).map(|j| serde_json::from_str(j.get()).unwrap());
            assert_eq!(written, Some(before), "{kind:?}");
        }
        // The top level and the pod are written in the order the tree wrote them.
        let mut written = Vec::new();
        let resource = Resource::Agent(agent);
        Wire { form, resource }.write_json(&mut written);
        let written = String::from_utf8(written).unwrap();
        let head = |t: &str| t.split_once(",\"spec\"").unwrap().0.to_owned();
        assert_eq!(head(&written), head(BEFORE.lines().next().unwrap()));
    }

    #[test]
    fn a_url_password_is_masked_and_nothing_else() {
        for (url, want) in [
            (
                "redis://default:pw@redis:6379/0",
                "redis://default:***@redis:6379/0",
            ),
            ("redis://:pw@redis", "redis://:***@redis"),
            (
                "postgres://u:p@ss@db/x?sslmode=require",
                "postgres://u:***@db/x?sslmode=require",
            ),
            ("redis://u:a/b+c@h:6379/0", "redis://u:***@h:6379/0"),
            ("redis://u:a@b/c?d#e@h/0", "redis://u:***@h/0"),
            // An '@' after the host: what lies between the first ':' and it is hidden.
            ("redis://h:6379/0?to=a@b", "redis://h:***@b"),
            ("redis://user@redis:6379", "redis://user@redis:6379"),
            ("redis://redis:6379/0", "redis://redis:6379/0"),
            ("not a url: pw@host", "not a url: pw@host"),
            ("", ""),
        ] {
            assert_eq!(
                String::from_utf8(mask_url_password(url.as_bytes()).into_owned()).unwrap(),
                want,
                "{url}"
            );
        }
    }

    /// A small deterministic generator: random specs without a crate for it.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> usize {
            (self.next() % n) as usize
        }

        /// Text with what JSON escapes and what a url's parts are made of.
        fn text(&mut self, max: u64) -> String {
            const PARTS: [&str; 14] = [
                "a", "Z", "9", "\"", "\\", "\n", "\u{1}", "é", "🦀", "@", ":", "/", "%40", " ",
            ];
            (0..self.below(max + 1))
                .map(|_| PARTS[self.below(PARTS.len() as u64)])
                .collect()
        }
    }

    /// Random specs of the three kinds with `env` and of Memory with a url: no env value
    /// and no url password is in the wire form, wherever they sit and whatever they
    /// hold; names, `valueFrom`, user names and hosts are; the output is JSON. With the
    /// admin's `send`, the env values are there as written.
    #[test]
    fn random_specs_never_carry_an_env_value_or_a_url_password() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..400 {
            // Each secret holds a marker no other field has.
            let secret = |rng: &mut Rng, i: usize| format!("S3CR3T{round}x{i}{}", rng.text(6));
            let env: Vec<Value> = (0..rng.below(5))
                .map(|i| match rng.below(3) {
                    0 => json!({"name": format!("V{i}{}", rng.text(3)),
                        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
                    _ => json!({"name": format!("V{i}{}", rng.text(3)), "value": secret(&mut rng, i)}),
                })
                .collect();
            let (kind, spec) = match round % 4 {
                0 => (
                    "Agent",
                    json!({"runtime": {"image": "i", "env": env}, "tools": [rng.text(4)]}),
                ),
                1 => (
                    "Runtime",
                    json!({"image": rng.text(8), "env": env, "args": [rng.text(5)]}),
                ),
                2 => ("Tool", json!({"image": "t", "port": 80, "env": env})),
                _ => {
                    let user = format!("user{}", rng.text(3).replace(['@', ':', '/'], ""));
                    let password = secret(&mut rng, 99);
                    // The path holds no '@': one there is taken as the userinfo's end.
                    let path = rng.text(4).replace('@', "");
                    let url = format!("redis://{user}:{password}@host-{round}:6379/{path}");
                    ("Memory", json!({"backend": "redis", "url": url}))
                }
            };
            let object = json!({"apiVersion": "autonomic.sh/v1alpha1", "kind": kind,
                "metadata": {"name": "x", "namespace": "ns"}, "spec": spec});
            let written = |env_values: bool| -> String {
                let mut out = Vec::new();
                let mask = Mask { env_values };
                match kind {
                    "Agent" => {
                        let a: Agent = serde_json::from_value(object.clone()).unwrap();
                        write_resource(&mut out, &a, &a.spec, a.status.as_ref(), None, None, mask);
                    }
                    "Runtime" => {
                        let r: Runtime = serde_json::from_value(object.clone()).unwrap();
                        write_resource(&mut out, &r, &r.spec, r.status.as_ref(), None, None, mask);
                    }
                    "Tool" => {
                        let t: Tool = serde_json::from_value(object.clone()).unwrap();
                        write_resource(&mut out, &t, &t.spec, t.status.as_ref(), None, None, mask);
                    }
                    _ => {
                        let m: Memory = serde_json::from_value(object.clone()).unwrap();
                        write_resource(&mut out, &m, &m.spec, m.status.as_ref(), None, None, mask);
                    }
                }
                String::from_utf8(out).unwrap()
            };
            let masked = written(true);
            let tree: Value =
                serde_json::from_str(&masked).unwrap_or_else(|e| panic!("{e}: {masked}"));
            assert!(!masked.contains("S3CR3T"), "{masked}");
            let env_out = match kind {
                "Agent" => tree["spec"]["runtime"]["env"].clone(),
                _ => tree["spec"]["env"].clone(),
            };
            if kind == "Memory" {
                let url = tree["spec"]["url"].as_str().unwrap();
                assert!(
                    url.starts_with("redis://user") && url.contains(":***@host-"),
                    "{url:?}"
                );
            } else {
                // Every entry kept, in order, names and valueFrom as written.
                let want: Vec<Value> = env
                    .iter()
                    .map(|e| {
                        let mut e = e.clone();
                        if e.get("value").is_some() {
                            e["value"] = json!(MASKED);
                        }
                        snaked(&e)
                    })
                    .collect();
                assert_eq!(env_out, Value::Array(want), "{masked}");
            }
            // The admin's `send`: env values as written; a url password never.
            let sent = written(false);
            let sent_tree: Value = serde_json::from_str(&sent).unwrap();
            if kind == "Memory" {
                assert_eq!(sent, masked);
            } else {
                let env_sent = match kind {
                    "Agent" => &sent_tree["spec"]["runtime"]["env"],
                    _ => &sent_tree["spec"]["env"],
                };
                let want: Vec<Value> = env.iter().map(snaked).collect();
                assert_eq!(env_sent, &Value::Array(want));
            }
        }
    }

    #[test]
    fn the_streamed_snapshot_is_the_encoded_frame() {
        use crate::protocol::frame::{self, Frame, Snapshot};
        for n in [0, 1, 3] {
            let resources: Vec<Json> = (0..n)
                .map(|i| json!({"kind": "Agent", "name": format!("a{i}"), "spec": {"x": [1, "é"]}}))
                .map(|v| Json::from(&v))
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
        let d = |spec: &str, status: &str| -> Value {
            let mut out = Vec::new();
            tool_demand(&tool(spec, status)).write(&mut out);
            serde_json::from_slice(&out).expect("JSON")
        };
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
        let status = snaked(&tool("", ", users: 1, idleSince: '2026-12-03T07:00:00Z'").status);
        assert_eq!(
            (status["users"].clone(), status["idle_since"].clone()),
            (json!(1), json!("2026-12-03T07:00:00Z"))
        );
    }

    /// What [`write_snake`] writes, read back.
    fn snaked<T: Serialize>(value: &T) -> Value {
        let mut out = Vec::new();
        write_snake(&mut out, value);
        serde_json::from_slice(&out).expect("JSON")
    }

    #[test]
    fn keys_become_snake_case_but_data_keys_do_not() {
        let v = snaked(&json!({
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
        // At any depth; a key with an escape, or not a plain identifier, passes unchanged.
        let v = snaked(&json!({
            "someField": [{"innerKey": 1, "x": {"deepKeyHere": true}}],
            "Upper": "c", "ab\ncD": "d", "quote\"Key": "e", "plain": "with \"escapes\" \u{1}",
        }));
        assert_eq!(
            v,
            json!({
                "some_field": [{"inner_key": 1, "x": {"deep_key_here": true}}],
                "Upper": "c", "ab\ncD": "d", "quote\"Key": "e", "plain": "with \"escapes\" \u{1}",
            })
        );
        // A map whose keys are not strings cannot be JSON: `null`, and nothing else.
        let mut out = b"[".to_vec();
        write_snake(&mut out, &std::collections::BTreeMap::from([((1, 2), 3)]));
        assert_eq!(out, b"[null");
    }

    /// The hand-written strings and numbers are serde_json's, byte for byte: every
    /// escape, control bytes, non-ASCII, long runs; integers at their limits.
    #[test]
    fn strings_and_numbers_are_serde_jsons() {
        let controls: String = (0u8..0x20).map(char::from).collect();
        for s in [
            "",
            "plain",
            "quote \" backslash \\ slash / tab \t nl \n cr \r bs \u{8} ff \u{c}",
            &controls,
            "\u{7f} é ✓ 😀 \u{2028}",
            "a long run of text that needs no escaping at all, longer than 32 bytes",
        ] {
            let mut out = Vec::new();
            json::write_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap());
        }
        for n in [0, 7, 10, -1, -10, 1234567890, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            put_i64(&mut out, n);
            assert_eq!(out, serde_json::to_vec(&n).unwrap());
        }
    }
}

#[cfg(test)]
mod pod_tests {
    use super::write_pod;
    use crate::store::{Health, PodView, pod_health, trim};
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

    /// A pod's wire form, read back.
    fn pod_wire(pod: &PodView) -> serde_json::Value {
        let mut out = Vec::new();
        write_pod(&mut out, pod);
        serde_json::from_slice(&out).expect("JSON")
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
