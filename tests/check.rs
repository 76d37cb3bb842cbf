//! `autonomic-manager check` against the test bed, as the chart's ServiceAccount: the
//! healthy path (managed, over TLS with the test CA), and each failure it names, each
//! with its exact line.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::connect_proxy::ConnectProxy;
use support::fake_cp::FakeCp;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_autonomic-manager");
const TOKEN: &str = "tok_live_3f9a1c7e5b2d4a60";

/// What one run of `check` printed, and its exit code.
struct Checked {
    code: Option<i32>,
    lines: Vec<String>,
}

impl Checked {
    /// The line of `step` (`ok   api server: …` → "api server").
    fn line(&self, step: &str) -> &str {
        self.lines
            .iter()
            .find(|l| {
                l.get(5..)
                    .is_some_and(|l| l.starts_with(&format!("{step}: ")))
            })
            .unwrap_or_else(|| panic!("no {step} line in:\n{}", self.lines.join("\n")))
    }
}

/// Runs `check` with `kubeconfig`, watching `namespace`, with `env`; off the test's
/// runtime thread (the fake peers run on it), bounded.
async fn check(kubeconfig: &Path, namespace: &str, env: &[(&str, String)]) -> Checked {
    let mut cmd = Command::new(BIN);
    cmd.arg("check")
        .env_clear()
        .env("KUBECONFIG", kubeconfig)
        .env("AUTONOMIC_NAMESPACES", namespace)
        // The manager's namespace, as the chart's pod has it: the audit outbox's there.
        .env("POD_NAMESPACE", namespace)
        // As the chart's pod has it: the Lease is used.
        .env("AUTONOMIC_LEADER_ELECTION", "true")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let run = tokio::task::spawn_blocking(move || cmd.output().expect("run check"));
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("check ends within 2 minutes")
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    Checked {
        code: out.status.code(),
        lines: stdout.lines().map(str::to_owned).collect(),
    }
}

fn managed(url: String) -> Vec<(&'static str, String)> {
    vec![
        ("AUTONOMIC_MANAGED", "true".into()),
        ("AUTONOMIC_BASE_URL", url),
        ("AUTONOMIC_AUTH_TOKEN", TOKEN.into()),
    ]
}

/// The test bed's API server URL and version.
async fn api_server(client: &kube::Client) -> (String, String) {
    let server = run_ok(Command::new("kubectl").args([
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]));
    let version = client.apiserver_version().await.unwrap().git_version;
    (server.trim().trim_end_matches('/').to_owned(), version)
}

/// The lines of steps 2–5 for the chart's identity in `ns` (managed: the cluster id's
/// `get namespaces kube-system` too).
async fn cluster_lines(
    client: &kube::Client,
    ns: &str,
    kubeconfig: &Path,
    managed: bool,
) -> Vec<String> {
    let (server, version) = api_server(client).await;
    // The workload's 31 and the namespace's labels' 2 in `ns`, the Lease's 3; managed,
    // the cluster id's 1, the audit outbox's 3 in the manager's namespace, pods/exec's 2
    // (shells), patch and delete of Agents and Tools (control actions) too.
    let rbac = if managed {
        format!(
            "46 permissions allowed (namespace {ns}, namespace kube-system, the Lease autonomic-manager in namespace {ns})"
        )
    } else {
        format!(
            "36 permissions allowed (namespace {ns}, the Lease autonomic-manager in namespace {ns})"
        )
    };
    vec![
        format!(
            "ok   identity: kubeconfig {}, context manager, user autonomic-manager (ServiceAccount {ns}/autonomic-manager)",
            kubeconfig.display()
        ),
        format!("ok   api server: {server} ({version})"),
        format!("ok   rbac: {rbac}"),
        "ok   crds: agents, tools, runtimes, memories served (autonomic.sh/v1alpha1); schemas not compared: this identity may not get customresourcedefinitions".into(),
    ]
}

