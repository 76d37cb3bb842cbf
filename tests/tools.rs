//! Tools as on-demand pods (RESOURCES.md, Tool) against the real API server and node:
//! the pod runs while an Agent that lists the Tool wants to run, and goes `idleSeconds`
//! after the last one stops; the Service stays throughout.

mod support;

use std::time::{Duration, SystemTime};

use autonomic_manager::crd::{Agent, Tool, ToolPhase, ToolStatus};
use autonomic_manager::internals::IDLE;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::*;

/// A tool that listens on 8080 (busybox nc), so its TCP readiness probe passes; `& wait`
/// lets the TERM trap run at once instead of after the 30 s grace period.
const SERVER: &str =
    r#"[sh, -c, "trap 'exit 0' TERM; while :; do nc -l -p 8080 -e echo ok & wait $!; done"]"#;
/// An agent runtime that stays up and stops at once on SIGTERM.
const SLEEPER: &str = r#"[sh, -c, "trap 'exit 0' TERM; while :; do sleep 1; done"]"#;

async fn tool(ns: &TestNamespace, name: &str, extra_spec: &str) {
    let t: Tool = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: {name}}}\nspec: {{image: '{BUSYBOX_IMAGE}', command: {SERVER}, port: 8080{extra_spec}}}"
    ));
    ns.api::<Tool>()
        .create(&PostParams::default(), &t)
        .await
        .expect("create Tool");
}

async fn agent(ns: &TestNamespace, name: &str, extra_spec: &str) {
    let a: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: {SLEEPER}}}{extra_spec}}}"
    ));
    ns.api::<Agent>()
        .create(&PostParams::default(), &a)
        .await
        .expect("create Agent");
}

fn status(t: &Tool) -> ToolStatus {
    t.status.clone().unwrap_or_default()
}

fn idle_since(t: &Tool) -> Option<SystemTime> {
    let since = status(t).idle_since?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(since.0.as_second()).ok()?))
}

/// Waits until the Tool's status satisfies `pred`; returns the Tool.
async fn tool_until(
    ns: &TestNamespace,
    name: &str,
    what: &str,
    pred: impl Fn(&ToolStatus) -> bool,
) -> Tool {
    wait_for(&ns.api::<Tool>(), name, what, |t| pred(&status(t))).await
}

/// The uid of the Tool's pod while it is not being deleted.
async fn live_pod(ns: &TestNamespace, tool: &str) -> Option<String> {
    let pod = ns
        .api::<Pod>()
        .get_opt(&format!("{tool}-tool"))
        .await
        .unwrap()?;
    pod.metadata
        .deletion_timestamp
        .is_none()
        .then(|| pod.uid().unwrap())
}

