//! Managed mode against the fake control plane (a real WebSocket server on loopback)
//! and the real API server: the protocol of PROTOCOL.md §2–§5 and §7.

mod support;

use std::time::Duration;

use autonomic_manager::crd::{Agent, AgentPhase, Runtime, Tool};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::connect_proxy::ConnectProxy;
use support::fake_cp::{FakeCp, Mode, Received, ReceivedKind};
use support::*;

const TOKEN: &str = "tok_live_3f9a1c7e5b2d4a60";

fn managed_env(cp: &FakeCp) -> Vec<(&'static str, String)> {
    let mut env = managed_vars(cp.url(), TOKEN);
    env.push(("AUTONOMIC_CLUSTER_ID", "test-cluster".into()));
    env
}

fn start(ns: &str, env: &[(&'static str, String)]) -> Manager {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Manager::start(ns, &pairs)
}

fn is(t: &'static str) -> impl Fn(&Received) -> bool {
    move |r| r.frame_type() == Some(t)
}

fn json_of(r: &Received) -> Value {
    r.json().cloned().unwrap_or(Value::Null)
}

/// The manager's log must never hold the token (its 6-character prefix may appear).
fn assert_no_token(m: &Manager) {
    let logs = m.logs();
    assert!(!logs.contains(TOKEN), "the token leaked into the log");
    assert!(
        !logs.contains(&TOKEN[6..]),
        "part of the token leaked into the log"
    );
}

#[tokio::test]
async fn hello_snapshot_then_deltas_for_every_kind() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-sync").await;
    let rt: Runtime = create_yaml(&ns.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: base}\nspec: {image: 'img:1'}").await;
    let cp = FakeCp::start().await;
    let m = start(&ns.name, &managed_env(&cp));

    let hello = json_of(&cp.wait_frame("hello", is("hello")).await);
    assert_eq!(hello["protocol"], 1);
    assert_eq!(hello["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(hello["cluster_id"], "test-cluster");
    assert_eq!(hello["boot_id"].as_str().unwrap().len(), 36);
    assert!(
        hello["host"]["kubernetes_version"]
            .as_str()
            .unwrap()
            .starts_with("v1.")
    );
    let req = &cp.requests()[0];
    assert_eq!(req.path, "/api/autonomic/connect");
    assert_eq!(req.headers["authorization"], format!("Bearer {TOKEN}"));
    assert_eq!(req.headers["sec-websocket-protocol"], "autonomic.v1");
    assert!(req.headers["user-agent"].starts_with("autonomic-manager/"));

    // The snapshot holds what is in the cluster, in wire form.
    let snap = json_of(&cp.wait_frame("snapshot", is("snapshot")).await);
    assert_eq!(snap["seq"], 1);
    let res = snap["resources"].as_array().unwrap();
    let base = res
        .iter()
        .find(|r| r["name"] == "base")
        .expect("the Runtime in the snapshot");
    assert_eq!(base["kind"], "Runtime");
    assert_eq!(base["uid"], rt.uid().unwrap());
    assert_eq!(base["spec"]["image"], "img:1");
    assert_eq!(base["pods"], json!([]));
    m.wait_ready().await;
    assert_eq!(m.metric("autonomic_connected").await, 1.0);

    // Create, update, delete of each kind become deltas.
    create_yaml::<Tool>(&ns.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {name: t1}\nspec: {image: 'img:2'}").await;
    create_yaml::<autonomic_manager::crd::Memory>(&ns.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {name: m1}\nspec: {backend: redis, url: 'redis://x'}").await;
    create_yaml::<Agent>(&ns.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: a1}\nspec: {runtime: {ref: base}, memory: [m1]}").await;
    let upsert_of = |kind: &'static str, name: &'static str, pred: fn(&Value) -> bool| {
        move |r: &Received| {
            r.frame_type() == Some("delta")
                && json_of(r)["changes"].as_array().unwrap().iter().any(|c| {
                    c["op"] == "upsert"
                        && c["resource"]["kind"] == kind
                        && c["resource"]["name"] == name
                        && pred(&c["resource"])
                })
        }
    };
    // No Agent uses the Tool: the wire form says why it has no pod.
    cp.wait_frame(
        "Tool upsert, idle for want of users",
        upsert_of("Tool", "t1", |r| {
            r["demand"]
                == json!({"users": 0, "state": "idle", "idle_since": null, "idle_until": null})
                && r["message"] == "idle: no Agent uses this tool"
                && r["status"]["users"] == 0
                && r["pods"] == json!([])
        }),
    )
    .await;
    cp.wait_frame(
        "Memory bound",
        upsert_of("Memory", "m1", |r| {
            r["phase"] == "Bound" && r["ready"] == true
        }),
    )
    .await;
    cp.wait_frame(
        "Agent upsert with memory refs",
        upsert_of("Agent", "a1", |r| {
            r["status"]["memory_refs"][0]["secret_name"] == "m1-memory"
        }),
    )
    .await;
    ns.api::<Runtime>()
        .patch(
            "base",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "img:9"}})),
        )
        .await
        .unwrap();
    cp.wait_frame(
        "Runtime update",
        upsert_of("Runtime", "base", |r| {
            r["spec"]["image"] == "img:9" && r["generation"] == 2
        }),
    )
    .await;
    ns.api::<Tool>()
        .delete("t1", &DeleteParams::default())
        .await
        .unwrap();
    cp.wait_frame("Tool removal", |r| {
        r.frame_type() == Some("delta")
            && json_of(r)["changes"].as_array().unwrap().iter().any(|c| {
                c["op"] == "remove"
                    && c["kind"] == "Tool"
                    && c["name"] == "t1"
                    && c["uid"].as_str().is_some_and(|u| !u.is_empty())
            })
    })
    .await;

    // seq: 1 on the snapshot, then +1 on every snapshot and delta, no gaps.
    let seqs: Vec<u64> = cp
        .frames()
        .iter()
        .filter(|r| matches!(r.frame_type(), Some("snapshot" | "delta")))
        .map(|r| json_of(r)["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_no_token(&m);
}

#[tokio::test]
async fn agent_wire_form_carries_its_pod_and_context_summary() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-pods").await;
    let cp = FakeCp::start().await;
    let _m = start(&ns.name, &managed_env(&cp));
    cp.wait_frame("snapshot", is("snapshot")).await;
    let agents: Api<Agent> = ns.api();
    create_yaml(&agents, &format!("apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'trap \"exit 0\" TERM; while :; do sleep 1; done']}}}}")).await;
    wait_for(&agents, "a", "Active", |a| {
        a.status.as_ref().and_then(|s| s.phase) == Some(AgentPhase::Active)
    })
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    pods.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"autonomic.sh/context-summary": "reading the logs"}}})))
        .await
        .unwrap();
    let frame = cp
        .wait_frame("Active agent with its pod and summary", |r| {
            r.frame_type() == Some("delta")
                && json_of(r)["changes"].as_array().unwrap().iter().any(|c| {
                    let a = &c["resource"];
                    a["name"] == "a"
                        && a["phase"] == "Active"
                        && a["status"]["context_summary"] == "reading the logs"
                })
        })
        .await;
    let delta = json_of(&frame);
    let agent = delta["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["resource"]["name"] == "a")
        .unwrap();
    let pod = &agent["resource"]["pods"][0];
    assert_eq!(
        (
            pod["name"].as_str(),
            pod["phase"].as_str(),
            pod["ready"].as_bool()
        ),
        (Some("a"), Some("Running"), Some(true))
    );
    assert_eq!(pod["node"], "testbed-node");
    let names: Vec<_> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["agentlet", "runtime"]);
    assert_eq!(pod["containers"][1]["state"], "running");
}

