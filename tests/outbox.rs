//! The audit outbox (issue 27) on the test bed: audit events that could not be sent at
//! once outlive the manager that recorded them. Each manager runs in its own process as
//! the chart's ServiceAccount (whose Role grants the outbox ConfigMap alone) against the
//! fake control plane; the outbox is read as admin to show what it holds. Measured
//! figures are printed (`--no-capture`).
//!
//! Events that "cannot be sent at once" are made two ways: a shell ended by a dropped
//! link (recorded with no connection), and requests the control plane sends before its
//! `welcome` (fake mode `NoWelcome`: served and audited, but the session never gets past
//! a snapshot, so nothing is sent).

mod support;

use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

use autonomic_manager::crd::{Agent, AgentPhase};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::fake_cp::{FakeCp, Mode, Received};
use support::*;

const TOKEN: &str = "tok_live_3c8a1f5e7b2d9046";
const OUTBOX: &str = "autonomic-audit-outbox";
const KEY: &str = "events.jsonl";
/// The outbox's bounds (src/connect/outbox.rs).
const MAX_EVENTS: usize = 1000;
const MAX_BYTES: usize = 512 * 1024;

/// A managed manager `pod` living in `ns`, dialling `cp`, with `extra` settings.
fn start(ns: &str, pod: &str, cp: &FakeCp, extra: &[(&'static str, &str)]) -> Manager {
    let mut env = managed_vars(cp.url(), TOKEN);
    env.push(("POD_NAME", pod.into()));
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Manager::start_as(ns, &format!("{ns}-{pod}"), &pairs)
}

/// The outbox's text, read as admin (`None`: there is none).
async fn outbox_text(ns: &TestNamespace) -> Option<String> {
    let cm = ns.api::<ConfigMap>().get_opt(OUTBOX).await.unwrap()?;
    Some(cm.data.and_then(|mut d| d.remove(KEY)).unwrap_or_default())
}

/// The events of the outbox, each a JSON object.
async fn outbox_events(ns: &TestNamespace) -> Vec<Value> {
    outbox_text(ns)
        .await
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn audits(cp: &FakeCp) -> Vec<Received> {
    cp.frames()
        .into_iter()
        .filter(|f| f.frame_type() == Some("audit"))
        .collect()
}

fn event_id(r: &Received) -> String {
    r.json().unwrap()["event"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn count_logged(m: &Manager, needle: &str) -> usize {
    m.logs().lines().filter(|l| l.contains(needle)).count()
}

/// Waits (polling, real time) until the log holds `n` lines with `needle`.
async fn wait_logged(m: &Manager, needle: &str, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while count_logged(m, needle) < n {
        assert!(
            Instant::now() < deadline,
            "no {n} log lines with {needle:?} within {within:?}; the log:\n{}",
            m.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls (real time) until `check` holds; fails naming `what` after `within`.
async fn wait_within<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn is_on(t: &'static str, conn: usize) -> impl Fn(&Received) -> bool {
    move |r| r.conn == conn && r.frame_type() == Some(t)
}

async fn agent(ns: &TestNamespace, name: &str) {
    let a: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: {IDLE}}}}}"
    ));
    ns.api::<Agent>()
        .create(&PostParams::default(), &a)
        .await
        .expect("create agent");
}

/// The scenario: a shell open, the link down (the exec ends and its
/// `session.close` is recorded), the manager SIGKILLed 2 s later, a new manager
/// started: it delivers that `session.close` after its snapshot, once, and empties the
/// outbox.
#[tokio::test]
async fn a_session_close_recorded_while_down_survives_a_sigkill() {
    require_node();
    let client = client().await;
    let ns = TestNamespace::new(&client, "ob-kill").await;
    let _report = ReportOnPanic(vec![ns.name.clone()]);
    let cp = FakeCp::start().await;
    let mut first = start(&ns.name, "first", &cp, &[]);
    agent(&ns, "held").await;
    wait_for(&ns.api::<Agent>(), "held", "Active", |a: &Agent| {
        a.status.as_ref().and_then(|s| s.phase) == Some(AgentPhase::Active)
    })
    .await;
    reported(&cp, &ns.name, "held", "Active").await;
    open(
        &cp,
        1,
        target(&ns.name, "held"),
        Some(&["sleep", "3601"]),
        true,
    )
    .await;
    cp.wait_frame("io_opened", frame_on("io_opened", 1)).await;
    cp.wait_frame("session.open", audit_of("session.open", "sess-1".into()))
        .await;

    // The link goes down; the exec ends with it and is audited with no one to hear.
    cp.stop().await;
    let down = Instant::now();
    wait_logged(&first, "action=session.close", 1, Duration::from_secs(20)).await;
    let recorded = down.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = outbox_events(&ns).await;
    first.stop("KILL");
    eprintln!("session.close recorded {recorded:?} after the link went down; SIGKILL 2 s later");
    assert!(
        held.iter()
            .any(|e| e["action"] == "session.close" && e["session_id"] == "sess-1"),
        "the outbox at the SIGKILL holds the session.close: {held:?}"
    );

    // A new manager, the control plane back: the close arrives after its snapshot.
    cp.restart().await;
    let second = start(&ns.name, "second", &cp, &[]);
    let snapshot = cp
        .wait_frame("the new snapshot", is_on("snapshot", 2))
        .await;
    let close = cp
        .wait_frame(
            "the session.close recorded before the SIGKILL",
            audit_of("session.close", "sess-1".into()),
        )
        .await;
    assert_eq!(close.conn, 2, "delivered by the new manager");
    assert!(close.at >= snapshot.at, "sent after the snapshot");
    assert_eq!(
        close.json().unwrap()["event"]["detail"]["reason"],
        "connection to the control plane lost"
    );
    wait_within("the outbox emptied", Duration::from_secs(10), || async {
        outbox_events(&ns).await.is_empty()
    })
    .await;
    let closes = audits(&cp)
        .iter()
        .filter(|f| f.json().unwrap()["event"]["action"] == "session.close")
        .count();
    assert_eq!(closes, 1, "delivered once");
    assert_eq!(
        second
            .metric("autonomic_audit_outbox_delivered_total")
            .await,
        1.0
    );
    assert_eq!(
        second
            .metric("autonomic_audit_outbox_malformed_total")
            .await,
        0.0
    );
}

/// A leader failover during an outage: the leader serves 50 controls (audited, never
/// sent: no connection gets past a snapshot), the control plane goes away, the leader
/// is SIGKILLed; the standby takes over and, when the control plane is back, delivers
/// the 50 events, each once, in the order they were recorded.
#[tokio::test]
async fn a_failover_during_an_outage_delivers_fifty_controls_once() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ob-failover").await;
    let cp = FakeCp::start().await;
    cp.set_mode(Mode::NoWelcome);
    let elected = [
        ("AUTONOMIC_LEADER_ELECTION", "true"),
        ("AUTONOMIC_WELCOME_TIMEOUT_S", "600"),
    ];
    let mut a = start(&ns.name, "a", &cp, &elected);
    cp.wait_frame("a's hello", is_on("hello", 1)).await;
    assert_eq!(lease_holder_pod(&ns).await, "a");
    let mut b = start(&ns.name, "b", &cp, &elected);
    b.wait_log("leader election on", Duration::from_secs(30));
    agent(&ns, "bot").await;
    // Reconciled by a: in its cache, so the controls find it.
    wait_for(&ns.api::<Agent>(), "bot", "a status", |x: &Agent| {
        x.status.is_some()
    })
    .await;

    // 50 controls, 8 a connection (what a session runs at once before its first
    // result goes out), each connection dropped once they are done.
    let control = |i: usize| {
        let action = if i.is_multiple_of(2) {
            "pause"
        } else {
            "resume"
        };
        json!({"type": "control", "id": format!("c{i}"), "action": action,
               "actor": "alice@example.com",
               "target": {"kind": "Agent", "namespace": ns.name, "name": "bot"}})
    };
    let mut sent = 0;
    let mut conn = 1;
    while sent < 50 {
        cp.wait_frame("hello", is_on("hello", conn)).await;
        let batch = (50 - sent).min(8);
        for i in sent..sent + batch {
            cp.send(control(i)).await;
        }
        sent += batch;
        wait_logged(&a, "action=control.", sent, Duration::from_secs(30)).await;
        cp.drop_connection().await;
        conn += 1;
    }
    // The outage; the writer's batch is out within a second or two.
    cp.stop().await;
    let written = Instant::now();
    wait_within(
        "50 events in the outbox",
        Duration::from_secs(10),
        || async { outbox_events(&ns).await.len() == 50 },
    )
    .await;
    eprintln!(
        "the outbox held the 50 events {:?} after the outage began",
        written.elapsed()
    );
    let kept: Vec<String> = outbox_events(&ns)
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(audits(&cp).is_empty(), "nothing sent before the failover");
    let writes = a.metric("autonomic_audit_outbox_writes_total").await;
    eprintln!(
        "{writes} outbox writes for 50 events over {} connections",
        conn - 1
    );
    assert!(writes < 50.0, "batched: {writes} writes for 50 events");
    a.stop("KILL");
    let killed = Instant::now();

    // b leads; the control plane comes back and welcomes it.
    cp.set_mode(Mode::Accept);
    cp.restart().await;
    wait_within("b leading", Duration::from_secs(60), || async {
        lease_holder_pod(&ns).await == "b"
    })
    .await;
    wait_within("b's hello", Duration::from_secs(30), || async {
        hello_conn(&cp, "b").is_some()
    })
    .await;
    let b_conn = hello_conn(&cp, "b").unwrap();
    let snapshot = cp
        .wait_frame("b's snapshot", is_on("snapshot", b_conn))
        .await;
    wait_within(
        "the 50 events delivered",
        Duration::from_secs(30),
        || async { audits(&cp).len() >= 50 },
    )
    .await;
    eprintln!(
        "delivered by the new leader {:?} after the SIGKILL",
        killed.elapsed()
    );
    // A moment for any duplicate to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = audits(&cp);
    let ids: Vec<String> = got.iter().map(event_id).collect();
    assert_eq!(ids, kept, "each once, in the order recorded");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 50);
    for f in &got {
        assert_eq!(f.conn, snapshot.conn, "all on b's connection");
        assert!(f.at >= snapshot.at, "after its snapshot");
        let action = f.json().unwrap()["event"]["action"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(action.starts_with("control."), "{action}");
    }
    wait_within("the outbox emptied", Duration::from_secs(10), || async {
        outbox_events(&ns).await.is_empty()
    })
    .await;
    assert_eq!(
        b.metric("autonomic_audit_outbox_delivered_total").await,
        50.0
    );
}

/// The first connection whose `hello` names pod `pod`.
fn hello_conn(cp: &FakeCp, pod: &str) -> Option<usize> {
    cp.frames()
        .iter()
        .find(|f| f.frame_type() == Some("hello") && f.json().unwrap()["host"]["pod"] == pod)
        .map(|f| f.conn)
}

/// 20 000 audit events that cannot be sent (session denials served before any
/// `welcome`): the outbox stays within its count and bytes, the drop is counted, writes
/// stay at most about one a second; then a new manager delivers what the outbox kept
/// (the newest), skipping and counting entries someone else wrote into it.
#[tokio::test]
async fn twenty_thousand_events_keep_the_bound_and_count_the_drop() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "ob-flood").await;
    let cp = FakeCp::start().await;
    cp.set_mode(Mode::NoWelcome);
    let mut first = start(
        &ns.name,
        "first",
        &cp,
        &[("AUTONOMIC_WELCOME_TIMEOUT_S", "600")],
    );
    cp.wait_frame("hello", is_on("hello", 1)).await;
    let began = Instant::now();
    const N: u32 = 20_000;
    for i in 1..=N {
        cp.send(json!({
            "type": "io_open", "channel": i, "session_id": format!("s-{i}"),
            "actor": "alice@example.com", "target": target(&ns.name, "ghost"),
            "command": ["sh"], "tty": false, "cols": 80, "rows": 24,
        }))
        .await;
    }
    wait_within("20 000 denials", Duration::from_secs(120), || async {
        cp.frames()
            .iter()
            .filter(|f| f.frame_type() == Some("io_close"))
            .count()
            >= N as usize
    })
    .await;
    let flood = began.elapsed();
    // The writer's last batch.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = outbox_text(&ns).await.expect("an outbox");
    let lines = text.lines().count();
    let writes = first.metric("autonomic_audit_outbox_writes_total").await;
    let dropped = first.metric("autonomic_audit_outbox_dropped_total").await;
    let queue_dropped = first.metric("autonomic_audit_dropped_total").await;
    eprintln!(
        "{N} events in {flood:?}: the outbox holds {lines} events, {} bytes; {writes} writes; \
         {dropped} dropped from the outbox, {queue_dropped} from the memory queue",
        text.len()
    );
    assert!(lines <= MAX_EVENTS, "{lines} events");
    assert!(text.len() <= MAX_BYTES, "{} bytes", text.len());
    assert_eq!(lines, MAX_EVENTS, "full");
    // At least the newest 10 000 (what the memory queue keeps) went through the outbox.
    assert!(dropped >= 9_000.0, "dropped {dropped}");
    assert_eq!(queue_dropped, f64::from(N) - 10_000.0);
    assert_eq!(
        first.metric("autonomic_audit_outbox_events").await,
        MAX_EVENTS as f64
    );
    let bound = (flood + Duration::from_secs(3)).as_secs_f64() + 2.0;
    assert!(
        writes <= bound,
        "{writes} writes in {flood:?}: not rate-bounded"
    );
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.last().unwrap()["session_id"], format!("s-{N}"));
    assert!(audits(&cp).is_empty(), "nothing sent before a snapshot");
    first.stop("KILL");

    // Someone else's lines in the outbox: skipped and counted by the next manager.
    let mut tampered = String::from("not an event\n{\"id\":\"\"}\n");
    tampered.push_str(&text);
    let mut cm = ns.api::<ConfigMap>().get(OUTBOX).await.unwrap();
    cm.data = Some([(KEY.to_owned(), tampered)].into());
    ns.api::<ConfigMap>()
        .replace(OUTBOX, &PostParams::default(), &cm)
        .await
        .unwrap();

    cp.set_mode(Mode::Accept);
    let second = start(&ns.name, "second", &cp, &[]);
    wait_within(
        "the kept events delivered",
        Duration::from_secs(60),
        || async { audits(&cp).len() >= MAX_EVENTS },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got: Vec<String> = audits(&cp).iter().map(event_id).collect();
    let want: Vec<String> = events
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, want, "the outbox's events, in order, once");
    assert_eq!(
        second
            .metric("autonomic_audit_outbox_malformed_total")
            .await,
        2.0
    );
    wait_within("the outbox emptied", Duration::from_secs(10), || async {
        outbox_events(&ns).await.is_empty()
    })
    .await;
}
