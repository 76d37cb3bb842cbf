//! `autonomic-manager check`: the preflight. It walks the path a user would debug, in
//! order — configuration, identity, API server, RBAC, CRDs, then (managed mode) DNS,
//! proxy, TLS, WebSocket upgrade and token — and prints one line per step, with the fix
//! when it fails. Each network step is bounded by [`STEP_TIMEOUT`], each line by
//! [`MAX_LINE`]. The dial's steps are `connect::socket`'s own, run one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::MaybeTlsStream;

use crate::config::{Config, ConfigError, Transport};
use crate::connect::read_token;
use crate::connect::socket::{self, DialError};
use crate::crd::{self, API_VERSION};
use crate::text::cap_utf8_marked;

/// How long one network step may take.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest line printed, in bytes: what a step reports (an error from a peer, a
/// list of missing permissions) is cut to fit, the fix kept whole.
pub const MAX_LINE: usize = 600;
const MAX_TEXT: usize = 360;
const MAX_FIX: usize = 200;

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    Fail,
    /// Not run: unmanaged, or an earlier step failed.
    Skip,
}

/// One step's line: `ok   api server: https://10.0.0.1:443 (v1.33.1)`,
/// `FAIL rbac: cannot watch pods in namespace x — fix: …`, `-    dns: skipped: unmanaged`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub status: Status,
    pub step: &'static str,
    pub text: String,
    pub fix: Option<String>,
}

impl Line {
    pub fn ok(step: &'static str, text: impl Into<String>) -> Line {
        Line::new(Status::Ok, step, text.into(), None)
    }
    pub fn fail(step: &'static str, text: impl Into<String>, fix: impl Into<String>) -> Line {
        Line::new(Status::Fail, step, text.into(), Some(fix.into()))
    }
    pub fn skip(step: &'static str, why: impl Into<String>) -> Line {
        Line::new(Status::Skip, step, format!("skipped: {}", why.into()), None)
    }

    /// Text from peers and the cluster made one bounded line: control characters become
    /// spaces, the text and the fix are cut with a visible mark.
    fn new(status: Status, step: &'static str, text: String, fix: Option<String>) -> Line {
        let one_line = |s: String, max: usize| {
            let mut s: String = s
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            cap_utf8_marked(&mut s, max);
            s
        };
        Line {
            status,
            step,
            text: one_line(text, MAX_TEXT),
            fix: fix.map(|f| one_line(f, MAX_FIX)),
        }
    }

    /// The line for a configuration `check` cannot run with (exit 2, as for `run`).
    pub fn configuration_refused(e: &ConfigError) -> Line {
        Line::fail(
            "configuration",
            e.to_string(),
            "correct that variable (autonomic-manager --help lists them all)",
        )
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = match self.status {
            Status::Ok => "ok  ",
            Status::Fail => "FAIL",
            Status::Skip => "-   ",
        };
        write!(f, "{head} {}: {}", self.step, self.text)?;
        if let Some(fix) = &self.fix {
            write!(f, " — fix: {fix}")?;
        }
        Ok(())
    }
}

/// Where a rule of [`RULES`] applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every watched namespace (cluster-wide when all are watched): the chart's
    /// `autonomic.workloadRules`.
    Watched,
    /// The manager's own namespace, with leader election: the Lease.
    Lease,
    /// Cluster-scoped, in managed mode without `AUTONOMIC_CLUSTER_ID`: the cluster id.
    ClusterId,
    /// The manager's own namespace, in managed mode in a pod: Events on its pod for
    /// link changes.
    OwnEvents,
}

/// One RBAC rule the manager needs.
pub struct Rule {
    pub group: &'static str,
    /// `pods`, or `pods/exec` for a subresource.
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    /// The objects it is limited to (none: any).
    pub names: &'static [&'static str],
    pub scope: Scope,
}

const fn rule(
    group: &'static str,
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
) -> Rule {
    Rule {
        group,
        resources,
        verbs,
        names: &[],
        scope: Scope::Watched,
    }
}

const CRS: &[&str] = &["agents", "tools", "runtimes", "memories"];
const CR_STATUS: &[&str] = &[
    "agents/status",
    "tools/status",
    "runtimes/status",
    "memories/status",
];
const LEASE_NAME: &str = "autonomic-manager";

/// Every verb the manager uses, on what: the one list `check` asks the API server about.
/// A unit test holds it equal to the chart's rules (`charts/autonomic/templates/`).
pub const RULES: &[Rule] = &[
    rule("autonomic.sh", CRS, &["list", "watch", "patch", "delete"]),
    rule("autonomic.sh", CR_STATUS, &["patch"]),
    rule("", &["pods"], &["get", "list", "watch", "create", "delete"]),
    rule("", &["pods/exec"], &["get", "create"]),
    rule(
        "",
        &["services"],
        &["get", "list", "watch", "create", "patch"],
    ),
    rule(
        "",
        &["secrets"],
        &["get", "list", "watch", "create", "patch"],
    ),
    rule("events.k8s.io", &["events"], &["create", "patch"]),
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        names: &[],
        scope: Scope::OwnEvents,
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "update"],
        names: &[LEASE_NAME],
        scope: Scope::Lease,
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create"],
        names: &[],
        scope: Scope::Lease,
    },
    Rule {
        group: "",
        resources: &["namespaces"],
        verbs: &["get"],
        names: &["kube-system"],
        scope: Scope::ClusterId,
    },
];

