//! Leader election against the real API server: several managers in managed mode, one
//! fake control plane. Only the leader reconciles and holds the connection; never two
//! connections at once, across a SIGKILL of the leader (the successor waits for the
//! Lease to expire) and a SIGTERM (the Lease is released, the successor takes over on
//! its next retry). The measured takeover times are printed (`--no-capture`); the
//! asserted bounds are the issue's, with room for a loaded machine.

mod support;

use std::time::Duration;
use tokio::time::Instant;

use autonomic_manager::crd::{Runtime, RuntimePhase};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use serde_json::Value;
use support::fake_cp::{FakeCp, Received};
use support::*;

const TOKEN: &str = "tok_live_5e1d7c9a2b4f6a80";
const LEASE: &str = "autonomic-manager";

fn elected_env(cp: &FakeCp, ns: &str, pod: &str) -> Vec<(&'static str, String)> {
    let mut env = managed_vars(cp.url(), TOKEN);
    env.extend([
        ("AUTONOMIC_LEADER_ELECTION", "true".into()),
        ("POD_NAMESPACE", ns.into()),
        ("POD_NAME", pod.into()),
    ]);
    env
}

fn start(ns: &str, pod: &str, cp: &FakeCp) -> Manager {
    let env = elected_env(cp, ns, pod);
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Manager::start_as(ns, &format!("{ns}-{pod}"), &pairs)
}

