//! Configuration from the environment (PROTOCOL.md §1), parsed by a pure function so
//! tests pass a map instead of mutating the process environment.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::egress::{NoProxy, Proxy};

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

/// A parsed platform URL. Only what the connector needs: scheme, authority, path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for none).
    pub path: String,
}

impl BaseUrl {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("{s:?} is not an http:// or https:// URL"));
        };
        if rest.contains(['?', '#']) {
            return Err(format!("{s:?} must not carry a query or fragment"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!("{s:?} must not carry credentials"));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = split_host_port(authority, default_port)
            .ok_or_else(|| format!("{s:?} has no valid host[:port]"))?;
        Ok(BaseUrl {
            tls,
            host,
            port,
            path: path.trim_end_matches('/').to_owned(),
        })
    }

    /// `<base>/api/autonomic/<endpoint>` as a ws:// or wss:// (or http(s) for §8) URL.
    pub fn endpoint(&self, websocket: bool, endpoint: &str) -> String {
        let scheme = match (websocket, self.tls) {
            (true, true) => "wss",
            (true, false) => "ws",
            (false, true) => "https",
            (false, false) => "http",
        };
        format!(
            "{scheme}://{}{}/api/autonomic/{endpoint}",
            self.authority(),
            self.path
        )
    }

    /// `host:port` as it goes on the wire (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// `url` with the password of its userinfo replaced by `***` (`http://user:***@proxy:3128`),
/// or all of the userinfo when it has no `:` (a bare token): what logs, errors and the
/// Lease may show of a proxy URL. Works on text that does not parse as a URL too.
pub fn redact_userinfo(url: &str) -> String {
    let Some((start, at)) = userinfo(url) else {
        return url.to_owned();
    };
    let shown = match url[start..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{}{shown}{}", &url[..start], &url[at..])
}

/// Whether `url` carries userinfo (`user:pass@`) before its host.
pub fn has_userinfo(url: &str) -> bool {
    userinfo(url).is_some()
}

/// Where the userinfo of `url` starts and where its `@` is, if it has one: in the
/// authority (after an optional `scheme://`, up to the first `/`, `?` or `#`), before its
/// last `@`.
fn userinfo(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    authority.rfind('@').map(|at| (start, start + at))
}

/// Splits `host[:port]` / `[v6][:port]`; `None` when malformed.
pub(crate) fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let host = &rest[..end];
        host.parse::<std::net::Ipv6Addr>().ok()?;
        match &rest[end + 1..] {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let valid_host = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    if !valid_host {
        return None;
    }
    let port = match port {
        None => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
    };
    Some((host.to_owned(), port))
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
    /// Extra roots (see [`crate::egress::root_store`]).
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
    /// `AUTONOMIC_LOG`, checked: `level` and `target=level` directives, comma-separated.
    pub log_filter: String,
    pub log_format: LogFormat,
    /// Where the manager itself runs (downward API), for `hello` and the Lease.
    pub pod_namespace: String,
    pub pod_name: String,
    pub node_name: String,
    /// Concurrent shell sessions allowed on one connection.
    pub max_sessions: usize,
}

pub const DEFAULT_BASE_URL: &str = "https://exo.adaptive.live";

/// One environment variable the manager reads, as `autonomic-manager --help` lists it.
pub struct EnvVar {
    pub name: &'static str,
    /// Other names read for the same setting, after `name` (the lower-case proxy
    /// variables; `HOSTNAME` for `POD_NAME`).
    pub also: &'static [&'static str],
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn env(name: &'static str, default: &'static str, meaning: &'static str) -> EnvVar {
    EnvVar {
        name,
        also: &[],
        default,
        meaning,
    }
}

/// Every variable [`Config::parse`] reads: the one list `--help` prints, and a test
/// checks it against what `parse` asks for, so neither can drift from the other.
pub const ENV_VARS: &[EnvVar] = &[
    env(
        "AUTONOMIC_MANAGED",
        "false",
        "true opens the control-plane connection (managed mode)",
    ),
    env(
        "AUTONOMIC_BASE_URL",
        DEFAULT_BASE_URL,
        "platform URL, may carry a path prefix; http:// only to loopback unless AUTONOMIC_ALLOW_INSECURE=true",
    ),
    env(
        "AUTONOMIC_ALLOW_INSECURE",
        "false",
        "true allows a plain http:// AUTONOMIC_BASE_URL to a host that is not loopback",
    ),
    env(
        "AUTONOMIC_AUTH_TOKEN",
        "-",
        "deployment token; managed mode needs it or AUTONOMIC_AUTH_TOKEN_FILE; logs show its first 6 characters",
    ),
    env(
        "AUTONOMIC_AUTH_TOKEN_FILE",
        "-",
        "file holding the token, read before every dial (wins over AUTONOMIC_AUTH_TOKEN)",
    ),
    env(
        "AUTONOMIC_CLUSTER_ID",
        "uid of the kube-system namespace",
        "cluster id sent in hello",
    ),
    env(
        "AUTONOMIC_TRANSPORT",
        "ws",
        "ws (one WebSocket), or http (the legacy reporter)",
    ),
    env(
        "AUTONOMIC_CA_FILE",
        "-",
        "PEM bundle of extra roots for the platform's certificate",
    ),
    env(
        "SSL_CERT_FILE",
        "-",
        "PEM bundle of extra roots, as OpenSSL and Go read it",
    ),
    env(
        "SSL_CERT_DIR",
        "-",
        "directories (colon-separated) of PEM files of extra roots, as OpenSSL and Go read them",
    ),
    EnvVar {
        name: "HTTPS_PROXY",
        also: &["https_proxy"],
        default: "-",
        meaning: "proxy of the control-plane connection (HTTP CONNECT): [http://][user:password@]host[:port], port 80 by default; the API server is always reached directly",
    },
    EnvVar {
        name: "NO_PROXY",
        also: &["no_proxy"],
        default: "-",
        meaning: "hosts reached without the proxy, comma-separated: example.com (and its subdomains), .example.com or *.example.com (subdomains only), an IP, a CIDR (10.0.0.0/8, fd00::/8), [::1]; any with :port for that port only; * for all",
    },
    env(
        "AUTONOMIC_BACKOFF_INITIAL_MS",
        "1000",
        "first reconnect delay (milliseconds)",
    ),
    env(
        "AUTONOMIC_BACKOFF_MAX_MS",
        "60000",
        "reconnect delay cap (milliseconds; 5 times that after a rejected token)",
    ),
    env(
        "AUTONOMIC_EVICTION_DELAY_S",
        "300",
        "wait after being evicted by a newer connection (seconds)",
    ),
    env(
        "AUTONOMIC_WELCOME_TIMEOUT_S",
        "10",
        "wait for welcome before going on with the default intervals (seconds)",
    ),
    env(
        "AUTONOMIC_NAMESPACES",
        "all",
        "namespaces to watch, comma-separated",
    ),
    env(
        "AUTONOMIC_AGENTLET_IMAGE",
        "-",
        "agentlet image for Agents that name none",
    ),
    env(
        "AUTONOMIC_AGENTLET_RESOURCES",
        r#"{"requests":{"cpu":"10m","memory":"32Mi"},"limits":{"memory":"128Mi"}}"#,
        "the agentlet container's requests and limits (JSON)",
    ),
    env(
        "AUTONOMIC_PROBE_ADDR",
        ":8081",
        "listen address of /livez, /readyz and /metrics",
    ),
    env(
        "AUTONOMIC_LEADER_ELECTION",
        "false",
        "true elects one leader among replicas on a Lease in POD_NAMESPACE",
    ),
    env(
        "AUTONOMIC_LOG",
        "info",
        "log filter: a level and target=level directives, comma-separated (levels: off error warn info debug trace)",
    ),
    env(
        "AUTONOMIC_LOG_FORMAT",
        "text",
        "text, or json (one object a line)",
    ),
    env(
        "AUTONOMIC_MAX_SESSIONS",
        "16",
        "concurrent shell sessions on one connection",
    ),
    env(
        "POD_NAMESPACE",
        "default",
        "the manager's namespace (downward API): where the leader Lease lives",
    ),
    EnvVar {
        name: "POD_NAME",
        also: &["HOSTNAME"],
        default: "HOSTNAME, else autonomic-manager",
        meaning: "the manager's pod (downward API): in hello and the Lease holder",
    },
    env(
        "NODE_NAME",
        "-",
        "the manager's node (downward API): in hello",
    ),
];

/// Read by the Kubernetes client rather than [`Config::parse`]; listed by `--help`.
pub const KUBE_ENV_VARS: &[EnvVar] = &[
    env(
        "KUBECONFIG",
        "~/.kube/config",
        "kubeconfig used outside a cluster",
    ),
    env(
        "KUBERNETES_SERVICE_HOST",
        "-",
        "set by Kubernetes in a pod, with KUBERNETES_SERVICE_PORT: the in-cluster API server and ServiceAccount",
    ),
];

/// The commands of the binary: (name, what it does).
pub const COMMANDS: &[(&str, &str)] = &[
    ("run", "run the manager (the default)"),
    ("crds", "print the CustomResourceDefinitions (YAML)"),
    ("version", "print the version, git revision and target"),
    ("help", "print this help (also -h, --help)"),
];

/// What `autonomic-manager --help` prints.
pub fn usage() -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "autonomic-manager: the in-cluster Kubernetes operator of the autonomic.sh platform\n\n\
         Usage: autonomic-manager [COMMAND]\n\nCommands:\n",
    );
    for (name, meaning) in COMMANDS {
        let _ = writeln!(out, "  {name:<9} {meaning}");
    }
    out.push_str(
        "\nEnvironment (an empty value counts as unset; an invalid one stops start-up with\n\
         one line on stderr and exit code 2):\n",
    );
    let var = |out: &mut String, v: &EnvVar| {
        let mut names = v.name.to_owned();
        for also in v.also {
            let _ = write!(names, ", {also}");
        }
        let _ = writeln!(
            out,
            "  {names}  (default: {})\n      {}",
            v.default, v.meaning
        );
    };
    for v in ENV_VARS {
        var(&mut out, v);
    }
    out.push_str("\nRead by the Kubernetes client:\n");
    for v in KUBE_ENV_VARS {
        var(&mut out, v);
    }
    out
}