/// One question for the API server: may I `verb` `resource` (`name`) in `namespace`
/// (`None`: cluster-wide)?
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Permission {
    namespace: Option<String>,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    name: Option<&'static str>,
}

impl Permission {
    /// `watch pods`, `patch agents/status`, `update leases autonomic-manager`.
    fn action(&self) -> String {
        match self.name {
            Some(name) => format!("{} {} {name}", self.verb, self.resource),
            None => format!("{} {}", self.verb, self.resource),
        }
    }

    fn location(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None if self.name.is_some() => String::new(),
            None => "cluster-wide".into(),
        }
    }
}

/// The permissions `config` needs, from [`RULES`].
fn permissions(config: &Config) -> Vec<Permission> {
    let watched: Vec<Option<String>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.iter().cloned().map(Some).collect()
    };
    let mut out = Vec::new();
    for rule in RULES {
        let namespaces = match rule.scope {
            Scope::Watched => watched.clone(),
            Scope::Lease if config.leader_election => vec![Some(config.pod_namespace.clone())],
            Scope::ClusterId if config.managed && config.cluster_id.is_none() => vec![None],
            // Recorded only when the pod's uid is known (in a pod: `POD_UID`).
            Scope::OwnEvents if config.managed && !config.pod_uid.is_empty() => {
                vec![Some(config.pod_namespace.clone())]
            }
            Scope::Lease | Scope::ClusterId | Scope::OwnEvents => continue,
        };
        let names: Vec<Option<&'static str>> = if rule.names.is_empty() {
            vec![None]
        } else {
            rule.names.iter().copied().map(Some).collect()
        };
        for namespace in &namespaces {
            for resource in rule.resources {
                for verb in rule.verbs {
                    for name in &names {
                        out.push(Permission {
                            namespace: namespace.clone(),
                            verb,
                            group: rule.group,
                            resource,
                            name: *name,
                        });
                    }
                }
            }
        }
    }
    out
}

/// `cannot watch pods, create pods/exec in namespace a; cannot get namespaces kube-system`.
fn missing_text(missing: &[Permission]) -> String {
    let mut by_place: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in missing {
        by_place.entry(p.location()).or_default().push(p.action());
    }
    by_place
        .into_iter()
        .map(|(place, actions)| {
            let actions = actions.join(", ");
            if place.is_empty() {
                format!("cannot {actions}")
            } else {
                format!("cannot {actions} {place}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the lines say so far.
struct Report<'a> {
    print: &'a mut dyn FnMut(&Line),
    failed: usize,
}

impl Report<'_> {
    fn line(&mut self, line: Line) {
        if line.status == Status::Fail {
            self.failed += 1;
        }
        (self.print)(&line);
    }
}

/// Runs every step on `config` (parsed already: a refusal is
/// [`Line::configuration_refused`] and exit 2), handing each line to `print` as it is
/// known. `true` when none failed.
pub async fn run(config: &Config, print: &mut dyn FnMut(&Line)) -> bool {
    let mut report = Report { print, failed: 0 };
    report.line(Line::ok("configuration", configuration_text(config)));
    cluster_steps(config, &mut report).await;
    if config.managed {
        control_plane_steps(config, &mut report).await;
    } else {
        for step in ["dns", "proxy", "tls", "websocket", "token"] {
            report.line(Line::skip(step, "unmanaged"));
        }
    }
    report.failed == 0
}

fn configuration_text(config: &Config) -> String {
    let watching = if config.namespaces.is_empty() {
        "all namespaces".to_owned()
    } else {
        format!("namespaces {}", config.namespaces.join(", "))
    };
    if !config.managed {
        return format!("unmanaged, watching {watching}");
    }
    let endpoint = match config.transport {
        Transport::Ws => config.base_url.endpoint(true, "connect"),
        Transport::Http => config.base_url.endpoint(false, "report"),
    };
    format!("managed ({endpoint}), watching {watching}")
}

/// Steps 2–5: identity, API server, RBAC, CRDs.
async fn cluster_steps(config: &Config, report: &mut Report<'_>) {
    let skip_rest = |report: &mut Report<'_>, steps: &[&'static str], why: &str| {
        for step in steps {
            report.line(Line::skip(step, why.to_owned()));
        }
    };
    // A kubeconfig may run an exec credential plugin: bounded too.
    let found = tokio::time::timeout(STEP_TIMEOUT, identity())
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "loading the kubeconfig took more than {} s (an exec credential plugin?)",
                STEP_TIMEOUT.as_secs()
            ))
        });
    let (mut kube_config, who) = match found {
        Ok(found) => found,
        Err(why) => {
            report.line(Line::fail(
                "identity",
                why,
                "set KUBECONFIG, or run it in the manager's pod: kubectl exec deploy/autonomic-manager -- /autonomic-manager check",
            ));
            return skip_rest(report, &["api server", "rbac", "crds"], "no identity");
        }
    };
    report.line(Line::ok("identity", who));

    let url = kube_config.cluster_url.to_string();
    let url = url.trim_end_matches('/').to_owned();
    // As `run` does: HTTPS_PROXY is the control plane's, never the API server's.
    kube_config.proxy_url = None;
    let client = match kube::Client::try_from(kube_config) {
        Ok(c) => c,
        Err(e) => {
            report.line(Line::fail(
                "api server",
                format!("{url}: cannot build a client: {e}"),
                "check the kubeconfig's cluster entry (server, certificate-authority)",
            ));
            return skip_rest(report, &["rbac", "crds"], "no API server");
        }
    };
    match tokio::time::timeout(STEP_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(info)) => report.line(Line::ok(
            "api server",
            format!("{url} ({})", info.git_version),
        )),
        failed => {
            let (text, fix) = match failed {
                Ok(Err(kube::Error::Api(s))) if s.code == 401 => (
                    format!("{url}: credentials rejected (HTTP 401)"),
                    "renew the kubeconfig's credentials (in a pod: the ServiceAccount token)",
                ),
                Ok(Err(e)) => (
                    format!("{url}: {e}"),
                    "check the server address (kubeconfig, or KUBERNETES_SERVICE_HOST in a pod) and that it is reachable from here",
                ),
                _ => (
                    format!("{url}: no answer within {} s", STEP_TIMEOUT.as_secs()),
                    "check the server address (kubeconfig, or KUBERNETES_SERVICE_HOST in a pod) and that it is reachable from here",
                ),
            };
            report.line(Line::fail("api server", text, fix));
            return skip_rest(report, &["rbac", "crds"], "no API server");
        }
    }
    report.line(rbac(config, &client).await);
    report.line(crds(&client).await);
}

