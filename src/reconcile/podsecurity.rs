//! TRUST.md §1: every pod the manager creates satisfies the Pod Security Standards level
//! of its namespace (`restricted`, `baseline` or `privileged`), enforced here whether or
//! not the cluster runs Pod Security Admission.
//!
//! Pure: [`check`] reads a pod the manager built and says which rule it breaks, if any;
//! [`merge_defaults`] fills what a template's `securityContext` leaves unset. The rules
//! are one table, [`RULES`], as the standards write them
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>), each over
//! every field that carries it (pod, containers, init and ephemeral containers), whether
//! or not a template can set that field today: a field a template may one day reach is
//! already checked.

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, ContainerPort, Pod, PodSecurityContext, PodSpec, SELinuxOptions,
    SeccompProfile, SecurityContext, WindowsSecurityContextOptions,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use crate::crd::PodSecurityLevel as Level;

use super::common;

/// Where a rule is broken: the pod as a whole, or one container (by name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    Pod,
    Container(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Pod => f.write_str("pod"),
            Place::Container(name) => write!(f, "container {name:?}"),
        }
    }
}

/// A rule of the level that the pod breaks. Its text is the status message:
/// `container "runtime": securityContext.privileged=true is not allowed under restricted`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule's name in [`RULES`].
    pub rule: &'static str,
    /// The level in force (not the rule's own, which may be lower).
    pub level: Level,
    pub place: Place,
    /// The field, with its value when the value is what is wrong: container fields from
    /// the container (`securityContext.runAsUser=0`), pod fields from the pod
    /// (`spec.hostNetwork=true`).
    pub field: String,
    /// What the field must be instead, when leaving it unset is what is wrong
    /// (`be false`); `None`: the field or its value is not allowed.
    pub must: Option<&'static str>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (place, field, level) = (&self.place, &self.field, self.level);
        match self.must {
            None => write!(f, "{place}: {field} is not allowed under {level}"),
            Some(must) => write!(f, "{place}: {field} must {must} under {level}"),
        }
    }
}

impl std::error::Error for Violation {}

/// What one rule found: a [`Violation`] without the rule and the level.
#[derive(Debug)]
pub struct Finding {
    place: Place,
    field: String,
    must: Option<&'static str>,
}

fn at_pod(field: impl Into<String>) -> Finding {
    Finding {
        place: Place::Pod,
        field: field.into(),
        must: None,
    }
}

/// One rule of the standards: enforced at `level` and every stricter one.
pub struct Rule {
    /// Pod Security Admission's name of the check.
    pub name: &'static str,
    /// The lowest level that enforces it.
    pub level: Level,
    /// The first place the pod breaks it, if any.
    pub check: fn(&ObjectMeta, &PodSpec) -> Option<Finding>,
}

/// The rules, `baseline`'s first. A `restricted` pod breaks none of them.
pub const RULES: &[Rule] = &[
    Rule {
        name: "hostProcess",
        level: Level::Baseline,
        check: host_process,
    },
    Rule {
        name: "hostNamespaces",
        level: Level::Baseline,
        check: host_namespaces,
    },
    Rule {
        name: "privileged",
        level: Level::Baseline,
        check: privileged,
    },
    Rule {
        name: "capabilities_baseline",
        level: Level::Baseline,
        check: capabilities_baseline,
    },
    Rule {
        name: "hostPathVolumes",
        level: Level::Baseline,
        check: host_path_volumes,
    },
    Rule {
        name: "hostPorts",
        level: Level::Baseline,
        check: host_ports,
    },
    Rule {
        name: "appArmorProfile",
        level: Level::Baseline,
        check: app_armor,
    },
    Rule {
        name: "seLinuxOptions",
        level: Level::Baseline,
        check: se_linux,
    },
    Rule {
        name: "procMount",
        level: Level::Baseline,
        check: proc_mount,
    },
    Rule {
        name: "seccompProfile_baseline",
        level: Level::Baseline,
        check: seccomp_baseline,
    },
    Rule {
        name: "sysctls",
        level: Level::Baseline,
        check: sysctls,
    },
    Rule {
        name: "restrictedVolumes",
        level: Level::Restricted,
        check: restricted_volumes,
    },
    Rule {
        name: "allowPrivilegeEscalation",
        level: Level::Restricted,
        check: allow_privilege_escalation,
    },
    Rule {
        name: "runAsNonRoot",
        level: Level::Restricted,
        check: run_as_non_root,
    },
    Rule {
        name: "runAsUser",
        level: Level::Restricted,
        check: run_as_user,
    },
    Rule {
        name: "seccompProfile_restricted",
        level: Level::Restricted,
        check: seccomp_restricted,
    },
    Rule {
        name: "capabilities_restricted",
        level: Level::Restricted,
        check: capabilities_restricted,
    },
];

