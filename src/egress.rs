//! How the manager reaches the control plane through the network it is given, read the
//! way the rest of the system reads it: the egress proxy (`HTTPS_PROXY`, `NO_PROXY`) as
//! Go's `golang.org/x/net/http/httpproxy` does, and the trust store (the Mozilla roots
//! plus `AUTONOMIC_CA_FILE`, `SSL_CERT_FILE` and `SSL_CERT_DIR`) as OpenSSL and Go do.
//! Everything here is parsed at start-up, so a malformed value is refused there (exit 2)
//! instead of at every dial.

use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// `HTTPS_PROXY`: an `http://` proxy, tunnelled with `CONNECT`. Its `Debug` and `Display`
/// show the URL with the password replaced by `***`, so no log line, error or `{:?}` of
/// the [`Config`] can show it; the credentials go only into `Proxy-Authorization`.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    /// `http://[user:***@]host:port`, what may be shown.
    shown: String,
    pub host: String,
    pub port: u16,
    /// `Basic <base64(user:password)>`, when the URL carries userinfo.
    authorization: Option<String>,
}

impl Proxy {
    /// Parses a proxy URL as Go's httpproxy does: `[http://][user[:password]@]host[:port]`
    /// (a URL without a scheme is `http://`, the port defaults to 80, userinfo is
    /// percent-decoded, a path is ignored). `https://` (TLS to the proxy) and other
    /// schemes are refused. Errors never show the password.
    pub fn parse(raw: &str) -> Result<Proxy, String> {
        let raw = raw.trim();
        let quoted = redact_userinfo(raw);
        let rest = match raw.find("://") {
            Some(i) if raw[..i].eq_ignore_ascii_case("http") => &raw[i + 3..],
            Some(i) => {
                return Err(format!(
                    "{quoted:?}: only http:// proxies are supported, not {}://",
                    &raw[..i]
                ));
            }
            None => raw,
        };
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let (userinfo, host_port) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (host, port) = split_host_port(host_port, 80)
            .ok_or_else(|| format!("{quoted:?} has no valid host[:port]"))?;
        let authorization = match userinfo {
            None => None,
            Some(userinfo) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let (Some(user), Some(password)) = (percent_decode(user), percent_decode(password))
                else {
                    return Err(format!(
                        "{quoted:?}: the userinfo has a malformed %-escape or is not UTF-8"
                    ));
                };
                Some(format!(
                    "Basic {}",
                    base64(format!("{user}:{password}").as_bytes())
                ))
            }
        };
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let shown = match userinfo {
            Some(u) => redact_userinfo(&format!("http://{u}@{authority}")),
            None => format!("http://{authority}"),
        };
        Ok(Proxy {
            shown,
            host,
            port,
            authorization,
        })
    }

    /// `host:port` to connect to (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The `Proxy-Authorization` header value, for the `CONNECT` request only.
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }
}

impl std::fmt::Display for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Proxy({:?})", self.shown)
    }
}

/// `%XX` escapes decoded; `None` for a malformed escape or bytes that are not UTF-8.
/// (The `percent-encoding` crate in the tree passes a malformed escape through as text;
/// a proxy password is refused instead, with the variable named.)
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Standard base64 with padding (RFC 4648 §4).
pub(crate) fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `NO_PROXY`: the hosts dialled directly, as Go's httpproxy reads it. A comma list of
/// - `*`: every host;
/// - an IP address (`10.0.0.1`, `::1`, `[::1]`), optionally with a port (`10.0.0.1:443`,
///   `[::1]:443`): that address;
/// - a CIDR (`10.0.0.0/8`, `fd00::/8`): every IP address in it (names are not resolved);
/// - a domain (`example.com`): it and its subdomains; `.example.com` or `*.example.com`:
///   its subdomains only; optionally with a port (`example.com:443`).
///
/// Entries with a port match only that port. Matching is case-insensitive. Unlike Go,
/// `localhost` and loopback addresses are not exempt by themselves: a proxy on the path
/// to a loopback control plane is a setup the tests use.
/// An entry that is none of these is refused at start-up (Go ignores it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoProxy {
    all: bool,
    rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    Cidr {
        net: IpAddr,
        bits: u8,
    },
    Ip {
        ip: IpAddr,
        port: Option<u16>,
    },
    Domain {
        /// With its leading dot: `.example.com`.
        suffix: String,
        /// Whether the domain itself matches too (`example.com`, not `.example.com`).
        exact: bool,
        port: Option<u16>,
    },
}

