//! Which Agents demand which Tools (RESOURCES.md, Tool: the on-demand pod).
//!
//! An Agent demands the Tools in its `spec.tools` while it wants to run: not paused, not
//! finished (`Succeeded`/`Failed` for its current generation), not being deleted. Its
//! phase otherwise does not matter: an Agent in `Error` (a missing Memory, a crashing
//! container) still wants to run, and may even have a running pod (a broken reference
//! leaves a running pod alone), so its Tools stay up.
//!
//! The count a Tool shows (`status.users`) is computed from the Agent cache when the Tool
//! is reconciled. [`Index`] only decides *when* to reconcile a Tool: it remembers what
//! each Agent demanded last, so an Agent change requeues exactly the Tools whose demand
//! it changed (old list and new), and an Agent's status writes — most Agent events —
//! requeue none.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::crd::{Agent, AgentPhase, Tool};
use crate::store::ObjKey;

/// Whether the Agent wants to run: not paused, not finished for its generation, not
/// being deleted.
pub fn wants_to_run(agent: &Agent) -> bool {
    let finished = agent.status.as_ref().is_some_and(|s| {
        matches!(s.phase, Some(AgentPhase::Succeeded | AgentPhase::Failed))
            && s.observed_generation == agent.metadata.generation
    });
    agent.metadata.deletion_timestamp.is_none() && !agent.spec.paused && !finished
}

/// The Tools the Agent demands now: its `spec.tools` (sorted, once each) while it wants
/// to run, else none.
pub fn demanded(agent: &Agent) -> Vec<String> {
    if !wants_to_run(agent) {
        return Vec::new();
    }
    let mut tools = agent.spec.tools.to_vec();
    tools.sort();
    tools.dedup();
    tools
}

/// How many of `agents` (one namespace's) demand the Tool `tool`.
pub fn users(agents: &[std::sync::Arc<Agent>], tool: &str) -> u32 {
    let n = agents
        .iter()
        .filter(|a| wants_to_run(a) && a.spec.tools.iter().any(|t| t == tool))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What each Agent demanded when last seen, to requeue the Tools an Agent change
/// concerns; and the idle start this process last wrote per Tool (see [`Index::idle_since`]).
#[derive(Default)]
pub struct Index {
    /// Only Agents that demand at least one Tool have an entry.
    by_agent: Mutex<HashMap<ObjKey, Vec<String>>>,
    /// Tool → (uid, `status.idleSince` as last written by this process).
    idle_written: Mutex<HashMap<ObjKey, (String, Option<Timestamp>)>>,
    /// Tool → (uid, generation) last seen, to tell spec changes from status writes.
    tool_seen: Mutex<HashMap<ObjKey, (String, Option<i64>)>>,
}

impl Index {
    /// Records that Agent `ns/name` now demands `now` (empty when it stopped or is gone);
    /// returns the Tools whose demand changed: in the old list or the new, not both.
    pub fn update(&self, ns: &str, name: &str, now: Vec<String>) -> Vec<String> {
        let key = (ns.to_owned(), name.to_owned());
        let mut map = self.by_agent.lock().unwrap_or_else(|e| e.into_inner());
        let old = if now.is_empty() {
            map.remove(&key).unwrap_or_default()
        } else {
            map.insert(key, now.clone()).unwrap_or_default()
        };
        drop(map);
        let mut changed: Vec<String> = old
            .iter()
            .filter(|t| !now.contains(t))
            .chain(now.iter().filter(|t| !old.contains(t)))
            .cloned()
            .collect();
        changed.sort();
        changed
    }

    /// The `status.idleSince` this process last wrote for `tool`, if it wrote one since
    /// it started: fresher than the cache, which may not yet hold our own write. `None`
    /// when this process has not written the Tool's status (then the cache is the truth).
    pub fn idle_since(&self, tool: &Tool) -> Option<Option<Timestamp>> {
        let map = self.idle_written.lock().unwrap_or_else(|e| e.into_inner());
        let (uid, since) = map.get(&key_of(tool))?;
        (Some(uid.as_str()) == tool.metadata.uid.as_deref()).then_some(*since)
    }

    /// Notes the `status.idleSince` just written for `tool`.
    pub fn wrote_idle_since(&self, tool: &Tool, since: Option<Timestamp>) {
        let uid = tool.metadata.uid.clone().unwrap_or_default();
        let mut map = self.idle_written.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key_of(tool), (uid, since));
    }

    /// Notes a Tool change; whether it can matter to the Agents that use it: the Tool
    /// appeared, went, or its spec changed. A status write (most Tool events, now that
    /// `status.users` follows every Agent start and stop) does not.
    pub fn tool_changed(&self, tool: &Tool, removed: bool) -> bool {
        let key = key_of(tool);
        let mut seen = self.tool_seen.lock().unwrap_or_else(|e| e.into_inner());
        if removed {
            seen.remove(&key);
            drop(seen);
            let mut idle = self.idle_written.lock().unwrap_or_else(|e| e.into_inner());
            idle.remove(&key);
            return true;
        }
        let now = (
            tool.metadata.uid.clone().unwrap_or_default(),
            tool.metadata.generation,
        );
        seen.insert(key, now.clone()).is_none_or(|old| old != now)
    }
}

