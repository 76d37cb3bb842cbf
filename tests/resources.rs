//! Tool, Memory and Runtime reconciliation, and the unmanaged default, against the real
//! API server.

mod support;

use std::time::Duration;

use autonomic_manager::crd::{Memory, MemoryPhase, Runtime, RuntimePhase, Tool, ToolPhase};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::*;

/// A tool that listens on 8080 (busybox nc), so its TCP readiness probe passes; `& wait`
/// lets the TERM trap run at once instead of after the 30 s grace period.
const SERVER: &str =
    r#"[sh, -c, "trap 'exit 0' TERM; while :; do nc -l -p 8080 -e echo ok & wait $!; done"]"#;

fn tool_phase(t: &Tool) -> Option<ToolPhase> {
    t.status.as_ref()?.phase
}

#[tokio::test]
async fn tool_serves_behind_a_service_and_can_be_disabled() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "tool").await;
    let _m = Manager::start(&ns.name, &[]);
    let tools: Api<Tool> = ns.api();
    // alwaysOn: no Agent uses it, so on demand it would have no pod (tests/tools.rs).
    let t: Tool = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: search}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {SERVER}, port: 8080, alwaysOn: true}}"
    ));
    tools.create(&PostParams::default(), &t).await.unwrap();
    let t = wait_for(&tools, "search", "Ready", |t| {
        tool_phase(t) == Some(ToolPhase::Ready)
    })
    .await;
    let st = t.status.clone().unwrap();
    assert_eq!(
        st.endpoint,
        Some(format!("http://search.{}.svc:8080", ns.name))
    );
    assert_eq!(st.pod_name.as_deref(), Some("search-tool"));
    assert_eq!(st.observed_generation, t.metadata.generation);

    let svc = ns.api::<Service>().get("search").await.unwrap();
    assert_eq!(svc.owner_references()[0].uid, t.uid().unwrap());
    let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 8080);
    let pod = ns.api::<Pod>().get("search-tool").await.unwrap();
    for (k, v) in svc.spec.unwrap().selector.unwrap() {
        assert_eq!(
            pod.labels().get(&k),
            Some(&v),
            "the Service selects the tool's pod"
        );
    }
    assert_eq!(pod.labels()["autonomic.sh/tool"], "search");

    // disabled wins over alwaysOn.
    merge(&tools, "search", json!({"spec": {"disabled": true}})).await;
    wait_for(&tools, "search", "Disabled", |t| {
        tool_phase(t) == Some(ToolPhase::Disabled)
    })
    .await;
    wait_gone(&ns.api::<Pod>(), "search-tool").await;
    assert!(
        ns.api::<Service>()
            .get_opt("search")
            .await
            .unwrap()
            .is_some(),
        "the Service stays"
    );

    merge(&tools, "search", json!({"spec": {"disabled": false}})).await;
    wait_for(&tools, "search", "Ready again", |t| {
        tool_phase(t) == Some(ToolPhase::Ready)
    })
    .await;
}

#[tokio::test]
async fn tool_errors_name_their_cause() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "tool-bad").await;
    let _m = Manager::start(&ns.name, &[]);
    let tools: Api<Tool> = ns.api();
    // A valid object name that cannot name a Service.
    let t: Tool = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {name: 9lives}\nspec: {image: x}",
    );
    tools.create(&PostParams::default(), &t).await.unwrap();
    let t = wait_for(&tools, "9lives", "Error", |t| {
        tool_phase(t) == Some(ToolPhase::Error)
    })
    .await;
    assert!(
        t.status
            .unwrap()
            .message
            .unwrap()
            .contains("cannot name a Service")
    );
    // The schema refuses what it can: a port out of range never reaches the manager.
    let bad: Tool = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {name: badport}\nspec: {image: x, port: 70000}",
    );
    let err = tools
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("65535"), "{err}");
    // So is an idle grace out of 0..=86400.
    for (idle, bound) in [("86401", "86400"), ("-1", "0")] {
        let bad: Tool = yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: badidle}}\nspec: {{image: x, idleSeconds: {idle}}}"
        ));
        let err = tools
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("idleSeconds") && err.to_string().contains(bound),
            "{err}"
        );
    }
    if has_node() {
        let t: Tool = yaml(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {name: ghost}\nspec: {image: 'autonomic.test/no-such-tool:1', alwaysOn: true}",
        );
        tools.create(&PostParams::default(), &t).await.unwrap();
        let t = wait_for(&tools, "ghost", "Error", |t| {
            tool_phase(t) == Some(ToolPhase::Error)
        })
        .await;
        let msg = t.status.unwrap().message.unwrap();
        assert!(
            msg.contains("ErrImagePull") || msg.contains("ImagePullBackOff"),
            "{msg}"
        );
    }
}

