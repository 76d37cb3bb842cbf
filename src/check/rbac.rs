//! Step 4, RBAC: every rule the manager needs ([`RULES`]) and the
//! SelfSubjectAccessReviews that ask the API server about them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::{Line, STEP_TIMEOUT};
use crate::config::Config;

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
    /// Cluster-scoped: the watched namespaces themselves, for their labels (TRUST.md);
    /// by name when only some are watched.
    Namespaces,
    /// The manager's own namespace, in managed mode over the WebSocket: the audit
    /// outbox (a ConfigMap).
    Outbox,
    /// Every watched namespace, in managed mode over the WebSocket with shells enabled:
    /// `pods/exec` (the chart's `autonomic.shellRules`).
    Shells,
    /// Every watched namespace, in managed mode with `pause` or `resume` among the
    /// control actions: patch of Agents and Tools (the chart's `autonomic.controlRules`).
    Pause,
    /// Every watched namespace, in managed mode with `delete` among the control
    /// actions: delete of Agents and Tools.
    Delete,
}

impl Scope {
    /// Why `config` does not use the rules of this scope; `None` when it does. A
    /// permission of an unused scope held anyway is a warning (TRUST.md §6).
    fn unused_by(self, config: &Config) -> Option<&'static str> {
        use crate::config::Transport;
        let allowed = |action: &str| config.control_actions.contains(&action);
        match self {
            Scope::Watched | Scope::Namespaces => None,
            Scope::Lease if !config.leader_election => Some("leader election is off"),
            Scope::Lease => None,
            _ if !config.managed => Some("unmanaged: no control-plane link"),
            Scope::ClusterId if config.cluster_id.is_some() => Some("AUTONOMIC_CLUSTER_ID is set"),
            // Recorded only when the pod's uid is known (in a pod: `POD_UID`).
            Scope::OwnEvents if config.pod_uid.is_empty() => Some("not in a pod: no link Events"),
            Scope::Outbox if config.transport != Transport::Ws => {
                Some("the http transport keeps no outbox")
            }
            Scope::Shells if config.transport != Transport::Ws => {
                Some("the http transport opens no shells")
            }
            Scope::Shells if !config.shell_enabled => {
                Some("shells are off (AUTONOMIC_SHELL_ENABLED=false)")
            }
            Scope::Pause if !allowed("pause") && !allowed("resume") => {
                Some("AUTONOMIC_CONTROL_ACTIONS allows neither pause nor resume")
            }
            Scope::Delete if !allowed("delete") => {
                Some("AUTONOMIC_CONTROL_ACTIONS does not allow delete")
            }
            _ => None,
        }
    }
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
/// What the control plane's `pause`, `resume` and `delete` act on.
const CONTROLLED: &[&str] = &["agents", "tools"];
const LEASE_NAME: &str = "autonomic-manager";
const OUTBOX_NAME: &str = "autonomic-audit-outbox";

