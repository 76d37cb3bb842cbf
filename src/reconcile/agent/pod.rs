//! The pod an Agent should have (`agentlet` + `runtime`) and its Secret `<agent>-agent`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements,
    Secret, SecretVolumeSource, Volume, VolumeMount,
};
use kube::ResourceExt;
use serde_json::json;

use super::Refs;
use crate::crd::{Agent, Kind, Runtime, RuntimeSpec};
use crate::reconcile::common;
use crate::reconcile::podsecurity::{self, Level};
use crate::reconcile::problem::Problem;

pub const CONFIG_MOUNT: &str = "/var/run/autonomic";

pub fn secret_name(agent: &str) -> String {
    format!("{agent}-agent")
}

/// The manager's defaults for the agentlet sidecar (`AUTONOMIC_AGENTLET_*`).
pub struct AgentletDefaults<'a> {
    pub image: Option<&'a str>,
    pub resources: &'a ResourceRequirements,
}

/// The pod the Agent should have in a namespace of level `level`, with its spec hash
/// annotation, or why it cannot have one: among the reasons, a template that breaks the
/// level (TRUST.md §1), which no pod is created for.
pub fn admitted_pod(
    agent: &Agent,
    runtime: Option<&Runtime>,
    agentlet: &AgentletDefaults,
    level: Level,
) -> Result<Pod, Problem> {
    let pod = build(agent, runtime, agentlet, level)?;
    podsecurity::check(level, &pod)?;
    Ok(pod)
}

/// The pod the Agent would have at the default level (`restricted`), not checked
/// against it: what [`admitted_pod`] builds there before its check (the tests that
/// submit the manager's pods to a real admission controller build them here).
pub fn desired_pod(
    agent: &Agent,
    runtime: Option<&Runtime>,
    agentlet: &AgentletDefaults,
) -> Result<Pod, Problem> {
    build(agent, runtime, agentlet, Level::Restricted)
}

