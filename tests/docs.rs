//! The docs stay true to the tests: every command in the docs' `sh` blocks is one a test
//! runs (asked for through `support::docs::doc_command`, so the test runs the docs' own
//! words), or is listed in [`NOT_RUN_LITERALLY`] with the reason and the test that runs
//! its equivalent; every test `SECURITY.md` names exists. No cluster: this reads files.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::docs;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Documented commands no test runs word for word, each with why and what runs instead.
/// Keep it short: a command belongs here only when running it literally would test the
/// bed rather than the product.
const NOT_RUN_LITERALLY: &[(&str, &str)] = &[
    (
        "scripts/test",
        "the command that runs this suite; CI (.ci/run) runs it on a clean clone",
    ),
    (
        "scripts/dev",
        "a manager over the whole cluster with the admin's kubeconfig, for a person to watch: in the \
         suite it would reconcile every other test's namespace; `DEMO_ONCE=1 scripts/dev` runs it \
         once by hand",
    ),
    (
        "scripts/build-arm64",
        "scripts/test runs it before the suite (tests/arm64.rs runs its binary under qemu)",
    ),
    (
        "scripts/image",
        "scripts/test runs it before the suite (tests/image.rs and tests/mirror.rs use its output)",
    ),
    (
        "kubectl apply --server-side -f deploy.yaml",
        "tests/deploy.rs applies deploy.yaml server-side into a namespace of its own",
    ),
    (
        "helm install autonomic oci://registry.example.com",
        "the air-gapped install from oci:// (tests/mirror.rs, literally) without the registry override",
    ),
];

/// The first words each test asks `doc_command` for, read from the tests' sources.
fn asked_for() -> BTreeSet<String> {
    let mut prefixes = BTreeSet::new();
    for entry in std::fs::read_dir(Path::new(ROOT).join("tests")).unwrap() {
        let path = entry.unwrap().path();
        // This file names the call in its own text; it runs none.
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("docs.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for call in source.split("doc_command(").skip(1) {
            let call = call.trim_start();
            if let Some(literal) = call.strip_prefix('"') {
                prefixes.insert(literal.split('"').next().unwrap().to_owned());
            }
        }
    }
    prefixes
}

#[test]
fn every_documented_command_is_run_by_a_test() {
    let asked = asked_for();
    let all = docs::all();
    assert!(all.len() > 20, "the docs' commands were not found: {all:?}");
    let unrun: Vec<_> = all
        .iter()
        .filter(|(_, c)| {
            !asked.iter().any(|p| c.starts_with(p.as_str()))
                && !NOT_RUN_LITERALLY.iter().any(|(p, _)| c.starts_with(p))
        })
        .collect();
    assert!(
        unrun.is_empty(),
        "documented commands no test runs (ask for them with support::docs::doc_command, \
         or say in NOT_RUN_LITERALLY why not):\n{unrun:#?}"
    );
    // Nothing stale: each prefix names a documented command.
    let stale: Vec<&str> = asked
        .iter()
        .map(String::as_str)
        .chain(NOT_RUN_LITERALLY.iter().map(|(p, _)| *p))
        .filter(|p| !all.iter().any(|(_, c)| c.starts_with(p)))
        .collect();
    assert!(
        stale.is_empty(),
        "prefixes that match no documented command: {stale:?}"
    );
}

/// The reader: blocks, continuations and comments, on a sample written for it.
#[test]
fn commands_are_read_from_sh_blocks_only() {
    let page = "text\n```sh\n# a comment\nhelm upgrade a b \\\n  --set x=1 \\\n  --set y=2   # why\n\nkubectl get pods\n```\n```yaml\nkind: Pod\n```\n```\nnot a command\n```\n";
    assert_eq!(
        docs::commands_of(page),
        ["helm upgrade a b --set x=1 --set y=2", "kubectl get pods"]
    );
}

/// `SECURITY.md` maps each guarantee to a test by name: `file::name` in `tests/`,
/// `src/…::name` a unit test, a bare `src/…` path a file of them. Each must exist, or
/// the table claims a test nobody runs.
#[test]
fn every_test_security_md_names_exists() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("SECURITY.md")).unwrap();
    let named: BTreeSet<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            (s.contains("::") || (s.starts_with("src/") && s.ends_with(".rs")))
                && !s.contains(' ')
                && *s != "file::name"
                && !s.contains('…')
        })
        .collect();
    assert!(
        named.len() > 20,
        "SECURITY.md's tests were not found: {named:?}"
    );
    let mut missing = Vec::new();
    for name in &named {
        let (file, test) = match name.rsplit_once("::") {
            Some((f, t)) if f.starts_with("src/") => (f.to_owned(), Some(t)),
            Some((f, t)) => (format!("tests/{f}.rs"), Some(t)),
            None => (name.to_string(), None),
        };
        let Ok(source) = std::fs::read_to_string(Path::new(ROOT).join(&file)) else {
            missing.push(format!("{name}: no file {file}"));
            continue;
        };
        if let Some(test) = test.filter(|t| *t != "*")
            && !source.contains(&format!("fn {test}("))
        {
            missing.push(format!("{name}: no fn {test} in {file}"));
        }
    }
    assert!(
        missing.is_empty(),
        "SECURITY.md names what is not there:\n{missing:#?}"
    );
}
