//! Memory → Secret `<memory>-memory` with `backend` and `url`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use super::common;
use super::offer;
use super::problem::{self, Problem};
use super::{Context, Outcome};
use crate::cluster::Error;
use crate::cluster::Written;
use crate::crd::{Kind, Memory, MemoryPhase, MemoryStatus, Reason};

pub fn secret_name(memory: &str) -> String {
    format!("{memory}-memory")
}

/// Where the URL comes from, or why it cannot be had.
#[derive(Debug, PartialEq)]
pub enum Source {
    Url(String),
    /// Waiting for the Secret to exist, or to be offered to agents: one answer for both
    /// (TRUST.md §2).
    Pending(Problem),
    Invalid(Problem),
}

/// `secret` is the referenced Secret, when there is a `secretRef` and it exists and is
/// offered to agents.
pub fn source(memory: &Memory, secret: Option<&Secret>) -> Source {
    // A stub's spec is the default, not the user's (TRUST.md §3).
    if let Err(e) = problem::check_spec_size(&memory.metadata) {
        return Source::Invalid(e);
    }
    if let Err(e) = problem::check_label_value(Kind::Memory, &memory.name_any()) {
        return Source::Invalid(e);
    }
    match (&memory.spec.url, &memory.spec.secret_ref) {
        (Some(_), Some(_)) => Source::Invalid(Problem::UrlAndSecretRef),
        (None, None) => Source::Invalid(Problem::NoUrl),
        (Some(url), None) if url.trim().is_empty() => Source::Invalid(Problem::EmptyUrl),
        (Some(url), None) => Source::Url(url.clone()),
        (None, Some(r)) => {
            let Some(secret) = secret else {
                return Source::Pending(Problem::SecretNotAllowed(r.name.clone()));
            };
            let value = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .map(|b| b.0.clone())
                .or_else(|| {
                    secret
                        .string_data
                        .as_ref()
                        .and_then(|d| d.get(&r.key))
                        .map(|s| s.clone().into_bytes())
                });
            match value.map(String::from_utf8) {
                None => Source::Invalid(Problem::SecretKeyMissing {
                    secret: r.name.clone(),
                    key: r.key.clone(),
                }),
                Some(Err(_)) => Source::Invalid(Problem::SecretNotText {
                    secret: r.name.clone(),
                    key: r.key.clone(),
                }),
                Some(Ok(url)) => Source::Url(url.trim().to_owned()),
            }
        }
    }
}

