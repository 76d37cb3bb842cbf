//! The crate's layers point one way (ARCHITECTURE.md): a module uses only modules of
//! lower layers, never its own layer's others or a higher one, so there is no cycle.
//! Read from the source: every `crate::<module>` path outside test code.

use std::collections::BTreeSet;
use std::path::Path;

/// Lowest first. `lib.rs` (the application) sits above them all.
const LAYERS: &[&[&str]] = &[
    &["text", "crd", "egress", "backoff", "process"],
    &["config", "audit", "metrics", "store"],
    &["cluster", "protocol"],
    &["reconcile"],
    &["connect"],
    &["health", "leader", "check"],
    &["cli"],
];

/// An item of `lib.rs` itself (`crate::VERSION`, `crate::Error`, `crate::boot_id`): the
/// application, above every layer.
const APP: usize = usize::MAX;

fn layer(name: &str) -> usize {
    if !is_module(name) {
        return APP;
    }
    LAYERS
        .iter()
        .position(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("module {name} is in no layer: add it to LAYERS"))
}

/// Whether `crate::<name>` is a module of `src/` (a file or a folder), not an item of
/// `lib.rs`.
fn is_module(name: &str) -> bool {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    src.join(format!("{name}.rs")).is_file() || src.join(name).join("mod.rs").is_file()
}

/// The modules a source text names as `crate::<module>`, test code excluded.
fn uses(source: &str) -> BTreeSet<String> {
    let code = source
        .find("#[cfg(test)]\nmod ")
        .map_or(source, |i| &source[..i]);
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        assert!(
            !rest.starts_with('{'),
            "`crate::{{…}}` is not scanned: write one `use` per module"
        );
        // Every name: a module's, or an item of `lib.rs` (`crate::VERSION`,
        // `crate::Error`, `crate::boot_id()`), which is the application's.
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.insert(name);
        }
    }
    found
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_uses_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut wrong = Vec::new();
    let mut edges = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs");
        if top == "lib" || top == "main" {
            continue;
        }
        let source = std::fs::read_to_string(file).unwrap();
        for used in uses(&source) {
            if used == top {
                continue;
            }
            edges += 1;
            if layer(&used) >= layer(top) {
                wrong.push(format!("{} uses crate::{used}", rel.display()));
            }
        }
    }
    assert!(
        edges > 20,
        "the scan found only {edges} edges: is it reading the source?"
    );
    assert!(
        wrong.is_empty(),
        "layers pointing the wrong way:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_scan_sees_uses_and_skips_tests() {
    let source = "use crate::store::Store;\nfn f() { crate::text::cap(); crate::boot_id(); crate::VERSION; }\n#[cfg(test)]\nmod tests { use crate::connect::x; }";
    assert_eq!(
        uses(source).into_iter().collect::<Vec<_>>(),
        ["VERSION", "boot_id", "store", "text"]
    );
    // The application's items are above every layer: a module naming one points up.
    assert_eq!(layer("boot_id"), APP);
    assert_eq!(layer("Error"), APP);
    assert_eq!(layer("process"), 0);
}
