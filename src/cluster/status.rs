//! Status writes: the status subresource patched when it changed, skipped while the
//! cache has not shown this process's own last write, and an Event on a phase change.

use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::{Error, Kube, api_status, phase_event};
use crate::crd::PhaseStatus;

/// The most entries `Kube::unseen` holds; past it, it is emptied (at worst one status is
/// written twice).
const UNSEEN_MAX: usize = 4096;

/// A hash of a status less its conditions' transition times: a reconcile deciding from
/// a stale status stamps a new time on the same condition.
fn status_digest<S: serde::Serialize>(status: &S) -> u64 {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(conditions) = value
        .get_mut("conditions")
        .and_then(serde_json::Value::as_array_mut)
    {
        for c in conditions
            .iter_mut()
            .filter_map(serde_json::Value::as_object_mut)
        {
            c.remove("lastTransitionTime");
        }
    }
    let mut h = DefaultHasher::new();
    value.to_string().hash(&mut h);
    h.finish()
}

impl Kube {
    /// Writes `status` through the status subresource when it differs from `old`, and
    /// records a Kubernetes Event when the phase changes.
    pub async fn write_status<K, S>(
        &self,
        obj: &K,
        old: Option<&S>,
        status: &S,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned,
        S: PhaseStatus,
    {
        // A reconcile that runs before the cache shows this process's last status write
        // (the pod's watch event often comes first) decides from the status before it:
        // writing the same status again, and its Event, would change nothing.
        let uid = obj.uid().unwrap_or_default();
        let version = obj.resource_version().unwrap_or_default();
        let digest = status_digest(status);
        {
            let mut unseen = self.unseen.lock().unwrap_or_else(|e| e.into_inner());
            match unseen.get(&uid) {
                Some((v, d)) if *v == version && *d == digest => return Ok(()),
                Some((v, _)) if *v != version => {
                    unseen.remove(&uid);
                }
                _ => {}
            }
        }
        if old == Some(status) {
            return Ok(());
        }
        let ns = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        let kind = K::kind(&());
        // A merge patch of the whole status: unset fields are sent as null and removed.
        let patch = serde_json::json!({ "status": status });
        match self
            .api::<K>(&ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let mut unseen = self.unseen.lock().unwrap_or_else(|e| e.into_inner());
                if unseen.len() >= UNSEEN_MAX {
                    unseen.clear();
                }
                if !uid.is_empty() {
                    unseen.insert(uid, (version, digest));
                }
            }
            // Deleted meanwhile: nothing to report on.
            Err(e) if api_status(&e) == Some(404) => return Ok(()),
            Err(e) => {
                return Err(Error::kube(
                    format!("unable to update status of {kind} {ns}/{name}"),
                    e,
                ));
            }
        }
        if let Some(event) = phase_event(old, status) {
            let (phase, message) = (
                status.phase_name().unwrap_or_default(),
                status.message_text(),
            );
            tracing::info!(%kind, namespace = %ns, %name, %phase, reason = %event.reason, status_message = %message, "phase changed");
            self.publish(obj, event).await;
        }
        Ok(())
    }
}