#[tokio::test]
async fn memory_secret_from_url_or_secret_ref() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "mem").await;
    let _m = Manager::start(&ns.name, &[]);
    let memories: Api<Memory> = ns.api();
    let secrets: Api<Secret> = ns.api();
    let phase = |m: &Memory| m.status.as_ref().and_then(|s| s.phase);

    let m: Memory = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {name: cache}\nspec: {backend: redis, url: 'redis://r:6379/1'}",
    );
    memories.create(&PostParams::default(), &m).await.unwrap();
    let m = wait_for(&memories, "cache", "Bound", |m| {
        phase(m) == Some(MemoryPhase::Bound)
    })
    .await;
    assert_eq!(
        m.status.unwrap().secret_name.as_deref(),
        Some("cache-memory")
    );
    let s = secrets.get("cache-memory").await.unwrap();
    let data = s.data.clone().unwrap();
    assert_eq!(
        (data["backend"].0.as_slice(), data["url"].0.as_slice()),
        (&b"redis"[..], &b"redis://r:6379/1"[..])
    );
    assert_eq!(s.labels()["autonomic.sh/memory"], "cache");
    assert_eq!(s.owner_references()[0].uid, m.metadata.uid.unwrap());

    // secretRef: Pending while the Secret is missing, Bound once it appears offered to
    // agents (TRUST.md §2; tests/trust.rs has the Secret that is not offered).
    let m: Memory = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {name: db}\nspec: {backend: postgres, secretRef: {name: db-creds, key: url}}",
    );
    memories.create(&PostParams::default(), &m).await.unwrap();
    let m = wait_for(&memories, "db", "Pending", |m| {
        phase(m) == Some(MemoryPhase::Pending)
    })
    .await;
    assert!(m.status.unwrap().message.unwrap().contains("db-creds"));
    let creds: Secret = yaml(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: db-creds, labels: {autonomic.sh/agents: allowed}}\nstringData: {url: 'postgres://db:5432/x'}",
    );
    secrets
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
    wait_for(&memories, "db", "Bound", |m| {
        phase(m) == Some(MemoryPhase::Bound)
    })
    .await;
    let data = secrets.get("db-memory").await.unwrap().data.unwrap();
    assert_eq!(data["url"].0, b"postgres://db:5432/x");

    // Invalid specs are Errors with a reason.
    for (name, spec, needle) in [
        (
            "both",
            "{backend: redis, url: u, secretRef: {name: a, key: b}}",
            "not both",
        ),
        (
            "neither",
            "{backend: redis}",
            "set spec.url or spec.secretRef",
        ),
        (
            "wrongkey",
            "{backend: redis, secretRef: {name: db-creds, key: nope}}",
            "no key",
        ),
    ] {
        let m: Memory = yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {{name: {name}}}\nspec: {spec}"
        ));
        memories.create(&PostParams::default(), &m).await.unwrap();
        let m = wait_for(&memories, name, "Error", |m| {
            phase(m) == Some(MemoryPhase::Error)
        })
        .await;
        let msg = m.status.unwrap().message.unwrap();
        assert!(msg.contains(needle), "{name}: {msg}");
    }
    // A Secret of the same name that is not ours is not taken over.
    let theirs: Secret = yaml(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: taken-memory}\nstringData: {url: keep-me}",
    );
    secrets
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let m: Memory = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {name: taken}\nspec: {backend: redis, url: 'redis://x'}",
    );
    memories.create(&PostParams::default(), &m).await.unwrap();
    let m = wait_for(&memories, "taken", "Error", |m| {
        phase(m) == Some(MemoryPhase::Error)
    })
    .await;
    assert!(m.status.unwrap().message.unwrap().contains("not owned"));
    assert_eq!(
        secrets.get("taken-memory").await.unwrap().data.unwrap()["url"].0,
        b"keep-me"
    );
}

#[tokio::test]
async fn runtime_validity_and_agent_count() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "rt").await;
    let _m = Manager::start(&ns.name, &[]);
    let runtimes: Api<Runtime> = ns.api();
    let phase = |r: &Runtime| r.status.as_ref().and_then(|s| s.phase);
    let r: Runtime = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: empty}\nspec: {command: [x]}",
    );
    runtimes.create(&PostParams::default(), &r).await.unwrap();
    let r = wait_for(&runtimes, "empty", "Invalid", |r| {
        phase(r) == Some(RuntimePhase::Invalid)
    })
    .await;
    assert!(r.status.unwrap().message.unwrap().contains("image"));
    merge(&runtimes, "empty", json!({"spec": {"image": "py:3"}})).await;
    let r = wait_for(&runtimes, "empty", "Ready", |r| {
        phase(r) == Some(RuntimePhase::Ready)
    })
    .await;
    let st = r.status.unwrap();
    assert_eq!(
        (st.agents, st.observed_generation),
        (Some(0), r.metadata.generation)
    );
    let a: autonomic_manager::crd::Agent = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: user}\nspec: {runtime: {ref: empty}}",
    );
    ns.api().create(&PostParams::default(), &a).await.unwrap();
    wait_for(&runtimes, "empty", "counting 1 agent", |r| {
        r.status.as_ref().and_then(|s| s.agents) == Some(1)
    })
    .await;
}

#[tokio::test]
async fn unmanaged_mode_never_dials_the_control_plane() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "unmanaged").await;
    // A listener standing in for the control plane: nothing may connect to it.
    let cp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", cp.local_addr().unwrap());
    let m = Manager::start(
        &ns.name,
        &[
            ("AUTONOMIC_BASE_URL", &url),
            ("AUTONOMIC_AUTH_TOKEN", "tok_unmanaged_secret"),
        ],
    );
    m.wait_ready().await;
    let r: Runtime = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: r}\nspec: {image: i}",
    );
    ns.api::<Runtime>()
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    wait_for(&ns.api::<Runtime>(), "r", "Ready", |r| {
        r.status.as_ref().and_then(|s| s.phase) == Some(RuntimePhase::Ready)
    })
    .await;
    let dialled = tokio::time::timeout(Duration::from_secs(3), cp.accept()).await;
    assert!(
        dialled.is_err(),
        "the manager connected to the control plane while unmanaged"
    );
    // No socket of any process on this machine points at the control plane's port.
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let cp_port = format!(":{:04X}", cp.local_addr().unwrap().port());
    assert!(
        !tcp.lines().any(|l| l
            .split_whitespace()
            .nth(2)
            .is_some_and(|remote| remote.ends_with(&cp_port))),
        "a socket to the control plane port exists"
    );
    assert!(!m.logs().contains("tok_unmanaged_secret"));
}