#[tokio::test]
async fn healthy_path_managed_over_tls() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "check-ok").await;
    let kubeconfig = chart_identity_with(&ns.name, &[&ns.name], &["manager.managed=true".into()]);
    let (ca_file, cert, key) = pki::test_pki();
    let cp = FakeCp::start_tls(&cert, &key).await;
    cp.set_token(Some(TOKEN));
    let mut env = managed(cp.url());
    env.push(("AUTONOMIC_CA_FILE", ca_file.display().to_string()));
    let got = check(&kubeconfig, &ns.name, &env).await;

    let port = cp.port();
    let mut want = vec![format!(
        "ok   configuration: managed (wss://127.0.0.1:{port}/api/autonomic/connect), watching namespaces {}",
        ns.name
    )];
    want.extend(cluster_lines(&client, &ns.name, &kubeconfig, true).await);
    want.extend([
        "ok   dns: 127.0.0.1 is an address (nothing to resolve)".to_owned(),
        format!("ok   connect: 127.0.0.1:{port} reached directly (no HTTPS_PROXY)"),
        "ok   tls: 127.0.0.1 presented a certificate this trust accepts, TLS 1.3".into(),
        format!(
            "ok   websocket: wss://127.0.0.1:{port}/api/autonomic/connect upgraded (autonomic.v1)"
        ),
        "ok   token: accepted (tok_li…)".into(),
    ]);
    assert_eq!(got.lines, want);
    assert_eq!(got.code, Some(0));

    // One upgrade, closed at once with 1000; no hello, nothing else sent.
    assert_eq!(cp.accepted(), 1);
    assert_eq!(cp.requests()[0].status, 101);
    wait_until("the close frame", || async { !cp.frames().is_empty() }).await;
    let kinds: Vec<_> = cp.frames().into_iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        [fake_cp::ReceivedKind::Close(Some((
            1000,
            "autonomic-manager check".into()
        )))]
    );
}

/// The chart's RBAC minus `watch` on pods: the one missing verb is named.
#[tokio::test]
async fn a_verb_missing_from_rbac_is_named() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "check-rbac").await;
    let without_watch = |docs: &mut Vec<Value>| {
        let mut removed = 0;
        for doc in docs.iter_mut().filter(|d| d["kind"] == "Role") {
            for rule in doc["rules"].as_array_mut().into_iter().flatten() {
                if rule["resources"] == json!(["pods"]) {
                    let verbs = rule["verbs"].as_array_mut().unwrap();
                    verbs.retain(|v| v != "watch");
                    removed += 1;
                }
            }
        }
        assert_eq!(removed, 1, "the pods rule of the chart's Role");
    };
    let kubeconfig = identity_with_rbac(&ns.name, &[&ns.name], &without_watch, 100);
    let got = check(&kubeconfig, &ns.name, &[]).await;
    assert_eq!(
        got.line("rbac"),
        format!(
            "FAIL rbac: cannot watch pods in namespace {} — fix: grant this identity the chart's RBAC for this configuration (helm upgrade with its values, or kubectl apply --server-side -f deploy.yaml)",
            ns.name
        )
    );
    assert_eq!(
        got.line("crds"),
        cluster_lines(&client, &ns.name, &kubeconfig, false).await[3].as_str()
    );
    assert_eq!(got.line("dns"), "-    dns: skipped: unmanaged");
    assert_eq!(got.lines.len(), 10);
    assert_eq!(got.code, Some(1));
}

