//! Status that says the cause, a roll at a bounded pace, and two custom resources that
//! want the same pod: against the real API server and a real node.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use autonomic_manager::crd::{Agent, AgentPhase, Runtime, Tool, ToolPhase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use support::*;

const SPEC_HASH: &str = "autonomic.sh/spec-hash";

fn phase(a: &Agent) -> Option<AgentPhase> {
    a.status.as_ref()?.phase
}

/// The `Ready` condition: (status, reason, observedGeneration, lastTransitionTime).
fn ready(
    conditions: &[autonomic_manager::crd::Condition],
) -> Option<(String, String, Option<i64>, String)> {
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| {
        (
            c.status.clone(),
            c.reason.clone(),
            c.observed_generation,
            c.last_transition_time.0.to_string(),
        )
    })
}

fn agent_ready(a: &Agent) -> Option<(String, String, Option<i64>, String)> {
    ready(&a.status.as_ref()?.conditions)
}

fn agent_reason(a: &Agent) -> String {
    agent_ready(a).map(|r| r.1).unwrap_or_default()
}

/// The manager's Events about `name`: (type, reason).
async fn events_of(ns: &TestNamespace, name: &str) -> Vec<(String, String)> {
    ns.api::<Event>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reporting_controller.as_deref() == Some("autonomic-manager")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
        .collect()
}

/// A missing Runtime, an image that cannot be pulled (the bed is offline) and a pod no
/// node can take: each Agent's `Ready` condition and a Warning Event name the cause;
/// once the cause goes, the condition flips to `True`/`Running` with a new transition
/// time, and a Normal Event says so.
#[tokio::test]
async fn condition_and_event_reasons_say_the_cause() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "cause").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let runtimes: Api<Runtime> = ns.api();
    let agent = |name: &str, runtime: &str| -> Agent {
        yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {runtime}}}"
        ))
    };
    create(&agents, &agent("lost", "{ref: nowhere}")).await;
    create(
        &agents,
        &agent("ghost", "{image: 'autonomic.test/no-such-image:1'}"),
    )
    .await;
    // A Runtime whose template asks for more memory than any node has.
    create(
        &runtimes,
        &yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: huge}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}, resources: {{requests: {{memory: 900Ti}}}}}}"
        )),
    )
    .await;
    create(&agents, &agent("stuck", "{ref: huge}")).await;

    let pull = ["ErrImagePull", "ImagePullBackOff"];
    let cases: [(&str, &[&str], AgentPhase); 3] = [
        ("lost", &["RuntimeNotFound"], AgentPhase::Error),
        ("ghost", &pull, AgentPhase::Error),
        ("stuck", &["Unschedulable"], AgentPhase::Pending),
    ];
    let mut lost_since = String::new();
    for (name, reasons, want) in cases {
        let a = wait_for(
            &agents,
            name,
            &format!("Ready reason in {reasons:?}"),
            |a| reasons.contains(&agent_reason(a).as_str()),
        )
        .await;
        let (status, _, generation, since) = agent_ready(&a).unwrap();
        assert_eq!(
            (phase(&a), status.as_str(), generation),
            (Some(want), "False", a.metadata.generation),
            "{name}: {:?}",
            a.status
        );
        if name == "lost" {
            lost_since = since;
        }
        wait_until(
            &format!("a Warning Event {reasons:?} on {name}"),
            || async {
                events_of(&ns, name)
                    .await
                    .iter()
                    .any(|(t, r)| t == "Warning" && reasons.contains(&r.as_str()))
            },
        )
        .await;
    }
    // The phase's name is never the reason any more.
    for (name, _, _) in cases {
        let events = events_of(&ns, name).await;
        assert!(
            events.iter().all(|(_, r)| r != "Error" && r != "Pending"),
            "{name}: {events:?}"
        );
    }

    // The Runtime appears: Running, True, and the transition time moved.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create(
        &runtimes,
        &yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: nowhere}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}"
        )),
    )
    .await;
    let a = wait_for(&agents, "lost", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
    let (status, reason, _, since) = agent_ready(&a).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Running"));
    assert_ne!(
        since, lost_since,
        "lastTransitionTime did not move on a flip"
    );
    wait_until("a Normal Running Event on lost", || async {
        events_of(&ns, "lost")
            .await
            .iter()
            .any(|(t, r)| t == "Normal" && r == "Running")
    })
    .await;
    pods_read_the_same_from_json_and_protobuf(&client, &ns).await;
}

