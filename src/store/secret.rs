//! A Secret of ours as the manager reads it: who owns it, its labels, and a hash of each
//! data value, never the data.
//!
//! The manager writes config Secrets (an Agent's, a Memory's) and only ever asks of the
//! cached copy "is it ours, and does it already hold what we would write?". A hash of each
//! value answers the second question; the values (an Agent's `config.json` is most of its
//! Secret) stay out of the cache, and the serde code for them out of the binary's hot
//! path. Secrets are still written as k8s-openapi `Secret`s.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Secret)]
#[serde(from = "Served")]
pub struct SecretView {
    /// Without its labels: they are in `labels`.
    pub metadata: ObjectMeta,
    /// The labels in key order: a map's node on the heap holds eleven entries however
    /// few it has (about half a kilobyte per cached Secret).
    pub labels: Vec<(String, String)>,
    /// Each data key with the hash of its value as served (base64 text), in key order.
    pub data: Vec<(String, u64)>,
}

/// A Secret as served, read into [`SecretView`].
#[derive(Deserialize)]
struct Served {
    metadata: ObjectMeta,
    #[serde(default, deserialize_with = "hashed")]
    data: Vec<(String, u64)>,
}

impl From<Served> for SecretView {
    fn from(mut s: Served) -> Self {
        let labels = s.metadata.labels.take().into_iter().flatten().collect();
        SecretView {
            metadata: s.metadata,
            labels,
            data: s.data,
        }
    }
}

/// The hash of one data value in its JSON form (base64 text). Compared only within this
/// process, so `DefaultHasher`'s fixed keys do.
fn value_hash(base64: &str) -> u64 {
    let mut h = DefaultHasher::new();
    base64.hash(&mut h);
    h.finish()
}

fn hashed<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, u64)>, D::Error> {
    let data: Option<BTreeMap<String, String>> = Option::deserialize(d)?;
    Ok(data
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let h = value_hash(&v);
            (k, h)
        })
        .collect())
}

impl SecretView {
    /// Whether this Secret already holds every label and data value of `desired`; labels
    /// and keys others added are ignored, as a server-side apply would leave them.
    pub fn holds(&self, desired: &Secret) -> bool {
        let labels_held = desired.metadata.labels.iter().flatten().all(|(k, v)| {
            self.labels
                .iter()
                .any(|(key, value)| key == k && value == v)
        });
        let data_held = desired.data.iter().flatten().all(|(k, v)| {
            let text = serde_json::to_value(v).unwrap_or_default();
            let want = value_hash(text.as_str().unwrap_or_default());
            self.data.iter().any(|(key, h)| key == k && *h == want)
        });
        labels_held && data_held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn desired(value: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("a-agent".into()),
                labels: Some(BTreeMap::from([("x".to_owned(), "1".to_owned())])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "config.json".to_owned(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn holds_compares_labels_and_data_hashes_and_ignores_what_others_added() {
        // As served: data base64-encoded, extra labels and keys.
        let served = r#"{"metadata": {"name": "a-agent", "labels": {"x": "1", "y": "2"}},
            "data": {"config.json": "e30=", "other": "eA=="}, "type": "Opaque"}"#;
        let view: SecretView = serde_json::from_str(served).unwrap();
        assert_eq!(view.data.len(), 2);
        assert!(view.holds(&desired("{}")));
        assert!(!view.holds(&desired("{ }")), "a changed value");
        let mut relabelled = desired("{}");
        relabelled.metadata.labels = Some(BTreeMap::from([("x".to_owned(), "2".to_owned())]));
        assert!(!view.holds(&relabelled), "a changed label");
        let none: SecretView =
            serde_json::from_str(r#"{"metadata": {"name": "a-agent"}}"#).unwrap();
        assert!(!none.holds(&desired("{}")), "no data");
    }
}
