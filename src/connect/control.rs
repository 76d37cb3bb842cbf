//! `control` frames: restart, pause, resume, delete of Agents and Tools (PROTOCOL.md §3).
//! Anything else, or a target outside what the manager reconciles, is refused.

use std::time::Duration;

use serde_json::json;

use super::Context;
use crate::audit::{AuditAction, AuditDetail, AuditEvent, AuditTarget, now_rfc3339};
use crate::crd::{Agent, Kind};
use crate::process::uuid_v4;
use crate::protocol::frame::{
    Control, ControlAction, ControlResult, Frame, IoClose, IoOpen, PartialIoOpen,
};

/// How long one `control` may wait for the API server before it is answered `ok: false`.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// The `control_result` error of a request the API server did not answer in time (the
/// action may or may not have been applied).
pub const TIMED_OUT: &str = "the API server did not answer in time";

/// Carries out `c`, logs and audits it (before anything is sent, so a failed send cannot
/// lose the record), and returns the `control_result` to send.
pub async fn answer(ctx: &Context, c: Control) -> Frame {
    // A stalled API server must not hold a request (and its slot) forever.
    let outcome = match tokio::time::timeout(CONTROL_TIMEOUT, execute(ctx, &c)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(TIMED_OUT.to_owned()),
    };
    let ok = outcome.is_ok();
    tracing::info!(id = %c.id, action = ?c.action, kind = %c.target.kind, namespace = %c.target.namespace, name = %c.target.name, ok, "control");
    ctx.link.audit.record(AuditEvent {
        id: uuid_v4(),
        time: now_rfc3339(),
        action: if ok {
            AuditAction::ControlDone
        } else {
            AuditAction::ControlDenied
        },
        actor: c.actor,
        session_id: None,
        target: AuditTarget {
            kind: c.target.kind,
            namespace: c.target.namespace,
            name: c.target.name,
            pod: None,
            container: None,
        },
        detail: AuditDetail {
            command: Some(vec![format!("{:?}", c.action).to_lowercase()]),
            reason: outcome.clone().err(),
            ..Default::default()
        },
    });
    Frame::ControlResult(ControlResult {
        id: c.id,
        ok,
        error: outcome.err(),
    })
}

/// Refuses a shell session: audits `session.denied` with `reason` and returns the
/// `io_close` (reason `denied`) to send.
pub fn deny_session(ctx: &Context, o: IoOpen, reason: &str) -> Frame {
    let target = AuditTarget {
        kind: "Agent".into(),
        namespace: o.target.namespace,
        name: o.target.agent,
        pod: None,
        container: Some(o.target.container),
    };
    deny(
        ctx,
        o.channel,
        o.actor,
        o.session_id,
        target,
        Some(o.command),
        reason,
    )
}

/// Refuses an `io_open` that failed to decode but names its channel, as
/// [`deny_session`] does (audited with what could be read of it).
pub fn deny_malformed_session(ctx: &Context, o: &PartialIoOpen, reason: &str) -> Frame {
    let target = AuditTarget {
        kind: "Agent".into(),
        namespace: o.namespace.clone(),
        name: o.agent.clone(),
        pod: None,
        container: Some(o.container.clone()),
    };
    let (actor, session_id) = (o.actor.clone(), o.session_id.clone());
    deny(ctx, o.channel, actor, session_id, target, None, reason)
}

fn deny(
    ctx: &Context,
    channel: u32,
    actor: String,
    session_id: String,
    target: AuditTarget,
    command: Option<Vec<String>>,
    reason: &str,
) -> Frame {
    ctx.link.audit.record(AuditEvent {
        id: uuid_v4(),
        time: now_rfc3339(),
        action: AuditAction::SessionDenied,
        actor,
        session_id: Some(session_id),
        target,
        detail: AuditDetail {
            command,
            reason: Some(reason.into()),
            ..Default::default()
        },
    });
    Frame::IoClose(IoClose {
        channel,
        exit_code: None,
        reason: Some("denied".into()),
    })
}

/// The admin's veto (TRUST.md §5): an action outside `AUTONOMIC_CONTROL_ACTIONS` is
/// refused before anything else is looked at, the rule named.
fn allowed(actions: &[&str], action: ControlAction) -> Result<(), String> {
    let name = action.wire_name();
    if actions.contains(&name) {
        return Ok(());
    }
    let list = match actions {
        [] => "none".to_owned(),
        some => some.join(","),
    };
    Err(format!(
        "action {name} is not allowed by the admin (AUTONOMIC_CONTROL_ACTIONS={list})"
    ))
}

/// Why `restart` cannot do what it says for this Agent, if it cannot: a finished Agent
/// (`Succeeded`/`Failed` under `restartPolicy` `OnFailure`/`Never`, for its current
/// generation) gets no new pod when its pod is deleted (the reconciler's own rule,
/// [`Agent::finished`]), so deleting it would only lose its logs. Refused instead, with
/// `ok: false`: the protocol's `control_result` has no other way to say "not done".
pub fn restart_refusal(a: &Agent) -> Option<String> {
    if !a.finished() {
        return None;
    }
    let phase = a
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .map_or_else(|| "finished".to_owned(), |p| format!("{p:?}"));
    Some(format!(
        "Agent {}/{} has finished ({phase}) with restartPolicy {}: it is not restarted until its spec changes",
        a.metadata.namespace.as_deref().unwrap_or_default(),
        a.metadata.name.as_deref().unwrap_or_default(),
        a.spec.restart_policy.as_str(),
    ))
}

