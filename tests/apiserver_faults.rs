//! The API-server side of the fault suite (issue 11), each on a bed of the test's own
//! (`support::own_bed`: etcd and kube-apiserver, no node), never the shared one:
//!
//! - kube-apiserver restarted mid-stream, its peer on the same etcd taking the changes
//!   meanwhile (an HA pair, the manager behind a load balancer that routes to a server
//!   once it is ready): the restarted server's watch cache starts at the current
//!   revision, so the manager's resumed watches get 410 Gone and relist;
//! - an etcd compaction with the watches cut (watch cache off, so the watches are
//!   etcd's own): the resumed watches get 410 Gone from etcd and relist.
//!
//! After each, with a managed manager (the chart's ServiceAccount) and the fake control
//! plane: the caches recover (what the control plane holds, snapshot plus deltas, and a
//! fresh snapshot equal the cluster: every object at its current resourceVersion, phase
//! and pods), no change made during the fault is missed, objects deleted during it are
//! reported removed, every `control` sent is audited once, and nothing crashed.

mod support;

use std::time::Duration;
use tokio::time::Instant;

use autonomic_manager::crd::{Agent, Memory, Runtime, Tool};
use kube::Client;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::cluster_state::{self, State};
use support::fake_cp::{FakeCp, Received};
use support::faults::{Fault, FaultProxy};
use support::own_bed::OwnBed;
use support::*;

const TOKEN: &str = "tok_live_4a7c2e9f1b3d5a60";
/// The log line of a watch the API server ended with 410 Gone (reason `Expired`).
const GONE: &str = "watch expired (410 Gone): relisting";

fn agent(name: &str) -> String {
    format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}'}}}}"
    )
}

fn runtime(name: &str, image: &str) -> String {
    format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: {name}}}\nspec: {{image: '{image}'}}"
    )
}

fn memory(name: &str) -> String {
    format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Memory\nmetadata: {{name: {name}}}\nspec: {{backend: redis, url: 'redis://r:6379'}}"
    )
}

/// The objects both tests start from: each kind, some to keep, some to change or delete
/// during the fault.
async fn populate(ns: &TestNamespace) {
    for a in ["a-keep", "a-gone", "a-pause", "a-ctl"] {
        create_yaml(&ns.api::<Agent>(), &agent(a)).await;
    }
    create_yaml(&ns.api::<Runtime>(), &runtime("r-keep", "img:1")).await;
    create_yaml(&ns.api::<Runtime>(), &runtime("r-edit", "img:1")).await;
    create_yaml(&ns.api::<Memory>(), &memory("m-keep")).await;
    create_yaml(&ns.api::<Memory>(), &memory("m-gone")).await;
    create_yaml(
        &ns.api::<Tool>(),
        &format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: t-keep}}\nspec: {{image: '{BUSYBOX_IMAGE}', port: 8080}}"
        ),
    )
    .await;
}

/// The changes made during a fault (through an API server the manager does not reach):
/// a creation of each of two kinds, two deletions, a spec edit, a pause.
async fn change_during_fault(ns: &TestNamespace) {
    create_yaml(&ns.api::<Agent>(), &agent("a-new")).await;
    create_yaml(&ns.api::<Runtime>(), &runtime("r-new", "img:2")).await;
    ns.api::<Agent>()
        .delete("a-gone", &DeleteParams::background())
        .await
        .expect("delete a-gone");
    ns.api::<Memory>()
        .delete("m-gone", &DeleteParams::background())
        .await
        .expect("delete m-gone");
    merge(
        &ns.api::<Runtime>(),
        "r-edit",
        json!({"spec": {"image": "img:3"}}),
    )
    .await;
    merge(
        &ns.api::<Agent>(),
        "a-pause",
        json!({"spec": {"paused": true}}),
    )
    .await;
}

