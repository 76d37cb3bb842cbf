//! `deploy.yaml` against the real API server: admitted by a server-side dry run, and
//! applied for real with the image built from the project's Dockerfile, the manager runs
//! as a pod and reconciles an Agent.

mod support;

use std::process::Command;

use autonomic_manager::internals::{AgentletDefaults, agent_pod as desired_pod};

use autonomic_manager::crd::{Agent, AgentPhase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use support::*;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy.yaml");

const PDB_V1: &str = "apiVersion: policy/v1\nkind: PodDisruptionBudget";

/// deploy.yaml with its namespace renamed to `ns`, so tests neither need nor disturb
/// `autonomic-system`. deploy.yaml ships the PodDisruptionBudget as policy/v1 (what
/// Kubernetes >= 1.21 serves, and >= 1.25 only); for a server without it (the 1.20
/// test bed) it becomes policy/v1beta1, whose fields are the same.
fn manifest_in(ns: &str) -> String {
    manifest_of(DEPLOY, ns)
}

/// [`manifest_in`] for the shipped manifest `file`.
fn manifest_of(file: &str, ns: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains("namespace: autonomic-system"));
    assert!(text.contains(PDB_V1), "{file} lost its policy/v1 PDB");
    // Namespaced names and the cluster-scoped names derived from the namespace alike.
    let text = text.replace("autonomic-system", ns);
    let (ok, versions) = kubectl(&["api-versions"], None);
    assert!(ok, "kubectl api-versions: {versions}");
    if versions.lines().any(|l| l == "policy/v1") {
        text
    } else {
        text.replace(
            PDB_V1,
            "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget",
        )
    }
}

/// The documents of deploy.yaml, parsed.
fn deploy_documents() -> Vec<serde_json::Value> {
    documents(&std::fs::read_to_string(DEPLOY).unwrap())
}

/// deploy.yaml and deploy-managed.yaml are each admitted whole by the API server.
#[tokio::test]
async fn deploy_yaml_passes_a_server_side_dry_run() {
    let client = client().await;
    // A dry run creates nothing, so the namespaced objects need their namespace to exist.
    let ns = TestNamespace::new(&client, "dry-run").await;
    let managed = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy-managed.yaml");
    let (ok, out) = kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&manifest_of(managed, &ns.name)),
    );
    assert!(ok, "dry run of deploy-managed.yaml refused:\n{out}");
    for what in [
        &format!(
            "clusterrole.rbac.authorization.k8s.io/autonomic-manager-{}-cluster-id",
            ns.name
        ),
        "role.rbac.authorization.k8s.io/autonomic-manager-audit-outbox",
        "deployment.apps/autonomic-manager",
    ] {
        assert!(out.contains(what), "{what} missing from:\n{out}");
    }
    let (ok, out) = kubectl(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&manifest_in(&ns.name)),
    );
    assert!(ok, "dry run refused:\n{out}");
    assert!(
        !out.contains("cluster-id") && !out.contains("audit-outbox"),
        "{out}"
    );
    for what in [
        "customresourcedefinition.apiextensions.k8s.io/agents.autonomic.sh",
        "serviceaccount/autonomic-manager",
        "clusterrole.rbac.authorization.k8s.io/autonomic-manager-dry-run",
        "clusterrolebinding.rbac.authorization.k8s.io/autonomic-manager-dry-run",
        "role.rbac.authorization.k8s.io/autonomic-manager-leader-election",
        "rolebinding.rbac.authorization.k8s.io/autonomic-manager-leader-election",
        "poddisruptionbudget.policy/autonomic-manager",
        "deployment.apps/autonomic-manager",
        &format!("namespace/{}", ns.name),
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
    let _report = ReportOnPanic(vec![home.name.clone(), ns.name.clone()]);
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
    // scripts/test loads the image under deploy.yaml's name; a run beside others on a
    // shared test bed may load its own build under another name.
    let manifest = match std::env::var("AUTONOMIC_TEST_MANAGER_IMAGE") {
        Ok(image) => manifest.replace("ghcr.io/autonomic-sh/autonomic-manager:0.1.0", &image),
        Err(_) => manifest,
    };
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&manifest));
    assert!(ok, "apply failed:\n{out}");

    // Both replicas become ready: the standby too, though it never reconciles.
    let deployments: Api<Deployment> = home.api();
    wait_available(&deployments, 2).await;
    // One of them holds the Lease in its own namespace.
    let pods: Vec<String> = Api::<Pod>::namespaced(client.clone(), &home.name)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let leader = lease_holder_pod(&home).await;
    assert!(
        pods.contains(&leader),
        "the Lease holder {leader:?} is none of the pods {pods:?}"
    );

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

    // The line is written once the status patch returns, then passes through the
    // container runtime's log file: ask until it shows.
    let json_line = |logs: &str| {
        logs.lines()
            .any(|l| l.starts_with('{') && l.contains("\"phase\":\"Active\""))
    };
    wait_until("a JSON log line saying Active", || async {
        json_line(&kubectl(&["-n", &home.name, "logs", &leader], None).1)
    })
    .await;
}

