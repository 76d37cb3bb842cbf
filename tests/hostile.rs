//! Hostile sizes (issue 11): a control plane, a namespace user or a port scanner sends
//! the most it can. For each, the manager (its own process, as the chart's
//! ServiceAccount) stays up, its peak memory (`VmHWM` of `/proc/<pid>/status`) grows by
//! no more than the bound stated here and in docs/design.md's Bounds, and the link to the
//! control plane recovers or never breaks. The measured growth is printed
//! (`--no-capture`).

mod support;

use std::time::Duration;
use tokio::time::Instant;

use autonomic_manager::crd::{Agent, AgentPhase};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::PostParams;
use serde_json::{Value, json};
use support::fake_cp::{FakeCp, Received};
use support::fake_http::FakeReport;
use support::*;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::Frame as WsFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

const TOKEN: &str = "tok_live_8d3f1b6e9c2a7d41";
const MIB: u64 = 1 << 20;
const DEAD: &str = "nothing from the control plane for 3 heartbeat intervals";

/// A field of `/proc/<pid>/status` in KiB (`VmHWM`: the peak resident set so far).
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("the manager (pid {pid}) is gone: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The manager's peak memory, from its first instruction to now.
struct Peak {
    pid: u32,
    before_kib: u64,
}

impl Peak {
    fn start(m: &Manager) -> Peak {
        let pid = m.pid();
        Peak {
            pid,
            before_kib: status_kib(pid, "VmHWM"),
        }
    }

    /// Asserts the peak grew by at most `bound_mib` since `start`; returns the growth
    /// in MiB.
    fn assert_within(&self, what: &str, bound_mib: u64) -> f64 {
        let after = status_kib(self.pid, "VmHWM");
        let grown = after.saturating_sub(self.before_kib);
        let grown_mib = grown as f64 / 1024.0;
        eprintln!(
            "{what}: peak memory {:.1} MiB → {:.1} MiB (+{grown_mib:.1} MiB, bound {bound_mib} MiB)",
            self.before_kib as f64 / 1024.0,
            after as f64 / 1024.0
        );
        assert!(
            grown <= bound_mib * 1024,
            "{what}: the manager's peak memory grew by {grown_mib:.1} MiB, bound {bound_mib} MiB"
        );
        grown_mib
    }
}

fn start(ns: &str, cp: &FakeCp) -> Manager {
    let env = managed_vars(cp.url(), TOKEN);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Manager::start_as(ns, ns, &pairs)
}

fn is_on(t: &'static str, conn: usize) -> impl Fn(&Received) -> bool {
    move |r| r.conn == conn && r.frame_type() == Some(t)
}

/// A second manager started on what the first one left: connected, its first snapshot
/// handed to `check`, `/readyz` green and a heartbeat sent.
async fn started_on_them(ns: &TestNamespace, check: impl FnOnce(&Received)) -> (FakeCp, Manager) {
    let cp = FakeCp::start().await;
    cp.set_welcome(2, 300);
    let m = start(&ns.name, &cp);
    let snap = cp
        .wait_frame("the first snapshot", is_on("snapshot", 1))
        .await;
    check(&snap);
    m.wait_ready().await;
    cp.wait_frame("a heartbeat", is_on("heartbeat", 1)).await;
    (cp, m)
}

/// A control plane on a 2 s heartbeat and a manager connected to it, its first
/// snapshot sent and `/readyz` green.
async fn connected(ns: &TestNamespace) -> (FakeCp, Manager) {
    let cp = FakeCp::start().await;
    cp.set_welcome(2, 300);
    let m = start(&ns.name, &cp);
    cp.wait_frame("the first snapshot", is_on("snapshot", 1))
        .await;
    m.wait_ready().await;
    (cp, m)
}

/// The manager is up (its probe answers) and connection `conn` got hello, a snapshot
/// with seq 1 and then a heartbeat: the link recovered.
async fn recovered(cp: &FakeCp, m: &Manager, conn: usize) {
    let snap = cp
        .wait_frame(
            "a snapshot after the hostile message",
            is_on("snapshot", conn),
        )
        .await;
    assert_eq!(snap.json().unwrap()["seq"], 1);
    let first = cp
        .frames()
        .into_iter()
        .find(|r| r.conn == conn && r.frame_type().is_some())
        .unwrap();
    assert_eq!(first.frame_type(), Some("hello"));
    cp.wait_frame("a heartbeat after the snapshot", |r| {
        r.conn == conn && r.at > snap.at && r.frame_type() == Some("heartbeat")
    })
    .await;
    assert_eq!(m.get("/livez").await.0, 200);
    m.wait_ready().await;
}

/// A 48 MiB binary message: the socket refuses it from its header (the limit is
/// 1 MiB + 5 bytes), the connection ends, the manager redials.
#[tokio::test]
async fn a_48_mib_binary_message_ends_the_connection_not_the_manager() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-bin").await;
    let (cp, m) = connected(&ns).await;
    let peak = Peak::start(&m);
    let sent = cp.try_send(Message::binary(vec![7u8; 48 << 20])).await;
    eprintln!("48 MiB binary message: send {sent:?}");
    recovered(&cp, &m, 2).await;
    assert!(
        m.logs().contains("too long"),
        "the refusal is not logged:\n{}",
        m.logs()
    );
    peak.assert_within("48 MiB binary message", 4);
}