/// Whether `pod` satisfies `level`: the first rule it breaks, in the order of [`RULES`].
pub fn check(level: Level, pod: &Pod) -> Result<(), Violation> {
    match violations(level, pod).into_iter().next() {
        Some(v) => Err(v),
        None => Ok(()),
    }
}

/// Every rule of `level` that `pod` breaks (the first place each).
pub fn violations(level: Level, pod: &Pod) -> Vec<Violation> {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    RULES
        .iter()
        .filter(|r| r.level <= level)
        .filter_map(|r| {
            (r.check)(&pod.metadata, spec).map(|f| Violation {
                rule: r.name,
                level,
                place: f.place,
                field: f.field,
                must: f.must,
            })
        })
        .collect()
}

/// The runtime container's `securityContext` from a template's: under `restricted`, the
/// template merged over the manager's restricted defaults (`runAsNonRoot: true`, uid and
/// gid 65532, `allowPrivilegeEscalation: false`, capabilities `drop: [ALL]`, seccomp
/// `RuntimeDefault`) field by field, so what it leaves unset stays restricted; under a
/// laxer level, which the admin chose so that templates may ask for more (root, above
/// all), the template as written. Without a template, the defaults at every level.
///
/// Not a check: a template field that breaks the level is kept, and [`check`] refuses
/// the pod.
pub fn merge_defaults(level: Level, template: Option<SecurityContext>) -> SecurityContext {
    let defaults = common::restricted_security();
    let Some(template) = template else {
        return defaults;
    };
    if level < Level::Restricted {
        return template;
    }
    // Every field named, none with `..`: a field a new Kubernetes version adds does not
    // compile until it is decided here.
    let SecurityContext {
        allow_privilege_escalation,
        app_armor_profile,
        capabilities,
        privileged,
        proc_mount,
        read_only_root_filesystem,
        run_as_group,
        run_as_non_root,
        run_as_user,
        se_linux_options,
        seccomp_profile,
        windows_options,
    } = template;
    let capabilities = match (capabilities, defaults.capabilities) {
        (Some(t), Some(d)) => Some(Capabilities {
            add: t.add.or(d.add),
            drop: t.drop.or(d.drop),
        }),
        (t, d) => t.or(d),
    };
    SecurityContext {
        allow_privilege_escalation: allow_privilege_escalation
            .or(defaults.allow_privilege_escalation),
        app_armor_profile: app_armor_profile.or(defaults.app_armor_profile),
        capabilities,
        privileged: privileged.or(defaults.privileged),
        proc_mount: proc_mount.or(defaults.proc_mount),
        read_only_root_filesystem: read_only_root_filesystem.or(defaults.read_only_root_filesystem),
        run_as_group: run_as_group.or(defaults.run_as_group),
        run_as_non_root: run_as_non_root.or(defaults.run_as_non_root),
        run_as_user: run_as_user.or(defaults.run_as_user),
        se_linux_options: se_linux_options.or(defaults.se_linux_options),
        // A profile is one choice (its type and, for Localhost, its file): taken whole.
        seccomp_profile: seccomp_profile.or(defaults.seccomp_profile),
        windows_options: windows_options.or(defaults.windows_options),
    }
}

// The rules' data, as the standards list it.

/// Capabilities `baseline` lets a container add (the container runtimes' defaults).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The one capability `restricted` lets a container add back after dropping `ALL`.
const RESTRICTED_CAPABILITIES: &[&str] = &["NET_BIND_SERVICE"];

/// The sysctls `baseline` allows: namespaced, and isolated from other pods.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_syncookies",
];

/// SELinux types `baseline` allows (besides none).
const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The volume sources `restricted` allows, as the API spells them: any other, including
/// one a later Kubernetes adds, is refused.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The profile types that confine, seccomp's and AppArmor's alike (`restricted` asks for
/// one of them for seccomp; `baseline` allows no other for AppArmor).
const CONFINED: &[&str] = &["RuntimeDefault", "Localhost"];

/// One container of any kind, as the rules read it.
struct ContainerView<'a> {
    name: &'a str,
    sc: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
}

/// Every container of the pod: init containers, containers, ephemeral containers.
fn containers(spec: &PodSpec) -> Vec<ContainerView<'_>> {
    let mut all = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        all.push(ContainerView {
            name: &c.name,
            sc: c.security_context.as_ref(),
            ports: c.ports.as_deref().unwrap_or_default(),
        });
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        all.push(ContainerView {
            name: &c.name,
            sc: c.security_context.as_ref(),
            ports: c.ports.as_deref().unwrap_or_default(),
        });
    }
    all
}