/// Polls (every 20 ms, real time) until `n` upgrades were accepted; the time it took.
async fn wait_accepted(cp: &FakeCp, n: usize, bound: Duration) -> Duration {
    let start = Instant::now();
    while cp.accepted() < n {
        assert!(
            start.elapsed() < bound,
            "no connection #{n} within {bound:?} (accepted {})",
            cp.accepted()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

async fn holder(leases: &Api<Lease>) -> String {
    leases
        .get(LEASE)
        .await
        .expect("the Lease")
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

fn hello_on(cp: &FakeCp, conn: usize) -> Value {
    cp.frames()
        .iter()
        .find(|f| f.conn == conn && f.frame_type() == Some("hello"))
        .and_then(Received::json)
        .cloned()
        .unwrap_or_else(|| panic!("no hello on connection {conn}"))
}

#[tokio::test]
async fn one_leader_one_connection_across_kill_and_graceful_stop() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "leader").await;
    let leases: Api<Lease> = ns.api();
    let cp = FakeCp::start().await;

    let mut a = start(&ns.name, "a", &cp);
    cp.wait_frame("a's snapshot", |f| {
        f.conn == 1 && f.frame_type() == Some("snapshot")
    })
    .await;
    let b = start(&ns.name, "b", &cp);
    // A standby is ready once its watches synced: it never connects.
    b.wait_ready().await;
    a.wait_ready().await;
    assert_eq!(a.metric("autonomic_leader").await, 1.0);
    assert_eq!(b.metric("autonomic_leader").await, 0.0);
    // The Lease names the leader as `<pod>_<boot id>`, the boot id its hello carried.
    let boot_a = hello_on(&cp, 1)["boot_id"].as_str().unwrap().to_owned();
    assert_eq!(holder(&leases).await, format!("a_{boot_a}"));

    // Only the leader reconciles; the standby's watches see the object all the same.
    let rt: Runtime = yaml(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {name: base}\nspec: {image: 'img:1'}",
    );
    ns.api::<Runtime>()
        .create(&PostParams::default(), &rt)
        .await
        .unwrap();
    wait_for(&ns.api::<Runtime>(), "base", "Ready", |r: &Runtime| {
        r.status.as_ref().and_then(|s| s.phase) == Some(RuntimePhase::Ready)
    })
    .await;
    // The standby's watches queued it too; nobody works that queue.
    wait_until("the standby's watch saw the Runtime", || async {
        b.metric("autonomic_queue_depth").await >= 1.0
    })
    .await;
    // Counted when the reconcile returns, a moment after its status write.
    wait_until("the leader counted its reconcile", || async {
        a.metric("autonomic_reconciles_total{kind=\"Runtime\"}")
            .await
            >= 1.0
    })
    .await;
    let standby_reconciles = [
        "autonomic_reconciles_total{kind=\"Agent\"}",
        "autonomic_reconciles_total{kind=\"Tool\"}",
        "autonomic_reconciles_total{kind=\"Runtime\"}",
        "autonomic_reconciles_total{kind=\"Memory\"}",
    ];
    for series in standby_reconciles {
        assert_eq!(
            b.metric(series).await,
            0.0,
            "the standby reconciled: {series}"
        );
    }
    assert_eq!(cp.accepted(), 1, "the standby dialled");

    // SIGKILL: nothing is released; the standby waits out the lease duration.
    a.stop("KILL");
    let after_kill = wait_accepted(&cp, 2, Duration::from_secs(15 + 5)).await;
    eprintln!("takeover after SIGKILL of the leader: {after_kill:?}");
    // Never before the Lease could have expired: the last renewal was at most one
    // retry period (2 s) before the kill.
    assert!(
        after_kill >= Duration::from_secs(15 - 2),
        "took over a Lease that had not expired: {after_kill:?}"
    );
    cp.wait_frame("b's snapshot", |f| {
        f.conn == 2 && f.frame_type() == Some("snapshot")
    })
    .await;
    b.wait_ready().await;
    assert_eq!(b.metric("autonomic_leader").await, 1.0);
    let boot_b = hello_on(&cp, 2)["boot_id"].as_str().unwrap().to_owned();
    assert_eq!(holder(&leases).await, format!("b_{boot_b}"));

    // SIGTERM: the leader closes with 1000, releases, exits 0; a standby takes over.
    let mut b = b;
    let c = start(&ns.name, "c", &cp);
    c.wait_ready().await;
    assert_eq!(c.metric("autonomic_leader").await, 0.0);
    let t = Instant::now();
    let code = b.stop("TERM");
    let exit = t.elapsed();
    assert_eq!(code, Some(0), "{}", b.logs());
    assert!(exit < Duration::from_secs(5), "exit took {exit:?}");
    let after_term = t.elapsed() + wait_accepted(&cp, 3, Duration::from_secs(6)).await;
    eprintln!("leader exit after SIGTERM: {exit:?}; takeover after SIGTERM: {after_term:?}");
    assert!(
        cp.frames().iter().any(|f| f.conn == 2
            && f.kind == support::fake_cp::ReceivedKind::Close(Some((1000, "shutdown".into())))),
        "the leader did not close with 1000"
    );
    cp.wait_frame("c's snapshot", |f| {
        f.conn == 3 && f.frame_type() == Some("snapshot")
    })
    .await;
    let boot_c = hello_on(&cp, 3)["boot_id"].as_str().unwrap().to_owned();
    assert_eq!(holder(&leases).await, format!("c_{boot_c}"));

    assert_eq!(
        cp.max_connections(),
        1,
        "two connections were open at the same time"
    );
    assert_eq!(cp.accepted(), 3);
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_disconnects_and_exits() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "leader-lost").await;
    let leases: Api<Lease> = ns.api();
    let cp = FakeCp::start().await;
    let mut a = start(&ns.name, "a", &cp);
    cp.wait_frame("snapshot", |f| f.frame_type() == Some("snapshot"))
        .await;
    assert!(cp.connected());

    // Someone else writes itself into the Lease (as a partitioned peer might).
    // Retried on 409: the leader renews every 2 s.
    wait_until("the Lease overwritten", || async {
        let mut lease = leases.get(LEASE).await.unwrap();
        let spec = lease.spec.as_mut().unwrap();
        spec.holder_identity = Some("intruder".into());
        spec.lease_duration_seconds = Some(60);
        leases
            .replace(LEASE, &PostParams::default(), &lease)
            .await
            .is_ok()
    })
    .await;
    let t = Instant::now();
    let code = a.wait_exit(Duration::from_secs(10));
    eprintln!("exit after the Lease was taken: {:?}", t.elapsed());
    assert_eq!(code, Some(1), "{}", a.logs());
    // The manager closed the connection itself (1000) before exiting, rather than
    // leaving it to the kernel. The fake may see the close a moment after the exit.
    cp.wait_frame("the leader's close", |f| {
        f.conn == 1
            && f.kind == support::fake_cp::ReceivedKind::Close(Some((1000, "shutdown".into())))
    })
    .await;
    wait_until("the connection closed", || async { !cp.connected() }).await;
    assert!(a.logs().contains("leadership lost"), "{}", a.logs());
    // It did not take the Lease back on its way out.
    assert_eq!(holder(&leases).await, "intruder");
}

/// A TCP forwarder to `target` that the test can turn into a black hole: after `cut`,
/// every connection, old or new, stays open and silent (a partition, not a reset).
async fn cuttable_proxy(target: String) -> (u16, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            let mut cut_rx = cut_rx.clone();
            let target = target.clone();
            tokio::spawn(async move {
                if !*cut_rx.borrow() {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                        _ = cut_rx.wait_for(|c| *c) => {}
                    }
                    // Hold both sockets, silent, until the test ends.
                    std::future::pending::<()>().await;
                    drop(outbound);
                }
                std::future::pending::<()>().await;
                drop(inbound);
            });
        }
    });
    (port, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_disconnects_before_anyone_takes_over() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "leader-cut").await;
    let cp = FakeCp::start().await;

    // Leader A reaches the API server through a proxy the test can cut; B directly.
    let (mut a, cut) = proxied_leader(&ns.name, "a", &cp).await;
    cp.wait_frame("a's snapshot", |f| {
        f.conn == 1 && f.frame_type() == Some("snapshot")
    })
    .await;
    let b = start(&ns.name, "b", &cp);
    b.wait_ready().await;
    assert_eq!(b.metric("autonomic_leader").await, 0.0);

    // Partition: A can no longer renew. It must drop its connection before B, which
    // still sees the API server, may take the Lease over.
    let t = Instant::now();
    cut.send(true).unwrap();
    let mut a_closed = None;
    while cp.accepted() < 2 {
        if a_closed.is_none() && !cp.connected() {
            a_closed = Some(t.elapsed());
        }
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "no takeover within 40 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b_connected = t.elapsed();
    let a_closed = a_closed.expect("B connected while A's connection was still open");
    eprintln!(
        "partitioned leader closed its connection after {a_closed:?}; successor connected after {b_connected:?}"
    );
    // Renew deadline 10 s after the last renewal (at most 2 s before the cut), plus
    // the close; before the Lease could expire for B (15 s after it last saw it renewed).
    assert!(a_closed < Duration::from_secs(10 + 4), "{a_closed:?}");
    assert!(a_closed < b_connected);
    assert_eq!(cp.max_connections(), 1, "two connections at once");
    assert_eq!(
        a.wait_exit(Duration::from_secs(10)),
        Some(1),
        "{}",
        a.logs()
    );
    assert!(a.logs().contains("renew deadline"), "{}", a.logs());
    cp.wait_frame("b's snapshot", |f| {
        f.conn == 2 && f.frame_type() == Some("snapshot")
    })
    .await;
}