/// A 48 MiB text message sent as 192 fragments of 256 KiB (each fragment below the frame
/// limit): the socket stops collecting at 1 MiB + 5 bytes and ends the connection.
#[tokio::test]
async fn a_48_mib_text_message_in_fragments_ends_the_connection_not_the_manager() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-frag").await;
    let (cp, m) = connected(&ns).await;
    let peak = Peak::start(&m);
    let piece = 256 << 10;
    let count = (48 << 20) / piece;
    let mut sent = 0;
    for i in 0..count {
        let opcode = if i == 0 {
            OpCode::Data(Data::Text)
        } else {
            OpCode::Data(Data::Continue)
        };
        let payload = if i == 0 {
            let mut p = br#"{"type":"resync","pad":""#.to_vec();
            p.resize(piece, b'x');
            p
        } else {
            vec![b'x'; piece]
        };
        let frame = WsFrame::message(payload, opcode, i == count - 1);
        if cp.try_send(Message::Frame(frame)).await.is_err() {
            break;
        }
        sent += 1;
    }
    eprintln!("fragments of 256 KiB written before the manager hung up: {sent} of {count}");
    assert!(sent < count, "the manager took all 48 MiB");
    recovered(&cp, &m, 2).await;
    peak.assert_within("48 MiB text message in fragments", 4);
}

/// 200 `resync`s at once: each is answered with a full snapshot (§3), one after the
/// other, about 240 KiB each here; the connection and its heartbeats go on.
#[tokio::test]
async fn two_hundred_resyncs_at_once_are_answered_and_the_link_stays() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-resync").await;
    create_big_runtimes(&ns).await;
    let (cp, m) = connected(&ns).await;
    // Past the first snapshot's deltas (the Runtimes' status).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let peak = Peak::start(&m);
    let t = Instant::now();
    for _ in 0..200 {
        cp.send(json!({"type": "resync"})).await;
    }
    let snapshots_on_1 = || -> Vec<Received> {
        cp.frames()
            .into_iter()
            .filter(|r| r.conn == 1 && r.frame_type() == Some("snapshot"))
            .collect()
    };
    wait_until("the 200th answer to a resync", || async {
        snapshots_on_1().len() >= 201
    })
    .await;
    let snapshots = snapshots_on_1();
    let last = snapshots.last().unwrap().clone();
    let took = last.at - t;
    let size = snapshots[0].json().unwrap().to_string().len();
    eprintln!(
        "200 resyncs answered in {took:?} ({} snapshots of about {} KiB)",
        snapshots.len(),
        size / 1024
    );
    assert_eq!(
        snapshots.len(),
        201,
        "one snapshot per resync, plus the first"
    );
    assert_eq!(cp.accepted(), 1, "the connection broke");
    let after = last.at;
    cp.wait_frame("a heartbeat after the resyncs", |r| {
        r.conn == 1 && r.at > after && r.frame_type() == Some("heartbeat")
    })
    .await;
    assert!(!m.logs().contains(DEAD));
    peak.assert_within("200 resyncs at once", 8);
}

