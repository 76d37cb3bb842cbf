//! Agent reconciliation against the real API server and a real node.

mod support;

use std::time::Duration;

use autonomic_manager::crd::{Agent, AgentPhase, Runtime, RuntimePhase};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use support::*;

fn agent(name: &str, extra_spec: &str) -> Agent {
    yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}{extra_spec}}}"
    ))
}

fn phase(a: &Agent) -> Option<AgentPhase> {
    a.status.as_ref()?.phase
}

fn message(a: &Agent) -> String {
    a.status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn agent_runs_as_pod_with_config_secret_labels_and_events() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-active").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    create(&agents, &agent("triage", "")).await;

    let a = wait_for(&agents, "triage", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
    let st = a.status.clone().unwrap();
    assert_eq!(st.observed_generation, a.metadata.generation);
    assert_eq!(st.pod_name.as_deref(), Some("triage"));
    assert!(st.started_at.is_some());
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Running")
    );

    let pod = ns.api::<Pod>().get("triage").await.unwrap();
    let names: Vec<_> = pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(names, ["agentlet", "runtime"]);
    assert_eq!(pod.labels()["app.kubernetes.io/managed-by"], "autonomic");
    assert_eq!(pod.labels()["autonomic.sh/agent"], "triage");
    let owner = &pod.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Agent", a.uid().unwrap().as_str(), Some(true))
    );

    let secret = ns.api::<Secret>().get("triage-agent").await.unwrap();
    assert_eq!(secret.owner_references()[0].uid, a.uid().unwrap());
    assert_eq!(secret.labels()["autonomic.sh/agent"], "triage");
    let config: serde_json::Value =
        serde_json::from_slice(&secret.data.unwrap()["config.json"].0).unwrap();
    assert_eq!(config["agent"], "triage");

    // A hand edit of the config Secret is undone: the watch requeues the Agent, and the
    // cached copy no longer holds the desired data, so it is applied again.
    let secrets: Api<Secret> = ns.api();
    merge(
        &secrets,
        "triage-agent",
        json!({"data": {"config.json": "e30="}}),
    )
    .await;
    wait_for(&secrets, "triage-agent", "config.json restored", |s| {
        s.data.as_ref().is_some_and(|d| {
            serde_json::from_slice::<serde_json::Value>(&d["config.json"].0)
                .is_ok_and(|c| c["agent"] == "triage")
        })
    })
    .await;

    // `kubectl describe` tells the story: an Event for the phase change.
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    wait_until("a Running event", || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Running")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("triage")
            })
    })
    .await;

    // Deleting the Agent cascades to what it owns.
    agents
        .delete("triage", &DeleteParams::background())
        .await
        .unwrap();
    wait_gone(&ns.api::<Pod>(), "triage").await;
    wait_gone(&ns.api::<Secret>(), "triage-agent").await;
}

