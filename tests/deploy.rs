//! `deploy.yaml` against the real API server: admitted by a server-side dry run, and
//! applied for real with the image built from the project's Dockerfile, the manager runs
//! as a pod and reconciles an Agent.

mod support;

use std::process::Command;

use autonomic_manager::crd::{Agent, AgentPhase};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use support::*;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy.yaml");

fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl on PATH");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// deploy.yaml with its namespace renamed to `ns`, so tests neither need nor disturb
/// `autonomic-system`.
fn manifest_in(ns: &str) -> String {
    let text = std::fs::read_to_string(DEPLOY).unwrap();
    assert!(text.contains("namespace: autonomic-system"));
    text.replace("name: autonomic-system\n", &format!("name: {ns}\n"))
        .replace("namespace: autonomic-system", &format!("namespace: {ns}"))
}

#[tokio::test]
async fn deploy_yaml_passes_a_server_side_dry_run() {
    let client = client().await;
    // A dry run creates nothing, so the namespaced objects need their namespace to exist.
    let ns = TestNamespace::new(&client, "dry-run").await;
    let (ok, out) = kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&manifest_in(&ns.name)),
    );
    assert!(ok, "dry run refused:\n{out}");
    for what in [
        "customresourcedefinition.apiextensions.k8s.io/agents.autonomic.sh",
        "serviceaccount/autonomic-manager",
        "clusterrole.rbac.authorization.k8s.io/autonomic-manager",
        "clusterrolebinding.rbac.authorization.k8s.io/autonomic-manager",
        "deployment.apps/autonomic-manager",
    ] {
        assert!(out.contains(what), "{what} missing from:\n{out}");
    }
}

#[tokio::test]
async fn manager_runs_as_a_pod_from_deploy_yaml() {
    require_node();
    let client = client().await;
    let home = TestNamespace::new(&client, "in-cluster").await;
    let ns = TestNamespace::new(&client, "in-cluster-agents").await;
    // The in-cluster manager watches only the test's namespace, so it does not race the
    // managers other tests start.
    let knob = "name: AUTONOMIC_NAMESPACES\n              value: \"\"";
    let manifest = manifest_in(&home.name);
    assert!(
        manifest.contains(knob),
        "deploy.yaml lost its AUTONOMIC_NAMESPACES knob"
    );
    let manifest = manifest
        .replace(
            knob,
            &format!(
                "name: AUTONOMIC_NAMESPACES\n              value: \"{}\"",
                ns.name
            ),
        )
        .replace("ghcr.io/autonomic-sh/agentlet:0.1.0", AGENTLET_IMAGE);
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&manifest));
    assert!(ok, "apply failed:\n{out}");

    let deployments: Api<Deployment> = home.api();
    wait_for(&deployments, "autonomic-manager", "available", |d| {
        d.status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0)
            >= 1
    })
    .await;

    let agents: Api<Agent> = ns.api();
    let a: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: hello}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'trap \"exit 0\" TERM; while :; do sleep 1; done']}}}}"
    ));
    agents.create(&PostParams::default(), &a).await.unwrap();
    let a = wait_for(&agents, "hello", "Active", |a| {
        a.status.as_ref().and_then(|s| s.phase) == Some(AgentPhase::Active)
    })
    .await;
    assert_eq!(a.status.unwrap().observed_generation, a.metadata.generation);

    let (_, logs) = kubectl(
        &["-n", &home.name, "logs", "deployment/autonomic-manager"],
        None,
    );
    assert!(
        logs.lines()
            .any(|l| l.starts_with('{') && l.contains("\"phase\":\"Active\"")),
        "json logs expected:\n{logs}"
    );
}
