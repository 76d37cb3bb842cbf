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

use k8s_openapi::api::core::v1::{Capabilities, Pod, PodSpec, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use crate::crd::PodSecurityLevel as Level;

use super::common;

mod checks;

use checks::*;

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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        AppArmorProfile, ContainerPort, PodSecurityContext, SELinuxOptions, SeccompProfile,
        WindowsSecurityContextOptions,
    };
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
