//! Test bed access for the integration tests: a client for the real API server the
//! project's scripts started (`KUBECONFIG`), a namespace per test, and the manager
//! binary itself run as a child process scoped to that namespace.
#![allow(dead_code)]
// Waits on child processes block a thread on purpose (clippy.toml bans that in the
// manager).
#![allow(clippy::disallowed_methods)]
pub mod cluster_state;
pub mod connect_proxy;
pub mod docs;
pub mod fake_cp;
pub mod fake_http;
pub mod faults;
pub mod own_bed;
pub mod pki;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

use fake_cp::{FakeCp, Received};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub const AGENTLET_IMAGE: &str = "autonomic.test/agentlet:1";
pub const BUSYBOX_IMAGE: &str = "autonomic.test/busybox:1";
/// A runtime container that stays up and stops at once on SIGTERM.
pub const IDLE: &str = r#"["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]"#;
/// Long enough for a pod on a loaded 2-core machine; this is a bound, not a claim.
pub const WAIT: Duration = Duration::from_secs(150);

/// A client for the test bed. Fails loudly (never skips) when there is none.
pub async fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: run the suite with scripts/test, which starts the test bed"
    );
    let client = Client::try_default()
        .await
        .expect("a client for the test bed");
    ensure_crds(&client).await;
    client
}

/// Installs the CRDs (server-side apply: idempotent) and waits until they are served.
pub async fn ensure_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in autonomic_manager::crd::crds() {
        let name = crd.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("autonomic-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        wait_for(&api, &name, "Established", |c| {
            c.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
        .await;
    }
}

/// Whether the test bed runs a node (pods really start). `scripts/test` says so.
pub fn has_node() -> bool {
    std::env::var("AUTONOMIC_TESTBED_MODE").as_deref() != Ok("apiserver")
}

/// Skips nothing silently: a node-dependent test on an apiserver-only bed fails with a
/// reason unless the run explicitly says pods cannot run here.
pub fn require_node() {
    assert!(
        has_node(),
        "this test needs a node that runs pods; the test bed was started apiserver-only"
    );
}

/// A namespace of its own for one test; deleted on drop.
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    pub async fn new(client: &Client, prefix: &str) -> Self {
        let suffix = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                % 0xffff_ffff
        );
        let name = format!("{prefix}-{suffix}");
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"autonomic.test/suite": "true"}}
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create test namespace");
        // The ServiceAccount controller must have made `default` before pods can be created.
        if has_node() {
            let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                Api::namespaced(client.clone(), &name);
            wait_until("default ServiceAccount", || async {
                sa.get_opt("default").await.ok().flatten().is_some()
            })
            .await;
        }
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    /// Creates a Runtime `name` (image `img:1`) here.
    pub async fn create_runtime(&self, name: &str) {
        let rt: autonomic_manager::crd::Runtime = yaml(&format!(
            "apiVersion: autonomic.sh/v1alpha1\nkind: Runtime\nmetadata: {{name: {name}}}\nspec: {{image: 'img:1'}}"
        ));
        self.api::<autonomic_manager::crd::Runtime>()
            .create(&PostParams::default(), &rt)
            .await
            .expect("create runtime");
    }

    /// The manager's pods in this namespace (a release installed here), but those
    /// being deleted.
    pub async fn manager_pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let params =
            kube::api::ListParams::default().labels("app.kubernetes.io/name=autonomic-manager");
        self.api::<k8s_openapi::api::core::v1::Pod>()
            .list(&params)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort; the test bed is torn down after the suite anyway. A new client on
        // a runtime of its own: the test's runtime is blocked right here.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    if let Ok(client) = Client::try_default().await {
                        let _ = Api::<Namespace>::all(client)
                            .delete(&name, &DeleteParams::background())
                            .await;
                    }
                });
        })
        .join();
    }
}

/// Polls `check` every 100 ms until it holds; panics with `what` after [`WAIT`].
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {WAIT:?} waiting for {what}");
}