/// Which identity the API server will see: a kubeconfig (tried first, as `run` does) or
/// the pod's ServiceAccount.
async fn identity() -> Result<(kube::Config, String), String> {
    let options = kube::config::KubeConfigOptions::default();
    let kubeconfig_err = match kube::Config::from_kubeconfig(&options).await {
        Ok(c) => {
            let path = std::env::var("KUBECONFIG")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "~/.kube/config".into());
            let mut who = format!("kubeconfig {path}");
            if let Ok(file) = kube::config::Kubeconfig::read()
                && let Some(context) = file.current_context.as_deref()
            {
                let user = file
                    .contexts
                    .iter()
                    .find(|c| c.name == context)
                    .and_then(|c| c.context.as_ref())
                    .and_then(|c| c.user.clone());
                who.push_str(&format!(", context {context}"));
                if let Some(user) = user {
                    who.push_str(&format!(", user {user}"));
                }
            }
            if let Some(sa) = service_account(&c) {
                who.push_str(&format!(" (ServiceAccount {sa})"));
            }
            return Ok((c, who));
        }
        Err(e) => e.to_string(),
    };
    match kube::Config::incluster() {
        Ok(c) => {
            let who = match service_account(&c) {
                Some(sa) => format!("in-cluster, ServiceAccount {sa}"),
                None => "in-cluster".to_owned(),
            };
            Ok((c, who))
        }
        Err(e) => Err(format!(
            "no kubeconfig ({kubeconfig_err}) and not in a pod ({e})"
        )),
    }
}

/// `namespace/name` of the ServiceAccount whose token `config` carries (its JWT's `sub`,
/// `system:serviceaccount:<namespace>:<name>`); `None` for any other credential.
fn service_account(config: &kube::Config) -> Option<String> {
    // The token is a `SecretString`; its serialized form is the one place kube shows it.
    let auth = serde_json::to_value(&config.auth_info).ok()?;
    let token = match (auth["token"].as_str(), auth["tokenFile"].as_str()) {
        (Some(t), _) => t.to_owned(),
        (None, Some(file)) => std::fs::read_to_string(file).ok()?,
        (None, None) => return None,
    };
    service_account_of(token.trim())
}

fn service_account_of(jwt: &str) -> Option<String> {
    let payload = jwt.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&base64url_decode(payload)?).ok()?;
    let sub = claims["sub"].as_str()?;
    let (ns, name) = sub
        .strip_prefix("system:serviceaccount:")?
        .split_once(':')?;
    Some(format!("{ns}/{name}"))
}