/// The pod [`admitted_pod`] checks: the agentlet and the runtime over the config
/// Secret's volume, the runtime's securityContext merged for `level`, the spec hash
/// taken before that merge.
fn build(
    agent: &Agent,
    runtime: Option<&Runtime>,
    agentlet: &AgentletDefaults,
    level: Level,
) -> Result<Pod, Problem> {
    let name = agent.name_any();
    let spec = &agent.spec;
    let tpl = runtime.map(|r| &r.spec);
    let mount = VolumeMount {
        name: "autonomic-config".into(),
        mount_path: CONFIG_MOUNT.into(),
        read_only: Some(true),
        ..Default::default()
    };
    let runtime_container = runtime_container(agent, tpl, mount.clone())?;
    let agentlet = agentlet_container(agent, agentlet, mount)?;
    let mut pod_spec = PodSpec {
        containers: vec![agentlet, runtime_container],
        restart_policy: Some(spec.restart_policy.as_str().into()),
        service_account_name: spec.service_account_name.as_deref().map(str::to_owned),
        security_context: Some(common::restricted_pod_security()),
        volumes: Some(vec![Volume {
            name: "autonomic-config".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(&name)),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    // The hash is of the template's securityContext as written (the defaults without
    // one), not of what the level merges in: a namespace's level changing makes no pod
    // look changed. The level decides what a pod may be when one is made; a running pod
    // stays until the Agent's spec changes (`docs/design.md`, "What a tenant gets through the manager").
    let written = tpl.and_then(|t| t.security_context.clone());
    let runtime_at = 1; // [agentlet, runtime]
    pod_spec.containers[runtime_at].security_context =
        Some(written.clone().unwrap_or_else(common::restricted_security));
    let hash = common::spec_hash(&pod_spec);
    pod_spec.containers[runtime_at].security_context =
        Some(podsecurity::merge_defaults(level, written));
    let mut meta = common::child_meta(agent, Kind::Agent, name);
    meta.annotations = Some(BTreeMap::from([(common::SPEC_HASH.to_owned(), hash)]));
    Ok(Pod {
        metadata: meta,
        spec: Some(pod_spec),
        status: None,
    })
}

/// The `runtime` container: each field the Agent's own, else its Runtime template's
/// (`tpl`); its securityContext is set by [`build`].
fn runtime_container(
    agent: &Agent,
    tpl: Option<&RuntimeSpec>,
    mount: VolumeMount,
) -> Result<Container, Problem> {
    let spec = &agent.spec;
    let image = spec
        .runtime
        .image
        .as_deref()
        .or_else(|| tpl.and_then(|t| t.image.as_deref()))
        .map(str::to_owned)
        .filter(|i| !i.trim().is_empty())
        .ok_or(Problem::NoRuntimeImage)?;
    // The override replaces the template's entry of the same name; order is kept.
    let mut env: Vec<EnvVar> = tpl.and_then(|t| t.env.clone()).unwrap_or_default();
    for e in spec.runtime.env.as_deref().unwrap_or_default() {
        match env.iter_mut().find(|x| x.name == e.name) {
            Some(x) => *x = e.clone(),
            None => env.push(e.clone()),
        }
    }
    Ok(Container {
        name: "runtime".into(),
        image: Some(image),
        command: spec
            .runtime
            .command
            .as_deref()
            .map(<[String]>::to_vec)
            .or_else(|| tpl.and_then(|t| t.command.clone())),
        args: spec
            .runtime
            .args
            .as_deref()
            .map(<[String]>::to_vec)
            .or_else(|| tpl.and_then(|t| t.args.clone())),
        env: (!env.is_empty()).then_some(env),
        resources: (spec.runtime.resources.as_deref().cloned())
            .or_else(|| tpl.and_then(|t| t.resources.clone())),
        volume_mounts: Some(vec![mount]),
        // Set by `build`: merged over the restricted defaults under `restricted`.
        security_context: None,
        ..Default::default()
    })
}

/// The `agentlet` sidecar: the Agent's image, else the manager's default; told its
/// Agent's name and its pod's.
fn agentlet_container(
    agent: &Agent,
    defaults: &AgentletDefaults,
    mount: VolumeMount,
) -> Result<Container, Problem> {
    let image = agent
        .spec
        .agentlet
        .image
        .as_deref()
        .or(defaults.image)
        .map(str::to_owned)
        .filter(|i| !i.trim().is_empty())
        .ok_or(Problem::NoAgentletImage)?;
    let field_env = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Container {
        name: "agentlet".into(),
        image: Some(image),
        env: Some(vec![
            EnvVar {
                name: "AUTONOMIC_AGENT".into(),
                value: Some(agent.name_any()),
                ..Default::default()
            },
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        volume_mounts: Some(vec![mount]),
        resources: Some(defaults.resources.clone()),
        security_context: Some(common::restricted_security()),
        ..Default::default()
    })
}

/// The Secret `<agent>-agent` with `config.json`: tools' endpoints, memory Secrets.
pub fn desired_secret(agent: &Agent, refs: &Refs) -> Secret {
    let tools: Vec<_> = refs
        .tools
        .iter()
        .map(|t| json!({"name": t.name_any(), "endpoint": crate::reconcile::tool::endpoint(t)}))
        .collect();
    let memory: Vec<_> = refs
        .memories
        .iter()
        .map(|m| {
            json!({"name": m.name_any(), "backend": m.spec.backend,
                   "secretName": crate::reconcile::memory::secret_name(&m.name_any())})
        })
        .collect();
    let config = json!({
        "agent": agent.name_any(),
        "namespace": agent.namespace(),
        "tools": tools,
        "memory": memory,
    });
    let body = serde_json::to_vec_pretty(&config).unwrap_or_default();
    Secret {
        metadata: common::child_meta(agent, Kind::Agent, secret_name(&agent.name_any())),
        data: Some(BTreeMap::from([(
            "config.json".to_owned(),
            ByteString(body),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Reason;
    use crate::reconcile::agent::tests::{BASE, agent, al};
    use k8s_openapi::api::core::v1::SecurityContext;

    #[test]
    fn pod_has_both_containers_labels_owner_and_config_mount() {
        let a = agent(BASE);
        let p = desired_pod(&a, None, &al(Some("agentlet:1"))).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("triage"));
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "autonomic");
        assert_eq!(labels["autonomic.sh/agent"], "triage");
        assert!(crate::store::is_owned_by(&p.metadata, Some("uid-a")));
        let spec = p.spec.unwrap();
        let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["agentlet", "runtime"]);
        for c in &spec.containers {
            let m = &c.volume_mounts.as_ref().unwrap()[0];
            assert_eq!(
                (m.mount_path.as_str(), m.read_only),
                (CONFIG_MOUNT, Some(true))
            );
        }
        assert_eq!(
            spec.volumes.unwrap()[0]
                .secret
                .as_ref()
                .unwrap()
                .secret_name
                .as_deref(),
            Some("triage-agent")
        );
    }

    #[test]
    fn containers_are_restricted_without_a_template() {
        let a = agent(BASE);
        let p = desired_pod(&a, None, &al(Some("agentlet:1"))).unwrap();
        for c in p.spec.as_ref().unwrap().containers.iter() {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            assert_eq!(sc.run_as_user, Some(65532), "{}", c.name);
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            let drop = sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap();
            assert_eq!(drop, &["ALL"], "{}", c.name);
            assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        }
        // The agentlet has requests and a memory limit.
        let agentlet = &p.spec.as_ref().unwrap().containers[0];
        let r = agentlet.resources.as_ref().unwrap();
        assert!(r.requests.as_ref().unwrap().contains_key("memory"));
        assert!(r.limits.as_ref().unwrap().contains_key("memory"));
        // The pod passes every level, the same at each (no roll when a level changes).
        for level in Level::ALL {
            let at = admitted_pod(&a, None, &al(Some("agentlet:1")), level).unwrap();
            assert_eq!(at, p, "{level}");
        }
    }

    fn runtime(security_context: &str) -> Runtime {
        serde_saphyr::from_str(&format!(
            "{{apiVersion: autonomic.sh/v1alpha1, kind: Runtime, metadata: {{name: rt}}, spec: {{image: 'legacy:1', securityContext: {security_context}}}}}"
        ))
        .unwrap()
    }

    fn using_rt() -> Agent {
        agent(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: x, namespace: n}, spec: {runtime: {ref: rt}}}",
        )
    }

    /// The runtime container's and the agentlet's securityContext.
    fn contexts(p: &Pod) -> (SecurityContext, SecurityContext) {
        let spec = p.spec.as_ref().unwrap();
        let sc = |i: usize| spec.containers[i].security_context.clone().unwrap();
        (sc(1), sc(0))
    }

    #[test]
    fn a_template_is_merged_over_the_restricted_defaults() {
        let rt = runtime("{runAsUser: 1000}");
        let p = admitted_pod(&using_rt(), Some(&rt), &al(Some("al")), Level::Restricted).unwrap();
        let (runtime, agentlet) = contexts(&p);
        assert_eq!(
            runtime,
            SecurityContext {
                run_as_user: Some(1000),
                ..common::restricted_security()
            }
        );
        assert_eq!(agentlet, common::restricted_security());
    }

    #[test]
    fn a_template_that_breaks_the_level_gets_no_pod() {
        let agent = using_rt();
        let build =
            |sc: &str, level| admitted_pod(&agent, Some(&runtime(sc)), &al(Some("al")), level);
        let err = build("{privileged: true}", Level::Restricted).unwrap_err();
        assert_eq!(err.reason(), Reason::PodSecurityViolation);
        assert_eq!(
            err.to_string(),
            "container \"runtime\": securityContext.privileged=true is not allowed under restricted"
        );
        let err = build("{privileged: true}", Level::Baseline).unwrap_err();
        assert!(err.to_string().ends_with("under baseline"), "{err}");
        assert!(build("{privileged: true}", Level::Privileged).is_ok());
        // Root: refused under restricted; under baseline the template stands as written
        // (nothing forces runAsNonRoot on a container that asks for uid 0).
        let err = build("{runAsUser: 0}", Level::Restricted).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"runtime\": securityContext.runAsUser=0 is not allowed under restricted"
        );
        let (root, agentlet) = contexts(&build("{runAsUser: 0}", Level::Baseline).unwrap());
        assert_eq!((root.run_as_user, root.run_as_non_root), (Some(0), None));
        assert_eq!(agentlet, common::restricted_security());
        // Unset by the template, escalation is refused; set, it is kept and refused.
        let err = build("{allowPrivilegeEscalation: true}", Level::Restricted).unwrap_err();
        assert!(
            err.to_string().contains("allowPrivilegeEscalation=true"),
            "{err}"
        );
        let err = build("{capabilities: {add: [SYS_ADMIN]}}", Level::Baseline).unwrap_err();
        assert!(
            err.to_string().contains("capabilities.add=[SYS_ADMIN]"),
            "{err}"
        );
    }

    #[test]
    fn runtime_template_fills_and_overrides() {
        let rt: Runtime = serde_saphyr::from_str(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Runtime, metadata: {name: py}, spec: {image: 'py:3', args: [a], env: [{name: A, value: '1'}, {name: B, value: '2'}]}}",
        )
        .unwrap();
        let a = agent(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: x, namespace: n}, spec: {runtime: {ref: py, env: [{name: B, value: over}, {name: C, value: '3'}]}}}",
        );
        let p = desired_pod(&a, Some(&rt), &al(Some("al"))).unwrap();
        let c = &p.spec.unwrap().containers[1];
        assert_eq!(c.image.as_deref(), Some("py:3"));
        assert_eq!(c.args.as_deref(), Some(&["a".to_string()][..]));
        let env: Vec<_> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(env, [("A", "1"), ("B", "over"), ("C", "3")]);
        // The template's change changes the hash: its agents roll.
        let mut rt2 = rt.clone();
        rt2.spec.image = Some("py:4".into());
        let p2 = desired_pod(&a, Some(&rt2), &al(Some("al"))).unwrap();
        assert_ne!(
            common::pod_spec_hash(&p2.metadata),
            common::pod_spec_hash(
                &desired_pod(&a, Some(&rt), &al(Some("al")))
                    .unwrap()
                    .metadata
            )
        );
    }

    #[test]
    fn missing_images_are_named() {
        let a = agent(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: x, namespace: n}, spec: {}}",
        );
        let err = desired_pod(&a, None, &al(Some("al"))).unwrap_err();
        assert_eq!(err, Problem::NoRuntimeImage);
        assert!(err.to_string().contains("no runtime image"), "{err}");
        let a = agent(BASE);
        let err = desired_pod(&a, None, &al(None)).unwrap_err();
        assert_eq!(err.reason(), Reason::NoAgentletImage);
        assert!(err.to_string().contains("no agentlet image"), "{err}");
    }
}
