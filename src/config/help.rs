//! What `autonomic-manager --help` prints: the commands and every variable the manager
//! reads, with its default.

use super::DEFAULT_BASE_URL;

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
        "AUTONOMIC_POD_SECURITY",
        "restricted",
        "Pod Security Standards level (restricted, baseline or privileged) of the pods the manager creates in a namespace without the label autonomic.sh/pod-security",
    ),
    env(
        "AUTONOMIC_MAX_SPEC_BYTES",
        "262144",
        "an Agent, Tool, Runtime or Memory whose spec is larger as JSON (bytes, at least 1) is not reconciled: Error, reason SpecTooLarge",
    ),
    env(
        "AUTONOMIC_SHELL_ENABLED",
        "true",
        "false: every io_open is refused (io_close denied, audited session.denied); a namespace labelled autonomic.sh/shell=disabled refuses them either way",
    ),
    env(
        "AUTONOMIC_CONTROL_ACTIONS",
        "restart,pause,resume,delete",
        "the control actions the control plane may ask, comma-separated, or none; another is refused (control_result ok false, audited control.denied)",
    ),
    env(
        "AUTONOMIC_WIRE_ENV_VALUES",
        "mask",
        "mask: the env[].value of every spec reaches the control plane as \"***\"; send: as written (url passwords are masked either way)",
    ),
    env(
        "AUTONOMIC_MAX_SESSIONS",
        "16",
        "concurrent shell sessions on one connection",
    ),
    env(
        "AUTONOMIC_ROLL_MAX",
        "10",
        "Agents whose pods are recreated at once when the pod they should have changes (at least 1)",
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
        "POD_UID",
        "-",
        "the manager's pod uid (downward API): link Events (connected, token rejected, evicted, connection lost) are recorded on the pod when set",
    ),
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
    (
        "check",
        "check the path to the cluster and the control plane, one line a step (exit 0: all passed, 1: a step failed)",
    ),
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