/// Every string field of every frame the manager reads from the control plane, filled
/// to the largest size a frame may have (1 MiB in all: the string is 1 MiB less the
/// rest of the frame), one field at a time; then, per kind, every string field at a
/// full 1 MiB at once (a frame of several MiB, refused by the socket: the connection
/// ends). The frames that fit are decoded and their strings cut; no log line grows past
/// 64 KiB; the connection stays for them, comes back after the others.
#[tokio::test]
async fn one_mib_strings_in_every_field_are_cut_and_the_link_recovers() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-strings").await;
    let (cp, m) = connected(&ns).await;
    let peak = Peak::start(&m);
    let limit = MIB as usize;
    let target = |ns: &str| json!({"kind": "Agent", "namespace": ns, "name": "a"});
    // Each kind with every string field it has (paths into the frame) and a valid
    // frame to fill.
    let kinds: Vec<(Value, Vec<&[&str]>)> = vec![
        (
            json!({"type": "heartbeat", "sent_at": "t"}),
            vec![&["sent_at"]],
        ),
        (
            json!({"type": "welcome", "deployment_id": "d", "heartbeat_interval_s": 2}),
            vec![&["deployment_id"]],
        ),
        (json!({"type": "resync", "extra": ""}), vec![&["extra"]]),
        (
            json!({"type": "control", "id": "c", "action": "pause", "target": target(&ns.name), "actor": "u"}),
            vec![
                &["id"],
                &["action"],
                &["actor"],
                &["target", "kind"],
                &["target", "namespace"],
                &["target", "name"],
            ],
        ),
        (
            json!({"type": "io_open", "channel": 7, "session_id": "s", "actor": "u",
                   "target": {"namespace": ns.name, "agent": "none", "container": "runtime"},
                   "command": ["sh"], "tty": false}),
            vec![
                &["session_id"],
                &["actor"],
                &["target", "namespace"],
                &["target", "agent"],
                &["target", "container"],
                &["command", "0"],
            ],
        ),
        (
            json!({"type": "io_resize", "channel": 7, "cols": 80, "rows": 24, "extra": ""}),
            vec![&["extra"]],
        ),
        (
            json!({"type": "io_close", "channel": 7, "reason": "r"}),
            vec![&["reason"]],
        ),
        (
            json!({"type": "error", "code": "c", "message": "m", "ref": "r"}),
            vec![&["code"], &["message"], &["ref"]],
        ),
        (json!({"type": "x"}), vec![&["type"]]),
    ];
    fn slot<'v>(frame: &'v mut Value, path: &[&str]) -> &'v mut Value {
        path.iter().fold(frame, |v, k| match k.parse::<usize>() {
            Ok(i) => &mut v[i],
            Err(_) => &mut v[*k],
        })
    }
    // One field at a time, the frame exactly at the limit: decoded, the connection stays.
    let mut sent = 0;
    for (frame, fields) in &kinds {
        for path in fields {
            let mut f = frame.clone();
            *slot(&mut f, path) = Value::String(String::new());
            let room = limit - f.to_string().len();
            *slot(&mut f, path) = Value::String("é".repeat(room / 2));
            let text = f.to_string();
            assert!(
                text.len() <= limit && text.len() >= limit - 1,
                "{}",
                text.len()
            );
            cp.send_raw(&text).await;
            sent += 1;
        }
    }
    // Past them, a heartbeat is still answered on the same connection.
    let t = Instant::now();
    cp.send(json!({"type": "heartbeat", "sent_at": "t"})).await;
    cp.wait_frame("a heartbeat after the large strings", |r| {
        r.conn == 1 && r.at > t && r.frame_type() == Some("heartbeat")
    })
    .await;
    assert_eq!(
        cp.accepted(),
        1,
        "a frame within the limit ended the connection"
    );
    let rejected = cp
        .frames()
        .iter()
        .filter(|r| r.frame_type() == Some("error"))
        .count();
    eprintln!("{sent} frames of 1 MiB with one large string; {rejected} answered with error");

    // Every string field at 1 MiB at once: refused by the socket, the connection ends.
    let mut conn = 1;
    for (frame, fields) in &kinds {
        let mut f = frame.clone();
        for path in fields {
            *slot(&mut f, path) = Value::String("x".repeat(limit));
        }
        let _ = cp.try_send(Message::text(f.to_string())).await;
        conn += 1;
        recovered(&cp, &m, conn).await;
    }

    // The welcome's deployment id at 1 MiB less the frame, as the first frame of a
    // session: the session starts, its log line bounded.
    let id_room = limit - 120;
    cp.set_deployment_id(&"d".repeat(id_room));
    cp.drop_connection().await;
    conn += 1;
    recovered(&cp, &m, conn).await;

    let logs = m.logs();
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    eprintln!(
        "longest log line: {longest} bytes; {} connections",
        cp.accepted()
    );
    assert!(
        longest <= 64 * 1024,
        "a log line of {longest} bytes: {}",
        &logs.lines().max_by_key(|l| l.len()).unwrap()[..300]
    );
    peak.assert_within("1 MiB strings in every field", 8);
}

