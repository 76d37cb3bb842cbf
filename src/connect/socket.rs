//! Dialling the control plane: TCP (directly or through an HTTP `CONNECT` proxy), TLS
//! with the platform's roots plus `AUTONOMIC_CA_FILE`, `SSL_CERT_FILE` and `SSL_CERT_DIR`
//! (see [`crate::egress`]), and the WebSocket upgrade.

use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::progress::Progress;

use super::link::DialFailure;
use crate::config::{Config, Token};
use crate::egress::Proxy;
#[cfg(test)]
use crate::protocol::frame::{IO_HEADER_LEN, MAX_FRAME_BYTES, MAX_IO_PAYLOAD};
use crate::protocol::frame::{MAX_MESSAGE_BYTES, SUBPROTOCOL};

pub type Socket = WebSocketStream<MaybeTlsStream<Progress<TcpStream>>>;

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
    #[error("refused with HTTP {0}")]
    Http(u16),
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    #[error("cannot resolve {target}: {reason}")]
    Dns { target: String, reason: String },
    /// A step of the dial got no answer within [`DIAL_TIMEOUT`]; the text says which.
    #[error("{0}")]
    Timeout(String),
    /// `proxy` is the URL with its password redacted.
    #[error("proxy {proxy}: {reason}")]
    Proxy { proxy: String, reason: String },
    /// The proxy answered `CONNECT` with something other than 200.
    #[error("proxy {proxy}: CONNECT refused: {status_line}")]
    ProxyRefused {
        proxy: String,
        status: u16,
        status_line: String,
    },
    #[error("TLS: {0}")]
    Tls(String),
    /// The certificate chains to no trusted root (shown like any TLS failure).
    #[error("TLS: {0}")]
    UnknownCa(String),
    #[error("WebSocket handshake failed: {0}")]
    Handshake(String),
    /// A report's answer (HTTP transport) that is not what §8 says.
    #[error("bad report answer: {0}")]
    Report(String),
}

impl DialError {
    pub fn status(&self) -> Option<u16> {
        match self {
            DialError::Rejected { status, .. } | DialError::Http(status) => Some(*status),
            DialError::NotFound { .. } => Some(404),
            _ => None,
        }
    }

    /// The reason `autonomic_dial_failures_total` counts this under.
    pub fn failure(&self) -> DialFailure {
        match self {
            DialError::Rejected { .. } => DialFailure::Token,
            DialError::NotFound { .. } | DialError::Http(_) => DialFailure::HttpStatus,
            DialError::Connect { .. } => DialFailure::Connect,
            DialError::Dns { .. } => DialFailure::Dns,
            DialError::Timeout(_) => DialFailure::Timeout,
            DialError::Proxy { .. } | DialError::ProxyRefused { .. } => DialFailure::Proxy,
            DialError::Tls(_) | DialError::UnknownCa(_) => DialFailure::Tls,
            DialError::Handshake(_) | DialError::Report(_) => DialFailure::Handshake,
        }
    }
}

/// An I/O error in the words users search logs for ("connection refused"), with the
/// OS's own text after it.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => format!("connection refused ({e})"),
        _ => e.to_string(),
    }
}

/// The proxy the control plane is reached through: `HTTPS_PROXY`, unless `NO_PROXY`
/// exempts the control plane's host and port.
pub(crate) fn proxy_for(config: &Config) -> Option<&Proxy> {
    config.https_proxy.as_ref().filter(|_| {
        !config
            .no_proxy
            .bypasses(&config.base_url.host, config.base_url.port)
    })
}

