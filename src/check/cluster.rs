//! Steps 2, 3 and 5: identity, API server (then [`rbac`](super::rbac)), CRDs.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use serde_json::Value;

use super::rbac::rbac;
use super::{Line, Report, STEP_TIMEOUT};
use crate::cluster::service_account;
use crate::config::Config;
use crate::crd::{self, API_VERSION};

/// Steps 2–5's names, in order: the first that fails skips the ones after it.
const STEPS: [&str; 4] = ["identity", "api server", "rbac", "crds"];

/// Prints the steps after `failed` as not run, because of `why`.
fn skip_after(report: &mut Report<'_>, failed: &str, why: &str) {
    let next = STEPS
        .iter()
        .position(|s| *s == failed)
        .map_or(STEPS.len(), |i| i + 1);
    for step in &STEPS[next..] {
        report.line(Line::skip(step, why.to_owned()));
    }
}

/// Steps 2–5: identity, API server, RBAC, CRDs.
pub(super) async fn cluster_steps(config: &Config, report: &mut Report<'_>) {
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
            return skip_after(report, "identity", "no identity");
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
            return skip_after(report, "api server", "no API server");
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
            return skip_after(report, "api server", "no API server");
        }
    }
    for line in rbac(config, &client).await {
        report.line(line);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
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