/// Every verb the manager uses, on what: the one list `check` asks the API server about.
/// A unit test holds it equal to the chart's rules (`charts/autonomic/templates/`).
pub const RULES: &[Rule] = &[
    rule("autonomic.sh", CRS, &["list", "watch"]),
    rule("autonomic.sh", CR_STATUS, &["patch"]),
    rule("", &["pods"], &["get", "list", "watch", "create", "delete"]),
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
    rule("", &["serviceaccounts"], &["list", "watch"]),
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
    Rule {
        group: "",
        resources: &["namespaces"],
        verbs: &["list", "watch"],
        names: &[],
        scope: Scope::Namespaces,
    },
    Rule {
        group: "",
        resources: &["configmaps"],
        verbs: &["get", "update"],
        names: &[OUTBOX_NAME],
        scope: Scope::Outbox,
    },
    Rule {
        group: "",
        resources: &["configmaps"],
        verbs: &["create"],
        names: &[],
        scope: Scope::Outbox,
    },
    Rule {
        group: "",
        resources: &["pods/exec"],
        verbs: &["get", "create"],
        names: &[],
        scope: Scope::Shells,
    },
    Rule {
        group: "autonomic.sh",
        resources: CONTROLLED,
        verbs: &["patch"],
        names: &[],
        scope: Scope::Pause,
    },
    Rule {
        group: "autonomic.sh",
        resources: CONTROLLED,
        verbs: &["delete"],
        names: &[],
        scope: Scope::Delete,
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
    name: Option<String>,
}

impl Permission {
    /// `watch pods`, `patch agents/status`, `update leases autonomic-manager`.
    fn action(&self) -> String {
        match &self.name {
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
    RULES
        .iter()
        .filter(|r| r.scope.unused_by(config).is_none())
        .flat_map(|r| permissions_of(r, config))
        .collect()
}

/// Each permission `rule` grants, where `config` would use it.
fn permissions_of(rule: &Rule, config: &Config) -> Vec<Permission> {
    let watched: Vec<Option<String>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.iter().cloned().map(Some).collect()
    };
    let home = vec![Some(config.pod_namespace.clone())];
    let (namespaces, names) = match rule.scope {
        Scope::Watched | Scope::Shells | Scope::Pause | Scope::Delete => (watched, vec![None]),
        Scope::Lease | Scope::OwnEvents | Scope::Outbox => (home, vec![None]),
        Scope::ClusterId => (vec![None], vec![None]),
        // Each watched namespace by name, or all of them.
        Scope::Namespaces => (vec![None], watched),
    };
    let names = if rule.names.is_empty() {
        names
    } else {
        rule.names.iter().map(|n| Some(n.to_string())).collect()
    };
    let mut out = Vec::new();
    for namespace in &namespaces {
        for resource in rule.resources {
            for verb in rule.verbs {
                for name in &names {
                    out.push(Permission {
                        namespace: namespace.clone(),
                        verb,
                        group: rule.group,
                        resource,
                        name: name.clone(),
                    });
                }
            }
        }
    }
    out
}

/// `cannot watch pods, create pods/exec in namespace a; cannot get namespaces kube-system`.
fn missing_text(missing: &[Permission]) -> String {
    by_place(missing, "cannot")
}

/// `permissions` grouped by where they apply, each group led by `lead`.
fn by_place(permissions: &[Permission], lead: &str) -> String {
    let mut by_place: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in permissions {
        by_place.entry(p.location()).or_default().push(p.action());
    }
    by_place
        .into_iter()
        .map(|(place, actions)| {
            let actions = actions.join(", ");
            if place.is_empty() {
                format!("{lead} {actions}")
            } else {
                format!("{lead} {actions} {place}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The permissions of the features `config` leaves off (the chart's rules for managed
/// mode, shells, control actions, the outbox, the cluster id, leader election), each
/// with why it is not used; one the configuration needs anyway (an Event in a watched
/// namespace that is also the manager's) is not among them. Held anyway, each is a
/// warning (TRUST.md §6).
fn unused(config: &Config) -> Vec<(Permission, &'static str)> {
    let needed = permissions(config);
    RULES
        .iter()
        .filter_map(|r| Some((r, r.scope.unused_by(config)?)))
        .flat_map(|(r, why)| permissions_of(r, config).into_iter().map(move |p| (p, why)))
        .filter(|(p, _)| !needed.contains(p))
        .collect()
}

/// One SelfSubjectAccessReview for each of `permissions`: allowed or not, or why the
/// API server could not say.
async fn ask(
    client: &kube::Client,
    permissions: &[Permission],
) -> Vec<(Permission, Result<bool, String>)> {
    use futures::StreamExt;
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    futures::stream::iter(permissions.iter().cloned())
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
        .await
}

/// Step 4: a SelfSubjectAccessReview for each permission of [`permissions`]; then, for
/// each of [`unused`] the identity holds, a warning line.
pub(super) async fn rbac(config: &Config, client: &kube::Client) -> Vec<Line> {
    let mut lines = vec![needed(config, client).await];
    let unused = unused(config);
    let permissions: Vec<Permission> = unused.iter().map(|(p, _)| p.clone()).collect();
    // The ones held, grouped by why they are not used: one warning line each.
    let mut held: BTreeMap<&str, Vec<Permission>> = BTreeMap::new();
    for ((p, answer), (_, why)) in ask(client, &permissions).await.into_iter().zip(&unused) {
        if answer == Ok(true) {
            held.entry(why).or_default().push(p);
        }
    }
    for (why, permissions) in held {
        lines.push(Line::warn(
            "rbac",
            format!(
                "{}, which this configuration does not use ({why})",
                by_place(&permissions, "may")
            ),
            "drop it from this identity (the chart grants a feature's permissions only with the feature: helm upgrade with the values this manager runs with)",
        ));
    }
    lines
}

/// The line for the permissions the configuration needs.
async fn needed(config: &Config, client: &kube::Client) -> Line {
    let wanted = permissions(config);
    let answers = ask(client, &wanted).await;
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
            places.insert(match (&p.namespace, p.name.as_deref()) {
                (_, Some(name)) if p.resource == "leases" => {
                    format!("the Lease {name} in namespace {}", config.pod_namespace)
                }
                (Some(ns), _) if p.resource == "configmaps" => format!("namespace {ns}"),
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
    let manifest = if config.managed {
        "deploy-managed.yaml"
    } else {
        "deploy.yaml"
    };
    let mut fix = format!(
        "grant this identity the chart's RBAC for this configuration (helm upgrade with its values, or kubectl apply --server-side -f {manifest})"
    );
    if missing
        .iter()
        .any(|p| p.resource == "namespaces" && p.verb == "get")
    {
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
        name: p.name.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .expect("config")
    }

    #[test]
    fn missing_permissions_are_named_by_place() {
        let p = |ns: Option<&str>, verb, resource, name: Option<&str>| Permission {
            namespace: ns.map(str::to_owned),
            verb,
            group: "",
            resource,
            name: name.map(str::to_owned),
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
        // 31 workload permissions in each watched namespace, and list and watch of each
        // of those namespaces by name; nothing of the link: no pods/exec, no writes to
        // the custom resources, no cluster id, no outbox.
        assert_eq!(unmanaged.len(), 62 + 4);
        assert!(!unmanaged.iter().any(|p| p.resource == "pods/exec"
            || p.resource == "configmaps"
            || (p.group == "autonomic.sh"
                && !p.resource.ends_with("/status")
                && p.verb != "list"
                && p.verb != "watch")
            || p.name.as_deref() == Some("kube-system")));
        assert!(unmanaged.contains(&Permission {
            namespace: None,
            verb: "watch",
            group: "",
            resource: "namespaces",
            name: Some("b".into()),
        }));
        assert!(
            unmanaged
                .iter()
                .all(|p| p.namespace.is_some() || p.name.is_some())
        );
        let all = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_LEADER_ELECTION", "true"),
            ("POD_NAMESPACE", "home"),
            ("POD_UID", "u-1"),
        ]));
        // Workload, namespaces (2), Lease (3), cluster id (1), link Events in the manager's
        // namespace (2), the audit outbox (3), pods/exec for shells (2), pause and resume
        // (patch agents, tools), delete (2).
        assert_eq!(all.len(), 31 + 2 + 3 + 1 + 2 + 3 + 2 + 2 + 2);
        assert!(all.contains(&Permission {
            namespace: None,
            verb: "delete",
            group: "autonomic.sh",
            resource: "tools",
            name: None,
        }));
        assert!(all.contains(&Permission {
            namespace: None,
            verb: "create",
            group: "",
            resource: "pods/exec",
            name: None,
        }));
        assert!(all.contains(&Permission {
            namespace: Some("home".into()),
            verb: "update",
            group: "",
            resource: "configmaps",
            name: Some(crate::connect::outbox::NAME.into()),
        }));
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
            name: Some(crate::leader::LEASE_NAME.into()),
        }));
        assert!(all.contains(&Permission {
            namespace: None,
            verb: "get",
            group: "",
            resource: "namespaces",
            name: Some("kube-system".into()),
        }));
        let with_id = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_CLUSTER_ID", "prod"),
        ]));
        assert_eq!(
            with_id.len(),
            31 + 2 + 3 + 2 + 4,
            "outside a pod: no link Events"
        );
        let no_shells = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_CLUSTER_ID", "prod"),
            ("AUTONOMIC_SHELL_ENABLED", "false"),
        ]));
        assert_eq!(no_shells.len(), 31 + 2 + 3 + 4, "shells off: no pods/exec");
        let restart_only = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_CLUSTER_ID", "prod"),
            ("AUTONOMIC_CONTROL_ACTIONS", "restart,resume"),
        ]));
        assert_eq!(
            restart_only.len(),
            31 + 2 + 3 + 2 + 2,
            "resume alone needs patch; no delete"
        );
        let http = permissions(&config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_CLUSTER_ID", "prod"),
            ("AUTONOMIC_TRANSPORT", "http"),
        ]));
        assert_eq!(
            http.len(),
            31 + 2 + 4,
            "the legacy transport keeps no outbox and opens no shells"
        );
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

    /// TRUST.md §6: what a configuration leaves off is every permission of the chart's
    /// feature rules it does not use, each with its reason, and never one it needs.
    #[test]
    fn unused_permissions_are_the_features_left_off() {
        let text = |u: &[(Permission, &str)]| -> Vec<String> {
            u.iter()
                .map(|(p, why)| format!("{} {} ({why})", p.action(), p.location()))
                .collect()
        };
        // Unmanaged, in a pod, home watched: the link's every grant, and the Lease.
        let unmanaged = config(&[
            ("AUTONOMIC_NAMESPACES", "home"),
            ("POD_NAMESPACE", "home"),
            ("POD_UID", "u-1"),
        ]);
        let off = "unmanaged: no control-plane link";
        assert_eq!(
            text(&unused(&unmanaged)),
            [
                "get leases autonomic-manager in namespace home (leader election is off)"
                    .to_owned(),
                "update leases autonomic-manager in namespace home (leader election is off)"
                    .to_owned(),
                "create leases in namespace home (leader election is off)".to_owned(),
                format!("get namespaces kube-system  ({off})"),
                // Link Events in home: the workload's Events there are needed anyway.
                format!("get configmaps autonomic-audit-outbox in namespace home ({off})"),
                format!("update configmaps autonomic-audit-outbox in namespace home ({off})"),
                format!("create configmaps in namespace home ({off})"),
                format!("get pods/exec in namespace home ({off})"),
                format!("create pods/exec in namespace home ({off})"),
                format!("patch agents in namespace home ({off})"),
                format!("patch tools in namespace home ({off})"),
                format!("delete agents in namespace home ({off})"),
                format!("delete tools in namespace home ({off})"),
            ]
        );
        // Elsewhere than home, the link Events' Role is unused too.
        let away = config(&[
            ("AUTONOMIC_NAMESPACES", "a"),
            ("POD_NAMESPACE", "home"),
            ("POD_UID", "u"),
        ]);
        assert!(
            text(&unused(&away)).contains(&format!("create events in namespace home ({off})")),
            "{:?}",
            text(&unused(&away))
        );
        // Managed with everything on: nothing unused.
        let all = config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_LEADER_ELECTION", "true"),
            ("POD_NAMESPACE", "home"),
            ("POD_UID", "u-1"),
        ]);
        assert_eq!(text(&unused(&all)), Vec::<String>::new());
        // Each feature off names itself.
        let some = config(&[
            ("AUTONOMIC_MANAGED", "true"),
            ("AUTONOMIC_AUTH_TOKEN", "t"),
            ("AUTONOMIC_LEADER_ELECTION", "true"),
            ("AUTONOMIC_CLUSTER_ID", "prod"),
            ("AUTONOMIC_TRANSPORT", "http"),
            ("AUTONOMIC_CONTROL_ACTIONS", "none"),
            ("POD_NAMESPACE", "home"),
        ]);
        let reasons: BTreeSet<&str> = unused(&some).into_iter().map(|(_, why)| why).collect();
        assert_eq!(
            reasons.into_iter().collect::<Vec<_>>(),
            [
                "AUTONOMIC_CLUSTER_ID is set",
                "AUTONOMIC_CONTROL_ACTIONS allows neither pause nor resume",
                "AUTONOMIC_CONTROL_ACTIONS does not allow delete",
                "not in a pod: no link Events",
                "the http transport keeps no outbox",
                "the http transport opens no shells",
            ]
        );
        for c in [&unmanaged, &away, &all, &some] {
            let needed = permissions(c);
            assert!(unused(c).iter().all(|(p, _)| !needed.contains(p)));
        }
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
    /// `_helpers.tpl` (each watched namespace, or cluster-wide), the leader-election Role,
    /// the link Events' Role and the cluster-id and namespaces ClusterRoles of
    /// `rbac.yaml` (their template lines dropped: the rules themselves are literal YAML).
    #[test]
    fn the_rbac_table_is_the_charts() {
        let helpers = include_str!("../../charts/autonomic/templates/_helpers.tpl");
        let start = helpers
            .find(r#"{{- define "autonomic.workloadRules" -}}"#)
            .expect("the workload rules in _helpers.tpl");
        let body = &helpers[start..];
        let body = &body[body.find('\n').unwrap() + 1..body.find("{{- end -}}").unwrap()];
        let workload: Value = serde_saphyr::from_str(body).expect("the workload rules parse");
        let mut chart = BTreeSet::new();
        grants_of(&workload, Scope::Watched, &mut chart);
        // The shells' rule, its template lines (the feature condition) dropped.
        // A conditional template's rules, its template lines (the conditions) dropped.
        let conditional = |name: &str| -> Value {
            let start = helpers
                .find(&format!(r#"{{{{- define "autonomic.{name}" -}}}}"#))
                .unwrap_or_else(|| panic!("{name} in _helpers.tpl"));
            let body = &helpers[start..];
            let body: String = body[..body.find("{{- end -}}\n{{- end -}}").unwrap()]
                .lines()
                .filter(|l| !l.contains("{{"))
                .map(|l| format!("{l}\n"))
                .collect();
            serde_saphyr::from_str(&body).unwrap_or_else(|e| panic!("{name} parse: {e}"))
        };
        let shells = conditional("shellRules");
        grants_of(&shells, Scope::Shells, &mut chart);
        // The control actions' rules, likewise; told apart by their verb.
        let control = conditional("controlRules");
        for rule in control.as_array().expect("a list of rules") {
            let scope = match rule["verbs"][0].as_str() {
                Some("patch") => Scope::Pause,
                Some("delete") => Scope::Delete,
                other => panic!("a control rule with verb {other:?}"),
            };
            grants_of(&Value::Array(vec![rule.clone()]), scope, &mut chart);
        }

        let rbac = include_str!("../../charts/autonomic/templates/rbac.yaml");
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
                Some("Role") if doc["rules"][0]["resources"][0] == "configmaps" => Scope::Outbox,
                Some("Role") => Scope::Lease,
                // The namespaces' labels, told from the cluster id's by the verb.
                Some("ClusterRole") if doc["rules"][0]["verbs"][0] == "list" => Scope::Namespaces,
                Some("ClusterRole") => Scope::ClusterId,
                other => panic!("rules in a {other:?}"),
            };
            scopes.push(scope);
            grants_of(&doc["rules"], scope, &mut chart);
        }
        scopes.sort();
        assert_eq!(
            scopes,
            [
                Scope::Lease,
                Scope::ClusterId,
                Scope::OwnEvents,
                Scope::Namespaces,
                Scope::Outbox
            ]
        );

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
        assert_eq!(OUTBOX_NAME, crate::connect::outbox::NAME);
    }
}