/// TCP to the control plane: directly, or tunnelled through the proxy that applies.
pub(crate) async fn tcp(config: &Config) -> Result<TcpStream, DialError> {
    let target = config.base_url.authority();
    let stream = match proxy_for(config) {
        None => connect_direct(target).await,
        Some(proxy) => connect_through(proxy, &target).await,
    }?;
    // No Nagle: every write is a whole frame (a keystroke's echo, a heartbeat, a 64 KiB
    // fragment of a snapshot), and holding its last partial segment until the previous
    // one is acknowledged added the peer's delayed acknowledgement to each.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// TCP to `target` (`host:port`), no proxy.
pub(crate) async fn connect_direct(target: String) -> Result<TcpStream, DialError> {
    // Resolved apart from the connect, so that a name that does not resolve is told
    // (and counted) as such.
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&target)
        .await
        .map_err(|e| DialError::Dns {
            target: target.clone(),
            reason: e.to_string(),
        })?
        .collect();
    TcpStream::connect(&addrs[..])
        .await
        .map_err(|e| DialError::Connect {
            target,
            reason: io_reason(&e),
        })
}

/// A tunnel to `target` (`host:port`) through `proxy`: HTTP `CONNECT`, its credentials
/// in `Proxy-Authorization`.
pub(crate) async fn connect_through(proxy: &Proxy, target: &str) -> Result<TcpStream, DialError> {
    // Errors name the proxy without its password (its Display): they are log lines and
    // the Lease's `autonomic.sh/link` annotation.
    let proxy_err = |reason: String| DialError::Proxy {
        proxy: proxy.to_string(),
        reason,
    };
    let authority = proxy.authority();
    let mut stream = TcpStream::connect(&authority)
        .await
        .map_err(|e| proxy_err(format!("cannot connect: {e}")))?;
    let authorization = proxy
        .authorization()
        .map(|a| format!("Proxy-Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{authorization}\r\n");
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
        return Err(DialError::ProxyRefused {
            proxy: proxy.to_string(),
            status: status.parse().unwrap_or(0),
            status_line: status_line.to_owned(),
        });
    }
    Ok(stream)
}

/// The TLS handshake with the control plane over `stream`, its certificate checked
/// against `tls` (see [`tls_config`]) for the base URL's host.
pub(crate) async fn tls<S: AsyncRead + AsyncWrite + Unpin>(
    config: &Config,
    tls: Arc<rustls::ClientConfig>,
    stream: S,
) -> Result<tokio_rustls::client::TlsStream<S>, DialError> {
    let name = ServerName::try_from(config.base_url.host.clone())
        .map_err(|e| DialError::Tls(e.to_string()))?;
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, stream)
        .await
        .map_err(|e| {
            let unknown_ca = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .is_some_and(|r| {
                    matches!(
                        r,
                        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
                    )
                });
            if unknown_ca {
                DialError::UnknownCa(e.to_string())
            } else {
                DialError::Tls(e.to_string())
            }
        })
}

/// The platform's roots: see [`Config::root_store`] (read again at each dial, so a
/// rotated bundle needs no restart).
pub fn tls_config(config: &Config) -> Result<Arc<rustls::ClientConfig>, DialError> {
    let roots = config
        .root_store()
        .map_err(|e| DialError::Tls(e.to_string()))?;
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
/// stop at [`MAX_FRAME_BYTES`](crate::protocol::frame::MAX_FRAME_BYTES), below it). A bigger message is refused by the socket as
/// it arrives, before a buffer of the peer's choosing is allocated, and ends the
/// connection (a peer sending one is broken or hostile). Writes are not limited: the
/// snapshots the manager sends may be far larger.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES))
}

/// Opens the WebSocket: [`tcp`] (directly or through the proxy), [`tls`] for `wss`, then
/// [`upgrade`]. `token` goes only into the `Authorization` header.
pub async fn dial(config: &Config, token: &Token) -> Result<Socket, DialError> {
    let request = upgrade_request(config, token)?;
    let tls_config = if config.base_url.tls {
        Some(tls_config(config)?)
    } else {
        None
    };
    let stream = tokio::time::timeout(DIAL_TIMEOUT, tcp(config))
        .await
        .map_err(|_| {
            DialError::Timeout(format!(
                "cannot connect to {}: timed out",
                config.base_url.authority()
            ))
        })??;
    // Below TLS: the clock counts bytes the network took.
    let stream = Progress::new(stream);
    let handshake = async {
        let stream = match tls_config {
            Some(roots) => MaybeTlsStream::Rustls(tls(config, roots, stream).await?),
            None => MaybeTlsStream::Plain(stream),
        };
        upgrade(config, token, request, stream).await
    };
    let Ok(result) = tokio::time::timeout(DIAL_TIMEOUT, handshake).await else {
        return Err(DialError::Timeout(
            "WebSocket handshake failed: no answer to the upgrade request within 30 s".into(),
        ));
    };
    result
}