/// Carries out `c`. `Ok` says what was done; `Err` why it was refused or failed.
pub async fn execute(ctx: &Context, c: &Control) -> Result<String, String> {
    allowed(&ctx.config.control_actions, c.action)?;
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
            let a = ctx.store.agents.get(&t.namespace, &t.name);
            (a.and_then(|a| a.metadata.uid.clone()), t.name.clone())
        }
        _ => {
            let tl = ctx.store.tools.get(&t.namespace, &t.name);
            (
                tl.and_then(|t| t.metadata.uid.clone()),
                crate::crd::tool_pod_name(&t.name),
            )
        }
    };
    let Some(uid) = uid else {
        return Err(format!("{kind} {}/{} not found", t.namespace, t.name));
    };
    match c.action {
        ControlAction::Restart => {
            if kind == Kind::Agent
                && let Some(a) = ctx.store.agents.get(&t.namespace, &t.name)
                && let Some(refusal) = restart_refusal(&a)
            {
                return Err(refusal);
            }
            let pod = ctx
                .store
                .owned_pod(&t.namespace, &pod_name, Some(&uid))
                .ok_or_else(|| {
                    format!("{kind} {}/{} has no pod to restart", t.namespace, t.name)
                })?;
            ctx.kube.delete_pod(&pod).await.map_err(|e| e.to_string())?;
            Ok(format!("pod {pod_name} deleted; it is recreated"))
        }
        ControlAction::Pause | ControlAction::Resume => {
            let on = c.action == ControlAction::Pause;
            let field = if kind == Kind::Agent {
                "paused"
            } else {
                "disabled"
            };
            ctx.kube
                .patch_spec(kind, &t.namespace, &t.name, json!({ field: on }))
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("spec.{field} set to {on}"))
        }
        ControlAction::Delete => {
            ctx.kube
                .delete_object(kind, &t.namespace, &t.name)
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!("{kind} deleted"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AgentPhase, AgentStatus, RestartPolicy};

    fn agent(policy: RestartPolicy, phase: Option<AgentPhase>, observed: i64) -> Agent {
        let mut a: Agent = serde_saphyr::from_str(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: triage, namespace: team-a}, spec: {runtime: {image: 'rt:1'}}}",
        )
        .unwrap();
        a.metadata.generation = Some(2);
        a.spec.restart_policy = policy;
        a.status = Some(AgentStatus {
            phase,
            observed_generation: Some(observed),
            ..Default::default()
        });
        a
    }

    /// TRUST.md §5: an action the admin left out is refused before anything is looked
    /// at (the test context's API server is never reached), answered `ok: false` and
    /// audited `control.denied`, the rule named.
    #[tokio::test]
    async fn an_action_the_admin_left_out_is_refused_and_audited() {
        let config = crate::config::Config::parse(|k| {
            (k == "AUTONOMIC_CONTROL_ACTIONS").then(|| "pause, resume".to_owned())
        })
        .unwrap();
        let ctx = crate::connect::test_context_with(config);
        let c: Control = serde_json::from_value(json!({
            "id": "c-1", "action": "delete", "actor": "ada",
            "target": {"kind": "Agent", "namespace": "team", "name": "triage"}
        }))
        .unwrap();
        let want =
            "action delete is not allowed by the admin (AUTONOMIC_CONTROL_ACTIONS=pause,resume)";
        let Frame::ControlResult(r) = answer(&ctx, c).await else {
            panic!("not a control_result");
        };
        assert_eq!(
            (r.id.as_str(), r.ok, r.error.as_deref()),
            ("c-1", false, Some(want))
        );
        let events = ctx.link.audit.drain();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].action, AuditAction::ControlDenied);
        assert_eq!(events[0].detail.reason.as_deref(), Some(want));
        assert_eq!(events[0].target.name, "triage");
        assert_eq!(
            allowed(&[], ControlAction::Pause).unwrap_err(),
            "action pause is not allowed by the admin (AUTONOMIC_CONTROL_ACTIONS=none)"
        );
        assert!(allowed(&crate::config::CONTROL_ACTIONS, ControlAction::Delete).is_ok());
    }

    #[test]
    fn restart_of_a_finished_agent_is_refused_truthfully() {
        use AgentPhase::*;
        use RestartPolicy::*;
        // (policy, phase, observed generation, refused): the reconciler's own rule, so the
        // answer says exactly whether a new pod follows.
        let cases = [
            (Never, Some(Succeeded), 2, true),
            (Never, Some(Failed), 2, true),
            (OnFailure, Some(Succeeded), 2, true),
            (OnFailure, Some(Failed), 2, true),
            // A spec change since the agent finished: the next pass starts it again.
            (Never, Some(Succeeded), 1, false),
            (Never, Some(Active), 2, false),
            (OnFailure, Some(Error), 2, false),
            (Always, Some(Active), 2, false),
            (Always, Some(Pending), 2, false),
            (Never, None, 2, false),
        ];
        for (policy, phase, observed, refused) in cases {
            let a = agent(policy, phase, observed);
            let answer = restart_refusal(&a);
            assert_eq!(answer.is_some(), refused, "{policy:?} {phase:?} {observed}");
            if let Some(why) = answer {
                let phase = format!("{:?}", phase.unwrap());
                assert!(
                    why.contains(&phase) && why.contains(policy.as_str()),
                    "{why}"
                );
                assert!(
                    why.contains("not restarted until its spec changes"),
                    "{why}"
                );
                assert!(!why.contains("recreated"), "{why}");
            }
        }
    }
}
