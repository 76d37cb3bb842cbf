//! The aarch64 binary (`scripts/build-arm64`, run by `scripts/test` before the suite):
//! static, and working under qemu-user — the commands, and a reconcile against the test
//! bed. Missing artefacts fail these tests: they never skip.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use autonomic_manager::crd::{Agent, AgentPhase};
use kube::api::{Api, PostParams};
use support::*;

const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// The fixed path `scripts/build-arm64` writes.
pub fn arm64_bin() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/aarch64-unknown-linux-musl/release/autonomic-manager");
    assert!(
        path.is_file(),
        "{} is missing: run the suite with scripts/test, or scripts/build-arm64 first",
        path.display()
    );
    path
}

/// qemu-user for aarch64 (Debian's qemu-user-static; scripts/test installs it).
fn qemu() -> String {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("qemu-aarch64-static");
        if p.is_file() {
            return p.display().to_string();
        }
    }
    panic!("qemu-aarch64-static is not on PATH: scripts/test installs qemu-user-static");
}

#[test]
fn aarch64_binary_is_static() {
    let path = arm64_bin();
    let bytes = std::fs::read(&path).unwrap();
    let e = elf(&bytes);
    assert_eq!(e.machine, EM_AARCH64, "{} is not AArch64", path.display());
    assert!(matches!(e.kind, 2 | 3), "ELF type {}", e.kind);
    assert!(!e.interp, "{} has an ELF interpreter", path.display());
    assert!(!e.needed, "{} needs shared libraries", path.display());
    // And the x86_64 one is what its name says.
    let x86 = std::fs::read(env!("CARGO_BIN_EXE_autonomic-manager")).unwrap();
    assert_eq!(elf(&x86).machine, EM_X86_64);
    println!(
        "aarch64 autonomic-manager: {} bytes ({:.2} MiB), static, ELF type {}",
        bytes.len(),
        bytes.len() as f64 / 1048576.0,
        e.kind
    );
}

#[test]
fn aarch64_binary_runs_under_qemu() {
    let (qemu, bin) = (qemu(), arm64_bin());
    let run = |args: &[&str], env: &[(&str, &str)]| {
        Command::new(&qemu)
            .arg(&bin)
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let out = run(&["version"], &[]);
    assert!(out.status.success(), "{out:?}");
    let version = String::from_utf8(out.stdout).unwrap();
    let prefix = format!("autonomic-manager {} (revision ", env!("CARGO_PKG_VERSION"));
    assert!(
        version.starts_with(&prefix) && version.ends_with(", aarch64-unknown-linux-musl)\n"),
        "{version:?}"
    );

    let out = run(&["crds"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        autonomic_manager::crd::crds_yaml()
    );

    let out = run(&[], &[("AUTONOMIC_TRANSPORT", "carrier-pigeon")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("autonomic-manager: invalid configuration: "),
        "{out:?}"
    );
}

/// The aarch64 manager, under qemu, as the chart's ServiceAccount, reconciles an Agent
/// to Active on the test bed (its pod really runs).
#[tokio::test]
async fn aarch64_manager_reconciles_an_agent_under_qemu() {
    require_node();
    let (qemu, bin) = (qemu(), arm64_bin());
    let client = client().await;
    let ns = TestNamespace::new(&client, "arm64").await;
    let log = log_dir().join(format!("{}.log", ns.name));
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(qemu)
        .arg(bin)
        .env_clear()
        .env("KUBECONFIG", chart_identity(&ns.name, &[&ns.name]))
        .env("AUTONOMIC_NAMESPACES", &ns.name)
        .env("AUTONOMIC_PROBE_ADDR", "127.0.0.1:0")
        .env("AUTONOMIC_AGENTLET_IMAGE", AGENTLET_IMAGE)
        .env("AUTONOMIC_LOG", "info,autonomic_manager=debug")
        .env("POD_NAME", format!("test-{}", ns.name))
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("spawn qemu-aarch64-static autonomic-manager");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut child);

    let agents: Api<Agent> = ns.api();
    let agent: Agent = yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: triage}}\n\
         spec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: [sh, -c, \"trap 'exit 0' TERM; while :; do sleep 1; done\"]}}}}"
    ));
    agents.create(&PostParams::default(), &agent).await.unwrap();
    let started = tokio::time::Instant::now();
    wait_for(&agents, "triage", "Active", |a| {
        a.status.as_ref().and_then(|s| s.phase) == Some(AgentPhase::Active)
    })
    .await;
    println!("Active after {:?}", started.elapsed());
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        rbac_refusal(&logs).is_none(),
        "the manager was refused a request:\n{logs}"
    );
}