/// RFC 4648 §5, padding optional.
fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// Step 4: a SelfSubjectAccessReview for each permission of [`permissions`].
async fn rbac(config: &Config, client: &kube::Client) -> Line {
    use futures::StreamExt;
    let wanted = permissions(config);
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answers: Vec<(Permission, Result<bool, String>)> =
        futures::stream::iter(wanted.iter().cloned())
            .map(|p| {
                let api = api.clone();
                async move {
                    let review = SelfSubjectAccessReview {
                        spec: SelfSubjectAccessReviewSpec {
                            resource_attributes: Some(attributes(&p)),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let params = PostParams::default();
                    let asked = api.create(&params, &review);
                    let answer = match tokio::time::timeout(STEP_TIMEOUT, asked).await {
                        Ok(Ok(r)) => Ok(r.status.is_some_and(|s| s.allowed)),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("no answer within {} s", STEP_TIMEOUT.as_secs())),
                    };
                    (p, answer)
                }
            })
            .buffered(8)
            .collect()
            .await;
    if let Some((p, Err(e))) = answers.iter().find(|(_, a)| a.is_err()) {
        return Line::fail(
            "rbac",
            format!(
                "cannot ask whether I may {} {}: {e}",
                p.action(),
                p.location()
            ),
            "check the API server (a SelfSubjectAccessReview is open to any authenticated user)",
        );
    }
    let missing: Vec<Permission> = answers
        .into_iter()
        .filter(|(_, a)| *a == Ok(false))
        .map(|(p, _)| p)
        .collect();
    if missing.is_empty() {
        let mut places: BTreeSet<String> = BTreeSet::new();
        for p in &wanted {
            places.insert(match (&p.namespace, p.name) {
                (_, Some(name)) if p.resource == "leases" => {
                    format!("the Lease {name} in namespace {}", config.pod_namespace)
                }
                // `namespace kube-system`
                (None, Some(name)) => format!("{} {name}", p.resource.trim_end_matches('s')),
                (Some(ns), None) => format!("namespace {ns}"),
                (None, None) => "cluster-wide".into(),
                (Some(ns), Some(_)) => format!("namespace {ns}"),
            });
        }
        let places: Vec<String> = places.into_iter().collect();
        return Line::ok(
            "rbac",
            format!(
                "{} permissions allowed ({})",
                wanted.len(),
                places.join(", ")
            ),
        );
    }
    let mut fix = "grant this identity the chart's RBAC (helm upgrade, or kubectl apply --server-side -f deploy.yaml; the rules: charts/autonomic/templates/_helpers.tpl)".to_owned();
    if missing.iter().any(|p| p.resource == "namespaces") {
        fix.push_str(", or set AUTONOMIC_CLUSTER_ID");
    }
    Line::fail("rbac", missing_text(&missing), fix)
}

fn attributes(p: &Permission) -> ResourceAttributes {
    let (resource, subresource) = match p.resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (p.resource, None),
    };
    ResourceAttributes {
        namespace: p.namespace.clone(),
        verb: Some(p.verb.to_owned()),
        group: Some(p.group.to_owned()),
        resource: Some(resource.to_owned()),
        subresource,
        name: p.name.map(str::to_owned),
        ..Default::default()
    }
}

const CRDS_FIX: &str =
    "install this version's CRDs: autonomic-manager crds | kubectl apply --server-side -f -";

/// Step 5: each CRD installed, established, serving `v1alpha1`, with every field of the
/// schema this binary would install. An identity that may not read CRDs (the chart grants
/// no such thing) gets the discovery check: each kind served, with its status.
async fn crds(client: &kube::Client) -> Line {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let expected = crd::embedded_crds();
    let plurals: Vec<String> = expected
        .iter()
        .map(|c| c.spec.names.plural.clone())
        .collect();
    let (mut missing, mut stale) = (Vec::new(), Vec::new());
    for want in &expected {
        let name = want.metadata.name.clone().unwrap_or_default();
        let got = match tokio::time::timeout(STEP_TIMEOUT, api.get_opt(&name)).await {
            Err(_) => {
                return Line::fail(
                    "crds",
                    format!(
                        "no answer within {} s reading {name}",
                        STEP_TIMEOUT.as_secs()
                    ),
                    "check the API server",
                );
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                return crds_discovered(client, &plurals).await;
            }
            Ok(Err(e)) => {
                return Line::fail(
                    "crds",
                    format!("reading {name}: {e}"),
                    "check the API server",
                );
            }
            Ok(Ok(None)) => {
                missing.push(name);
                continue;
            }
            Ok(Ok(Some(got))) => got,
        };
        if let Some(why) = outdated(want, &got) {
            stale.push(format!("{name} {why}"));
        }
    }
    if !missing.is_empty() {
        let mut text = format!("not installed: {}", missing.join(", "));
        if !stale.is_empty() {
            text.push_str(&format!("; outdated: {}", stale.join("; ")));
        }
        return Line::fail("crds", text, CRDS_FIX);
    }
    if !stale.is_empty() {
        return Line::fail("crds", format!("outdated: {}", stale.join("; ")), CRDS_FIX);
    }
    Line::ok(
        "crds",
        format!(
            "{} installed and current ({API_VERSION})",
            plurals.join(", ")
        ),
    )
}

/// Why the installed CRD `got` is not the one this binary would install (`want`), if it
/// is not: not established, the version not served, or fields of the schema missing.
fn outdated(want: &CustomResourceDefinition, got: &CustomResourceDefinition) -> Option<String> {
    let established = got
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Established" && c.status == "True");
    if !established {
        return Some("is not established".into());
    }
    for version in &want.spec.versions {
        let Some(have) = got.spec.versions.iter().find(|v| v.name == version.name) else {
            return Some(format!("has no version {}", version.name));
        };
        if !have.served {
            return Some(format!("does not serve {}", version.name));
        }
        let fields = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            let schema = v
                .schema
                .as_ref()
                .and_then(|s| serde_json::to_value(&s.open_api_v3_schema).ok())
                .unwrap_or(Value::Null);
            let mut out = BTreeSet::new();
            schema_paths(&schema, "", &mut out);
            out
        };
        let have = fields(have);
        let lacking: Vec<String> = fields(version).difference(&have).cloned().collect();
        if !lacking.is_empty() {
            let shown = lacking
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = lacking.len().saturating_sub(5);
            return Some(if more > 0 {
                format!("lacks {shown} and {more} more")
            } else {
                format!("lacks {shown}")
            });
        }
    }
    None
}

/// Every property path of a JSON schema: `.spec`, `.spec.tools`, `.spec.tools[].name`.
fn schema_paths(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            let path = format!("{prefix}.{name}");
            schema_paths(sub, &path, out);
            out.insert(path);
        }
    }
    if schema["items"].is_object() {
        schema_paths(&schema["items"], &format!("{prefix}[]"), out);
    }
}