/// The legacy HTTP transport gets a 16 MiB answer (its limit) of `resync`s, about
/// 930 000 of them: it reads the answer without building a JSON tree of it, answers
/// them all with one snapshot, and goes on posting.
#[tokio::test]
async fn a_16_mib_http_answer_of_resyncs_is_one_snapshot() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-http").await;
    ns.create_runtime("r").await;
    let cp = FakeReport::start().await;
    let env = http_vars(&cp.url, TOKEN);
    let m = Manager::start(&ns.name, &pairs(&env));
    cp.wait_frame("hello", |f| f["type"] == "hello").await;
    m.wait_ready().await;
    cp.wait_frame("a heartbeat", |f| f["type"] == "heartbeat")
        .await;
    let peak = Peak::start(&m);
    // The head takes about a hundred bytes of the 16 MiB.
    let element = r#"{"type":"resync"}"#;
    let count = (16 * MIB as usize - 1024) / (element.len() + 1);
    let mut raw = String::with_capacity(count * (element.len() + 1));
    for i in 0..count {
        if i > 0 {
            raw.push(',');
        }
        raw.push_str(element);
    }
    let posts = cp.posts().len();
    cp.queue_raw(raw);
    // The post after the one that got the answer carries the snapshot.
    wait_until("two posts after the large answer", || async {
        cp.posts().len() >= posts + 3
    })
    .await;
    let after = &cp.posts()[posts + 1..];
    let snapshots: usize = after
        .iter()
        .take(2)
        .map(|p| p.frames.iter().filter(|f| f["type"] == "snapshot").count())
        .sum();
    eprintln!("{count} resyncs in one 16 MiB answer → {snapshots} snapshot(s) in the next posts");
    assert_eq!(
        snapshots, 1,
        "one snapshot answers every resync of an answer"
    );
    let snap = after
        .iter()
        .flat_map(|p| p.frames.iter())
        .find(|f| f["type"] == "snapshot")
        .unwrap();
    assert!(
        snap["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "r")
    );
    assert_eq!(m.get("/livez").await.0, 200);
    m.wait_ready().await;
    peak.assert_within("16 MiB HTTP answer", 24);
}

