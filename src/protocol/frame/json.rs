//! A resource's wire form in a frame: written text, carried as it is.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// A resource's wire form (§5) as the manager wrote it: JSON text, sent as it is, never
/// parsed into a tree to be written again.
#[derive(Debug, Clone)]
pub struct Json(Box<RawValue>);

impl Json {
    /// `text` if it is one JSON value.
    pub fn new(text: String) -> Result<Json, serde_json::Error> {
        RawValue::from_string(text).map(Json)
    }

    /// The text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Json) -> bool {
        self.get() == other.get()
    }
}

impl From<&Value> for Json {
    fn from(value: &Value) -> Json {
        // Cannot fail: string map keys, and a `Value` holds no NaN or infinity.
        Json(serde_json::value::to_raw_value(value).expect("a Value always serializes"))
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
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