impl NoProxy {
    pub fn parse(list: &str) -> Result<NoProxy, String> {
        let mut no_proxy = NoProxy::default();
        for entry in list.split(',').map(|e| e.trim().to_ascii_lowercase()) {
            match entry.as_str() {
                "" => {}
                "*" => no_proxy.all = true,
                _ => no_proxy
                    .rules
                    .push(Rule::parse(&entry).map_err(|why| format!("entry {entry:?}: {why}"))?),
            }
        }
        Ok(no_proxy)
    }

    /// Whether `host` (a name, or an IP address with or without brackets) on `port` is
    /// dialled without the proxy.
    pub fn bypasses(&self, host: &str, port: u16) -> bool {
        if self.all {
            return true;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = host.to_ascii_lowercase();
        let ip = host.parse::<IpAddr>().ok();
        self.rules.iter().any(|rule| rule.matches(&host, ip, port))
    }
}

impl Rule {
    fn parse(entry: &str) -> Result<Rule, String> {
        if let Some((address, bits)) = entry.split_once('/') {
            let net: IpAddr = address
                .parse()
                .map_err(|_| format!("{address:?} is not an IP address (CIDR: address/bits)"))?;
            let max = if net.is_ipv4() { 32 } else { 128 };
            let bits = bits
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("the prefix length must be 0 to {max}"))?;
            return Ok(Rule::Cidr {
                net: masked(net, bits),
                bits,
            });
        }
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or("unclosed [")?;
            host.parse::<Ipv6Addr>()
                .map_err(|_| format!("{host:?} in brackets is not an IPv6 address"))?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':').ok_or("junk after ]")?)),
            }
        } else if entry.matches(':').count() > 1 {
            (entry, None) // a bare IPv6 address
        } else {
            match entry.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (entry, None),
            }
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{p:?} is not a port"))
            })
            .transpose()?;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Rule::Ip { ip, port });
        }
        let (suffix, exact) = match host.strip_prefix('*') {
            Some(rest) if rest.starts_with('.') => (rest.to_owned(), false),
            Some(_) => return Err("`*` stands alone or starts `*.domain`".into()),
            None if host.starts_with('.') => (host.to_owned(), false),
            None => (format!(".{host}"), true),
        };
        let domain = &suffix[1..];
        let valid = !domain.is_empty()
            && domain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !valid {
            return Err("not a host name, IP address or CIDR".into());
        }
        Ok(Rule::Domain {
            suffix,
            exact,
            port,
        })
    }

    fn matches(&self, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
        let port_ok = |p: &Option<u16>| p.is_none_or(|p| p == port);
        match self {
            Rule::Cidr { net, bits } => {
                ip.is_some_and(|ip| ip.is_ipv4() == net.is_ipv4() && masked(ip, *bits) == *net)
            }
            Rule::Ip { ip: want, port: p } => ip == Some(*want) && port_ok(p),
            Rule::Domain {
                suffix,
                exact,
                port: p,
            } => {
                (host.ends_with(suffix.as_str()) || (*exact && host == &suffix[1..])) && port_ok(p)
            }
        }
    }
}

/// `ip` with all but its first `bits` bits cleared.
fn masked(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

/// A trust store path that cannot be used: the variable that named it, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct TrustError {
    pub var: &'static str,
    pub reason: String,
}

/// The roots the platform's certificate is checked against: the Mozilla set (the image
/// has no system store), plus
/// - `AUTONOMIC_CA_FILE` and `SSL_CERT_FILE`: PEM bundles, each read whole: unreadable,
///   malformed or without a certificate is an error;
/// - `SSL_CERT_DIR`: directories (colon-separated), each file in them read as OpenSSL's
///   hashed directories and Go do: files that are not PEM certificates (CRLs, notes,
///   broken links) are skipped, but a directory that cannot be read or gives no
///   certificate at all is an error.
///
/// Checked at start-up (exit 2) and read again at each dial, so a rotated bundle is used
/// without a restart.
pub fn root_store(
    ca_file: Option<&Path>,
    ssl_cert_file: Option<&Path>,
    ssl_cert_dirs: &[PathBuf],
) -> Result<rustls::RootCertStore, TrustError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let invalid = |var: &'static str, path: &Path, reason: String| TrustError {
        var,
        reason: format!("{}: {reason}", path.display()),
    };
    for (var, path) in [
        ("AUTONOMIC_CA_FILE", ca_file),
        ("SSL_CERT_FILE", ssl_cert_file),
    ] {
        if let Some(path) = path {
            add_bundle(&mut roots, path).map_err(|reason| invalid(var, path, reason))?;
        }
    }
    for dir in ssl_cert_dirs {
        add_dir(&mut roots, dir).map_err(|reason| invalid("SSL_CERT_DIR", dir, reason))?;
    }
    Ok(roots)
}