#[tokio::test]
async fn resync_malformed_and_unknown_frames() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-bad").await;
    let cp = FakeCp::start().await;
    let m = start(&ns.name, &managed_env(&cp));
    cp.wait_frame("snapshot", is("snapshot")).await;

    cp.send(json!({"type": "resync"})).await;
    cp.wait_frame("second snapshot", |r| {
        r.frame_type() == Some("snapshot") && json_of(r)["seq"] == 2
    })
    .await;

    for (garbage, reference) in [
        ("{not json", None),
        ("[1,2,3]", None),
        (r#"{"type": 7}"#, None),
        (r#"{"type": "control", "id": "x"}"#, Some("control")),
        (
            r#"{"type": "io_resize", "channel": "one"}"#,
            Some("io_resize"),
        ),
    ] {
        let before = tokio::time::Instant::now();
        cp.send_raw(garbage).await;
        let err = cp
            .wait_frame(&format!("error for {garbage}"), |r| {
                r.frame_type() == Some("error") && r.at >= before
            })
            .await;
        let err = json_of(&err);
        assert_eq!(err["code"], "bad_frame", "{garbage}");
        assert_eq!(err["ref"].as_str(), reference, "{garbage}");
    }
    // Unknown types are ignored; binary on an unknown channel is answered; the link stays up.
    cp.send(json!({"type": "future_feature", "x": 1})).await;
    cp.send_binary(vec![0, 0, 0, 9, 0, b'l', b's']).await;
    cp.wait_frame("unknown_channel", |r| {
        r.frame_type() == Some("error") && json_of(r)["code"] == "unknown_channel"
    })
    .await;
    cp.send(json!({"type": "resync"})).await;
    cp.wait_frame("third snapshot", |r| {
        r.frame_type() == Some("snapshot") && json_of(r)["seq"] == 3
    })
    .await;
    assert_eq!(cp.accepted(), 1, "still the first connection");
    assert!(
        !cp.frames()
            .iter()
            .any(|r| r.frame_type() == Some("error") && json_of(r)["ref"] == "future_feature")
    );
    assert!(m.metric("autonomic_frames_rejected_total").await >= 6.0);
    assert!(!m.logs().contains("panicked"));
}

#[tokio::test]
async fn control_actions_change_the_cluster_and_are_audited() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-control").await;
    let other = TestNamespace::new(&client, "cp-elsewhere").await;
    let cp = FakeCp::start().await;
    let m = start(&ns.name, &managed_env(&cp));
    let agents: Api<Agent> = ns.api();
    create_yaml(&agents, "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: bot}\nspec: {runtime: {image: 'img:1'}}").await;
    create_yaml::<Tool>(&ns.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {name: t}\nspec: {image: 'img:1'}").await;
    create_yaml::<Runtime>(&ns.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: r}\nspec: {image: 'img:1'}").await;
    create_yaml::<Agent>(&other.api(), "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: bot}\nspec: {runtime: {image: 'img:1'}}").await;
    cp.wait_frame("Agent in a delta or snapshot", |r| {
        r.resources().iter().any(|x| x["name"] == "bot")
    })
    .await;
    wait_until("the Tool in the manager's cache", || async {
        cp.frames()
            .iter()
            .any(|r| r.resources().iter().any(|x| x["name"] == "t"))
    })
    .await;

    let control = |id: &str, action: &str, kind: &str, namespace: &str, name: &str| {
        json!({"type": "control", "id": id, "action": action, "actor": "alice@example.com",
               "target": {"kind": kind, "namespace": namespace, "name": name}})
    };
    let result = |id: &'static str| {
        move |r: &Received| r.frame_type() == Some("control_result") && json_of(r)["id"] == id
    };

    cp.send(control("c1", "pause", "Agent", &ns.name, "bot"))
        .await;
    assert_eq!(
        json_of(&cp.wait_frame("c1", result("c1")).await)["ok"],
        true
    );
    wait_for(&agents, "bot", "paused", |a| a.spec.paused).await;
    cp.send(control("c2", "resume", "Agent", &ns.name, "bot"))
        .await;
    assert_eq!(
        json_of(&cp.wait_frame("c2", result("c2")).await)["ok"],
        true
    );
    wait_for(&agents, "bot", "resumed", |a| !a.spec.paused).await;
    cp.send(control("c3", "pause", "Tool", &ns.name, "t")).await;
    assert_eq!(
        json_of(&cp.wait_frame("c3", result("c3")).await)["ok"],
        true
    );
    wait_for(&ns.api::<Tool>(), "t", "disabled", |t| t.spec.disabled).await;

    // Refusals: another kind, another namespace, a missing target.
    for (id, kind, namespace, name, why) in [
        (
            "d1",
            "Runtime",
            ns.name.as_str(),
            "r",
            "cannot be controlled",
        ),
        ("d2", "Agent", other.name.as_str(), "bot", "not watched"),
        ("d3", "Agent", ns.name.as_str(), "nobody", "not found"),
        ("d4", "Pod", ns.name.as_str(), "bot", "cannot be controlled"),
    ] {
        let id: &'static str = Box::leak(id.to_owned().into_boxed_str());
        cp.send(control(id, "delete", kind, namespace, name)).await;
        let r = json_of(&cp.wait_frame(id, result(id)).await);
        assert_eq!(r["ok"], false, "{id}");
        assert!(r["error"].as_str().unwrap().contains(why), "{id}: {r}");
    }
    assert!(
        other.api::<Agent>().get_opt("bot").await.unwrap().is_some(),
        "the other namespace is untouched"
    );

    cp.send(control("c4", "delete", "Agent", &ns.name, "bot"))
        .await;
    assert_eq!(
        json_of(&cp.wait_frame("c4", result("c4")).await)["ok"],
        true
    );
    wait_gone(&agents, "bot").await;

    // Every control, done or refused, is one audit event with the actor.
    wait_until("8 audit events", || async {
        cp.frames()
            .iter()
            .filter(|r| r.frame_type() == Some("audit"))
            .count()
            >= 8
    })
    .await;
    let audits: Vec<Value> = cp
        .frames()
        .iter()
        .filter(|r| r.frame_type() == Some("audit"))
        .map(|r| json_of(r)["event"].clone())
        .collect();
    let done = audits
        .iter()
        .filter(|e| e["action"] == "control.done")
        .count();
    let denied = audits
        .iter()
        .filter(|e| e["action"] == "control.denied")
        .count();
    assert_eq!((done, denied), (4, 4), "{audits:#?}");
    assert!(
        audits
            .iter()
            .all(|e| e["actor"] == "alice@example.com" && e["id"].as_str().unwrap().len() == 36)
    );
    // …and one structured log line each.
    assert_eq!(
        m.logs()
            .lines()
            .filter(|l| l.contains("audit") && l.contains("alice@example.com"))
            .count(),
        8
    );
}

