//! The shipped binary: static (no ELF interpreter, no shared libraries) and small; its
//! commands, its refusals of bad configuration, and its JSON log lines.
// Waits on the child processes block a thread (clippy.toml bans that in the manager).
#![allow(clippy::disallowed_methods)]

mod support;

use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_autonomic-manager");

#[test]
fn release_binary_is_statically_linked() {
    let bytes = std::fs::read(BIN).unwrap();
    let e = support::elf(&bytes);
    assert_eq!(
        (e.interp, e.needed),
        (false, false),
        "{BIN} is dynamically linked"
    );
    println!(
        "autonomic-manager: {} bytes ({:.2} MiB), static",
        bytes.len(),
        bytes.len() as f64 / 1048576.0
    );
}

#[test]
fn commands_and_bad_configuration() {
    // `autonomic-manager 0.1.0 (revision 0123456789ab[+dirty], x86_64-unknown-linux-musl)`
    let out = Command::new(BIN).arg("version").output().unwrap();
    assert!(out.status.success());
    let version = String::from_utf8(out.stdout).unwrap();
    let rest = version
        .strip_prefix(&format!(
            "autonomic-manager {} (revision ",
            env!("CARGO_PKG_VERSION")
        ))
        .unwrap_or_else(|| panic!("{version:?}"));
    let (revision, target) = rest.trim_end().split_once(", ").expect(&version);
    let bare = revision.strip_suffix("+dirty").unwrap_or(revision);
    assert!(
        bare == "unknown" || (bare.len() == 12 && bare.bytes().all(|b| b.is_ascii_hexdigit())),
        "{version:?}"
    );
    assert_eq!(target, "x86_64-unknown-linux-musl)", "{version:?}");

    // Help: every variable the manager reads, with its default; exit 0.
    for arg in ["--help", "-h", "help"] {
        let out = Command::new(BIN).arg(arg).output().unwrap();
        assert!(out.status.success(), "{arg}");
        let help = String::from_utf8(out.stdout).unwrap();
        assert_eq!(help, autonomic_manager::config::usage(), "{arg}");
        for v in autonomic_manager::config::ENV_VARS {
            assert!(help.contains(v.name), "{arg}: {}", v.name);
        }
        for name in ["AUTONOMIC_LOG", "SSL_CERT_DIR", "NO_PROXY", "KUBECONFIG"] {
            assert!(help.contains(&format!("\n  {name}")), "{arg}: {name}");
        }
    }

    let out = Command::new(BIN).arg("crds").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        autonomic_manager::crd::crds_yaml()
    );

    let out = Command::new(BIN).arg("bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));

    // Each refusal: exit 2, exactly one line on stderr, before anything is dialled
    // (no KUBECONFIG either: it stops before looking for a cluster).
    for env in [
        vec![("AUTONOMIC_MANAGED", "perhaps")],
        vec![("AUTONOMIC_MANAGED", "true")],
        vec![("AUTONOMIC_BASE_URL", "not a url")],
        vec![("AUTONOMIC_BASE_URL", "http://cp.example.com")],
        vec![("AUTONOMIC_TRANSPORT", "carrier-pigeon")],
        // Refused, not replaced by a default.
        vec![("AUTONOMIC_LOG", "debgu")],
        vec![("AUTONOMIC_LOG", "info,autonomic_manager=loud")],
        vec![("AUTONOMIC_NAMESPACES", "Team-A")],
        vec![("HTTPS_PROXY", "https://user:s3cr3t@proxy:3128")],
        vec![("HTTPS_PROXY", "proxy:port")],
        vec![("NO_PROXY", "10.0.0.0/33")],
        vec![("SSL_CERT_FILE", "/nonexistent/ca.pem")],
        vec![("SSL_CERT_DIR", "/nonexistent")],
        vec![("AUTONOMIC_CA_FILE", "/dev/null")],
        // Leader election needs the Lease's namespace.
        vec![("AUTONOMIC_LEADER_ELECTION", "true")],
    ] {
        let out = Command::new(BIN)
            .env_clear()
            .envs(env.clone())
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{env:?}: {err}");
        assert!(
            err.starts_with("autonomic-manager: invalid configuration: "),
            "{err}"
        );
        // Named by the variable, the proxy's password never shown.
        assert!(err.contains(&format!(": {}", env[0].0)), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
    }
}

#[test]
fn duplicate_key_detector() {
    use support::assert_no_duplicate_keys;
    let clean = "text line\n{\"a\":1,\"b\":{\"a\":[{\"a\":1},{\"a\":2}]},\"c\":null}\n";
    assert_eq!(assert_no_duplicate_keys(clean), 1);
    for dup in [
        r#"{"message":"phase changed","message":"ok"}"#,
        r#"{"span":{"name":"object","name":"reconcile"}}"#,
        r#"{"spans":[{"a":1},{"name":"x","kind":"Agent","name":"reconcile"}]}"#,
    ] {
        let caught = std::panic::catch_unwind(|| assert_no_duplicate_keys(dup));
        assert!(caught.is_err(), "{dup}");
    }
}

/// The check every manager's log gets when a test ends: the authorizer's refusal, in text
/// and JSON logs, and not an admission plugin's 403 (seen in CI while the API server
/// restarted: its LimitRanger could not reach itself).
#[test]
fn rbac_refusal_detector() {
    use support::rbac_refusal;
    let text = r#"WARN list failed: pods is forbidden: User "system:serviceaccount:autonomic-system:autonomic-manager" cannot list resource "pods" in API group "" at the cluster scope"#;
    let json = r#"{"error":"secrets \"a\" is forbidden: User \"system:serviceaccount:s:m\" cannot get resource \"secrets\""}"#;
    assert_eq!(rbac_refusal(&format!("ok\n{text}\n")), Some(text));
    assert_eq!(rbac_refusal(json), Some(json));
    let admission = r#"INFO phase changed phase=Error reason=PodRejected status_message=Pod "a" refused: pods "a" is forbidden: Get "https://127.0.0.1:45431/api/v1/namespaces/n/limitranges": dial tcp 127.0.0.1:45431: connect: connection refused"#;
    let quota = r#"pods "a" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1"#;
    assert_eq!(rbac_refusal(&format!("{admission}\n{quota}")), None);
}

/// `AUTONOMIC_LOG_FORMAT=json`: every line is one JSON object with no key twice, through
/// start-up, the reconcile span and a phase change (whose `message` field once collided
/// with the event's message, and the span's `name` field with the span's name).
#[tokio::test]
async fn json_log_lines_have_no_duplicate_keys() {
    // The test bed's API server, the chart's identity: one Agent, reconciled.
    let client = support::client().await;
    let ns = support::TestNamespace::new(&client, "json-logs").await;
    let kubeconfig = support::chart_identity(&ns.name, &[&ns.name]);
    let log = support::log_dir().join(format!("{}.log", ns.name));
    let mut child = Command::new(BIN)
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("AUTONOMIC_LOG_FORMAT", "json")
        .env("AUTONOMIC_LOG", "debug")
        .env("AUTONOMIC_NAMESPACES", &ns.name)
        .env("AUTONOMIC_PROBE_ADDR", "127.0.0.1:0")
        .env("AUTONOMIC_AGENTLET_IMAGE", support::AGENTLET_IMAGE)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let agent: autonomic_manager::crd::Agent = serde_json::from_value(json!({
        "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
        "metadata": {"name": "triage"},
        "spec": {"runtime": {"image": support::BUSYBOX_IMAGE, "command": ["sleep", "3600"]}},
    }))
    .unwrap();
    ns.api::<autonomic_manager::crd::Agent>()
        .create(&Default::default(), &agent)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let logs = loop {
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        if logs.contains("phase changed") {
            break logs;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the manager exited ({status}):\n{logs}");
        }
        assert!(Instant::now() < deadline, "no phase change logged:\n{logs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(
        support::assert_no_duplicate_keys(&logs),
        lines.len(),
        "every line is a JSON object:\n{logs}"
    );
    let phase: Value = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["message"] == "phase changed")
        .unwrap();
    assert_eq!(phase["name"], "triage", "{phase}");
    assert!(phase["status_message"].is_string(), "{phase}");
    assert_eq!(phase["span"]["name"], "reconcile", "{phase}");
    assert_eq!(phase["span"]["object"], "triage", "{phase}");
}
