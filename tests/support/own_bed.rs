//! A test bed of the test's own: etcd and kube-apiserver (apiserver-only, no node) on
//! free ports in a state dir of its own, started by `testbed/cluster.sh`, for the faults
//! that must not touch the shared bed: kube-apiserver restarts, an extra API server on
//! the same etcd (an HA pair: changes are made through it while the other is down), and
//! etcd compactions. Taken down on drop; its `down` touches nothing outside its dir.
//!
//! [`OwnBed::make_default`] points this test process at the bed (`KUBECONFIG`, the
//! apiserver-only mode), so the support code (`client`, `kubectl`, `chart_identity`,
//! `TestNamespace`) works on it unchanged. Each integration test runs in a process of
//! its own under nextest, so that changes no other test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The beds' ports come from below the kernel's ephemeral range (32768-60999 by
/// default), never from `127.0.0.1:0`: a port the kernel handed out once it hands out
/// again, as the local port of any test's outgoing connection or `:0` listener, and a
/// restarted kube-apiserver whose port was taken meanwhile fails to bind ("address
/// already in use").
const PORTS: std::ops::Range<u16> = 28000..32700;
/// One empty file per port a bed of some test process holds, created exclusively: two
/// tests starting beds at once never pick the same port. Removed with the bed; one a
/// killed test left is taken back after a day.
const CLAIMS: &str = "/tmp/autonomic-own-bed-ports";

/// A port of [`PORTS`] no one listens on, claimed in [`CLAIMS`]; [`release`] gives it back.
fn claim_port() -> u16 {
    std::fs::create_dir_all(CLAIMS).unwrap();
    // Where this process starts looking: the claims keep processes apart, the start
    // only spreads them.
    let n = PORTS.len();
    let start = std::process::id() as usize * 7919;
    for i in 0..n {
        let port = PORTS.start + ((start + i) % n) as u16;
        let claim = format!("{CLAIMS}/{port}");
        let stale = std::fs::metadata(&claim)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default().as_secs() > 24 * 3600);
        if stale {
            let _ = std::fs::remove_file(&claim);
        }
        let new = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&claim);
        if new.is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
        let _ = std::fs::remove_file(&claim);
    }
    panic!("no free port in {PORTS:?} ({CLAIMS} holds the claimed ones)")
}

fn release(port: u16) {
    let _ = std::fs::remove_file(format!("{CLAIMS}/{port}"));
}

/// A copy of `kubeconfig` (any kubeconfig naming `https://127.0.0.1:<port>`, JSON or
/// YAML) whose server is the one on `port` instead: another API server on the same
/// etcd, or a proxy in front of one (the test beds' certificates carry the SAN
/// `127.0.0.1`, which matches any port).
pub fn kubeconfig_on(kubeconfig: &Path, port: u16) -> PathBuf {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let at = "https://127.0.0.1:";
    let start = text
        .find(at)
        .unwrap_or_else(|| panic!("{} names no {at}", kubeconfig.display()))
        + at.len();
    let end = start + text[start..].find(|c: char| !c.is_ascii_digit()).unwrap();
    let out = PathBuf::from(format!("{}-{port}", kubeconfig.display()));
    let text = format!("{}{port}{}", &text[..start], &text[end..]);
    std::fs::write(&out, text).unwrap();
    out
}

/// The API server's `127.0.0.1:<port>` in `kubeconfig`.
pub fn server_of(kubeconfig: &Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let at = "https://127.0.0.1:";
    let start = text.find(at).expect("a 127.0.0.1 server") + "https://".len();
    let end = start
        + text[start..]
            .find(|c: char| c != '.' && c != ':' && !c.is_ascii_digit())
            .unwrap();
    text[start..end].to_owned()
}

/// One bed at a time per process: [`OwnBed::make_default`] sets the process's
/// environment. Under nextest every test is a process of its own and this never waits;
/// under `cargo test` (threads) the tests that use a bed of their own take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub struct OwnBed {
    pub dir: String,
    /// The port of the bed's kube-apiserver (the one `restart_apiserver` restarts).
    pub port: u16,
    /// Every port claimed for it (its API servers' and etcd's), released on drop.
    ports: std::sync::Mutex<Vec<u16>>,
    env: Vec<(&'static str, String)>,
    /// Released after `down` (fields drop after `Drop::drop`); none for a bed that may
    /// not become the process's default ([`OwnBed::up_with_cache`]).
    _turn: Option<std::sync::MutexGuard<'static, ()>>,
}

impl OwnBed {
    /// Starts the bed; `apiserver_args` are extra kube-apiserver flags (space-separated).
    pub fn up(apiserver_args: &str) -> OwnBed {
        // A test that failed while holding it poisoned it; the next may still run.
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        Self::start(apiserver_args, Some(turn), vec![])
    }

