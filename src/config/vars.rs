//! The variables [`Config::parse`](super::Config::parse) reads, one group of settings
//! per method, each checked as it is read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ResourceRequirements;

use super::{
    BaseUrl, ConfigError, DEFAULT_BASE_URL, DEFAULT_ROLL_MAX, LogFormat, Token, Transport,
    default_agentlet_resources, is_dns_label, parse_listen_addr,
};
use crate::crd::{DEFAULT_MAX_SPEC_BYTES, PodSecurityLevel};
use crate::egress::{NoProxy, Proxy};

/// Managed or not, and where and how the control plane is reached.
pub(super) struct ControlPlane {
    pub managed: bool,
    pub allow_insecure: bool,
    pub base_url: BaseUrl,
    pub transport: Transport,
}

/// Logs, probes, the namespaces watched (checked later) and leader election.
pub(super) struct Process {
    pub log_format: LogFormat,
    pub probe_addr: SocketAddr,
    pub namespaces: Vec<String>,
    pub leader_election: bool,
}

/// The bounds: eviction delay, welcome timeout, sessions, roll size and spec size.
pub(super) struct Limits {
    pub eviction_delay: Duration,
    pub welcome_timeout: Duration,
    pub max_sessions: usize,
    pub roll_max: usize,
    pub max_spec_bytes: u64,
}

/// A `ConfigError::Invalid` for `var`, from a reason.
pub(super) fn invalid(var: &'static str) -> impl Fn(String) -> ConfigError {
    move |reason| ConfigError::Invalid { var, reason }
}

pub(super) fn check_namespaces(namespaces: &[String]) -> Result<(), ConfigError> {
    for ns in namespaces {
        if !is_dns_label(ns) {
            return Err(ConfigError::Invalid {
                var: "AUTONOMIC_NAMESPACES",
                reason: format!(
                    "{ns:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"
                ),
            });
        }
    }
    Ok(())
}

