//! The bound on a custom resource's spec (TRUST.md §3): one tenant's megabyte specs must
//! not starve the others of the manager's memory.
//!
//! [`super::Cache::insert`] measures the spec of every Agent, Tool, Runtime and Memory it
//! is handed, as JSON, without writing the text anywhere (a counting writer). One over
//! the bound is kept as a stub: its metadata and status as they are, its spec replaced by
//! the kind's default, and the annotation [`SPEC_BYTES`] saying so. The reconcilers see
//! the annotation ([`Oversized::of`]), reconcile nothing and say why (`Error`, reason
//! `SpecTooLarge`). The object's change brings it again, measured again: a spec cut down
//! below the bound is reconciled as any other.
//!
//! The annotation is the store's alone: one an object carries when it arrives (a tenant
//! may set any annotation on its objects) is removed before the spec is measured, so a
//! small object cannot pass for a stub, nor a stub for a small object.

use std::any::Any;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::object::HasSpec;

use crate::crd::{Agent, Memory, Runtime, Tool};

/// The annotation on a custom resource the store keeps as a stub:
/// `<the spec's size as JSON>/<the bound>`, in bytes (`1048576/262144`).
pub const SPEC_BYTES: &str = "autonomic.sh/spec-bytes";

/// A custom resource whose spec was over the bound: the store kept none of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oversized {
    /// The spec's size as JSON.
    pub bytes: u64,
    /// The bound it was over (`AUTONOMIC_MAX_SPEC_BYTES`).
    pub max: u64,
}

impl Oversized {
    /// Whether the object, as the store keeps it, is a stub, and of how large a spec.
    pub fn of(meta: &ObjectMeta) -> Option<Oversized> {
        let value = meta.annotations.as_ref()?.get(SPEC_BYTES)?;
        let (bytes, max) = value.split_once('/')?;
        Some(Oversized {
            bytes: bytes.parse().ok()?,
            max: max.parse().ok()?,
        })
    }
}

