//! Restarts in a row (issue 11): of the manager over 200 steady Agents and Tools, of its
//! leader (failovers between two replicas), and of the control plane with shells and
//! controls in flight. What must hold each time: nothing that was steady changes (no
//! phase, no status write, no pod recreated, no Event), the control plane's snapshot
//! equals the cluster, and no audit event is lost. The measured times are printed
//! (`--no-capture`).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

use autonomic_manager::crd::{Agent, Runtime, Tool};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use serde_json::json;
use support::cluster_state;
use support::fake_cp::{FakeCp, Received};
use support::faults::{Fault, FaultProxy};
use support::own_bed::{kubeconfig_on, server_of};
use support::*;

const SERVE: &str =
    r#"[sh, -c, "trap 'exit 0' TERM; while :; do nc -l -p 8080 -e echo ok & wait $!; done"]"#;

/// The mix of the 200 objects: (what, how many, its steady phase). Most are steady
/// without a pod, so the shared 2-core bed runs 12 pods (10 Agents of two containers,
/// 2 Tools), not 200.
const ACTIVE_AGENTS: usize = 10;
const PAUSED_AGENTS: usize = 100;
const ERROR_AGENTS: usize = 22;
const USED_TOOLS: usize = 2;
const IDLE_TOOLS: usize = 40;
const DISABLED_TOOLS: usize = 26;
const AGENTS: usize = ACTIVE_AGENTS + PAUSED_AGENTS + ERROR_AGENTS;
const TOOLS: usize = USED_TOOLS + IDLE_TOOLS + DISABLED_TOOLS;

/// Creates the 200 objects: Active Agents (a Runtime by reference, a Tool each) and the
/// Tools they use, paused Agents, Agents in `Error` (a Runtime that does not exist: the
/// case that flapped on restarts before), idle Tools and disabled Tools.
async fn populate(ns: &TestNamespace) {
    create_yaml(
        &ns.api::<Runtime>(),
        &format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: rt}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}"
        ),
    )
    .await;
    let tool = |name: String, extra: &str| {
        format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: {name}}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {SERVE}, port: 8080{extra}}}"
        )
    };
    for i in 0..USED_TOOLS {
        create_yaml(&ns.api::<Tool>(), &tool(format!("used-{i}"), "")).await;
    }
    for i in 0..IDLE_TOOLS {
        create_yaml(&ns.api::<Tool>(), &tool(format!("idle-{i}"), "")).await;
    }
    for i in 0..DISABLED_TOOLS {
        create_yaml(
            &ns.api::<Tool>(),
            &tool(format!("off-{i}"), ", disabled: true"),
        )
        .await;
    }
    let agent = |name: String, spec: String| {
        format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {spec}"
        )
    };
    for i in 0..ACTIVE_AGENTS {
        let spec = format!("{{runtime: {{ref: rt}}, tools: [used-{}]}}", i % USED_TOOLS);
        create_yaml(&ns.api::<Agent>(), &agent(format!("active-{i}"), spec)).await;
    }
    for i in 0..PAUSED_AGENTS {
        let spec = "{runtime: {ref: rt}, tools: [idle-0], paused: true}".to_owned();
        create_yaml(&ns.api::<Agent>(), &agent(format!("paused-{i}"), spec)).await;
    }
    for i in 0..ERROR_AGENTS {
        let spec = "{runtime: {ref: no-such-runtime}}".to_owned();
        create_yaml(&ns.api::<Agent>(), &agent(format!("broken-{i}"), spec)).await;
    }
}

/// How many Agents and Tools are in each phase.
async fn phases(ns: &TestNamespace) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for a in ns.api::<Agent>().list(&Default::default()).await.unwrap() {
        let p = serde_json::to_value(a.status.and_then(|s| s.phase)).unwrap();
        *out.entry(format!("Agent {p}")).or_default() += 1;
    }
    for t in ns.api::<Tool>().list(&Default::default()).await.unwrap() {
        let p = serde_json::to_value(t.status.and_then(|s| s.phase)).unwrap();
        *out.entry(format!("Tool {p}")).or_default() += 1;
    }
    out
}

