//! The manager's writes to the cluster: server-side apply of children, pod create and
//! delete, status patches and Events. Reads come from the [`crate::store::Store`]; the one
//! direct read here (`get_secret`) is of a Secret the store does not watch. Events (the
//! one a status change deserves, and their POST) are in [`events`].
//!
//! Every write returns `Err` for what is worth retrying (the API server unreachable, a
//! conflict) and [`Written::Refused`] for what is not (the API server refused the object,
//! or a same-named object belongs to someone else): the owner's status says why.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crd::{Agent, Kind, Tool};
use crate::store::{PodView, SecretView, is_owned_by};

mod events;
mod identity;
mod status;

pub use identity::service_account;

pub use events::phase_event;

/// A request to the API server that failed in a way worth retrying, with what it was.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct Error {
    context: String,
    #[source]
    source: kube::Error,
}

impl Error {
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error {
            context: context.into(),
            source,
        }
    }
}

/// The field manager of every server-side apply, and the Events' reporting controller.
pub const FIELD_MANAGER: &str = "autonomic-manager";

/// How a write ended, when it did not fail in a way worth retrying.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Written {
    Done,
    Refused(Refused),
}

impl Written {
    pub fn refused(self) -> Option<Refused> {
        match self {
            Written::Done => None,
            Written::Refused(r) => Some(r),
        }
    }
}

/// Why a child was not written; retrying the same object would not help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A same-named object exists that the owner does not control: never taken over.
    #[error("{kind} {name:?} exists and is not owned by the manager")]
    NotOurs { kind: String, name: String },
    /// The API server refused the object (400, 403, 422): its own words.
    #[error("{kind} {name:?} refused: {message}")]
    Invalid {
        kind: String,
        name: String,
        message: String,
    },
}

impl Refused {
    fn not_ours(kind: &str, name: &str) -> Self {
        Refused::NotOurs {
            kind: kind.to_owned(),
            name: name.to_owned(),
        }
    }

    fn invalid(kind: &str, name: &str, e: &kube::Error) -> Self {
        Refused::Invalid {
            kind: kind.to_owned(),
            name: name.to_owned(),
            message: api_message(e),
        }
    }
}

/// The HTTP status of an API error.
pub fn api_status(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The API server's own words, for a status message.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Whether `actual` holds every field `desired` sets, with the same value; fields the
/// API server adds (defaults, metadata) are ignored. Lists must have the same length and
/// hold their elements in order.
pub fn holds(actual: &serde_json::Value, desired: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| dv.is_null() || a.get(k).is_some_and(|av| holds(av, dv))),
        (Value::Array(a), Value::Array(d)) => {
            a.len() == d.len() && a.iter().zip(d).all(|(x, y)| holds(x, y))
        }
        _ => actual == desired,
    }
}

/// The writer: a client, and this replica's name for the Events it records.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    instance: String,
    /// Statuses written whose write the cache has not shown yet: uid → the
    /// resourceVersion the write was decided from, and the status's hash.
    unseen: Arc<Mutex<HashMap<String, (String, u64)>>>,
}