/// The pods of these causes (running, waiting on a pull, unschedulable), listed as the
/// manager lists them (protobuf) and as JSON, are the same `PodView`s: the protobuf
/// reader skips nothing the manager reads and reads nothing JSON leaves out.
async fn pods_read_the_same_from_json_and_protobuf(client: &kube::Client, ns: &TestNamespace) {
    use autonomic_manager::internals::{PROTOBUF_ACCEPT, PodView, list, trim};
    let path = format!("/api/v1/namespaces/{}/pods", ns.name);
    // The API server answers the manager's Accept with protobuf.
    let mut req = kube::core::Request::new(&path)
        .list(&Default::default())
        .unwrap();
    req.headers_mut()
        .insert("accept", PROTOBUF_ACCEPT.parse().unwrap());
    let res = client.send(req.map(Into::into)).await.unwrap();
    assert_eq!(
        res.headers()["content-type"],
        "application/vnd.kubernetes.protobuf"
    );
    let by_name = |pods: Vec<PodView>| -> BTreeMap<String, PodView> {
        pods.into_iter()
            .map(|mut p| {
                trim(&mut p);
                (p.name_any(), p)
            })
            .collect()
    };
    // A pod may change between the two lists: those whose versions differ are listed
    // again.
    for _ in 0..20 {
        let json = by_name(
            ns.api::<PodView>()
                .list(&Default::default())
                .await
                .unwrap()
                .items,
        );
        let mut read = Vec::new();
        list(client, &path, Default::default(), |p: PodView| read.push(p))
            .await
            .unwrap();
        let protobuf = by_name(read);
        let version = |m: &BTreeMap<String, PodView>| -> Vec<_> {
            m.values().map(|p| p.resource_version()).collect()
        };
        if version(&json) != version(&protobuf) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert_eq!(json, protobuf);
        let status = |name: &str| json[name].status.clone().unwrap();
        // What the comparison covers: a running container, a waiting one, and the
        // unscheduled condition.
        let running = status("lost").container_statuses.unwrap();
        assert!(
            running
                .iter()
                .any(|c| c.state.as_ref().unwrap().running.is_some())
        );
        assert!(status("lost").start_time.is_some());
        let waiting = status("ghost").container_statuses.unwrap();
        assert!(
            waiting
                .iter()
                .any(|c| c.state.as_ref().unwrap().waiting.is_some())
        );
        assert!(status("stuck").conditions.is_some());
        return;
    }
    panic!("the pods kept changing between the two lists");
}

/// Whether a pod is Ready, as the kubelet says it.
fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn hash_of(p: &Pod) -> String {
    p.annotations().get(SPEC_HASH).cloned().unwrap_or_default()
}