/// 120 Secrets of 1 MiB each, labelled as the manager's own
/// (`app.kubernetes.io/managed-by=autonomic`, which any namespace user can set), in a
/// watched namespace: first created while a manager runs (its watch gets them one by
/// one), then listed by a manager started afterwards (the initial list, paged, read
/// one object at a time). Both
/// stay up and connected. Two figures each: what stays (`VmRSS` over a manager's on an
/// empty namespace: what the Secret cache keeps, whole Secrets or less) and the
/// transient above it (`VmHWM` less `VmRSS`: pages and events on their way into the
/// cache). The transient is bounded whatever the cache keeps; what stays is bounded by
/// the Secrets' own size (less once the cache keeps less).
#[tokio::test]
async fn labelled_1_mib_secrets_in_a_user_namespace_are_bounded() {
    const SECRETS: u64 = 120;
    // Each Secret (1 MiB) passes through once, as its JSON and then decoded: a few MiB.
    // Lists held a page whole before (12.7 MiB at 8 a page, 145 MiB at 100).
    const TRANSIENT_MIB: f64 = 8.0;
    const KEPT_MIB: f64 = 8.0;
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-secrets").await;
    let (cp, mut m) = connected(&ns).await;
    let empty_kib = status_kib(m.pid(), "VmRSS");
    let data = "s".repeat(MIB as usize - 4096);
    let secrets = ns.api::<Secret>();
    for i in 0..SECRETS {
        let s: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("big-{i:03}"),
                         "labels": {"app.kubernetes.io/managed-by": "autonomic"}},
            "stringData": {"blob": data},
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("create secret");
    }
    // The watch has seen them all once a change made after them is reported.
    ns.create_runtime("after-the-secrets").await;
    reported_runtime(&cp, "after-the-secrets").await;
    let check = |what: &str, pid: u32| {
        let (rss, hwm) = (status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM"));
        let kept = rss.saturating_sub(empty_kib) as f64 / 1024.0;
        let transient = hwm.saturating_sub(rss) as f64 / 1024.0;
        eprintln!(
            "{SECRETS} labelled 1 MiB Secrets, {what}: peak {:.1} MiB, steady {:.1} MiB; kept +{kept:.1} MiB (bound {KEPT_MIB}), transient +{transient:.1} MiB (bound {TRANSIENT_MIB}) over {:.1} MiB on an empty namespace",
            hwm as f64 / 1024.0,
            rss as f64 / 1024.0,
            empty_kib as f64 / 1024.0
        );
        assert!(
            transient <= TRANSIENT_MIB,
            "{what}: a transient of {transient:.1} MiB above what stays, bound {TRANSIENT_MIB} MiB"
        );
        assert!(
            kept <= KEPT_MIB,
            "{what}: {kept:.1} MiB kept for {SECRETS} MiB of Secrets, bound {KEPT_MIB} MiB"
        );
    };
    check("watched", m.pid());
    assert_eq!(cp.accepted(), 1);
    assert!(!m.logs().contains(DEAD));
    m.stop("TERM");

    // A manager that starts on them lists them.
    let (_cp2, m2) = started_on_them(&ns, |snap| {
        assert!(
            snap.resources()
                .iter()
                .any(|r| r["name"] == "after-the-secrets")
        )
    })
    .await;
    check("listed at start", m2.pid());
}