impl Kube {
    /// `instance`: this replica's name, in the Events it records.
    pub fn new(client: Client, instance: &str) -> Self {
        Kube {
            client,
            instance: instance.to_owned(),
            unseen: Arc::default(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn api<T>(&self, ns: &str) -> Api<T>
    where
        T: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Server-side applies a child. The outer error is transient; the inner one says the
    /// API server refused it or a same-named object belongs to someone else (we never
    /// take over or delete what is not ours).
    ///
    /// `cached` is the watch cache's copy: when it is ours and already holds every field
    /// of `obj`, nothing is sent (most reconciles of an Agent change nothing, and a GET
    /// plus an apply each would double the API server's work). A change made to the
    /// child since arrives as a watch event that requeues the owner.
    pub async fn apply<T>(&self, ns: &str, obj: &T, cached: Option<&T>) -> Result<Written, Error>
    where
        T: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Debug
            + Serialize
            + DeserializeOwned,
    {
        let api: Api<T> = self.api(ns);
        let name = obj.name_any();
        let kind = T::kind(&());
        let owner = obj.owner_references().first().map(|r| r.uid.as_str());
        if let Some(cached) = cached
            && is_owned_by(cached.meta(), owner)
            && holds(
                &serde_json::to_value(cached).unwrap_or_default(),
                &serde_json::to_value(obj).unwrap_or_default(),
            )
        {
            return Ok(Written::Done);
        }
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube(format!("unable to get {kind} {ns}/{name}"), e))?;
        if let Some(existing) = existing
            && !is_owned_by(existing.meta(), owner)
        {
            return Ok(Written::Refused(Refused::not_ours(&kind, &name)));
        }
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch(&name, &pp, &Patch::Apply(obj)).await {
            Ok(_) => Ok(Written::Done),
            Err(e) if matches!(api_status(&e), Some(400 | 403 | 422)) => {
                Ok(Written::Refused(Refused::invalid(&kind, &name, &e)))
            }
            Err(e) => Err(Error::kube(
                format!("unable to apply {kind} {ns}/{name}"),
                e,
            )),
        }
    }

    /// Writes a config Secret of the manager's: created with a POST when the cache has
    /// none, merge-patched (guarded by the resourceVersion it was compared with) when the
    /// cached copy is ours and differs, nothing when it already holds `desired`.
    ///
    /// One request per new Secret: the GET that refuses a stranger's Secret of the same
    /// name (which the label-selected cache cannot see) is only sent when the create
    /// answers 409. No server-side apply: its field ownership would mix Apply and Update
    /// entries of this manager in `managedFields`, and it needs that GET first.
    pub async fn write_secret(
        &self,
        desired: &Secret,
        cached: Option<&SecretView>,
    ) -> Result<Written, Error> {
        let ns = desired.namespace().unwrap_or_default();
        let name = desired.name_any();
        let owner = desired.owner_references().first().map(|r| r.uid.as_str());
        let existing = match cached {
            Some(c) => c.clone(),
            None => match self.create_or_get_secret(&ns, desired).await? {
                Ok(done) => return Ok(done),
                Err(existing) => existing,
            },
        };
        if !is_owned_by(&existing.metadata, owner) {
            return Ok(Written::Refused(Refused::not_ours("Secret", &name)));
        }
        if existing.holds(desired) {
            return Ok(Written::Done);
        }
        // The labels and values we set; keys others added stay (as with an apply).
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": existing.metadata.resource_version,
                "labels": desired.metadata.labels,
            },
            "data": desired.data,
        });
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match self
            .api::<SecretView>(&ns)
            .patch(&name, &pp, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Written::Done),
            Err(e) if matches!(api_status(&e), Some(400 | 403 | 422)) => {
                Ok(Written::Refused(Refused::invalid("Secret", &name, &e)))
            }
            // 409 (changed since the cache saw it) and 404 (deleted): the watch brings
            // the news and requeues the owner; until then, a retry.
            Err(e) => Err(Error::kube(
                format!("unable to patch Secret {ns}/{name}"),
                e,
            )),
        }
    }

    /// POSTs a Secret: `Ok` when that settled it (created, or refused by the API server),
    /// else the Secret of that name that exists (409), read with a GET. A Secret deleted
    /// between the two is created again, once.
    async fn create_or_get_secret(
        &self,
        ns: &str,
        secret: &Secret,
    ) -> Result<Result<Written, SecretView>, Error> {
        let name = secret.name_any();
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let mut tries = 0;
        loop {
            let create = async {
                let body = serde_json::to_vec(secret).map_err(kube::Error::SerdeError)?;
                let mut req = kube::core::Request::new(Secret::url_path(&(), Some(ns)))
                    .create(&pp, body)
                    .map_err(kube::Error::BuildRequest)?;
                req.extensions_mut().insert("create");
                self.client.request::<SecretView>(req).await
            };
            let conflict = match create.await {
                Ok(_) => return Ok(Ok(Written::Done)),
                Err(e) if api_status(&e) == Some(409) => e,
                Err(e) if matches!(api_status(&e), Some(400 | 403 | 422)) => {
                    return Ok(Ok(Written::Refused(Refused::invalid("Secret", &name, &e))));
                }
                Err(e) => {
                    return Err(Error::kube(
                        format!("unable to create Secret {ns}/{name}"),
                        e,
                    ));
                }
            };
            match self.api::<SecretView>(ns).get_opt(&name).await {
                Ok(Some(existing)) => return Ok(Err(existing)),
                Ok(None) if tries == 0 => tries += 1,
                Ok(None) => {
                    return Err(Error::kube(
                        format!("unable to create Secret {ns}/{name}"),
                        conflict,
                    ));
                }
                Err(e) => return Err(Error::kube(format!("unable to get Secret {ns}/{name}"), e)),
            }
        }
    }

    /// Creates a pod; an already existing one is fine (the watch will show it). The inner
    /// error is the API server's refusal, to report as the owner's `Error`.
    pub async fn create_pod(&self, pod: &Pod) -> Result<Written, Error> {
        Ok(match self.create_pod_read(pod).await? {
            Ok(_) => Written::Done,
            Err(why) => Written::Refused(why),
        })
    }

    /// [`create_pod`](Self::create_pod), with the pod as the API server answered (`None`
    /// when ours already existed): its owner can decide from it at once instead of
    /// writing a status the pod's first watch event would change again.
    pub async fn create_pod_read(
        &self,
        pod: &Pod,
    ) -> Result<Result<Option<PodView>, Refused>, Error> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        // Api::create, but reading the answer as the slim PodView: the manager never
        // parses a whole k8s-openapi Pod (see pod.rs).
        let create = async {
            let body = serde_json::to_vec(pod).map_err(kube::Error::SerdeError)?;
            let mut req = kube::core::Request::new(Pod::url_path(&(), Some(&ns)))
                .create(&PostParams::default(), body)
                .map_err(kube::Error::BuildRequest)?;
            req.extensions_mut().insert("create");
            self.client.request::<PodView>(req).await
        };
        match create.await {
            Ok(created) => {
                tracing::info!(pod = %name, namespace = %ns, "pod created");
                Ok(Ok(Some(created)))
            }
            // Ours and not yet in the cache is fine; someone else's is never touched.
            Err(e) if api_status(&e) == Some(409) => {
                let owner = pod.owner_references().first().map(|r| r.uid.as_str());
                let existing = self
                    .api::<PodView>(&ns)
                    .get_opt(&name)
                    .await
                    .map_err(|e| Error::kube(format!("unable to get pod {ns}/{name}"), e))?;
                match existing {
                    Some(p) if !is_owned_by(&p.metadata, owner) => {
                        Ok(Err(Refused::not_ours("Pod", &name)))
                    }
                    _ => Ok(Ok(None)),
                }
            }
            Err(e) if matches!(api_status(&e), Some(400 | 403 | 422)) => {
                Ok(Err(Refused::invalid("Pod", &name, &e)))
            }
            Err(e) => Err(Error::kube(format!("unable to create pod {ns}/{name}"), e)),
        }
    }

    /// Deletes exactly this pod (by uid): a pod recreated meanwhile is left alone.
    pub async fn delete_pod(&self, pod: &PodView) -> Result<(), Error> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api::<PodView>(&ns).delete(&name, &dp).await {
            Ok(_) => {
                tracing::info!(pod = %name, namespace = %ns, "pod deleted");
                Ok(())
            }
            Err(e) if matches!(api_status(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(Error::kube(format!("unable to delete pod {ns}/{name}"), e)),
        }
    }

    /// Merge-patches `spec` of an Agent or a Tool (the control actions pause and resume).
    pub async fn patch_spec(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        spec: serde_json::Value,
    ) -> Result<(), Error> {
        let patch = Patch::Merge(serde_json::json!({ "spec": spec }));
        let pp = PatchParams::default();
        let patched = match kind {
            Kind::Agent => self
                .api::<Agent>(ns)
                .patch(name, &pp, &patch)
                .await
                .map(drop),
            _ => self
                .api::<Tool>(ns)
                .patch(name, &pp, &patch)
                .await
                .map(drop),
        };
        patched.map_err(|e| Error::kube(format!("{kind} {ns}/{name}"), e))
    }

    /// Deletes an Agent or a Tool in the background (the control action delete).
    pub async fn delete_object(&self, kind: Kind, ns: &str, name: &str) -> Result<(), Error> {
        let dp = DeleteParams::background();
        let deleted = match kind {
            Kind::Agent => self.api::<Agent>(ns).delete(name, &dp).await.map(drop),
            _ => self.api::<Tool>(ns).delete(name, &dp).await.map(drop),
        };
        deleted.map_err(|e| Error::kube(format!("{kind} {ns}/{name}"), e))
    }

    pub async fn get_secret(&self, ns: &str, name: &str) -> Result<Option<Secret>, Error> {
        self.api::<Secret>(ns)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("unable to get Secret {ns}/{name}"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_ignores_what_the_server_adds_but_not_what_we_set() {
        use serde_json::json;
        let desired = json!({"metadata": {"name": "a", "labels": {"x": "1"}},
                             "spec": {"ports": [{"port": 80}]}, "data": {"k": "dg=="}});
        let actual = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}},
                            "spec": {"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.0.0.1"},
                            "data": {"k": "dg=="}});
        assert!(holds(&actual, &desired));
        let mut changed = actual.clone();
        changed["data"]["k"] = json!("dw==");
        assert!(!holds(&changed, &desired));
        let mut extra_port = actual.clone();
        extra_port["spec"]["ports"] = json!([{"port": 80}, {"port": 81}]);
        assert!(!holds(&extra_port, &desired));
        let mut no_label = actual;
        no_label["metadata"]["labels"] = json!({"y": "2"});
        assert!(!holds(&no_label, &desired));
    }
}
