//! Who may open a shell where (PROTOCOL.md §6): a pure decision on the store's view.

use super::IoOpen;
use crate::config::Config;
use crate::crd::AgentPhase;
use crate::protocol::frame::IoTarget;
use crate::store::Store;
use crate::store::{SHELL_DISABLED, SHELL_LABEL};

/// The largest command a shell may run (TRUST.md §5): its arguments, and their bytes.
pub const MAX_COMMAND_ARGS: usize = 64;
pub const MAX_COMMAND_BYTES: usize = 16 * 1024;

/// The containers of an agent's pod a shell may open in.
pub const ALLOWED_CONTAINERS: [&str; 2] = ["runtime", "agentlet"];

/// The §6 rule: shells allowed by the admin (TRUST.md §5: `AUTONOMIC_SHELL_ENABLED`, and
/// no label `autonomic.sh/shell: disabled` on the namespace, whose labels must be known),
/// an Agent this manager reconciles, Active and not paused, its own pod running, and one
/// of its two containers. Returns the pod's name; a refusal names the rule.
pub fn authorize(
    store: &Store,
    config: &Config,
    o: &IoOpen,
    open: usize,
) -> Result<String, String> {
    allowed_request(config, o, open)?;
    allowed_namespace(store, config, &o.target.namespace)?;
    running_pod(store, &o.target)
}

/// Shells on, a session free, an allowed container and a command within bounds.
fn allowed_request(config: &Config, o: &IoOpen, open: usize) -> Result<(), String> {
    if !config.shell_enabled {
        return Err("shells are disabled by the admin (AUTONOMIC_SHELL_ENABLED=false)".into());
    }
    if open >= config.max_sessions {
        return Err(format!(
            "too many shell sessions: {} open, the limit is {} (AUTONOMIC_MAX_SESSIONS)",
            open, config.max_sessions
        ));
    }
    if !ALLOWED_CONTAINERS.contains(&o.target.container.as_str()) {
        return Err(format!(
            "container {:?} is not allowed (runtime or agentlet only)",
            o.target.container
        ));
    }
    if o.command.is_empty() || o.command.iter().any(|a| a.contains('\0')) {
        return Err("the command is empty or holds a NUL byte".into());
    }
    let bytes: usize = o.command.iter().map(String::len).sum();
    if o.command.len() > MAX_COMMAND_ARGS || bytes > MAX_COMMAND_BYTES {
        return Err(format!(
            "the command has {} arguments of {bytes} bytes: at most {MAX_COMMAND_ARGS} and {} KiB",
            o.command.len(),
            MAX_COMMAND_BYTES / 1024
        ));
    }
    Ok(())
}

/// A namespace this manager watches, whose labels are known and do not veto shells.
fn allowed_namespace(store: &Store, config: &Config, namespace: &str) -> Result<(), String> {
    if !config.watches(namespace) {
        return Err(format!(
            "namespace {namespace:?} is not watched by this manager"
        ));
    }
    // The admin's veto is the namespace's label: unknown labels refuse (fail closed).
    match store.namespaces.get("", namespace) {
        None => Err(format!(
            "the labels of namespace {namespace:?} are not known (not listed yet, or the manager may not read it): shells there are refused until they are"
        )),
        Some(n) if n.shell_disabled() => Err(format!(
            "shells are disabled in namespace {namespace:?} by the admin (label {SHELL_LABEL}={SHELL_DISABLED})"
        )),
        Some(_) => Ok(()),
    }
}

