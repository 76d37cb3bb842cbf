//! Steps 6–10 in managed mode: DNS, proxy or connect, TLS, WebSocket upgrade and
//! token — `connect::socket`'s own steps, run one at a time.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{Line, Report, STEP_TIMEOUT};
use crate::config::{Config, Token, Transport};
use crate::connect::read_token;
use crate::connect::socket::{self, DialError};
use crate::egress::Proxy;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A step, holding what the step before it opened.
enum Step {
    Dns,
    /// TCP, through the proxy (CONNECT) or directly.
    Connect,
    Tls(TcpStream),
    /// Boxed: a TLS stream is a kilobyte, the other steps' data a few words.
    Websocket(Box<MaybeTlsStream<TcpStream>>),
    /// Checked by the upgrade: the line it left, and the socket to close once printed.
    Token(Line, Option<Box<Socket>>),
}

/// The step failed: the ones after it are not run.
struct Failed;

/// What every step reads.
struct Dial<'a> {
    config: &'a Config,
    proxy: Option<&'a Proxy>,
    /// `host:port` of the control plane.
    target: String,
}

impl Dial<'_> {
    /// The steps' names, in order.
    fn names(&self) -> [&'static str; 5] {
        // Step 7's name: what it does here.
        let connect = if self.proxy.is_some() {
            "proxy"
        } else {
            "connect"
        };
        ["dns", connect, "tls", "websocket", "token"]
    }
}

/// Steps 6–10 in managed mode: DNS, proxy (or a direct TCP connection), TLS, the
/// WebSocket upgrade and the token, each over the stream the one before opened. The
/// first that fails stops the walk; the steps after it are printed as not run.
pub(super) async fn control_plane_steps(config: &Config, report: &mut Report<'_>) {
    let dial = Dial {
        config,
        proxy: socket::proxy_for(config),
        target: config.base_url.authority(),
    };
    let names = dial.names();
    let mut step = Step::Dns;
    loop {
        let at = step.index();
        match step.run(&dial, report).await {
            Ok(Some(next)) => step = next,
            Ok(None) => return,
            Err(Failed) => {
                for later in &names[at + 1..] {
                    report.line(Line::skip(later, format!("{} failed", names[at])));
                }
                return;
            }
        }
    }
}

impl Step {
    /// This step's place in [`Dial::names`].
    fn index(&self) -> usize {
        match self {
            Step::Dns => 0,
            Step::Connect => 1,
            Step::Tls(_) => 2,
            Step::Websocket(_) => 3,
            Step::Token(..) => 4,
        }
    }

    /// Runs the step and prints its line: the next step, `None` after the last.
    async fn run(self, dial: &Dial<'_>, report: &mut Report<'_>) -> Result<Option<Step>, Failed> {
        let ran = match self {
            Step::Dns => dns(dial).await.map(|line| (line, Step::Connect)),
            Step::Connect => connect(dial).await,
            Step::Tls(stream) => tls(dial, stream).await,
            Step::Websocket(stream) => websocket(dial, *stream).await,
            Step::Token(line, socket) => {
                report.line(line);
                if let Some(mut socket) = socket {
                    close(&mut *socket).await;
                }
                return Ok(None);
            }
        };
        match ran {
            Ok((line, next)) => {
                report.line(line);
                Ok(Some(next))
            }
            Err(line) => {
                report.line(line);
                Err(Failed)
            }
        }
    }
}

/// Step 6, DNS: the host this process connects to (the proxy's, when one applies:
/// the proxy resolves the control plane's).
async fn dns(dial: &Dial<'_>) -> Result<Line, Line> {
    let url = &dial.config.base_url;
    let (host, port, whose, fix) = match dial.proxy {
        Some(p) => (
            p.host.clone(),
            p.port,
            "proxy host ",
            "check the host in HTTPS_PROXY and this pod's DNS",
        ),
        None => (
            url.host.clone(),
            url.port,
            "",
            "check the host in AUTONOMIC_BASE_URL and this pod's DNS (or set HTTPS_PROXY if only a proxy reaches it)",
        ),
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(Line::ok(
            "dns",
            format!("{whose}{host} is an address (nothing to resolve)"),
        ));
    }
    let lookup = tokio::net::lookup_host((host.as_str(), port));
    match tokio::time::timeout(STEP_TIMEOUT, lookup).await {
        Ok(Ok(addrs)) => {
            let ips: BTreeSet<String> = addrs.map(|a| a.ip().to_string()).collect();
            let shown: Vec<String> = ips.iter().take(3).cloned().collect();
            let more = if ips.len() > 3 { ", …" } else { "" };
            Ok(Line::ok(
                "dns",
                format!("{whose}{host} resolves to {}{more}", shown.join(", ")),
            ))
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no answer within {} s", STEP_TIMEOUT.as_secs()),
            };
            Err(Line::fail(
                "dns",
                format!("cannot resolve {whose}{host}: {why}"),
                fix,
            ))
        }
    }
}

