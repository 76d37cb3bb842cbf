//! The multi-arch image `scripts/image` writes (and `scripts/test` before the suite):
//! an OCI layout at target/image/oci whose image is one index listing linux/amd64 and
//! linux/arm64, each manifest holding that platform's static binary, the OCI labels and
//! annotations, and each platform's CycloneDX SBOM attached as a referrer. A missing
//! layout fails these tests: they never skip.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CYCLONEDX: &str = "application/vnd.cyclonedx+json";

fn layout() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/image/oci");
    assert!(
        dir.join("index.json").is_file(),
        "{} holds no OCI layout: run the suite with scripts/test, or scripts/image first",
        dir.display()
    );
    dir
}

fn blob(layout: &Path, desc: &Value) -> Vec<u8> {
    let digest = desc["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let bytes = std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    assert_eq!(
        bytes.len() as u64,
        desc["size"].as_u64().unwrap(),
        "{digest}: size"
    );
    assert_eq!(sha256(&bytes), hex, "{digest}: content");
    bytes
}

fn json(layout: &Path, desc: &Value) -> Value {
    serde_json::from_slice(&blob(layout, desc)).unwrap()
}

/// sha256sum from coreutils: the project has no hashing crate of its own to reuse.
fn sha256(bytes: &[u8]) -> String {
    pipe("sha256sum", &[], bytes)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn pipe(program: &str, args: &[&str], input: &[u8]) -> String {
    String::from_utf8(pipe_bytes(program, args, input)).unwrap()
}

fn pipe_bytes(program: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{program} failed");
    out.stdout
}

/// The regular files of an (uncompressed) tar: name → content.
fn tar_files(tar: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at..at + 512].iter().any(|&b| b != 0) {
        let h = &tar[at..at + 512];
        let field = |r: std::ops::Range<usize>| {
            let s = &h[r];
            String::from_utf8_lossy(&s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())])
                .into_owned()
        };
        let size = usize::from_str_radix(field(124..136).trim(), 8).unwrap();
        let name = match field(345..500) {
            prefix if prefix.is_empty() => field(0..100),
            prefix => format!("{prefix}/{}", field(0..100)),
        };
        if matches!(h[156], b'0' | 0) {
            files.insert(
                name.trim_start_matches("./").to_owned(),
                tar[at + 512..at + 512 + size].to_vec(),
            );
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    files
}

/// e_machine of an ELF file.
fn elf_machine(bytes: &[u8]) -> u16 {
    assert_eq!(&bytes[..4], b"\x7fELF");
    u16::from_le_bytes([bytes[0x12], bytes[0x13]])
}

