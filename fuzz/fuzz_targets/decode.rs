//! Arbitrary bytes into both decoders: nothing a peer sends may panic, every frame that
//! decodes survives a round trip, and every refusal yields a valid `error` answer.
#![no_main]

use autonomic_manager::internals::{self as frame, Frame};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    match frame::decode(&text) {
        Ok(Some(decoded)) => {
            let again = frame::decode(&frame::encode(&decoded));
            let Ok(Some(again)) = again else {
                panic!("{text:?} decoded but its encoding did not: {again:?}");
            };
            assert!(
                same(&json(&decoded), &json(&again)),
                "round trip of {text:?}: {decoded:?} became {again:?}"
            );
        }
        Ok(None) => {}
        Err(err) => {
            let answer = Frame::bad_frame(&err);
            assert_eq!(frame::decode(&frame::encode(&answer)), Ok(Some(answer)));
        }
    }

    if let Ok(chunk) = frame::decode_io(bytes) {
        assert_eq!(
            frame::encode_io(chunk.channel, chunk.stream, chunk.data),
            bytes
        );
    }
});

fn json(frame: &Frame) -> Value {
    serde_json::to_value(frame).expect("a Frame always serializes")
}

/// Equality, except that a float may come back one or two ULPs off: the main crate's
/// serde_json is built without `float_roundtrip`, so its parser may re-read the
/// shortest representation of a float (inside the opaque `resources`) a little off.
/// Every other value must be exactly equal.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() && y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
