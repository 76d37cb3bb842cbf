//! Configuration from the environment (PROTOCOL.md §1), parsed by a pure function so
//! tests pass a map instead of mutating the process environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;
use tracing_subscriber::filter::Targets;

use crate::crd::PodSecurityLevel;
use crate::egress::{NoProxy, Proxy};

mod help;
mod url;
mod vars;

pub use help::{COMMANDS, ENV_VARS, EnvVar, KUBE_ENV_VARS, usage};
pub use url::BaseUrl;
use vars::{Vars, check_namespaces, invalid};

/// Why the configuration was refused. Printed as one line; the process exits 2.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}: expected true or false, got {value:?}")]
    Bool { var: &'static str, value: String },
    #[error("{var}: expected a whole number, got {value:?}")]
    Number { var: &'static str, value: String },
    #[error("{var}: {reason}")]
    Invalid { var: &'static str, reason: String },
    #[error(
        "AUTONOMIC_MANAGED=true needs a token: set AUTONOMIC_AUTH_TOKEN or AUTONOMIC_AUTH_TOKEN_FILE"
    )]
    MissingToken,
}

/// How the manager talks to the control plane in managed mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One outbound WebSocket (the default).
    Ws,
    /// The legacy HTTP reporter (PROTOCOL.md §8).
    Http,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The deployment token. Its `Debug` shows only the prefix the dashboard shows, so a
/// stray `{:?}` can never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(value: impl Into<String>) -> Self {
        Token(value.into().trim().to_owned())
    }
    /// The whole token, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The first six characters: what logs and the dashboard may show.
    pub fn prefix(&self) -> String {
        self.0.chars().take(6).collect()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({}…)", self.prefix())
    }
}

/// Everything the manager reads from its environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub managed: bool,
    pub base_url: BaseUrl,
    pub token: Option<Token>,
    pub token_file: Option<PathBuf>,
    /// `AUTONOMIC_CLUSTER_ID`; unset: the uid of the `kube-system` namespace, read at
    /// connect time (stable across restarts, rollouts and failovers).
    pub cluster_id: Option<String>,
    pub transport: Transport,
    /// Extra roots (see [`Config::root_store`]).
    pub ca_file: Option<PathBuf>,
    pub ssl_cert_file: Option<PathBuf>,
    pub ssl_cert_dirs: Vec<PathBuf>,
    pub https_proxy: Option<Proxy>,
    pub no_proxy: NoProxy,
    pub allow_insecure: bool,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub eviction_delay: Duration,
    pub welcome_timeout: Duration,
    /// Image of the agentlet sidecar when an Agent names none.
    pub agentlet_image: Option<String>,
    /// Compute resources of the agentlet sidecar (`AUTONOMIC_AGENTLET_RESOURCES`, JSON).
    pub agentlet_resources: ResourceRequirements,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    pub probe_addr: SocketAddr,
    pub leader_election: bool,
    /// `AUTONOMIC_LOG`, checked (`level` and `target=level` directives, comma-separated)
    /// and parsed once here, as the log subscriber reads it.
    pub log_targets: Targets,
    pub log_format: LogFormat,
    /// Where the manager itself runs (downward API), for `hello` and the Lease.
    pub pod_namespace: String,
    pub pod_name: String,
    /// `namespace/name` of the ServiceAccount the manager's credential names, never
    /// lent to an Agent (TRUST.md §2). Not configuration: `run` reads it from the
    /// credential (in-cluster token or kubeconfig); `None` for any other credential.
    pub own_service_account: Option<String>,
    /// The manager's pod uid (downward API `metadata.uid`); empty outside a pod. Link
    /// Events are recorded on the pod only when it is known: `kubectl describe pod`
    /// finds Events by the pod's uid.
    pub pod_uid: String,
    pub node_name: String,
    /// Concurrent shell sessions allowed on one connection.
    pub max_sessions: usize,
    /// Agents whose pods are recreated at once when the pod they should have changes
    /// (a Runtime edit, a new default agentlet image); at least 1.
    pub roll_max: usize,
    /// `AUTONOMIC_POD_SECURITY`: the Pod Security Standards level of the pods the
    /// manager creates in a namespace without the label `autonomic.sh/pod-security`
    /// (TRUST.md §1).
    pub pod_security: PodSecurityLevel,
    /// `AUTONOMIC_MAX_SPEC_BYTES`: an Agent, Tool, Runtime or Memory whose spec is larger
    /// as JSON is kept as a stub and not reconciled (TRUST.md §3); at least 1.
    pub max_spec_bytes: u64,
    /// `AUTONOMIC_WIRE_ENV_VALUES=send`: the `env[].value`s of specs reach the control
    /// plane as written; by default (`mask`) each is sent as `***` (TRUST.md §4).
    pub send_env_values: bool,
    /// `AUTONOMIC_SHELL_ENABLED` (default true): whether the control plane may open
    /// shells at all; a namespace labelled `autonomic.sh/shell: disabled` refuses them
    /// either way (TRUST.md §5).
    pub shell_enabled: bool,
    /// `AUTONOMIC_CONTROL_ACTIONS`: the `control` actions the control plane may ask, of
    /// [`CONTROL_ACTIONS`] (all by default; `none` for none) (TRUST.md §5).
    pub control_actions: Vec<&'static str>,
}