/// 50 Agents on one Runtime, one edit of its template, `AUTONOMIC_ROLL_MAX=5`: watching
/// the pods the whole time, never more than 5 Agents are mid-roll (their old pod deleted,
/// the new one not yet Ready); the others show `WaitingToRoll` meanwhile with their pod
/// still running; in the end every pod carries the new spec hash and every Agent is
/// Active.
#[tokio::test]
async fn a_runtime_edit_rolls_at_most_roll_max_agents_at_once() {
    const AGENTS: usize = 50;
    const MAX: usize = 5;
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "roll").await;
    let _m = Manager::start(&ns.name, &[("AUTONOMIC_ROLL_MAX", "5")]);
    let agents: Api<Agent> = ns.api();
    let runtimes: Api<Runtime> = ns.api();
    let pods: Api<Pod> = ns.api();
    create(
        &runtimes,
        &yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: shared}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}, env: [{{name: MODE, value: one}}]}}"
        )),
    )
    .await;
    let names: Vec<String> = (0..AGENTS).map(|i| format!("a{i:02}")).collect();
    for name in &names {
        let a: Agent = yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{ref: shared}}}}"
        ));
        create(&agents, &a).await;
    }
    // 50 first pods on a small node take a while: a long, liveness-only deadline.
    let all_active = || async {
        let list = agents.list(&Default::default()).await.unwrap().items;
        list.len() == AGENTS
            && list.iter().all(|a| {
                phase(a) == Some(AgentPhase::Active)
                    && a.status.as_ref().unwrap().observed_generation == a.metadata.generation
            })
    };
    wait_long("50 Agents Active", Duration::from_secs(600), all_active).await;
    let before: BTreeMap<String, String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| (p.name_any(), hash_of(p)))
        .collect();
    assert_eq!(before.len(), AGENTS);

    // Watch the pods from now on: who is mid-roll at each event.
    let watch = {
        let pods = pods.clone();
        let before = before.clone();
        tokio::spawn(async move {
            let mut mid: BTreeSet<String> = BTreeSet::new();
            let mut done: BTreeSet<String> = BTreeSet::new();
            let mut most = 0;
            let mut stream = watcher(pods, watcher::Config::default()).boxed();
            while let Some(ev) = stream.next().await {
                let (pod, gone) = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    _ => continue,
                };
                let name = pod.name_any();
                let Some(old) = before.get(&name) else {
                    continue;
                };
                let hash = hash_of(&pod);
                if &hash == old && (gone || pod.metadata.deletion_timestamp.is_some()) {
                    if !done.contains(&name) {
                        mid.insert(name.clone());
                    }
                } else if &hash != old && pod_ready(&pod) && !gone {
                    mid.remove(&name);
                    done.insert(name.clone());
                }
                most = most.max(mid.len());
                if done.len() == before.len() {
                    break;
                }
            }
            (most, done.len())
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    merge(
        &runtimes,
        "shared",
        json!({"spec": {"env": [{"name": "MODE", "value": "two"}]}}),
    )
    .await;
    // While it rolls, some Agents wait their turn, still Active on their old pod.
    let saw_waiting = std::sync::atomic::AtomicBool::new(false);
    wait_long(
        "every pod rebuilt and every Agent Active",
        Duration::from_secs(900),
        || {
            let (agents, pods, before, saw) = (&agents, &pods, &before, &saw_waiting);
            async move {
                let list = agents.list(&Default::default()).await.unwrap().items;
                for a in &list {
                    if agent_reason(a) == "WaitingToRoll" {
                        assert_eq!(phase(a), Some(AgentPhase::Active), "{:?}", a.status);
                        let msg = a
                            .status
                            .as_ref()
                            .unwrap()
                            .message
                            .clone()
                            .unwrap_or_default();
                        assert_eq!(&*msg, "spec changed: waiting to roll (5 at a time)");
                        saw.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                let ps = pods.list(&Default::default()).await.unwrap().items;
                ps.len() == AGENTS
                    && ps
                        .iter()
                        .all(|p| Some(&hash_of(p)) != before.get(&p.name_any()) && pod_ready(p))
                    && list.iter().all(|a| {
                        phase(a) == Some(AgentPhase::Active) && agent_reason(a) == "Running"
                    })
            }
        },
    )
    .await;
    let (most, done) = tokio::time::timeout(Duration::from_secs(60), watch)
        .await
        .expect("the pod watch saw every roll")
        .unwrap();
    eprintln!("at most {most} Agents mid-roll at once (limit {MAX}); {done} rolled");
    assert_eq!(done, AGENTS);
    assert!(most <= MAX, "{most} Agents mid-roll at once, limit {MAX}");
    assert!(most >= 2, "the roll never ran Agents side by side: {most}");
    assert!(
        saw_waiting.into_inner(),
        "no Agent was ever seen waiting to roll"
    );
    // Every pod was rebuilt from the new template (each Agent's hash is its own: the
    // agentlet's environment names the Agent).
    let after = pods.list(&Default::default()).await.unwrap().items;
    assert_eq!(after.len(), AGENTS);
    for p in &after {
        assert_ne!(
            Some(&hash_of(p)),
            before.get(&p.name_any()),
            "{}",
            p.name_any()
        );
        let env = p.spec.as_ref().unwrap().containers[1].env.clone().unwrap();
        assert_eq!(env[0].value.as_deref(), Some("two"), "{}", p.name_any());
    }
}

/// Polls `check` every 500 ms until it holds; panics after `within`.
async fn wait_long<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("timed out after {within:?} waiting for {what}");
}

fn tool_yaml(name: &str) -> Tool {
    yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: {name}}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, \"trap 'exit 0' TERM; while :; do nc -l -p 8080 -e echo ok & wait $!; done\"], port: 8080, alwaysOn: true}}"
    ))
}

