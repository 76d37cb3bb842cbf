//! What this process is: its version and its boot id. The bottom layer, so the link's
//! `hello`, the report's `User-Agent` and the Lease identity read them without reaching
//! up into the application.

use std::sync::OnceLock;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// This process's boot id, drawn once: `hello` and the Lease identity carry the same.
pub fn boot_id() -> &'static str {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID.get_or_init(uuid_v4)
}

/// A random (version 4) UUID.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    // Without randomness (never seen in practice) fall back to the clock: ids stay unique
    // enough for an audit trail, and nothing may crash over it.
    let random = rustls::crypto::ring::default_provider().secure_random;
    if random.fill(&mut b).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b = nanos.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = uuid_v4();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, uuid_v4());
    }
}