/// A PodSecurityPolicy encoding the restricted Pod Security Standard, as far as PSP
/// can: Kubernetes 1.20 has no PodSecurity admission, so the namespace label
/// `pod-security.kubernetes.io/enforce: restricted` is inert there; PSP admission is
/// the 1.20 mechanism that refuses pods. (PSP also mutates: a missing field can be
/// filled in rather than refused, so the test also checks nothing was filled in.)
const RESTRICTED_PSP: &str = r#"
apiVersion: policy/v1beta1
kind: PodSecurityPolicy
metadata:
  name: restricted
  annotations:
    seccomp.security.alpha.kubernetes.io/allowedProfileNames: runtime/default
spec:
  privileged: false
  allowPrivilegeEscalation: false
  defaultAllowPrivilegeEscalation: false
  requiredDropCapabilities: ["ALL"]
  volumes: [configMap, emptyDir, projected, secret, downwardAPI, csi, persistentVolumeClaim, ephemeral]
  hostNetwork: false
  hostIPC: false
  hostPID: false
  runAsUser: {rule: MustRunAsNonRoot}
  seLinux: {rule: RunAsAny}
  # The restricted Pod Security Standard does not constrain groups.
  supplementalGroups: {rule: RunAsAny}
  fsGroup: {rule: RunAsAny}
"#;

/// An apiserver-only test bed of its own (etcd + kube-apiserver with PodSecurityPolicy
/// admission) on free ports; taken down on drop.
struct PrivateBed {
    dir: String,
    env: Vec<(&'static str, String)>,
}

impl PrivateBed {
    fn up(extra_apiserver_args: &str) -> PrivateBed {
        let ports: Vec<u16> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect::<Vec<_>>()
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let dir = format!("/tmp/autonomic-psp-bed-{}", ports[0]);
        let env = vec![
            ("AUTONOMIC_TESTBED_DIR", dir.clone()),
            ("AUTONOMIC_TESTBED_APISERVER_PORT", ports[0].to_string()),
            ("AUTONOMIC_TESTBED_ETCD_PORT", ports[1].to_string()),
            ("AUTONOMIC_TESTBED_ETCD_PEER_PORT", ports[2].to_string()),
            (
                "AUTONOMIC_TESTBED_APISERVER_ARGS",
                extra_apiserver_args.into(),
            ),
        ];
        let bed = PrivateBed { dir, env };
        let out = bed.cluster(&["up", "--apiserver-only"]);
        assert!(
            out.status.success(),
            "private test bed did not start:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bed
    }

    fn cluster(&self, args: &[&str]) -> std::process::Output {
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/testbed/cluster.sh"))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(std::process::Stdio::null())
            .output()
            .expect("testbed/cluster.sh")
    }

    /// kubectl against this bed.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let kubeconfig = format!("--kubeconfig={}/kubeconfig", self.dir);
        let mut all = vec![kubeconfig.as_str()];
        all.extend_from_slice(args);
        kubectl(&all, stdin)
    }
}

impl Drop for PrivateBed {
    fn drop(&mut self) {
        let _ = self.cluster(&["down"]);
        // cluster.sh serialises up/down on a lock file beside the state dir.
        let _ = std::fs::remove_file(format!("{}.lock", self.dir));
    }
}

#[tokio::test]
async fn pod_template_is_admitted_by_a_restricted_pod_security_policy() {
    // The pod the Deployment would create, built from deploy.yaml's template.
    let deployment = deploy_documents()
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment in deploy.yaml");
    let template = &deployment["spec"]["template"];
    let ns = "restricted";
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "manager", "namespace": ns, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    });
    let namespace = deploy_documents()
        .into_iter()
        .find(|d| d["kind"] == "Namespace")
        .expect("a Namespace in deploy.yaml");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
        "deploy.yaml's namespace must enforce the restricted Pod Security Standard"
    );

    let bed = PrivateBed::up("--enable-admission-plugins PodSecurityPolicy");
    // Only the restricted policy is usable, and only by the manager's ServiceAccount.
    let setup = format!(
        r#"{RESTRICTED_PSP}
---
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
  labels: {{pod-security.kubernetes.io/enforce: restricted}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: manager-pods, namespace: {ns}}}
