//! URLs from the environment: the platform's base URL, and what of a proxy URL may be
//! shown.

use std::net::IpAddr;

use crate::egress::split_host_port;

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