fn add_bundle(roots: &mut rustls::RootCertStore, path: &Path) -> Result<(), String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("malformed PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificates in it".into());
    }
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("a certificate is not a usable root: {e}"))?;
    }
    Ok(())
}

fn add_dir(roots: &mut rustls::RootCertStore, dir: &Path) -> Result<(), String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the directory: {e}"))?
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    files.sort();
    let mut added = 0;
    for file in files.iter().filter(|f| f.is_file()) {
        let Ok(pem) = std::fs::read(file) else {
            continue;
        };
        // Up to the first malformed section: whatever precedes it is usable.
        let certs = CertificateDer::pem_slice_iter(&pem).map_while(Result::ok);
        added += roots.add_parsable_certificates(certs).0;
    }
    if added == 0 {
        return Err("no PEM certificates in the directory".into());
    }
    Ok(())
}

#[cfg(test)]
#[path = "../tests/support/pki.rs"]
mod pki;

/// Where [`pki`] (the integration tests' throw-away PKI) writes its files.
#[cfg(test)]
fn log_dir() -> PathBuf {
    std::env::temp_dir().join("autonomic-manager-unit")
}

/// `url` with the password of its userinfo replaced by `***` (`http://user:***@proxy:3128`),
/// or all of the userinfo when it has no `:` (a bare token): what logs, errors and the
/// Lease may show of a proxy URL. Works on text that does not parse as a URL too.
pub fn redact_userinfo(url: &str) -> String {
    let Some((start, at)) = userinfo(url) else {
        return url.to_owned();
    };
    let shown = match url[start..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{}{shown}{}", &url[..start], &url[at..])
}

/// Where the userinfo of `url` starts and where its `@` is, if it has one: in the
/// authority (after an optional `scheme://`, up to the first `/`, `?` or `#`), before its
/// last `@`.
fn userinfo(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    authority.rfind('@').map(|at| (start, start + at))
}

/// Splits `host[:port]` / `[v6][:port]`; `None` when malformed.
pub(crate) fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest.find(']')?;
        let host = &rest[..end];
        host.parse::<std::net::Ipv6Addr>().ok()?;
        match &rest[end + 1..] {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let valid_host = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    if !valid_host {
        return None;
    }
    let port = match port {
        None => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
    };
    Some((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn proxy_urls_parse_like_go() {
        // (configured, shown, authority, Proxy-Authorization)
        let cases: &[(&str, &str, &str, Option<&str>)] = &[
            ("proxy:3128", "http://proxy:3128", "proxy:3128", None),
            ("http://proxy:3128", "http://proxy:3128", "proxy:3128", None),
            (
                "HTTP://Proxy:3128/",
                "http://Proxy:3128",
                "Proxy:3128",
                None,
            ),
            ("proxy", "http://proxy:80", "proxy:80", None),
            (
                " http://10.0.0.1 ",
                "http://10.0.0.1:80",
                "10.0.0.1:80",
                None,
            ),
            ("[::1]:3128", "http://[::1]:3128", "[::1]:3128", None),
            (
                "http://[fd00::1]",
                "http://[fd00::1]:80",
                "[fd00::1]:80",
                None,
            ),
            (
                "http://user:pass@proxy:3128",
                "http://user:***@proxy:3128",
                "proxy:3128",
                Some("Basic dXNlcjpwYXNz"),
            ),
            (
                "user:pass@proxy:3128",
                "http://user:***@proxy:3128",
                "proxy:3128",
                Some("Basic dXNlcjpwYXNz"),
            ),
            // Percent-escapes are decoded: user "a@b", password "p:w%".
            (
                "http://a%40b:p%3Aw%25@proxy:1",
                "http://a%40b:***@proxy:1",
                "proxy:1",
                Some("Basic YUBiOnA6dyU="),
            ),
            // A user without a password: "user:".
            (
                "http://token@proxy:1",
                "http://***@proxy:1",
                "proxy:1",
                Some("Basic dG9rZW46"),
            ),
            // An `@` in the password, unescaped: the last `@` ends the userinfo.
            (
                "http://u:p@ss@proxy:1",
                "http://u:***@proxy:1",
                "proxy:1",
                Some("Basic dTpwQHNz"),
            ),
        ];
        for (raw, shown, authority, auth) in cases {
            let p = Proxy::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(p.to_string(), *shown, "{raw}");
            assert_eq!(format!("{p:?}"), format!("Proxy({shown:?})"), "{raw}");
            assert_eq!(p.authority(), *authority, "{raw}");
            assert_eq!(p.authorization(), *auth, "{raw}");
        }
    }

    #[test]
    fn malformed_proxy_urls_are_refused_without_the_password() {
        for raw in [
            "https://user:s3cr3t@proxy:3128",
            "socks5://user:s3cr3t@proxy:1080",
            "http://user:s3cr3t@",
            "http://user:s3cr3t@proxy:99999",
            "http://user:s3cr3t@proxy:0",
            "http://user:s3cr3t@[::1",
            "http://user:s3cr3t@pro xy:1",
            "http://user:s3cr3t%zz@proxy:1",
            "http://us%zzer:s3cr3t@proxy:1",
            "http://",
            "",
        ] {
            let err = Proxy::parse(raw).expect_err(raw);
            assert!(!err.contains("s3cr3t"), "{raw}: {err}");
            assert!(!err.contains('\n'), "{raw}: {err}");
        }
    }

    #[test]
    fn no_proxy_matches_like_go() {
        let np = NoProxy::parse(
            " Example.com, .internal,*.corp.net, api.io:8443, 10.0.0.0/8, fd00::/8, \
             192.168.1.7, [::1], [2001:db8::5]:443, 2001:db8::9, 172.16.0.1:8443,,",
        )
        .unwrap();
        // (host, port, bypasses)
        let cases = [
            ("example.com", 443, true),
            ("EXAMPLE.com", 443, true),
            ("api.example.com", 443, true),
            ("notexample.com", 443, false),
            ("example.com.evil", 443, false),
            // A leading dot or `*.`: subdomains only.
            ("cp.internal", 443, true),
            ("internal", 443, false),
            ("a.b.corp.net", 443, true),
            ("corp.net", 443, false),
            // With a port: that port only.
            ("api.io", 8443, true),
            ("x.api.io", 8443, true),
            ("api.io", 443, false),
            ("172.16.0.1", 8443, true),
            ("172.16.0.1", 443, false),
            // CIDRs: IP literals only, any port.
            ("10.1.2.3", 443, true),
            ("10.255.255.255", 1, true),
            ("11.0.0.1", 443, false),
            ("fd12:3456::1", 443, true),
            ("[fd12:3456::1]", 443, true),
            ("fe80::1", 443, false),
            // Addresses.
            ("192.168.1.7", 443, true),
            ("192.168.1.8", 443, false),
            ("::1", 443, true),
            ("[::1]", 9, true),
            ("2001:db8::5", 443, true),
            ("2001:db8::5", 80, false),
            ("[2001:DB8::9]", 80, true),
            // Not exempt by themselves (unlike Go): see NoProxy.
            ("localhost", 443, false),
            ("127.0.0.1", 443, false),
            ("exo.adaptive.live", 443, false),
        ];
        for (host, port, bypass) in cases {
            assert_eq!(np.bypasses(host, port), bypass, "{host}:{port}");
        }
        let all = NoProxy::parse("example.com, *").unwrap();
        assert!(all.bypasses("anything", 1) && all.bypasses("::1", 1));
        let none = NoProxy::parse("").unwrap();
        assert!(!none.bypasses("anything", 443));
        assert_eq!(none, NoProxy::default());
        let zero = NoProxy::parse("0.0.0.0/0").unwrap();
        assert!(zero.bypasses("203.0.113.9", 1) && !zero.bypasses("::1", 1));
        assert!(!zero.bypasses("example.com", 1));
    }

    #[test]
    fn malformed_no_proxy_entries_are_refused() {
        for list in [
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0/8",
            "host/8",
            "example.com:http",
            "example.com:0",
            "example.com:70000",
            "[::1",
            "[example.com]",
            "[::1]x",
            "*example.com",
            "exa mple.com",
            "ok.com, bad!.com",
            ".",
            "*.",
        ] {
            let err = NoProxy::parse(list).expect_err(list);
            assert!(err.starts_with("entry "), "{list}: {err}");
        }
    }

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("Aladdin:open sesame", "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    fn config(vars: &[(&str, String)]) -> Config {
        Config::parse(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
            .expect("config")
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = log_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn unreadable_or_empty_trust_paths_are_refused() {
        let dir = scratch("trust-refused");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let no_certs = dir.join("nocerts");
        std::fs::create_dir_all(&no_certs).unwrap();
        std::fs::write(no_certs.join("README"), "not a certificate").unwrap();
        let missing = dir.join("missing").display().to_string();
        let cases = [
            ("AUTONOMIC_CA_FILE", missing.clone()),
            ("AUTONOMIC_CA_FILE", empty.display().to_string()),
            ("SSL_CERT_FILE", missing.clone()),
            ("SSL_CERT_FILE", empty.display().to_string()),
            ("SSL_CERT_FILE", junk.display().to_string()),
            ("SSL_CERT_FILE", dir.display().to_string()),
            ("SSL_CERT_DIR", missing.clone()),
            ("SSL_CERT_DIR", no_certs.display().to_string()),
        ];
        for (var, value) in cases {
            let c = config(&[(var, value.clone())]);
            let err = c.root_store().expect_err(&value).to_string();
            assert!(err.starts_with(&format!("{var}: {value}: ")), "{err}");
        }
    }

    /// A CA known only through `SSL_CERT_FILE` (or `SSL_CERT_DIR`) lets a TLS handshake
    /// with a server it signed succeed; without it the handshake fails.
    #[tokio::test]
    async fn a_ca_from_ssl_cert_file_or_dir_is_trusted() {
        use std::sync::Arc;
        let (ca, cert, key) = pki::test_pki();
        let certs: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        use tokio::io::AsyncWriteExt;
                        let _ = tls.write_all(b"hi").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        let handshake = |config: Config| async move {
            use tokio::io::AsyncReadExt;
            let tls = crate::connect::socket::tls_config(&config).map_err(|e| e.to_string())?;
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            stream
                .read_to_end(&mut got)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(got)
        };
        let err = handshake(config(&[])).await.expect_err("an unknown CA");
        assert!(err.contains("UnknownIssuer"), "{err}");
        let via_file = config(&[("SSL_CERT_FILE", ca.display().to_string())]);
        assert_eq!(handshake(via_file).await.unwrap(), b"hi");

        // A directory, as OpenSSL's hashed directories hold it, next to a file that is no
        // certificate; one of two colon-separated directories.
        let dir = scratch("trust-dir");
        std::fs::copy(&ca, dir.join("5ad8a5d6.0")).unwrap();
        std::fs::write(dir.join("README"), "not a certificate").unwrap();
        let other = scratch("trust-dir-other");
        std::fs::copy(&ca, other.join("ca.pem")).unwrap();
        let dirs = format!("{}::{}", other.display(), dir.display());
        let c = config(&[("SSL_CERT_DIR", dirs)]);
        assert_eq!(c.ssl_cert_dirs, [other.clone(), dir.clone()]);
        assert_eq!(handshake(c).await.unwrap(), b"hi");
    }

    #[test]
    fn proxy_userinfo_is_redacted() {
        let cases = [
            ("http://user:pass@proxy:3128", "http://user:***@proxy:3128"),
            (
                "http://user:pass@proxy:3128/",
                "http://user:***@proxy:3128/",
            ),
            ("http://user:p%40ss:w@proxy", "http://user:***@proxy"),
            ("http://us%3Aer:pa@ss@proxy:1", "http://us%3Aer:***@proxy:1"),
            ("http://token@proxy:3128", "http://***@proxy:3128"),
            ("http://:pass@proxy", "http://:***@proxy"),
            ("user:pass@proxy:3128", "user:***@proxy:3128"),
            (
                "HTTPS://u:p@[::1]:8080/x?y@z",
                "HTTPS://u:***@[::1]:8080/x?y@z",
            ),
            ("http://proxy:3128", "http://proxy:3128"),
            ("http://proxy:3128/a@b", "http://proxy:3128/a@b"),
            ("proxy", "proxy"),
            ("", ""),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_userinfo(url), shown, "{url}");
        }
    }
}