/// Every `control` action there is (PROTOCOL.md §3), by its wire name.
pub const CONTROL_ACTIONS: [&str; 4] = ["restart", "pause", "resume", "delete"];

/// `AUTONOMIC_CONTROL_ACTIONS`: names of [`CONTROL_ACTIONS`], comma-separated, or
/// `none`; unset, all of them.
fn control_actions(v: Option<&str>) -> Result<Vec<&'static str>, ConfigError> {
    let Some(v) = v else {
        return Ok(CONTROL_ACTIONS.to_vec());
    };
    if v.trim() == "none" {
        return Ok(Vec::new());
    }
    let mut allowed = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(known) = CONTROL_ACTIONS.iter().find(|a| **a == name) else {
            return Err(ConfigError::Invalid {
                var: "AUTONOMIC_CONTROL_ACTIONS",
                reason: format!(
                    "{name:?} is not a control action: expected some of {} (comma-separated), or none",
                    CONTROL_ACTIONS.join(", ")
                ),
            });
        };
        if !allowed.contains(known) {
            allowed.push(*known);
        }
    }
    Ok(allowed)
}

/// The default of `AUTONOMIC_ROLL_MAX`: ten Agents out of service at once is a small
/// share of a fleet big enough to care, and ten pod starts (image pulls) at once are
/// what one node takes in its stride; a roll of 500 Agents whose pods start in ~10 s
/// takes about eight minutes.
pub const DEFAULT_ROLL_MAX: u64 = 10;

pub const DEFAULT_BASE_URL: &str = "https://exo.adaptive.live";

impl Config {
    /// The roots the platform's certificate is checked against (see
    /// [`crate::egress::root_store`]).
    pub fn root_store(&self) -> Result<rustls::RootCertStore, ConfigError> {
        crate::egress::root_store(
            self.ca_file.as_deref(),
            self.ssl_cert_file.as_deref(),
            &self.ssl_cert_dirs,
        )
        .map_err(|e| ConfigError::Invalid {
            var: e.var,
            reason: e.reason,
        })
    }

    /// Reads the process environment, and checks the files it names that must be
    /// readable at start-up (the trust store's).
    pub fn from_env() -> Result<Self, ConfigError> {
        let config = Self::parse(|k| std::env::var(k).ok())?;
        config.root_store()?;
        Ok(config)
    }