/// 7. TCP, through the proxy (CONNECT) or directly.
async fn connect(dial: &Dial<'_>) -> Result<(Line, Step), Line> {
    type Connecting<'a> =
        std::pin::Pin<Box<dyn Future<Output = Result<TcpStream, DialError>> + Send + 'a>>;
    let target = &dial.target;
    let step = dial.names()[1];
    let connected: Connecting<'_> = match dial.proxy {
        Some(p) => Box::pin(socket::connect_through(p, target)),
        None => Box::pin(socket::connect_direct(target.clone())),
    };
    let failed = match tokio::time::timeout(STEP_TIMEOUT, connected).await {
        Ok(Ok(stream)) => {
            let text = match dial.proxy {
                Some(p) => format!("CONNECT {target} through {p} established"),
                None if dial.config.https_proxy.is_some() => {
                    format!("{target} reached directly (NO_PROXY exempts it)")
                }
                None => format!("{target} reached directly (no HTTPS_PROXY)"),
            };
            return Ok((Line::ok(step, text), Step::Tls(stream)));
        }
        failed => failed,
    };
    Err(match (failed, dial.proxy) {
        (
            Ok(Err(DialError::ProxyRefused {
                proxy,
                status_line,
                status,
            })),
            _,
        ) => {
            let fix = match status {
                407 => "the proxy wants credentials: put them in HTTPS_PROXY (http://user:password@host:port)".to_owned(),
                403 => format!("the proxy refuses {target}: have it allowed, or exempt the host with NO_PROXY if it is reachable directly"),
                _ => format!("check the proxy's logs for CONNECT {target}"),
            };
            Line::fail(
                "proxy",
                format!("{proxy} refused CONNECT {target}: {status_line}"),
                fix,
            )
        }
        (Ok(Err(e)), Some(_)) => Line::fail(
            step,
            e.to_string(),
            "check HTTPS_PROXY: host, port, and that it is reachable from here",
        ),
        (Ok(Err(e)), None) => Line::fail(
            step,
            e.to_string(),
            "check AUTONOMIC_BASE_URL's port and the egress network policy (or set HTTPS_PROXY)",
        ),
        _ => Line::fail(
            step,
            format!("{target}: no answer within {} s", STEP_TIMEOUT.as_secs()),
            "check the egress network policy and firewalls (or set HTTPS_PROXY)",
        ),
    })
}

/// 8. TLS with the configured trust.
async fn tls(dial: &Dial<'_>, stream: TcpStream) -> Result<(Line, Step), Line> {
    let (config, target) = (dial.config, &dial.target);
    let url = &config.base_url;
    if !url.tls {
        return Ok((
            Line::skip("tls", "plain http:// in AUTONOMIC_BASE_URL"),
            Step::Websocket(Box::new(MaybeTlsStream::Plain(stream))),
        ));
    }
    let tls = socket::tls_config(config).map_err(|e| {
        Line::fail(
            "tls",
            e.to_string(),
            "check AUTONOMIC_CA_FILE, SSL_CERT_FILE and SSL_CERT_DIR",
        )
    })?;
    match tokio::time::timeout(STEP_TIMEOUT, socket::tls(config, tls, stream)).await {
        Ok(Ok(stream)) => {
            let version = match stream.get_ref().1.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => ", TLS 1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => ", TLS 1.2",
                _ => "",
            };
            let line = Line::ok(
                "tls",
                format!(
                    "{} presented a certificate this trust accepts{version}",
                    url.host
                ),
            );
            Ok((
                line,
                Step::Websocket(Box::new(MaybeTlsStream::Rustls(stream))),
            ))
        }
        Ok(Err(DialError::UnknownCa(_))) => Err(Line::fail(
            "tls",
            format!("the certificate of {target} is signed by an unknown CA"),
            "set AUTONOMIC_CA_FILE (or SSL_CERT_FILE) to a PEM file of the CA that signs it (a TLS-inspecting proxy's CA, if there is one)",
        )),
        Ok(Err(e)) => Err(Line::fail(
            "tls",
            format!("{target}: {e}"),
            "check AUTONOMIC_BASE_URL (host and port) and the trust: AUTONOMIC_CA_FILE, SSL_CERT_FILE",
        )),
        Err(_) => Err(Line::fail(
            "tls",
            format!("{target}: no handshake within {} s", STEP_TIMEOUT.as_secs()),
            "check that AUTONOMIC_BASE_URL's port speaks TLS (https://)",
        )),
    }
}

