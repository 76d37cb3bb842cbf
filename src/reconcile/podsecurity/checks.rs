//! The checks of the Pod Security Standards, one function per control, and the lists
//! they allow (capabilities, sysctls, SELinux types, volume types, profiles).

use k8s_openapi::api::core::v1::{
    AppArmorProfile, ContainerPort, PodSecurityContext, PodSpec, SELinuxOptions, SeccompProfile,
    SecurityContext, WindowsSecurityContextOptions,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Finding, Place, at_pod};

/// Capabilities `baseline` lets a container add (the container runtimes' defaults).
pub(super) const BASELINE_CAPABILITIES: &[&str] = &[
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
pub(super) const RESTRICTED_CAPABILITIES: &[&str] = &["NET_BIND_SERVICE"];

/// The sysctls `baseline` allows: namespaced, and isolated from other pods.
pub(super) const SAFE_SYSCTLS: &[&str] = &[
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
pub(super) const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The volume sources `restricted` allows, as the API spells them: any other, including
/// one a later Kubernetes adds, is refused.
pub(super) const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

pub(super) const APPARMOR_ANNOTATION: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The profile types that confine, seccomp's and AppArmor's alike (`restricted` asks for
/// one of them for seccomp; `baseline` allows no other for AppArmor).
pub(super) const CONFINED: &[&str] = &["RuntimeDefault", "Localhost"];

/// One container of any kind, as the rules read it.
pub(super) struct ContainerView<'a> {
    name: &'a str,
    sc: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
}

/// Every container of the pod: init containers, containers, ephemeral containers.
pub(super) fn containers(spec: &PodSpec) -> Vec<ContainerView<'_>> {
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
pub(super) fn in_containers(
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
pub(super) fn in_container_sc(
    spec: &PodSpec,
    bad: impl Fn(&SecurityContext) -> Option<String>,
) -> Option<Finding> {
    in_containers(spec, |c| c.sc.and_then(&bad).map(|f| (f, None)))
}

pub(super) fn pod_sc(spec: &PodSpec) -> Option<&PodSecurityContext> {
    spec.security_context.as_ref()
}

pub(super) fn host_process(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn host_namespaces(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    [
        (spec.host_network, "spec.hostNetwork=true"),
        (spec.host_pid, "spec.hostPID=true"),
        (spec.host_ipc, "spec.hostIPC=true"),
    ]
    .into_iter()
    .find(|(on, _)| *on == Some(true))
    .map(|(_, field)| at_pod(field))
}

pub(super) fn privileged(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_container_sc(spec, |sc| {
        (sc.privileged == Some(true)).then(|| "securityContext.privileged=true".to_owned())
    })
}

/// `securityContext.capabilities.add=[X, Y]`: the added capabilities not in `allowed`.
pub(super) fn added_beyond(sc: &SecurityContext, allowed: &[&str]) -> Option<String> {
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

pub(super) fn capabilities_baseline(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_container_sc(spec, |sc| added_beyond(sc, BASELINE_CAPABILITIES))
}

pub(super) fn host_path_volumes(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.is_some())
        .map(|v| at_pod(format!("spec.volumes[{:?}].hostPath", v.name)))
}

pub(super) fn host_ports(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_containers(spec, |c| {
        c.ports.iter().enumerate().find_map(|(i, p)| {
            p.host_port
                .filter(|hp| *hp != 0)
                .map(|hp| (format!("ports[{i}].hostPort={hp}"), None))
        })
    })
}

pub(super) fn app_armor(meta: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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
pub(super) fn se_linux_wrong(o: &SELinuxOptions) -> Option<String> {
    let set = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
    if let Some(t) = set(&o.type_).filter(|t| !SELINUX_TYPES.contains(&t.as_str())) {
        return Some(format!("seLinuxOptions.type={t}"));
    }
    if let Some(u) = set(&o.user) {
        return Some(format!("seLinuxOptions.user={u}"));
    }
    set(&o.role).map(|r| format!("seLinuxOptions.role={r}"))
}

pub(super) fn se_linux(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn proc_mount(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    in_container_sc(spec, |sc| {
        sc.proc_mount
            .as_deref()
            .filter(|m| *m != "Default")
            .map(|m| format!("securityContext.procMount={m}"))
    })
}

pub(super) fn seccomp_baseline(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn sysctls(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    pod_sc(spec)?
        .sysctls
        .iter()
        .flatten()
        .find(|s| !SAFE_SYSCTLS.contains(&s.name.as_str()))
        .map(|s| at_pod(format!("spec.securityContext.sysctls[{:?}]", s.name)))
}

pub(super) fn restricted_volumes(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn allow_privilege_escalation(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn run_as_non_root(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn run_as_user(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
    if pod_sc(spec).and_then(|s| s.run_as_user) == Some(0) {
        return Some(at_pod("spec.securityContext.runAsUser=0"));
    }
    in_container_sc(spec, |sc| {
        (sc.run_as_user == Some(0)).then(|| "securityContext.runAsUser=0".to_owned())
    })
}

pub(super) fn seccomp_restricted(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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

pub(super) fn capabilities_restricted(_: &ObjectMeta, spec: &PodSpec) -> Option<Finding> {
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