/// Makes the manager decide about pod `x-tool` once more: touches the Agent `x-tool` and
/// the Tool `x` (an annotation: no spec change) and returns once both kinds' reconcile
/// counters have moved. A fight would show in those reconciles; waiting a while to see
/// nothing happen would only hope that one ran.
async fn reconciled_again(m: &Manager, agents: &Api<Agent>, tools: &Api<Tool>, round: u32) {
    const AGENTS: &str = "autonomic_reconciles_total{kind=\"Agent\"}";
    const TOOLS: &str = "autonomic_reconciles_total{kind=\"Tool\"}";
    let before = (m.metric(AGENTS).await, m.metric(TOOLS).await);
    let touch = Patch::Merge(json!({
        "metadata": {"annotations": {"test.autonomic.sh/touch": round.to_string()}}
    }));
    let params = PatchParams::default();
    agents.patch("x-tool", &params, &touch).await.unwrap();
    tools.patch("x", &params, &touch).await.unwrap();
    wait_until("the Agent and the Tool reconciled again", || async {
        m.metric(AGENTS).await > before.0 && m.metric(TOOLS).await > before.1
    })
    .await;
}

/// The spec names an Agent's pod `<agent>` and a Tool's `<tool>-tool`: an Agent `x-tool`
/// and a Tool `x` want the same pod. Whoever has it keeps it; the other is `Error`
/// `PodNameTaken` naming the holder, with no fight over the pod and no status rewritten;
/// when the holder goes, the other takes the pod. Both ways round.
#[tokio::test]
async fn an_agent_and_a_tool_that_want_the_same_pod() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "podname").await;
    let m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let tools: Api<Tool> = ns.api();
    let pods: Api<Pod> = ns.api();
    let tool_phase = |t: &Tool| t.status.as_ref().and_then(|s| s.phase);
    let tool_reason = |t: &Tool| {
        t.status
            .as_ref()
            .and_then(|s| ready(&s.conditions))
            .map(|r| r.1)
            .unwrap_or_default()
    };
    let agent: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: x-tool}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}}}"
    ));

    // 1. The Tool first: it keeps the pod.
    create(&tools, &tool_yaml("x")).await;
    wait_for(&tools, "x", "Ready", |t| {
        tool_phase(t) == Some(ToolPhase::Ready)
    })
    .await;
    let held = pods.get("x-tool").await.unwrap();
    create(&agents, &agent).await;
    let a = wait_for(&agents, "x-tool", "Error PodNameTaken", |a| {
        agent_reason(a) == "PodNameTaken"
    })
    .await;
    assert_eq!(phase(&a), Some(AgentPhase::Error));
    let msg = a.status.as_ref().unwrap().message.clone().unwrap();
    assert!(msg.contains("belongs to Tool \"x\""), "{msg}");
    // Steady: the pod is the same, neither status is written again, when the manager
    // decides about both once more (rather than waiting to see nothing happen).
    let steady = || async {
        (
            pods.get("x-tool").await.unwrap().uid(),
            serde_json::to_value(&agents.get("x-tool").await.unwrap().status).unwrap(),
            serde_json::to_value(&tools.get("x").await.unwrap().status).unwrap(),
        )
    };
    let first = steady().await;
    assert_eq!(first.0, held.uid());
    reconciled_again(&m, &agents, &tools, 1).await;
    assert_eq!(steady().await, first, "a fight over pod x-tool");
    assert_eq!(
        tool_phase(&tools.get("x").await.unwrap()),
        Some(ToolPhase::Ready)
    );

    // The Tool goes: the Agent takes the name.
    tools
        .delete("x", &DeleteParams::background())
        .await
        .unwrap();
    let a = wait_for(&agents, "x-tool", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
    let pod = pods.get("x-tool").await.unwrap();
    assert_eq!(pod.owner_references()[0].uid, a.uid().unwrap());

    // 2. The other way round: the Agent has it, a new Tool x waits.
    create(&tools, &tool_yaml("x")).await;
    let t = wait_for(&tools, "x", "Error PodNameTaken", |t| {
        tool_reason(t) == "PodNameTaken"
    })
    .await;
    assert_eq!(tool_phase(&t), Some(ToolPhase::Error));
    let msg = t.status.as_ref().unwrap().message.clone().unwrap();
    assert!(msg.contains("belongs to Agent \"x-tool\""), "{msg}");
    let first = steady().await;
    assert_eq!(first.0, pod.uid());
    reconciled_again(&m, &agents, &tools, 2).await;
    assert_eq!(steady().await, first, "a fight over pod x-tool");

    agents
        .delete("x-tool", &DeleteParams::background())
        .await
        .unwrap();
    wait_for(&tools, "x", "Ready", |t| {
        tool_phase(t) == Some(ToolPhase::Ready)
    })
    .await;
    let pod = pods.get("x-tool").await.unwrap();
    assert_eq!(
        pod.owner_references()[0].uid,
        tools.get("x").await.unwrap().uid().unwrap()
    );
}
