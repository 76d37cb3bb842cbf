//! `control` frames: restart, pause, resume, delete of Agents and Tools (PROTOCOL.md §3).
//! Anything else, or a target outside what the manager reconciles, is refused.

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::connect::frame::{Control, ControlAction};
use crate::crd::{Agent, Kind, Tool};
use crate::reconcile::{Context, common, tool};

/// Carries out `c`. `Ok` says what was done; `Err` why it was refused or failed.
pub async fn execute(ctx: &Context, c: &Control) -> Result<String, String> {
    let t = &c.target;
    let kind = match Kind::parse(&t.kind) {
        Some(k @ (Kind::Agent | Kind::Tool)) => k,
        _ => {
            return Err(format!(
                "kind {:?} cannot be controlled (Agent or Tool only)",
                t.kind
            ));
        }
    };
    if !ctx.config.watches(&t.namespace) {
        return Err(format!(
            "namespace {:?} is not watched by this manager",
            t.namespace
        ));
    }
    let (uid, pod_name) = match kind {
        Kind::Agent => {
            let a = ctx.agents.get(&t.namespace, &t.name);
            (a.and_then(|a| a.metadata.uid.clone()), t.name.clone())
        }
        _ => {
            let tl = ctx.tools.get(&t.namespace, &t.name);
            (
                tl.and_then(|t| t.metadata.uid.clone()),
                tool::pod_name(&t.name),
            )
        }
    };
    let Some(uid) = uid else {
        return Err(format!("{kind} {}/{} not found", t.namespace, t.name));
    };
    let failed = |e: kube::Error| format!("{kind} {}/{}: {e}", t.namespace, t.name);
    match c.action {
        ControlAction::Restart => {
            let pod = ctx
                .pods
                .get(&t.namespace, &pod_name)
                .filter(|p| common::is_owned_by(&p.metadata, Some(&uid)))
                .ok_or_else(|| {
                    format!("{kind} {}/{} has no pod to restart", t.namespace, t.name)
                })?;
            ctx.delete_pod(&pod).await.map_err(|e| e.to_string())?;
            Ok(format!("pod {pod_name} deleted; it is recreated"))
        }
        ControlAction::Pause | ControlAction::Resume => {
            let on = c.action == ControlAction::Pause;
            let field = if kind == Kind::Agent {
                "paused"
            } else {
                "disabled"
            };
            let patch = Patch::Merge(json!({"spec": {field: on}}));
            let pp = PatchParams::default();
            match kind {
                Kind::Agent => Api::<Agent>::namespaced(ctx.client.clone(), &t.namespace)
                    .patch(&t.name, &pp, &patch)
                    .await
                    .map(drop),
                _ => Api::<Tool>::namespaced(ctx.client.clone(), &t.namespace)
                    .patch(&t.name, &pp, &patch)
                    .await
                    .map(drop),
            }
            .map_err(failed)?;
            Ok(format!("spec.{field} set to {on}"))
        }
        ControlAction::Delete => {
            let dp = DeleteParams::background();
            match kind {
                Kind::Agent => Api::<Agent>::namespaced(ctx.client.clone(), &t.namespace)
                    .delete(&t.name, &dp)
                    .await
                    .map(drop),
                _ => Api::<Tool>::namespaced(ctx.client.clone(), &t.namespace)
                    .delete(&t.name, &dp)
                    .await
                    .map(drop),
            }
            .map_err(failed)?;
            Ok(format!("{kind} deleted"))
        }
    }
}