#[tokio::test]
async fn pause_resume_and_recreation_of_a_pod_deleted_by_someone_else() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-pause").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let pods: Api<Pod> = ns.api();
    create(&agents, &agent("worker", "")).await;
    wait_for(&agents, "worker", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
    let first = pods.get("worker").await.unwrap().uid().unwrap();

    pods.delete("worker", &DeleteParams::default())
        .await
        .unwrap();
    let p = wait_for(&pods, "worker", "recreated", |p| {
        p.uid().as_deref() != Some(first.as_str())
    })
    .await;
    assert_ne!(p.uid().unwrap(), first);
    wait_for(&agents, "worker", "Active again", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;

    merge(&agents, "worker", json!({"spec": {"paused": true}})).await;
    let a = wait_for(&agents, "worker", "Paused", |a| {
        phase(a) == Some(AgentPhase::Paused)
    })
    .await;
    assert_eq!(a.status.unwrap().pod_name, None);
    wait_gone(&pods, "worker").await;

    merge(&agents, "worker", json!({"spec": {"paused": false}})).await;
    wait_for(&agents, "worker", "Active after resume", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
}

#[tokio::test]
async fn spec_change_recreates_pod_and_runtime_change_rolls_agents() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-roll").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let runtimes: Api<Runtime> = ns.api();
    let pods: Api<Pod> = ns.api();
    let rt: Runtime = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: shell}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}, env: [{{name: MODE, value: one}}]}}"
    ));
    create(&runtimes, &rt).await;
    for name in ["a1", "a2"] {
        let a: Agent = yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{ref: shell}}}}"
        ));
        create(&agents, &a).await;
    }
    for name in ["a1", "a2"] {
        wait_for(&agents, name, "Active", |a| {
            phase(a) == Some(AgentPhase::Active)
        })
        .await;
    }
    let rt = wait_for(&runtimes, "shell", "Ready with 2 agents", |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.phase == Some(RuntimePhase::Ready) && s.agents == Some(2))
    })
    .await;
    assert_eq!(
        rt.status.unwrap().observed_generation,
        rt.metadata.generation
    );
    let uid_a1 = pods.get("a1").await.unwrap().uid().unwrap();
    let uid_a2 = pods.get("a2").await.unwrap().uid().unwrap();

    // The template changes: both agents' pods are recreated with the new env.
    merge(
        &runtimes,
        "shell",
        json!({"spec": {"env": [{"name": "MODE", "value": "two"}]}}),
    )
    .await;
    for (name, old) in [("a1", &uid_a1), ("a2", &uid_a2)] {
        let p = wait_for(&pods, name, "recreated from the new template", |p| {
            p.uid().as_deref() != Some(old.as_str()) && p.metadata.deletion_timestamp.is_none()
        })
        .await;
        let env = p.spec.unwrap().containers[1].env.clone().unwrap();
        assert_eq!(env[0].value.as_deref(), Some("two"));
    }

    // An agent's own override changes only that agent's pod.
    let uid_a2 = pods.get("a2").await.unwrap().uid().unwrap();
    let uid_a1 = pods.get("a1").await.unwrap().uid().unwrap();
    merge(&agents, "a1", json!({"spec": {"runtime": {"args": ["x"]}}})).await;
    wait_for(&pods, "a1", "recreated after its spec changed", |p| {
        p.uid().as_deref() != Some(uid_a1.as_str())
    })
    .await;
    wait_for(&agents, "a1", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
            && a.status.as_ref().unwrap().observed_generation == a.metadata.generation
    })
    .await;
    assert_eq!(
        pods.get("a2").await.unwrap().uid().unwrap(),
        uid_a2,
        "a2 untouched"
    );

    // A Runtime without an image is Invalid; its agents say why instead of crashing.
    merge(&runtimes, "shell", json!({"spec": {"image": null}})).await;
    let r = wait_for(&runtimes, "shell", "Invalid", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(RuntimePhase::Invalid)
    })
    .await;
    assert!(r.status.unwrap().message.unwrap().contains("image"));
    let a = wait_for(&agents, "a2", "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    assert!(
        message(&a).contains("Runtime \"shell\" is invalid"),
        "{}",
        message(&a)
    );
}

