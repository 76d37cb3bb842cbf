//! One link flag for the shipped binary.
//!
//! The musl target links a static PIE: the binary stays position-independent (ASLR), and
//! musl's start code applies its relocations. Those are about 0.7 MB of `.rela.dyn` in
//! the classic format; packed as DT_RELR (binutils >= 2.38; musl >= 1.2.4, which the Rust
//! toolchain's self-contained musl is) they take a few KB. BENCHMARKS.md has the sizes.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // x86_64 only: zig's linker driver (the aarch64 cross-build, scripts/build-arm64)
    // refuses `-z pack-relative-relocs`, and that musl binary links as a non-PIE static
    // executable, which has no relative relocations to pack.
    let env = std::env::var("CARGO_CFG_TARGET_ENV");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH");
    if env.as_deref() == Ok("musl") && arch.as_deref() == Ok("x86_64") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