/// Asserts, polling, that the Tool's pod stays the same live pod until `until`.
async fn holds_until(ns: &TestNamespace, tool: &str, uid: &str, until: SystemTime, why: &str) {
    assert!(
        SystemTime::now() < until,
        "{why}: the hold ends before it began (a slow machine?)"
    );
    while SystemTime::now() < until {
        assert_eq!(live_pod(ns, tool).await.as_deref(), Some(uid), "{why}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the Tool's pod is deleted or being deleted; returns when that was seen.
async fn wait_removed(ns: &TestNamespace, tool: &str) -> SystemTime {
    wait_until(&format!("{tool}-tool to be removed"), || async {
        live_pod(ns, tool).await.is_none()
    })
    .await;
    SystemTime::now()
}

async fn pause(ns: &TestNamespace, agent: &str, paused: bool) {
    merge(
        &ns.api::<Agent>(),
        agent,
        json!({"spec": {"paused": paused}}),
    )
    .await;
}

#[tokio::test]
async fn without_users_a_tool_has_its_service_and_no_pod_and_always_on_and_disabled_win() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "tl-idle").await;
    let _m = Manager::start(&ns.name, &[]);
    tool(&ns, "lonely", "").await;
    tool(&ns, "always", ", alwaysOn: true").await;
    tool(&ns, "off", ", disabled: true").await;
    // An Agent in Error (a Memory it names is missing) still wants to run: it demands.
    agent(&ns, "broken", ", tools: [off], memory: [missing]").await;
    // A finished Agent does not.
    tool(&ns, "job", ", idleSeconds: 0").await;
    let done: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: done}}\nspec: {{restartPolicy: Never, tools: [job], agentlet: {{image: '{BUSYBOX_IMAGE}'}}, runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'exit 0']}}}}"
    ));
    ns.api::<Agent>()
        .create(&PostParams::default(), &done)
        .await
        .unwrap();

    let t = tool_until(&ns, "lonely", "idle", |s| {
        s.phase == Some(ToolPhase::Pending) && s.message.as_deref() == Some(IDLE)
    })
    .await;
    let st = status(&t);
    assert_eq!(
        (st.users, st.idle_since, st.pod_name),
        (Some(0), None, None)
    );
    assert_eq!(
        st.endpoint,
        Some(format!("http://lonely.{}.svc:8080", ns.name))
    );
    let svc = ns.api::<Service>().get("lonely").await.unwrap();
    assert_eq!(svc.owner_references()[0].uid, t.uid().unwrap());

    let t = tool_until(&ns, "always", "Ready without users", |s| {
        s.phase == Some(ToolPhase::Ready)
    })
    .await;
    assert_eq!(status(&t).users, Some(0));
    assert!(live_pod(&ns, "always").await.is_some());

    let t = tool_until(&ns, "off", "Disabled with a user", |s| {
        s.phase == Some(ToolPhase::Disabled) && s.users == Some(1)
    })
    .await;
    assert_eq!(status(&t).message.as_deref(), Some("disabled"));
    assert_eq!(
        ns.api::<Agent>()
            .get("broken")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase,
        Some(autonomic_manager::crd::AgentPhase::Error)
    );

    wait_for(&ns.api::<Agent>(), "done", "Succeeded", |a| {
        a.status.as_ref().and_then(|s| s.phase)
            == Some(autonomic_manager::crd::AgentPhase::Succeeded)
    })
    .await;
    tool_until(&ns, "job", "idle once its only user finished", |s| {
        s.users == Some(0) && s.message.as_deref() == Some(IDLE)
    })
    .await;
    assert_eq!(live_pod(&ns, "job").await, None);

    // Still no pod for the unused and the disabled Tool, a while after their status said so.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["lonely", "off"] {
        let pod = ns
            .api::<Pod>()
            .get_opt(&format!("{name}-tool"))
            .await
            .unwrap();
        assert!(pod.is_none(), "{name} has a pod: {pod:?}");
    }

    // Enabled, the Error agent's demand brings its pod up.
    merge(
        &ns.api::<Tool>(),
        "off",
        json!({"spec": {"disabled": false}}),
    )
    .await;
    tool_until(&ns, "off", "Ready for the Error agent", |s| {
        s.phase == Some(ToolPhase::Ready) && s.users == Some(1)
    })
    .await;
    // `kubectl get tl` shows the users.
    let out = std::process::Command::new("kubectl")
        .args(["get", "tl", "-n", &ns.name])
        .output()
        .expect("run kubectl");
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..3], ["NAME", "PHASE", "USERS"], "{text}");
    let users = |name: &str| rows.iter().find(|r| r[0] == name).map(|r| r[2]);
    assert_eq!(
        (users("lonely"), users("always"), users("off")),
        (Some("0"), Some("0"), Some("1")),
        "{text}"
    );
}

