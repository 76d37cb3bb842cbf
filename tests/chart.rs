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

/// deploy.yaml (unmanaged) and deploy-managed.yaml are the chart rendered with its
/// default values, the second with manager.managed=true; each a whole install, and they
/// differ only by managed mode and the grants it brings (TRUST.md §6).
#[test]
fn deploy_yaml_is_the_chart_rendered_with_default_values() {
    let gen_deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gen-deploy");
    let shipped = |file: &str| {
        std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    };
    let unmanaged = shipped("deploy.yaml");
    let managed = shipped("deploy-managed.yaml");
    assert!(
        run_ok(Command::new(gen_deploy).arg("--stdout")) == unmanaged
            && run_ok(Command::new(gen_deploy).args(["--stdout", "managed"])) == managed,
        "deploy.yaml or deploy-managed.yaml drifted from charts/autonomic: run scripts/gen-deploy and commit the result"
    );
    let grants = |text: &str| feature_grants(&documents(text));
    assert_eq!(grants(&unmanaged), []);
    assert_eq!(
        grants(&managed).iter().map(|(f, _)| *f).collect::<Vec<_>>(),
        ["cluster-id", "delete", "exec", "outbox", "patch"]
    );
    assert_eq!(
        env(&documents(&unmanaged), "AUTONOMIC_MANAGED").unwrap()["value"],
        "false"
    );
    assert_eq!(
        env(&documents(&managed), "AUTONOMIC_MANAGED").unwrap()["value"],
        "true"
    );
    // And each is a whole install: CRDs, identity, RBAC, the Deployment.
    for shipped in [unmanaged, managed] {
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
}

/// charts/autonomic/README.md is what scripts/gen-chart-readme writes from the chart
/// (values.yaml, values.schema.json, the Deployment's security context), so its values
/// table cannot drift; and the images Chart.yaml announces to Artifact Hub are the ones
/// the chart renders by default.
#[test]
fn chart_readme_and_artifact_hub_metadata_are_the_charts_own() {
    let root = env!("CARGO_MANIFEST_DIR");
    let generated =
        run_ok(Command::new(format!("{root}/scripts/gen-chart-readme")).arg("--stdout"));
    let committed = std::fs::read_to_string(format!("{CHART}/README.md")).unwrap();
    assert!(
        generated == committed,
        "charts/autonomic/README.md drifted from the chart: run scripts/gen-chart-readme and commit the result"
    );
    // Every value of values.yaml has its row (or is inside a map that has one).
    let values = std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap();
    for key in [
        "managed",
        "baseURL",
        "caBundle",
        "watchNamespaces",
        "prometheusRule",
    ] {
        assert!(
            values.contains(&format!("  {key}:"))
                && committed.contains(&format!("| `manager.{key}")),
            "no row for manager.{key}"
        );
    }
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap())
            .unwrap();
    let annotations = &chart["annotations"];
    for key in [
        "artifacthub.io/images",
        "artifacthub.io/crds",
        "artifacthub.io/license",
        "artifacthub.io/containsSecurityUpdates",
    ] {
        assert!(annotations[key].is_string(), "Chart.yaml has no {key}");
    }
    let announced: Vec<Value> =
        serde_saphyr::from_str(annotations["artifacthub.io/images"].as_str().unwrap()).unwrap();
    let announced: Vec<&str> = announced
        .iter()
        .map(|i| i["image"].as_str().unwrap())
        .collect();
    let docs = documents(&render_chart("autonomic-system", &[]));
    let manager = deployment(&docs)["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap();
    let agentlet = env(&docs, "AUTONOMIC_AGENTLET_IMAGE").unwrap()["value"]
        .as_str()
        .unwrap();
    assert_eq!(announced, [manager, agentlet]);
    let crds: Vec<Value> =
        serde_saphyr::from_str(annotations["artifacthub.io/crds"].as_str().unwrap()).unwrap();
    let mut names: Vec<&str> = crds.iter().map(|c| c["name"].as_str().unwrap()).collect();
    names.sort();
    let mut shipped: Vec<String> = std::fs::read_dir(format!("{CHART}/crds"))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".yaml")
                .to_owned()
        })
        .collect();
    shipped.sort();
    assert_eq!(names, shipped);
    assert_eq!(annotations["artifacthub.io/license"], "Apache-2.0");
    for key in ["maintainers", "sources", "home", "icon"] {
        assert!(!chart[key].is_null(), "Chart.yaml has no {key}");
    }
}

