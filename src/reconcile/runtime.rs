//! Runtime: a template; valid when it has an image. Counts the Agents that use it.

use std::sync::Arc;

use kube::ResourceExt;

use super::common;
use super::problem::Problem;
use super::{Context, Outcome};
use crate::Error;
use crate::crd::{Reason, Runtime, RuntimePhase, RuntimeStatus};

pub fn validate(rt: &Runtime) -> Result<(), Problem> {
    match rt.spec.image.as_deref().map(str::trim) {
        None | Some("") => Err(Problem::NoImage),
        Some(_) => Ok(()),
    }
}

pub async fn reconcile(ctx: &Context, rt: Arc<Runtime>) -> Result<Outcome, Error> {
    let ns = rt.namespace().unwrap_or_default();
    let name = rt.name_any();
    let (phase, reason, message) = match validate(&rt) {
        Ok(()) => (RuntimePhase::Ready, Reason::Valid, "valid".to_owned()),
        Err(why) => (RuntimePhase::Invalid, why.reason(), why.to_string()),
    };
    let agents = ctx
        .store
        .agents_where(&ns, |a| {
            a.spec.runtime.reference.as_deref() == Some(name.as_str())
        })
        .len() as i64;
    let own = RuntimeStatus {
        agents: Some(agents),
        ..Default::default()
    };
    let status = common::status(
        &rt.metadata,
        rt.status.as_ref(),
        phase,
        reason,
        message,
        own,
    );
    ctx.kube
        .write_status(&*rt, rt.status.as_ref(), &status)
        .await?;
    Ok(Outcome::default())
}