#[tokio::test]
async fn dead_connection_is_detected_and_redialled() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-dead").await;
    let cp = FakeCp::start().await;
    cp.set_welcome(1, 300);
    cp.set_auto_heartbeat(false);
    let mut m = start(&ns.name, &managed_env(&cp));
    cp.wait_frame("snapshot", is("snapshot")).await;
    // Heartbeats go out every second; the silent peer is dropped after 3 and redialled.
    cp.wait_frame("a heartbeat", is("heartbeat")).await;
    wait_until("a second connection", || async { cp.accepted() >= 2 }).await;
    // Connection 2 stays up until the drop below (unanswered, it too would be dropped
    // after 3 s, and there would be no connection left to drop).
    cp.set_auto_heartbeat(true);
    m.wait_log(
        "nothing from the control plane for 3 heartbeat intervals",
        Duration::from_secs(5),
    );
    // The readiness probe tells the truth meanwhile.
    cp.set_mode(Mode::Reject(503));
    cp.drop_connection().await;
    wait_until("not ready while disconnected", || async {
        m.get("/readyz").await.0 == 503
    })
    .await;
    assert!(m.get("/readyz").await.1.contains("not connected"));
    cp.set_mode(Mode::Accept);
    cp.set_auto_heartbeat(true);
    m.wait_ready().await;
    assert!(m.metric("autonomic_reconnects_total").await >= 2.0);
}

#[tokio::test]
async fn eviction_waits_the_eviction_delay_and_says_why() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-evict").await;
    let cp = FakeCp::start().await;
    let mut env = managed_env(&cp);
    env.push(("AUTONOMIC_EVICTION_DELAY_S", "5".into()));
    let mut m = start(&ns.name, &env);
    cp.wait_frame("snapshot", is("snapshot")).await;
    cp.close(4000, "evicted by newer connection").await;
    let line = m.wait_log("evicted by a newer connection", Duration::from_secs(10));
    assert!(line.contains("share one token"), "{line}");
    // The backoff floor is 100 ms here: an immediate redial would be well inside 1.5 s,
    // and the delay leaves 3.5 s for a loaded machine to look.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(cp.attempts(), 1, "redialled before the eviction delay");
    wait_until("the redial after the eviction delay", || async {
        cp.accepted() >= 2
    })
    .await;
    assert_no_token(&m);
}

#[tokio::test]
async fn rejected_token_backs_off_and_logs_only_the_prefix() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-reject").await;
    let cp = FakeCp::start().await;
    cp.set_mode(Mode::Reject(401));
    let mut m = start(&ns.name, &managed_env(&cp));
    let line = m.wait_log("token rejected", Duration::from_secs(20));
    assert!(
        line.contains(&TOKEN[..6]),
        "the token prefix helps find the token: {line}"
    );
    wait_until("a few attempts", || async { cp.attempts() >= 3 }).await;
    assert_eq!(cp.accepted(), 0);
    // Reconciling goes on while the link is down.
    create_yaml::<Runtime>(
        &ns.api(),
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: r}\nspec: {image: i}",
    )
    .await;
    wait_for(
        &ns.api::<Runtime>(),
        "r",
        "reconciled while disconnected",
        |r| r.status.is_some(),
    )
    .await;
    // A wrong URL is a 404 with its own message.
    cp.set_mode(Mode::Reject(404));
    m.wait_log("check AUTONOMIC_BASE_URL", Duration::from_secs(20));
    assert_no_token(&m);
}

