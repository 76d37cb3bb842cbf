//! Tool → pod `<tool>-tool` and Service `<tool>`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodSpec, Probe, Service, ServicePort, ServiceSpec,
    TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::common::{self, Health};
use super::{Context, Outcome};
use crate::Error;
use crate::crd::{Kind, Tool, ToolPhase, ToolStatus};

pub fn pod_name(tool: &str) -> String {
    format!("{tool}-tool")
}

/// `http://<tool>.<namespace>.svc:<port>`.
pub fn endpoint(tool: &Tool) -> String {
    format!(
        "http://{}.{}.svc:{}",
        tool.name_any(),
        tool.namespace().unwrap_or_default(),
        tool.spec.port
    )
}

/// What a schema cannot check: the name must serve as a Service name (DNS-1035 label).
pub fn validate(tool: &Tool) -> Result<(), String> {
    let name = tool.name_any();
    let dns1035 = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !dns1035 {
        return Err(format!(
            "name {name:?} cannot name a Service: use at most 63 lowercase letters, digits and '-', starting with a letter"
        ));
    }
    if tool.spec.image.trim().is_empty() {
        return Err("spec.image is empty".into());
    }
    if !(1..=65535).contains(&tool.spec.port) {
        return Err(format!("spec.port {} is not in 1..65535", tool.spec.port));
    }
    Ok(())
}

fn selector(tool: &str) -> BTreeMap<String, String> {
    common::labels(Kind::Tool, tool)
}

pub fn desired_pod(tool: &Tool) -> Pod {
    let name = tool.name_any();
    let port = tool.spec.port;
    let spec = PodSpec {
        containers: vec![Container {
            name: "tool".into(),
            image: Some(tool.spec.image.clone()),
            command: tool.spec.command.clone(),
            args: tool.spec.args.clone(),
            env: tool.spec.env.clone(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: port,
                ..Default::default()
            }]),
            // Ready means the endpoint accepts connections, not merely that a process runs.
            readiness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(port),
                    ..Default::default()
                }),
                period_seconds: Some(2),
                ..Default::default()
            }),
            security_context: Some(common::restricted_security()),
            ..Default::default()
        }],
        security_context: Some(common::restricted_pod_security()),
        ..Default::default()
    };
    let mut meta = common::child_meta(tool, Kind::Tool, pod_name(&name));
    meta.annotations = Some(BTreeMap::from([(
        common::SPEC_HASH.to_owned(),
        common::spec_hash(&spec),
    )]));
    Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    }
}

pub fn desired_service(tool: &Tool) -> Service {
    let name = tool.name_any();
    Service {
        metadata: common::child_meta(tool, Kind::Tool, name.clone()),
        spec: Some(ServiceSpec {
            selector: Some(selector(&name)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: tool.spec.port,
                target_port: Some(IntOrString::Int(tool.spec.port)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

pub async fn reconcile(ctx: &Context, tool: Arc<Tool>) -> Result<Outcome, Error> {
    let ns = tool.namespace().unwrap_or_default();
    let name = tool.name_any();
    let uid = tool.uid();
    let current = ctx
        .pods
        .get(&ns, &pod_name(&name))
        .filter(|p| common::is_owned_by(&p.metadata, uid.as_deref()));
    let mut requeue = None;
    let (phase, message) = if tool.metadata.deletion_timestamp.is_some() {
        (ToolPhase::Pending, "deletion requested".to_owned())
    } else if let Err(why) = validate(&tool) {
        (ToolPhase::Error, why)
    } else if let Err(why) = ctx
        .apply(
            &ns,
            &desired_service(&tool),
            ctx.services.get(&ns, &tool.name_any()).as_deref(),
        )
        .await?
    {
        (ToolPhase::Error, why)
    } else {
        let desired = desired_pod(&tool);
        match current.as_deref() {
            Some(pod) if tool.spec.disabled => {
                if pod.metadata.deletion_timestamp.is_none() {
                    ctx.delete_pod(pod).await?;
                }
                (ToolPhase::Disabled, "disabled".to_owned())
            }
            None if tool.spec.disabled => (ToolPhase::Disabled, "disabled".to_owned()),
            None => match ctx.create_pod(&desired).await? {
                Ok(()) => (ToolPhase::Pending, "creating pod".to_owned()),
                Err(e) => {
                    requeue = Some(Duration::from_secs(60));
                    (ToolPhase::Error, e)
                }
            },
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => (
                ToolPhase::Pending,
                "waiting for the previous pod to terminate".to_owned(),
            ),
            Some(pod)
                if common::pod_spec_hash(&pod.metadata)
                    != common::pod_spec_hash(&desired.metadata) =>
            {
                ctx.delete_pod(pod).await?;
                (
                    ToolPhase::Pending,
                    "spec changed: recreating pod".to_owned(),
                )
            }
            Some(pod) => match common::pod_health(pod) {
                Health::Ready => (ToolPhase::Ready, format!("serving at {}", endpoint(&tool))),
                Health::Pending(m) => (ToolPhase::Pending, m),
                Health::Error(m) => (ToolPhase::Error, m),
                // A tool is a server: if it ends, it is replaced.
                Health::Succeeded | Health::Failed(_) => {
                    ctx.delete_pod(pod).await?;
                    (ToolPhase::Pending, "pod ended: replacing it".to_owned())
                }
            },
        }
    };
    let old = tool.status.clone().unwrap_or_default();
    let valid = phase != ToolPhase::Error || current.is_some();
    let status = ToolStatus {
        observed_generation: tool.metadata.generation,
        phase: Some(phase),
        message: Some(message.clone()),
        conditions: common::ready_condition(
            &old.conditions,
            phase == ToolPhase::Ready,
            &format!("{phase:?}"),
            &message,
            tool.metadata.generation,
        ),
        pod_name: current
            .filter(|_| phase != ToolPhase::Disabled)
            .map(|_| pod_name(&name)),
        endpoint: valid.then(|| endpoint(&tool)),
    };
    ctx.write_status(&*tool, tool.status.as_ref(), &status)
        .await?;
    Ok(Outcome { requeue })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, port: i32) -> Tool {
        let mut t: Tool = serde_saphyr::from_str(&format!(
            "{{apiVersion: autonomic.sh/v1alpha1, kind: Tool, metadata: {{name: '{name}', namespace: team-a}}, spec: {{image: 'srv:1', port: {port}}}}}"
        ))
        .unwrap();
        t.metadata.uid = Some("u".into());
        t
    }

    #[test]
    fn endpoint_service_and_pod() {
        let t = tool("search", 9000);
        assert_eq!(endpoint(&t), "http://search.team-a.svc:9000");
        let svc = desired_service(&t);
        assert_eq!(svc.metadata.name.as_deref(), Some("search"));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.ports.unwrap()[0].port, 9000);
        let pod = desired_pod(&t);
        assert_eq!(pod.metadata.name.as_deref(), Some("search-tool"));
        // The Service selects exactly the tool's pod.
        let pod_labels = pod.metadata.labels.unwrap();
        for (k, v) in spec.selector.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
    }

    #[test]
    fn names_that_cannot_be_services_are_refused() {
        for bad in ["1st", "a.b", "Upper", &"x".repeat(64), "trailing-"] {
            assert!(validate(&tool(bad, 80)).is_err(), "{bad}");
        }
        assert!(validate(&tool(&"x".repeat(63), 80)).is_ok());
        assert!(validate(&tool("ok", 0)).unwrap_err().contains("port"));
    }
}