/// Waits until the manager's Deployment in `ns` has `n` available replicas.
pub async fn wait_available(deployments: &Api<k8s_openapi::api::apps::v1::Deployment>, n: i32) {
    wait_for(deployments, "autonomic-manager", "available", |d| {
        d.status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0)
            >= n
    })
    .await;
}

/// Waits until object `name` exists and `pred` holds for it; returns it.
pub async fn wait_for<K, P>(api: &Api<K>, name: &str, what: &str, pred: P) -> K
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
    P: Fn(&K) -> bool,
{
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    while Instant::now() < deadline {
        match api.get_opt(name).await {
            Ok(Some(obj)) if pred(&obj) => return obj,
            Ok(other) => last = other,
            Err(e) => eprintln!("get {name}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {WAIT:?} waiting for {name} to be {what}; last seen: {last:#?}");
}

/// Waits until object `name` is gone.
pub async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    wait_until(&format!("{name} to be deleted"), || async {
        matches!(api.get_opt(name).await, Ok(None))
    })
    .await;
}

/// Where every test's manager logs go; the token-leak test reads them all.
pub fn log_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-logs");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The helm binary: `HELM` (scripts/test installs it), else `helm` on PATH.
pub fn helm() -> String {
    std::env::var("HELM").unwrap_or_else(|_| "helm".into())
}

/// The project's chart.
pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/autonomic");

/// Runs a command; its stdout, or a panic with its stderr.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template` of the chart as release `autonomic` in `namespace`, with `--set`s.
pub fn render_chart(namespace: &str, sets: &[String]) -> String {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "autonomic", CHART, "--namespace", namespace]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    run_ok(&mut cmd)
}

/// The YAML documents of a manifest, parsed.
pub fn documents(manifest: &str) -> Vec<serde_json::Value> {
    manifest
        .split("\n---\n")
        .filter_map(|doc| serde_saphyr::from_str::<Option<serde_json::Value>>(doc).unwrap())
        .filter(|d| d.is_object())
        .collect()
}

/// `kubectl` with the admin kubeconfig, for the tests' own setup; stdin optional.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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

/// On a panic (a test failing), prints what the bed knew: the node's conditions and the
/// namespaces' pods and Events, the kubelet's among them. A test whose failure was seen
/// only under a loaded suite says why, not only what.
pub struct ReportOnPanic(pub Vec<String>);

impl Drop for ReportOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let conditions = "jsonpath={range .items[*]}{.metadata.name}{'\\n'}{range .status.conditions[*]}  {.type}={.status} {.reason} {.lastTransitionTime} {.message}{'\\n'}{end}{end}";
        let mut out = kubectl(&["get", "nodes", "-o", conditions], None).1;
        for ns in &self.0 {
            out += &kubectl(&["-n", ns, "get", "pods", "-o", "wide"], None).1;
            out += &kubectl(
                &["-n", ns, "get", "events", "--sort-by=.lastTimestamp"],
                None,
            )
            .1;
        }
        eprintln!("the bed when the test failed:\n{out}");
    }
}

/// The identity the chart gives the manager, for a manager living in `home` and watching
/// `watch` (empty: all namespaces): the chart's ServiceAccount and RBAC, rendered by helm
/// with those values and applied (as admin), and a kubeconfig holding that
/// ServiceAccount's token (TokenRequest). Made once per (home, watch) and reused. The
/// chart's default values: unmanaged (no `pods/exec`); see [`chart_identity_with`].
pub fn chart_identity(home: &str, watch: &[&str]) -> PathBuf {
    chart_identity_with(home, watch, &[])
}

/// [`chart_identity`] rendered with `features` (`--set`s such as `manager.managed=true`).
/// The chart's names do not depend on them: the last identity applied in `home` is the
/// one its ServiceAccount holds.
pub fn chart_identity_with(home: &str, watch: &[&str], features: &[String]) -> PathBuf {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MADE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{home}|{}|{}", watch.join(","), features.join(","));
    let mut made = MADE.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = made.get(&key) {
        return path.clone();
    }
    let path = identity_rendered(home, watch, features, &|_| {}, made.len());
    made.insert(key, path.clone());
    path
}