    /// A bed whose build, image and PKI cache is `cache` (`AUTONOMIC_TESTBED_CACHE`),
    /// not yet up: [`bring_up`](Self::bring_up) starts it, from any thread, so that
    /// several start at once. None may be [`make_default`](Self::make_default)'s.
    pub fn with_cache(cache: &Path) -> OwnBed {
        let cache = ("AUTONOMIC_TESTBED_CACHE", cache.display().to_string());
        Self::new("", None, vec![cache])
    }

    /// `cluster.sh up --apiserver-only`: returns once the API server answers.
    pub fn bring_up(&self) {
        self.ok(&["up", "--apiserver-only"]);
    }

    fn start(
        apiserver_args: &str,
        turn: Option<std::sync::MutexGuard<'static, ()>>,
        env: Vec<(&'static str, String)>,
    ) -> OwnBed {
        let bed = Self::new(apiserver_args, turn, env);
        bed.bring_up();
        bed
    }

    fn new(
        apiserver_args: &str,
        turn: Option<std::sync::MutexGuard<'static, ()>>,
        mut env: Vec<(&'static str, String)>,
    ) -> OwnBed {
        let (port, etcd, peer) = (claim_port(), claim_port(), claim_port());
        let dir = format!("/tmp/autonomic-own-bed-{port}");
        env.extend([
            ("AUTONOMIC_TESTBED_DIR", dir.clone()),
            ("AUTONOMIC_TESTBED_APISERVER_PORT", port.to_string()),
            ("AUTONOMIC_TESTBED_ETCD_PORT", etcd.to_string()),
            ("AUTONOMIC_TESTBED_ETCD_PEER_PORT", peer.to_string()),
            ("AUTONOMIC_TESTBED_APISERVER_ARGS", apiserver_args.into()),
        ]);
        OwnBed {
            dir,
            port,
            ports: std::sync::Mutex::new(vec![port, etcd, peer]),
            env,
            _turn: turn,
        }
    }

    fn cluster(&self, args: &[&str]) -> Output {
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/testbed/cluster.sh"))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            // Not the test's KUBEBUILDER_ASSETS or KUBECONFIG: the bed is described above.
            .env_remove("KUBEBUILDER_ASSETS")
            .stdin(Stdio::null())
            .output()
            .expect("testbed/cluster.sh")
    }

    /// Runs a cluster.sh command that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cluster(args);
        assert!(
            out.status.success(),
            "cluster.sh {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The bed's admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(format!("{}/kubeconfig", self.dir))
    }

    /// [`kubeconfig_on`] for this bed's kubeconfigs.
    pub fn kubeconfig_on(&self, kubeconfig: &Path, port: u16) -> PathBuf {
        kubeconfig_on(kubeconfig, port)
    }

    /// Points this test process at the bed: the admin kubeconfig `kubeconfig` (this
    /// bed's, or a copy from [`kubeconfig_on`](Self::kubeconfig_on)) and the
    /// apiserver-only mode (no ServiceAccount controller to wait for).
    pub fn make_default(&self, kubeconfig: &Path) {
        assert!(self._turn.is_some(), "a bed of with_cache is no default");
        // SAFETY: called first thing in a test, before its threads (the fake control
        // plane's, kube's) exist; nextest runs each test in a process of its own, and
        // under `cargo test` the bed's turn keeps the other tests with a bed waiting.
        unsafe {
            std::env::set_var("KUBECONFIG", kubeconfig);
            std::env::set_var("AUTONOMIC_TESTBED_MODE", "apiserver");
        }
    }

    /// Stops the bed's kube-apiserver (etcd stays) and returns once it is gone.
    pub fn stop_apiserver(&self) {
        self.ok(&["stop-apiserver"]);
    }

    /// Starts it again with its flags; returns once it answers `/readyz`.
    pub fn start_apiserver(&self) {
        self.ok(&["start-apiserver"]);
    }

    /// Starts a second kube-apiserver on the same etcd; its port.
    pub fn start_second_apiserver(&self) -> u16 {
        let port = claim_port();
        self.ports.lock().unwrap().push(port);
        self.ok(&[
            "start-apiserver",
            "kube-apiserver-second",
            &port.to_string(),
        ]);
        port
    }

    /// Compacts etcd at its current revision; that revision.
    pub fn compact(&self) -> u64 {
        let out = self.ok(&["compact"]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("cluster.sh compact printed {out:?}"))
    }
}

impl Drop for OwnBed {
    fn drop(&mut self) {
        let down = self.cluster(&["down"]);
        // cluster.sh serialises up/down on a lock file beside the state dir.
        let _ = std::fs::remove_file(format!("{}.lock", self.dir));
        if down.status.success() {
            let ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
            ports.iter().copied().for_each(release);
        }
        // A `down` that fails leaves an API server and an etcd running for good: the test
        // fails rather than leak them (unless it is failing already).
        if !down.status.success() && !std::thread::panicking() {
            panic!(
                "cluster.sh down failed for {}:\n{}",
                self.dir,
                String::from_utf8_lossy(&down.stderr)
            );
        }
    }
}
