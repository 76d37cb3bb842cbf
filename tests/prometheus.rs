//! The chart's alert rules, evaluated by a real Prometheus: the PrometheusRule the chart
//! renders is checked by `promtool check rules` (Debian's prometheus 2.42, installed by
//! scripts/lib.sh `ensure_prometheus`) and unit-tested by `promtool test rules` with
//! `tests/prometheus/alerts_test.yml`: for every alert, a case where it fires and one
//! where it must not.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use support::*;

#[test]
fn the_shipped_alert_rules_pass_promtool_and_their_unit_tests() {
    let docs = documents(&render_chart(
        "autonomic-system",
        &["manager.prometheusRule.enabled=true".to_owned()],
    ));
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("no PrometheusRule rendered");
    let alerts: Vec<&str> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(alerts.len(), 5, "{alerts:?}");

    // promtool reads a rule file: the PrometheusRule's spec is one (JSON is YAML).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let work = log_dir().join(format!("promtool-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("rules.yml"), rule["spec"].to_string()).unwrap();
    let tests = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/prometheus/alerts_test.yml"
    );
    std::fs::copy(tests, work.join("alerts_test.yml")).unwrap();
    let checked =
        run_ok(
            Command::new("promtool")
                .current_dir(&work)
                .args(["check", "rules", "rules.yml"]),
        );
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    let tested = run_ok(Command::new("promtool").current_dir(&work).args([
        "test",
        "rules",
        "alerts_test.yml",
    ]));
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a case where it fires and one where it must not.
    let cases: Value = serde_saphyr::from_str(&std::fs::read_to_string(tests).unwrap()).unwrap();
    let mut seen: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for case in cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
    {
        let entry = seen.entry(case["alertname"].as_str().unwrap()).or_default();
        if case["exp_alerts"].as_array().is_some_and(|a| a.is_empty()) {
            entry.1 = true;
        } else {
            entry.0 = true;
        }
    }
    for alert in alerts {
        assert_eq!(
            seen.get(alert),
            Some(&(true, true)),
            "{alert}: no case where it fires and one where it must not"
        );
    }
}

/// A GET on 127.0.0.1:port: the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    // Chunked or not, the JSON object is the body's one line that starts with '{'.
    body.lines().find(|l| l.starts_with('{')).map(str::to_owned)
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The number of series an instant query returns (None: the query failed).
fn series(port: u16, query: &str) -> Option<usize> {
    let body = http_get(
        port,
        &format!("/api/v1/query?query={}", percent_encode(query)),
    )?;
    let v: Value = serde_json::from_str(&body).ok()?;
    (v["status"] == "success").then(|| v["data"]["result"].as_array().map_or(0, Vec::len))
}

