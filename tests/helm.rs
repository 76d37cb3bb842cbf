//! The install users run, end to end on the test bed with the image built from the
//! Dockerfile: `helm install` of the chart (two replicas, unmanaged), then the platform's
//! documented command switches it to managed mode against the fake control plane; a
//! shell into an Agent goes through the in-cluster manager; the leader pod is deleted and
//! the standby connects; the token Secret is rotated and the next connection carries the
//! new token with no restart; the platform's log command shows the connection; `helm
//! uninstall` leaves the custom resources.

mod support;

use std::process::Command;
use tokio::time::Instant;

use autonomic_manager::crd::Agent;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use support::docs::doc_command;
use support::fake_cp::{FakeCp, Received};
use support::*;

const TOKEN_A: &str = "tok_live_helm_a1b2c3d4e5f6";
const TOKEN_B: &str = "tok_live_helm_f6e5d4c3b2a1";

/// `helm ARGS` in the release namespace (HELM_NAMESPACE, so the platform's command line
/// stays as documented); its output, or a panic.
fn helm_in(ns: &str, args: &[&str]) -> String {
    run_ok(Command::new(helm()).env("HELM_NAMESPACE", ns).args(args))
}

fn token_secret(token: &str) -> Secret {
    yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: autonomic-auth}}\nstringData: {{token: {token}}}"
    ))
}

fn hello_on(conn: usize) -> impl Fn(&Received) -> bool {
    move |r| r.conn == conn && r.frame_type() == Some("hello")
}