impl Config {
    /// Reads the process environment, and checks the files it names that must be
    /// readable at start-up (the trust store's).
    pub fn from_env() -> Result<Self, ConfigError> {
        let config = Self::parse(|k| std::env::var(k).ok())?;
        crate::egress::root_store(&config)?;
        Ok(config)
    }

    /// Parses configuration from any variable source. Empty values count as unset.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let flag = |k: &'static str, default: bool| -> Result<bool, ConfigError> {
            match var(k) {
                None => Ok(default),
                Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => Ok(true),
                    "false" | "0" | "no" | "off" => Ok(false),
                    _ => Err(ConfigError::Bool { var: k, value: v }),
                },
            }
        };
        let number = |k: &'static str, default: u64| -> Result<u64, ConfigError> {
            match var(k) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| ConfigError::Number { var: k, value: v }),
            }
        };

        let managed = flag("AUTONOMIC_MANAGED", false)?;
        let allow_insecure = flag("AUTONOMIC_ALLOW_INSECURE", false)?;
        let base_url_raw = var("AUTONOMIC_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.into());
        let base_url =
            BaseUrl::parse(base_url_raw.trim()).map_err(|reason| ConfigError::Invalid {
                var: "AUTONOMIC_BASE_URL",
                reason,
            })?;
        if !base_url.tls && !base_url.is_loopback() && !allow_insecure {
            return Err(ConfigError::Invalid {
                var: "AUTONOMIC_BASE_URL",
                reason: format!(
                    "plain http:// to {} would send the token unencrypted; use https:// or set AUTONOMIC_ALLOW_INSECURE=true",
                    base_url.host
                ),
            });
        }
        let transport = match var("AUTONOMIC_TRANSPORT").as_deref().map(str::trim) {
            None | Some("ws") => Transport::Ws,
            Some("http") => Transport::Http,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_TRANSPORT",
                    reason: format!("expected ws or http, got {other:?}"),
                });
            }
        };
        let token = var("AUTONOMIC_AUTH_TOKEN").map(Token::new);
        let token_file = var("AUTONOMIC_AUTH_TOKEN_FILE").map(PathBuf::from);
        if managed && token.is_none() && token_file.is_none() {
            return Err(ConfigError::MissingToken);
        }
        let log_format = match var("AUTONOMIC_LOG_FORMAT").as_deref().map(str::trim) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_LOG_FORMAT",
                    reason: format!("expected json or text, got {other:?}"),
                });
            }
        };
        let probe_addr = match var("AUTONOMIC_PROBE_ADDR") {
            None => SocketAddr::from(([0, 0, 0, 0], 8081)),
            Some(v) => parse_listen_addr(v.trim()).ok_or_else(|| ConfigError::Invalid {
                var: "AUTONOMIC_PROBE_ADDR",
                reason: format!("expected [host]:port, got {v:?}"),
            })?,
        };
        let namespaces: Vec<String> = var("AUTONOMIC_NAMESPACES")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let leader_election = flag("AUTONOMIC_LEADER_ELECTION", false)?;
        // The Lease lives in the manager's own namespace; guessing one could make two
        // installs elect in different places and both lead.
        if leader_election && var("POD_NAMESPACE").is_none() {
            return Err(ConfigError::Invalid {
                var: "POD_NAMESPACE",
                reason: "AUTONOMIC_LEADER_ELECTION=true needs the namespace of the leader Lease; set POD_NAMESPACE (the downward API's metadata.namespace)".into(),
            });
        }
        let pod_namespace = var("POD_NAMESPACE").unwrap_or_else(|| "default".into());
        let pod_name = var("POD_NAME")
            .or_else(|| var("HOSTNAME"))
            .unwrap_or_else(|| "autonomic-manager".into());
        let cluster_id = var("AUTONOMIC_CLUSTER_ID").map(|v| v.trim().to_owned());
        let agentlet_resources = match var("AUTONOMIC_AGENTLET_RESOURCES") {
            None => default_agentlet_resources(),
            Some(v) => serde_json::from_str(&v).map_err(|e| ConfigError::Invalid {
                var: "AUTONOMIC_AGENTLET_RESOURCES",
                reason: format!("expected a JSON object of requests and limits: {e}"),
            })?,
        };
        let invalid =
            |var: &'static str| move |reason: String| ConfigError::Invalid { var, reason };
        let https_proxy = var("HTTPS_PROXY")
            .map(|v| ("HTTPS_PROXY", v))
            .or_else(|| var("https_proxy").map(|v| ("https_proxy", v)))
            .map(|(name, v)| Proxy::parse(&v).map_err(invalid(name)))
            .transpose()?;
        let no_proxy = match var("NO_PROXY")
            .map(|v| ("NO_PROXY", v))
            .or_else(|| var("no_proxy").map(|v| ("no_proxy", v)))
        {
            None => NoProxy::default(),
            Some((name, v)) => NoProxy::parse(&v).map_err(invalid(name))?,
        };
        let log_filter = match var("AUTONOMIC_LOG") {
            None => "info".to_owned(),
            Some(v) => check_log_filter(&v).map_err(invalid("AUTONOMIC_LOG"))?,
        };
        for ns in &namespaces {
            if !is_dns_label(ns) {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_NAMESPACES",
                    reason: format!(
                        "{ns:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"
                    ),
                });
            }
        }
        let backoff_initial = Duration::from_millis(number("AUTONOMIC_BACKOFF_INITIAL_MS", 1000)?);
        let backoff_max = Duration::from_millis(number("AUTONOMIC_BACKOFF_MAX_MS", 60_000)?);
        if backoff_initial.is_zero() || backoff_max < backoff_initial {
            return Err(ConfigError::Invalid {
                var: "AUTONOMIC_BACKOFF_MAX_MS",
                reason: "the backoff needs 0 < initial <= max".into(),
            });
        }
        Ok(Config {
            managed,
            base_url,
            token,
            token_file,
            cluster_id,
            transport,
            ca_file: var("AUTONOMIC_CA_FILE").map(|v| PathBuf::from(v.trim())),
            ssl_cert_file: var("SSL_CERT_FILE").map(|v| PathBuf::from(v.trim())),
            // Colon-separated, as OpenSSL and Go read it; empty parts are skipped.
            ssl_cert_dirs: var("SSL_CERT_DIR")
                .map(|v| {
                    v.split(':')
                        .map(str::trim)
                        .filter(|d| !d.is_empty())
                        .map(PathBuf::from)
                        .collect()
                })
                .unwrap_or_default(),
            https_proxy,
            no_proxy,
            allow_insecure,
            backoff_initial,
            backoff_max,
            eviction_delay: Duration::from_secs(number("AUTONOMIC_EVICTION_DELAY_S", 300)?),
            welcome_timeout: Duration::from_secs(number("AUTONOMIC_WELCOME_TIMEOUT_S", 10)?),
            agentlet_image: var("AUTONOMIC_AGENTLET_IMAGE"),
            agentlet_resources,
            namespaces,
            probe_addr,
            leader_election,
            log_filter,
            log_format,
            pod_namespace,
            pod_name,
            node_name: var("NODE_NAME").unwrap_or_default(),
            max_sessions: number("AUTONOMIC_MAX_SESSIONS", 16)? as usize,
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
/// after a comma as part of a target: both are refused here instead.
fn check_log_filter(value: &str) -> Result<String, String> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
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
    filter
        .parse::<Targets>()
        .map_err(|e| format!("{value:?}: {e}"))?;
    Ok(filter)
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
    fn cluster_id_is_read_from_the_cluster_unless_set() {
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
    fn proxy_userinfo_is_redacted() {
        let cases = [
            ("http://user:pass@proxy:3128", "http://user:***@proxy:3128"),
            (
                "http://user:pass@proxy:3128/",
                "http://user:***@proxy:3128/",
            ),
            ("http://user:p%40ss:w@proxy", "http://user:***@proxy"),
            ("http://us%3Aer:pa@ss@proxy:1", "http://us%3Aer:***@proxy:1"),
            ("http://token@proxy:3128", "http://***@proxy:3128"),
            ("http://:pass@proxy", "http://:***@proxy"),
            ("user:pass@proxy:3128", "user:***@proxy:3128"),
            (
                "HTTPS://u:p@[::1]:8080/x?y@z",
                "HTTPS://u:***@[::1]:8080/x?y@z",
            ),
            ("http://proxy:3128", "http://proxy:3128"),
            ("http://proxy:3128/a@b", "http://proxy:3128/a@b"),
            ("proxy", "proxy"),
            ("", ""),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_userinfo(url), shown, "{url}");
            assert_eq!(has_userinfo(url), url != shown, "{url}");
            assert!(has_userinfo("http://***@proxy"));
        }
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
            assert_eq!(c.log_filter, normalised, "{value}");
            normalised
                .parse::<tracing_subscriber::filter::Targets>()
                .unwrap();
        }
        assert_eq!(parse(&[]).unwrap().log_filter, "info");
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