/// The name of the target Agent's own pod, the Agent Active and not paused, the pod
/// running with the target container.
fn running_pod(store: &Store, t: &IoTarget) -> Result<String, String> {
    let agent = store
        .agents
        .get(&t.namespace, &t.agent)
        .ok_or_else(|| format!("agent {}/{} not found", t.namespace, t.agent))?;
    if agent.spec.paused {
        return Err(format!("agent {}/{} is paused", t.namespace, t.agent));
    }
    let phase = agent.status.as_ref().and_then(|s| s.phase);
    if phase != Some(AgentPhase::Active) {
        let phase = phase.map_or("unknown".to_owned(), |p| format!("{p:?}"));
        return Err(format!(
            "agent {}/{} is {phase}, not Active",
            t.namespace, t.agent
        ));
    }
    let pod_name = agent
        .status
        .as_ref()
        .and_then(|s| s.pod_name.as_deref())
        .map_or_else(|| t.agent.clone(), str::to_owned);
    let pod = store
        .owned_pod(&t.namespace, &pod_name, agent.metadata.uid.as_deref())
        .ok_or_else(|| format!("agent {}/{} has no pod of its own", t.namespace, t.agent))?;
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) != Some("Running") {
        return Err(format!("pod {pod_name} is not running"));
    }
    // A running pod reports every container (the cache keeps no container specs).
    let has_container = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == t.container));
    if !has_container {
        return Err(format!("pod {pod_name} has no container {:?}", t.container));
    }
    Ok(pod_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Agent;
    use crate::store::PodView;

    /// An Agent in `phase` (paused or not) with uid `a-<name>`, as the store holds it.
    fn agent(name: &str, phase: AgentPhase, paused: bool) -> Agent {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "team", "uid": format!("a-{name}")},
            "spec": {"runtime": {"image": "x"}, "paused": paused},
            "status": {"phase": format!("{phase:?}")},
        }))
        .unwrap()
    }

    /// Pod `name` controlled by uid `owner`, in `phase`, with `containers`.
    fn pod(name: &str, owner: &str, phase: &str, containers: &[&str]) -> PodView {
        let statuses: Vec<_> = containers
            .iter()
            .map(|c| serde_json::json!({"name": c, "ready": true, "restartCount": 0}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team", "ownerReferences": [{
                "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent", "name": name,
                "uid": owner, "controller": true}]},
            "status": {"phase": phase, "containerStatuses": statuses},
        }))
        .unwrap()
    }

    fn open(ns: &str, agent: &str, container: &str, command: &[&str]) -> IoOpen {
        serde_json::from_value(serde_json::json!({
            "channel": 1, "session_id": "s", "actor": "ada",
            "target": {"namespace": ns, "agent": agent, "container": container},
            "command": command,
        }))
        .unwrap()
    }

    /// (namespace, agent, container, command, sessions open, the answer)
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a [&'a str],
        usize,
        Result<&'a str, &'a str>,
    );

    fn namespace(name: &str, labels: serde_json::Value) -> crate::store::NamespaceView {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}}))
            .unwrap()
    }

    #[test]
    fn the_rule_of_section_6_table() {
        let store = Store::default();
        store
            .namespaces
            .insert(namespace("team", serde_json::json!({})));
        let both = ["runtime", "agentlet"];
        store.agents.insert(agent("ok", AgentPhase::Active, false));
        store.pods.insert(pod("ok", "a-ok", "Running", &both));
        store
            .agents
            .insert(agent("paused", AgentPhase::Active, true));
        store
            .agents
            .insert(agent("pending", AgentPhase::Pending, false));
        store
            .agents
            .insert(agent("podless", AgentPhase::Active, false));
        store
            .agents
            .insert(agent("stranger", AgentPhase::Active, false));
        store
            .pods
            .insert(pod("stranger", "someone-else", "Running", &both));
        store
            .agents
            .insert(agent("starting", AgentPhase::Active, false));
        store
            .pods
            .insert(pod("starting", "a-starting", "Pending", &both));
        store
            .agents
            .insert(agent("half", AgentPhase::Active, false));
        store
            .pods
            .insert(pod("half", "a-half", "Running", &["agentlet"]));
        let config = Config::parse(|k| match k {
            "AUTONOMIC_NAMESPACES" => Some("team".into()),
            "AUTONOMIC_MAX_SESSIONS" => Some("2".into()),
            _ => None,
        })
        .unwrap();
        let sh = ["sh"];
        let table: [Row; 12] = [
            ("team", "ok", "runtime", &sh, 0, Ok("ok")),
            ("team", "ok", "agentlet", &sh, 1, Ok("ok")),
            (
                "team",
                "ok",
                "runtime",
                &sh,
                2,
                Err("too many shell sessions: 2 open, the limit is 2 (AUTONOMIC_MAX_SESSIONS)"),
            ),
            (
                "team",
                "ok",
                "sidecar",
                &sh,
                0,
                Err("container \"sidecar\" is not allowed (runtime or agentlet only)"),
            ),
            (
                "team",
                "ok",
                "runtime",
                &[],
                0,
                Err("the command is empty or holds a NUL byte"),
            ),
            (
                "team",
                "ok",
                "runtime",
                &["a\0b"],
                0,
                Err("the command is empty or holds a NUL byte"),
            ),
            (
                "other",
                "ok",
                "runtime",
                &sh,
                0,
                Err("namespace \"other\" is not watched by this manager"),
            ),
            (
                "team",
                "nobody",
                "runtime",
                &sh,
                0,
                Err("agent team/nobody not found"),
            ),
            (
                "team",
                "paused",
                "runtime",
                &sh,
                0,
                Err("agent team/paused is paused"),
            ),
            (
                "team",
                "pending",
                "runtime",
                &sh,
                0,
                Err("agent team/pending is Pending, not Active"),
            ),
            (
                "team",
                "stranger",
                "runtime",
                &sh,
                0,
                Err("agent team/stranger has no pod of its own"),
            ),
            (
                "team",
                "starting",
                "runtime",
                &sh,
                0,
                Err("pod starting is not running"),
            ),
        ];
        for (ns, name, container, command, sessions, want) in table {
            let got = authorize(
                &store,
                &config,
                &open(ns, name, container, command),
                sessions,
            );
            let want = want.map(str::to_owned).map_err(str::to_owned);
            assert_eq!(got, want, "{ns}/{name} {container} {command:?} {sessions}");
        }
        let got = authorize(&store, &config, &open("team", "podless", "runtime", &sh), 0);
        assert_eq!(got.unwrap_err(), "agent team/podless has no pod of its own");
        let got = authorize(&store, &config, &open("team", "half", "runtime", &sh), 0);
        assert_eq!(got.unwrap_err(), "pod half has no container \"runtime\"");
        // The command's bounds: 64 arguments, 16 KiB, each at its edge and past it.
        let ask = |command: Vec<String>| {
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            authorize(&store, &config, &open("team", "ok", "runtime", &command), 0)
        };
        assert!(ask(vec!["a".into(); 64]).is_ok());
        assert_eq!(
            ask(vec!["a".into(); 65]).unwrap_err(),
            "the command has 65 arguments of 65 bytes: at most 64 and 16 KiB"
        );
        assert!(ask(vec!["a".repeat(8 * 1024), "b".repeat(8 * 1024)]).is_ok());
        assert_eq!(
            ask(vec!["a".repeat(8 * 1024), "b".repeat(8 * 1024 + 1)]).unwrap_err(),
            "the command has 2 arguments of 16385 bytes: at most 64 and 16 KiB"
        );
    }

    /// TRUST.md §5: the admin's veto comes before anything else is looked at, and a
    /// namespace whose labels are not known refuses.
    #[test]
    fn the_admins_veto_by_configuration_and_by_namespace_label() {
        let store = Store::default();
        let both = ["runtime", "agentlet"];
        for ns in ["team", "locked", "unlisted"] {
            let mut a = agent("ok", AgentPhase::Active, false);
            a.metadata.namespace = Some(ns.into());
            store.agents.insert(a);
            let mut p = pod("ok", "a-ok", "Running", &both);
            p.metadata.namespace = Some(ns.into());
            store.pods.insert(p);
        }
        store.namespaces.insert(namespace(
            "team",
            serde_json::json!({"autonomic.sh/shell": "enabled"}),
        ));
        store.namespaces.insert(namespace(
            "locked",
            serde_json::json!({"autonomic.sh/shell": "disabled"}),
        ));
        let config = |shell: &str| {
            let shell = shell.to_owned();
            Config::parse(move |k| match k {
                "AUTONOMIC_NAMESPACES" => Some("team,locked,unlisted".into()),
                "AUTONOMIC_SHELL_ENABLED" => Some(shell.clone()),
                _ => None,
            })
            .unwrap()
        };
        let on = config("true");
        let ask = |config: &Config, ns: &str| {
            authorize(&store, config, &open(ns, "ok", "runtime", &["sh"]), 0)
        };
        assert_eq!(ask(&on, "team"), Ok("ok".to_owned()));
        assert_eq!(
            ask(&on, "locked").unwrap_err(),
            "shells are disabled in namespace \"locked\" by the admin (label autonomic.sh/shell=disabled)"
        );
        assert_eq!(
            ask(&on, "unlisted").unwrap_err(),
            "the labels of namespace \"unlisted\" are not known (not listed yet, or the manager may not read it): shells there are refused until they are"
        );
        let off = config("false");
        for ns in ["team", "locked", "unlisted"] {
            assert_eq!(
                ask(&off, ns).unwrap_err(),
                "shells are disabled by the admin (AUTONOMIC_SHELL_ENABLED=false)"
            );
        }
    }
}