/// Step 5 through discovery: `autonomic.sh/v1alpha1` serves each kind and its status.
async fn crds_discovered(client: &kube::Client, plurals: &[String]) -> Line {
    let found =
        tokio::time::timeout(STEP_TIMEOUT, client.list_api_group_resources(API_VERSION)).await;
    let served: BTreeSet<String> = match found {
        Err(_) => {
            return Line::fail(
                "crds",
                format!(
                    "no answer within {} s from {API_VERSION} discovery",
                    STEP_TIMEOUT.as_secs()
                ),
                "check the API server",
            );
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => BTreeSet::new(),
        Ok(Err(e)) => {
            return Line::fail(
                "crds",
                format!("{API_VERSION} discovery: {e}"),
                "check the API server",
            );
        }
        Ok(Ok(list)) => list.resources.into_iter().map(|r| r.name).collect(),
    };
    let missing: Vec<String> = plurals
        .iter()
        .flat_map(|p| [p.clone(), format!("{p}/status")])
        .filter(|r| !served.contains(r))
        .collect();
    if !missing.is_empty() {
        return Line::fail(
            "crds",
            format!("not served by {API_VERSION}: {}", missing.join(", ")),
            CRDS_FIX,
        );
    }
    Line::ok(
        "crds",
        format!(
            "{} served ({API_VERSION}); schemas not compared: this identity may not get customresourcedefinitions",
            plurals.join(", ")
        ),
    )
}

/// Steps 6–10 in managed mode: DNS, proxy (or a direct TCP connection), TLS, the
/// WebSocket upgrade and the token, each over the stream the one before opened.
async fn control_plane_steps(config: &Config, report: &mut Report<'_>) {
    let after = |report: &mut Report<'_>, steps: &[&'static str], failed: &str| {
        for step in steps {
            report.line(Line::skip(step, format!("{failed} failed")));
        }
    };
    let url = &config.base_url;
    let proxy = socket::proxy_for(config);
    let target = url.authority();
    // Step 7's name: what it does here.
    let connect_step = if proxy.is_some() { "proxy" } else { "connect" };

    // 6. DNS: the host this process connects to (the proxy's, when one applies: the
    // proxy resolves the control plane's).
    let (host, port, whose, fix) = match proxy {
        Some(p) => (
            p.host.clone(),
            p.port,
            "proxy host ",
            "check the host in HTTPS_PROXY and this pod's DNS",
        ),
        None => (
            url.host.clone(),
            url.port,
            "",
            "check the host in AUTONOMIC_BASE_URL and this pod's DNS (or set HTTPS_PROXY if only a proxy reaches it)",
        ),
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        report.line(Line::ok(
            "dns",
            format!("{whose}{host} is an address (nothing to resolve)"),
        ));
    } else {
        let lookup = tokio::net::lookup_host((host.as_str(), port));
        match tokio::time::timeout(STEP_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => {
                let ips: BTreeSet<String> = addrs.map(|a| a.ip().to_string()).collect();
                let shown: Vec<String> = ips.iter().take(3).cloned().collect();
                let more = if ips.len() > 3 { ", …" } else { "" };
                report.line(Line::ok(
                    "dns",
                    format!("{whose}{host} resolves to {}{more}", shown.join(", ")),
                ));
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {} s", STEP_TIMEOUT.as_secs()),
                };
                report.line(Line::fail(
                    "dns",
                    format!("cannot resolve {whose}{host}: {why}"),
                    fix,
                ));
                return after(report, &[connect_step, "tls", "websocket", "token"], "dns");
            }
        }
    }

    // 7. TCP, through the proxy (CONNECT) or directly.
    type Connecting<'a> =
        std::pin::Pin<Box<dyn Future<Output = Result<TcpStream, DialError>> + Send + 'a>>;
    let (step, connected): (&'static str, Connecting<'_>) = match proxy {
        Some(p) => ("proxy", Box::pin(socket::connect_through(p, &target))),
        None => ("connect", Box::pin(socket::connect_direct(target.clone()))),
    };
    let stream = match tokio::time::timeout(STEP_TIMEOUT, connected).await {
        Ok(Ok(stream)) => {
            report.line(Line::ok(
                step,
                match proxy {
                    Some(p) => format!("CONNECT {target} through {p} established"),
                    None if config.https_proxy.is_some() => {
                        format!("{target} reached directly (NO_PROXY exempts it)")
                    }
                    None => format!("{target} reached directly (no HTTPS_PROXY)"),
                },
            ));
            stream
        }
        failed => {
            let line = match (failed, proxy) {
                (
                    Ok(Err(DialError::ProxyRefused {
                        proxy,
                        status_line,
                        status,
                    })),
                    _,
                ) => {
                    let fix = match status {
                        407 => "the proxy wants credentials: put them in HTTPS_PROXY (http://user:password@host:port)".to_owned(),
                        403 => format!("the proxy refuses {target}: have it allowed, or exempt the host with NO_PROXY if it is reachable directly"),
                        _ => format!("check the proxy's logs for CONNECT {target}"),
                    };
                    Line::fail(
                        "proxy",
                        format!("{proxy} refused CONNECT {target}: {status_line}"),
                        fix,
                    )
                }
                (Ok(Err(e)), Some(_)) => Line::fail(
                    step,
                    e.to_string(),
                    "check HTTPS_PROXY: host, port, and that it is reachable from here",
                ),
                (Ok(Err(e)), None) => Line::fail(
                    step,
                    e.to_string(),
                    "check AUTONOMIC_BASE_URL's port and the egress network policy (or set HTTPS_PROXY)",
                ),
                _ => Line::fail(
                    step,
                    format!("{target}: no answer within {} s", STEP_TIMEOUT.as_secs()),
                    "check the egress network policy and firewalls (or set HTTPS_PROXY)",
                ),
            };
            report.line(line);
            return after(report, &["tls", "websocket", "token"], step);
        }
    };

    // 8. TLS with the configured trust.
    let stream = if url.tls {
        let tls = match socket::tls_config(config) {
            Ok(t) => t,
            Err(e) => {
                report.line(Line::fail(
                    "tls",
                    e.to_string(),
                    "check AUTONOMIC_CA_FILE, SSL_CERT_FILE and SSL_CERT_DIR",
                ));
                return after(report, &["websocket", "token"], "tls");
            }
        };
        match tokio::time::timeout(STEP_TIMEOUT, socket::tls(config, tls, stream)).await {
            Ok(Ok(stream)) => {
                let version = match stream.get_ref().1.protocol_version() {
                    Some(rustls::ProtocolVersion::TLSv1_3) => ", TLS 1.3",
                    Some(rustls::ProtocolVersion::TLSv1_2) => ", TLS 1.2",
                    _ => "",
                };
                report.line(Line::ok(
                    "tls",
                    format!(
                        "{} presented a certificate this trust accepts{version}",
                        url.host
                    ),
                ));
                MaybeTlsStream::Rustls(stream)
            }
            failed => {
                let line = match failed {
                    Ok(Err(DialError::UnknownCa(_))) => Line::fail(
                        "tls",
                        format!("the certificate of {target} is signed by an unknown CA"),
                        "set AUTONOMIC_CA_FILE (or SSL_CERT_FILE) to a PEM file of the CA that signs it (a TLS-inspecting proxy's CA, if there is one)",
                    ),
                    Ok(Err(e)) => Line::fail(
                        "tls",
                        format!("{target}: {e}"),
                        "check AUTONOMIC_BASE_URL (host and port) and the trust: AUTONOMIC_CA_FILE, SSL_CERT_FILE",
                    ),
                    _ => Line::fail(
                        "tls",
                        format!("{target}: no handshake within {} s", STEP_TIMEOUT.as_secs()),
                        "check that AUTONOMIC_BASE_URL's port speaks TLS (https://)",
                    ),
                };
                report.line(line);
                return after(report, &["websocket", "token"], "tls");
            }
        }
    } else {
        report.line(Line::skip("tls", "plain http:// in AUTONOMIC_BASE_URL"));
        MaybeTlsStream::Plain(stream)
    };

    // 9–10. The upgrade, the token checked by it.
    if config.transport == Transport::Http {
        report.line(Line::skip("websocket", "AUTONOMIC_TRANSPORT=http"));
        report.line(Line::skip("token", "AUTONOMIC_TRANSPORT=http"));
        return;
    }
    let token = match read_token(config) {
        Ok(t) => t,
        Err(e) => {
            report.line(Line::skip("websocket", "no token to send"));
            report.line(Line::fail(
                "token",
                e,
                "set AUTONOMIC_AUTH_TOKEN, or mount the token Secret at AUTONOMIC_AUTH_TOKEN_FILE",
            ));
            return;
        }
    };
    let endpoint = url.endpoint(true, "connect");
    let request = match socket::upgrade_request(config, &token) {
        Ok(r) => r,
        Err(e) => {
            report.line(Line::skip("websocket", "no request to send"));
            report.line(Line::fail(
                "token",
                e.to_string(),
                "copy the token again from the platform's dashboard",
            ));
            return;
        }
    };
    report_upgrade(config, &endpoint, &token, request, stream, report).await;
}

