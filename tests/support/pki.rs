//! A throw-away PKI for the TLS tests, made at test time with the `openssl` command-line
//! tool (the test bed installs it): a self-signed CA and a server certificate for
//! `127.0.0.1` (IP SAN) and `localhost` signed by it. Nothing is cached; every call
//! makes a fresh CA in a directory of its own under [`log_dir`](super::log_dir).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

const CA_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca

[dn]
CN = autonomic test CA

[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
";

const SERVER_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = 127.0.0.1
";

const SERVER_EXTENSIONS: &str = "\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost{extra}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// Makes a CA and a server certificate for `127.0.0.1`/`localhost` signed by it.
/// Returns `(path of the CA certificate PEM, server certificate PEM, server key PEM)`.
/// Fails the test (never skips) when `openssl` is missing or fails.
pub fn test_pki() -> (PathBuf, String, String) {
    test_pki_for(&[])
}

/// Like [`test_pki`], the server certificate also valid for the IP addresses `ips`.
pub fn test_pki_for(ips: &[std::net::Ipv4Addr]) -> (PathBuf, String, String) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = super::log_dir().join(format!("pki-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write("ca.cnf", CA_CONFIG);
    write("server.cnf", SERVER_CONFIG);
    let extra: String = ips.iter().map(|ip| format!(", IP:{ip}")).collect();
    write("server.ext", &SERVER_EXTENSIONS.replace("{extra}", &extra));

    let ec_key = [
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
    ];
    openssl(&dir, &[&ec_key[..], &["-out", "ca.key"]].concat());
    openssl(
        &dir,
        &[
            "req", "-x509", "-new", "-config", "ca.cnf", "-key", "ca.key", "-sha256", "-days", "2",
            "-out", "ca.pem",
        ],
    );
    openssl(&dir, &[&ec_key[..], &["-out", "server.key"]].concat());
    openssl(
        &dir,
        &[
            "req",
            "-new",
            "-config",
            "server.cnf",
            "-key",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    let serial = format!("0x{nanos:x}");
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial,
            "-sha256",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    (dir.join("ca.pem"), read("server.pem"), read("server.key"))
}

/// Runs `openssl ARGS` in `dir`; panics with its output when it cannot run or fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the `openssl` command-line tool ({e}): the TLS tests need it to \
                 make their certificates; install openssl (the test bed's setup does)"
            )
        });
    assert!(
        out.status.success(),
        "openssl {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
