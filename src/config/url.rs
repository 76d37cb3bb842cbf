//! URLs from the environment: the platform's base URL, and what of a proxy URL may be
//! shown.

use std::net::IpAddr;

/// A parsed platform URL. Only what the connector needs: scheme, authority, path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for none).
    pub path: String,
}

impl BaseUrl {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(r) = s.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("{s:?} is not an http:// or https:// URL"));
        };
        if rest.contains(['?', '#']) {
            return Err(format!("{s:?} must not carry a query or fragment"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(format!("{s:?} must not carry credentials"));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = split_host_port(authority, default_port)
            .ok_or_else(|| format!("{s:?} has no valid host[:port]"))?;
        Ok(BaseUrl {
            tls,
            host,
            port,
            path: path.trim_end_matches('/').to_owned(),
        })
    }

    /// `<base>/api/autonomic/<endpoint>` as a ws:// or wss:// (or http(s) for §8) URL.
    pub fn endpoint(&self, websocket: bool, endpoint: &str) -> String {
        let scheme = match (websocket, self.tls) {
            (true, true) => "wss",
            (true, false) => "ws",
            (false, true) => "https",
            (false, false) => "http",
        };
        format!(
            "{scheme}://{}{}/api/autonomic/{endpoint}",
            self.authority(),
            self.path
        )
    }

    /// `host:port` as it goes on the wire (IPv6 in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
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

/// Whether `url` carries userinfo (`user:pass@`) before its host.
pub fn has_userinfo(url: &str) -> bool {
    userinfo(url).is_some()
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