/// The variable source [`Config::parse`] reads, one group of settings per method.
pub(super) struct Vars<F>(pub(super) F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    /// A variable; empty counts as unset.
    pub(super) fn var(&self, k: &str) -> Option<String> {
        (self.0)(k).filter(|v| !v.trim().is_empty())
    }

    pub(super) fn flag(&self, k: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.var(k) {
            None => Ok(default),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(true),
                "false" | "0" | "no" | "off" => Ok(false),
                _ => Err(ConfigError::Bool { var: k, value: v }),
            },
        }
    }

    pub(super) fn number(&self, k: &'static str, default: u64) -> Result<u64, ConfigError> {
        match self.var(k) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| ConfigError::Number { var: k, value: v }),
        }
    }

    pub(super) fn control_plane(&self) -> Result<ControlPlane, ConfigError> {
        let managed = self.flag("AUTONOMIC_MANAGED", false)?;
        let allow_insecure = self.flag("AUTONOMIC_ALLOW_INSECURE", false)?;
        let base_url_raw = self
            .var("AUTONOMIC_BASE_URL")
            .unwrap_or_else(|| DEFAULT_BASE_URL.into());
        let base_url =
            BaseUrl::parse(base_url_raw.trim()).map_err(invalid("AUTONOMIC_BASE_URL"))?;
        if !base_url.tls && !base_url.is_loopback() && !allow_insecure {
            return Err(ConfigError::Invalid {
                var: "AUTONOMIC_BASE_URL",
                reason: format!(
                    "plain http:// to {} would send the token unencrypted; use https:// or set AUTONOMIC_ALLOW_INSECURE=true",
                    base_url.host
                ),
            });
        }
        let transport = match self.var("AUTONOMIC_TRANSPORT").as_deref().map(str::trim) {
            None | Some("ws") => Transport::Ws,
            Some("http") => Transport::Http,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_TRANSPORT",
                    reason: format!("expected ws or http, got {other:?}"),
                });
            }
        };
        Ok(ControlPlane {
            managed,
            allow_insecure,
            base_url,
            transport,
        })
    }

    /// The token, or the file it is read from; managed mode needs one of them.
    pub(super) fn token(
        &self,
        managed: bool,
    ) -> Result<(Option<Token>, Option<PathBuf>), ConfigError> {
        let token = self.var("AUTONOMIC_AUTH_TOKEN").map(Token::new);
        let token_file = self.var("AUTONOMIC_AUTH_TOKEN_FILE").map(PathBuf::from);
        if managed && token.is_none() && token_file.is_none() {
            return Err(ConfigError::MissingToken);
        }
        Ok((token, token_file))
    }

    pub(super) fn process(&self) -> Result<Process, ConfigError> {
        let log_format = match self.var("AUTONOMIC_LOG_FORMAT").as_deref().map(str::trim) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_LOG_FORMAT",
                    reason: format!("expected json or text, got {other:?}"),
                });
            }
        };
        let probe_addr = match self.var("AUTONOMIC_PROBE_ADDR") {
            None => SocketAddr::from(([0, 0, 0, 0], 8081)),
            Some(v) => parse_listen_addr(v.trim()).ok_or_else(|| ConfigError::Invalid {
                var: "AUTONOMIC_PROBE_ADDR",
                reason: format!("expected [host]:port, got {v:?}"),
            })?,
        };
        let namespaces: Vec<String> = self
            .var("AUTONOMIC_NAMESPACES")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let leader_election = self.flag("AUTONOMIC_LEADER_ELECTION", false)?;
        Ok(Process {
            log_format,
            probe_addr,
            namespaces,
            leader_election,
        })
    }

    /// Where the manager itself runs: its namespace and pod name.
    pub(super) fn own_pod(&self, leader_election: bool) -> Result<(String, String), ConfigError> {
        // The Lease lives in the manager's own namespace; guessing one could make two
        // installs elect in different places and both lead.
        if leader_election && self.var("POD_NAMESPACE").is_none() {
            return Err(ConfigError::Invalid {
                var: "POD_NAMESPACE",
                reason: "AUTONOMIC_LEADER_ELECTION=true needs the namespace of the leader Lease; set POD_NAMESPACE (the downward API's metadata.namespace)".into(),
            });
        }
        let pod_namespace = self
            .var("POD_NAMESPACE")
            .unwrap_or_else(|| "default".into());
        let pod_name = self
            .var("POD_NAME")
            .or_else(|| self.var("HOSTNAME"))
            .unwrap_or_else(|| "autonomic-manager".into());
        Ok((pod_namespace, pod_name))
    }

    pub(super) fn agentlet_resources(&self) -> Result<ResourceRequirements, ConfigError> {
        match self.var("AUTONOMIC_AGENTLET_RESOURCES") {
            None => Ok(default_agentlet_resources()),
            Some(v) => serde_json::from_str(&v).map_err(|e| ConfigError::Invalid {
                var: "AUTONOMIC_AGENTLET_RESOURCES",
                reason: format!("expected a JSON object of requests and limits: {e}"),
            }),
        }
    }

    /// `HTTPS_PROXY` and `NO_PROXY`, either in upper or lower case.
    pub(super) fn proxy(&self) -> Result<(Option<Proxy>, NoProxy), ConfigError> {
        let https_proxy = self
            .var("HTTPS_PROXY")
            .map(|v| ("HTTPS_PROXY", v))
            .or_else(|| self.var("https_proxy").map(|v| ("https_proxy", v)))
            .map(|(name, v)| Proxy::parse(&v).map_err(invalid(name)))
            .transpose()?;
        let no_proxy = match self
            .var("NO_PROXY")
            .map(|v| ("NO_PROXY", v))
            .or_else(|| self.var("no_proxy").map(|v| ("no_proxy", v)))
        {
            None => NoProxy::default(),
            Some((name, v)) => NoProxy::parse(&v).map_err(invalid(name))?,
        };
        Ok((https_proxy, no_proxy))
    }

    pub(super) fn pod_security(&self) -> Result<PodSecurityLevel, ConfigError> {
        match self.var("AUTONOMIC_POD_SECURITY") {
            None => Ok(PodSecurityLevel::default()),
            Some(v) => PodSecurityLevel::parse(v.trim()).ok_or_else(|| ConfigError::Invalid {
                var: "AUTONOMIC_POD_SECURITY",
                reason: format!("expected restricted, baseline or privileged, got {v:?}"),
            }),
        }
    }

    pub(super) fn backoff(&self) -> Result<(Duration, Duration), ConfigError> {
        let initial = Duration::from_millis(self.number("AUTONOMIC_BACKOFF_INITIAL_MS", 1000)?);
        let max = Duration::from_millis(self.number("AUTONOMIC_BACKOFF_MAX_MS", 60_000)?);
        if initial.is_zero() || max < initial {
            return Err(ConfigError::Invalid {
                var: "AUTONOMIC_BACKOFF_MAX_MS",
                reason: "the backoff needs 0 < initial <= max".into(),
            });
        }
        Ok((initial, max))
    }

    pub(super) fn limits(&self) -> Result<Limits, ConfigError> {
        let eviction_delay = Duration::from_secs(self.number("AUTONOMIC_EVICTION_DELAY_S", 300)?);
        let welcome_timeout = Duration::from_secs(self.number("AUTONOMIC_WELCOME_TIMEOUT_S", 10)?);
        let max_sessions = self.number("AUTONOMIC_MAX_SESSIONS", 16)? as usize;
        let roll_max = match self.number("AUTONOMIC_ROLL_MAX", DEFAULT_ROLL_MAX)? {
            0 => {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_ROLL_MAX",
                    reason: "0 would never roll a changed pod; the least is 1".into(),
                });
            }
            n => n.min(100_000) as usize,
        };
        let max_spec_bytes = match self
            .number("AUTONOMIC_MAX_SPEC_BYTES", DEFAULT_MAX_SPEC_BYTES)?
        {
            0 => {
                return Err(ConfigError::Invalid {
                    var: "AUTONOMIC_MAX_SPEC_BYTES",
                    reason: "0 would refuse every object; the least is 1 (the default is 262144, 256 KiB)".into(),
                });
            }
            n => n,
        };
        Ok(Limits {
            eviction_delay,
            welcome_timeout,
            max_sessions,
            roll_max,
            max_spec_bytes,
        })
    }

    pub(super) fn send_env_values(&self) -> Result<bool, ConfigError> {
        match self
            .var("AUTONOMIC_WIRE_ENV_VALUES")
            .as_deref()
            .map(str::trim)
        {
            None | Some("mask") => Ok(false),
            Some("send") => Ok(true),
            Some(v) => Err(ConfigError::Invalid {
                var: "AUTONOMIC_WIRE_ENV_VALUES",
                reason: format!("expected mask or send, got {v:?}"),
            }),
        }
    }

    /// `SSL_CERT_DIR`: colon-separated, as OpenSSL and Go read it; empty parts are
    /// skipped.
    pub(super) fn ssl_cert_dirs(&self) -> Vec<PathBuf> {
        self.var("SSL_CERT_DIR")
            .map(|v| {
                v.split(':')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default()
    }
}
