//! Kubernetes Events on the manager's own pod when the control-plane link changes
//! (connected, token rejected, evicted, connection lost), so that `kubectl describe pod`
//! tells the story the logs tell.
//!
//! Recorded only when the state in words changed (a redial that fails the same way
//! again is not news), at most one per reason a minute (a flapping link does not flood
//! the namespace's Events), and only when the pod's uid is known (`POD_UID`, the
//! downward API): `kubectl describe pod` finds Events by the pod's uid.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tokio::time::Instant;

use super::Context;
use crate::text::cap_utf8;

/// At most one Event per reason this often.
pub const PER_REASON: Duration = Duration::from_secs(60);

/// A change of the link worth an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    Connected,
    TokenRejected,
    Evicted,
    ConnectionLost,
}

impl Change {
    /// The Event's reason, in the Kubernetes style (CamelCase, the cause).
    pub fn reason(self) -> &'static str {
        match self {
            Change::Connected => "Connected",
            Change::TokenRejected => "TokenRejected",
            Change::Evicted => "Evicted",
            Change::ConnectionLost => "ConnectionLost",
        }
    }

    /// The Event for this change; `state` is the link's state in words (its note).
    pub fn event(self, state: &str) -> Event {
        Event {
            type_: if self == Change::Connected {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: self.reason().into(),
            note: Some(cap_utf8(state, 1000).to_owned()).filter(|n| !n.is_empty()),
            action: "Connect".into(),
            secondary: None,
        }
    }
}

/// When each reason was last recorded: the rate limit.
#[derive(Debug, Default)]
pub struct Limit {
    last: Mutex<HashMap<Change, Instant>>,
}

impl Limit {
    /// Whether an Event for `change` is recorded now: only when the state `changed`, and
    /// when none of the same reason was within [`PER_REASON`]. Notes it when so.
    pub fn admit(&self, change: Change, changed: bool, now: Instant) -> bool {
        if !changed {
            return false;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last
            .get(&change)
            .is_some_and(|at| now.saturating_duration_since(*at) < PER_REASON)
        {
            return false;
        }
        last.insert(change, now);
        true
    }

    /// When an Event of this reason was last admitted.
    #[cfg(test)]
    pub fn last(&self, change: Change) -> Option<Instant> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.get(&change).copied()
    }
}

/// The manager's own pod, when it runs in one (its uid known).
fn own_pod(ctx: &Context) -> Option<ObjectReference> {
    let c = &ctx.config;
    (!c.pod_uid.is_empty()).then(|| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(c.pod_name.clone()),
        namespace: Some(c.pod_namespace.clone()),
        uid: Some(c.pod_uid.clone()),
        ..Default::default()
    })
}

/// Records the Event of `change` on the manager's pod in the background (the dial loop
/// never waits on the API server), when the module's rules allow: `changed` is what
/// [`super::Link::set_state`] returned for `state`, the link's state in words.
pub fn record(ctx: &Context, change: Change, changed: bool, state: &str) {
    if !ctx.link.events.admit(change, changed, Instant::now()) {
        return;
    }
    tracing::debug!(reason = change.reason(), "link change");
    let Some(pod) = own_pod(ctx) else { return };
    let (kube, event) = (ctx.kube.clone(), change.event(state));
    tokio::spawn(async move { kube.record(&event, &pod).await });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_has_its_event() {
        let e = Change::Connected.event("connected to wss://cp/connect (token tok_…)");
        assert_eq!(e.type_, EventType::Normal);
        assert_eq!(e.reason, "Connected");
        assert_eq!(
            e.note.as_deref(),
            Some("connected to wss://cp/connect (token tok_…)")
        );
        for (change, reason) in [
            (Change::TokenRejected, "TokenRejected"),
            (Change::Evicted, "Evicted"),
            (Change::ConnectionLost, "ConnectionLost"),
        ] {
            let e = change.event("why");
            assert_eq!((e.type_, e.reason.as_str()), (EventType::Warning, reason));
        }
        let long = "x".repeat(5000);
        assert!(Change::ConnectionLost.event(&long).note.unwrap().len() <= 1000);
    }

    /// The Events go on the manager's pod, named with its uid (what `kubectl describe
    /// pod` selects by); without the uid (a manager run outside a pod) on nothing.
    #[tokio::test]
    async fn events_go_on_the_managers_own_pod_when_its_uid_is_known() {
        let ctx = crate::connect::test_context();
        assert_eq!(own_pod(&ctx), None);
        let config = crate::config::Config::parse(|k| match k {
            "POD_NAME" => Some("autonomic-manager-7d9f-abcde".into()),
            "POD_NAMESPACE" => Some("autonomic-system".into()),
            "POD_UID" => Some("5f0c-uid".into()),
            _ => None,
        })
        .unwrap();
        let ctx = crate::connect::test_context_with(config);
        let pod = own_pod(&ctx).expect("a reference");
        assert_eq!(
            (pod.api_version.as_deref(), pod.kind.as_deref()),
            (Some("v1"), Some("Pod"))
        );
        assert_eq!(pod.name.as_deref(), Some("autonomic-manager-7d9f-abcde"));
        assert_eq!(pod.namespace.as_deref(), Some("autonomic-system"));
        assert_eq!(pod.uid.as_deref(), Some("5f0c-uid"));
    }

    #[tokio::test(start_paused = true)]
    async fn one_event_per_reason_a_minute_and_only_on_a_change() {
        let limit = Limit::default();
        let now = Instant::now;
        assert!(
            !limit.admit(Change::ConnectionLost, false, now()),
            "no change"
        );
        assert!(limit.admit(Change::ConnectionLost, true, now()));
        // The same reason again within the minute: not recorded; another reason is.
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!limit.admit(Change::ConnectionLost, true, now()));
        assert!(limit.admit(Change::Connected, true, now()));
        // A minute after the first: recorded again, and the minute starts over.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(limit.admit(Change::ConnectionLost, true, now()));
        assert!(!limit.admit(Change::ConnectionLost, true, now()));
        assert_eq!(limit.last(Change::ConnectionLost), Some(now()));
        assert_eq!(limit.last(Change::Evicted), None);
    }
}