fn steady_phases() -> BTreeMap<String, usize> {
    [
        ("Agent \"Active\"", ACTIVE_AGENTS),
        ("Agent \"Paused\"", PAUSED_AGENTS),
        ("Agent \"Error\"", ERROR_AGENTS),
        ("Tool \"Ready\"", USED_TOOLS),
        ("Tool \"Pending\"", IDLE_TOOLS),
        ("Tool \"Disabled\"", DISABLED_TOOLS),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// What "steady" is: every custom resource's uid and resourceVersion (a status write
/// moves it), every pod's uid (a recreated pod has a new one), and the manager's Events.
#[derive(PartialEq, Debug)]
struct Steady {
    objects: BTreeMap<String, String>,
    events: Vec<String>,
}

async fn steady(ns: &TestNamespace) -> Steady {
    let mut objects = BTreeMap::new();
    for a in ns.api::<Agent>().list(&Default::default()).await.unwrap() {
        let v = format!("{:?} {:?}", a.uid(), a.resource_version());
        objects.insert(format!("Agent/{}", a.name_any()), v);
    }
    for t in ns.api::<Tool>().list(&Default::default()).await.unwrap() {
        let v = format!("{:?} {:?}", t.uid(), t.resource_version());
        objects.insert(format!("Tool/{}", t.name_any()), v);
    }
    for r in ns.api::<Runtime>().list(&Default::default()).await.unwrap() {
        let v = format!("{:?} {:?}", r.uid(), r.resource_version());
        objects.insert(format!("Runtime/{}", r.name_any()), v);
    }
    for p in ns.api::<Pod>().list(&Default::default()).await.unwrap() {
        objects.insert(format!("Pod/{}", p.name_any()), format!("{:?}", p.uid()));
    }
    let events = ns
        .api::<Event>()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("autonomic-manager"))
        .map(|e| format!("{:?} {:?} {:?}", e.metadata.name, e.reason, e.note))
        .collect();
    Steady { objects, events }
}

fn compare(after: &Steady, before: &Steady, what: &str) {
    if after == before {
        return;
    }
    let mut out = String::new();
    for (k, v) in &before.objects {
        match after.objects.get(k) {
            Some(a) if a == v => {}
            a => out += &format!("{k}: {v} → {a:?}\n"),
        }
    }
    for (k, v) in &after.objects {
        if !before.objects.contains_key(k) {
            out += &format!("{k}: new {v}\n");
        }
    }
    for e in &after.events {
        if !before.events.contains(e) {
            out += &format!("new Event {e}\n");
        }
    }
    panic!("{what} changed something steady:\n{out}");
}

/// Waits until manager `m` (leading) has reconciled every Agent and Tool at least once
/// and its queue is empty; the time it took.
async fn reconciled_all(m: &Manager) -> Duration {
    let start = Instant::now();
    wait_until("every Agent and Tool reconciled", || async {
        m.metric("autonomic_reconciles_total{kind=\"Agent\"}").await >= AGENTS as f64
            && m.metric("autonomic_reconciles_total{kind=\"Tool\"}").await >= TOOLS as f64
            && m.metric("autonomic_queue_depth").await == 0.0
    })
    .await;
    start.elapsed()
}

/// A manager with leader election in `ns`, as pod `pod`.
fn elected(ns: &str, pod: &str) -> Manager {
    Manager::start_as(
        ns,
        &format!("{ns}-{pod}"),
        &[
            ("AUTONOMIC_LEADER_ELECTION", "true"),
            ("POD_NAMESPACE", ns),
            ("POD_NAME", pod),
        ],
    )
}

/// Waits until the Lease's holder is pod `pod`; the time it took.
async fn leads(ns: &TestNamespace, pod: &str) -> Duration {
    let start = Instant::now();
    let leases = ns.api::<Lease>();
    wait_until(&format!("{pod} to hold the Lease"), || async {
        leases
            .get_opt("autonomic-manager")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .is_some_and(|h| h.rsplit_once('_').is_some_and(|(p, _)| p == pod))
    })
    .await;
    start.elapsed()
}

/// 20 manager restarts (SIGTERM and SIGKILL in turn, a fresh process each time) and then
/// 10 leader failovers between two replicas (SIGKILL and SIGTERM of the leader in turn;
/// a fresh standby joins after each) over 200 steady Agents and Tools: after each, every
/// object was reconciled by the new manager or leader, and no phase changed, no status
/// was written, no pod recreated, no Event emitted.
#[tokio::test]
async fn twenty_restarts_and_ten_failovers_change_nothing_in_200_steady_objects() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "rs-steady").await;
    let _report = ReportOnPanic(vec![ns.name.clone()]);
    let t = Instant::now();
    populate(&ns).await;
    let first = Manager::start_as(&ns.name, &format!("{}-first", ns.name), &[]);
    wait_until("the 200 objects steady", || async {
        phases(&ns).await == steady_phases()
    })
    .await;
    reconciled_all(&first).await;
    // The last status writes and their Events land before the baseline is taken.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(first);
    let before = steady(&ns).await;
    eprintln!(
        "200 objects steady after {:?}: {:?}",
        t.elapsed(),
        phases(&ns).await
    );
    assert!(
        !before.events.is_empty(),
        "no Event of the manager's was found: the Event check would be empty"
    );
    assert_eq!(
        before
            .objects
            .keys()
            .filter(|k| k.starts_with("Pod/"))
            .count(),
        ACTIVE_AGENTS + USED_TOOLS
    );

    for round in 1..=20 {
        let t = Instant::now();
        let mut m = Manager::start_as(&ns.name, &format!("{}-r{round}", ns.name), &[]);
        m.wait_ready().await;
        let took = reconciled_all(&m).await;
        // A write the reconciles put off (a retry, a requeue) would land in this second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let signal = if round % 2 == 1 { "TERM" } else { "KILL" };
        let code = m.stop(signal);
        if signal == "TERM" {
            assert_eq!(code, Some(0), "restart {round}: exit after SIGTERM");
        }
        compare(&steady(&ns).await, &before, &format!("restart {round}"));
        eprintln!(
            "restart {round}: all reconciled {took:?} after ready, round {:?} (stopped by SIG{signal})",
            t.elapsed()
        );
    }

    let mut leader = (elected(&ns.name, "replica-0"), "replica-0".to_owned());
    leads(&ns, "replica-0").await;
    let mut standby = (elected(&ns.name, "replica-1"), "replica-1".to_owned());
    standby.0.wait_ready().await;
    reconciled_all(&leader.0).await;
    compare(&steady(&ns).await, &before, "the first election");
    for failover in 1..=10 {
        let t = Instant::now();
        let signal = if failover % 2 == 1 { "KILL" } else { "TERM" };
        leader.0.stop(signal);
        let takeover = leads(&ns, &standby.1).await;
        let took = reconciled_all(&standby.0).await;
        let pod = format!("replica-{}", failover + 1);
        let fresh = (elected(&ns.name, &pod), pod);
        fresh.0.wait_ready().await;
        compare(&steady(&ns).await, &before, &format!("failover {failover}"));
        eprintln!(
            "failover {failover} (SIG{signal}): takeover {takeover:?}, all reconciled {took:?} after, round {:?}",
            t.elapsed()
        );
        leader = std::mem::replace(&mut standby, fresh);
    }
    // Nothing was recreated meanwhile by anything else either: the pods still run.
    assert_eq!(phases(&ns).await, steady_phases());
}