/// TRUST.md §6 on the bed. The chart's managed identity used by an unmanaged manager: one
/// warning names every grant of the link (the cluster id, the outbox, pods/exec, the
/// control actions' patch and delete); used by a managed one with shells off and only
/// `restart` allowed: a warning for each feature off. The unmanaged chart's identity
/// for an unmanaged manager: no warning. And that identity for a managed manager (what
/// deploy.yaml turned managed by hand holds): each missing grant named, and where to
/// get them.
#[tokio::test]
async fn feature_grants_held_and_not_used_are_warnings() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "check-unused").await;
    let n = &ns.name;
    let fix = "fix: drop it from this identity (the chart grants a feature's permissions only with the feature: helm upgrade with the values this manager runs with)";
    let managed_identity = chart_identity_with(n, &[n], &["manager.managed=true".into()]);
    let got = check(&managed_identity, n, &[]).await;
    let warns: Vec<&String> = got.lines.iter().filter(|l| l.starts_with("warn")).collect();
    assert_eq!(
        warns,
        [&format!(
            "warn rbac: may get namespaces kube-system; may get configmaps autonomic-audit-outbox, update configmaps autonomic-audit-outbox, create configmaps, get pods/exec, create pods/exec, patch agents, patch tools, delete agents, delete tools in namespace {n}, which this configuration does not use (unmanaged: no control-plane link) — {fix}"
        )]
    );
    assert_eq!(got.code, Some(0), "a warning is no failure");

    let cp = FakeCp::start().await;
    cp.set_token(Some(TOKEN));
    let mut env = managed(cp.url());
    env.push(("AUTONOMIC_SHELL_ENABLED", "false".into()));
    env.push(("AUTONOMIC_CONTROL_ACTIONS", "restart".into()));
    let got = check(&managed_identity, n, &env).await;
    let warns: Vec<&String> = got.lines.iter().filter(|l| l.starts_with("warn")).collect();
    assert_eq!(
        warns,
        [
            &format!(
                "warn rbac: may patch agents, patch tools in namespace {n}, which this configuration does not use (AUTONOMIC_CONTROL_ACTIONS allows neither pause nor resume) — {fix}"
            ),
            &format!(
                "warn rbac: may delete agents, delete tools in namespace {n}, which this configuration does not use (AUTONOMIC_CONTROL_ACTIONS does not allow delete) — {fix}"
            ),
            &format!(
                "warn rbac: may get pods/exec, create pods/exec in namespace {n}, which this configuration does not use (shells are off (AUTONOMIC_SHELL_ENABLED=false)) — {fix}"
            ),
        ],
        "{:?}",
        got.lines
    );
    assert_eq!(got.code, Some(0), "{:?}", got.lines);

    // The unmanaged chart's identity (in a namespace of its own: applying it over the
    // managed one would leave the managed install's extra Roles behind): no warning.
    let ns = TestNamespace::new(&client, "check-unmanaged").await;
    let n = &ns.name;
    let unmanaged_identity = chart_identity(n, &[n]);
    let got = check(&unmanaged_identity, n, &[]).await;
    assert!(
        !got.lines.iter().any(|l| l.starts_with("warn")),
        "{:?}",
        got.lines
    );
    assert_eq!(got.code, Some(0));

    // deploy.yaml turned managed by hand: the link's grants are missing, each named.
    let got = check(&unmanaged_identity, n, &managed(cp.url())).await;
    assert_eq!(
        got.line("rbac"),
        format!(
            "FAIL rbac: cannot get namespaces kube-system; cannot get configmaps autonomic-audit-outbox, update configmaps autonomic-audit-outbox, create configmaps, get pods/exec, create pods/exec, patch agents, patch tools, delete agents, delete tools in namespace {n} — fix: grant this identity the chart's RBAC for this configuration (helm upgrade with its values, or kubectl apply --server-side -f deploy-managed.yaml), or set AUTONOMIC_CLUSTER_ID"
        )
    );
    assert_eq!(got.code, Some(1));
}

/// Missing CRDs. The shared test bed's CRDs cannot be taken away while other tests run,
/// so this one starts an API server of its own (etcd and kube-apiserver, no node) where
/// they were never installed, and runs `check` there as the chart's ServiceAccount.
#[tokio::test]
async fn missing_crds_are_named() {
    let bed = support::own_bed::OwnBed::up("");
    bed.make_default(&bed.kubeconfig());
    // Not support::client(): it installs the CRDs.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default().await.unwrap();
    let ns = TestNamespace::new(&client, "crd-less").await;
    let identity = chart_identity(&ns.name, &[&ns.name]);
    let got = check(&identity, &ns.name, &[]).await;
    // The chart's identity may not read CRDs (a stand-in API server that answered 404
    // to that read hid this): the API's discovery says what is not served.
    assert_eq!(
        got.line("crds"),
        "FAIL crds: not served by autonomic.sh/v1alpha1: agents, agents/status, tools, tools/status, runtimes, runtimes/status, memories, memories/status — fix: install this version's CRDs: autonomic-manager crds | kubectl apply --server-side -f -"
    );
    assert!(
        got.line("rbac").starts_with("ok   rbac: "),
        "{}",
        got.line("rbac")
    );
    assert_eq!(got.code, Some(1));
}

