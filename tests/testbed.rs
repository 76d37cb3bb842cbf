//! The project's own test-bed scripts on a fresh machine (issue 26): every cache they
//! fill is safe under concurrent first use. The two beds of `apiserver_faults` once
//! started together on an empty PKI cache, and one removed what the other was writing.

mod support;

use std::path::{Path, PathBuf};

use support::own_bed::OwnBed;

/// The cache `testbed/` fills for this machine (`AUTONOMIC_TESTBED_CACHE`, as there).
fn machine_cache() -> PathBuf {
    std::env::var_os("AUTONOMIC_TESTBED_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var("HOME").unwrap()).join(".cache/autonomic-testbed")
        })
}

/// The entries of `dir`, sorted, as names.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A folder of the test's own under /tmp, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An empty cache but for the Kubernetes build (linked, as the rehearsal of a fresh
/// machine reuses it): no PKI yet.
fn linked_cache(name: &str) -> Scratch {
    let cache = Scratch::new(name);
    let builds: Vec<String> = entries(&machine_cache())
        .into_iter()
        .filter(|n| n.starts_with("k8s-"))
        .collect();
    assert!(
        !builds.is_empty(),
        "no Kubernetes build in {}",
        machine_cache().display()
    );
    for name in &builds {
        std::os::unix::fs::symlink(machine_cache().join(name), cache.path().join(name)).unwrap();
    }
    cache
}

#[test]
fn two_private_beds_started_at_once_on_an_empty_pki_cache_both_come_up() {
    let cache = linked_cache("autonomic-testbed-cache");

    let beds = [
        OwnBed::with_cache(cache.path()),
        OwnBed::with_cache(cache.path()),
    ];
    let start = std::sync::Barrier::new(beds.len());
    std::thread::scope(|s| {
        for bed in &beds {
            let start = &start;
            s.spawn(move || {
                start.wait();
                bed.bring_up();
            });
        }
    });

    for bed in &beds {
        let out = std::process::Command::new("kubectl")
            .args(["get", "--raw", "/readyz"])
            .env("KUBECONFIG", bed.kubeconfig())
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stdout == b"ok",
            "bed {} does not answer: {}",
            bed.dir,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // One PKI, made once and shared: nothing half-written or left over beside it.
    let pki = cache.path().join("pki");
    let made = entries(&pki);
    let keys: Vec<&String> = made.iter().filter(|n| !n.ends_with(".lock")).collect();
    assert_eq!(keys.len(), 1, "the PKI cache holds {made:?}");
    let ca = |dir: &str| std::fs::read(format!("{dir}/pki/ca.crt")).unwrap();
    assert_eq!(
        ca(&beds[0].dir),
        ca(&beds[1].dir),
        "the two beds made two PKIs"
    );
    assert_eq!(
        ca(&beds[0].dir),
        std::fs::read(pki.join(keys[0]).join("ca.crt")).unwrap()
    );
}

/// A private API-server-only bed started and stopped beside the node bed leaves the
/// node's host-wide state alone. Its `up` cleans its state dir first, before the dir
/// says which mode it is; that clean once took the kubelet, run from the build's real
/// path while this bed's cache reaches the build through a link (as a rehearsal's
/// does), for no node at all, and deleted the pods' bridge and kube-proxy's rules under
/// every running pod: probes then failed with "no route to host" (three rehearsals).
#[test]
fn a_private_bed_beside_the_node_bed_leaves_its_bridge_alone() {
    support::require_node();
    let bridge = std::env::var("AUTONOMIC_TESTBED_BRIDGE").unwrap_or("autonomic-tb0".into());
    let index = || std::fs::read_to_string(format!("/sys/class/net/{bridge}/ifindex")).ok();
    let before = index().unwrap_or_else(|| panic!("no bridge {bridge}: is the node bed up?"));
    {
        let cache = linked_cache("autonomic-testbed-beside");
        let bed = OwnBed::with_cache(cache.path());
        bed.bring_up();
        assert_eq!(
            index().as_ref(),
            Some(&before),
            "bridge {bridge} gone at up"
        );
    }
    assert_eq!(index(), Some(before), "bridge {bridge} gone at down");
}