#[tokio::test]
async fn a_user_brings_the_pod_up_and_the_grace_removes_it_unless_the_user_returns() {
    require_node();
    const GRACE: u64 = 8;
    let client = client().await;
    let ns = TestNamespace::new(&client, "tl-grace").await;
    let _m = Manager::start(&ns.name, &[]);
    tool(&ns, "search", &format!(", idleSeconds: {GRACE}")).await;
    tool_until(&ns, "search", "idle", |s| {
        s.message.as_deref() == Some(IDLE)
    })
    .await;
    let svc_uid = ns.api::<Service>().get("search").await.unwrap().uid();
    agent(&ns, "a", ", tools: [search]").await;
    let t = tool_until(&ns, "search", "Ready with one user", |s| {
        s.phase == Some(ToolPhase::Ready) && s.users == Some(1)
    })
    .await;
    assert_eq!(status(&t).pod_name.as_deref(), Some("search-tool"));
    let uid = live_pod(&ns, "search").await.expect("the pod");

    // Paused: the grace starts; the pod stays and serves.
    pause(&ns, "a", true).await;
    let t = tool_until(&ns, "search", "in its grace", |s| s.idle_since.is_some()).await;
    let t0 = idle_since(&t).unwrap();
    let st = status(&t);
    assert_eq!(st.users, Some(0));
    assert!(st.message.as_deref().unwrap().starts_with(IDLE), "{st:?}");
    // Resumed within the grace: the same pod, the grace is over.
    pause(&ns, "a", false).await;
    tool_until(&ns, "search", "in use again", |s| {
        s.users == Some(1) && s.idle_since.is_none()
    })
    .await;
    holds_until(
        &ns,
        "search",
        &uid,
        t0 + Duration::from_secs(GRACE + 2),
        "a user that returned within the grace keeps the same pod",
    )
    .await;
    assert_eq!(
        status(&ns.api::<Tool>().get("search").await.unwrap()).phase,
        Some(ToolPhase::Ready)
    );

    // Paused again and not back: the pod goes once the grace is over, not before.
    pause(&ns, "a", true).await;
    let t = tool_until(&ns, "search", "in its grace again", |s| {
        s.idle_since.is_some()
    })
    .await;
    let t1 = idle_since(&t).unwrap();
    let deadline = t1 + Duration::from_secs(GRACE);
    holds_until(
        &ns,
        "search",
        &uid,
        deadline - Duration::from_secs(1),
        "the pod stays for the grace",
    )
    .await;
    assert_eq!(
        ns.api::<Tool>()
            .get("search")
            .await
            .unwrap()
            .resource_version(),
        t.resource_version(),
        "idleSince is written once: nothing is rewritten during the grace"
    );
    let seen = wait_removed(&ns, "search").await;
    eprintln!(
        "removed {:?} after the grace ended",
        seen.duration_since(deadline).unwrap_or_default()
    );
    let t = tool_until(&ns, "search", "idle after the grace", |s| {
        s.message.as_deref() == Some(IDLE)
    })
    .await;
    let st = status(&t);
    assert_eq!(
        (st.phase, st.users, st.idle_since, st.pod_name),
        (Some(ToolPhase::Pending), Some(0), None, None)
    );
    assert_eq!(
        st.endpoint,
        Some(format!("http://search.{}.svc:8080", ns.name))
    );
    assert_eq!(
        ns.api::<Service>().get("search").await.unwrap().uid(),
        svc_uid,
        "the Service stays throughout"
    );
}

#[tokio::test]
async fn agents_sharing_a_tool_keep_one_pod_until_the_last_leaves() {
    require_node();
    const GRACE: u64 = 5;
    let client = client().await;
    let ns = TestNamespace::new(&client, "tl-shared").await;
    let _m = Manager::start(&ns.name, &[]);
    tool(&ns, "shared", &format!(", idleSeconds: {GRACE}")).await;
    agent(&ns, "a", ", tools: [shared]").await;
    agent(&ns, "b", ", tools: [shared]").await;
    tool_until(&ns, "shared", "Ready with two users", |s| {
        s.phase == Some(ToolPhase::Ready) && s.users == Some(2)
    })
    .await;
    let uid = live_pod(&ns, "shared").await.expect("the pod");
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels("autonomic.sh/tool=shared"))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 1, "one pod for both users");

    // a drops the Tool from its list: one user left, no grace.
    merge(&ns.api::<Agent>(), "a", json!({"spec": {"tools": []}})).await;
    tool_until(&ns, "shared", "one user", |s| s.users == Some(1)).await;
    holds_until(
        &ns,
        "shared",
        &uid,
        SystemTime::now() + Duration::from_secs(GRACE + 2),
        "one user left keeps the pod",
    )
    .await;
    let t = ns.api::<Tool>().get("shared").await.unwrap();
    assert_eq!((status(&t).users, status(&t).idle_since), (Some(1), None));

    // b is deleted: the last user is gone; the grace, then the pod goes.
    ns.api::<Agent>()
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    let t = tool_until(&ns, "shared", "no users, in its grace", |s| {
        s.users == Some(0) && s.idle_since.is_some()
    })
    .await;
    let deadline = idle_since(&t).unwrap() + Duration::from_secs(GRACE);
    holds_until(
        &ns,
        "shared",
        &uid,
        deadline - Duration::from_secs(1),
        "the pod stays for the grace",
    )
    .await;
    wait_removed(&ns, "shared").await;
    tool_until(&ns, "shared", "idle", |s| {
        s.message.as_deref() == Some(IDLE)
    })
    .await;

    // a lists it again: a new pod.
    merge(
        &ns.api::<Agent>(),
        "a",
        json!({"spec": {"tools": ["shared"]}}),
    )
    .await;
    tool_until(&ns, "shared", "Ready again", |s| {
        s.phase == Some(ToolPhase::Ready) && s.users == Some(1)
    })
    .await;
    assert_ne!(live_pod(&ns, "shared").await.as_deref(), Some(uid.as_str()));
}