/// The lines of a managed check that fails at `step` with `line`: everything before it
/// passes (the cluster as the chart's identity), everything after is skipped.
async fn managed_failure(prefix: &str, url: String, extra: &[(&'static str, String)]) -> Checked {
    let client = client().await;
    let ns = TestNamespace::new(&client, prefix).await;
    let kubeconfig = chart_identity_with(&ns.name, &[&ns.name], &["manager.managed=true".into()]);
    let mut env = managed(url);
    env.extend(extra.iter().cloned());
    let got = check(&kubeconfig, &ns.name, &env).await;
    assert_eq!(
        got.lines[1..5],
        cluster_lines(&client, &ns.name, &kubeconfig, true).await[..]
    );
    assert_eq!(got.lines.len(), 10, "one line a step");
    assert_eq!(got.code, Some(1));
    got
}

#[tokio::test]
async fn an_unresolvable_host_fails_dns() {
    let got = managed_failure("check-dns", "https://cp.autonomic.invalid".into(), &[]).await;
    assert_eq!(
        got.lines[5..],
        [
            "FAIL dns: cannot resolve cp.autonomic.invalid: failed to lookup address information: Name does not resolve — fix: check the host in AUTONOMIC_BASE_URL and this pod's DNS (or set HTTPS_PROXY if only a proxy reaches it)",
            "-    connect: skipped: dns failed",
            "-    tls: skipped: dns failed",
            "-    websocket: skipped: dns failed",
            "-    token: skipped: dns failed",
        ]
    );
}

#[tokio::test]
async fn a_proxy_refusing_connect_is_named_with_its_status() {
    let cp = FakeCp::start().await;
    let proxy = ConnectProxy::start(Some(407));
    let extra = [("HTTPS_PROXY", proxy.url())];
    let got = managed_failure("check-proxy", cp.url(), &extra).await;
    let (pp, port) = (proxy.port, cp.port());
    assert_eq!(
        got.lines[5..7],
        [
            "ok   dns: proxy host 127.0.0.1 is an address (nothing to resolve)".to_owned(),
            format!(
                "FAIL proxy: http://127.0.0.1:{pp} refused CONNECT 127.0.0.1:{port}: HTTP/1.1 407 Refused — fix: the proxy wants credentials: put them in HTTPS_PROXY (http://user:password@host:port)"
            ),
        ]
    );
    assert_eq!(got.lines[7], "-    tls: skipped: proxy failed");
    assert_eq!(proxy.seen(), [format!("CONNECT 127.0.0.1:{port}")]);
    assert_eq!(cp.attempts(), 0);
}

#[tokio::test]
async fn an_unknown_ca_is_named() {
    let (_ca_file, cert, key) = pki::test_pki();
    let cp = FakeCp::start_tls(&cert, &key).await;
    let got = managed_failure("check-ca", cp.url(), &[]).await;
    let port = cp.port();
    assert_eq!(
        got.lines[7..],
        [
            format!(
                "FAIL tls: the certificate of 127.0.0.1:{port} is signed by an unknown CA — fix: set AUTONOMIC_CA_FILE (or SSL_CERT_FILE) to a PEM file of the CA that signs it (a TLS-inspecting proxy's CA, if there is one)"
            ),
            "-    websocket: skipped: tls failed".into(),
            "-    token: skipped: tls failed".into(),
        ]
    );
    assert_eq!(cp.accepted(), 0);
}

#[tokio::test]
async fn a_rejected_token_is_named() {
    let cp = FakeCp::start().await;
    cp.set_token(Some("tok_another_one"));
    let got = managed_failure("check-token", cp.url(), &[]).await;
    assert_eq!(
        got.lines[8..],
        [
            "-    websocket: skipped: the token was refused first (HTTP 401)",
            "FAIL token: rejected (HTTP 401) for token tok_li… — fix: set AUTONOMIC_AUTH_TOKEN (or the Secret behind AUTONOMIC_AUTH_TOKEN_FILE) to a current token from the platform's dashboard",
        ]
    );
    assert_eq!(cp.requests()[0].status, 401);
}

/// A plain HTTP server that answers every request with 200 and a page.
async fn not_a_websocket() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let page = "<html>welcome</html>";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{page}",
                    page.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_peer_that_is_not_a_websocket_is_named() {
    let port = not_a_websocket().await;
    let got = managed_failure("check-ws", format!("http://127.0.0.1:{port}"), &[]).await;
    assert_eq!(
        got.lines[7..],
        [
            "-    tls: skipped: plain http:// in AUTONOMIC_BASE_URL".to_owned(),
            format!(
                "FAIL websocket: ws://127.0.0.1:{port}/api/autonomic/connect is not a WebSocket endpoint: it answered the upgrade with HTTP 200 — fix: check AUTONOMIC_BASE_URL: it must be the platform's URL (and nothing between may strip the Upgrade header)"
            ),
            "-    token: skipped: websocket failed".into(),
        ]
    );
}

/// Neither a kubeconfig nor a pod: the identity step fails and says where to run it;
/// the steps that need the API server are skipped.
#[tokio::test]
async fn no_identity_says_where_to_run_it() {
    let dir = log_dir().join(format!("check-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let got = check(&dir.join("no-such-kubeconfig"), "x", &[]).await;
    let line = got.line("identity");
    assert!(
        line.starts_with("FAIL identity: no kubeconfig (") && line.contains(") and not in a pod ("),
        "{line}"
    );
    assert!(
        line.ends_with(" — fix: set KUBECONFIG, or run it in the manager's pod: kubectl exec deploy/autonomic-manager -- /autonomic-manager check"),
        "{line}"
    );
    assert_eq!(
        got.lines[2..5],
        [
            "-    api server: skipped: no identity",
            "-    rbac: skipped: no identity",
            "-    crds: skipped: no identity",
        ]
    );
    assert_eq!(got.code, Some(1));
}
