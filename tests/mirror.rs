//! The air-gapped install as a user runs it, on the bed: Debian's `docker-registry` (the
//! CNCF distribution registry) on loopback is the mirror; `skopeo copy --all` copies the
//! multi-arch image from the OCI layout `target/image/oci` into it; `scripts/chart-repo
//! --oci` pushes the chart there; `helm install … oci://…` with `global.imageRegistry`
//! pointing at the mirror; and the bed's containerd pulls the manager's image from it,
//! under a name only that registry can supply. A mirror that cannot be reached fails
//! `helm install` with Helm's own error and leaves no release.
//!
//! The packages come from `ensure_mirror_tools` (scripts/lib.sh); the layout from
//! `scripts/image` (scripts/test runs both first).

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use support::docs::doc_command;
use support::*;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The image the manager's (one) pod in `ns` runs.
async fn running_image(ns: &TestNamespace) -> String {
    let pod = ns
        .manager_pods()
        .await
        .into_iter()
        .next()
        .expect("a manager pod");
    pod.status.unwrap().container_statuses.unwrap()[0]
        .image
        .clone()
}

/// A GET on 127.0.0.1:port; the status and the body.
fn get(port: u16, path: &str, accept: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// The registry, its log, and the containerd hosts entry that lets the bed pull from it
/// over plain HTTP; all stopped or removed on drop.
struct Mirror {
    port: u16,
    child: Child,
    log: PathBuf,
    hosts: PathBuf,
}

impl Mirror {
    async fn start(work: &Path) -> Mirror {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = work.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: info}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
                work.join("storage").display()
            ),
        )
        .unwrap();
        let log = work.join("registry.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("docker-registry (scripts/lib.sh ensure_mirror_tools installs it)");
        // containerd reads hosts.toml under the CRI's config_path at each pull.
        let bed = std::env::var("AUTONOMIC_TESTBED_DIR")
            .unwrap_or_else(|_| "/tmp/autonomic-testbed".into());
        let certs = Path::new(&bed).join("containerd/certs.d");
        assert!(
            certs.parent().unwrap().is_dir(),
            "no containerd of the project's test bed at {bed}"
        );
        let hosts = certs.join(format!("127.0.0.1:{port}"));
        std::fs::create_dir_all(&hosts).unwrap();
        std::fs::write(
            hosts.join("hosts.toml"),
            format!(
                "server = \"http://127.0.0.1:{port}\"\n\n[host.\"http://127.0.0.1:{port}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap();
        let mirror = Mirror {
            port,
            child,
            log,
            hosts,
        };
        let started = Instant::now();
        while get(port, "/v2/", "*/*").map(|(s, _)| s) != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "docker-registry did not answer: {}",
                std::fs::read_to_string(&mirror.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        mirror
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.hosts);
    }
}

#[tokio::test]
async fn air_gapped_install_pulls_the_image_from_a_mirror_registry() {
    require_node();
    let layout = concat!(env!("CARGO_MANIFEST_DIR"), "/target/image/oci");
    assert!(
        Path::new(layout).join("index.json").is_file(),
        "no OCI layout at {layout}: run scripts/image (scripts/test does)"
    );
    let client = client().await;
    let home = TestNamespace::new(&client, "mirror").await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let work = log_dir().join(format!("mirror-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let mirror = Mirror::start(&work).await;
    let registry = mirror.addr();

    // 1. Mirror the image, both platforms, as the docs say (their commands, read by
    //    support::docs: the mirror's address, the test's namespace and folders filled
    //    in; plain HTTP added, as docs/install.md says the test does).
    let repo = work.join("repo");
    let public = format!("{}/", repo.display());
    let tgz = repo.join(format!("autonomic-{VERSION}.tgz"));
    let rendered = work.join("autonomic.yaml");
    let values = [
        ("registry.internal:5000", registry.as_str()),
        ("registry.example.com", registry.as_str()),
        ("target/image/oci", layout),
        ("public/", public.as_str()),
        ("./autonomic-0.1.0.tgz", tgz.to_str().unwrap()),
        ("autonomic.yaml", rendered.to_str().unwrap()),
        ("autonomic-system", home.name.as_str()),
    ];
    let copied = Instant::now();
    run_ok(
        doc_command("skopeo copy --all", &values)
            .command()
            .arg("--dest-tls-verify=false"),
    );
    let copy_time = copied.elapsed();
    let (status, tags) = get(
        mirror.port,
        "/v2/autonomic-sh/autonomic-manager/tags/list",
        "*/*",
    )
    .unwrap();
    assert!(status == 200 && tags.contains(VERSION), "{status} {tags}");
    let (status, index) = get(
        mirror.port,
        &format!("/v2/autonomic-sh/autonomic-manager/manifests/{VERSION}"),
        "application/vnd.oci.image.index.v1+json",
    )
    .unwrap();
    assert_eq!(status, 200, "{index}");
    for arch in ["\"amd64\"", "\"arm64\""] {
        assert!(
            index.contains(arch),
            "the mirrored index lacks {arch}: {index}"
        );
    }

    // 2. The chart into the same registry, as an OCI artifact.
    run_ok(
        doc_command("scripts/chart-repo public/ --oci", &values)
            .command()
            .arg("--plain-http"),
    );

    // 3. A mirror that cannot be reached: Helm's own error, and no release.
    let release = HelmRelease::new(&home.name, "autonomic");
    let (ok, out) = release.try_helm(&[
        "install",
        "autonomic",
        "oci://127.0.0.1:9/charts/autonomic",
        "--version",
        VERSION,
        "--plain-http",
    ]);
    assert!(!ok && out.contains("127.0.0.1:9"), "{out}");
    let (ok, out) = release.try_helm(&["status", "autonomic"]);
    assert!(!ok && out.contains("not found"), "{out}");

    // 4. Install from the mirror, every image from it.
    let watch = format!("manager.watchNamespaces={{{}}}", home.name);
    let bed = ["--set", "manager.replicas=1", "--set", watch.as_str()];
    let installed = Instant::now();
    let oci = doc_command(
        "helm install autonomic oci://registry.internal:5000",
        &values,
    );
    release.helm(&[oci.args().as_slice(), &["--plain-http"], &bed].concat());
    let deployments: Api<Deployment> = home.api();
    wait_available(&deployments, 1).await;
    let install_time = installed.elapsed();
    let image = format!("{registry}/autonomic-sh/autonomic-manager:{VERSION}");
    assert_eq!(running_image(&home).await, image);
    // containerd pulled it through the mirror: it resolved the tag there (the blobs are
    // fetched too when its content store lacks them; an earlier run may have left them).
    let served = std::fs::read_to_string(&mirror.log).unwrap();
    let pulled = served.lines().any(|l| {
        l.contains("useragent=\"containerd")
            && l.contains(&format!(
                "/v2/autonomic-sh/autonomic-manager/manifests/{VERSION}"
            ))
    });
    assert!(
        pulled,
        "containerd did not resolve the image at the mirror:\n{served}"
    );

    let timings = serde_json::json!({
        "skopeo_copy_ms": copy_time.as_millis() as u64,
        "install_from_mirror_to_available_ms": install_time.as_millis() as u64,
    });
    eprintln!("mirror timings: {timings}");
    // Read by scripts/bench (BENCHMARKS.md, item 16).
    std::fs::write(log_dir().join("mirror-timings.json"), timings.to_string()).unwrap();

    // 5. The other air-gapped ways the docs give: the chart's .tgz (scripts/chart-repo
    //    left it beside the push), and `helm template` rendered offline.
    release.helm(&["uninstall", "autonomic"]);
    wait_gone(&deployments, "autonomic-manager").await;
    let from_tgz = doc_command("helm install autonomic ./autonomic-0.1.0.tgz", &values);
    release.helm(&[from_tgz.args().as_slice(), &bed].concat());
    wait_available(&deployments, 1).await;
    assert_eq!(running_image(&home).await, image);
    let template = doc_command("helm template autonomic charts/autonomic", &values);
    let manifest = run_ok(template.command().current_dir(env!("CARGO_MANIFEST_DIR")));
    std::fs::write(template.stdout_to.as_deref().unwrap(), &manifest).unwrap();
    let images: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert!(
        !images.is_empty()
            && images
                .iter()
                .all(|i| i.trim_matches('"').starts_with(&format!("{registry}/"))),
        "an image of the offline render is not from the mirror: {images:?}"
    );

    release.helm(&["uninstall", "autonomic"]);
    // The pulled image goes too: the next run pulls again.
    let bed =
        std::env::var("AUTONOMIC_TESTBED_DIR").unwrap_or_else(|_| "/tmp/autonomic-testbed".into());
    let _ = Command::new("ctr")
        .args([
            "-a",
            &format!("{bed}/containerd/containerd.sock"),
            "-n",
            "k8s.io",
            "images",
            "rm",
            &format!("{registry}/autonomic-sh/autonomic-manager:{VERSION}"),
        ])
        .output();
    drop(mirror);
}
