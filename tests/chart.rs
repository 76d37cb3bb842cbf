//! The chart as `helm` renders it: deploy.yaml is its default rendering, mistyped values
//! fail at install time, and the values an operator sets land where they should.

mod support;

use std::process::Command;

use serde_json::Value;
use support::*;

fn kinds<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn deployment(docs: &[Value]) -> &Value {
    kinds(docs, "Deployment")[0]
}

fn env<'a>(docs: &'a [Value], name: &str) -> Option<&'a Value> {
    deployment(docs)["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
}

fn sets(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

#[test]
fn deploy_yaml_is_the_chart_rendered_with_default_values() {
    let rendered = run_ok(
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gen-deploy")).arg("--stdout"),
    );
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy.yaml")).unwrap();
    assert!(
        rendered == shipped,
        "deploy.yaml drifted from charts/autonomic: run scripts/gen-deploy and commit the result"
    );
    // And it is a whole install: CRDs, identity, RBAC, the Deployment.
    let docs = documents(&shipped);
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "Deployment",
    ] {
        assert!(!kinds(&docs, kind).is_empty(), "no {kind} in deploy.yaml");
    }
    assert_eq!(kinds(&docs, "CustomResourceDefinition").len(), 4);
}

#[test]
fn mistyped_values_fail_at_install_time() {
    for (bad, says) in [
        ("manager.managd=true", "additional properties 'managd'"),
        ("manager.managed=yes", "/manager/managed"),
        ("manager.replicas=0", "/manager/replicas"),
        ("manager.baseURL=exo.example.com", "/manager/baseURL"),
        ("manager.transport=grpc", "/manager/transport"),
        ("manager.log.format=xml", "/manager/log/format"),
        ("manager.image.digest=latest", "/manager/image/digest"),
        (
            "manager.watchNamespaces[0]=Not_A_Namespace",
            "/manager/watchNamespaces/0",
        ),
        (
            "manager.authTokenSecret.nam=x",
            "additional properties 'nam'",
        ),
    ] {
        let out = Command::new(helm())
            .args(["template", "autonomic", CHART, "--set", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} was accepted");
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn the_platforms_values_configure_managed_mode_with_the_token_as_a_file() {
    let docs = documents(&render_chart(
        "autonomic-system",
        &sets(&[
            "manager.managed=true",
            "manager.baseURL=https://exo.example.com",
            "manager.authTokenSecret.name=autonomic-auth",
            "manager.authTokenSecret.key=token",
        ]),
    ));
    assert_eq!(env(&docs, "AUTONOMIC_MANAGED").unwrap()["value"], "true");
    assert_eq!(
        env(&docs, "AUTONOMIC_BASE_URL").unwrap()["value"],
        "https://exo.example.com"
    );
    // Never an environment variable: a file the kubelet refreshes.
    assert!(env(&docs, "AUTONOMIC_AUTH_TOKEN").is_none());
    let file = env(&docs, "AUTONOMIC_AUTH_TOKEN_FILE").unwrap()["value"]
        .as_str()
        .unwrap();
    let pod = &deployment(&docs)["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "auth")
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "autonomic-auth");
    assert_eq!(volume["secret"]["optional"], true);
    assert_eq!(volume["secret"]["items"][0]["key"], "token");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "auth")
        .unwrap();
    let mount_path = mount["mountPath"].as_str().unwrap();
    assert_eq!(
        file,
        format!(
            "{mount_path}/{}",
            volume["secret"]["items"][0]["path"].as_str().unwrap()
        )
    );
    // No cluster id pinned: the manager reads the kube-system namespace's uid.
    assert!(env(&docs, "AUTONOMIC_CLUSTER_ID").is_none());
}

#[test]
fn watched_namespaces_get_roles_and_no_cluster_wide_workload_access() {
    let docs = documents(&render_chart(
        "autonomic-system",
        &sets(&["manager.watchNamespaces={team-a,team-b}"]),
    ));
    let roles = kinds(&docs, "Role");
    let namespaces: Vec<&str> = roles
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, ["team-a", "team-b", "autonomic-system"]);
    // The one ClusterRole left reads one namespace by name, for the cluster id.
    let cluster_roles = kinds(&docs, "ClusterRole");
    assert_eq!(cluster_roles.len(), 1);
    assert_eq!(
        cluster_roles[0]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}])
    );
    assert_eq!(
        env(&docs, "AUTONOMIC_NAMESPACES").unwrap()["value"],
        "team-a,team-b"
    );
    // Exec is granted as the API server authorizes a WebSocket exec (GET), and as newer
    // servers also check it (create).
    let exec = roles[0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == serde_json::json!(["pods/exec"]))
        .expect("a pods/exec rule");
    assert_eq!(exec["verbs"], serde_json::json!(["get", "create"]));
}

#[test]
fn images_follow_the_registry_override_and_digests() {
    let image = |docs: &[Value]| {
        deployment(docs)["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let docs = documents(&render_chart("x", &[]));
    assert_eq!(image(&docs), "ghcr.io/autonomic-sh/autonomic-manager:0.1.0");
    let digest = format!("sha256:{}", "a".repeat(64));
    let docs = documents(&render_chart(
        "x",
        &sets(&[
            "global.imageRegistry=mirror.internal:5000",
            &format!("manager.image.digest={digest}"),
        ]),
    ));
    assert_eq!(
        image(&docs),
        format!("mirror.internal:5000/autonomic-sh/autonomic-manager@{digest}")
    );
    assert_eq!(
        env(&docs, "AUTONOMIC_AGENTLET_IMAGE").unwrap()["value"],
        "mirror.internal:5000/autonomic-sh/agentlet:0.1.0"
    );
}

#[test]
fn proxy_ca_and_scheduling_values_reach_the_pod() {
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
    let docs = documents(&render_chart(
        "x",
        &sets(&[
            "manager.proxy.httpsProxy=http://proxy.internal:3128",
            "manager.proxy.noProxy=.svc\\,10.0.0.0/8",
            &format!("manager.caBundle.pem={pem}"),
            "manager.priorityClassName=system-cluster-critical",
            "manager.nodeSelector.kubernetes\\.io/arch=arm64",
            "manager.networkPolicy.enabled=true",
            "manager.podMonitor.enabled=true",
        ]),
    ));
    assert_eq!(
        env(&docs, "HTTPS_PROXY").unwrap()["value"],
        "http://proxy.internal:3128"
    );
    assert_eq!(env(&docs, "NO_PROXY").unwrap()["value"], ".svc,10.0.0.0/8");
    let ca = kinds(&docs, "ConfigMap")[0];
    assert!(ca["data"]["ca.crt"].as_str().unwrap().contains("MIIB"));
    assert_eq!(
        env(&docs, "AUTONOMIC_CA_FILE").unwrap()["value"],
        "/etc/autonomic/ca/ca.crt"
    );
    let pod = &deployment(&docs)["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["nodeSelector"]["kubernetes.io/arch"], "arm64");
    assert_eq!(kinds(&docs, "NetworkPolicy").len(), 1);
    assert_eq!(kinds(&docs, "PodMonitor").len(), 1);
}
