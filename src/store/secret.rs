//! A Secret of ours as the manager reads it: who owns it, and a hash of each label and
//! data entry, never the data.
//!
//! The manager writes config Secrets (an Agent's, a Memory's) and only ever asks of the
//! cached copy "is it ours, and does it already hold what we would write?". A hash of each
//! entry answers the second question; the values (an Agent's `config.json` is most of its
//! Secret) stay out of the cache, and the serde code for them out of the binary's hot
//! path. Secrets are still written as k8s-openapi `Secret`s.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Secret)]
#[serde(from = "Served")]
pub struct SecretView {
    /// Without its labels: they are in `entries`.
    pub metadata: ObjectMeta,
    /// A hash of each label (key and value) and of each data key with its value as served
    /// (base64 text), in no particular order: the manager only asks whether an entry it
    /// would write is there. A map's node on the heap holds eleven entries however few it
    /// has; a pair of strings is two allocations more. One boxed slice, not two lists: it
    /// keeps a SecretView in its `Arc` within musl's 400-byte slot, not the 496
    /// (`cache::tests::cached_objects_fit_their_allocator_slots`).
    entries: Box<[u64]>,
}

/// A Secret as served, read into [`SecretView`].
#[derive(Deserialize)]
struct Served {
    metadata: ObjectMeta,
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
}

impl From<Served> for SecretView {
    fn from(mut s: Served) -> Self {
        let labels = s.metadata.labels.take().into_iter().flatten();
        let labels = labels.map(|(k, v)| entry_hash(Entry::Label, &k, &v));
        let data = s.data.into_iter().flatten();
        let data = data.map(|(k, v)| entry_hash(Entry::Data, &k, &v));
        SecretView {
            metadata: s.metadata,
            entries: labels.chain(data).collect(),
        }
    }
}

#[derive(Hash)]
enum Entry {
    Label,
    Data,
}

/// The hash of a label or data key and its value (a data value in its JSON form, base64
/// text). Compared only within this process, so `DefaultHasher`'s fixed keys do.
fn entry_hash(entry: Entry, key: &str, value: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (entry, key, value).hash(&mut h);
    h.finish()
}

impl SecretView {
    /// Whether this Secret already holds every label and data value of `desired`; labels
    /// and keys others added are ignored, as a server-side apply would leave them.
    pub fn holds(&self, desired: &Secret) -> bool {
        let labels_held = (desired.metadata.labels.iter().flatten())
            .all(|(k, v)| self.entries.contains(&entry_hash(Entry::Label, k, v)));
        let data_held = desired.data.iter().flatten().all(|(k, v)| {
            let text = serde_json::to_value(v).unwrap_or_default();
            let want = entry_hash(Entry::Data, k, text.as_str().unwrap_or_default());
            self.entries.contains(&want)
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
        assert_eq!(view.entries.len(), 4);
        assert!(view.holds(&desired("{}")));
        assert!(!view.holds(&desired("{ }")), "a changed value");
        let mut relabelled = desired("{}");
        relabelled.metadata.labels = Some(BTreeMap::from([("x".to_owned(), "2".to_owned())]));
        assert!(!view.holds(&relabelled), "a changed label");
        let mut renamed = desired("{}");
        renamed.data = Some(BTreeMap::from([(
            "other.json".to_owned(),
            ByteString(b"{}".to_vec()),
        )]));
        assert!(!view.holds(&renamed), "the value under another key");
        let none: SecretView =
            serde_json::from_str(r#"{"metadata": {"name": "a-agent"}}"#).unwrap();
        assert!(!none.holds(&desired("{}")), "no data");
        // A label is not a data entry of the same key and value, nor the other way round.
        let swapped: SecretView = serde_json::from_str(
            r#"{"metadata": {"name": "a-agent", "labels": {"config.json": "e30="}},
            "data": {"x": "1"}}"#,
        )
        .unwrap();
        assert!(!swapped.holds(&desired("{}")), "labels and data swapped");
    }
}