/// Debian's Prometheus scrapes the installed managers on the bed (a managed release,
/// connected to the fake control plane, reconciling an Agent), as a PodMonitor would:
/// each pod's port 8081, labelled with its namespace and pod. Every query of the shipped
/// Grafana dashboard then returns a series (`$namespace` the release's, `$__rate_interval`
/// 1m); a panel whose query matches nothing fails the test.
#[tokio::test]
async fn every_dashboard_query_returns_a_series_from_a_real_prometheus() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    use support::fake_cp::FakeCp;
    use tokio::time::{Duration, Instant};

    require_node();
    let client = client().await;
    let home = TestNamespace::new(&client, "prom").await;
    let agents = TestNamespace::new(&client, "prom-agents").await;
    let ip = bridge_ip();
    let (ca, cert, key) = support::pki::test_pki_for(&[ip]);
    let cp = FakeCp::start_tls_on(ip, &cert, &key).await;
    cp.set_token(Some("tok_live_prom_3d5f7a9b"));
    home.api::<Secret>()
        .create(
            &PostParams::default(),
            &yaml(
                "apiVersion: v1\nkind: Secret\nmetadata: {name: autonomic-auth}\nstringData: {token: tok_live_prom_3d5f7a9b}",
            ),
        )
        .await
        .unwrap();
    let release = HelmRelease::new(&home.name, "autonomic");
    let mut install: Vec<String> = [
        "install",
        "autonomic",
        CHART,
        "--set",
        "manager.managed=true",
        "--set",
        "manager.agentlet.image.registry=autonomic.test",
        "--set",
        "manager.agentlet.image.repository=agentlet",
        "--set-string",
        "manager.agentlet.image.tag=1",
    ]
    .map(String::from)
    .to_vec();
    install.extend([
        "--set".into(),
        format!("manager.baseURL={}", cp.url()),
        "--set".into(),
        format!("manager.watchNamespaces={{{}}}", agents.name),
        "--set-file".into(),
        format!("manager.caBundle.pem={}", ca.display()),
    ]);
    install.extend(manager_image_sets());
    release.helm(&install.iter().map(String::as_str).collect::<Vec<_>>());
    let deployments: Api<Deployment> = home.api();
    wait_for(&deployments, "autonomic-manager", "2 available", |d| {
        d.status
            .as_ref()
            .is_some_and(|s| s.available_replicas.unwrap_or(0) >= 2)
    })
    .await;
    cp.wait_frame("the first snapshot", |r| r.frame_type() == Some("snapshot"))
        .await;
    // Work for the reconcile and delta panels: an Agent, reconciled and reported.
    create_yaml::<autonomic_manager::crd::Agent>(
        &agents.api(),
        &format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: hello}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, 'trap \"exit 0\" TERM; while :; do sleep 1; done']}}}}"
        ),
    )
    .await;
    reported(&cp, &agents.name, "hello", "Active").await;

    // Prometheus, scraping both pods every second.
    let targets: Vec<(String, String)> = home
        .manager_pods()
        .await
        .into_iter()
        .map(|p| {
            let ip = p.status.unwrap().pod_ip.unwrap();
            (p.metadata.name.unwrap(), ip)
        })
        .collect();
    assert_eq!(targets.len(), 2, "{targets:?}");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let work = log_dir().join(format!("prometheus-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let mut config = String::from(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n  - job_name: autonomic-manager\n    static_configs:\n",
    );
    for (pod, ip) in &targets {
        config.push_str(&format!(
            "      - targets: ['{ip}:8081']\n        labels: {{namespace: {}, pod: {pod}}}\n",
            home.name
        ));
    }
    std::fs::write(work.join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                work.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                work.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(work.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (scripts/lib.sh ensure_prometheus installs it)"),
    );
    let up = format!("up{{namespace=\"{}\"}} == 1", home.name);
    wait_until("Prometheus scraping both managers", || async {
        series(port, &up) == Some(2)
    })
    .await;

    // Every query of the dashboard, as Grafana would send it.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{CHART}/dashboards/autonomic-manager.json")).unwrap(),
    )
    .unwrap();
    let namespace = home.name.clone();
    let queries: Vec<(String, String)> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let namespace = namespace.clone();
            p["targets"].as_array().unwrap().iter().map(move |t| {
                (
                    p["title"].as_str().unwrap().to_owned(),
                    t["expr"]
                        .as_str()
                        .unwrap()
                        .replace("$namespace", &namespace)
                        .replace("$__rate_interval", "1m"),
                )
            })
        })
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    let started = Instant::now();
    let empty = loop {
        let empty: Vec<&(String, String)> = queries
            .iter()
            .filter(|(_, q)| series(port, q).unwrap_or(0) == 0)
            .collect();
        if empty.is_empty() || started.elapsed() > Duration::from_secs(60) {
            break empty;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        empty.is_empty(),
        "dashboard queries that match nothing after 60 s of scraping: {empty:#?}"
    );
    eprintln!(
        "{} dashboard queries each returned a series {:?} after scraping began",
        queries.len(),
        started.elapsed()
    );
}