#[tokio::test]
async fn a_manager_restart_in_the_grace_neither_removes_the_pod_early_nor_keeps_it() {
    require_node();
    const GRACE: u64 = 10;
    let client = client().await;
    let ns = TestNamespace::new(&client, "tl-restart").await;
    let mut m = Manager::start(&ns.name, &[]);
    tool(&ns, "search", &format!(", idleSeconds: {GRACE}")).await;
    agent(&ns, "a", ", tools: [search]").await;
    // In use with no grace at all: a fresh manager that decided before its Agent cache
    // was filled would see no users and remove this pod at once.
    tool(&ns, "busy", ", idleSeconds: 0").await;
    agent(&ns, "b", ", tools: [busy]").await;
    for name in ["search", "busy"] {
        tool_until(&ns, name, "Ready", |s| s.phase == Some(ToolPhase::Ready)).await;
    }
    let uid = live_pod(&ns, "search").await.expect("the pod");
    let busy = live_pod(&ns, "busy").await.expect("the pod");

    pause(&ns, "a", true).await;
    let t = tool_until(&ns, "search", "in its grace", |s| s.idle_since.is_some()).await;
    let recorded = status(&t).idle_since;
    let t0 = idle_since(&t).unwrap();
    let deadline = t0 + Duration::from_secs(GRACE);

    // The manager dies 4 s into the grace and a fresh one takes over.
    let restart_at = t0 + Duration::from_secs(4);
    tokio::time::sleep(
        restart_at
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    )
    .await;
    m.stop("KILL");
    let m2 = Manager::start_as(&ns.name, &format!("{}-2", ns.name), &[]);
    holds_until(
        &ns,
        "search",
        &uid,
        deadline - Duration::from_secs(1),
        "no early removal after a restart",
    )
    .await;
    assert!(
        m2.metric("autonomic_reconciles_total{kind=\"Tool\"}").await >= 1.0,
        "the new manager has looked at the Tool"
    );
    assert_eq!(
        live_pod(&ns, "busy").await,
        Some(busy),
        "a restart does not take an in-use Tool's pod down"
    );
    let now = ns.api::<Tool>().get("search").await.unwrap();
    assert_eq!(
        status(&now).idle_since,
        recorded,
        "the grace is not restarted"
    );
    assert_eq!(
        now.resource_version(),
        t.resource_version(),
        "the new manager rewrote nothing"
    );

    // Removed at the end of the recorded grace: well before a grace restarted by the new
    // manager (which would end 4 s later, at the earliest).
    let seen = wait_removed(&ns, "search").await;
    let late = seen.duration_since(deadline).unwrap_or_default();
    eprintln!("removed {late:?} after the grace ended");
    assert!(
        late < Duration::from_secs(4),
        "removed {late:?} after the recorded grace ended: was the grace restarted?"
    );
}