    /// Parses configuration from any variable source. Empty values count as unset.
    /// The settings are checked group by group, in this order.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let v = Vars(get);
        let vars::ControlPlane {
            managed,
            allow_insecure,
            base_url,
            transport,
        } = v.control_plane()?;
        let (token, token_file) = v.token(managed)?;
        let vars::Process {
            log_format,
            probe_addr,
            namespaces,
            leader_election,
        } = v.process()?;
        let (pod_namespace, pod_name) = v.own_pod(leader_election)?;
        let cluster_id = v.var("AUTONOMIC_CLUSTER_ID").map(|v| v.trim().to_owned());
        let agentlet_resources = v.agentlet_resources()?;
        let (https_proxy, no_proxy) = v.proxy()?;
        let log = v.var("AUTONOMIC_LOG").unwrap_or_else(|| "info".into());
        let (_, log_targets) = check_log_filter(&log).map_err(invalid("AUTONOMIC_LOG"))?;
        check_namespaces(&namespaces)?;
        let pod_security = v.pod_security()?;
        let (backoff_initial, backoff_max) = v.backoff()?;
        let vars::Limits {
            eviction_delay,
            welcome_timeout,
            max_sessions,
            roll_max,
            max_spec_bytes,
        } = v.limits()?;
        Ok(Config {
            managed,
            base_url,
            token,
            token_file,
            cluster_id,
            transport,
            ca_file: v.var("AUTONOMIC_CA_FILE").map(|v| PathBuf::from(v.trim())),
            ssl_cert_file: v.var("SSL_CERT_FILE").map(|v| PathBuf::from(v.trim())),
            ssl_cert_dirs: v.ssl_cert_dirs(),
            https_proxy,
            no_proxy,
            allow_insecure,
            backoff_initial,
            backoff_max,
            eviction_delay,
            welcome_timeout,
            agentlet_image: v.var("AUTONOMIC_AGENTLET_IMAGE"),
            agentlet_resources,
            namespaces,
            probe_addr,
            leader_election,
            log_targets,
            log_format,
            pod_namespace,
            pod_name,
            own_service_account: None,
            pod_uid: v.var("POD_UID").unwrap_or_default(),
            node_name: v.var("NODE_NAME").unwrap_or_default(),
            max_sessions,
            roll_max,
            pod_security,
            max_spec_bytes,
            send_env_values: v.send_env_values()?,
            shell_enabled: v.flag("AUTONOMIC_SHELL_ENABLED", true)?,
            control_actions: control_actions(v.var("AUTONOMIC_CONTROL_ACTIONS").as_deref())?,
        })
    }

    /// Whether the manager watches this namespace.
    pub fn watches(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }
}

/// The agentlet's default requests and limits: a small proxy process. Requests make the
/// pod schedulable on a full node's accounting; the memory limit keeps a leaking sidecar
/// from taking the agent's node down. `AUTONOMIC_AGENTLET_RESOURCES` replaces them.
pub fn default_agentlet_resources() -> ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |s: &str| Quantity(s.to_owned());
    ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_owned(), q("10m")),
                ("memory".to_owned(), q("32Mi")),
            ]
            .into(),
        ),
        limits: Some([("memory".to_owned(), q("128Mi"))].into()),
        ..Default::default()
    }
}

/// `AUTONOMIC_LOG` checked and normalised (directives trimmed, empty ones dropped): each
/// directive is a level (`off`, `error`, `warn`, `info`, `debug`, `trace`) or
/// `target=level`. `tracing_subscriber`'s own parser would take a misspelt level
/// (`debgu`) as a target enabled at trace, silencing everything else, and a space
/// after a comma as part of a target: both are refused here instead. With it, the
/// filter parsed: `Targets` reads the same directives as `EnvFilter` without
/// `EnvFilter`'s regex engine (about a megabyte of binary).
fn check_log_filter(value: &str) -> Result<(String, Targets), String> {
    use tracing_subscriber::filter::LevelFilter;
    let mut directives = Vec::new();
    for directive in value.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = |l: &str| {
            l.trim().parse::<LevelFilter>().map_err(|_| {
                format!(
                    "{l:?} in {directive:?} is not a level (off, error, warn, info, debug, trace)"
                )
            })
        };
        match directive.split_once('=') {
            None => {
                level(directive).map_err(|_| {
                    format!("{directive:?} is not a level (off, error, warn, info, debug, trace); a target needs one: {directive}=debug")
                })?;
                directives.push(directive.to_owned());
            }
            Some((target, l)) => {
                let target = target.trim();
                let plain = !target.is_empty()
                    && target
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'));
                if !plain {
                    return Err(format!(
                        "{target:?} in {directive:?} is not a target (a module path such as autonomic_manager::connect; span and field filters are not supported)"
                    ));
                }
                level(l)?;
                directives.push(format!("{target}={}", l.trim()));
            }
        }
    }
    if directives.is_empty() {
        return Err(format!("{value:?} holds no directive"));
    }
    let filter = directives.join(",");
    let targets = filter
        .parse::<Targets>()
        .map_err(|e| format!("{value:?}: {e}"))?;
    Ok((filter, targets))
}

