//! The shipped binary is static (no ELF interpreter, no shared libraries) and small.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_autonomic-manager");

/// Reads the ELF64 program headers: (has PT_INTERP, has DT_NEEDED).
fn elf_links(bytes: &[u8]) -> (bool, bool) {
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(bytes[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    let (mut interp, mut needed) = (false, false);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(bytes[ph..ph + 4].try_into().unwrap());
        match p_type {
            3 => interp = true, // PT_INTERP
            2 => {
                // PT_DYNAMIC (static-pie has one for self-relocation): look for DT_NEEDED.
                let (off, size) = (u64_at(ph + 8), u64_at(ph + 32));
                needed |= bytes[off..off + size]
                    .chunks_exact(16)
                    .any(|e| u64::from_le_bytes(e[..8].try_into().unwrap()) == 1);
            }
            _ => {}
        }
    }
    (interp, needed)
}

#[test]
fn release_binary_is_statically_linked() {
    let bytes = std::fs::read(BIN).unwrap();
    assert_eq!(
        elf_links(&bytes),
        (false, false),
        "{BIN} is dynamically linked"
    );
    println!(
        "autonomic-manager: {} bytes ({:.2} MiB), static",
        bytes.len(),
        bytes.len() as f64 / 1048576.0
    );
}

#[test]
fn commands_and_bad_configuration() {
    let out = Command::new(BIN).arg("version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("autonomic-manager {}\n", env!("CARGO_PKG_VERSION"))
    );

    let out = Command::new(BIN).arg("crds").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        autonomic_manager::crd::crds_yaml()
    );

    let out = Command::new(BIN).arg("bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));

    // Each refusal: exit 2, exactly one line on stderr, before anything is dialled
    // (no KUBECONFIG either: it stops before looking for a cluster).
    for env in [
        vec![("AUTONOMIC_MANAGED", "perhaps")],
        vec![("AUTONOMIC_MANAGED", "true")],
        vec![("AUTONOMIC_BASE_URL", "not a url")],
        vec![("AUTONOMIC_BASE_URL", "http://cp.example.com")],
        vec![("AUTONOMIC_TRANSPORT", "carrier-pigeon")],
        // Leader election needs the Lease's namespace.
        vec![("AUTONOMIC_LEADER_ELECTION", "true")],
    ] {
        let out = Command::new(BIN)
            .env_clear()
            .envs(env.clone())
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{env:?}: {err}");
        assert!(
            err.starts_with("autonomic-manager: invalid configuration: "),
            "{err}"
        );
    }
}