/// The first container for which `bad` finds something: (field, what it must be).
fn in_containers(
    spec: &PodSpec,
    bad: impl Fn(&ContainerView) -> Option<(String, Option<&'static str>)>,
) -> Option<Finding> {
    containers(spec).iter().find_map(|c| {
        bad(c).map(|(field, must)| Finding {
            place: Place::Container(c.name.to_owned()),
            field,
            must,
        })
    })
}

/// A container's own securityContext field, when `bad` finds it wrong: not allowed.
fn in_container_sc(
    spec: &PodSpec,
    bad: impl Fn(&SecurityContext) -> Option<String>,
) -> Option<Finding> {
    in_containers(spec, |c| c.sc.and_then(&bad).map(|f| (f, None)))
}

fn pod_sc(spec: &PodSpec) -> Option<&PodSecurityContext> {
    spec.security_context.as_ref()
}

fn host_process(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    let on =
        |w: Option<&WindowsSecurityContextOptions>| w.and_then(|w| w.host_process) == Some(true);
    if pod_sc(spec).is_some_and(|s| on(s.windows_options.as_ref())) {
        return Some(at_pod(
            "spec.securityContext.windowsOptions.hostProcess=true",
        ));
    }
    in_container_sc(spec, |sc| {
        on(sc.windows_options.as_ref())
            .then(|| "securityContext.windowsOptions.hostProcess=true".to_owned())
    })
}

fn host_namespaces(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    [
        (spec.host_network, "spec.hostNetwork=true"),
        (spec.host_pid, "spec.hostPID=true"),
        (spec.host_ipc, "spec.hostIPC=true"),
    ]
    .into_iter()
    .find(|(on, _)| *on == Some(true))
    .map(|(_, field)| at_pod(field))
}

fn privileged(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_container_sc(spec, |sc| {
        (sc.privileged == Some(true)).then(|| "securityContext.privileged=true".to_owned())
    })
}

/// `securityContext.capabilities.add=[X, Y]`: the added capabilities not in `allowed`.
fn added_beyond(sc: &SecurityContext, allowed: &[&str]) -> Option<String> {
    let extra: Vec<&str> = sc
        .capabilities
        .as_ref()?
        .add
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|c| !allowed.contains(c))
        .collect();
    (!extra.is_empty()).then(|| format!("securityContext.capabilities.add=[{}]", extra.join(", ")))
}

fn capabilities_baseline(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_container_sc(spec, |sc| added_beyond(sc, BASELINE_CAPABILITIES))
}

fn host_path_volumes(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.is_some())
        .map(|v| at_pod(format!("spec.volumes[{:?}].hostPath", v.name)))
}

fn host_ports(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_containers(spec, |c| {
        c.ports.iter().enumerate().find_map(|(i, p)| {
            p.host_port
                .filter(|hp| *hp != 0)
                .map(|hp| (format!("ports[{i}].hostPort={hp}"), None))
        })
    })
}

fn app_armor(meta: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    // The annotation (before Kubernetes 1.30): runtime/default or localhost/<profile>.
    let annotation = meta.annotations.iter().flatten().find(|(k, v)| {
        k.starts_with(APPARMOR_ANNOTATION)
            && !(v.is_empty() || *v == "runtime/default" || v.starts_with("localhost/"))
    });
    if let Some((k, v)) = annotation {
        return Some(at_pod(format!("metadata.annotations[{k:?}]={v:?}")));
    }
    // The field: RuntimeDefault or Localhost, never Unconfined.
    fn unconfined(p: Option<&AppArmorProfile>) -> Option<&str> {
        p.map(|p| p.type_.as_str())
            .filter(|t| !CONFINED.contains(t))
    }
    if let Some(t) = pod_sc(spec).and_then(|s| unconfined(s.app_armor_profile.as_ref())) {
        return Some(at_pod(format!(
            "spec.securityContext.appArmorProfile.type={t}"
        )));
    }
    in_container_sc(spec, |sc| {
        unconfined(sc.app_armor_profile.as_ref())
            .map(|t| format!("securityContext.appArmorProfile.type={t}"))
    })
}

/// What is wrong in SELinux options, relative to them: a type off the list, any user or
/// role.
fn se_linux_wrong(o: &SELinuxOptions) -> Option<String> {
    let set = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
    if let Some(t) = set(&o.type_).filter(|t| !SELINUX_TYPES.contains(&t.as_str())) {
        return Some(format!("seLinuxOptions.type={t}"));
    }
    if let Some(u) = set(&o.user) {
        return Some(format!("seLinuxOptions.user={u}"));
    }
    set(&o.role).map(|r| format!("seLinuxOptions.role={r}"))
}