#[tokio::test]
async fn helm_install_then_the_platforms_command_manages_it_end_to_end() {
    require_node();
    let client = client().await;
    let home = TestNamespace::new(&client, "helm").await;
    let ns = TestNamespace::new(&client, "helm-agents").await;
    let (ca, cert, key) = support::pki::test_pki_for(&[bridge_ip()]);

    // 1. Install: two replicas, unmanaged, watching the test's namespace, trusting the
    //    fake control plane's CA (an operator's choice made before going managed).
    //    The docs' command for an install from the chart's folder, then the bed's sets.
    let documented = doc_command(
        "helm install autonomic charts/autonomic",
        &[
            ("charts/autonomic", CHART),
            ("autonomic-system", &home.name),
        ],
    );
    let mut install: Vec<String> = documented.args().into_iter().map(String::from).collect();
    install.extend([
        "--set".into(),
        format!("manager.watchNamespaces={{{}}}", ns.name),
        "--set".into(),
        "manager.agentlet.image.registry=autonomic.test".into(),
        "--set".into(),
        "manager.agentlet.image.repository=agentlet".into(),
        "--set-string".into(),
        "manager.agentlet.image.tag=1".into(),
        "--set-file".into(),
        format!("manager.caBundle.pem={}", ca.display()),
    ]);
    // scripts/test loads the image under the chart's default name; a run beside others
    // on a shared test bed may load its own build under another.
    if let Ok(image) = std::env::var("AUTONOMIC_TEST_MANAGER_IMAGE") {
        let (repo, tag) = image.rsplit_once(':').unwrap();
        let (registry, repository) = repo.split_once('/').unwrap();
        for set in [
            format!("manager.image.registry={registry}"),
            format!("manager.image.repository={repository}"),
            format!("manager.image.tag={tag}"),
        ] {
            install.extend(["--set-string".into(), set]);
        }
    }
    let args: Vec<&str> = install.iter().map(String::as_str).collect();
    let notes = helm_in(&home.name, &args);
    assert!(
        notes.contains("`helm uninstall` keeps the CRDs and every Agent"),
        "the install notes do not say what uninstall keeps:\n{notes}"
    );
    let deployments: Api<Deployment> = home.api();
    let available = |n: i32| {
        move |d: &Deployment| {
            d.status.as_ref().is_some_and(|s| {
                s.available_replicas.unwrap_or(0) >= n && s.updated_replicas.unwrap_or(0) >= n
            })
        }
    };
    wait_for(
        &deployments,
        "autonomic-manager",
        "2 available",
        available(2),
    )
    .await;

    let agents: Api<Agent> = ns.api();
    let a: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: hello}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'trap \"exit 0\" TERM; while :; do sleep 1; done']}}}}"
    ));
    agents.create(&PostParams::default(), &a).await.unwrap();

    // 2. The platform's documented command, verbatim but for the chart's location and
    //    the base URL, with the token Secret created first, as its docs say.
    let cp = FakeCp::start_tls_on(bridge_ip(), &cert, &key).await;
    cp.set_token(Some(TOKEN_A));
    home.api::<Secret>()
        .create(&PostParams::default(), &token_secret(TOKEN_A))
        .await
        .unwrap();
    let base_url = format!("manager.baseURL={}", cp.url());
    let upgraded = Instant::now();
    helm_in(
        &home.name,
        &[
            "upgrade",
            "autonomic",
            CHART,
            "--reuse-values",
            "--set",
            "manager.managed=true",
            "--set",
            &base_url,
            "--set",
            "manager.authTokenSecret.name=autonomic-auth",
            "--set",
            "manager.authTokenSecret.key=token",
        ],
    );
    let hello = cp
        .wait_frame("hello from the in-cluster manager", hello_on(1))
        .await;
    let rolled = |d: &Deployment| {
        let s = d.status.as_ref();
        d.metadata.generation == s.and_then(|s| s.observed_generation)
            && s.is_some_and(|s| {
                s.replicas == Some(2)
                    && s.updated_replicas == Some(2)
                    && s.available_replicas == Some(2)
            })
    };
    cp.wait_frame("the first snapshot", |r| {
        r.conn == 1 && r.frame_type() == Some("snapshot")
    })
    .await;
    let to_online = upgraded.elapsed();
    wait_for(&deployments, "autonomic-manager", "rolled out", rolled).await;
    let hello = hello.json().unwrap().clone();
    // A stable cluster id: the uid of kube-system, not this pod's name.
    let kube_system = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap();
    assert_eq!(
        hello["cluster_id"].as_str(),
        kube_system.metadata.uid.as_deref()
    );
    let first_pod = hello["host"]["pod"].as_str().unwrap().to_owned();
    assert!(first_pod.starts_with("autonomic-manager-"), "{hello}");

    // The link's story on the leader's pod: `kubectl describe pod` shows the Event
    // (found by the pod's uid, which the chart passes as POD_UID), recorded through the
    // events Role the chart adds in the release namespace (only the test's namespace is
    // watched).
    let described = |pod: String, reason: &'static str| {
        let ns = home.name.clone();
        move || {
            let (pod, ns) = (pod.clone(), ns.clone());
            async move {
                let (ok, out) = kubectl(&["-n", &ns, "describe", "pod", &pod], None);
                ok && out
                    .split_once("\nEvents:")
                    .is_some_and(|(_, events)| events.contains(reason))
            }
        }
    };
    wait_until(
        "a Connected Event in kubectl describe of the leader's pod",
        described(first_pod.clone(), "Connected"),
    )
    .await;

    // 3. The platform's troubleshooting command, run literally: whichever replica it
    //    picks shows the connection (the standby repeats what the leader publishes).
    let log_command = ["logs", "deploy/autonomic-manager", "--tail=50"];
    wait_until("the log command to show the connection", || async {
        let (ok, out) = kubectl(
            &[&["-n", home.name.as_str()][..], &log_command[..]].concat(),
            None,
        );
        // "connected to …" as a phrase: "not connected to …" is the opposite.
        ok && out
            .lines()
            .any(|l| l.contains("connected to ") && !l.contains("not connected"))
    })
    .await;
    let pods: Api<Pod> = home.api();
    let running: Vec<String> = home
        .manager_pods()
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    // The leader logs "connected to the control plane" with the URL; the standby
    // "standby; the leader says: connected to <URL> (token …)".
    let wss = cp.url().replacen("https://", "wss://", 1);
    for pod in &running {
        wait_until(&format!("{pod}'s log to show the connection"), || async {
            let log = kubectl(&["-n", &home.name, "logs", pod.as_str()], None).1;
            log.lines()
                .any(|l| l.contains("connected to") && l.contains(&wss))
        })
        .await;
    }

    // 4. A shell into the Agent through the in-cluster manager (pods/exec with the
    //    chart's RBAC).
    reported(&cp, &ns.name, "hello", "Active").await;
    open(
        &cp,
        1,
        target(&ns.name, "hello"),
        Some(&["sh", "-c", "echo shell-through-$((40+2))"]),
        false,
    )
    .await;
    wait_output(&cp, 1, 1, "shell-through-42").await;
    let closed = cp
        .wait_frame("io_close on channel 1", frame_on("io_close", 1))
        .await;
    assert_eq!(closed.json().unwrap()["exit_code"], 0, "{closed:?}");

    // 5. The leader pod is deleted: it closes its connection and releases the Lease; the
    //    standby connects. Never two connections at once.
    let old_leader = lease_holder_pod(&home).await;
    assert_eq!(old_leader, first_pod);
    let deleted = Instant::now();
    pods.delete(&old_leader, &DeleteParams::default())
        .await
        .unwrap();
    let hello2 = cp.wait_frame("hello from the standby", hello_on(2)).await;
    let failover = deleted.elapsed();
    let second_pod = hello2.json().unwrap()["host"]["pod"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(second_pod, old_leader);
    assert_eq!(cp.max_connections(), 1);

    // 6. The token is rotated in the Secret, and the control plane revokes the old one.
    //    The manager backs off on the rejected schedule (minutes), but the new token on
    //    disk is used as soon as the kubelet refreshes the mounted Secret: no restart.
    cp.set_token(Some(TOKEN_B));
    let rotated = Instant::now();
    let (ok, out) = kubectl(
        &["-n", &home.name, "apply", "-f", "-"],
        Some(&serde_json::to_string(&token_secret(TOKEN_B)).unwrap()),
    );
    assert!(ok, "rotating the token Secret failed:\n{out}");
    cp.close(4001, "token revoked").await;
    let accepted_with_b = || {
        cp.requests().iter().any(|r| {
            r.status == 101 && r.headers.get("authorization") == Some(&format!("Bearer {TOKEN_B}"))
        })
    };
    wait_until("a connection with the rotated token", || async {
        accepted_with_b()
    })
    .await;
    let rotation = rotated.elapsed();
    cp.wait_frame("hello after the rotation", hello_on(3)).await;
    let pod = pods.get(&second_pod).await.unwrap();
    let restarts: i32 = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0, "the manager restarted to pick up the token");
    // The revocation is told on that pod too.
    wait_until(
        "a TokenRejected Event in kubectl describe of the leader's pod",
        described(second_pod.clone(), "TokenRejected"),
    )
    .await;
    assert_eq!(cp.max_connections(), 1);

    // 7. The preflight as docs/operations.md runs it: `kubectl exec` into the manager's pod (the
    //    image has no shell; the binary is the command), with the pod's own identity,
    //    configuration, mounted token and CA bundle. Every step passes, the last being
    //    the rotated token accepted by the control plane. (In the leader's pod: the
    //    kubelet refreshes each pod's copy of the Secret on its own schedule, and the
    //    standby's may still hold the revoked token, which check would rightly refuse.)
    let leader = format!("pod/{second_pod}");
    let (ok, out) = kubectl(
        &[
            "-n",
            &home.name,
            "exec",
            &leader,
            "--",
            "/autonomic-manager",
            "check",
        ],
        None,
    );
    assert!(ok, "check in the manager's pod failed:\n{out}");
    let lines: Vec<&str> = out.lines().collect();
    let steps: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.get(5..)?.split_once(": ").map(|(step, _)| step))
        .collect();
    assert_eq!(
        steps,
        [
            "configuration",
            "identity",
            "api server",
            "rbac",
            "crds",
            "dns",
            "connect",
            "tls",
            "websocket",
            "token"
        ],
        "{out}"
    );
    assert!(lines.iter().all(|l| l.starts_with("ok   ")), "{out}");
    assert!(
        lines[1].contains(&format!("ServiceAccount {}/autonomic-manager", home.name)),
        "{out}"
    );
    let prefix: String = TOKEN_B.chars().take(6).collect();
    assert_eq!(
        lines[9],
        format!("ok   token: accepted ({prefix}…)"),
        "{out}"
    );

    // 8. helm uninstall: the manager goes, the custom resources (and CRDs) stay.
    helm_in(&home.name, &["uninstall", "autonomic"]);
    wait_gone(&deployments, "autonomic-manager").await;
    assert!(agents.get_opt("hello").await.unwrap().is_some());

    let timings = serde_json::json!({
        "upgrade_to_snapshot_ms": to_online.as_millis() as u64,
        "leader_deleted_to_hello_ms": failover.as_millis() as u64,
        "secret_rotated_to_connection_ms": rotation.as_millis() as u64,
    });
    eprintln!("helm timings: {timings}");
    std::fs::write(log_dir().join("helm-timings.json"), timings.to_string()).unwrap();
}