/// A manager reaching the API server through a proxy the test can cut (see
/// [`cuttable_proxy`]), started and leading; with the switch that cuts it.
async fn proxied_leader(
    ns: &str,
    name: &str,
    cp: &FakeCp,
) -> (Manager, tokio::sync::watch::Sender<bool>) {
    // The chart's identity, with the API server's address swapped for the proxy's.
    let mut kubeconfig: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(managed_chart_identity(ns, &[ns])).unwrap())
            .unwrap();
    let server = kubeconfig["clusters"][0]["cluster"]["server"]
        .as_str()
        .and_then(|s| s.strip_prefix("https://"))
        .expect("server in the kubeconfig")
        .to_owned();
    let (port, cut) = cuttable_proxy(server.clone()).await;
    kubeconfig["clusters"][0]["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    let proxied = log_dir().join(format!("{ns}-{name}.kubeconfig"));
    std::fs::write(&proxied, kubeconfig.to_string()).unwrap();
    let mut env = elected_env(cp, ns, name);
    env.push(("KUBECONFIG", proxied.display().to_string()));
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut m = Manager::start_as(ns, &format!("{ns}-{name}"), &pairs);
    m.wait_log("acquired the Lease", Duration::from_secs(30));
    (m, cut)
}

fn signal(m: &Manager, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), m.pid().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_bounded_and_a_second_signal_exits_at_once() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "leader-stop").await;
    let cp = FakeCp::start().await;

    // With the API server unreachable, releasing the Lease cannot complete: the
    // shutdown still ends, with 0, within 5 s.
    let (mut a, cut_a) = proxied_leader(&ns.name, "a", &cp).await;
    cut_a.send(true).unwrap();
    let t = Instant::now();
    signal(&a, "TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(5)), Some(0), "{}", a.logs());
    eprintln!(
        "shutdown with the API server unreachable: {:?}",
        t.elapsed()
    );
    assert!(
        a.logs().contains("releasing the Lease timed out"),
        "{}",
        a.logs()
    );

    // The same stuck shutdown, and a second signal: out at once. (A namespace of its
    // own: A's Lease, never released, would keep B standing by for 15 s.)
    let ns_b = TestNamespace::new(&client, "leader-stop-b").await;
    let (mut b, cut_b) = proxied_leader(&ns_b.name, "b", &cp).await;
    cut_b.send(true).unwrap();
    signal(&b, "TERM");
    b.wait_log("a second signal exits at once", Duration::from_secs(5));
    let t = Instant::now();
    signal(&b, "INT");
    let code = b.wait_exit(Duration::from_secs(5));
    eprintln!("exit after the second signal: {:?}", t.elapsed());
    assert_eq!(code, Some(130), "{}", b.logs());
    assert!(
        !b.logs().contains("releasing the Lease timed out"),
        "{}",
        b.logs()
    );
}