fn key_of<K: ResourceExt>(obj: &K) -> ObjKey {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AgentStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn agent(tools: &[&str]) -> Agent {
        let mut a: Agent = serde_saphyr::from_str(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Agent, metadata: {name: a, namespace: n}, spec: {}}",
        )
        .unwrap();
        a.spec.tools = tools.iter().map(|t| t.to_string()).collect();
        a.metadata.generation = Some(2);
        a
    }

    fn finished(phase: AgentPhase, generation: i64) -> Option<AgentStatus> {
        Some(AgentStatus {
            phase: Some(phase),
            observed_generation: Some(generation),
            ..Default::default()
        })
    }

    #[test]
    fn who_wants_to_run() {
        use AgentPhase::*;
        let base = agent(&["search", "fetch", "search"]);
        let cases: Vec<(&str, Agent, bool)> = vec![
            ("new", base.clone(), true),
            (
                "paused",
                Agent {
                    spec: crate::crd::AgentSpec {
                        paused: true,
                        ..base.spec.clone()
                    },
                    ..base.clone()
                },
                false,
            ),
            (
                "succeeded",
                Agent {
                    status: finished(Succeeded, 2),
                    ..base.clone()
                },
                false,
            ),
            (
                "failed",
                Agent {
                    status: finished(Failed, 2),
                    ..base.clone()
                },
                false,
            ),
            // Finished for an older generation: the spec changed, it runs again.
            (
                "finished before an edit",
                Agent {
                    status: finished(Succeeded, 1),
                    ..base.clone()
                },
                true,
            ),
            // Error (e.g. a missing Memory) still wants to run: its Tools stay up.
            (
                "error",
                Agent {
                    status: finished(Error, 2),
                    ..base.clone()
                },
                true,
            ),
            (
                "pending",
                Agent {
                    status: finished(Pending, 2),
                    ..base.clone()
                },
                true,
            ),
            (
                "deleting",
                {
                    let mut a = base.clone();
                    a.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
                    a
                },
                false,
            ),
        ];
        for (what, a, wants) in cases {
            assert_eq!(wants_to_run(&a), wants, "{what}");
            let expect: Vec<String> = if wants {
                vec!["fetch".into(), "search".into()]
            } else {
                vec![]
            };
            assert_eq!(demanded(&a), expect, "{what}");
        }
    }

    #[test]
    fn users_count_agents_once_each() {
        let mut paused = agent(&["search"]);
        paused.spec.paused = true;
        let agents: Vec<_> = [
            agent(&["search", "search"]),
            agent(&["search", "x"]),
            agent(&["x"]),
            paused,
        ]
        .into_iter()
        .map(std::sync::Arc::new)
        .collect();
        assert_eq!(users(&agents, "search"), 2);
        assert_eq!(users(&agents, "x"), 2);
        assert_eq!(users(&agents, "none"), 0);
    }

    #[test]
    fn an_agent_change_requeues_the_tools_whose_demand_changed() {
        let ix = Index::default();
        let v = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ix.update("n", "a", v(&["s", "t"])),
            v(&["s", "t"]),
            "created"
        );
        assert_eq!(ix.update("n", "a", v(&["s", "t"])), v(&[]), "status write");
        assert_eq!(
            ix.update("n", "a", v(&["t", "u"])),
            v(&["s", "u"]),
            "edited"
        );
        assert_eq!(ix.update("n", "b", v(&["t"])), v(&["t"]), "another agent");
        assert_eq!(ix.update("n", "a", v(&[])), v(&["t", "u"]), "paused");
        assert_eq!(ix.update("n", "a", v(&[])), v(&[]), "still paused");
        assert_eq!(ix.update("n", "a", v(&["t"])), v(&["t"]), "resumed");
        assert_eq!(
            ix.update("m", "a", v(&["t"])),
            v(&["t"]),
            "namespaces apart"
        );
        assert_eq!(ix.update("n", "b", v(&[])), v(&["t"]), "deleted");
        assert_eq!(
            ix.by_agent.lock().unwrap().len(),
            2,
            "only demanding agents held"
        );
    }

    #[test]
    fn tool_changes_that_matter_to_agents() {
        let ix = Index::default();
        let mut t: Tool = serde_saphyr::from_str(
            "{apiVersion: autonomic.sh/v1alpha1, kind: Tool, metadata: {name: t, namespace: n, uid: u1, generation: 1}, spec: {image: i}}",
        )
        .unwrap();
        assert!(ix.tool_changed(&t, false), "appeared");
        assert!(!ix.tool_changed(&t, false), "status write");
        t.metadata.generation = Some(2);
        assert!(ix.tool_changed(&t, false), "spec changed");
        t.metadata.uid = Some("u2".into());
        assert!(ix.tool_changed(&t, false), "recreated");
        ix.wrote_idle_since(&t, Some(Timestamp::UNIX_EPOCH));
        assert_eq!(ix.idle_since(&t), Some(Some(Timestamp::UNIX_EPOCH)));
        t.metadata.uid = Some("u3".into());
        assert_eq!(ix.idle_since(&t), None, "another object of that name");
        assert!(ix.tool_changed(&t, true), "removed");
        t.metadata.uid = Some("u2".into());
        assert_eq!(ix.idle_since(&t), None, "forgotten with the Tool");
    }
}