/// [`chart_identity`] as the chart gives it to a managed manager (its defaults
/// otherwise): for tests that point a managed manager's kubeconfig elsewhere (a proxy),
/// so that the identity they copy is the one [`Manager::start_as`] applies.
pub fn managed_chart_identity(home: &str, watch: &[&str]) -> PathBuf {
    chart_identity_with(home, watch, &["manager.managed=true".to_owned()])
}

/// The chart's `--set`s for the features a manager started with `env` uses: managed
/// mode, its transport, shells on or off (what the chart's RBAC follows).
pub fn features_of(env: &[(&str, &str)]) -> Vec<String> {
    let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.trim());
    let mut sets = Vec::new();
    if get("AUTONOMIC_MANAGED") == Some("true") {
        sets.push("manager.managed=true".to_owned());
    }
    if let Some(t) = get("AUTONOMIC_TRANSPORT") {
        sets.push(format!("manager.transport={t}"));
    }
    if get("AUTONOMIC_SHELL_ENABLED") == Some("false") {
        sets.push("manager.shell.enabled=false".to_owned());
    }
    sets
}

/// Like [`chart_identity`], with `edit` applied to the chart's RBAC documents before they
/// are applied (a rule taken away, say); not cached. `n` makes the kubeconfig's name.
pub fn identity_with_rbac(
    home: &str,
    watch: &[&str],
    edit: &dyn Fn(&mut Vec<serde_json::Value>),
    n: usize,
) -> PathBuf {
    identity_rendered(home, watch, &[], edit, n)
}

fn identity_rendered(
    home: &str,
    watch: &[&str],
    features: &[String],
    edit: &dyn Fn(&mut Vec<serde_json::Value>),
    n: usize,
) -> PathBuf {
    let mut sets = vec![format!("manager.watchNamespaces={{{}}}", watch.join(","))];
    sets.extend(features.iter().cloned());
    let mut rbac: Vec<serde_json::Value> = documents(&render_chart(home, &sets))
        .into_iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "Role"
                        | "RoleBinding"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                )
            )
        })
        .collect();
    assert!(rbac.len() >= 4, "the chart rendered no RBAC");
    edit(&mut rbac);
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": rbac});
    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&list.to_string()));
    assert!(ok, "applying the chart's RBAC failed:\n{out}");
    let sa = rbac
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .and_then(|d| d["metadata"]["name"].as_str())
        .unwrap()
        .to_owned();
    token_kubeconfig(home, &sa, &format!("{home}-{n}"))
}

/// A kubeconfig at `<log dir>/<file>.kubeconfig` that authenticates as ServiceAccount
/// `home/sa` (a token from the TokenRequest API) against the bed's API server.
pub fn token_kubeconfig(home: &str, sa: &str, file: &str) -> PathBuf {
    // TokenRequest through the raw API: any kubectl version can send it (`kubectl create
    // token` needs 1.24 or newer on the client).
    let request = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 43200},
    });
    let (ok, out) = kubectl(
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{home}/serviceaccounts/{sa}/token"),
            "-f",
            "-",
        ],
        Some(&request.to_string()),
    );
    assert!(ok, "TokenRequest for {home}/{sa} failed:\n{out}");
    // kubectl may add warnings (version skew) around the JSON.
    let json = out
        .find('{')
        .zip(out.rfind('}'))
        .map_or("", |(a, b)| &out[a..=b]);
    let answer: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("TokenRequest answer is not JSON ({e}):\n{out}"));
    let token = answer["status"]["token"]
        .as_str()
        .expect("a token in the TokenRequest answer")
        .to_owned();
    let view = |path: &str| {
        run_ok(Command::new("kubectl").args([
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            &format!("jsonpath={{{path}}}"),
        ]))
    };
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bed", "cluster": {
            "server": view(".clusters[0].cluster.server"),
            "certificate-authority-data": view(".clusters[0].cluster.certificate-authority-data"),
        }}],
        "users": [{"name": sa, "user": {"token": token.trim()}}],
        "contexts": [{"name": "manager", "context": {"cluster": "bed", "user": sa, "namespace": home}}],
        "current-context": "manager",
    });
    let path = log_dir().join(format!("{file}.kubeconfig"));
    std::fs::write(&path, kubeconfig.to_string()).unwrap();
    path
}

