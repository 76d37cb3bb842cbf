//! `helm test`, the platform's "verify the pod": the chart's test hook runs
//! `autonomic-manager check` in a pod with the release's ServiceAccount, image and
//! configuration. On the bed, against the fake control plane over TLS with a private CA
//! given through `manager.caBundle`: a correct managed release passes (and the pod is
//! deleted); with a token the control plane refuses, `helm test` fails and the pod's log
//! holds the `check` line that names the token and says the fix.

mod support;

use tokio::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use support::fake_cp::FakeCp;
use support::*;

const GOOD: &str = "tok_live_verify_4b7e9d1c";
const WRONG: &str = "stale9_verify_0a2c4e6f";

fn token_secret(token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: autonomic-auth}}\nstringData: {{token: {token}}}"
    )
}

#[tokio::test]
async fn helm_test_passes_on_a_correct_release_and_names_a_wrong_token() {
    require_node();
    let client = client().await;
    let home = TestNamespace::new(&client, "helmtest").await;
    let agents = TestNamespace::new(&client, "helmtest-agents").await;
    let ip = bridge_ip();
    let (ca, cert, key) = support::pki::test_pki_for(&[ip]);
    let cp = FakeCp::start_tls_on(ip, &cert, &key).await;
    cp.set_token(Some(GOOD));
    home.api::<Secret>()
        .create(&PostParams::default(), &yaml(&token_secret(GOOD)))
        .await
        .unwrap();

    // A managed release (one replica is enough here) trusting the fake control plane's CA.
    let release = HelmRelease::new(&home.name, "autonomic");
    let mut install: Vec<String> = vec![
        "install".into(),
        "autonomic".into(),
        CHART.into(),
        "--set".into(),
        "manager.managed=true".into(),
        "--set".into(),
        format!("manager.baseURL={}", cp.url()),
        "--set".into(),
        format!("manager.watchNamespaces={{{}}}", agents.name),
        "--set".into(),
        "manager.replicas=1".into(),
        "--set-file".into(),
        format!("manager.caBundle.pem={}", ca.display()),
    ];
    install.extend(manager_image_sets());
    release.helm(&install.iter().map(String::as_str).collect::<Vec<_>>());
    let deployments: Api<Deployment> = home.api();
    wait_available(&deployments, 1).await;

    // 1. A correct release: `helm test` passes, the hook pod is deleted, and the check
    //    really dialled the control plane with the release's token.
    let started = Instant::now();
    let (ok, out) = release.try_helm(&["test", "autonomic", "--timeout", "120s"]);
    let passed_in = started.elapsed();
    assert!(ok, "helm test failed on a correct release:\n{out}");
    assert!(
        out.contains("autonomic-manager-check") && out.contains("Succeeded"),
        "{out}"
    );
    let pods: Api<Pod> = home.api();
    wait_gone(&pods, "autonomic-manager-check").await;
    assert!(
        cp.requests().iter().any(|r| {
            r.status == 101 && r.headers.get("authorization") == Some(&format!("Bearer {GOOD}"))
        }),
        "the check did not present the release's token"
    );

    // 2. A wrong token in the release's Secret: `helm test` fails, and the pod's log (left
    //    for reading; `helm test --logs` prints it too) names the token and the fix.
    let (ok, out) = kubectl(
        &["-n", &home.name, "apply", "-f", "-"],
        Some(&serde_json::to_string(&yaml::<Secret>(&token_secret(WRONG))).unwrap()),
    );
    assert!(ok, "replacing the token Secret failed:\n{out}");
    let started = Instant::now();
    let (ok, out) = release.try_helm(&["test", "autonomic", "--timeout", "120s", "--logs"]);
    let failed_in = started.elapsed();
    assert!(
        !ok,
        "helm test passed with a token the control plane refuses:\n{out}"
    );
    let prefix: String = WRONG.chars().take(6).collect();
    let named = |text: &str| {
        text.lines().any(|l| {
            l.starts_with("FAIL token: rejected (HTTP 40")
                && l.contains(&format!("for token {prefix}…"))
                && l.contains("fix:")
        })
    };
    assert!(
        named(&out),
        "helm test --logs does not show the token line:\n{out}"
    );
    let (ok, log) = kubectl(&["-n", &home.name, "logs", "autonomic-manager-check"], None);
    assert!(ok && named(&log), "the test pod's log:\n{log}");
    eprintln!("the test pod's log:\n{log}");
    assert!(
        !log.contains(WRONG),
        "the whole token is in the log:\n{log}"
    );

    // 3. helm uninstall takes the release; the failed test pod is a hook and stays (the
    //    docs say so) until the next `helm test` or its deletion.
    release.helm(&["uninstall", "autonomic"]);
    wait_gone(&deployments, "autonomic-manager").await;
    let (ok, out) = kubectl(
        &["-n", &home.name, "delete", "pod", "autonomic-manager-check"],
        None,
    );
    assert!(ok, "the failed test pod was not there to delete:\n{out}");

    let timings = serde_json::json!({
        "helm_test_pass_ms": passed_in.as_millis() as u64,
        "helm_test_fail_ms": failed_in.as_millis() as u64,
    });
    eprintln!("helm test timings: {timings}");
}