#[test]
fn image_index_lists_both_platforms_with_labels_and_sboms() {
    let layout = layout();
    let version = env!("CARGO_PKG_VERSION");
    let oci_layout: Value =
        serde_json::from_slice(&std::fs::read(layout.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
    let top: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let entries = top["manifests"].as_array().unwrap();

    // The image: an index, named by its version, for containerd too.
    let image = entries
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == version)
        .expect("an image tagged with the crate's version");
    assert_eq!(image["mediaType"], INDEX);
    assert_eq!(
        image["annotations"]["io.containerd.image.name"],
        format!("ghcr.io/autonomic-sh/autonomic-manager:{version}")
    );
    let index = json(&layout, image);
    assert_eq!(index["mediaType"], INDEX);
    let ann = &index["annotations"];
    assert_eq!(ann["org.opencontainers.image.title"], "autonomic-manager");
    assert_eq!(ann["org.opencontainers.image.version"], version);
    assert_eq!(ann["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(
        ann["org.opencontainers.image.source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{ann}"
    );
    let revision = ann["org.opencontainers.image.revision"].as_str().unwrap();
    assert!(
        revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()),
        "revision {revision:?} is not a commit"
    );

    let platforms: Vec<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let p = &m["platform"];
            (
                p["os"].as_str().unwrap().to_owned(),
                p["architecture"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("linux".into(), "amd64".into()),
            ("linux".into(), "arm64".into())
        ],
        "the index's platforms"
    );

    for m in index["manifests"].as_array().unwrap() {
        let arch = m["platform"]["architecture"].as_str().unwrap();
        assert_eq!(m["mediaType"], MANIFEST);
        let manifest = json(&layout, m);
        let config = json(&layout, &manifest["config"]);
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["os"], "linux");
        let c = &config["config"];
        assert_eq!(c["Entrypoint"], serde_json::json!(["/autonomic-manager"]));
        assert_eq!(c["User"], "65532:65532");
        for key in ["title", "source", "revision", "version", "licenses"] {
            let key = format!("org.opencontainers.image.{key}");
            assert_eq!(c["Labels"][&key], ann[&key], "{arch}: label {key}");
        }

        // FROM scratch: one layer, the binary of this platform and nothing else.
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "{arch}: {layers:?}");
        let gz = blob(&layout, &layers[0]);
        let tar = match layers[0]["mediaType"].as_str().unwrap() {
            "application/vnd.oci.image.layer.v1.tar+gzip" => pipe_bytes("gzip", &["-dc"], &gz),
            "application/vnd.oci.image.layer.v1.tar" => gz,
            other => panic!("{arch}: layer type {other}"),
        };
        assert_eq!(
            format!("sha256:{}", sha256(&tar)),
            config["rootfs"]["diff_ids"][0],
            "{arch}: diff_id"
        );
        let files = tar_files(&tar);
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["autonomic-manager"],
            "{arch}"
        );
        let bin = &files["autonomic-manager"];
        let machine = elf_machine(bin);
        assert_eq!(
            machine,
            if arch == "amd64" { 62 } else { 183 },
            "{arch}: ELF machine"
        );

        // Its SBOM: an artifact whose subject is this manifest, describing this binary.
        let sbom_manifest = entries
            .iter()
            .filter(|e| e["artifactType"] == CYCLONEDX)
            .map(|e| json(&layout, e))
            .find(|a| a["subject"]["digest"] == m["digest"])
            .unwrap_or_else(|| panic!("{arch}: no SBOM refers to its manifest"));
        assert_eq!(sbom_manifest["mediaType"], MANIFEST);
        assert_eq!(
            sbom_manifest["config"]["mediaType"],
            "application/vnd.oci.empty.v1+json"
        );
        let layer = &sbom_manifest["layers"][0];
        assert_eq!(layer["mediaType"], CYCLONEDX);
        let sbom = json(&layout, layer);
        check_sbom(&sbom, arch, &sha256(bin));
        // The same document ships beside the layout.
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
            "target/image/sbom/autonomic-manager-linux-{arch}.cdx.json"
        ));
        assert_eq!(
            std::fs::read(&beside).unwrap(),
            blob(&layout, layer),
            "{}",
            beside.display()
        );
    }
}

fn check_sbom(sbom: &Value, arch: &str, bin_sha256: &str) {
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    let described = &sbom["metadata"]["component"];
    assert_eq!(described["type"], "container");
    assert_eq!(described["name"], "ghcr.io/autonomic-sh/autonomic-manager");
    let components = sbom["components"].as_array().unwrap();
    let find = |name: &str| {
        components
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{arch}: no component {name} in the SBOM"))
    };
    let app = find("autonomic-manager");
    assert_eq!(app["type"], "application");
    assert_eq!(app["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        app["hashes"][0]["content"], bin_sha256,
        "{arch}: the binary's hash"
    );
    let target = if arch == "amd64" { "x86_64" } else { "aarch64" };
    assert!(
        app["properties"]
            .to_string()
            .contains(&format!("{target}-unknown-linux-musl"))
    );
    // Linked crates, with their licence, purl and the hash Cargo.lock pins; no proc
    // macros (they run in the compiler) and no dev-dependencies.
    for name in ["tokio", "kube-client", "rustls", "ring", "serde_json"] {
        let c = find(name);
        assert!(
            c["purl"]
                .as_str()
                .unwrap()
                .starts_with(&format!("pkg:cargo/{name}@"))
        );
        assert!(c["licenses"][0]["expression"].is_string(), "{name}: {c}");
        assert_eq!(c["hashes"][0]["alg"], "SHA-256", "{name}");
    }
    for absent in ["serde_derive", "syn", "prometheus-parse"] {
        assert!(
            components.iter().all(|c| c["name"] != absent),
            "{arch}: {absent} is not linked but is in the SBOM"
        );
    }
    assert!(
        components.len() > 100,
        "{arch}: {} components",
        components.len()
    );
}