fn se_linux(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    if let Some(f) = pod_sc(spec)
        .and_then(|s| s.se_linux_options.as_ref())
        .and_then(se_linux_wrong)
    {
        return Some(at_pod(format!("spec.securityContext.{f}")));
    }
    in_container_sc(spec, |sc| {
        sc.se_linux_options
            .as_ref()
            .and_then(se_linux_wrong)
            .map(|f| format!("securityContext.{f}"))
    })
}

fn proc_mount(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_container_sc(spec, |sc| {
        sc.proc_mount
            .as_deref()
            .filter(|m| *m != "Default")
            .map(|m| format!("securityContext.procMount={m}"))
    })
}

fn seccomp_baseline(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    let unconfined = |p: Option<&SeccompProfile>| p.is_some_and(|p| p.type_ == "Unconfined");
    if pod_sc(spec).is_some_and(|s| unconfined(s.seccomp_profile.as_ref())) {
        return Some(at_pod(
            "spec.securityContext.seccompProfile.type=Unconfined",
        ));
    }
    in_container_sc(spec, |sc| {
        unconfined(sc.seccomp_profile.as_ref())
            .then(|| "securityContext.seccompProfile.type=Unconfined".to_owned())
    })
}

fn sysctls(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    pod_sc(spec)?
        .sysctls
        .iter()
        .flatten()
        .find(|s| !SAFE_SYSCTLS.contains(&s.name.as_str()))
        .map(|s| at_pod(format!("spec.securityContext.sysctls[{:?}]", s.name)))
}

fn restricted_volumes(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    // Read from the volume's API form, so a source a later Kubernetes adds is refused
    // rather than missed.
    spec.volumes.iter().flatten().find_map(|v| {
        let json = serde_json::to_value(v).ok()?;
        let source = json
            .as_object()?
            .keys()
            .find(|k| *k != "name" && !RESTRICTED_VOLUMES.contains(&k.as_str()))?
            .clone();
        Some(at_pod(format!("spec.volumes[{:?}].{source}", v.name)))
    })
}

fn allow_privilege_escalation(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_containers(spec, |c| {
        match c.sc.and_then(|sc| sc.allow_privilege_escalation) {
            Some(false) => None,
            Some(true) => Some((
                "securityContext.allowPrivilegeEscalation=true".to_owned(),
                None,
            )),
            None => Some((
                "securityContext.allowPrivilegeEscalation".to_owned(),
                Some("be false"),
            )),
        }
    })
}

fn run_as_non_root(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    let pod = pod_sc(spec).and_then(|s| s.run_as_non_root);
    if pod == Some(false) {
        return Some(at_pod("spec.securityContext.runAsNonRoot=false"));
    }
    in_containers(spec, |c| match c.sc.and_then(|sc| sc.run_as_non_root) {
        Some(true) => None,
        Some(false) => Some(("securityContext.runAsNonRoot=false".to_owned(), None)),
        None if pod == Some(true) => None,
        None => Some((
            "securityContext.runAsNonRoot".to_owned(),
            Some("be true (here or in spec.securityContext)"),
        )),
    })
}

fn run_as_user(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    if pod_sc(spec).and_then(|s| s.run_as_user) == Some(0) {
        return Some(at_pod("spec.securityContext.runAsUser=0"));
    }
    in_container_sc(spec, |sc| {
        (sc.run_as_user == Some(0)).then(|| "securityContext.runAsUser=0".to_owned())
    })
}

fn seccomp_restricted(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    let kind = |p: Option<&SeccompProfile>| p.map(|p| p.type_.clone());
    let pod = kind(pod_sc(spec).and_then(|s| s.seccomp_profile.as_ref()));
    if let Some(t) = pod.as_deref().filter(|t| !CONFINED.contains(t)) {
        return Some(at_pod(format!(
            "spec.securityContext.seccompProfile.type={t}"
        )));
    }
    in_containers(spec, |c| {
        match kind(c.sc.and_then(|sc| sc.seccomp_profile.as_ref())) {
            Some(t) if CONFINED.contains(&t.as_str()) => None,
            Some(t) => Some((format!("securityContext.seccompProfile.type={t}"), None)),
            None if pod.is_some() => None,
            None => Some((
                "securityContext.seccompProfile.type".to_owned(),
                Some("be RuntimeDefault or Localhost (here or in spec.securityContext)"),
            )),
        }
    })
}