/// The pod holding the manager's Lease in `home` (its identity is `<pod>_<boot id>`),
/// once someone holds it.
pub async fn lease_holder_pod(home: &TestNamespace) -> String {
    use k8s_openapi::api::coordination::v1::Lease;
    let lease = wait_for(
        &home.api::<Lease>(),
        "autonomic-manager",
        "held",
        |l: &Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty())
        },
    )
    .await;
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    holder
        .rsplit_once('_')
        .map_or(holder.clone(), |(pod, _)| pod.to_owned())
}

/// The manager binary, run as a child process.
pub struct Manager {
    child: Child,
    pub log: PathBuf,
    pub probe: String,
}

impl Manager {
    /// Starts the manager watching only `namespace`, with extra environment.
    pub fn start(namespace: &str, env: &[(&str, &str)]) -> Manager {
        Manager::start_as(namespace, namespace, env)
    }

    /// Like [`start`](Self::start), logging to `<name>.log`: for several managers in
    /// one namespace.
    ///
    /// The manager runs as the chart's ServiceAccount (see [`chart_identity`]), never
    /// with the admin kubeconfig, and a test fails if it was refused any request.
    pub fn start_as(namespace: &str, name: &str, env: &[(&str, &str)]) -> Manager {
        let log = log_dir().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let watch: Vec<&str> = env
            .iter()
            .find(|(k, _)| *k == "AUTONOMIC_NAMESPACES")
            .map_or(vec![namespace], |(_, v)| {
                v.split(',').filter(|s| !s.is_empty()).collect()
            });
        let kubeconfig = chart_identity_with(namespace, &watch, &features_of(env));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_autonomic-manager"));
        cmd.env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .env("AUTONOMIC_NAMESPACES", namespace)
            .env("AUTONOMIC_PROBE_ADDR", "127.0.0.1:0")
            .env("AUTONOMIC_AGENTLET_IMAGE", AGENTLET_IMAGE)
            .env("AUTONOMIC_LOG", "info,autonomic_manager=debug")
            .env("POD_NAME", format!("test-{namespace}"))
            // Its home, as the chart's pod has it: the Lease and the audit outbox are there.
            .env("POD_NAMESPACE", namespace)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        // A test or bench killed before `Drop` runs must not leave its manager behind:
        // one such ran for 71 minutes beside later runs, redialling a closed port. The
        // manager gets SIGKILL when the thread that started it ends (a test's thread, or
        // a runtime's worker thread: both live as long as the process).
        // SAFETY: between fork and exec this calls prctl alone, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(
                || match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                },
            );
        }
        let child = cmd.spawn().expect("spawn autonomic-manager");
        let mut m = Manager {
            child,
            log,
            probe: String::new(),
        };
        m.probe = m
            .wait_log("probe_addr=", Duration::from_secs(30))
            .split("probe_addr=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .expect("probe address in the start line")
            .to_owned();
        m
    }

    /// Waits for a log line containing `needle`; returns it.
    pub fn wait_log(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let f = std::fs::File::open(&self.log).unwrap();
            if let Some(line) = BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .find(|l| l.contains(needle))
            {
                return line;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "manager exited ({status}) before logging {needle:?}:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET a path on the probe server.
    pub async fn get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.probe)
            .await
            .expect("probe connect");
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let code = out[9..12].parse().unwrap();
        let body = out
            .split_once("\r\n\r\n")
            .map(|x| x.1)
            .unwrap_or("")
            .to_owned();
        (code, body)
    }

    /// The value of a metric series (exact name with labels).
    pub async fn metric(&self, series: &str) -> f64 {
        let (_, body) = self.get("/metrics").await;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in:\n{body}"))
    }

    pub async fn wait_ready(&self) {
        wait_until("manager /readyz", || async {
            self.get("/readyz").await.0 == 200
        })
        .await;
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit on its own; its exit code (None: by a signal).
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "manager still running after {within:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal and waits for the exit code (None when killed by a signal).
    pub fn stop(&mut self, signal: &str) -> Option<i32> {
        Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap().code()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The chart's RBAC must cover everything the manager does: any refusal fails
        // the test (unless it is failing already).
        if !std::thread::panicking() {
            let logs = self.logs();
            if let Some(line) = rbac_refusal(&logs) {
                panic!(
                    "the manager was refused a request with the chart's RBAC ({}):\n{line}",
                    self.log.display()
                );
            }
            // With AUTONOMIC_LOG_FORMAT=json, every line is one object without a key twice.
            assert_no_duplicate_keys(&logs);
        }
    }
}