pub fn desired_secret(memory: &Memory, url: &str) -> Secret {
    Secret {
        metadata: common::child_meta(memory, Kind::Memory, secret_name(&memory.name_any())),
        data: Some(BTreeMap::from([
            (
                "backend".to_owned(),
                ByteString(memory.spec.backend.clone().into_bytes()),
            ),
            ("url".to_owned(), ByteString(url.as_bytes().to_vec())),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

pub async fn reconcile(ctx: &Context, memory: Arc<Memory>) -> Result<Outcome, Error> {
    let ns = memory.namespace().unwrap_or_default();
    // Only a Secret offered to agents is read (TRUST.md §2): for any other the manager
    // asks the API server nothing, and says what it says of a missing one. An offer
    // made, withdrawn or changed queues the Memory again (the offer watch).
    let referenced = match &memory.spec.secret_ref {
        Some(r) if offer::secret(ctx, &ns, &r.name).is_ok() => {
            ctx.kube.get_secret(&ns, &r.name).await?
        }
        _ => None,
    };
    let mut outcome = Outcome::default();
    let error = |why: Problem| (MemoryPhase::Error, why.reason(), why.to_string(), None);
    let (phase, reason, message, secret) = match source(&memory, referenced.as_ref()) {
        _ if memory.metadata.deletion_timestamp.is_some() => (
            MemoryPhase::Pending,
            Reason::Deleting,
            "deletion requested".to_owned(),
            None,
        ),
        Source::Url(url) => {
            let name = secret_name(&memory.name_any());
            let cached = ctx.store.secrets.get(&ns, &name);
            let desired = desired_secret(&memory, &url);
            match ctx.kube.write_secret(&desired, cached.as_deref()).await? {
                Written::Done => (MemoryPhase::Bound, Reason::Bound, String::new(), Some(name)),
                Written::Refused(why) => error(why.into()),
            }
        }
        Source::Pending(why) => (MemoryPhase::Pending, why.reason(), why.to_string(), None),
        Source::Invalid(why) => error(why),
    };
    let old = memory.status.clone().unwrap_or_default();
    let own = MemoryStatus {
        secret_name: secret.or(old
            .secret_name
            .clone()
            .filter(|_| phase != MemoryPhase::Error)),
        ..Default::default()
    };
    let status = common::status(
        &memory.metadata,
        memory.status.as_ref(),
        phase,
        reason,
        message,
        own,
    );
    ctx.kube
        .write_status(&*memory, memory.status.as_ref(), &status)
        .await?;
    // An offered Secret's changes queue the Memory through the offer watch; this look
    // now and then only backs that watch up (a missed event), and costs one GET a minute.
    if memory.spec.secret_ref.is_some() && outcome.requeue.is_none() {
        outcome.requeue = Some(Duration::from_secs(60));
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(spec: &str) -> Memory {
        serde_saphyr::from_str(&format!(
            "{{apiVersion: autonomic.sh/v1alpha1, kind: Memory, metadata: {{name: m, namespace: n}}, spec: {spec}}}"
        ))
        .unwrap()
    }

    #[test]
    fn sources() {
        assert_eq!(
            source(&memory("{backend: redis, url: 'redis://r:6379'}"), None),
            Source::Url("redis://r:6379".into())
        );
        let by_ref = memory("{backend: redis, secretRef: {name: creds, key: url}}");
        assert_eq!(
            source(&by_ref, None),
            Source::Pending(Problem::SecretNotAllowed("creds".into()))
        );
        let s: Secret =
            serde_saphyr::from_str("{metadata: {name: creds}, data: {url: cmVkaXM6Ly94}}").unwrap();
        assert_eq!(source(&by_ref, Some(&s)), Source::Url("redis://x".into()));
        let wrong_key = memory("{backend: redis, secretRef: {name: creds, key: nope}}");
        let invalid = |m: &Memory, s: Option<&Secret>| match source(m, s) {
            Source::Invalid(p) => (p.to_string(), p.reason()),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            invalid(&wrong_key, Some(&s)),
            (
                "Secret \"creds\" has no key \"nope\"".into(),
                Reason::SecretInvalid
            )
        );
        assert_eq!(
            invalid(&memory("{backend: redis}"), None),
            ("set spec.url or spec.secretRef".into(), Reason::InvalidSpec)
        );
        assert_eq!(
            invalid(
                &memory("{backend: redis, url: u, secretRef: {name: a, key: b}}"),
                None
            ),
            (
                "set either spec.url or spec.secretRef, not both".into(),
                Reason::InvalidSpec
            )
        );
    }

    /// TRUST.md §3: a Memory kept as a stub (its spec over the bound) is `Error`,
    /// `SpecTooLarge`, both sizes in the message; it writes no Secret. Under the bound,
    /// the same Memory has its URL.
    #[test]
    fn a_spec_over_the_bound_is_an_error() {
        let store = crate::store::Store::with_max_spec_bytes(256);
        let big = memory(&format!(
            "{{backend: '{}', url: 'redis://r'}}",
            "x".repeat(300)
        ));
        let bytes = serde_json::to_vec(&big.spec).unwrap().len();
        let Source::Invalid(why) = source(&store.memories.insert(big), None) else {
            panic!("a stub has a source")
        };
        assert_eq!(why.reason(), Reason::SpecTooLarge);
        assert_eq!(
            why.to_string(),
            format!(
                "spec is {bytes} bytes as JSON, over the bound of 256 (AUTONOMIC_MAX_SPEC_BYTES)"
            )
        );
        let small = store
            .memories
            .insert(memory("{backend: redis, url: 'redis://r'}"));
        assert_eq!(source(&small, None), Source::Url("redis://r".into()));
    }

    #[test]
    fn secret_has_backend_and_url() {
        let m = memory("{backend: postgres, url: 'postgres://db'}");
        let s = desired_secret(&m, "postgres://db");
        assert_eq!(s.metadata.name.as_deref(), Some("m-memory"));
        let d = s.data.unwrap();
        assert_eq!(d["backend"].0, b"postgres");
        assert_eq!(d["url"].0, b"postgres://db");
    }
}
