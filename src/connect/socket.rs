//! Dialling the control plane: TCP (directly or through an HTTP `CONNECT` proxy), TLS
//! with the platform's roots plus `AUTONOMIC_CA_FILE`, and the WebSocket upgrade.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::config::{BaseUrl, Config, ProxyUrl, Token, has_userinfo, redact_userinfo};
#[cfg(test)]
use crate::connect::frame::{IO_HEADER_LEN, MAX_FRAME_BYTES, MAX_IO_PAYLOAD};
use crate::connect::frame::{MAX_MESSAGE_BYTES, SUBPROTOCOL};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A peer that accepts and never answers must not hold the connector: each step of a
/// dial (TCP and proxy, then TLS and upgrade) gets this long.
pub const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a dial failed; each is one log line.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("token rejected (HTTP {status}) for token {prefix}…")]
    Rejected { status: u16, prefix: String },
    #[error("no control plane at {url} (HTTP 404): check AUTONOMIC_BASE_URL")]
    NotFound { url: String },
    #[error("upgrade refused with HTTP {0}")]
    Http(u16),
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    /// `proxy` is the URL with its password redacted.
    #[error("proxy {proxy}: {reason}")]
    Proxy { proxy: String, reason: String },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("WebSocket handshake failed: {0}")]
    Handshake(String),
}

impl DialError {
    pub fn status(&self) -> Option<u16> {
        match self {
            DialError::Rejected { status, .. } | DialError::Http(status) => Some(*status),
            DialError::NotFound { .. } => Some(404),
            _ => None,
        }
    }
}

/// Whether `host` is exempt from the proxy by `NO_PROXY` (comma list of hosts, `.suffix`
/// or `suffix` domain matches, `*` for all).
pub fn bypasses_proxy(no_proxy: Option<&str>, host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    no_proxy
        .into_iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .any(|entry| {
            let entry = entry.to_ascii_lowercase();
            let entry = entry.split(':').next().unwrap_or_default();
            let domain = entry.trim_start_matches('.');
            !domain.is_empty()
                && (entry == "*" || host == domain || host.ends_with(&format!(".{domain}")))
        })
}

/// An I/O error in the words users search logs for ("connection refused"), with the
/// OS's own text after it.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => format!("connection refused ({e})"),
        _ => e.to_string(),
    }
}

/// Splits a proxy URL into `host:port`. Credentials in it are not supported (said so,
/// without the password: see [`redact_userinfo`]).
fn proxy_authority(proxy: &str) -> Result<String, String> {
    if has_userinfo(proxy) {
        return Err(format!(
            "credentials in the proxy URL {} are not supported: the manager sends no Proxy-Authorization",
            redact_userinfo(proxy)
        ));
    }
    // No userinfo: the parser's errors may quote the URL.
    let url = BaseUrl::parse(proxy)?;
    if url.tls {
        return Err("only http:// proxies are supported".into());
    }
    Ok(url.authority())
}

pub(crate) async fn tcp(config: &Config) -> Result<TcpStream, DialError> {
    let target = config.base_url.authority();
    let proxy = config
        .https_proxy
        .as_ref()
        .map(ProxyUrl::expose)
        .filter(|_| !bypasses_proxy(config.no_proxy.as_deref(), &config.base_url.host));
    let Some(proxy) = proxy else {
        return TcpStream::connect(&target)
            .await
            .map_err(|e| DialError::Connect {
                target,
                reason: io_reason(&e),
            });
    };
    // Errors name the proxy without its password: they are log lines and the Lease's
    // `autonomic.sh/link` annotation.
    let proxy_err = |reason: String| DialError::Proxy {
        proxy: redact_userinfo(proxy),
        reason,
    };
    let authority = proxy_authority(proxy).map_err(proxy_err)?;
    let mut stream = TcpStream::connect(&authority)
        .await
        .map_err(|e| proxy_err(format!("cannot connect: {e}")))?;
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| proxy_err(e.to_string()))?;
    // Read the answer's head byte by byte: nothing past it may be consumed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 {
            return Err(proxy_err("answer head too large".into()));
        }
        let b = stream
            .read_u8()
            .await
            .map_err(|e| proxy_err(format!("closed during CONNECT: {e}")))?;
        head.push(b);
    }
    let status_line = String::from_utf8_lossy(&head);
    let status_line = status_line.lines().next().unwrap_or_default();
    let status = status_line.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        return Err(proxy_err(format!("CONNECT refused: {status_line}")));
    }
    Ok(stream)
}

