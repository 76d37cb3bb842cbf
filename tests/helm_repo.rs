//! The platform's install path, literally: the docs' own commands (read from README.md,
//! `docs/` and the chart's README by `support::docs`, placeholders filled), in the order
//! a user runs them. `scripts/chart-repo … --url` writes a chart repository, served here
//! on loopback by a tiny static HTTP server; `helm repo add exo …` (with a private Helm
//! configuration and cache), `helm install autonomic exo/autonomic`, the namespace's Pod
//! Security label, then the platform's commands (the token Secret, `helm upgrade …
//! --reuse-values --set manager.managed=true …`, `kubectl … logs
//! deploy/autonomic-manager --tail=50`) against the fake control plane over TLS with a
//! private CA given through the chart's `caBundle`; the log command shows `connected`
//! (the time it took is written to `target/test-logs/helm-repo-timings.json`; the 10 s
//! goal is a benchmark's); `helm test`, and `check` run in the manager's pod. The release
//! lives in `autonomic-system`, as the commands say (no other test of the suite uses that
//! namespace); a leftover from an interrupted run is removed first.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams};
use support::docs::doc_command;
use support::fake_cp::FakeCp;
use support::*;

const NS: &str = "autonomic-system";
const TOKEN: &str = "tok_live_repo_5e1f9a3c7b";

/// Serves the files of `dir` over HTTP on 127.0.0.1 (a static web host, as a chart
/// repository needs no more); its port. One thread, one request per connection.
fn serve(dir: PathBuf) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let name = path.trim_start_matches('/');
            let file = (!name.is_empty() && !name.contains("..") && !name.contains('/'))
                .then(|| std::fs::read(dir.join(name)).ok())
                .flatten();
            let _ = match file {
                Some(body) => stream
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .and_then(|_| stream.write_all(&body)),
                None => stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                ),
            };
        }
    });
    port
}

/// `autonomic-system`, deleted on drop (and before the test, if an interrupted run left it).
struct SystemNamespace;

impl SystemNamespace {
    async fn fresh(client: &kube::Client) -> Self {
        let api: Api<Namespace> = Api::all(client.clone());
        if api.get_opt(NS).await.unwrap().is_some() {
            let _ = Command::new(helm())
                .args(["uninstall", "autonomic", "-n", NS, "--ignore-not-found"])
                .output();
            let _ = api.delete(NS, &DeleteParams::background()).await;
            wait_gone(&api, NS).await;
        }
        SystemNamespace
    }
}

impl Drop for SystemNamespace {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "namespace", NS, "--wait=false"], None);
    }
}

