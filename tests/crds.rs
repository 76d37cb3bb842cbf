//! The CRD YAML in `crds/` and `deploy.yaml` is what the Rust types generate.

use autonomic_manager::crd;

const FIX: &str = "run scripts/gen-crds and commit the result";

/// `scripts/gen-crds` sets this: the files are rewritten from the types, then compared.
fn updating() -> bool {
    std::env::var_os("AUTONOMIC_UPDATE_CRDS").is_some()
}

#[test]
fn crds_dir_matches_the_types() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/crds");
    let files = crd::crd_files();
    assert_eq!(files.len(), 4);
    if updating() {
        for entry in std::fs::read_dir(dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        for (name, yaml) in &files {
            std::fs::write(format!("{dir}/{name}"), yaml).unwrap();
        }
    }
    for (name, want) in &files {
        let have = std::fs::read_to_string(format!("{dir}/{name}"))
            .unwrap_or_else(|e| panic!("crds/{name}: {e}; {FIX}"));
        assert_eq!(&have, want, "crds/{name} drifted from the types; {FIX}");
    }
    let on_disk = std::fs::read_dir(dir).unwrap().count();
    assert_eq!(on_disk, files.len(), "stray files in crds/; {FIX}");
}

#[test]
fn deploy_yaml_carries_the_same_crds() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy.yaml");
    let (begin, end) = (
        "# --- BEGIN CRDs (scripts/gen-crds) ---\n",
        "# --- END CRDs ---\n",
    );
    let mut deploy = std::fs::read_to_string(path).unwrap();
    let split = |d: &str| -> Option<(String, String, String)> {
        let (head, rest) = d.split_once(begin)?;
        let (crds, tail) = rest.split_once(end)?;
        Some((head.into(), crds.into(), tail.into()))
    };
    if updating() {
        let (head, _, tail) = split(&deploy).expect("deploy.yaml has a CRD section");
        deploy = format!("{head}{begin}{}{end}{tail}", crd::crds_yaml());
        std::fs::write(path, &deploy).unwrap();
    }
    let (_, section, _) = split(&deploy).expect("deploy.yaml has a CRD section");
    assert_eq!(
        section,
        crd::crds_yaml(),
        "deploy.yaml's CRDs drifted; {FIX}"
    );
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
