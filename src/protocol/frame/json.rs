//! A resource's wire form in a frame: written text, carried as it is.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A resource's wire form (§5) as the manager wrote it: JSON text, sent as it is, never
/// parsed into a tree to be written again. [`super::encode`] writes the `snapshot` and
/// `delta` frames that carry it around the text.
#[derive(Debug, Clone, PartialEq)]
pub struct Json(Box<str>);

impl Json {
    /// Text the wire form's writer wrote: one JSON value (its tests hold that).
    pub(crate) fn written(text: String) -> Json {
        Json(text.into_boxed_str())
    }

    /// The text.
    pub fn get(&self) -> &str {
        &self.0
    }
}

impl From<&Value> for Json {
    fn from(value: &Value) -> Json {
        Json(value.to_string().into_boxed_str())
    }
}

/// Through a tree: only a frame serialized by serde itself gets here (a test, a fake
/// control plane); the manager's [`super::encode`] writes the text as it is. serde can
/// hand raw text to its writer only through serde_json's `raw_value` feature, which
/// costs the binary about 55 KB (measured: a branch in every struct serialized into a
/// `Value`, and kube serializes every Kubernetes type it sends that way).
impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let value: Value = serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
        value.serialize(s)
    }
}

/// Read back through a tree (a frame's tag is read first, and serde cannot hand raw text
/// through that), so the text is serde_json's, keys sorted as the manager writes them.
/// Only tests and fake control planes read these frames.
impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        Ok(Json::from(&Value::deserialize(d)?))
    }
}