async fn report_upgrade(
    config: &Config,
    endpoint: &str,
    token: &crate::config::Token,
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    stream: MaybeTlsStream<TcpStream>,
    report: &mut Report<'_>,
) {
    let upgraded = tokio::time::timeout(
        STEP_TIMEOUT,
        socket::upgrade(config, token, request, stream),
    )
    .await;
    let base_fix = "check AUTONOMIC_BASE_URL: it must be the platform's URL (and nothing between may strip the Upgrade header)";
    match upgraded {
        Ok(Ok(mut socket)) => {
            report.line(Line::ok(
                "websocket",
                format!(
                    "{endpoint} upgraded ({})",
                    crate::connect::frame::SUBPROTOCOL
                ),
            ));
            report.line(Line::ok("token", format!("accepted ({}…)", token.prefix())));
            close(&mut socket).await;
        }
        Ok(Err(DialError::Rejected { status, prefix })) => {
            report.line(Line::skip(
                "websocket",
                format!("the token was refused first (HTTP {status})"),
            ));
            report.line(Line::fail(
                "token",
                format!("rejected (HTTP {status}) for token {prefix}…"),
                "set AUTONOMIC_AUTH_TOKEN (or the Secret behind AUTONOMIC_AUTH_TOKEN_FILE) to a current token from the platform's dashboard",
            ));
        }
        Ok(Err(DialError::NotFound { url })) => {
            report.line(Line::fail(
                "websocket",
                format!("no control plane at {url} (HTTP 404)"),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
        Ok(Err(DialError::Http(status))) => {
            report.line(Line::fail(
                "websocket",
                format!("{endpoint} is not a WebSocket endpoint: it answered the upgrade with HTTP {status}"),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
        Ok(Err(e)) => {
            report.line(Line::fail(
                "websocket",
                format!("{endpoint}: {e}"),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
        Err(_) => {
            report.line(Line::fail(
                "websocket",
                format!(
                    "{endpoint}: no answer to the upgrade within {} s",
                    STEP_TIMEOUT.as_secs()
                ),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
    }
}

/// Closes the WebSocket at once (1000, no `hello`), waiting briefly for the peer's close.
async fn close<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    socket: &mut tokio_tungstenite::WebSocketStream<S>,
) {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let frame = CloseFrame {
        code: CloseCode::Normal,
        reason: "autonomic-manager check".into(),
    };
    let closing = async {
        if socket.close(Some(frame)).await.is_ok() {
            while let Some(Ok(_)) = socket.next().await {}
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), closing).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .expect("config")
    }

    #[test]
    fn lines_read_as_documented_and_stay_bounded() {
        assert_eq!(
            Line::ok("api server", "https://10.0.0.1:443 (v1.33.1)").to_string(),
            "ok   api server: https://10.0.0.1:443 (v1.33.1)"
        );
        assert_eq!(
            Line::fail("rbac", "cannot watch pods in namespace x", "grant it").to_string(),
            "FAIL rbac: cannot watch pods in namespace x — fix: grant it"
        );
        assert_eq!(
            Line::skip("dns", "unmanaged").to_string(),
            "-    dns: skipped: unmanaged"
        );
        // A peer's megabyte, with newlines: one line, cut with a mark, the fix whole.
        let long = format!("line one\nline two\r{}", "é".repeat(1 << 20));
        let line = Line::fail("websocket", long, "check AUTONOMIC_BASE_URL").to_string();
        assert!(line.len() <= MAX_LINE, "{}", line.len());
        assert!(!line.contains(['\n', '\r']));
        assert!(line.starts_with("FAIL websocket: line one line two é"));
        assert!(
            line.ends_with("é… — fix: check AUTONOMIC_BASE_URL"),
            "{line}"
        );
        let huge = Line::fail("x", "t".repeat(5000), "f".repeat(5000)).to_string();
        assert!(huge.len() <= MAX_LINE, "{}", huge.len());
    }

    #[test]
    fn missing_permissions_are_named_by_place() {
        let p = |ns: Option<&str>, verb, resource, name| Permission {
            namespace: ns.map(str::to_owned),
            verb,
            group: "",
            resource,
            name,
        };
        assert_eq!(
            missing_text(&[p(Some("x"), "watch", "pods", None)]),
            "cannot watch pods in namespace x"
        );
        assert_eq!(
            missing_text(&[
                p(Some("b"), "patch", "agents/status", None),
                p(Some("a"), "watch", "pods", None),
                p(Some("a"), "create", "pods/exec", None),
                p(None, "get", "namespaces", Some("kube-system")),
                p(None, "list", "secrets", None),
            ]),
            "cannot get namespaces kube-system; cannot list secrets cluster-wide; \
             cannot watch pods, create pods/exec in namespace a; \
             cannot patch agents/status in namespace b"
        );
    }

    #[test]
    fn permissions_follow_the_configuration() {
        let unmanaged = permissions(&config(&[("AUTONOMIC_NAMESPACES", "a,b")]));
        // 39 workload permissions in each watched namespace, nothing else.
        assert_eq!(unmanaged.len(), 78);
        assert!(unmanaged.iter().all(|p| p.namespace.is_some()));
        let all = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_LEADER_ELECTION", "true"),
            ("POD_NAMESPACE", "home"),
            ("POD_UID", "u-1"),
        ]));
        // Workload, Lease (3), cluster id (1), link Events in the manager's namespace (2).
        assert_eq!(all.len(), 39 + 3 + 1 + 2);
        assert!(all.contains(&Permission {
            namespace: Some("home".into()),
            verb: "create",
            group: "events.k8s.io",
            resource: "events",
            name: None,
        }));
        assert!(all.contains(&Permission {
            namespace: Some("home".into()),
            verb: "update",
            group: "coordination.k8s.io",
            resource: "leases",
            name: Some(crate::leader::LEASE_NAME),
        }));
        assert!(all.contains(&Permission {
            namespace: None,
            verb: "get",
            group: "",
            resource: "namespaces",
            name: Some("kube-system"),
        }));
        let with_id = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_CLUSTER_ID", "prod"),
        ]));
        assert_eq!(with_id.len(), 39, "outside a pod: no link Events");
        let a = attributes(&Permission {
            namespace: Some("x".into()),
            verb: "create",
            group: "",
            resource: "pods/exec",
            name: None,
        });
        assert_eq!(
            (a.resource.as_deref(), a.subresource.as_deref()),
            (Some("pods"), Some("exec"))
        );
    }

    /// (scope, group, resource, verb, resourceName) of every rule.
    type Grant = (Scope, String, String, String, Option<String>);

    fn grants_of(rules: &Value, scope: Scope, out: &mut BTreeSet<Grant>) {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        for rule in rules.as_array().expect("a list of rules") {
            let names = strings(&rule["resourceNames"]);
            let names: Vec<Option<String>> = if names.is_empty() {
                vec![None]
            } else {
                names.into_iter().map(Some).collect()
            };
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        for name in &names {
                            out.insert((
                                scope,
                                group.clone(),
                                resource.clone(),
                                verb.clone(),
                                name.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }

    /// The table is the chart's RBAC, rule for rule: the workload rules of
    /// `_helpers.tpl` (each watched namespace, or cluster-wide), the leader-election Role
    /// and the cluster-id ClusterRole of `rbac.yaml` (their template lines dropped: the
    /// rules themselves are literal YAML).
    #[test]
    fn the_rbac_table_is_the_charts() {
        let helpers = include_str!("../charts/autonomic/templates/_helpers.tpl");
        let start = helpers
            .find(r#"{{- define "autonomic.workloadRules" -}}"#)
            .expect("the workload rules in _helpers.tpl");
        let body = &helpers[start..];
        let body = &body[body.find('\n').unwrap() + 1..body.find("{{- end -}}").unwrap()];
        let workload: Value = serde_saphyr::from_str(body).expect("the workload rules parse");
        let mut chart = BTreeSet::new();
        grants_of(&workload, Scope::Watched, &mut chart);

        let rbac = include_str!("../charts/autonomic/templates/rbac.yaml");
        let literal: String = rbac
            .lines()
            .filter(|l| !l.contains("{{"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut scopes = Vec::new();
        for doc in literal.split("\n---\n") {
            let doc: Option<Value> = serde_saphyr::from_str(doc).expect("rbac.yaml parses");
            let Some(doc) = doc else { continue };
            if doc["rules"].is_null() {
                continue;
            }
            let scope = match doc["kind"].as_str() {
                // The Role for link Events in the release namespace (when it is not
                // watched), told from the Lease's by its rules.
                Some("Role") if doc["rules"][0]["resources"][0] == "events" => Scope::OwnEvents,
                Some("Role") => Scope::Lease,
                Some("ClusterRole") => Scope::ClusterId,
                other => panic!("rules in a {other:?}"),
            };
            scopes.push(scope);
            grants_of(&doc["rules"], scope, &mut chart);
        }
        scopes.sort();
        assert_eq!(scopes, [Scope::Lease, Scope::ClusterId, Scope::OwnEvents]);

        let mut table = BTreeSet::new();
        for rule in RULES {
            let names: Vec<Option<String>> = if rule.names.is_empty() {
                vec![None]
            } else {
                rule.names.iter().map(|n| Some(n.to_string())).collect()
            };
            for resource in rule.resources {
                for verb in rule.verbs {
                    for name in &names {
                        table.insert((
                            rule.scope,
                            rule.group.into(),
                            resource.to_string(),
                            verb.to_string(),
                            name.clone(),
                        ));
                    }
                }
            }
        }
        assert_eq!(table, chart);
        assert_eq!(LEASE_NAME, crate::leader::LEASE_NAME);
    }

    #[test]
    fn service_accounts_are_read_from_the_token() {
        // {"alg":"none"} . {"sub":"system:serviceaccount:autonomic-system:autonomic-manager"}
        let claims =
            r#"{"iss":"k","sub":"system:serviceaccount:autonomic-system:autonomic-manager"}"#;
        let b64 = |s: &str| {
            crate::egress::base64(s.as_bytes())
                .replace('+', "-")
                .replace('/', "_")
                .trim_end_matches('=')
                .to_owned()
        };
        let jwt = format!("{}.{}.sig", b64(r#"{"alg":"none"}"#), b64(claims));
        assert_eq!(
            service_account_of(&jwt).as_deref(),
            Some("autonomic-system/autonomic-manager")
        );
        let user = format!("x.{}.y", b64(r#"{"sub":"alice"}"#));
        assert_eq!(service_account_of(&user), None);
        assert_eq!(service_account_of("not a jwt"), None);
        assert_eq!(base64url_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(base64url_decode("Zm9vYg").unwrap(), b"foob");
        assert_eq!(base64url_decode("__79").unwrap(), [0xff, 0xfe, 0xfd]);
    }

    #[test]
    fn the_schema_paths_of_a_crd_are_its_fields() {
        let crd = crd::crds().remove(0);
        let mut paths = BTreeSet::new();
        let schema = serde_json::to_value(
            &crd.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema,
        )
        .unwrap();
        schema_paths(&schema, "", &mut paths);
        assert!(paths.contains(".spec"), "{paths:?}");
        assert!(paths.contains(".status.phase"), "{paths:?}");
        // The same CRD, established: current. Without a field: outdated, named.
        let mut got = crd.clone();
        got.status = serde_json::from_value(
            serde_json::json!({"conditions": [{"type": "Established", "status": "True"}]}),
        )
        .unwrap();
        assert_eq!(outdated(&crd, &got), None);
        let mut old = got.clone();
        let mut schema = serde_json::to_value(&old.spec.versions[0].schema).unwrap();
        schema["openAPIV3Schema"]["properties"]["status"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("phase");
        old.spec.versions[0].schema = serde_json::from_value(schema).unwrap();
        assert_eq!(outdated(&crd, &old).as_deref(), Some("lacks .status.phase"));
        assert_eq!(outdated(&crd, &crd).as_deref(), Some("is not established"));
    }
}