#[tokio::test]
async fn base_url_prefix_and_token_file_rotation() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-rotate").await;
    let cp = FakeCp::start_with_prefix("/platform/eu").await;
    let dir = log_dir().join(format!("{}-token", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "tok_first_aaaaaaaaaaaa\n").unwrap();
    let mut env: Vec<_> = managed_env(&cp)
        .into_iter()
        .filter(|(k, _)| *k != "AUTONOMIC_AUTH_TOKEN")
        .collect();
    env.push(("AUTONOMIC_AUTH_TOKEN_FILE", file.display().to_string()));
    env[1].1 = format!("{}/", cp.url()); // a trailing slash is not doubled
    let m = start(&ns.name, &env);
    cp.wait_frame("snapshot", is("snapshot")).await;
    assert_eq!(cp.requests()[0].path, "/platform/eu/api/autonomic/connect");
    assert_eq!(
        cp.requests()[0].headers["authorization"],
        "Bearer tok_first_aaaaaaaaaaaa"
    );
    // The Secret rotates: the file is re-read before the next dial.
    std::fs::write(&file, "tok_second_bbbbbbbbbbb").unwrap();
    cp.close(4002, "protocol error").await;
    wait_until("a second connection", || async { cp.accepted() >= 2 }).await;
    let last = cp
        .requests()
        .into_iter()
        .rfind(|r| r.status == 101)
        .unwrap();
    assert_eq!(
        last.headers["authorization"],
        "Bearer tok_second_bbbbbbbbbbb"
    );
    let logs = m.logs();
    assert!(!logs.contains("tok_first_aaaaaaaaaaaa") && !logs.contains("tok_second_bbbbbbbbbbb"));
}

#[tokio::test]
async fn control_plane_restart_and_sigterm() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-restart").await;
    let cp = FakeCp::start().await;
    let mut m = start(&ns.name, &managed_env(&cp));
    cp.wait_frame("snapshot", is("snapshot")).await;
    cp.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    cp.restart().await;
    wait_until("a snapshot on the new connection", || async {
        cp.frames()
            .iter()
            .any(|r| r.conn >= 2 && r.frame_type() == Some("snapshot"))
    })
    .await;
    let snap = cp
        .frames()
        .into_iter()
        .find(|r| r.conn >= 2 && r.frame_type() == Some("snapshot"))
        .unwrap();
    assert_eq!(
        json_of(&snap)["seq"],
        1,
        "seq starts at 1 on each connection"
    );
    // The second hello carries the same boot id: a reconnect, not a restart.
    let boots: Vec<Value> = cp
        .frames()
        .iter()
        .filter(|r| r.frame_type() == Some("hello"))
        .map(|r| json_of(r)["boot_id"].clone())
        .collect();
    assert!(boots.len() >= 2 && boots.iter().all(|b| *b == boots[0]));

    // SIGTERM: close 1000 "shutdown", exit 0.
    let code = m.stop("TERM");
    assert_eq!(code, Some(0), "{}", m.logs());
    let close = cp
        .wait_frame("close 1000", |r| {
            matches!(&r.kind, ReceivedKind::Close(Some((1000, _))))
        })
        .await;
    if let ReceivedKind::Close(Some((_, reason))) = &close.kind {
        assert_eq!(reason, "shutdown");
    }
}

/// The HTTP transport goes through the same dial loop as the socket: the Lease tells
/// the standbys "connected" while the platform answers, and why not once it refuses or
/// is gone; the disconnect and dial-failure counters move.
#[tokio::test]
async fn http_transport_tells_the_lease_and_counts_its_failures() {
    use k8s_openapi::api::coordination::v1::Lease;
    use support::fake_http::FakeReport;
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-http-link").await;
    let cp = FakeReport::start().await;
    let mut env = http_vars(&cp.url, TOKEN);
    env.extend([
        ("AUTONOMIC_LEADER_ELECTION", "true".into()),
        ("POD_NAMESPACE", ns.name.clone()),
        ("POD_NAME", "http-0".into()),
    ]);
    let m = Manager::start(&ns.name, &pairs(&env));
    m.wait_ready().await;
    let leases: Api<Lease> = ns.api();
    let link = || async {
        leases
            .get("autonomic-manager")
            .await
            .ok()
            .and_then(|l| l.metadata.annotations?.remove("autonomic.sh/link"))
            .unwrap_or_default()
    };
    let report = format!("{}/api/autonomic/report", cp.url);
    let says = |text: String| {
        let link = &link;
        async move {
            let now = link().await;
            now.contains(&text).then_some(()).ok_or(now)
        }
    };
    wait_until("the Lease says connected", || async {
        says(format!("connected to {report} (token ")).await.is_ok()
    })
    .await;
    assert_eq!(m.metric("autonomic_connected").await, 1.0);
    let counted = |series: &'static str| {
        let m = &m;
        async move { m.metric(series).await }
    };
    let dropped = r#"autonomic_disconnects_total{reason="dropped"}"#;
    let rejected = r#"autonomic_disconnects_total{reason="rejected"}"#;
    let status = r#"autonomic_dial_failures_total{reason="http_status"}"#;
    let token = r#"autonomic_dial_failures_total{reason="token"}"#;
    let refused = r#"autonomic_dial_failures_total{reason="connect"}"#;
    assert_eq!(counted(dropped).await, 0.0);
    assert_eq!(counted(status).await, 0.0);

    // The platform answers 503: the session ends (dropped), the redials fail (HTTP
    // status), and the Lease says why.
    cp.set_status(503);
    wait_until("the Lease says HTTP 503", || async {
        says(format!("not connected to {report}: refused with HTTP 503"))
            .await
            .is_ok()
    })
    .await;
    assert!(counted(dropped).await >= 1.0);
    assert!(counted(status).await >= 1.0);
    assert_eq!(m.metric("autonomic_connected").await, 0.0);

    // Back: connected again.
    cp.set_status(200);
    wait_until("the Lease says connected again", || async {
        says(format!("connected to {report} (token ")).await.is_ok()
    })
    .await;
    // The token refused in the middle of a session: a rejection, counted apart.
    cp.set_status(401);
    wait_until("the Lease says the token is rejected", || async {
        says(format!(
            "not connected to {report}: token rejected (HTTP 401)"
        ))
        .await
        .is_ok()
    })
    .await;
    assert!(counted(rejected).await >= 1.0);
    assert!(counted(token).await >= 1.0);

    // The platform gone: connection refused, on the Lease and counted.
    cp.set_status(200);
    wait_until("connected once more", || async {
        says(format!("connected to {report} (token ")).await.is_ok()
    })
    .await;
    drop(cp);
    wait_until("the Lease says connection refused", || async {
        says("connection refused".into()).await.is_ok()
    })
    .await;
    assert!(counted(refused).await >= 1.0);
    assert!(m.logs().contains("connection to the control plane failed"));
}

