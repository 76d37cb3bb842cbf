//! Events: the one a status change deserves ([`phase_event`]), and their POST
//! ([`Kube::record`]).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Resource;
use kube::api::PostParams;
use kube::runtime::events::{Event as KubeEvent, EventType};

use super::{FIELD_MANAGER, Kube};
use crate::crd::{PhaseStatus, Reason};
use crate::text::cap_utf8;

impl Kube {
    pub(super) async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, event: KubeEvent) {
        self.record(&event, &obj.object_ref(&())).await;
    }

    /// Records an Event on the object `reference` names (the manager's own pod, for
    /// the control-plane link); a failure is only logged.
    ///
    /// One POST of an `events.k8s.io/v1` Event, as kube's `Recorder` builds it, without
    /// its cache: the `Recorder` keeps every Event it sent for six minutes (to count
    /// repeats as a series), which after a burst of 10 000 new Agents was 10 000 Events
    /// held, each pruned by a scan of all on every publish. The manager records an
    /// Agent's phase change once, and the link's Events are rate-limited by their caller.
    pub async fn record(&self, event: &KubeEvent, reference: &ObjectReference) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let ns = reference
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let k8s_event = K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            note: event.note.clone(),
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(ns.clone()),
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(FIELD_MANAGER),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(FIELD_MANAGER.into()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            related: event.secondary.clone(),
            ..Default::default()
        };
        let created = async {
            let body = serde_json::to_vec(&k8s_event).map_err(kube::Error::SerdeError)?;
            let mut req = kube::core::Request::new(K8sEvent::url_path(&(), Some(&ns)))
                .create(&PostParams::default(), body)
                .map_err(kube::Error::BuildRequest)?;
            req.extensions_mut().insert("create");
            // The answer is not read: only whether it came.
            self.client.request_text(req).await
        };
        if let Err(e) = created.await {
            tracing::debug!(error = %e, reason = %event.reason, "unable to record event");
        }
    }
}

/// The Event a status change deserves, if any: one when the phase changes, and one when
/// a new cause of trouble appears (an error's cause, or `Unschedulable`, which leaves the
/// phase `Pending`): an Agent that was missing a Runtime now cannot pull its image. Its
/// reason is the cause (the `Ready` condition's reason), its type `Warning` in an error
/// phase or for a cause of trouble. A change of message alone, or of cause while on the
/// way (`Creating` → `ContainerCreating` → `Running`), is no Event: the status has it,
/// and an Event is an API request of its own. The kubelet's flip of a pull failure
/// between `ErrImagePull` and `ImagePullBackOff` is the same cause.
pub fn phase_event<S: PhaseStatus>(old: Option<&S>, new: &S) -> Option<KubeEvent> {
    let reason = new.ready_reason().unwrap_or_default().to_owned();
    let cause = Reason::parse(&reason);
    let trouble = cause.is_some_and(Reason::is_trouble);
    let phase_changed = old.and_then(|o| o.phase_name()) != new.phase_name();
    let old_reason = old.and_then(|o| o.ready_reason());
    let cause_changed = match (old_reason.and_then(Reason::parse), cause) {
        (Some(a), Some(b)) => !a.same_cause(b),
        _ => old_reason != Some(reason.as_str()),
    };
    if !(phase_changed || (trouble && cause_changed)) {
        return None;
    }
    let message = new.message_text();
    Some(KubeEvent {
        type_: if new.is_warning() || trouble {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason,
        note: Some(cap_utf8(message, 1000).to_owned()).filter(|m| !m.is_empty()),
        action: "Reconcile".into(),
        secondary: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_say_the_cause_on_a_phase_change_or_a_new_error() {
        use crate::crd::{AgentPhase, AgentStatus};
        let st = |phase, reason: &str| {
            let mut s = AgentStatus::default();
            s.set_head(
                Some(1),
                phase,
                format!("{reason} message"),
                vec![crate::crd::Condition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: reason.into(),
                    message: String::new(),
                    observed_generation: Some(1),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ),
                }],
            );
            s
        };
        use AgentPhase::*;
        let pending = st(Pending, "Creating");
        let creating = st(Pending, "ContainerCreating");
        let active = st(Active, "Running");
        let missing = st(Error, "RuntimeNotFound");
        let pull = st(Error, "ErrImagePull");
        let backoff = st(Error, "ImagePullBackOff");
        let crash = st(Error, "CrashLoopBackOff");
        let stuck = st(Pending, "Unschedulable");
        // (old, new) → (type, reason) or no Event.
        let cases = [
            (None, &pending, Some(("Normal", "Creating"))),
            (Some(&pending), &creating, None),
            (Some(&creating), &active, Some(("Normal", "Running"))),
            (Some(&active), &active, None),
            (
                Some(&active),
                &missing,
                Some(("Warning", "RuntimeNotFound")),
            ),
            (Some(&missing), &pull, Some(("Warning", "ErrImagePull"))),
            (Some(&pull), &backoff, None),
            (Some(&backoff), &pull, None),
            (
                Some(&backoff),
                &crash,
                Some(("Warning", "CrashLoopBackOff")),
            ),
            (Some(&crash), &active, Some(("Normal", "Running"))),
            (Some(&pending), &stuck, Some(("Warning", "Unschedulable"))),
            (Some(&stuck), &stuck, None),
            (Some(&stuck), &creating, None),
        ];
        for (i, (old, new, want)) in cases.into_iter().enumerate() {
            let got = phase_event(old, new).map(|e| {
                let t = if matches!(e.type_, EventType::Warning) {
                    "Warning"
                } else {
                    "Normal"
                };
                (t, e.reason)
            });
            assert_eq!(
                got.as_ref().map(|(t, r)| (*t, r.as_str())),
                want,
                "case {i}"
            );
        }
        let e = phase_event(None, &missing).unwrap();
        assert_eq!(e.note.as_deref(), Some("RuntimeNotFound message"));
    }
}