rules:
  - {{apiGroups: [""], resources: [pods], verbs: [create]}}
  - {{apiGroups: [policy], resources: [podsecuritypolicies], resourceNames: [restricted], verbs: [use]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: manager-pods, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: manager-pods}}
subjects: [{{kind: ServiceAccount, name: autonomic-manager, namespace: {ns}}}]
"#
    );
    let (ok, out) = bed.kubectl(&["apply", "-f", "-"], Some(&setup));
    assert!(ok, "setup refused:\n{out}");
    let service_account = format!("--as=system:serviceaccount:{ns}:autonomic-manager");
    let create = |pod: &serde_json::Value| {
        bed.kubectl(
            &[
                "create",
                "--dry-run=server",
                "-o",
                "json",
                &service_account,
                "-f",
                "-",
            ],
            Some(&pod.to_string()),
        )
    };

    let (ok, out) = create(&pod);
    assert!(ok, "the pod template was refused:\n{out}");
    let admitted: serde_json::Value = serde_json::from_str(&out).expect("the admitted pod");
    assert_eq!(
        admitted["metadata"]["annotations"]["kubernetes.io/psp"], "restricted",
        "not admitted by the restricted policy: {admitted:#}"
    );
    // Admitted as written: the policy had nothing to fill in.
    assert_eq!(
        admitted["spec"]["securityContext"],
        pod["spec"]["securityContext"]
    );
    assert_eq!(
        admitted["spec"]["containers"][0]["securityContext"],
        pod["spec"]["containers"][0]["securityContext"]
    );

    // The pods the manager creates, built by its own code with its defaults and created
    // as its ServiceAccount: an Agent's (agentlet + runtime) and a Tool's.
    let agent: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: a, namespace: {ns}, uid: u1}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}'}}}}"
    ));
    let resources = autonomic_manager::config::default_agentlet_resources();
    let agentlet = AgentletDefaults {
        image: Some(AGENTLET_IMAGE),
        resources: &resources,
    };
    let tool: autonomic_manager::crd::Tool = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Tool\nmetadata: {{name: t, namespace: {ns}, uid: u2}}\nspec: {{image: '{BUSYBOX_IMAGE}'}}"
    ));
    let made = [
        ("Agent", desired_pod(&agent, None, &agentlet).unwrap()),
        ("Tool", autonomic_manager::internals::tool_pod(&tool)),
    ];
    for (kind, made_pod) in &made {
        let made_pod = serde_json::to_value(made_pod).unwrap();
        let (ok, out) = create(&made_pod);
        assert!(ok, "the manager's {kind} pod was refused:\n{out}");
        let admitted: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            admitted["metadata"]["annotations"]["kubernetes.io/psp"], "restricted",
            "{kind} pod"
        );
        for (i, c) in made_pod["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            assert_eq!(
                admitted["spec"]["containers"][i]["securityContext"], c["securityContext"],
                "{kind} pod: the policy changed container {}",
                c["name"]
            );
        }
    }
    // A Runtime that asks for root says so explicitly, and a restricted namespace refuses it.
    let root: autonomic_manager::crd::Runtime = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: root, namespace: {ns}}}\nspec: {{image: '{BUSYBOX_IMAGE}', securityContext: {{runAsUser: 0}}}}"
    ));
    let root_pod = desired_pod(&agent, Some(&root), &agentlet).unwrap();
    let (ok, out) = create(&serde_json::to_value(&root_pod).unwrap());
    assert!(
        !ok,
        "a root runtime was admitted under the restricted policy"
    );
    assert!(
        out.contains("PodSecurityPolicy: unable to admit pod"),
        "{out}"
    );

    // Negative controls: each single violation is refused, so the check above can fail.
    type Violate = fn(&mut serde_json::Value);
    let violations: [(&str, Violate); 6] = [
        ("root user", |p| {
            p["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0.into()
        }),
        ("privileged", |p| {
            p["spec"]["containers"][0]["securityContext"]["privileged"] = true.into()
        }),
        ("privilege escalation", |p| {
            p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true.into()
        }),
        ("added capability", |p| {
            p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                serde_json::json!(["NET_RAW"])
        }),
        ("unconfined seccomp", |p| {
            p["spec"]["securityContext"]["seccompProfile"] =
                serde_json::json!({"type": "Unconfined"})
        }),
        ("host network", |p| p["spec"]["hostNetwork"] = true.into()),
    ];
    for (what, violate) in violations {
        let mut bad = pod.clone();
        violate(&mut bad);
        let (ok, out) = create(&bad);
        assert!(!ok, "a pod with {what} was admitted");
        assert!(
            out.contains("PodSecurityPolicy: unable to admit pod"),
            "{what}: refused for another reason:\n{out}"
        );
    }
}