#[tokio::test]
async fn context_summary_and_memory_refs_reach_the_status() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-ctx").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let mem: autonomic_manager::crd::Memory = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {name: notes}\nspec: {backend: redis, url: 'redis://redis:6379/0'}",
    );
    create(&ns.api(), &mem).await;
    create(&agents, &agent("scribe", ", memory: [notes]")).await;
    let a = wait_for(&agents, "scribe", "Active with a bound memory ref", |a| {
        phase(a) == Some(AgentPhase::Active)
            && a.status
                .as_ref()
                .unwrap()
                .memory_refs
                .first()
                .and_then(|m| m.phase.as_deref())
                == Some("Bound")
    })
    .await;
    let r = &a.status.unwrap().memory_refs[0];
    assert_eq!(
        (r.name.as_str(), r.secret_name.as_deref()),
        ("notes", Some("notes-memory"))
    );
    let secret = ns.api::<Secret>().get("scribe-agent").await.unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&secret.data.unwrap()["config.json"].0).unwrap();
    assert_eq!(config["memory"][0]["secretName"], "notes-memory");

    let pods: Api<Pod> = ns.api();
    merge(&pods, "scribe", json!({"metadata": {"annotations": {"autonomic.sh/context-summary": "triaging issue #42"}}})).await;
    wait_for(&agents, "scribe", "carrying the summary", |a| {
        a.status.as_ref().unwrap().context_summary.as_deref() == Some("triaging issue #42")
    })
    .await;
    // An oversized summary is capped, not refused.
    let huge = "é".repeat(10_000);
    merge(
        &pods,
        "scribe",
        json!({"metadata": {"annotations": {"autonomic.sh/context-summary": huge}}}),
    )
    .await;
    let a = wait_for(&agents, "scribe", "carrying a capped summary", |a| {
        a.status
            .as_ref()
            .unwrap()
            .context_summary
            .as_deref()
            .is_some_and(|s| s.starts_with("éé") && s.len() <= 4096)
    })
    .await;
    assert_eq!(a.status.unwrap().context_summary.unwrap().len(), 4096);
}

#[tokio::test]
async fn dangling_references_are_errors_that_heal_without_hot_looping() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-dangling").await;
    let m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    create(&agents, &agent("needy", ", tools: [search]")).await;
    let a = wait_for(&agents, "needy", "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    assert!(
        message(&a).contains("Tool \"search\" not found"),
        "{}",
        message(&a)
    );
    assert!(ns.api::<Pod>().get_opt("needy").await.unwrap().is_none());

    // Waiting for a change, not retrying. The status is written inside the first
    // reconcile and the counter moves when it returns, so wait for that; the status write
    // echoes back as one more reconcile, which changes nothing. A retry with the queue's
    // backoff (0.5 s, 1 s, 2 s, ...) would add three more within the 3 s.
    let reconciles = || m.metric("autonomic_reconciles_total{kind=\"Agent\"}");
    wait_until("the first reconcile to be counted", || async {
        reconciles().await >= 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = reconciles().await;
    assert!(after <= 2.0, "hot loop: {after} reconciles of one Agent");

    // The Tool appears: the Agent proceeds on its own.
    let tool: autonomic_manager::crd::Tool = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: search}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'while :; do nc -l -p 8080 -e echo ok & wait $!; done'], port: 8080}}"
    ));
    create(&ns.api(), &tool).await;
    wait_for(&agents, "needy", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
    let secret = ns.api::<Secret>().get("needy-agent").await.unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&secret.data.unwrap()["config.json"].0).unwrap();
    assert_eq!(
        config["tools"][0]["endpoint"],
        format!("http://search.{}.svc:8080", ns.name)
    );

    // Missing Runtime and Memory are named too.
    let a: Agent = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: lost}\nspec: {runtime: {ref: nowhere}, memory: [nothing]}",
    );
    create(&agents, &a).await;
    let a = wait_for(&agents, "lost", "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    assert!(
        message(&a).contains("Runtime \"nowhere\" not found"),
        "{}",
        message(&a)
    );
}