/// The `helm test` hook pod runs `autonomic-manager check` with exactly the Deployment's
/// identity, image, environment, files and security context (one definition in the
/// chart's helpers), and is no pod of the Deployment's.
#[test]
fn the_helm_test_pod_runs_check_with_the_releases_configuration() {
    let docs = documents(&render_chart(
        "autonomic-system",
        &sets(&[
            "manager.managed=true",
            "manager.clusterID=c1",
            "manager.watchNamespaces={a,b}",
            "manager.caBundle.configMapName=corp-ca",
            "manager.proxy.httpsProxy=http://proxy:3128",
            "manager.extraEnv[0].name=EXTRA",
            "manager.extraEnv[0].value=on",
            "manager.image.digest=sha256:0123456789012345678901234567890123456789012345678901234567890123",
        ]),
    ));
    let pods = kinds(&docs, "Pod");
    assert_eq!(pods.len(), 1, "one test hook pod");
    let pod = pods[0];
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    let template = &deployment(&docs)["spec"]["template"];
    let (check, manager) = (
        &pod["spec"]["containers"][0],
        &template["spec"]["containers"][0],
    );
    assert_eq!(
        check["command"],
        serde_json::json!(["/autonomic-manager", "check"])
    );
    for field in [
        "image",
        "imagePullPolicy",
        "env",
        "volumeMounts",
        "securityContext",
    ] {
        assert_eq!(check[field], manager[field], "{field}");
    }
    for field in ["serviceAccountName", "volumes", "securityContext"] {
        assert_eq!(pod["spec"][field], template["spec"][field], "{field}");
    }
    assert!(env(&docs, "EXTRA").is_some());
    let selector = deployment(&docs)["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    assert!(
        !selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the test pod carries the Deployment's selector: its ReplicaSet would adopt it"
    );
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
        &sets(&[
            "manager.watchNamespaces={team-a,team-b}",
            "manager.managed=true",
        ]),
    ));
    let roles = kinds(&docs, "Role");
    let namespaces: Vec<&str> = roles
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(
        namespaces,
        [
            "team-a",
            "team-b",
            "autonomic-system",
            "autonomic-system",
            "autonomic-system"
        ]
    );
    // The audit outbox: one ConfigMap by name, and create (which names cannot limit).
    let outbox = roles
        .iter()
        .find(|r| r["metadata"]["name"] == "autonomic-manager-audit-outbox")
        .expect("the audit outbox's Role");
    assert_eq!(
        outbox["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["autonomic-audit-outbox"], "verbs": ["get", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
        ])
    );
    // The release namespace is not watched: a Role there lets the manager record the
    // link's Events on its own pod.
    let events = roles
        .iter()
        .find(|r| r["metadata"]["name"] == "autonomic-manager-events")
        .expect("an events Role");
    assert_eq!(events["metadata"]["namespace"], "autonomic-system");
    assert_eq!(
        events["rules"],
        serde_json::json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}])
    );
    // Watched, it is covered by that namespace's Role.
    let docs_watched = documents(&render_chart(
        "autonomic-system",
        &sets(&[
            "manager.watchNamespaces={team-a,autonomic-system}",
            "manager.managed=true",
        ]),
    ));
    assert!(
        kinds(&docs_watched, "Role")
            .iter()
            .all(|r| r["metadata"]["name"] != "autonomic-manager-events")
    );
    // The two ClusterRoles left read namespaces by name: one for the cluster id, one for
    // the watched namespaces' labels (TRUST.md).
    let cluster_roles = kinds(&docs, "ClusterRole");
    let rules: Vec<&Value> = cluster_roles.iter().map(|r| &r["rules"]).collect();
    assert_eq!(
        rules,
        [
            &serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}]),
            &serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["team-a", "team-b"], "verbs": ["list", "watch"]}]),
        ]
    );
    assert_eq!(
        env(&docs, "AUTONOMIC_NAMESPACES").unwrap()["value"],
        "team-a,team-b"
    );
}

/// The feature rule `rule` of the Role or ClusterRole `holder` is for, if any: `exec`
/// (pods/exec), `patch` and `delete` (of the custom resources), `cluster-id` (get
/// namespace kube-system), `outbox` (its ConfigMap), `link-events` (the Role for Events in
/// the release namespace).
fn rule_feature(holder: &str, rule: &Value) -> Option<&'static str> {
    let has = |field: &str, x: &str| {
        rule[field]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == x))
    };
    let custom_resources = has("apiGroups", "autonomic.sh") && has("resources", "agents");
    Some(if has("resources", "pods/exec") {
        "exec"
    } else if custom_resources && has("verbs", "patch") {
        "patch"
    } else if custom_resources && has("verbs", "delete") {
        "delete"
    } else if has("resourceNames", "kube-system") {
        "cluster-id"
    } else if has("resources", "configmaps") {
        "outbox"
    } else if holder.ends_with("-events") {
        "link-events"
    } else {
        return None;
    })
}