/// The first line of `logs` that shows an RBAC refusal. The authorizer's words are
/// `<kind> "<name>" is forbidden: User "<who>" cannot <verb> …`; an admission plugin's
/// 403 (a quota, Pod Security, the API server's LimitRanger unable to reach itself while
/// it restarts) is also "forbidden" but says nothing about the chart's RBAC.
pub fn rbac_refusal(logs: &str) -> Option<&str> {
    logs.lines()
        .find(|l| l.contains("forbidden: User ") && l.contains(" cannot "))
}

/// The environment of a managed manager dialling the fake control plane at `url`, with
/// a fast backoff (100 ms … 400 ms) for tests.
pub fn managed_vars(url: String, token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AUTONOMIC_MANAGED", "true".into()),
        ("AUTONOMIC_BASE_URL", url),
        ("AUTONOMIC_AUTH_TOKEN", token.into()),
        ("AUTONOMIC_BACKOFF_INITIAL_MS", "100".into()),
        ("AUTONOMIC_BACKOFF_MAX_MS", "400".into()),
    ]
}

/// [`managed_vars`] over the legacy HTTP transport (PROTOCOL.md §8).
pub fn http_vars(url: &str, token: &str) -> Vec<(&'static str, String)> {
    let mut env = managed_vars(url.to_owned(), token);
    env.push(("AUTONOMIC_TRANSPORT", "http".into()));
    env
}

/// The variables as `Manager::start` takes them.
pub fn pairs<'a>(env: &'a [(&'a str, String)]) -> Vec<(&'a str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// A JSON merge patch of object `name`.
pub async fn merge<K>(api: &Api<K>, name: &str, patch: serde_json::Value)
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    use kube::api::{Patch, PatchParams};
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
}

/// Builds an object from YAML, for readable fixtures.
/// Creates `obj` in `api`'s namespace; the object as the API server returned it.
pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Clone + serde::Serialize + DeserializeOwned + std::fmt::Debug,
{
    api.create(&kube::api::PostParams::default(), obj)
        .await
        .unwrap_or_else(|e| panic!("create {obj:?}: {e}"))
}

/// Creates the object the YAML `text` describes; the object as the API server returned it.
pub async fn create_yaml<K>(api: &Api<K>, text: &str) -> K
where
    K: Clone + serde::Serialize + DeserializeOwned + std::fmt::Debug,
{
    api.create(&kube::api::PostParams::default(), &yaml::<K>(text))
        .await
        .unwrap_or_else(|e| panic!("create {text}: {e}"))
}

/// 40 Runtimes of about 6 KiB of spec each in `ns`: a snapshot of about 240 KiB.
pub async fn create_big_runtimes(ns: &TestNamespace) {
    let big = "x".repeat(6 * 1024);
    for i in 0..40 {
        let rt: autonomic_manager::crd::Runtime = serde_json::from_value(json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Runtime",
            "metadata": {"name": format!("big-{i}")},
            "spec": {"image": "img:1", "command": ["sh", "-c", big]},
        }))
        .unwrap();
        create(&ns.api(), &rt).await;
    }
}