#[tokio::test]
async fn the_platforms_commands_from_a_chart_repository_connect() {
    require_node();
    let client = client().await;
    let _system = SystemNamespace::fresh(&client).await;
    let agents = TestNamespace::new(&client, "repo-agents").await;
    let (ca, cert, key) = support::pki::test_pki_for(&[bridge_ip()]);

    // The repository, as a static host serves it.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let work = log_dir().join(format!("helm-repo-{}-{nanos:x}", std::process::id()));
    let repo = work.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let port = serve(repo.clone());
    let repo_url = format!("http://127.0.0.1:{port}");
    let public = format!("{}/", repo.display());
    // Every command below is the docs' own (support::docs), placeholders filled.
    let urls = [
        ("https://charts.example.com", repo_url.as_str()),
        ("<chart repository URL>", repo_url.as_str()),
        ("public/", public.as_str()),
    ];
    run_ok(&mut doc_command("scripts/chart-repo public/ --url", &urls).command());
    let index = std::fs::read_to_string(work.join("repo/index.yaml")).unwrap();
    assert!(
        index.contains(&format!("{repo_url}/autonomic-")),
        "--url is not in the index's chart URLs:\n{index}"
    );
    let home = |dir: &str| work.join(dir).display().to_string();
    let release = HelmRelease::new(NS, "autonomic")
        .with_env("HELM_REPOSITORY_CONFIG", &home("config/repositories.yaml"))
        .with_env("HELM_REPOSITORY_CACHE", &home("cache/repository"))
        .with_env("HELM_CACHE_HOME", &home("cache"))
        .with_env("HELM_CONFIG_HOME", &home("config"))
        .with_env("HELM_DATA_HOME", &home("data"));

    // An unreachable repository: Helm's own error, and nothing added.
    let (ok, out) = release.try_helm(&["repo", "add", "nowhere", "http://127.0.0.1:9/"]);
    assert!(!ok && out.contains("cannot be reached"), "{out}");

    let added = Instant::now();
    release.helm(&doc_command("helm repo add exo", &urls).args());
    let listed = release.helm(&["search", "repo", "exo/autonomic"]);
    assert!(listed.contains("exo/autonomic"), "{listed}");

    // 1. Install from the repository (unmanaged), with the operator's choices made before
    //    going managed: the namespace it watches, the agentlet image of the bed, and
    //    trust in the control plane's private CA.
    let mut install: Vec<String> = doc_command("helm install autonomic exo/autonomic", &[])
        .args()
        .into_iter()
        .map(String::from)
        .collect();
    install.push("--set".into());
    install.push(format!("manager.watchNamespaces={{{}}}", agents.name));
    install.extend(
        [
            "--set",
            "manager.agentlet.image.registry=autonomic.test",
            "--set",
            "manager.agentlet.image.repository=agentlet",
            "--set-string",
            "manager.agentlet.image.tag=1",
            "--set-file",
        ]
        .map(String::from),
    );
    install.push(format!("manager.caBundle.pem={}", ca.display()));
    install.extend(manager_image_sets());
    release.helm(&install.iter().map(String::as_str).collect::<Vec<_>>());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    wait_for(&deployments, "autonomic-manager", "2 available", |d| {
        d.status
            .as_ref()
            .is_some_and(|s| s.available_replicas.unwrap_or(0) >= 2)
    })
    .await;
    // The docs' Pod Security step: the manager's own pods already meet `restricted`, so
    // the API server, which checks the running pods against the new level, warns of none.
    let (ok, out) = kubectl(
        &doc_command("kubectl label namespace autonomic-system", &[]).args(),
        None,
    );
    assert!(ok && !out.contains("Warning"), "{out}");

    // 2. The platform's commands, word for word but for the token and the base URL.
    let cp = FakeCp::start_tls_on(bridge_ip(), &cert, &key).await;
    cp.set_token(Some(TOKEN));
    let cp_url = cp.url();
    let platform = [
        ("<token>", TOKEN),
        ("<your-deployment-token>", TOKEN),
        ("https://exo.example.com", cp_url.as_str()),
    ];
    let secret = doc_command(
        "kubectl -n autonomic-system create secret generic autonomic-auth",
        &platform,
    );
    let (ok, out) = kubectl(&secret.args(), None);
    assert!(ok, "{out}");
    // The CRDs first, as the docs' upgrade section says (Helm never upgrades them).
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/autonomic/crds/");
    let apply = doc_command(
        "kubectl apply --server-side -f charts/autonomic/crds/",
        &[("charts/autonomic/crds/", crds)],
    );
    let (ok, out) = kubectl(&apply.args(), None);
    assert!(ok, "{out}");
    let upgraded = Instant::now();
    release.helm(&doc_command("helm upgrade autonomic exo/autonomic", &platform).args());
    let upgrade_returned = upgraded.elapsed();
    let wss = cp.url().replacen("https://", "wss://", 1);
    let logs = doc_command(
        "kubectl -n autonomic-system logs deploy/autonomic-manager",
        &[],
    );
    let connected = loop {
        let (ok, out) = kubectl(&logs.args(), None);
        // The leader's "connected to the control plane" (its URL a field), or the
        // standby's "the leader says: connected to wss://…"; never "not connected to …".
        let line = out.lines().find(|l| {
            l.contains("connected to") && !l.contains("not connected") && l.contains(&wss)
        });
        if let (true, Some(line)) = (ok, line) {
            eprintln!("the log command shows: {line}");
            break upgraded.elapsed();
        }
        assert!(
            upgraded.elapsed() < Duration::from_secs(60),
            "no `connected` in the log command's output 60 s after the upgrade:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let repo_add_to_connected = added.elapsed();
    let timings = serde_json::json!({
        "upgrade_returned_ms": upgrade_returned.as_millis() as u64,
        "upgrade_to_connected_log_ms": connected.as_millis() as u64,
        "repo_add_to_connected_log_ms": repo_add_to_connected.as_millis() as u64,
    });
    eprintln!("chart repository timings: {timings}");
    std::fs::write(
        log_dir().join("helm-repo-timings.json"),
        timings.to_string(),
    )
    .unwrap();
    // The bound (10 s) is a timing goal: it lives in BENCHMARKS.md, not in this
    // test (a loaded machine running the whole suite at once would make it flaky). Seen
    // on the 2-core bed alone: 3.5 s since a managed standby is ready without the lists
    // the first snapshot does not need. The test holds that it connects at all, from the
    // repository, with the platform's commands.
    cp.wait_frame("the first snapshot", |r| r.frame_type() == Some("snapshot"))
        .await;

    // 3. Verify the pod, as the platform's dashboard says: `helm test`; and the docs'
    //    troubleshooting step, `check` inside the running manager.
    let (ok, out) = release.try_helm(&doc_command("helm test autonomic", &[]).args());
    assert!(ok, "helm test failed:\n{out}");
    let check = doc_command(
        "kubectl -n autonomic-system exec deploy/autonomic-manager",
        &[],
    );
    let (ok, out) = kubectl(&check.args(), None);
    assert!(ok, "check in the running manager failed:\n{out}");
    eprintln!("check in the running manager:\n{out}");

    // 4. helm uninstall leaves no object of the chart's: none in the namespace but what
    //    the docs say stays (the token Secret, the manager's Lease and audit outbox), and
    //    no cluster-wide RBAC of the release.
    release.helm(&["uninstall", "autonomic"]);
    wait_gone(&deployments, "autonomic-manager").await;
    let (ok, out) = kubectl(
        &[
            "get",
            "clusterroles,clusterrolebindings",
            "-l",
            "app.kubernetes.io/instance=autonomic",
            "-o",
            "name",
        ],
        None,
    );
    assert!(
        ok && !out.contains(&format!("-{NS}")),
        "cluster-wide RBAC left behind:\n{out}"
    );
    // The Deployment's ReplicaSets and pods go by garbage collection, a moment later.
    let left = || {
        kubectl(
            &[
                "-n",
                NS,
                "get",
                "all,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
                "-l",
                "app.kubernetes.io/instance=autonomic",
                "-o",
                "name",
            ],
            None,
        )
    };
    wait_until(
        "nothing of the release left in autonomic-system",
        || async {
            let (ok, out) = left();
            ok && out.trim().is_empty()
        },
    )
    .await;
}