/// 60 Agents whose specs are 1 MiB each as JSON (256 args of 4 KiB: the CRD bounds the
/// list, not its strings), in a watched namespace, past `AUTONOMIC_MAX_SPEC_BYTES`
/// (256 KiB by default; TRUST.md §3): first created while a manager runs (its watch gets
/// them one by one), then listed by a manager started afterwards. Each is kept as a
/// stub and goes `Error`, reason `SpecTooLarge`, the message giving its size; no pod is
/// made. The peak grows by less than 16 MiB for 60 MiB of specs: each passes through
/// once (as a watch event, then the answer to its status write), none stays. Before
/// the bound, the cache kept every spec whole (60 MiB).
#[tokio::test]
async fn sixty_agents_with_1_mib_specs_are_refused_and_not_kept() {
    const AGENTS: usize = 60;
    const BOUND_MIB: u64 = 16;
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-specs").await;
    let (cp, mut m) = connected(&ns).await;
    let peak = Peak::start(&m);
    let args = vec!["a".repeat(4096); 256];
    let agents = ns.api::<Agent>();
    for i in 0..AGENTS {
        let a: Agent = serde_json::from_value(json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
            "metadata": {"name": format!("big-{i:02}")},
            "spec": {"runtime": {"image": "img:1", "args": args}},
        }))
        .unwrap();
        agents
            .create(&PostParams::default(), &a)
            .await
            .unwrap_or_else(|e| panic!("create Agent big-{i:02}: {e}"));
    }
    // Each reported refused to the control plane (polling the API server would read
    // 60 MiB a time).
    let refused = |r: &Value| {
        r["kind"] == "Agent"
            && r["phase"] == "Error"
            && r["status"]["conditions"][0]["reason"] == "SpecTooLarge"
    };
    wait_until("every Agent reported Error/SpecTooLarge", || async {
        let names: std::collections::HashSet<String> = cp
            .frames()
            .iter()
            .flat_map(|f| f.resources())
            .filter(|r| refused(r))
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect();
        names.len() == AGENTS
    })
    .await;
    let grown = peak.assert_within("60 Agents with 1 MiB specs, watched", BOUND_MIB);
    // As the API server has them, once.
    for i in 0..AGENTS {
        let a = agents.get(&format!("big-{i:02}")).await.unwrap();
        let status = a.status.expect("a status");
        assert_eq!(status.phase, Some(AgentPhase::Error), "big-{i:02}");
        let ready = &status.conditions[0];
        assert_eq!(
            (ready.reason.as_str(), ready.status.as_str()),
            ("SpecTooLarge", "False")
        );
        let message = status.message.unwrap_or_default();
        let bytes: u64 = message
            .strip_prefix("spec is ")
            .and_then(|m| m.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no size in {message:?}"));
        assert!(bytes > MIB, "{message}");
        assert!(
            message.ends_with("bytes as JSON, over the bound of 262144 (AUTONOMIC_MAX_SPEC_BYTES)"),
            "{message}"
        );
    }
    let pods = ns.api::<Pod>().list(&Default::default()).await.unwrap();
    assert!(pods.items.is_empty(), "pods made from refused Agents");
    assert_eq!(cp.accepted(), 1);
    assert!(!m.logs().contains(DEAD));
    let baseline = peak.before_kib;
    m.stop("TERM");

    // A manager that starts on them lists them (one request from the watch cache, read
    // one object at a time), finds every status already written, and keeps no spec.
    let (_cp2, m2) = started_on_them(&ns, |snap| {
        let listed = snap.resources().into_iter().filter(|r| refused(r)).count();
        assert_eq!(listed, AGENTS, "refused Agents in the first snapshot");
    })
    .await;
    // From the first manager's peak on the empty namespace: the same process, started
    // on them.
    let peak2 = Peak {
        pid: m2.pid(),
        before_kib: baseline,
    };
    let grown2 = peak2.assert_within("60 Agents with 1 MiB specs, listed at start", BOUND_MIB);
    eprintln!("60 Agents with 1 MiB specs: +{grown:.1} MiB watched, +{grown2:.1} MiB listed");
}