/// Counts what is written to it and keeps nothing.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of `value` as JSON, in bytes, the text never held.
pub(super) fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> u64 {
    let mut counter = Counter(0);
    // Writing to a counter cannot fail, and the specs' types serialize (a map's keys are
    // strings): an error would only stop the count short.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Keeps `obj` within the bound `max` if it is one of the four custom resources (see the
/// module's comment); any other kind is left as it is. The cache holds objects of any
/// watched kind: this is where it tells the four apart, by type.
pub(super) fn bound<K: Any>(obj: &mut K, max: u64) {
    let obj: &mut dyn Any = obj;
    if let Some(agent) = obj.downcast_mut::<Agent>() {
        stub_if_over(agent, max);
    } else if let Some(tool) = obj.downcast_mut::<Tool>() {
        stub_if_over(tool, max);
    } else if let Some(runtime) = obj.downcast_mut::<Runtime>() {
        stub_if_over(runtime, max);
    } else if let Some(memory) = obj.downcast_mut::<Memory>() {
        stub_if_over(memory, max);
    }
}

/// Removes any [`SPEC_BYTES`] the object came with, measures its spec and, over `max`,
/// replaces it by its default and records its size.
fn stub_if_over<K>(obj: &mut K, max: u64)
where
    K: Resource + HasSpec,
    K::Spec: serde::Serialize + Default,
{
    let meta = obj.meta_mut();
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(SPEC_BYTES);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    let bytes = json_len(obj.spec());
    if bytes <= max {
        return;
    }
    *obj.spec_mut() = K::Spec::default();
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(SPEC_BYTES.to_owned(), format!("{bytes}/{max}"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DEFAULT_MAX_SPEC_BYTES;
    use crate::store::{Cache, PodView, Store};

    fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
        serde_json::to_value(value).unwrap()
    }

    fn of<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
        serde_json::from_value(value).unwrap()
    }

    /// An Agent whose spec is exactly `size` bytes as JSON (an arg padded to fit).
    fn agent_of(size: u64) -> Agent {
        let mut a: Agent = serde_json::from_value(serde_json::json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "7",
                         "labels": {"team": "x"}},
            "spec": {"runtime": {"image": "rt:1", "args": [""]}, "tools": ["t"]},
            "status": {"phase": "Active", "message": "running and ready"},
        }))
        .unwrap();
        let base = json_len(&a.spec);
        let pad = usize::try_from(size.checked_sub(base).expect("a spec that small")).unwrap();
        a.spec.runtime.args = Some(["x".repeat(pad)].into());
        assert_eq!(json_len(&a.spec), size);
        a
    }

    #[test]
    fn json_len_is_the_length_of_the_text() {
        let a = agent_of(1000);
        assert_eq!(
            json_len(&a.spec),
            serde_json::to_vec(&a.spec).unwrap().len() as u64
        );
        assert_eq!(json_len("é\"\n"), "\"é\\\"\\n\"".len() as u64);
    }

    /// Under and at the bound a spec is kept whole; one byte over, the store keeps the
    /// metadata and the status, the default spec and the size.
    #[test]
    fn a_spec_over_the_bound_is_kept_as_a_stub() {
        let max = 4096;
        let store = Store::with_max_spec_bytes(max);
        for size in [max - 1, max] {
            let a = agent_of(size);
            let kept = store.agents.insert(a.clone());
            assert_eq!(
                json(&*kept),
                json(&a),
                "a spec of {size} bytes, bound {max}"
            );
            assert_eq!(Oversized::of(&kept.metadata), None);
        }
        let a = agent_of(max + 1);
        let kept = store.agents.insert(a.clone());
        assert_eq!(kept.spec, Default::default());
        assert_eq!(kept.status, a.status);
        assert_eq!(kept.metadata.labels, a.metadata.labels);
        assert_eq!(kept.metadata.uid, a.metadata.uid);
        assert_eq!(kept.metadata.resource_version, a.metadata.resource_version);
        assert_eq!(
            Oversized::of(&kept.metadata),
            Some(Oversized {
                bytes: max + 1,
                max
            })
        );
        assert_eq!(
            kept.metadata.annotations.as_ref().unwrap()[SPEC_BYTES],
            "4097/4096"
        );
        // The same object cut down is kept whole again.
        let kept = store.agents.insert(agent_of(max));
        assert_eq!(Oversized::of(&kept.metadata), None);
        assert!(kept.metadata.annotations.is_none());
    }

    /// Each of the four kinds is bounded; the default bound is 256 KiB.
    #[test]
    fn every_kind_is_bounded_and_the_default_is_256_kib() {
        let store = Store::default();
        let big = "x".repeat(usize::try_from(DEFAULT_MAX_SPEC_BYTES).unwrap());
        let meta = |kind: &str, spec: serde_json::Value| {
            serde_json::json!({"apiVersion": "autonomic.sh/v1alpha1", "kind": kind,
                               "metadata": {"name": "x", "namespace": "n"}, "spec": spec})
        };
        let agent: Agent = of(meta(
            "Agent",
            serde_json::json!({"runtime": {"image": big}}),
        ));
        let tool: Tool = of(meta("Tool", serde_json::json!({"image": big})));
        let runtime: Runtime = of(meta("Runtime", serde_json::json!({"image": big})));
        let memory: Memory = of(meta("Memory", serde_json::json!({"backend": big})));
        let sizes = [
            Oversized::of(&store.agents.insert(agent).metadata),
            Oversized::of(&store.tools.insert(tool).metadata),
            Oversized::of(&store.runtimes.insert(runtime).metadata),
            Oversized::of(&store.memories.insert(memory).metadata),
        ];
        for (kind, size) in ["Agent", "Tool", "Runtime", "Memory"].iter().zip(sizes) {
            let size = size.unwrap_or_else(|| panic!("{kind} kept whole"));
            assert_eq!(size.max, DEFAULT_MAX_SPEC_BYTES, "{kind}");
            assert!(size.bytes > DEFAULT_MAX_SPEC_BYTES, "{kind}");
        }
        assert_eq!(store.tools.get("n", "x").unwrap().spec, Default::default());
        assert_eq!(
            store.memories.get("n", "x").unwrap().spec,
            Default::default()
        );
    }

    /// A tenant's own `autonomic.sh/spec-bytes` is dropped: a small object is not taken
    /// for a stub, and a large one is measured all the same.
    #[test]
    fn the_marker_is_the_stores_alone() {
        let store = Store::with_max_spec_bytes(4096);
        let mut forged = agent_of(1000);
        forged.metadata.annotations = Some(BTreeMap::from([
            (SPEC_BYTES.to_owned(), "999999/1".to_owned()),
            ("autonomic.sh/other".to_owned(), "kept".to_owned()),
        ]));
        let kept = store.agents.insert(forged.clone());
        assert_eq!(Oversized::of(&kept.metadata), None);
        assert_eq!(kept.spec, forged.spec);
        assert_eq!(
            kept.metadata.annotations,
            Some(BTreeMap::from([(
                "autonomic.sh/other".to_owned(),
                "kept".to_owned()
            )]))
        );
        let mut large = agent_of(5000);
        large.metadata.annotations =
            Some(BTreeMap::from([(SPEC_BYTES.to_owned(), "1/1".to_owned())]));
        let kept = store.agents.insert(large);
        assert_eq!(
            Oversized::of(&kept.metadata),
            Some(Oversized {
                bytes: 5000,
                max: 4096
            })
        );
        // Other kinds are not measured, whatever they carry.
        let pods: Cache<PodView> = Cache::default();
        let pod: PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n"}, "spec": {"nodeName": big_name()},
        }))
        .unwrap();
        assert_eq!(*pods.insert(pod.clone()), pod);
    }

    fn big_name() -> String {
        "n".repeat(300 << 10)
    }

    #[test]
    fn a_marker_that_does_not_parse_is_no_stub() {
        for value in ["", "12", "a/b", "12/", "/12", "-1/2"] {
            let meta = ObjectMeta {
                annotations: Some(BTreeMap::from([(SPEC_BYTES.to_owned(), value.to_owned())])),
                ..Default::default()
            };
            assert_eq!(Oversized::of(&meta), None, "{value:?}");
        }
    }
}
