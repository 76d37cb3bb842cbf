//! The wire form's strings and numbers as JSON text, byte for byte what serde_json
//! writes.
//!
//! Hand-written for speed in a crate built for size: serde's writer instantiated here is
//! about three times slower than at full speed, and musl's `memcpy` is slow for the
//! few-byte copies JSON is made of, so short runs are copied in a loop.

/// A JSON string: runs that need no escape are copied whole.
pub(super) fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut rest = s.as_bytes();
    while let Some(i) = rest
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
    {
        put(out, &rest[..i]);
        match rest[i] {
            b'"' => put(out, b"\\\""),
            b'\\' => put(out, b"\\\\"),
            b'\n' => put(out, b"\\n"),
            b'\r' => put(out, b"\\r"),
            b'\t' => put(out, b"\\t"),
            0x08 => put(out, b"\\b"),
            0x0c => put(out, b"\\f"),
            b => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                put(out, b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        rest = &rest[i + 1..];
    }
    put(out, rest);
    out.push(b'"');
}

/// Short runs are copied in a plain loop: musl's `memcpy` is slow for a few bytes.
pub(super) fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.len() > 32 {
        out.extend_from_slice(bytes);
    } else {
        out.extend(bytes.iter().copied());
    }
}

pub(super) fn put_bool(out: &mut Vec<u8>, b: bool) {
    put(out, if b { b"true" } else { b"false" });
}

pub(super) fn put_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    put_u64(out, n.unsigned_abs());
}

/// Decimal digits without going through `fmt` and a `String`.
fn put_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    put(out, &digits[at..]);
}