/// A Kubernetes namespace name: a DNS-1123 label.
fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `:8081`, `0.0.0.0:8081`, `127.0.0.1:0`, `[::]:8081`.
fn parse_listen_addr(s: &str) -> Option<SocketAddr> {
    if let Some(port) = s.strip_prefix(':') {
        return Some(SocketAddr::from(([0, 0, 0, 0], port.parse().ok()?)));
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_unmanaged_and_need_nothing() {
        let c = parse(&[]).unwrap();
        assert!(!c.managed);
        assert_eq!(c.transport, Transport::Ws);
        assert_eq!(c.base_url.host, "exo.adaptive.live");
        assert!(c.base_url.tls);
        assert_eq!(c.probe_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(c.backoff_initial, Duration::from_secs(1));
        assert_eq!(c.backoff_max, Duration::from_secs(60));
        assert_eq!(c.eviction_delay, Duration::from_secs(300));
        assert_eq!(c.welcome_timeout, Duration::from_secs(10));
        assert!(c.namespaces.is_empty());
        assert!(c.watches("anything"));
        assert!(!c.leader_election);
        let c = parse(&[
            ("AUTONOMIC_LEADER_ELECTION", "true"),
            ("POD_NAMESPACE", "autonomic-system"),
        ])
        .unwrap();
        assert!(c.leader_election);
    }

    #[test]
    fn pod_security_is_restricted_unless_set() {
        assert_eq!(
            parse(&[]).unwrap().pod_security,
            PodSecurityLevel::Restricted
        );
        for level in PodSecurityLevel::ALL {
            let c = parse(&[("AUTONOMIC_POD_SECURITY", &format!(" {level} "))]).unwrap();
            assert_eq!(c.pod_security, level);
        }
        let err = parse(&[("AUTONOMIC_POD_SECURITY", "none")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "AUTONOMIC_POD_SECURITY: expected restricted, baseline or privileged, got \"none\""
        );
    }

    #[test]
    fn shells_and_every_control_action_are_allowed_unless_the_admin_says_otherwise() {
        let c = parse(&[]).unwrap();
        assert!(c.shell_enabled);
        assert_eq!(c.control_actions, CONTROL_ACTIONS);
        let c = parse(&[
            ("AUTONOMIC_SHELL_ENABLED", "false"),
            ("AUTONOMIC_CONTROL_ACTIONS", " pause, resume,,pause "),
        ])
        .unwrap();
        assert!(!c.shell_enabled);
        assert_eq!(c.control_actions, ["pause", "resume"]);
        let none = parse(&[("AUTONOMIC_CONTROL_ACTIONS", "none")]).unwrap();
        assert!(none.control_actions.is_empty());
        let err = parse(&[("AUTONOMIC_CONTROL_ACTIONS", "pause,exec")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "AUTONOMIC_CONTROL_ACTIONS: \"exec\" is not a control action: expected some of restart, pause, resume, delete (comma-separated), or none"
        );
    }

    #[test]
    fn env_values_are_masked_unless_send() {
        assert!(!parse(&[]).unwrap().send_env_values);
        assert!(
            !parse(&[("AUTONOMIC_WIRE_ENV_VALUES", "mask")])
                .unwrap()
                .send_env_values
        );
        assert!(
            parse(&[("AUTONOMIC_WIRE_ENV_VALUES", " send ")])
                .unwrap()
                .send_env_values
        );
        let err = parse(&[("AUTONOMIC_WIRE_ENV_VALUES", "yes")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "AUTONOMIC_WIRE_ENV_VALUES: expected mask or send, got \"yes\""
        );
    }

    #[test]
    fn max_spec_bytes_is_256_kib_unless_set() {
        assert_eq!(parse(&[]).unwrap().max_spec_bytes, 262_144);
        let c = parse(&[("AUTONOMIC_MAX_SPEC_BYTES", " 1048576 ")]).unwrap();
        assert_eq!(c.max_spec_bytes, 1 << 20);
        let err = parse(&[("AUTONOMIC_MAX_SPEC_BYTES", "256Ki")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "AUTONOMIC_MAX_SPEC_BYTES: expected a whole number, got \"256Ki\""
        );
        let err = parse(&[("AUTONOMIC_MAX_SPEC_BYTES", "0")]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("AUTONOMIC_MAX_SPEC_BYTES: 0 would refuse every object"),
            "{err}"
        );
    }

    #[test]
    fn cluster_id_is_none_unless_set_and_trimmed_when_set() {
        let c = parse(&[("POD_NAMESPACE", "autonomic-system"), ("HOSTNAME", "m-1")]).unwrap();
        assert_eq!(c.cluster_id, None);
        let c = parse(&[("AUTONOMIC_CLUSTER_ID", " prod-eu ")]).unwrap();
        assert_eq!(c.cluster_id.as_deref(), Some("prod-eu"));
    }

    #[test]
    fn agentlet_resources_default_and_override() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.agentlet_resources, default_agentlet_resources());
        let c = parse(&[(
            "AUTONOMIC_AGENTLET_RESOURCES",
            r#"{"requests":{"cpu":"50m"},"limits":{"memory":"256Mi"}}"#,
        )])
        .unwrap();
        let limits = c.agentlet_resources.limits.unwrap();
        assert_eq!(limits["memory"].0, "256Mi");
        let err = parse(&[("AUTONOMIC_AGENTLET_RESOURCES", "lots")]).unwrap_err();
        assert!(
            err.to_string().starts_with("AUTONOMIC_AGENTLET_RESOURCES:"),
            "{err}"
        );
    }

    #[test]
    fn refusals_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("AUTONOMIC_MANAGED", "maybe")], "AUTONOMIC_MANAGED"),
            (&[("AUTONOMIC_BASE_URL", "ftp://x")], "AUTONOMIC_BASE_URL"),
            (&[("AUTONOMIC_BASE_URL", "https://")], "AUTONOMIC_BASE_URL"),
            (
                &[("AUTONOMIC_BASE_URL", "https://h:99999")],
                "AUTONOMIC_BASE_URL",
            ),
            (&[("AUTONOMIC_TRANSPORT", "grpc")], "AUTONOMIC_TRANSPORT"),
            (&[("AUTONOMIC_MANAGED", "true")], "AUTONOMIC_AUTH_TOKEN"),
            (
                &[("AUTONOMIC_BASE_URL", "http://cp.example.com")],
                "AUTONOMIC_ALLOW_INSECURE",
            ),
            (
                &[("AUTONOMIC_BACKOFF_INITIAL_MS", "soon")],
                "AUTONOMIC_BACKOFF_INITIAL_MS",
            ),
            (
                &[("AUTONOMIC_PROBE_ADDR", "nowhere")],
                "AUTONOMIC_PROBE_ADDR",
            ),
            (&[("AUTONOMIC_LOG_FORMAT", "xml")], "AUTONOMIC_LOG_FORMAT"),
            (&[("AUTONOMIC_LEADER_ELECTION", "true")], "POD_NAMESPACE"),
            (
                &[("AUTONOMIC_LEADER_ELECTION", "sometimes")],
                "AUTONOMIC_LEADER_ELECTION",
            ),
            (
                &[("AUTONOMIC_POD_SECURITY", "strict")],
                "AUTONOMIC_POD_SECURITY",
            ),
            (
                &[("AUTONOMIC_POD_SECURITY", "Restricted")],
                "AUTONOMIC_POD_SECURITY",
            ),
            (
                &[("AUTONOMIC_MAX_SPEC_BYTES", "-1")],
                "AUTONOMIC_MAX_SPEC_BYTES",
            ),
            (
                &[("AUTONOMIC_MAX_SPEC_BYTES", "0")],
                "AUTONOMIC_MAX_SPEC_BYTES",
            ),
        ];
        for (vars, needle) in cases {
            let err = parse(vars).expect_err(needle).to_string();
            assert!(err.contains(needle), "{err:?} should name {needle}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
    }

    #[test]
    fn plain_http_is_allowed_to_loopback_or_when_told() {
        for url in [
            "http://127.0.0.1:8080",
            "http://localhost:1",
            "http://[::1]:9/x",
        ] {
            parse(&[("AUTONOMIC_BASE_URL", url)]).expect(url);
        }
        parse(&[
            ("AUTONOMIC_BASE_URL", "http://cp.internal"),
            ("AUTONOMIC_ALLOW_INSECURE", "true"),
        ])
        .unwrap();
    }

    #[test]
    fn managed_with_token_or_token_file() {
        let c = parse(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", " tok_abcdef123 \n"),
        ])
        .unwrap();
        assert!(c.managed);
        assert_eq!(c.token.as_ref().unwrap().expose(), "tok_abcdef123");
        assert_eq!(c.token.as_ref().unwrap().prefix(), "tok_ab");
        assert!(!format!("{c:?}").contains("tok_abcdef123"));
        parse(&[
            ("AUTONOMIC_MANAGED", "TRUE"),
            ("AUTONOMIC_AUTH_TOKEN_FILE", "/var/run/token"),
        ])
        .unwrap();
    }

    #[test]
    fn endpoint_keeps_prefix_without_doubling_slashes() {
        let cases = [
            (
                "https://exo.adaptive.live",
                "wss://exo.adaptive.live:443/api/autonomic/connect",
            ),
            (
                "https://cp.example/platform/",
                "wss://cp.example:443/platform/api/autonomic/connect",
            ),
            (
                "http://127.0.0.1:9000/a/b//",
                "ws://127.0.0.1:9000/a/b/api/autonomic/connect",
            ),
            ("http://[::1]:9000", "ws://[::1]:9000/api/autonomic/connect"),
        ];
        for (base, want) in cases {
            assert_eq!(
                BaseUrl::parse(base).unwrap().endpoint(true, "connect"),
                want
            );
        }
        assert_eq!(
            BaseUrl::parse("https://h/p")
                .unwrap()
                .endpoint(false, "report"),
            "https://h:443/p/api/autonomic/report"
        );
    }

    #[test]
    fn config_debug_does_not_show_proxy_credentials() {
        let c = parse(&[("HTTPS_PROXY", "http://user:s3cr3t@proxy:3128")]).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("http://user:***@proxy:3128"), "{shown}");
        let c = parse(&[("https_proxy", "http://user:s3cr3t@proxy:3128")]).unwrap();
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }

    #[test]
    fn namespaces_list() {
        let c = parse(&[("AUTONOMIC_NAMESPACES", "a, b,,c ")]).unwrap();
        assert_eq!(c.namespaces, ["a", "b", "c"]);
        assert!(c.watches("b") && !c.watches("d"));
        for bad in ["Team-A", "a b", "-a", "a_b", &"x".repeat(64)] {
            let err = parse(&[("AUTONOMIC_NAMESPACES", bad)]).expect_err(bad);
            assert!(
                err.to_string().starts_with("AUTONOMIC_NAMESPACES: "),
                "{err}"
            );
        }
    }

    /// Every variable `parse` asks for is in [`ENV_VARS`] (so `--help` lists it), and
    /// every one listed is asked for.
    #[test]
    fn the_help_lists_exactly_the_variables_parse_reads() {
        let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
        Config::parse(|k| {
            asked.borrow_mut().insert(k.to_owned());
            None
        })
        .unwrap();
        // Those read only when another is set.
        Config::parse(|k| {
            asked.borrow_mut().insert(k.to_owned());
            (k == "AUTONOMIC_LEADER_ELECTION" || k == "POD_NAMESPACE").then(|| "true".into())
        })
        .unwrap();
        let listed: std::collections::BTreeSet<String> = ENV_VARS
            .iter()
            .flat_map(|v| std::iter::once(v.name).chain(v.also.iter().copied()))
            .map(str::to_owned)
            .collect();
        assert_eq!(asked.into_inner(), listed);
        let help = usage();
        for v in ENV_VARS.iter().chain(KUBE_ENV_VARS) {
            assert!(help.contains(v.name), "{}", v.name);
            assert!(help.contains(v.meaning), "{}", v.name);
            assert!(
                help.contains(&format!("(default: {})", v.default)),
                "{}",
                v.name
            );
        }
        for (command, _) in COMMANDS {
            assert!(help.contains(&format!("\n  {command} ")), "{command}");
        }
    }

    #[test]
    fn log_filters_are_checked_not_replaced() {
        for (value, normalised) in [
            ("debug", "debug"),
            ("INFO", "INFO"),
            (
                "info, autonomic_manager=debug ,",
                "info,autonomic_manager=debug",
            ),
            (
                "warn,kube_runtime::watcher=off,audit=info",
                "warn,kube_runtime::watcher=off,audit=info",
            ),
            ("autonomic_manager = trace", "autonomic_manager=trace"),
        ] {
            let c = parse(&[("AUTONOMIC_LOG", value)]).expect(value);
            assert_eq!(check_log_filter(value).unwrap().0, normalised, "{value}");
            assert_eq!(
                c.log_targets,
                normalised.parse::<Targets>().unwrap(),
                "{value}"
            );
        }
        assert_eq!(
            parse(&[]).unwrap().log_targets,
            "info".parse::<Targets>().unwrap()
        );
        for value in [
            "debgu",
            "verbose",
            "autonomic_manager",
            "info,autonomic_manager=loud",
            "=debug",
            "a=b=c",
            "info,kube[{name}]=debug",
            "my target=debug",
            ",",
        ] {
            let err = parse(&[("AUTONOMIC_LOG", value)])
                .expect_err(value)
                .to_string();
            assert!(err.starts_with("AUTONOMIC_LOG: "), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn proxy_settings_are_parsed_at_start() {
        let c = parse(&[
            ("HTTPS_PROXY", "user:s3cr3t@proxy.internal:3128"),
            ("NO_PROXY", ".svc,10.0.0.0/8"),
        ])
        .unwrap();
        let proxy = c.https_proxy.as_ref().unwrap();
        assert_eq!(proxy.to_string(), "http://user:***@proxy.internal:3128");
        assert_eq!(proxy.authority(), "proxy.internal:3128");
        assert!(c.no_proxy.bypasses("api.default.svc", 443));
        assert!(c.no_proxy.bypasses("10.96.0.1", 443));
        assert!(!c.no_proxy.bypasses("exo.adaptive.live", 443));
        let c = parse(&[("https_proxy", "proxy:1"), ("no_proxy", "*")]).unwrap();
        assert_eq!(c.https_proxy.unwrap().authority(), "proxy:1");
        assert!(c.no_proxy.bypasses("anything", 1));
        // The upper-case name wins, as in Go.
        let c = parse(&[("HTTPS_PROXY", "a:1"), ("https_proxy", "b:2")]).unwrap();
        assert_eq!(c.https_proxy.unwrap().authority(), "a:1");
        for (var, value) in [
            ("HTTPS_PROXY", "https://user:s3cr3t@proxy:3128"),
            ("https_proxy", "http://user:s3cr3t@proxy:http"),
            ("NO_PROXY", "10.0.0.0/40"),
            ("no_proxy", "bad host"),
        ] {
            let err = parse(&[(var, value)]).expect_err(value).to_string();
            assert!(err.starts_with(&format!("{var}: ")), "{err}");
            assert!(!err.contains("s3cr3t"), "{err}");
        }
    }
}
