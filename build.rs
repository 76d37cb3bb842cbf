//! Build-time facts for the shipped binary.
//!
//! - One link flag. The musl target links a static PIE: the binary stays
//!   position-independent (ASLR), and musl's start code applies its relocations. Those are
//!   about 0.7 MB of `.rela.dyn` in the classic format; packed as DT_RELR (binutils >= 2.38;
//!   musl >= 1.2.4, which the Rust toolchain's self-contained musl is) they take a few KB.
//!   BENCHMARKS.md has the sizes.
//! - What `autonomic-manager version` prints besides the crate version: the git revision
//!   (`AUTONOMIC_BUILD_REVISION`) and the target triple (`AUTONOMIC_BUILD_TARGET`).
//!
//! The revision is `git rev-parse --short=12 HEAD`, with `+dirty` when tracked files differ
//! from it; `AUTONOMIC_REVISION` overrides it (builds from a tarball, or a CI that knows
//! better); outside a git checkout it is `unknown`. The script reruns only when `HEAD`, the
//! branch it points to or `packed-refs` change (a commit or a checkout), or the override
//! does: never on an edit, because every rerun recompiles the crate. So `+dirty` says
//! whether the tree was dirty when HEAD last moved, which is exact for the builds that
//! matter (a clean checkout in CI) and a hint otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=AUTONOMIC_BUILD_TARGET={target}");

    println!("cargo:rerun-if-env-changed=AUTONOMIC_REVISION");
    let revision = match std::env::var("AUTONOMIC_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_owned(),
        _ => git_revision().unwrap_or_else(|| "unknown".into()),
    };
    println!("cargo:rustc-env=AUTONOMIC_BUILD_REVISION={revision}");
}

/// `git ARGS` in the package directory; its trimmed stdout when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn git_revision() -> Option<String> {
    let revision = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Rerun when HEAD moves: HEAD itself (a checkout), the branch it names (a commit) and
    // packed-refs (where a branch lives after `git gc`). A worktree has its own HEAD in
    // its git dir and shares the branches in the common dir. Only existing paths: cargo
    // reruns every time for one that is missing.
    let git_dir = PathBuf::from(git(&["rev-parse", "--absolute-git-dir"])?);
    let common = git(&["rev-parse", "--git-common-dir"])
        .map(|d| absolute(&git_dir, &d))
        .unwrap_or_else(|| git_dir.clone());
    let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common.join(&branch));
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    // Tracked files only: untracked files do not change what is built.
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{revision}+dirty")
    } else {
        revision
    })
}

/// `--git-common-dir` may be relative to the package directory.
fn absolute(git_dir: &Path, dir: &str) -> PathBuf {
    let path = PathBuf::from(dir);
    if path.is_absolute() {
        return path;
    }
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(|m| PathBuf::from(m).join(&path))
        .unwrap_or_else(|| git_dir.join(path))
}