const TOKEN: &str = "tok_live_9b2d4f6a8c1e3a57";

/// A `control` whose actor names it, so its audit event can be found.
async fn control(cp: &FakeCp, id: &str, action: &str, kind: &str, ns: &str, name: &str) {
    cp.send(json!({
        "type": "control", "id": id, "action": action, "actor": format!("{id}@test"),
        "target": {"kind": kind, "namespace": ns, "name": name},
    }))
    .await;
}

/// How many audit events of `action` the control plane received for `who` (a control's
/// id, or a shell's session id), over every connection.
fn audited(cp: &FakeCp, action: &str, who: &str) -> usize {
    let actor = format!("{who}@test");
    cp.frames()
        .iter()
        .filter(|r| r.frame_type() == Some("audit"))
        .filter_map(Received::json)
        .filter(|j| {
            j["event"]["action"] == action
                && (j["event"]["actor"] == actor.as_str() || j["event"]["session_id"] == who)
        })
        .count()
}

/// 100 control-plane restarts in a row (the fake goes down with every socket and comes
/// back on the same port), each with a shell open and a `control` in flight: the
/// manager's path to the API server stalls (fault proxy) after the control is read, so
/// its API call is still running when the control plane goes; it is let through once
/// the new control plane listens. Another control, refused, is answered before. Each
/// time: the new connection's snapshot equals the cluster (every object but the one
/// the control in flight is changing, which the deltas then bring to the cluster's
/// state), and every audit event arrives exactly once: the shell's open and close, the
/// refused control, and the control in flight.
#[tokio::test]
async fn a_hundred_control_plane_restarts_with_shells_and_controls_in_flight() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "rs-cp").await;
    let n = ns.name.clone();
    create_yaml(
        &ns.api::<Runtime>(),
        &format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: rt}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}"
        ),
    )
    .await;
    create_yaml(
        &ns.api::<Tool>(),
        &format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: flip}}\nspec: {{image: '{BUSYBOX_IMAGE}', port: 8080}}"
        ),
    )
    .await;
    create_yaml(
        &ns.api::<Agent>(),
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {name: held}\nspec: {runtime: {ref: rt}}",
    )
    .await;
    let cp = FakeCp::start().await;
    let api = FaultProxy::start(&server_of(&managed_chart_identity(&n, &[&n])));
    let kubeconfig = kubeconfig_on(&managed_chart_identity(&n, &[&n]), api.port());
    let mut env = managed_vars(cp.url(), TOKEN);
    env.push(("KUBECONFIG", kubeconfig.display().to_string()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let m = Manager::start_as(&n, &n, &pairs);
    reported(&cp, &n, "held", "Active").await;
    let flip = format!("Tool/{n}/flip");
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    for round in 1..=100u32 {
        let t = Instant::now();
        let conn = cp.accepted();
        let session = format!("sess-{round}");
        open(
            &cp,
            round,
            target(&n, "held"),
            Some(&["sleep", "3600"]),
            true,
        )
        .await;
        cp.wait_frame("io_opened", frame_on("io_opened", round))
            .await;
        let refused = format!("refused-{round}");
        control(&cp, &refused, "pause", "Agent", &n, "nobody").await;
        cp.wait_frame("the refused control's result", |r| {
            r.frame_type() == Some("control_result")
                && r.json().is_some_and(|j| j["id"] == refused.as_str())
        })
        .await;
        // The control in flight: its API call is held by the stalled path.
        api.set(Fault::Stall);
        let flying = format!("flying-{round}");
        let action = if round % 2 == 1 { "pause" } else { "resume" };
        control(&cp, &flying, action, "Tool", &n, "flip").await;
        // The manager read the control: it answers a resync sent after it.
        let asked = Instant::now();
        cp.send(json!({"type": "resync"})).await;
        cp.wait_frame("the snapshot answering resync", |r| {
            r.conn == conn && r.at > asked && r.frame_type() == Some("snapshot")
        })
        .await;
        cp.stop().await;
        cp.restart().await;
        api.set(Fault::Pass);
        let snap = cp
            .wait_frame("a snapshot for the restarted control plane", |r| {
                r.conn > conn && r.frame_type() == Some("snapshot")
            })
            .await;
        let mut seen = cluster_state::of_snapshot(&snap);
        let mut cluster = cluster_state::of_cluster(&client, &[&n]).await;
        assert!(seen.remove(&flip).is_some() && cluster.remove(&flip).is_some());
        assert_eq!(
            seen,
            cluster,
            "round {round}: the snapshot differs from the cluster:\n{}",
            cluster_state::diff(&seen, &cluster)
        );
        wait_until("the control plane's view to equal the cluster", || async {
            let cluster = cluster_state::of_cluster(&client, &[&n]).await;
            cluster_state::model(&cp.frames(), snap.conn) == Some(cluster)
        })
        .await;
        wait_until("this round's audit events", || async {
            audited(&cp, "session.open", &session) == 1
                && audited(&cp, "session.close", &session) == 1
                && audited(&cp, "control.denied", &refused) == 1
                && audited(&cp, "control.done", &flying) == 1
        })
        .await;
        // It was in flight: done after its connection was gone, audited on the next.
        let done_on = cp
            .frames()
            .iter()
            .find(|r| {
                r.frame_type() == Some("audit")
                    && r.json()
                        .is_some_and(|j| j["event"]["actor"] == format!("{flying}@test"))
            })
            .map(|r| r.conn);
        assert!(
            done_on > Some(conn),
            "round {round}: the control was audited on connection {done_on:?}, not after the restart"
        );
        slowest = slowest.max(t.elapsed());
    }
    eprintln!(
        "100 control-plane restarts in {:?}, the slowest round {slowest:?}",
        start.elapsed()
    );
    // Exactly once each, with nothing dropped from the queue.
    for round in 1..=100 {
        let session = format!("sess-{round}");
        assert_eq!(audited(&cp, "session.open", &session), 1, "{session}");
        assert_eq!(audited(&cp, "session.close", &session), 1, "{session}");
        let refused = format!("refused-{round}");
        assert_eq!(audited(&cp, "control.denied", &refused), 1, "{refused}");
        let flying = format!("flying-{round}");
        assert_eq!(audited(&cp, "control.done", &flying), 1, "{flying}");
    }
    assert_eq!(m.metric("autonomic_audit_dropped_total").await, 0.0);
    assert!(cp.accepted() > 100);
    m.wait_ready().await;
}