fn capabilities_restricted(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_containers(spec, |c| {
        let sc = c.sc;
        let drops_all = sc
            .and_then(|sc| sc.capabilities.as_ref())
            .and_then(|caps| caps.drop.as_ref())
            .is_some_and(|d| d.iter().any(|c| c == "ALL"));
        if !drops_all {
            return Some((
                "securityContext.capabilities.drop".to_owned(),
                Some("include ALL"),
            ));
        }
        sc.and_then(|sc| added_beyond(sc, RESTRICTED_CAPABILITIES))
            .map(|f| (f, None))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, EphemeralContainer, HostPathVolumeSource, NFSVolumeSource, SecretVolumeSource,
        Sysctl, Volume,
    };
    use std::collections::BTreeMap;

    /// A pod as the manager builds it: two restricted containers, seccomp at pod level,
    /// a Secret volume. It breaks no rule of any level.
    fn base() -> Pod {
        let container = |name: &str| Container {
            name: name.into(),
            image: Some("i".into()),
            security_context: Some(common::restricted_security()),
            ports: Some(vec![ContainerPort {
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container("agentlet"), container("runtime")],
                security_context: Some(common::restricted_pod_security()),
                volumes: Some(vec![Volume {
                    name: "config".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some("s".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn spec(p: &mut Pod) -> &mut PodSpec {
        p.spec.as_mut().unwrap()
    }

    /// The `runtime` container's securityContext.
    fn sc(p: &mut Pod) -> &mut SecurityContext {
        spec(p).containers[1].security_context.as_mut().unwrap()
    }

    fn pod_sc(p: &mut Pod) -> &mut PodSecurityContext {
        spec(p).security_context.get_or_insert_default()
    }

    fn profile(t: &str) -> SeccompProfile {
        SeccompProfile {
            type_: t.into(),
            ..Default::default()
        }
    }

    fn caps(c: &mut SecurityContext) -> &mut Capabilities {
        c.capabilities.get_or_insert_default()
    }

    fn volume(p: &mut Pod, v: Volume) {
        spec(p).volumes.get_or_insert_default().push(v);
    }

    type Mutate = fn(&mut Pod);

    /// `rule` (which must be in the table) catches each mutation of the base pod with
    /// exactly this message at its own level and above, alone at its own level (a
    /// stricter level may have a rule of its own for the same field); the levels below
    /// let the pod through.
    fn catches(rule: &str, cases: &[(Mutate, &str)]) {
        let r = RULES
            .iter()
            .find(|r| r.name == rule)
            .unwrap_or_else(|| panic!("{rule} is not in RULES"));
        assert!(!cases.is_empty());
        for (mutate, message) in cases {
            let mut pod = base();
            mutate(&mut pod);
            for level in Level::ALL {
                let found = violations(level, &pod);
                if level < r.level {
                    assert_eq!(found, [], "{rule} at {level}: {message}");
                    continue;
                }
                let v = found
                    .iter()
                    .find(|v| v.rule == rule)
                    .unwrap_or_else(|| panic!("{rule} at {level}: {message}: {found:?}"));
                assert_eq!(v.to_string(), message.replace("{level}", level.as_str()));
                if level == r.level {
                    assert_eq!(found.len(), 1, "{rule} at {level}: {found:?}");
                    assert_eq!(check(level, &pod), Err(v.clone()));
                }
            }
        }
    }

    /// Each rule's name, in table order: one test below each.
    const TESTED: &[&str] = &[
        "hostProcess",
        "hostNamespaces",
        "privileged",
        "capabilities_baseline",
        "hostPathVolumes",
        "hostPorts",
        "appArmorProfile",
        "seLinuxOptions",
        "procMount",
        "seccompProfile_baseline",
        "sysctls",
        "restrictedVolumes",
        "allowPrivilegeEscalation",
        "runAsNonRoot",
        "runAsUser",
        "seccompProfile_restricted",
        "capabilities_restricted",
    ];

    #[test]
    fn every_rule_has_its_test_and_baselines_come_first() {
        let names: Vec<_> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(names, TESTED);
        assert!(RULES.iter().all(|r| r.level != Level::Privileged));
        assert!(RULES.is_sorted_by_key(|r| r.level));
    }

    #[test]
    fn the_managers_own_pod_passes_every_level_and_privileged_passes_anything() {
        for level in Level::ALL {
            assert_eq!(check(level, &base()), Ok(()), "{level}");
        }
        let mut worst = base();
        sc(&mut worst).privileged = Some(true);
        sc(&mut worst).run_as_user = Some(0);
        spec(&mut worst).host_network = Some(true);
        volume(
            &mut worst,
            Volume {
                name: "root".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(check(Level::Privileged, &worst), Ok(()));
        // Every rule that applies is reported; `check` gives the first, in table order.
        let names: Vec<_> = violations(Level::Restricted, &worst)
            .iter()
            .map(|v| v.rule)
            .collect();
        assert_eq!(
            names,
            [
                "hostNamespaces",
                "privileged",
                "hostPathVolumes",
                "restrictedVolumes",
                "runAsUser"
            ]
        );
        assert_eq!(
            check(Level::Baseline, &worst).unwrap_err().to_string(),
            "pod: spec.hostNetwork=true is not allowed under baseline"
        );
    }

    #[test]
    fn host_process() {
        fn windows() -> Option<WindowsSecurityContextOptions> {
            Some(WindowsSecurityContextOptions {
                host_process: Some(true),
                ..Default::default()
            })
        }
        catches(
            "hostProcess",
            &[
                (
                    |p| pod_sc(p).windows_options = windows(),
                    "pod: spec.securityContext.windowsOptions.hostProcess=true is not allowed under {level}",
                ),
                (
                    |p| sc(p).windows_options = windows(),
                    "container \"runtime\": securityContext.windowsOptions.hostProcess=true is not allowed under {level}",
                ),
            ],
        );
    }

    #[test]
    fn host_namespaces() {
        catches(
            "hostNamespaces",
            &[
                (
                    |p| spec(p).host_network = Some(true),
                    "pod: spec.hostNetwork=true is not allowed under {level}",
                ),
                (
                    |p| spec(p).host_pid = Some(true),
                    "pod: spec.hostPID=true is not allowed under {level}",
                ),
                (
                    |p| spec(p).host_ipc = Some(true),
                    "pod: spec.hostIPC=true is not allowed under {level}",
                ),
            ],
        );
    }

    #[test]
    fn privileged() {
        catches(
            "privileged",
            &[
                (
                    |p| sc(p).privileged = Some(true),
                    "container \"runtime\": securityContext.privileged=true is not allowed under {level}",
                ),
                // Init and ephemeral containers are containers too.
                (
                    |p| {
                        let mut init = spec(p).containers[0].clone();
                        init.name = "init".into();
                        init.security_context.as_mut().unwrap().privileged = Some(true);
                        spec(p).init_containers = Some(vec![init]);
                    },
                    "container \"init\": securityContext.privileged=true is not allowed under {level}",
                ),
                (
                    |p| {
                        let mut debug = EphemeralContainer {
                            name: "debug".into(),
                            security_context: Some(common::restricted_security()),
                            ..Default::default()
                        };
                        debug.security_context.as_mut().unwrap().privileged = Some(true);
                        spec(p).ephemeral_containers = Some(vec![debug]);
                    },
                    "container \"debug\": securityContext.privileged=true is not allowed under {level}",
                ),
            ],
        );
    }

    #[test]
    fn capabilities_baseline() {
        catches(
            "capabilities_baseline",
            &[
                (
                    |p| caps(sc(p)).add = Some(vec!["CHOWN".into(), "SYS_ADMIN".into()]),
                    "container \"runtime\": securityContext.capabilities.add=[SYS_ADMIN] is not allowed under {level}",
                ),
                (
                    |p| caps(sc(p)).add = Some(vec!["NET_RAW".into()]),
                    "container \"runtime\": securityContext.capabilities.add=[NET_RAW] is not allowed under {level}",
                ),
            ],
        );
        // Baseline's own set passes baseline (restricted is the next rule's business).
        let mut p = base();
        caps(sc(&mut p)).add = Some(
            BASELINE_CAPABILITIES
                .iter()
                .map(|c| c.to_string())
                .collect(),
        );
        assert_eq!(check(Level::Baseline, &p), Ok(()));
    }

    #[test]
    fn host_path_volumes() {
        catches(
            "hostPathVolumes",
            &[(
                |p| {
                    volume(
                        p,
                        Volume {
                            name: "docker".into(),
                            host_path: Some(HostPathVolumeSource {
                                path: "/var/run/docker.sock".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )
                },
                "pod: spec.volumes[\"docker\"].hostPath is not allowed under {level}",
            )],
        );
    }

    #[test]
    fn host_ports() {
        catches(
            "hostPorts",
            &[(
                |p| spec(p).containers[1].ports.as_mut().unwrap()[0].host_port = Some(80),
                "container \"runtime\": ports[0].hostPort=80 is not allowed under {level}",
            )],
        );
        let mut p = base();
        spec(&mut p).containers[1].ports.as_mut().unwrap()[0].host_port = Some(0);
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn app_armor() {
        fn unconfined() -> Option<AppArmorProfile> {
            Some(AppArmorProfile {
                type_: "Unconfined".into(),
                ..Default::default()
            })
        }
        catches(
            "appArmorProfile",
            &[
                (
                    |p| {
                        p.metadata.annotations = Some(BTreeMap::from([(
                            format!("{APPARMOR_ANNOTATION}runtime"),
                            "unconfined".into(),
                        )]))
                    },
                    "pod: metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/runtime\"]=\"unconfined\" is not allowed under {level}",
                ),
                (
                    |p| pod_sc(p).app_armor_profile = unconfined(),
                    "pod: spec.securityContext.appArmorProfile.type=Unconfined is not allowed under {level}",
                ),
                (
                    |p| sc(p).app_armor_profile = unconfined(),
                    "container \"runtime\": securityContext.appArmorProfile.type=Unconfined is not allowed under {level}",
                ),
            ],
        );
        let mut p = base();
        p.metadata.annotations = Some(BTreeMap::from([
            (
                format!("{APPARMOR_ANNOTATION}runtime"),
                "localhost/mine".into(),
            ),
            (
                format!("{APPARMOR_ANNOTATION}agentlet"),
                "runtime/default".into(),
            ),
        ]));
        sc(&mut p).app_armor_profile = Some(AppArmorProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        });
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn se_linux() {
        catches(
            "seLinuxOptions",
            &[
                (
                    |p| {
                        sc(p).se_linux_options = Some(SELinuxOptions {
                            type_: Some("spc_t".into()),
                            ..Default::default()
                        })
                    },
                    "container \"runtime\": securityContext.seLinuxOptions.type=spc_t is not allowed under {level}",
                ),
                (
                    |p| {
                        pod_sc(p).se_linux_options = Some(SELinuxOptions {
                            user: Some("system_u".into()),
                            ..Default::default()
                        })
                    },
                    "pod: spec.securityContext.seLinuxOptions.user=system_u is not allowed under {level}",
                ),
                (
                    |p| {
                        sc(p).se_linux_options = Some(SELinuxOptions {
                            role: Some("sysadm_r".into()),
                            ..Default::default()
                        })
                    },
                    "container \"runtime\": securityContext.seLinuxOptions.role=sysadm_r is not allowed under {level}",
                ),
            ],
        );
        let mut p = base();
        sc(&mut p).se_linux_options = Some(SELinuxOptions {
            type_: Some("container_init_t".into()),
            level: Some("s0:c123,c456".into()),
            ..Default::default()
        });
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn proc_mount() {
        catches(
            "procMount",
            &[(
                |p| sc(p).proc_mount = Some("Unmasked".into()),
                "container \"runtime\": securityContext.procMount=Unmasked is not allowed under {level}",
            )],
        );
        let mut p = base();
        sc(&mut p).proc_mount = Some("Default".into());
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn seccomp_baseline() {
        catches(
            "seccompProfile_baseline",
            &[
                (
                    |p| pod_sc(p).seccomp_profile = Some(profile("Unconfined")),
                    "pod: spec.securityContext.seccompProfile.type=Unconfined is not allowed under {level}",
                ),
                (
                    |p| sc(p).seccomp_profile = Some(profile("Unconfined")),
                    "container \"runtime\": securityContext.seccompProfile.type=Unconfined is not allowed under {level}",
                ),
            ],
        );
    }

    #[test]
    fn sysctls() {
        catches(
            "sysctls",
            &[(
                |p| {
                    pod_sc(p).sysctls = Some(vec![
                        Sysctl {
                            name: "net.ipv4.tcp_syncookies".into(),
                            value: "1".into(),
                        },
                        Sysctl {
                            name: "kernel.msgmax".into(),
                            value: "1".into(),
                        },
                    ])
                },
                "pod: spec.securityContext.sysctls[\"kernel.msgmax\"] is not allowed under {level}",
            )],
        );
    }

    #[test]
    fn restricted_volumes() {
        catches(
            "restrictedVolumes",
            &[(
                |p| {
                    volume(
                        p,
                        Volume {
                            name: "share".into(),
                            nfs: Some(NFSVolumeSource {
                                server: "nfs".into(),
                                path: "/".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    )
                },
                "pod: spec.volumes[\"share\"].nfs is not allowed under {level}",
            )],
        );
    }

    #[test]
    fn allow_privilege_escalation() {
        catches(
            "allowPrivilegeEscalation",
            &[
                (
                    |p| sc(p).allow_privilege_escalation = Some(true),
                    "container \"runtime\": securityContext.allowPrivilegeEscalation=true is not allowed under {level}",
                ),
                (
                    |p| sc(p).allow_privilege_escalation = None,
                    "container \"runtime\": securityContext.allowPrivilegeEscalation must be false under {level}",
                ),
            ],
        );
    }

    #[test]
    fn run_as_non_root() {
        catches(
            "runAsNonRoot",
            &[
                (
                    |p| sc(p).run_as_non_root = Some(false),
                    "container \"runtime\": securityContext.runAsNonRoot=false is not allowed under {level}",
                ),
                (
                    |p| sc(p).run_as_non_root = None,
                    "container \"runtime\": securityContext.runAsNonRoot must be true (here or in spec.securityContext) under {level}",
                ),
                (
                    |p| pod_sc(p).run_as_non_root = Some(false),
                    "pod: spec.securityContext.runAsNonRoot=false is not allowed under {level}",
                ),
            ],
        );
        // Set once for the pod, the containers may leave it unset.
        let mut p = base();
        sc(&mut p).run_as_non_root = None;
        pod_sc(&mut p).run_as_non_root = Some(true);
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn run_as_user() {
        catches(
            "runAsUser",
            &[
                (
                    |p| sc(p).run_as_user = Some(0),
                    "container \"runtime\": securityContext.runAsUser=0 is not allowed under {level}",
                ),
                (
                    |p| pod_sc(p).run_as_user = Some(0),
                    "pod: spec.securityContext.runAsUser=0 is not allowed under {level}",
                ),
            ],
        );
    }

    #[test]
    fn seccomp_restricted() {
        catches(
            "seccompProfile_restricted",
            &[(
                |p| {
                    pod_sc(p).seccomp_profile = None;
                    sc(p).seccomp_profile = None;
                },
                "container \"runtime\": securityContext.seccompProfile.type must be RuntimeDefault or Localhost (here or in spec.securityContext) under {level}",
            )],
        );
        // A container's own profile stands for the pod's.
        let mut p = base();
        pod_sc(&mut p).seccomp_profile = None;
        for c in &mut spec(&mut p).containers {
            c.security_context.as_mut().unwrap().seccomp_profile = Some(profile("Localhost"));
        }
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn capabilities_restricted() {
        catches(
            "capabilities_restricted",
            &[
                (
                    |p| caps(sc(p)).drop = Some(vec!["NET_RAW".into()]),
                    "container \"runtime\": securityContext.capabilities.drop must include ALL under {level}",
                ),
                (
                    |p| sc(p).capabilities = None,
                    "container \"runtime\": securityContext.capabilities.drop must include ALL under {level}",
                ),
                (
                    // In baseline's set, not in restricted's.
                    |p| caps(sc(p)).add = Some(vec!["CHOWN".into()]),
                    "container \"runtime\": securityContext.capabilities.add=[CHOWN] is not allowed under {level}",
                ),
            ],
        );
        let mut p = base();
        caps(sc(&mut p)).add = Some(vec!["NET_BIND_SERVICE".into()]);
        assert_eq!(check(Level::Restricted, &p), Ok(()));
    }

    #[test]
    fn a_partial_template_is_merged_over_the_restricted_defaults() {
        let template = SecurityContext {
            run_as_user: Some(1000),
            ..Default::default()
        };
        let merged = merge_defaults(Level::Restricted, Some(template.clone()));
        assert_eq!(
            merged,
            SecurityContext {
                run_as_user: Some(1000),
                ..common::restricted_security()
            }
        );
        assert_eq!(merged.run_as_non_root, Some(true));
        assert_eq!(merged.allow_privilege_escalation, Some(false));
        assert_eq!(
            merged.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        assert_eq!(merged.seccomp_profile, Some(profile("RuntimeDefault")));
        let mut p = base();
        *sc(&mut p) = merged;
        assert_eq!(check(Level::Restricted, &p), Ok(()));

        // Inside capabilities too: an added NET_BIND_SERVICE keeps the drop of ALL.
        let merged = merge_defaults(
            Level::Restricted,
            Some(SecurityContext {
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_BIND_SERVICE".into()]),
                    drop: None,
                }),
                ..Default::default()
            }),
        );
        let c = merged.capabilities.unwrap();
        assert_eq!(c.add.unwrap(), ["NET_BIND_SERVICE"]);
        assert_eq!(c.drop.unwrap(), ["ALL"]);

        // What the template sets, it keeps, even against the level: the check refuses.
        let merged = merge_defaults(
            Level::Restricted,
            Some(SecurityContext {
                privileged: Some(true),
                run_as_user: Some(0),
                ..Default::default()
            }),
        );
        assert_eq!(
            (merged.privileged, merged.run_as_user),
            (Some(true), Some(0))
        );
        let mut p = base();
        *sc(&mut p) = merged;
        assert_eq!(
            check(Level::Restricted, &p).unwrap_err().to_string(),
            "container \"runtime\": securityContext.privileged=true is not allowed under restricted"
        );
    }

    #[test]
    fn without_a_template_the_defaults_and_below_restricted_the_template_as_written() {
        for level in Level::ALL {
            assert_eq!(merge_defaults(level, None), common::restricted_security());
        }
        let root = SecurityContext {
            run_as_user: Some(0),
            ..Default::default()
        };
        for level in [Level::Baseline, Level::Privileged] {
            assert_eq!(merge_defaults(level, Some(root.clone())), root, "{level}");
        }
        // Root, as written, is baseline.
        let mut p = base();
        *sc(&mut p) = root;
        assert_eq!(check(Level::Baseline, &p), Ok(()));
    }
}