/// The platform's roots: the Mozilla set (the image has no system store) plus any PEM
/// certificates in `AUTONOMIC_CA_FILE`.
pub fn tls_config(config: &Config) -> Result<Arc<rustls::ClientConfig>, DialError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = &config.ca_file {
        let certs: Vec<_> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| DialError::Tls(format!("AUTONOMIC_CA_FILE {}: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(DialError::Tls(format!(
                "AUTONOMIC_CA_FILE {}: no PEM certificates",
                path.display()
            )));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| {
                DialError::Tls(format!("AUTONOMIC_CA_FILE {}: {e}", path.display()))
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DialError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(tls))
}

/// The WebSocket's limits on what it reads: no larger than the largest message the codec
/// accepts ([`MAX_MESSAGE_BYTES`]: a binary shell frame at its payload cap; text frames
/// stop at [`MAX_FRAME_BYTES`](crate::connect::frame::MAX_FRAME_BYTES), below it). A bigger message is refused by the socket as
/// it arrives, before a buffer of the peer's choosing is allocated, and ends the
/// connection (a peer sending one is broken or hostile). Writes are not limited: the
/// snapshots the manager sends may be far larger.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
}

/// Opens the WebSocket. `token` goes only into the `Authorization` header.
pub async fn dial(config: &Config, token: &Token) -> Result<Socket, DialError> {
    let url = config.base_url.endpoint(true, "connect");
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| DialError::Handshake(e.to_string()))?;
    let headers = request.headers_mut();
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
        DialError::Handshake("the token holds characters not allowed in a header".into())
    })?;
    headers.insert("authorization", bearer);
    headers.insert(
        "sec-websocket-protocol",
        HeaderValue::from_static(SUBPROTOCOL),
    );
    headers.insert(
        "user-agent",
        HeaderValue::from_static(concat!("autonomic-manager/", env!("CARGO_PKG_VERSION"))),
    );
    let connector = if config.base_url.tls {
        Connector::Rustls(tls_config(config)?)
    } else {
        Connector::Plain
    };
    let stream = tokio::time::timeout(DIAL_TIMEOUT, tcp(config))
        .await
        .map_err(|_| DialError::Connect {
            target: config.base_url.authority(),
            reason: "timed out".into(),
        })??;
    let handshake = tokio_tungstenite::client_async_tls_with_config(
        request,
        stream,
        Some(ws_config()),
        Some(connector),
    );
    let Ok(result) = tokio::time::timeout(DIAL_TIMEOUT, handshake).await else {
        return Err(DialError::Handshake(
            "no answer to the upgrade request within 30 s".into(),
        ));
    };
    match result {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let status = resp.status().as_u16();
            Err(match status {
                401 | 403 => DialError::Rejected {
                    status,
                    prefix: token.prefix(),
                },
                404 => DialError::NotFound { url },
                _ => DialError::Http(status),
            })
        }
        Err(tokio_tungstenite::tungstenite::Error::Tls(e)) => Err(DialError::Tls(e.to_string())),
        Err(tokio_tungstenite::tungstenite::Error::Io(e)) => {
            // rustls reports certificate problems as I/O errors carrying a rustls error.
            let text = e.to_string();
            if text.contains("certificate") || text.contains("Tls") || text.contains("TLS") {
                Err(DialError::Tls(text))
            } else {
                Err(DialError::Handshake(text))
            }
        }
        Err(e) => Err(DialError::Handshake(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_matching() {
        let np = Some("localhost, .internal,example.com:443 ,10.0.0.1");
        for (host, bypass) in [
            ("localhost", true),
            ("cp.internal", true),
            ("internal", true),
            ("example.com", true),
            ("api.example.com", true),
            ("notexample.com", false),
            ("10.0.0.1", true),
            ("exo.adaptive.live", false),
        ] {
            assert_eq!(bypasses_proxy(np, host), bypass, "{host}");
        }
        assert!(bypasses_proxy(Some("*"), "anything"));
        assert!(!bypasses_proxy(None, "anything"));
        assert!(!bypasses_proxy(Some(""), "anything"));
    }

    #[test]
    fn reads_are_bounded_by_what_the_codec_accepts() {
        let c = ws_config();
        // The largest message the codec takes: a binary shell frame at its payload cap
        // (a text frame is at most MAX_FRAME_BYTES, less than that).
        assert_eq!(MAX_MESSAGE_BYTES, IO_HEADER_LEN + MAX_IO_PAYLOAD);
        const { assert!(MAX_MESSAGE_BYTES >= MAX_FRAME_BYTES) };
        assert_eq!(c.max_message_size, Some(MAX_MESSAGE_BYTES));
        assert_eq!(c.max_frame_size, Some(MAX_MESSAGE_BYTES));
    }

    /// Through a real WebSocket over an in-memory pipe: one byte past the bound is refused
    /// by the socket itself, before a buffer of the peer's choosing is allocated.
    #[tokio::test]
    async fn a_message_past_the_bound_is_refused_by_the_socket() {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let mut ours =
            WebSocketStream::from_raw_socket(ours, Role::Client, Some(ws_config())).await;
        let mut theirs = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        let peer = tokio::spawn(async move {
            for len in [MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 1] {
                if theirs.send(Message::binary(vec![0u8; len])).await.is_err() {
                    break;
                }
            }
            theirs
        });
        let fits = ours.next().await.unwrap().unwrap();
        assert_eq!(fits.len(), MAX_MESSAGE_BYTES);
        let err = ours.next().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("too long"), "{err}");
        drop(ours);
        let _ = peer.await;
    }

    /// Credentials in `HTTPS_PROXY` are not supported for dialling (refused before any
    /// connection), and the refusal never shows the password: it is one log line, and
    /// the Lease's `autonomic.sh/link` annotation carries it too.
    #[tokio::test]
    async fn proxy_errors_never_show_the_password() {
        for proxy in [
            "http://user:s3cr3t@127.0.0.1:9",
            "user:s3cr3t@127.0.0.1:9",
            "https://user:s3cr3t@127.0.0.1:9",
            "http://user:s3cr3t@[::1",
            "http://s3cr3t@127.0.0.1:9",
            "ftp://user:s3cr3t@proxy",
        ] {
            let config = Config::parse(|k| match k {
                "HTTPS_PROXY" => Some(proxy.into()),
                "AUTONOMIC_BASE_URL" => Some("https://cp.example.com".into()),
                _ => None,
            })
            .unwrap();
            assert!(!format!("{config:?}").contains("s3cr3t"), "{proxy}");
            let err = tcp(&config).await.expect_err(proxy);
            let shown = err.to_string();
            assert!(matches!(err, DialError::Proxy { .. }), "{proxy}: {shown}");
            assert!(!shown.contains("s3cr3t"), "{proxy}: {shown}");
            assert!(!format!("{err:?}").contains("s3cr3t"), "{proxy}: {err:?}");
            assert!(shown.contains("***"), "{proxy}: {shown}");
        }
        // The refusal says why.
        let config = Config::parse(|k| {
            (k == "HTTPS_PROXY").then(|| "http://user:s3cr3t@127.0.0.1:9".into())
        })
        .unwrap();
        let shown = tcp(&config).await.unwrap_err().to_string();
        assert!(shown.contains("credentials"), "{shown}");
        assert!(shown.contains("http://user:***@127.0.0.1:9"), "{shown}");
    }

    #[test]
    fn proxies_must_be_plain_http() {
        assert_eq!(proxy_authority("http://proxy:3128").unwrap(), "proxy:3128");
        assert!(proxy_authority("https://proxy:3128").is_err());
    }
}