/// 30 pods labelled as the manager's own (`app.kubernetes.io/managed-by=autonomic`, which
/// any namespace user can set) carrying 250 KiB of annotations each, 240 KiB of them an
/// `autonomic.sh/context-summary` (the API server allows 256 KiB of annotations a pod):
/// first created while a manager runs, then listed by a manager started afterwards. The
/// pod cache keeps the summary cut to 4 KiB and no other annotation (TRUST.md §3), so
/// the peak grows by less than 3 MiB; kept whole, the summaries alone were 7 MiB.
#[tokio::test]
async fn labelled_pods_with_250_kib_of_annotations_are_cut_when_read() {
    const PODS: usize = 30;
    const BOUND_MIB: u64 = 3;
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-annot").await;
    let (cp, mut m) = connected(&ns).await;
    let peak = Peak::start(&m);
    let summary = "s".repeat(240 << 10);
    let other = "o".repeat(10 << 10);
    let pods = ns.api::<Pod>();
    for i in 0..PODS {
        let p: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("annotated-{i:02}"),
                         "labels": {"app.kubernetes.io/managed-by": "autonomic"},
                         "annotations": {"autonomic.sh/context-summary": summary,
                                         "example.com/other": other}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": BUSYBOX_IMAGE,
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p)
            .await
            .unwrap_or_else(|e| panic!("create pod annotated-{i:02}: {e}"));
    }
    // The watch has seen them all once a change made after them is reported; then a
    // little longer for their first status changes (scheduled, started), each a watch
    // event of the whole pod.
    ns.create_runtime("after-the-pods").await;
    reported_runtime(&cp, "after-the-pods").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown = peak.assert_within("30 pods with 250 KiB of annotations, watched", BOUND_MIB);
    assert_eq!(cp.accepted(), 1);
    assert!(!m.logs().contains(DEAD));
    let baseline = peak.before_kib;
    m.stop("TERM");

    let (_cp2, m2) = started_on_them(&ns, |snap| {
        assert!(
            snap.resources()
                .iter()
                .any(|r| r["name"] == "after-the-pods")
        )
    })
    .await;
    let peak2 = Peak {
        pid: m2.pid(),
        before_kib: baseline,
    };
    let grown2 = peak2.assert_within(
        "30 pods with 250 KiB of annotations, listed at start",
        BOUND_MIB,
    );
    eprintln!(
        "30 pods with 250 KiB of annotations: +{grown:.1} MiB watched, +{grown2:.1} MiB listed"
    );
}

async fn reported_runtime(cp: &FakeCp, name: &str) {
    cp.wait_frame(&format!("Runtime {name} reported"), |r| {
        r.resources()
            .iter()
            .any(|x| x["kind"] == "Runtime" && x["name"] == name)
    })
    .await;
}

/// The probe port opened and held 10 000 times: 100 rounds of 100 connections opened at
/// once that send nothing, held 200 ms, then closed. The probe server serves 64 at once
/// and leaves the rest in the kernel's backlog (128 on the musl build: a flood past
/// 64 + 129 waits for its SYNs to be retried, as it should); the manager stays up, its
/// heartbeats keep their schedule all along, and `/readyz` answers once the flood is
/// over.
#[tokio::test]
async fn the_probe_port_held_open_10_000_times() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "hs-probe").await;
    let (cp, m) = connected(&ns).await;
    let peak = Peak::start(&m);
    let flood = Instant::now();
    let mut connected_total = 0;
    for _round in 0..100 {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let addr = m.probe.clone();
            tasks.spawn(async move {
                tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr))
                    .await
                    .ok()
                    .and_then(Result::ok)
            });
        }
        let held: Vec<_> = tasks.join_all().await.into_iter().flatten().collect();
        connected_total += held.len();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(held);
    }
    let took = flood.elapsed();
    let (code, _) = tokio::time::timeout(Duration::from_secs(15), m.get("/readyz"))
        .await
        .expect("/readyz did not answer within 15 s of the flood's end");
    assert_eq!(code, 200);
    // Heartbeats every 2 s all along: none more than an interval late.
    let beats: Vec<Instant> = cp
        .frames()
        .iter()
        .filter(|r| r.conn == 1 && r.frame_type() == Some("heartbeat") && r.at >= flood)
        .map(|r| r.at)
        .collect();
    let gap = beats
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!(
        "{connected_total} of 10000 probe connections held in {took:?}; {} heartbeats meanwhile, largest gap {gap:?}",
        beats.len()
    );
    assert!(connected_total >= 9900, "{connected_total} connected");
    assert!(
        beats.len() as u64 + 1 >= took.as_secs() / 2,
        "heartbeats stopped during the flood"
    );
    assert!(gap <= Duration::from_secs(4), "a heartbeat gap of {gap:?}");
    assert_eq!(cp.accepted(), 1);
    peak.assert_within("the probe port held open 10 000 times", 4);
}