#[tokio::test]
async fn unpullable_image_and_hostile_specs_end_in_error() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-hostile").await;
    let m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();

    // An image that cannot be pulled: the kubelet says so, the Agent says Error.
    let a: Agent = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: ghost}\nspec: {runtime: {image: 'autonomic.test/no-such-image:1'}}",
    );
    create(&agents, &a).await;
    let a = wait_for(&agents, "ghost", "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    let msg = message(&a);
    assert!(
        msg.contains("container runtime")
            && (msg.contains("ErrImagePull") || msg.contains("ImagePullBackOff")),
        "{msg}"
    );
    // Gone before the hot-loop check below: its pod flips between ErrImagePull and
    // ImagePullBackOff for as long as it exists, and every flip is a reconcile.
    agents
        .delete("ghost", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&agents, "ghost").await;
    wait_gone(&ns.api::<Pod>(), "ghost").await;

    // A name that cannot be a label value.
    let long = "x".repeat(70);
    create(&agents, &agent(&long, "")).await;
    let a = wait_for(&agents, &long, "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    assert!(message(&a).contains("at most 63"), "{}", message(&a));
    // 63 characters is fine.
    let edge = "y".repeat(63);
    create(&agents, &agent(&edge, "")).await;
    wait_for(&agents, &edge, "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;

    // A quantity the CRD schema cannot check but the pod API refuses: reported as Error
    // (and, below, not retried in a loop).
    let mut greedy = agent("greedy", "");
    greedy.spec.runtime.resources = Some(yaml("{limits: {memory: lots}}"));
    create(&agents, &greedy).await;
    let a = wait_for(&agents, "greedy", "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    assert!(
        message(&a).contains("refused") && message(&a).contains("quantities"),
        "{}",
        message(&a)
    );
    // Absurd but valid sizes: the pod cannot be scheduled and the Agent says why.
    let mut huge = agent("huge", "");
    huge.spec.runtime.resources = Some(yaml("{requests: {memory: 900Ti}}"));
    create(&agents, &huge).await;
    let a = wait_for(&agents, "huge", "Pending as unschedulable", |a| {
        message(a).contains("unschedulable")
    })
    .await;
    assert_eq!(phase(&a), Some(AgentPhase::Pending));

    // A pod of the same name that is not ours is never touched.
    let stranger: Pod = yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: squatter}}\nspec: {{containers: [{{name: c, image: '{BUSYBOX_IMAGE}', command: {IDLE}}}]}}"
    ));
    let stranger = create(&ns.api::<Pod>(), &stranger).await;
    create(&agents, &agent("squatter", "")).await;
    let a = wait_for(&agents, "squatter", "Error", |a| {
        phase(a) == Some(AgentPhase::Error)
    })
    .await;
    assert!(message(&a).contains("not owned"), "{}", message(&a));
    assert_eq!(
        ns.api::<Pod>().get("squatter").await.unwrap().uid(),
        stranger.uid()
    );

    let before = m.metric("autonomic_reconciles_total{kind=\"Agent\"}").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = m.metric("autonomic_reconciles_total{kind=\"Agent\"}").await;
    assert!(after - before <= 3.0, "hot loop: {before} -> {after}");
    assert!(m.logs().lines().all(|l| !l.contains("panicked")));
}

#[tokio::test]
async fn restart_policy_never_ends_in_succeeded_or_failed_and_stays_down() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-terminal").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let pods: Api<Pod> = ns.api();
    // busybox's default `sh` with no stdin exits 0: an agentlet that finishes.
    for (name, code) in [("done", 0), ("broken", 3)] {
        let a: Agent = yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{restartPolicy: Never, agentlet: {{image: '{BUSYBOX_IMAGE}'}}, runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'exit {code}']}}}}"
        ));
        create(&agents, &a).await;
    }
    wait_for(&agents, "done", "Succeeded", |a| {
        phase(a) == Some(AgentPhase::Succeeded)
    })
    .await;
    let a = wait_for(&agents, "broken", "Failed", |a| {
        phase(a) == Some(AgentPhase::Failed)
    })
    .await;
    assert!(message(&a).contains("code 3"), "{}", message(&a));

    // A finished pod removed is not recreated.
    pods.delete("done", &DeleteParams::default()).await.unwrap();
    wait_gone(&pods, "done").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(pods.get_opt("done").await.unwrap().is_none());
    assert_eq!(
        phase(&agents.get("done").await.unwrap()),
        Some(AgentPhase::Succeeded)
    );
}