#[tokio::test]
async fn legacy_http_transport_reports_and_takes_control() {
    use support::fake_http::FakeReport;
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-http").await;
    let cp = FakeReport::start().await;
    let env = http_vars(&cp.url, TOKEN);
    let m = Manager::start(&ns.name, &pairs(&env));
    // hello first, then the snapshot, in one post.
    cp.wait_frame("hello", |f| f["type"] == "hello").await;
    let first = cp.posts()[0].clone();
    assert_eq!(first.path, "/api/autonomic/report");
    assert_eq!(first.authorization, format!("Bearer {TOKEN}"));
    assert_eq!(first.frames[0]["type"], "hello");
    assert_eq!(
        (
            first.frames[1]["type"].as_str(),
            first.frames[1]["seq"].as_u64()
        ),
        (Some("snapshot"), Some(1))
    );
    m.wait_ready().await;

    // A change leaves as a delta in a later post.
    let agents: Api<Agent> = ns.api();
    create_yaml(&agents, "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: h}\nspec: {runtime: {image: 'img:1'}}").await;
    cp.wait_frame("delta with the Agent", |f| {
        f["type"] == "delta"
            && f["changes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["resource"]["name"] == "h")
    })
    .await;
    // Heartbeats at least every heartbeat interval (2 s here) when nothing changes.
    cp.wait_frame("heartbeat", |f| f["type"] == "heartbeat")
        .await;

    // Control frames come back in the answer; the result and audit go out in the next post.
    cp.queue(json!({"type": "control", "id": "h1", "action": "pause", "actor": "bob", "target": {"kind": "Agent", "namespace": ns.name, "name": "h"}}));
    let r = cp
        .wait_frame("control_result", |f| {
            f["type"] == "control_result" && f["id"] == "h1"
        })
        .await;
    assert_eq!(r["ok"], true);
    wait_for(&agents, "h", "paused", |a| a.spec.paused).await;
    cp.wait_frame("audit", |f| {
        f["type"] == "audit" && f["event"]["action"] == "control.done"
    })
    .await;
    // The link dies right after a control: its result and audit event are kept and
    // arrive after the next hello and snapshot.
    cp.fail_after_control(true);
    cp.queue(json!({"type": "control", "id": "h2", "action": "resume", "actor": "carol", "target": {"kind": "Agent", "namespace": ns.name, "name": "h"}}));
    wait_for(&agents, "h", "resumed", |a| !a.spec.paused).await;
    let after = cp
        .wait_frame("control_result h2", |f| {
            f["type"] == "control_result" && f["id"] == "h2"
        })
        .await;
    assert_eq!(after["ok"], true);
    let carries = |p: &support::fake_http::Post| p.frames.iter().any(|f| f["id"] == "h2");
    wait_until("the result sent again after the failed post", || async {
        cp.posts().iter().filter(|p| carries(p)).count() >= 2
    })
    .await;
    let posts = cp.posts();
    let carrying = |p: &support::fake_http::Post| p.frames.iter().any(|f| f["id"] == "h2");
    let failed = posts.iter().position(carrying).unwrap();
    let at = posts.iter().rposition(carrying).unwrap();
    assert!(
        at > failed,
        "the post carrying the result failed; a later one carries it again"
    );
    let types: Vec<_> = posts[at]
        .frames
        .iter()
        .map(|f| f["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        &types[..2],
        ["hello", "snapshot"],
        "delivered after a new hello: {types:?}"
    );
    assert!(
        posts[at]
            .frames
            .iter()
            .any(|f| f["type"] == "audit" && f["event"]["actor"] == "carol"),
        "{types:?}"
    );
    // seq restarts at 1 after a new hello, so count snapshots rather than compare seqs.
    let snapshots = || {
        cp.frames()
            .iter()
            .filter(|f| f["type"] == "snapshot")
            .count()
    };
    let before = snapshots();
    cp.queue(json!({"type": "resync"}));
    wait_until("a snapshot answering resync", || async {
        snapshots() > before
    })
    .await;
    // No shell over HTTP.
    cp.queue(json!({"type": "io_open", "channel": 1, "session_id": "s", "actor": "bob", "target": {"namespace": ns.name, "agent": "h"}, "cols": 80, "rows": 24}));
    cp.wait_frame("io_close denied", |f| {
        f["type"] == "io_close" && f["reason"] == "denied"
    })
    .await;
    cp.wait_frame("session.denied audit", |f| {
        f["type"] == "audit"
            && f["event"]["action"] == "session.denied"
            && f["event"]["session_id"] == "s"
    })
    .await;

    // A rejected token backs off and says so. (Waited for without blocking the thread:
    // the fake answers on this test's runtime.)
    cp.set_status(401);
    wait_until("token rejected in the log", || async {
        m.logs().contains("token rejected")
    })
    .await;
    let line = m
        .logs()
        .lines()
        .find(|l| l.contains("token rejected"))
        .unwrap()
        .to_owned();
    assert!(line.contains(&TOKEN[..6]), "{line}");
    assert_no_token(&m);
}

#[tokio::test]
async fn private_ca_is_trusted_only_when_configured() {
    let client = client().await;
    let (ca_file, cert, key) = pki::test_pki();
    let cp = FakeCp::start_tls(&cert, &key).await;
    assert!(cp.url().starts_with("https://127.0.0.1:"), "{}", cp.url());

    // Without AUTONOMIC_CA_FILE only the public roots are trusted: the handshake fails,
    // the cause is one line naming TLS and the certificate, and the manager retries.
    let ns = TestNamespace::new(&client, "cp-ca-none").await;
    let mut m = start(&ns.name, &managed_env(&cp));
    let line = m.wait_log(
        "connection to the control plane failed",
        Duration::from_secs(30),
    );
    assert!(
        line.contains("TLS") && line.contains("certificate"),
        "the failure should name TLS and the certificate: {line}"
    );
    wait_until("retried TLS handshakes", || async {
        cp.tls_failures() >= 2
    })
    .await;
    assert_eq!(cp.accepted(), 0, "no WebSocket without trusting the CA");
    assert_eq!(m.metric("autonomic_connected").await, 0.0);
    assert_no_token(&m);
    drop(m);

    // A CA file holding no certificate is refused at start (exit 2, the file named):
    // tests/binary.rs, commands_and_bad_configuration.

    // With the CA: hello and snapshot arrive over wss.
    let ns = TestNamespace::new(&client, "cp-ca").await;
    let mut env = managed_env(&cp);
    env.push(("AUTONOMIC_CA_FILE", ca_file.display().to_string()));
    let mut m = start(&ns.name, &env);
    let hello = json_of(&cp.wait_frame("hello over wss", is("hello")).await);
    assert_eq!(hello["cluster_id"], "test-cluster");
    let snap = json_of(&cp.wait_frame("snapshot over wss", is("snapshot")).await);
    assert_eq!(snap["seq"], 1);
    assert_eq!(cp.accepted(), 1);
    let req = cp.requests().into_iter().next().unwrap();
    assert_eq!(req.status, 101);
    assert_eq!(req.headers["authorization"], format!("Bearer {TOKEN}"));
    let line = m.wait_log("connected to the control plane", Duration::from_secs(10));
    assert!(line.contains("wss://127.0.0.1:"), "{line}");
    m.wait_ready().await;
    assert_eq!(m.metric("autonomic_connected").await, 1.0);
    assert_no_token(&m);
}

#[tokio::test]
async fn connects_through_an_http_connect_proxy() {
    let client = client().await;

    // HTTPS_PROXY: the socket is tunnelled with CONNECT to the control plane. Written as
    // Go allows (no scheme), with credentials: they go into Proxy-Authorization,
    // percent-decoded ("user:p@ss"), and the logs show no password.
    let cp = FakeCp::start().await;
    let proxy = ConnectProxy::start(None);
    let ns = TestNamespace::new(&client, "cp-proxy").await;
    let mut env = managed_env(&cp);
    env.push((
        "HTTPS_PROXY",
        format!("user:p%40ss@127.0.0.1:{}", proxy.port),
    ));
    let m = start(&ns.name, &env);
    cp.wait_frame("snapshot through the proxy", is("snapshot"))
        .await;
    assert_eq!(proxy.seen(), [format!("CONNECT 127.0.0.1:{}", cp.port())]);
    assert_eq!(
        proxy.authorizations(),
        [Some("Basic dXNlcjpwQHNz".to_owned())]
    );
    let logs = m.logs();
    assert!(!logs.contains("p%40ss") && !logs.contains("p@ss"), "{logs}");
    assert!(
        logs.contains("https_proxy=http://user:***@127.0.0.1:"),
        "{logs}"
    );
    assert_eq!(cp.requests()[0].path, "/api/autonomic/connect");
    assert_eq!(m.metric("autonomic_connected").await, 1.0);
    assert_no_token(&m);
    drop(m);

    // wss through the same kind of tunnel: TLS runs end to end, inside the CONNECT.
    let (ca_file, cert, key) = pki::test_pki();
    let tls_cp = FakeCp::start_tls(&cert, &key).await;
    let ns = TestNamespace::new(&client, "cp-proxy-tls").await;
    let mut env = managed_env(&tls_cp);
    env.push(("HTTPS_PROXY", proxy.url()));
    env.push(("AUTONOMIC_CA_FILE", ca_file.display().to_string()));
    let m = start(&ns.name, &env);
    tls_cp
        .wait_frame("snapshot over wss through the proxy", is("snapshot"))
        .await;
    assert_eq!(
        proxy.seen().last().unwrap(),
        &format!("CONNECT 127.0.0.1:{}", tls_cp.port())
    );
    assert_eq!(proxy.authorizations().last().unwrap(), &None);
    assert_no_token(&m);
    drop(m);
    drop(tls_cp);

    // A proxy that refuses: one line naming the proxy and its answer, retried, no crash.
    let cp = FakeCp::start().await;
    let refusing = ConnectProxy::start(Some(403));
    let ns = TestNamespace::new(&client, "cp-proxy-403").await;
    let mut env = managed_env(&cp);
    env.push(("HTTPS_PROXY", refusing.url()));
    let mut m = start(&ns.name, &env);
    let line = m.wait_log(
        "connection to the control plane failed",
        Duration::from_secs(30),
    );
    assert!(
        line.contains("proxy") && line.contains("403"),
        "the failure should name the proxy and its answer: {line}"
    );
    wait_until("retries through the refusing proxy", || async {
        refusing.seen().len() >= 3
    })
    .await;
    assert_eq!(m.metric("autonomic_connected").await, 0.0, "still serving");
    assert_eq!(cp.attempts(), 0, "nothing reached the control plane");
    assert_no_token(&m);
    drop(m);

    // NO_PROXY exempts the control plane's host: the proxy sees nothing.
    let cp = FakeCp::start().await;
    let proxy = ConnectProxy::start(None);
    let ns = TestNamespace::new(&client, "cp-no-proxy").await;
    let mut env = managed_env(&cp);
    env.push(("HTTPS_PROXY", proxy.url()));
    env.push(("NO_PROXY", "127.0.0.1".into()));
    let m = start(&ns.name, &env);
    cp.wait_frame("snapshot, direct", is("snapshot")).await;
    assert_eq!(cp.accepted(), 1);
    assert_eq!(proxy.seen(), Vec::<String>::new(), "NO_PROXY was ignored");
    assert_no_token(&m);
}

#[tokio::test]
async fn no_welcome_periodic_snapshots_and_revoked_token() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-timers").await;
    let cp = FakeCp::start().await;
    // A peer that upgrades and then says nothing: no welcome within the timeout. The
    // manager goes on with the default intervals (§4.1: a platform that sends no welcome
    // must still see the cluster). That it finds such a peer dead 3 × 15 s after its last
    // frame (§4.5) is timed exactly on the paused clock, in process
    // (`connect::session`'s `a_silent_peer_is_dead_three_intervals_after_its_last_frame_…`);
    // here the peer drops the connection instead, and the manager redials.
    cp.set_mode(Mode::Silent);
    let mut env = managed_env(&cp);
    env.push(("AUTONOMIC_WELCOME_TIMEOUT_S", "1".into()));
    let mut m = start(&ns.name, &env);
    m.wait_log("no welcome from the control plane", Duration::from_secs(20));
    wait_until("a snapshot without a welcome", || async {
        cp.frames()
            .iter()
            .any(|r| r.conn == 1 && r.frame_type() == Some("snapshot"))
    })
    .await;
    cp.set_mode(Mode::Accept);
    cp.set_welcome(15, 1);
    cp.drop_connection().await;
    wait_until("a redial after the drop", || async { cp.accepted() >= 2 }).await;

    // A snapshot every snapshot_interval_s backstops lost deltas.
    cp.set_mode(Mode::Accept);
    cp.set_welcome(15, 1);
    wait_until("three snapshots on one connection", || async {
        let frames = cp.frames();
        let Some(conn) = frames
            .iter()
            .filter(|r| r.frame_type() == Some("snapshot"))
            .map(|r| r.conn)
            .max()
        else {
            return false;
        };
        frames
            .iter()
            .filter(|r| r.conn == conn && r.frame_type() == Some("snapshot"))
            .count()
            >= 3
    })
    .await;

    // Close 4001: the token was revoked; said so, and dialled again on the rejected schedule.
    let before = cp.attempts();
    cp.close(4001, "token revoked").await;
    let line = m.wait_log("token rejected: revoked", Duration::from_secs(10));
    assert!(line.contains(&TOKEN[..6]), "{line}");
    wait_until("a redial", || async { cp.attempts() > before }).await;
    assert_no_token(&m);
}

/// `/metrics` parsed by a real Prometheus text parser: every sample line must parse,
/// every family has HELP and a TYPE; returns the samples. A histogram's `_bucket` lines
/// become one sample (per label set) holding its buckets; its `_sum` and `_count` are
/// untyped samples of their own.
async fn scrape(m: &Manager) -> Vec<prometheus_parse::Sample> {
    let (code, body) = m.get("/metrics").await;
    assert_eq!(code, 200);
    let parsed =
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("parse");
    // The parser skips what it cannot read: every sample line must have become a sample
    // (the bucket lines of one histogram series, one sample).
    let lines: Vec<&str> = body
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    let plain = lines.iter().filter(|l| !l.contains("_bucket{")).count();
    let histogram_series: std::collections::BTreeSet<String> = lines
        .iter()
        .filter(|l| l.contains("_bucket{"))
        .map(|l| {
            let head = l.rsplit_once(' ').unwrap().0;
            // The series without its `le` label (always the last one we write).
            head.split(",le=")
                .next()
                .unwrap()
                .split("{le=")
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        parsed.samples.len(),
        plain + histogram_series.len(),
        "unparsed lines in:\n{body}"
    );
    let histograms: Vec<&String> = parsed
        .samples
        .iter()
        .filter(|s| matches!(s.value, prometheus_parse::Value::Histogram(_)))
        .map(|s| &s.metric)
        .collect();
    for s in &parsed.samples {
        assert!(
            s.metric.starts_with("autonomic_") || s.metric.starts_with("process_"),
            "{}",
            s.metric
        );
        match s.value {
            prometheus_parse::Value::Counter(_) => assert!(s.metric.ends_with("_total")),
            prometheus_parse::Value::Gauge(_) => assert!(!s.metric.ends_with("_total")),
            prometheus_parse::Value::Histogram(ref buckets) => {
                assert!(
                    buckets.last().unwrap().less_than.is_infinite(),
                    "{}",
                    s.metric
                );
            }
            // A histogram's _sum and _count.
            prometheus_parse::Value::Untyped(_) => {
                let base = s
                    .metric
                    .strip_suffix("_sum")
                    .or_else(|| s.metric.strip_suffix("_count"))
                    .unwrap_or_else(|| panic!("{} is untyped", s.metric));
                assert!(histograms.iter().any(|h| *h == base), "{}", s.metric);
                assert!(parsed.docs.contains_key(base), "no HELP for {base}");
                continue;
            }
            ref other => panic!(
                "{} is neither counter, gauge nor histogram: {other:?}",
                s.metric
            ),
        }
        assert!(
            parsed.docs.contains_key(&s.metric),
            "no HELP for {}",
            s.metric
        );
    }
    parsed.samples
}

fn value(samples: &[prometheus_parse::Sample], name: &str, kind: Option<&str>) -> f64 {
    labelled(samples, name, kind.map(|k| ("kind", k)))
}

/// The value of the sample `name` with this label, if given (a histogram's `_sum` and
/// `_count` too).
fn labelled(samples: &[prometheus_parse::Sample], name: &str, label: Option<(&str, &str)>) -> f64 {
    samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
        .unwrap_or_else(|| panic!("no {name} ({label:?})"))
}

#[tokio::test]
async fn metrics_parse_and_move_and_readiness_follows_the_link() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "cp-metrics").await;
    let cp = FakeCp::start().await;
    cp.set_welcome(1, 300);
    let mut env = managed_env(&cp);
    env.push(("AUTONOMIC_WELCOME_TIMEOUT_S", "2".into()));
    let m = start(&ns.name, &env);
    cp.wait_frame("snapshot", is("snapshot")).await;
    m.wait_ready().await;

    let before = scrape(&m).await;
    for kind in ["Agent", "Tool", "Runtime", "Memory"] {
        value(&before, "autonomic_reconciles_total", Some(kind));
        value(&before, "autonomic_reconcile_errors_total", Some(kind));
    }
    for family in [
        "autonomic_queue_depth",
        "autonomic_reconnects_total",
        "autonomic_shell_sessions_open",
        "autonomic_heartbeat_rtt_seconds",
        "autonomic_audit_queued",
        "autonomic_audit_queued_bytes",
        "autonomic_audit_dropped_total",
    ] {
        value(&before, family, None);
    }
    assert_eq!(value(&before, "autonomic_connected", None), 1.0);
    assert_eq!(value(&before, "autonomic_leader", None), 1.0);
    assert_eq!(value(&before, "autonomic_managed", None), 1.0);

    // The build, with its version, revision and target.
    assert_eq!(value(&before, "autonomic_build_info", None), 1.0);
    let build = before
        .iter()
        .find(|s| s.metric == "autonomic_build_info")
        .unwrap();
    assert_eq!(
        build.labels.get("version"),
        Some(autonomic_manager::VERSION)
    );
    for label in ["revision", "target"] {
        assert!(
            build.labels.get(label).is_some_and(|v| !v.is_empty()),
            "{label}: {build:?}"
        );
    }
    // The process, as Prometheus' client libraries name it.
    assert!(value(&before, "process_resident_memory_bytes", None) > 1e6);
    assert!(value(&before, "process_cpu_seconds_total", None) >= 0.0);
    let fds = value(&before, "process_open_fds", None);
    assert!(
        fds > 3.0 && fds <= value(&before, "process_max_fds", None),
        "{fds}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value(&before, "process_start_time_seconds", None);
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "{started} vs {now}"
    );
    // Every reason is a series from the start (the labels are pinned by a unit test in
    // connect::link::figures).
    use autonomic_manager::internals::{DialFailure, Disconnect};
    for reason in Disconnect::ALL.iter().map(|d| d.as_str()) {
        labelled(
            &before,
            "autonomic_disconnects_total",
            Some(("reason", reason)),
        );
    }
    for reason in DialFailure::ALL.iter().map(|d| d.as_str()) {
        labelled(
            &before,
            "autonomic_dial_failures_total",
            Some(("reason", reason)),
        );
    }
    // The first snapshot: its size and the time it took.
    assert!(value(&before, "autonomic_snapshot_bytes_count", None) >= 1.0);
    assert!(value(&before, "autonomic_snapshot_bytes_sum", None) > 0.0);
    assert!(value(&before, "autonomic_snapshot_duration_seconds_count", None) >= 1.0);
    let disconnects = |samples: &[prometheus_parse::Sample]| -> f64 {
        samples
            .iter()
            .filter(|s| s.metric == "autonomic_disconnects_total")
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) => v,
                _ => f64::NAN,
            })
            .sum()
    };

    // A new object: a reconcile, a delta, bytes on the wire.
    create_yaml::<Runtime>(
        &ns.api(),
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: r}\nspec: {image: i}",
    )
    .await;
    cp.wait_frame("a delta", is("delta")).await;
    let grew = |name: &'static str, kind: Option<&'static str>| {
        let old = value(&before, name, kind);
        let m = &m;
        move || async move { value(&scrape(m).await, name, kind) > old }
    };
    wait_until(
        "reconciles grow",
        grew("autonomic_reconciles_total", Some("Runtime")),
    )
    .await;
    wait_until("deltas grow", grew("autonomic_deltas_sent_total", None)).await;
    wait_until("bytes grow", grew("autonomic_bytes_sent_total", None)).await;
    // The reconcile was timed, and the change's way from watch event to delta frame.
    wait_until(
        "a timed reconcile",
        grew(
            "autonomic_reconcile_duration_seconds_count",
            Some("Runtime"),
        ),
    )
    .await;
    wait_until(
        "a delta latency observed",
        grew("autonomic_delta_latency_seconds_count", None),
    )
    .await;
    let after = scrape(&m).await;
    let latency = value(&after, "autonomic_delta_latency_seconds_sum", None)
        / value(&after, "autonomic_delta_latency_seconds_count", None);
    assert!(
        latency > 0.0 && latency < 5.0,
        "mean delta latency {latency} s"
    );
    let reconcile = value(
        &after,
        "autonomic_reconcile_duration_seconds_sum",
        Some("Runtime"),
    );
    assert!(reconcile > 0.0 && reconcile < 60.0, "{reconcile}");

    // The control plane goes silent: no heartbeat answers, and no welcome on redial.
    cp.set_mode(Mode::Silent);
    cp.set_auto_heartbeat(false);
    wait_until("not ready while the control plane is silent", || async {
        m.get("/readyz").await.0 == 503
    })
    .await;
    assert_eq!(value(&scrape(&m).await, "autonomic_connected", None), 0.0);
    wait_until("a redial", grew("autonomic_reconnects_total", None)).await;
    // The session's end was counted under its reason.
    assert!(disconnects(&scrape(&m).await) > disconnects(&before));

    // It comes back: ready again, connected again.
    cp.set_mode(Mode::Accept);
    cp.set_auto_heartbeat(true);
    m.wait_ready().await;
    assert_eq!(value(&scrape(&m).await, "autonomic_connected", None), 1.0);
}