/// The upgrade request to `<base>/api/autonomic/connect`: the token, the subprotocol and
/// the user agent.
pub(crate) fn upgrade_request(config: &Config, token: &Token) -> Result<Request, DialError> {
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
    Ok(request)
}

/// The WebSocket upgrade over an open (TLS or plain) stream; 401 and 403 are a rejected
/// token, 404 no control plane at that path.
pub(crate) async fn upgrade<S: AsyncRead + AsyncWrite + Unpin>(
    config: &Config,
    token: &Token,
    request: Request,
    stream: MaybeTlsStream<S>,
) -> Result<WebSocketStream<MaybeTlsStream<S>>, DialError> {
    let result =
        tokio_tungstenite::client_async_with_config(request, stream, Some(ws_config())).await;
    match result {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let status = resp.status().as_u16();
            Err(match status {
                401 | 403 => DialError::Rejected {
                    status,
                    prefix: token.prefix(),
                },
                404 => DialError::NotFound {
                    url: config.base_url.endpoint(true, "connect"),
                },
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

    /// A CONNECT proxy on 127.0.0.1 that takes one request, hands its head to the test
    /// and answers `answer`.
    async fn one_shot_proxy(
        answer: &'static str,
    ) -> (String, tokio::sync::oneshot::Receiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(conn.read_u8().await.unwrap());
            }
            let _ = tx.send(String::from_utf8(head).unwrap());
            conn.write_all(answer.as_bytes()).await.unwrap();
            let _ = conn.read_u8().await;
        });
        (url, rx)
    }

    /// The dial's bound, on the paused clock: a peer that takes the connection and never
    /// answers the upgrade is given up on after exactly [`DIAL_TIMEOUT`], with the step
    /// named (the real process facing a black-holed dial is `tests/faults.rs`'s).
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_upgrade_is_given_up_after_the_dial_bound() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (held, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(held);
        });
        let config = Config::parse(|k| match k {
            "AUTONOMIC_BASE_URL" => Some(format!("http://127.0.0.1:{port}")),
            _ => None,
        })
        .unwrap();
        let start = tokio::time::Instant::now();
        let Err(DialError::Timeout(text)) = dial(&config, &Token::new("t")).await else {
            panic!("the dial did not time out");
        };
        assert_eq!(start.elapsed(), DIAL_TIMEOUT);
        assert!(
            text.contains("no answer to the upgrade request within 30 s"),
            "{text}"
        );
        assert_eq!(DIAL_TIMEOUT.as_secs(), 30, "the text names the bound");
    }

    fn proxied(proxy: &str) -> Config {
        Config::parse(|k| match k {
            "HTTPS_PROXY" => Some(proxy.into()),
            "AUTONOMIC_BASE_URL" => Some("https://cp.example.com".into()),
            _ => None,
        })
        .unwrap()
    }

    /// Credentials in `HTTPS_PROXY` (scheme-less here, as Go allows) go into CONNECT's
    /// `Proxy-Authorization: Basic`, percent-decoded; without them no such header is sent.
    #[tokio::test]
    async fn proxy_credentials_go_into_proxy_authorization() {
        let ok = "HTTP/1.1 200 Connection established\r\n\r\n";
        let (addr, head) = one_shot_proxy(ok).await;
        let config = proxied(&format!("user:p%40ss@{addr}"));
        tcp(&config).await.expect("tunnel");
        assert_eq!(
            head.await.unwrap(),
            "CONNECT cp.example.com:443 HTTP/1.1\r\nHost: cp.example.com:443\r\n\
             Proxy-Authorization: Basic dXNlcjpwQHNz\r\n\r\n"
        );
        let (addr, head) = one_shot_proxy(ok).await;
        tcp(&proxied(&format!("http://{addr}")))
            .await
            .expect("tunnel");
        assert_eq!(
            head.await.unwrap(),
            "CONNECT cp.example.com:443 HTTP/1.1\r\nHost: cp.example.com:443\r\n\r\n"
        );
    }

    /// A dial through a proxy with credentials that fails never shows the password: the
    /// error is one log line, and the Lease's `autonomic.sh/link` annotation carries it.
    #[tokio::test]
    async fn proxy_errors_never_show_the_password() {
        let refusing = "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n";
        let (addr, _head) = one_shot_proxy(refusing).await;
        for proxy in [
            "http://user:s3cr3t@127.0.0.1:9".to_owned(),
            "user:s3cr3t@127.0.0.1:9".to_owned(),
            "http://s3cr3t@127.0.0.1:9".to_owned(),
            format!("http://user:s3cr3t@{addr}"),
        ] {
            let config = proxied(&proxy);
            assert!(!format!("{config:?}").contains("s3cr3t"), "{proxy}");
            let err = tcp(&config).await.expect_err(&proxy);
            let shown = err.to_string();
            assert!(
                matches!(
                    err,
                    DialError::Proxy { .. } | DialError::ProxyRefused { status: 407, .. }
                ),
                "{proxy}: {shown}"
            );
            assert!(!shown.contains("s3cr3t"), "{proxy}: {shown}");
            assert!(!format!("{err:?}").contains("s3cr3t"), "{proxy}: {err:?}");
            assert!(shown.contains("***@127.0.0.1:"), "{proxy}: {shown}");
        }
    }

    /// Each failure is counted under its own reason; the texts are unchanged.
    #[test]
    fn every_dial_error_has_its_reason() {
        let s = String::new;
        for (e, reason) in [
            (
                DialError::Rejected {
                    status: 401,
                    prefix: s(),
                },
                "token",
            ),
            (DialError::NotFound { url: s() }, "http_status"),
            (DialError::Http(502), "http_status"),
            (
                DialError::Connect {
                    target: s(),
                    reason: s(),
                },
                "connect",
            ),
            (
                DialError::Dns {
                    target: s(),
                    reason: s(),
                },
                "dns",
            ),
            (DialError::Timeout(s()), "timeout"),
            (
                DialError::Proxy {
                    proxy: s(),
                    reason: s(),
                },
                "proxy",
            ),
            (DialError::Tls(s()), "tls"),
            (DialError::Handshake(s()), "handshake"),
        ] {
            assert_eq!(e.failure().as_str(), reason, "{e:?}");
        }
    }

    /// A control plane whose name does not resolve fails as DNS, not as a connect.
    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_a_dns_failure() {
        let config = Config::parse(|k| {
            (k == "AUTONOMIC_BASE_URL").then(|| "https://no-such-host.invalid".into())
        })
        .unwrap();
        let err = tcp(&config).await.expect_err("no such host");
        assert!(matches!(err, DialError::Dns { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("cannot resolve no-such-host.invalid:443: "),
            "{err}"
        );
    }

    /// `NO_PROXY` is matched against the control plane's host and port.
    #[tokio::test]
    async fn no_proxy_dials_directly() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let config = Config::parse(|k| match k {
            "HTTPS_PROXY" => Some("http://127.0.0.1:9".into()),
            "NO_PROXY" => Some(format!("example.com,127.0.0.1:{port}")),
            "AUTONOMIC_BASE_URL" => Some(format!("http://127.0.0.1:{port}")),
            _ => None,
        })
        .unwrap();
        tcp(&config).await.expect("direct");
    }
}
