//! The CRD YAML in `crds/` and the chart's `crds/` is what the Rust types generate
//! (`deploy.yaml` carries the chart's: tests/chart.rs).

use autonomic_manager::crd;

const FIX: &str = "run scripts/gen-crds and commit the result";

/// `scripts/gen-crds` sets this: the files are rewritten from the types, then compared.
fn updating() -> bool {
    std::env::var_os("AUTONOMIC_UPDATE_CRDS").is_some()
}

/// Rewrites (when updating) and checks one folder of CRD files against the types.
fn check_dir(dir: &str) {
    let files = crd::crd_files();
    assert_eq!(files.len(), 4);
    if updating() {
        std::fs::create_dir_all(dir).unwrap();
        for entry in std::fs::read_dir(dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        for (name, yaml) in &files {
            std::fs::write(format!("{dir}/{name}"), yaml).unwrap();
        }
    }
    for (name, want) in &files {
        let have = std::fs::read_to_string(format!("{dir}/{name}"))
            .unwrap_or_else(|e| panic!("{dir}/{name}: {e}; {FIX}"));
        assert_eq!(&have, want, "{dir}/{name} drifted from the types; {FIX}");
    }
    let on_disk = std::fs::read_dir(dir).unwrap().count();
    assert_eq!(on_disk, files.len(), "stray files in {dir}; {FIX}");
}

#[test]
fn crds_dir_matches_the_types() {
    check_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/crds"));
}

/// Where Helm expects CRDs: installed before the templates, never upgraded or deleted
/// by Helm (docs/install.md says how to upgrade them).
#[test]
fn the_charts_crds_are_the_same() {
    check_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/autonomic/crds"
    ));
}

#[test]
fn crds_are_useful_to_kubectl() {
    for c in crd::crds() {
        let name = c.metadata.name.clone().unwrap();
        assert_eq!(c.spec.group, "autonomic.sh");
        assert_eq!(c.spec.scope, "Namespaced");
        assert!(
            c.spec
                .names
                .short_names
                .as_ref()
                .is_some_and(|s| !s.is_empty()),
            "{name}: short name"
        );
        let v = &c.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{name}: status subresource"
        );
        let cols: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert!(
            cols.contains(&"Phase") && cols.contains(&"Age"),
            "{name}: {cols:?}"
        );
        // `kubectl explain` needs descriptions on the spec's fields.
        let schema = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for (field, s) in spec.as_object().unwrap() {
            assert!(
                s.get("description").is_some(),
                "{name}: spec.{field} has no description"
            );
        }
    }
}