/// A managed manager in `ns` reaching the API server through `kubeconfig`.
fn start_manager(ns: &str, cp: &FakeCp, kubeconfig: &std::path::Path) -> Manager {
    let mut env = managed_vars(cp.url(), TOKEN);
    env.push(("KUBECONFIG", kubeconfig.display().to_string()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Manager::start_as(ns, ns, &pairs)
}

/// Waits until what the control plane holds from connection `conn` (its snapshot and
/// the deltas after it) equals the cluster; the time it took.
async fn converged(cp: &FakeCp, conn: usize, client: &Client, ns: &str, what: &str) -> Duration {
    let start = Instant::now();
    let bound = Duration::from_secs(120);
    loop {
        let cluster = cluster_state::of_cluster(client, &[ns]).await;
        let held = cluster_state::model(&cp.frames(), conn).unwrap_or_default();
        if held == cluster {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "{what}: the control plane's view (connection {conn}) did not reach the cluster's within {bound:?}:\n{}",
            cluster_state::diff(&held, &cluster)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Asks for a snapshot (`resync`) on the live connection `conn` and checks it equals the
/// cluster as read right after it arrived. A status write landing between the two reads
/// would differ; the cluster is quiet by now, so a second try is allowed, no more.
async fn resync_equals_cluster(cp: &FakeCp, conn: usize, client: &Client, ns: &str) -> State {
    let mut last = String::new();
    for _ in 0..2 {
        let asked = Instant::now();
        cp.send(json!({"type": "resync"})).await;
        let snap = cp
            .wait_frame("the snapshot answering resync", |r| {
                r.conn == conn && r.at > asked && r.frame_type() == Some("snapshot")
            })
            .await;
        let cluster = cluster_state::of_cluster(client, &[ns]).await;
        let seen = cluster_state::of_snapshot(&snap);
        if seen == cluster {
            return seen;
        }
        last = cluster_state::diff(&seen, &cluster);
    }
    panic!("the snapshot after resync differs from the cluster:\n{last}");
}

/// Sends a `control` whose actor names it, so its audit event can be found.
async fn control(cp: &FakeCp, id: &str, action: &str, ns: &str, name: &str) {
    cp.send(json!({
        "type": "control", "id": id, "action": action, "actor": format!("{id}@test"),
        "target": {"kind": "Agent", "namespace": ns, "name": name},
    }))
    .await;
}

async fn control_result(cp: &FakeCp, id: &str) -> Value {
    let id = id.to_owned();
    let r = cp
        .wait_frame(&format!("control_result {id}"), |r| {
            r.frame_type() == Some("control_result")
                && r.json().is_some_and(|j| j["id"] == id.as_str())
        })
        .await;
    r.json().cloned().unwrap()
}

/// The audit events the control plane received for the control `id`.
fn audits_of(cp: &FakeCp, id: &str) -> Vec<Value> {
    let actor = format!("{id}@test");
    cp.frames()
        .iter()
        .filter(|r| r.frame_type() == Some("audit"))
        .filter_map(Received::json)
        .filter(|j| j["event"]["actor"] == actor.as_str())
        .cloned()
        .collect()
}

/// The removals the control plane was told of on connection `conn`, as `Kind/name`.
fn removed_on(cp: &FakeCp, conn: usize) -> Vec<String> {
    cp.frames()
        .iter()
        .filter(|r| r.conn == conn && r.frame_type() == Some("delta"))
        .filter_map(Received::json)
        .flat_map(|j| j["changes"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["op"] == "remove")
        .map(|c| {
            format!(
                "{}/{}",
                c["kind"].as_str().unwrap_or(""),
                c["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// What both tests check once the fault is over.
async fn check_recovered(cp: &FakeCp, m: &Manager, client: &Client, ns: &TestNamespace) {
    let took = converged(cp, 1, client, &ns.name, "after the fault").await;
    eprintln!("the control plane's view equals the cluster {took:?} after the fault");
    // The changes made during the fault are in the cluster, reconciled by this manager.
    // Its reconcilers start once every list is whole: a list the fault cut (a Secrets list
    // still in flight at the stall) is retried after a backoff of up to 0.8 s, so the
    // statuses may follow the control plane's view by a moment; 20 s at most.
    let n = &ns.name;
    let phase = |state: &cluster_state::State, k: &str| {
        state
            .get(k)
            .and_then(|e| e.split(" phase=").nth(1))
            .and_then(|p| p.split(' ').next())
            .unwrap_or("")
            .to_owned()
    };
    let want = [
        (format!("Agent/{n}/a-pause"), "Paused"),
        (format!("Agent/{n}/a-new"), "Pending"),
        (format!("Runtime/{n}/r-new"), "Ready"),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    let state = loop {
        let state = cluster_state::of_cluster(client, &[n]).await;
        if want.iter().all(|(k, p)| phase(&state, k) == *p) {
            break state;
        }
        assert!(
            Instant::now() < deadline,
            "not reconciled within 20 s of the view: want {want:?}\n{state:#?}\n{}",
            m.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for gone in ["Agent/a-gone", "Memory/m-gone"] {
        let (kind, name) = gone.split_once('/').unwrap();
        assert!(
            !state.contains_key(&format!("{kind}/{}/{name}", ns.name)),
            "{gone} still exists"
        );
        assert!(
            removed_on(cp, 1).contains(&gone.to_owned()),
            "{gone}, deleted during the fault, was not reported removed: {:?}",
            removed_on(cp, 1)
        );
    }
    let snap = resync_equals_cluster(cp, 1, client, n).await;
    let r_edit = cp
        .frames()
        .iter()
        .rev()
        .find(|r| r.frame_type() == Some("snapshot"))
        .and_then(|r| {
            r.resources()
                .into_iter()
                .find(|x| x["kind"] == "Runtime" && x["name"] == "r-edit")
                .cloned()
        })
        .expect("r-edit in the snapshot");
    assert_eq!(
        r_edit["spec"]["image"], "img:3",
        "the edit made during the fault"
    );
    eprintln!(
        "snapshot after resync equals the cluster: {} objects",
        snap.len()
    );
    assert_eq!(cp.accepted(), 1, "the control-plane link broke");
    assert_eq!(m.metric("autonomic_audit_dropped_total").await, 0.0);
    assert_eq!(m.get("/livez").await.0, 200);
    m.wait_ready().await;
}

/// Waits until the bed's own kube-apiserver (not its peer) authorizes the manager's
/// ServiceAccount to watch what it watches: its RBAC caches are filled.
async fn authorizes(bed: &OwnBed, ns: &str) {
    let kubeconfig = bed.kubeconfig_on(&bed.kubeconfig(), bed.port);
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    let user = format!("--as=system:serviceaccount:{ns}:autonomic-manager");
    wait_until(
        "the restarted API server to authorize the manager",
        || async {
            [
                "pods",
                "secrets",
                "serviceaccounts",
                "services",
                "agents.autonomic.sh",
                "tools.autonomic.sh",
            ]
            .iter()
            .all(|what| {
                let (ok, out) = kubectl(
                    &[&kubeconfig, "auth", "can-i", "watch", what, "-n", ns, &user],
                    None,
                );
                ok && out.trim() == "yes"
            }) && {
                // The namespace itself, by name, for its labels (kubectl warns on stderr
                // that namespaces are not namespaced).
                let named = format!("namespaces/{ns}");
                let (ok, out) = kubectl(
                    &[&kubeconfig, "auth", "can-i", "watch", &named, &user],
                    None,
                );
                ok && out.lines().any(|l| l.trim() == "yes")
            }
        },
    )
    .await;
}

/// (g) kube-apiserver restarted mid-stream: the manager's API server goes down while its
/// peer (same etcd) takes changes, deletions and a `control`'s neighbours; back up, its
/// watch cache starts at the current revision, the manager's watches resume with 410
/// Gone, relist, and nothing is missed.
#[tokio::test]
async fn kube_apiserver_restarted_mid_stream_misses_nothing() {
    let bed = OwnBed::up("");
    let peer = bed.start_second_apiserver();
    // The test's own requests go to the peer, which stays up throughout.
    bed.make_default(&bed.kubeconfig_on(&bed.kubeconfig(), peer));
    let client = client().await;
    let ns = TestNamespace::new(&client, "ap-restart").await;
    populate(&ns).await;
    let cp = FakeCp::start().await;
    // The manager reaches its API server as through an HA pair's load balancer, which
    // routes to a server only once it is ready (a proxy here): a kube-apiserver 1.20
    // listens before its RBAC caches are filled, and for a moment refuses the manager
    // (403); that the manager only retries then is no fault of its, but the tests fail
    // on any refusal it logs.
    let lb = FaultProxy::start(&format!("127.0.0.1:{}", bed.port));
    let identity = managed_chart_identity(&ns.name, &[&ns.name]);
    let m = start_manager(&ns.name, &cp, &bed.kubeconfig_on(&identity, lb.port()));
    cp.wait_frame("snapshot", |r| r.frame_type() == Some("snapshot"))
        .await;
    converged(&cp, 1, &client, &ns.name, "before the fault").await;

    bed.stop_apiserver();
    lb.set(Fault::Reset);
    let down = Instant::now();
    change_during_fault(&ns).await;
    // A control while the manager's API server is down: refused, audited once.
    control(&cp, "ctl-down", "pause", &ns.name, "a-ctl").await;
    let result = control_result(&cp, "ctl-down").await;
    assert_eq!(result["ok"], false, "{result}");
    // The watches retry against a closed port meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    bed.start_apiserver();
    authorizes(&bed, &ns.name).await;
    lb.set(Fault::Pass);
    eprintln!("kube-apiserver down for {:?}", down.elapsed());

    check_recovered(&cp, &m, &client, &ns).await;
    let gone = m
        .logs()
        .lines()
        .filter(|l| l.contains(GONE) && l.contains("Expired"))
        .count();
    assert!(
        gone >= 1,
        "no watch resumed with 410 Gone after the restart: the test did not test a relist:\n{}",
        m.logs()
    );
    eprintln!("{gone} watches resumed with 410 Gone and relisted");
    // A control after: done, audited once; the one during the outage audited once too.
    control(&cp, "ctl-after", "pause", &ns.name, "a-ctl").await;
    assert_eq!(control_result(&cp, "ctl-after").await["ok"], true);
    wait_until("the controls' audit events", || async {
        audits_of(&cp, "ctl-down").len() == 1 && audits_of(&cp, "ctl-after").len() == 1
    })
    .await;
    assert_eq!(
        audits_of(&cp, "ctl-down")[0]["event"]["action"],
        "control.denied"
    );
    assert_eq!(
        audits_of(&cp, "ctl-after")[0]["event"]["action"],
        "control.done"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(audits_of(&cp, "ctl-down").len(), 1, "audited twice");
    assert_eq!(audits_of(&cp, "ctl-after").len(), 1, "audited twice");
}

/// (h) An etcd compaction with the watches cut: the API server runs without its watch
/// cache (`--watch-cache=false`: every watch is etcd's own, as with a cache disabled for
/// a resource), the manager reaches it through the fault proxy. The path stalls, changes
/// and deletions are made, a `control` is sent (in flight on the stalled path), etcd is
/// compacted at the current revision, then every connection is reset: the watches
/// resume from compacted revisions, get 410 Gone from etcd, relist, and nothing is
/// missed.
#[tokio::test]
async fn an_etcd_compaction_makes_the_watches_relist_and_nothing_is_missed() {
    let bed = OwnBed::up("--watch-cache=false");
    bed.make_default(&bed.kubeconfig());
    let client = client().await;
    let ns = TestNamespace::new(&client, "ap-compact").await;
    populate(&ns).await;
    let cp = FakeCp::start().await;
    let proxy = FaultProxy::start(&format!("127.0.0.1:{}", bed.port));
    let identity = managed_chart_identity(&ns.name, &[&ns.name]);
    let m = start_manager(&ns.name, &cp, &bed.kubeconfig_on(&identity, proxy.port()));
    cp.wait_frame("snapshot", |r| r.frame_type() == Some("snapshot"))
        .await;
    converged(&cp, 1, &client, &ns.name, "before the fault").await;

    proxy.set(Fault::Stall);
    change_during_fault(&ns).await;
    control(&cp, "ctl-stalled", "pause", &ns.name, "a-ctl").await;
    let revision = bed.compact();
    eprintln!("etcd compacted at revision {revision}");
    proxy.set(Fault::Reset);
    proxy.set(Fault::Pass);
    wait_until("the proxy to reset the manager's connections", || async {
        proxy.resets() >= 1
    })
    .await;

    check_recovered(&cp, &m, &client, &ns).await;
    let gone = m
        .logs()
        .lines()
        .filter(|l| l.contains(GONE) && l.contains("Expired"))
        .count();
    assert!(
        gone >= 1,
        "no watch resumed with 410 Gone after the compaction: the test did not test a relist:\n{}",
        m.logs()
    );
    eprintln!("{gone} watches resumed with 410 Gone and relisted");
    // The control in flight when the path was cut: answered, audited exactly once,
    // whether it was applied or not.
    let result = control_result(&cp, "ctl-stalled").await;
    wait_until("the control's audit event", || async {
        audits_of(&cp, "ctl-stalled").len() == 1
    })
    .await;
    let expect = if result["ok"] == true {
        "control.done"
    } else {
        "control.denied"
    };
    assert_eq!(audits_of(&cp, "ctl-stalled")[0]["event"]["action"], expect);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(audits_of(&cp, "ctl-stalled").len(), 1, "audited twice");
}