#[tokio::test]
async fn deletion_requested_shows_terminating() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-term").await;
    let _m = Manager::start(&ns.name, &[]);
    let agents: Api<Agent> = ns.api();
    let mut a = agent("leaving", "");
    // A finalizer of the test's own holds the object in deletion long enough to look.
    a.metadata.finalizers = Some(vec!["autonomic.test/hold".into()]);
    create(&agents, &a).await;
    wait_for(&agents, "leaving", "reconciled", |a| phase(a).is_some()).await;
    agents
        .delete("leaving", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&agents, "leaving", "Terminating", |a| {
        phase(a) == Some(AgentPhase::Terminating)
    })
    .await;
    merge(
        &agents,
        "leaving",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    wait_gone(&agents, "leaving").await;
}

/// Every object's name and resourceVersion.
async fn versions<K>(api: &Api<K>) -> Vec<(String, String)>
where
    K: Clone + kube::Resource + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
        .collect()
}

/// Restarts change nothing that was steady: a fresh manager on a namespace whose Agent
/// (using a Runtime, a Tool and a Memory) is Active writes no status, recreates no pod
/// and emits no Event, three times in a row. Its workers wait for every watch's first
/// list, so no reference looks missing on half-filled caches.
#[tokio::test]
async fn restarts_change_nothing_that_was_steady() {
    use autonomic_manager::crd::{Memory, Tool, ToolPhase};
    use k8s_openapi::api::events::v1::Event;
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ag-steady").await;
    let m = Manager::start(&ns.name, &[]);
    create(
        &ns.api::<Runtime>(),
        &yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: rt}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}"
        )),
    )
    .await;
    create(
        &ns.api::<Tool>(),
        &yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: search}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, \"trap 'exit 0' TERM; while :; do nc -l -p 8080 -e echo ok & wait $!; done\"], port: 8080}}"
        )),
    )
    .await;
    create(
        &ns.api::<Memory>(),
        &yaml("apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {name: notes}\nspec: {backend: redis, url: 'redis://r:6379'}"),
    )
    .await;
    let agents: Api<Agent> = ns.api();
    create(
        &agents,
        &yaml(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: steady}\nspec: {runtime: {ref: rt}, tools: [search], memory: [notes]}",
        ),
    )
    .await;
    wait_for(&agents, "steady", "Active", |a| {
        phase(a) == Some(AgentPhase::Active)
    })
    .await;
    let tools: Api<Tool> = ns.api();
    wait_for(&tools, "search", "Ready", |t| {
        t.status.as_ref().and_then(|s| s.phase) == Some(ToolPhase::Ready)
    })
    .await;
    drop(m);

    // What "steady" is: every object's resourceVersion, and the Events so far.
    let snapshot = || async {
        let mut all = versions(&agents).await;
        all.extend(versions(&tools).await);
        all.extend(versions(&ns.api::<Runtime>()).await);
        all.extend(versions(&ns.api::<Memory>()).await);
        all.extend(versions(&ns.api::<Pod>()).await);
        // The manager's own Events (the kubelet's about its pods are not ours to judge).
        let events: Vec<String> = ns
            .api::<Event>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("autonomic-manager"))
            .map(|e| {
                format!(
                    "{:?} {:?} {:?}",
                    e.regarding.and_then(|r| r.name),
                    e.reason,
                    e.note
                )
            })
            .collect();
        (all, events)
    };
    // Let the last status writes and their Events land before taking the baseline.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = snapshot().await;
    assert!(
        !before.1.is_empty(),
        "no Event of the manager's was found: the Event check would be empty"
    );
    for round in 1..=3 {
        let m = Manager::start(&ns.name, &[]);
        m.wait_ready().await;
        // Every object was reconciled by this manager (the queue holds all of them
        // after the first list), and then some time passed.
        wait_until("the restarted manager to reconcile the Agent", || async {
            m.metric("autonomic_reconciles_total{kind=\"Agent\"}").await >= 1.0
                && m.metric("autonomic_reconciles_total{kind=\"Tool\"}").await >= 1.0
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = snapshot().await;
        assert_eq!(after, before, "restart {round} changed something steady");
        drop(m);
    }
}