/// 9. The upgrade, which also checks the token: the token's line is left for step 10.
async fn websocket(
    dial: &Dial<'_>,
    stream: MaybeTlsStream<TcpStream>,
) -> Result<(Line, Step), Line> {
    let config = dial.config;
    if config.transport == Transport::Http {
        return token_line(
            Line::skip("websocket", "AUTONOMIC_TRANSPORT=http"),
            Line::skip("token", "AUTONOMIC_TRANSPORT=http"),
        );
    }
    let token = match read_token(config) {
        Ok(t) => t,
        Err(e) => {
            return token_line(
                Line::skip("websocket", "no token to send"),
                Line::fail(
                    "token",
                    e,
                    "set AUTONOMIC_AUTH_TOKEN, or mount the token Secret at AUTONOMIC_AUTH_TOKEN_FILE",
                ),
            );
        }
    };
    let endpoint = config.base_url.endpoint(true, "connect");
    let request = match socket::upgrade_request(config, &token) {
        Ok(r) => r,
        Err(e) => {
            return token_line(
                Line::skip("websocket", "no request to send"),
                Line::fail(
                    "token",
                    e.to_string(),
                    "copy the token again from the platform's dashboard",
                ),
            );
        }
    };
    let upgraded = tokio::time::timeout(
        STEP_TIMEOUT,
        socket::upgrade(config, &token, request, stream),
    )
    .await;
    upgrade_lines(&endpoint, &token, upgraded)
}

/// Steps 9 and 10 when no socket is left to close: the upgrade's line and the token's.
fn token_line(websocket: Line, token: Line) -> Result<(Line, Step), Line> {
    Ok((websocket, Step::Token(token, None)))
}

/// The lines of how the upgrade to `endpoint` went: both steps' when it got as far as
/// the token, else the upgrade's failure.
fn upgrade_lines(
    endpoint: &str,
    token: &Token,
    upgraded: Result<Result<Socket, DialError>, tokio::time::error::Elapsed>,
) -> Result<(Line, Step), Line> {
    let base_fix = "check AUTONOMIC_BASE_URL: it must be the platform's URL (and nothing between may strip the Upgrade header)";
    Err(match upgraded {
        Ok(Ok(socket)) => {
            let websocket = Line::ok(
                "websocket",
                format!(
                    "{endpoint} upgraded ({})",
                    crate::protocol::frame::SUBPROTOCOL
                ),
            );
            let token = Line::ok("token", format!("accepted ({}…)", token.prefix()));
            return Ok((websocket, Step::Token(token, Some(Box::new(socket)))));
        }
        Ok(Err(DialError::Rejected { status, prefix })) => {
            return token_line(
                Line::skip(
                    "websocket",
                    format!("the token was refused first (HTTP {status})"),
                ),
                Line::fail(
                    "token",
                    format!("rejected (HTTP {status}) for token {prefix}…"),
                    "set AUTONOMIC_AUTH_TOKEN (or the Secret behind AUTONOMIC_AUTH_TOKEN_FILE) to a current token from the platform's dashboard",
                ),
            );
        }
        Ok(Err(DialError::NotFound { url })) => Line::fail(
            "websocket",
            format!("no control plane at {url} (HTTP 404)"),
            base_fix,
        ),
        Ok(Err(DialError::Http(status))) => Line::fail(
            "websocket",
            format!(
                "{endpoint} is not a WebSocket endpoint: it answered the upgrade with HTTP {status}"
            ),
            base_fix,
        ),
        Ok(Err(e)) => Line::fail("websocket", format!("{endpoint}: {e}"), base_fix),
        Err(_) => Line::fail(
            "websocket",
            format!(
                "{endpoint}: no answer to the upgrade within {} s",
                STEP_TIMEOUT.as_secs()
            ),
            base_fix,
        ),
    })
}

/// Closes the WebSocket at once (1000, no `hello`), waiting briefly for the peer's close.
async fn close<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    socket: &mut tokio_tungstenite::WebSocketStream<S>,
) {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let frame = CloseFrame {
        code: CloseCode::Normal,
        reason: "autonomic-manager check".into(),
    };
    let closing = async {
        if socket.close(Some(frame)).await.is_ok() {
            while let Some(Ok(_)) = socket.next().await {}
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), closing).await;
}