pub fn yaml<K: DeserializeOwned>(text: &str) -> K {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("fixture does not parse: {e}\n{text}"))
}

// Driving shells through the fake control plane (PROTOCOL.md §6).

/// How long output or an exec's end may take to show up (a bound, not a timing claim).
pub const OUTPUT_WAIT: Duration = Duration::from_secs(60);

/// Waits for a snapshot or delta that carries Agent `ns/name` in `phase`.
pub async fn reported(cp: &FakeCp, ns: &str, name: &str, phase: &str) {
    cp.wait_frame(&format!("Agent {ns}/{name} reported {phase}"), |r| {
        r.resources().iter().any(|a| {
            a["kind"] == "Agent" && a["namespace"] == ns && a["name"] == name && a["phase"] == phase
        })
    })
    .await;
}

pub async fn open(cp: &FakeCp, channel: u32, target: Value, command: Option<&[&str]>, tty: bool) {
    let mut frame = json!({
        "type": "io_open", "channel": channel, "session_id": format!("sess-{channel}"),
        "actor": "alice@example.com", "target": target, "tty": tty, "cols": 80, "rows": 24,
    });
    if let Some(c) = command {
        frame["command"] = json!(c);
    }
    cp.send(frame).await;
}

pub fn target(ns: &str, agent: &str) -> Value {
    json!({"namespace": ns, "agent": agent})
}

pub async fn stdin(cp: &FakeCp, channel: u32, text: &str) {
    let mut b = channel.to_be_bytes().to_vec();
    b.push(0);
    b.extend_from_slice(text.as_bytes());
    cp.send_binary(b).await;
}

pub fn frame_on(t: &'static str, channel: u32) -> impl Fn(&Received) -> bool {
    move |r| {
        r.frame_type() == Some(t)
            && r.json().and_then(|v| v["channel"].as_u64()) == Some(channel as u64)
    }
}

/// Waits until `channel`'s output on `stream` holds `needle`; returns the output.
pub async fn wait_output(cp: &FakeCp, channel: u32, stream: u8, needle: &str) -> String {
    let deadline = Instant::now() + OUTPUT_WAIT;
    loop {
        let out = String::from_utf8_lossy(&cp.output(channel, stream)).into_owned();
        if out.contains(needle) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} on channel {channel} stream {stream}; output so far: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails the test when a JSON line of `log` (the manager's `AUTONOMIC_LOG_FORMAT=json`
/// output) has a key twice in one object: `serde_json` would keep the last one and log
/// pipelines disagree about which wins (a span field `name` next to the span's own name,
/// a `message` field next to the event's message). Lines that are not JSON objects (the
/// text format) are skipped; returns how many were checked.
pub fn assert_no_duplicate_keys(log: &str) -> usize {
    let mut checked = 0;
    for line in log.lines().map(str::trim).filter(|l| l.starts_with('{')) {
        match serde_json::from_str::<NoDuplicateKeys>(line) {
            Ok(_) => checked += 1,
            Err(e) if e.to_string().starts_with("duplicate key") => {
                panic!("{e} in the log line:\n{line}")
            }
            // Not JSON after all (e.g. a line cut short by a kill): nothing to check.
            Err(_) => {}
        }
    }
    checked
}

/// Deserializes any JSON value, refusing an object that holds a key twice.
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeysVisitor)
    }
}

struct NoDuplicateKeysVisitor;

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeysVisitor {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate key {key:?}"
                )));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(NoDuplicateKeys)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(NoDuplicateKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
}