/// The Roles and ClusterRoles of `docs`.
fn roles(docs: &[Value]) -> impl Iterator<Item = &Value> {
    docs.iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")))
}

/// The grants of the rendered RBAC that a feature brings ([`rule_feature`]), each with
/// the name of the Role or ClusterRole that holds it.
fn feature_grants(docs: &[Value]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for d in roles(docs) {
        let name = d["metadata"]["name"].as_str().unwrap();
        for r in d["rules"].as_array().unwrap() {
            if let Some(feature) = rule_feature(name, r)
                && !out.contains(&(feature, name.to_owned()))
            {
                out.push((feature, name.to_owned()));
            }
        }
    }
    out.sort();
    out
}

/// TRUST.md §6: the chart grants what the configured features use and nothing more.
/// From everything on (managed, the WebSocket, shells, every control action, no pinned
/// cluster id), each feature is turned off in turn, and unmanaged with all of them on:
/// each grant comes and goes with its feature, in each watched namespace's Role or the
/// ClusterRole, and the rest of the rules never change.
#[test]
fn each_grant_comes_only_with_its_feature() {
    let all = [
        "exec",
        "patch",
        "delete",
        "cluster-id",
        "outbox",
        "link-events",
    ];
    let cases: [(&str, &[&str]); 9] = [
        ("", &all),
        (
            "manager.transport=http",
            &["patch", "delete", "cluster-id", "link-events"],
        ),
        (
            "manager.shell.enabled=false",
            &["patch", "delete", "cluster-id", "outbox", "link-events"],
        ),
        (
            "manager.control.actions={restart}",
            &["exec", "cluster-id", "outbox", "link-events"],
        ),
        (
            "manager.control.actions={resume}",
            &["exec", "patch", "cluster-id", "outbox", "link-events"],
        ),
        (
            "manager.control.actions={delete}",
            &["exec", "delete", "cluster-id", "outbox", "link-events"],
        ),
        (
            // None allowed (`--set` cannot write an empty list; null reads the same).
            "manager.control.actions=null",
            &["exec", "cluster-id", "outbox", "link-events"],
        ),
        (
            "manager.clusterID=prod",
            &["exec", "patch", "delete", "outbox", "link-events"],
        ),
        ("manager.managed=false", &[]),
    ];
    for watch in ["", "manager.watchNamespaces={team-a,team-b}"] {
        let mut rest_of_the_rules = None;
        for (off, want) in cases {
            let mut set = vec!["manager.managed=true".to_owned()];
            set.extend(off.split(',').filter(|s| !s.is_empty()).map(str::to_owned));
            if !watch.is_empty() {
                set.push(watch.to_owned());
            }
            let docs = documents(&render_chart("autonomic-system", &set));
            let got = feature_grants(&docs);
            let mut expected: Vec<(&str, String)> = Vec::new();
            for feature in want {
                let holders: Vec<&str> = match (*feature, watch.is_empty()) {
                    ("exec" | "patch" | "delete", true) => {
                        vec!["autonomic-manager-autonomic-system"]
                    }
                    ("exec" | "patch" | "delete", false) => vec!["autonomic-manager"],
                    ("cluster-id", _) => vec!["autonomic-manager-autonomic-system-cluster-id"],
                    ("outbox", _) => vec!["autonomic-manager-audit-outbox"],
                    // All namespaces watched: the ClusterRole's Events rule covers it.
                    ("link-events", true) => vec![],
                    ("link-events", false) => vec!["autonomic-manager-events"],
                    _ => unreachable!(),
                };
                expected.extend(holders.into_iter().map(|h| (*feature, h.to_owned())));
            }
            expected.sort();
            assert_eq!(got, expected, "{set:?}");
            if !watch.is_empty() {
                // One Role in each watched namespace carries the feature's rules.
                let in_roles = docs
                    .iter()
                    .filter(|d| d["kind"] == "Role" && d["metadata"]["name"] == "autonomic-manager")
                    .filter(|d| {
                        d["rules"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|r| r["resources"] == serde_json::json!(["pods/exec"]))
                    })
                    .count();
                assert_eq!(
                    in_roles,
                    if want.contains(&"exec") { 2 } else { 0 },
                    "{set:?}"
                );
            }
            // What is left when the features' grants are taken out: the same every time.
            let rest: Vec<Value> = roles(&docs)
                .map(|d| {
                    let name = d["metadata"]["name"].as_str().unwrap();
                    let mut rules = d["rules"].as_array().unwrap().clone();
                    rules.retain(|r| rule_feature(name, r).is_none());
                    Value::Array(rules)
                })
                .filter(|rules| rules != &Value::Array(Vec::new()))
                .collect();
            match &rest_of_the_rules {
                None => rest_of_the_rules = Some(rest),
                Some(first) => assert_eq!(&rest, first, "{set:?}"),
            }
            // The manager is told what the RBAC follows.
            let shell = !off.contains("shell.enabled=false");
            assert_eq!(
                env(&docs, "AUTONOMIC_SHELL_ENABLED").unwrap()["value"],
                shell.to_string()
            );
        }
    }
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

/// The metric names a PromQL expression uses: the manager's families are all named
/// `autonomic_*` or `process_*`, so every identifier with those prefixes is one (label
/// values such as "autonomic-system" are not identifiers of that form).
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("autonomic_") || w.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

/// A name an expression may use: a family's sample name, i.e. a counter or gauge as
/// listed, or a histogram's `_bucket`, `_sum` or `_count`.
fn exported(name: &str) -> bool {
    use autonomic_manager::internals::{HISTOGRAMS, SERIES};
    if SERIES.contains(&name) {
        return !HISTOGRAMS.contains(&name);
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .any(|base| HISTOGRAMS.contains(&base))
}

#[test]
fn the_dashboard_and_the_alerts_use_only_series_the_manager_exports() {
    let docs = documents(&render_chart(
        "autonomic-system",
        &sets(&[
            "manager.grafanaDashboard.enabled=true",
            "manager.prometheusRule.enabled=true",
        ]),
    ));
    let mut exprs: Vec<(String, String)> = Vec::new();

    let maps = kinds(&docs, "ConfigMap");
    let dashboard_map = maps
        .iter()
        .find(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("the dashboard ConfigMap, labelled for Grafana's sidecar");
    let dashboard: Value = serde_json::from_str(
        dashboard_map["data"]["autonomic-manager.json"]
            .as_str()
            .unwrap(),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().unwrap();
    for title in [
        "Connection state",
        "Dial failures and disconnects by reason",
        "Delta latency (change seen → frame written)",
        "Reconcile time by kind",
        "Reconciles and errors by kind",
        "Audit events: queued and dropped",
        "Memory (resident)",
    ] {
        assert!(
            panels.iter().any(|p| p["title"] == title),
            "no panel {title:?}"
        );
    }
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            exprs.push((format!("panel {}", panel["title"]), expr.to_owned()));
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str() {
            exprs.push((format!("variable {}", var["name"]), q.to_owned()));
        }
    }

    let rules = kinds(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    let mut alerts = Vec::new();
    for group in rules[0]["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            alerts.push(alert);
            exprs.push((
                format!("alert {alert}"),
                rule["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    assert_eq!(
        alerts,
        [
            "AutonomicLinkDown",
            "AutonomicTokenRejected",
            "AutonomicReconcileErrors",
            "AutonomicAuditDropped",
            "AutonomicSnapshotTooBig"
        ]
    );
    let link_down = &rules[0]["spec"]["groups"][0]["rules"][0];
    assert_eq!(link_down["for"], "10m");

    assert!(exprs.len() > 20, "{exprs:?}");
    for (whose, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{whose} names no series: {expr}");
        for name in names {
            assert!(
                exported(&name),
                "{whose} uses {name}, which the manager does not export: {expr}"
            );
        }
    }
    // The check itself catches a name that is not exported.
    assert!(!exported("autonomic_reconcile_duration_seconds"));
    assert!(exported("autonomic_reconcile_duration_seconds_bucket"));
    assert!(!exported("autonomic_connected_bucket"));
    assert!(!exported("autonomic_links_total"));
}

#[test]
fn the_dashboard_and_the_alerts_are_off_by_default() {
    let docs = documents(&render_chart("autonomic-system", &[]));
    assert!(kinds(&docs, "PrometheusRule").is_empty());
    assert!(kinds(&docs, "ConfigMap").is_empty());
}
