//! Runtime: a template; valid when it has an image. Counts the Agents that use it.

use std::sync::Arc;

use kube::ResourceExt;

use super::common;
use super::{Context, Outcome};
use crate::Error;
use crate::crd::{Runtime, RuntimePhase, RuntimeStatus};

pub fn validate(rt: &Runtime) -> Result<(), String> {
    match rt.spec.image.as_deref().map(str::trim) {
        None | Some("") => Err("spec.image is not set".into()),
        Some(_) => Ok(()),
    }
}

pub async fn reconcile(ctx: &Context, rt: Arc<Runtime>) -> Result<Outcome, Error> {
    let ns = rt.namespace().unwrap_or_default();
    let name = rt.name_any();
    let (phase, message) = match validate(&rt) {
        Ok(()) => (RuntimePhase::Ready, "valid".to_owned()),
        Err(why) => (RuntimePhase::Invalid, why),
    };
    let agents = ctx
        .agents
        .in_namespace(&ns)
        .iter()
        .filter(|a| a.spec.runtime.reference.as_deref() == Some(name.as_str()))
        .count() as i64;
    let old = rt.status.clone().unwrap_or_default();
    let status = RuntimeStatus {
        observed_generation: rt.metadata.generation,
        phase: Some(phase),
        message: Some(message.clone()),
        conditions: common::ready_condition(
            &old.conditions,
            phase == RuntimePhase::Ready,
            &format!("{phase:?}"),
            &message,
            rt.metadata.generation,
        ),
        agents: Some(agents),
    };
    ctx.write_status(&*rt, rt.status.as_ref(), &status).await?;
    Ok(Outcome::default())
}