/// What an ELF64 little-endian file says of its linking.
#[derive(Debug, PartialEq)]
pub struct Elf {
    pub machine: u16,
    /// ET_EXEC (2) or ET_DYN (3, a static PIE when it has no interpreter).
    pub kind: u16,
    pub interp: bool,
    pub needed: bool,
}

pub fn elf(bytes: &[u8]) -> Elf {
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(bytes[4], 2, "not ELF64");
    assert_eq!(bytes[5], 1, "not little-endian");
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36) as usize, u16_at(0x38));
    let (mut interp, mut needed) = (false, false);
    for i in 0..phnum as usize {
        let ph = phoff + i * phentsize;
        match u32::from_le_bytes(bytes[ph..ph + 4].try_into().unwrap()) {
            3 => interp = true, // PT_INTERP
            2 => {
                // PT_DYNAMIC: any DT_NEEDED entry is a shared library to load.
                let (off, size) = (u64_at(ph + 8), u64_at(ph + 32));
                needed |= bytes[off..off + size]
                    .chunks_exact(16)
                    .any(|e| u64::from_le_bytes(e[..8].try_into().unwrap()) == 1);
            }
            _ => {}
        }
    }
    Elf {
        machine: u16_at(0x12),
        kind: u16_at(0x10),
        interp,
        needed,
    }
}

/// An `audit` frame of `action` for shell session `session`.
pub fn audit_of(action: &'static str, session: String) -> impl Fn(&fake_cp::Received) -> bool {
    move |r| {
        r.frame_type() == Some("audit")
            && r.json().is_some_and(|v| {
                v["event"]["action"] == action && v["event"]["session_id"] == session.as_str()
            })
    }
}

/// The address of the test bed's pod bridge on this machine: pods reach the host there,
/// and nothing else on the network is involved.
pub fn bridge_ip() -> std::net::Ipv4Addr {
    let out = run_ok(Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "autonomic-tb0"]));
    out.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no IPv4 address on the test bed's bridge: {out:?}"))
}

/// `--set-string` arguments that point the chart at the manager image under test.
/// scripts/test loads it under the chart's default name; a run beside others on a shared
/// test bed may load its own build under another (`AUTONOMIC_TEST_MANAGER_IMAGE`).
pub fn manager_image_sets() -> Vec<String> {
    let Ok(image) = std::env::var("AUTONOMIC_TEST_MANAGER_IMAGE") else {
        return Vec::new();
    };
    let (repo, tag) = image.rsplit_once(':').unwrap();
    let (registry, repository) = repo.split_once('/').unwrap();
    [
        format!("manager.image.registry={registry}"),
        format!("manager.image.repository={repository}"),
        format!("manager.image.tag={tag}"),
    ]
    .into_iter()
    .flat_map(|set| ["--set-string".to_owned(), set])
    .collect()
}

/// A Helm release of a test, in its namespace; uninstalled on drop (its cluster-scoped
/// RBAC would outlive the namespace). `helm` runs with `HELM_NAMESPACE`, so command lines
/// stay as the docs write them.
pub struct HelmRelease {
    pub namespace: String,
    pub name: String,
    env: Vec<(String, String)>,
}

impl HelmRelease {
    pub fn new(namespace: &str, name: &str) -> Self {
        HelmRelease {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            env: Vec::new(),
        }
    }

    /// Extra environment for every `helm` call (a private repository config, say).
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(helm());
        cmd.env("HELM_NAMESPACE", &self.namespace)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(args);
        cmd
    }

    /// `helm ARGS`: its output, or a panic.
    pub fn helm(&self, args: &[&str]) -> String {
        run_ok(&mut self.command(args))
    }

    /// `helm ARGS`: whether it succeeded, and stdout and stderr together.
    pub fn try_helm(&self, args: &[&str]) -> (bool, String) {
        let out = self
            .command(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run helm {args:?}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let _ = self
            .command(&["uninstall", &self.name, "--ignore-not-found"])
            .output();
    }
}
