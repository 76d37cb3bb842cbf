//! Steps 6–10 in managed mode: DNS, proxy or connect, TLS, WebSocket upgrade and
//! token — `connect::socket`'s own steps, run one at a time.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_tungstenite::MaybeTlsStream;

use super::{Line, Report, STEP_TIMEOUT};
use crate::config::{Config, Transport};
use crate::connect::read_token;
use crate::connect::socket::{self, DialError};

/// Steps 6–10 in managed mode: DNS, proxy (or a direct TCP connection), TLS, the
/// WebSocket upgrade and the token, each over the stream the one before opened.
pub(super) async fn control_plane_steps(config: &Config, report: &mut Report<'_>) {
    let after = |report: &mut Report<'_>, steps: &[&'static str], failed: &str| {
        for step in steps {
            report.line(Line::skip(step, format!("{failed} failed")));
        }
    };
    let url = &config.base_url;
    let proxy = socket::proxy_for(config);
    let target = url.authority();
    // Step 7's name: what it does here.
    let connect_step = if proxy.is_some() { "proxy" } else { "connect" };

    // 6. DNS: the host this process connects to (the proxy's, when one applies: the
    // proxy resolves the control plane's).
    let (host, port, whose, fix) = match proxy {
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
        report.line(Line::ok(
            "dns",
            format!("{whose}{host} is an address (nothing to resolve)"),
        ));
    } else {
        let lookup = tokio::net::lookup_host((host.as_str(), port));
        match tokio::time::timeout(STEP_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => {
                let ips: BTreeSet<String> = addrs.map(|a| a.ip().to_string()).collect();
                let shown: Vec<String> = ips.iter().take(3).cloned().collect();
                let more = if ips.len() > 3 { ", …" } else { "" };
                report.line(Line::ok(
                    "dns",
                    format!("{whose}{host} resolves to {}{more}", shown.join(", ")),
                ));
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {} s", STEP_TIMEOUT.as_secs()),
                };
                report.line(Line::fail(
                    "dns",
                    format!("cannot resolve {whose}{host}: {why}"),
                    fix,
                ));
                return after(report, &[connect_step, "tls", "websocket", "token"], "dns");
            }
        }
    }

    // 7. TCP, through the proxy (CONNECT) or directly.
    type Connecting<'a> =
        std::pin::Pin<Box<dyn Future<Output = Result<TcpStream, DialError>> + Send + 'a>>;
    let (step, connected): (&'static str, Connecting<'_>) = match proxy {
        Some(p) => ("proxy", Box::pin(socket::connect_through(p, &target))),
        None => ("connect", Box::pin(socket::connect_direct(target.clone()))),
    };
    let stream = match tokio::time::timeout(STEP_TIMEOUT, connected).await {
        Ok(Ok(stream)) => {
            report.line(Line::ok(
                step,
                match proxy {
                    Some(p) => format!("CONNECT {target} through {p} established"),
                    None if config.https_proxy.is_some() => {
                        format!("{target} reached directly (NO_PROXY exempts it)")
                    }
                    None => format!("{target} reached directly (no HTTPS_PROXY)"),
                },
            ));
            stream
        }
        failed => {
            let line = match (failed, proxy) {
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
            };
            report.line(line);
            return after(report, &["tls", "websocket", "token"], step);
        }
    };

    // 8. TLS with the configured trust.
    let stream = if url.tls {
        let tls = match socket::tls_config(config) {
            Ok(t) => t,
            Err(e) => {
                report.line(Line::fail(
                    "tls",
                    e.to_string(),
                    "check AUTONOMIC_CA_FILE, SSL_CERT_FILE and SSL_CERT_DIR",
                ));
                return after(report, &["websocket", "token"], "tls");
            }
        };
        match tokio::time::timeout(STEP_TIMEOUT, socket::tls(config, tls, stream)).await {
            Ok(Ok(stream)) => {
                let version = match stream.get_ref().1.protocol_version() {
                    Some(rustls::ProtocolVersion::TLSv1_3) => ", TLS 1.3",
                    Some(rustls::ProtocolVersion::TLSv1_2) => ", TLS 1.2",
                    _ => "",
                };
                report.line(Line::ok(
                    "tls",
                    format!(
                        "{} presented a certificate this trust accepts{version}",
                        url.host
                    ),
                ));
                MaybeTlsStream::Rustls(stream)
            }
            failed => {
                let line = match failed {
                    Ok(Err(DialError::UnknownCa(_))) => Line::fail(
                        "tls",
                        format!("the certificate of {target} is signed by an unknown CA"),
                        "set AUTONOMIC_CA_FILE (or SSL_CERT_FILE) to a PEM file of the CA that signs it (a TLS-inspecting proxy's CA, if there is one)",
                    ),
                    Ok(Err(e)) => Line::fail(
                        "tls",
                        format!("{target}: {e}"),
                        "check AUTONOMIC_BASE_URL (host and port) and the trust: AUTONOMIC_CA_FILE, SSL_CERT_FILE",
                    ),
                    _ => Line::fail(
                        "tls",
                        format!("{target}: no handshake within {} s", STEP_TIMEOUT.as_secs()),
                        "check that AUTONOMIC_BASE_URL's port speaks TLS (https://)",
                    ),
                };
                report.line(line);
                return after(report, &["websocket", "token"], "tls");
            }
        }
    } else {
        report.line(Line::skip("tls", "plain http:// in AUTONOMIC_BASE_URL"));
        MaybeTlsStream::Plain(stream)
    };

    // 9–10. The upgrade, the token checked by it.
    if config.transport == Transport::Http {
        report.line(Line::skip("websocket", "AUTONOMIC_TRANSPORT=http"));
        report.line(Line::skip("token", "AUTONOMIC_TRANSPORT=http"));
        return;
    }
    let token = match read_token(config) {
        Ok(t) => t,
        Err(e) => {
            report.line(Line::skip("websocket", "no token to send"));
            report.line(Line::fail(
                "token",
                e,
                "set AUTONOMIC_AUTH_TOKEN, or mount the token Secret at AUTONOMIC_AUTH_TOKEN_FILE",
            ));
            return;
        }
    };
    let endpoint = url.endpoint(true, "connect");
    let request = match socket::upgrade_request(config, &token) {
        Ok(r) => r,
        Err(e) => {
            report.line(Line::skip("websocket", "no request to send"));
            report.line(Line::fail(
                "token",
                e.to_string(),
                "copy the token again from the platform's dashboard",
            ));
            return;
        }
    };
    report_upgrade(config, &endpoint, &token, request, stream, report).await;
}

async fn report_upgrade(
    config: &Config,
    endpoint: &str,
    token: &crate::config::Token,
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    stream: MaybeTlsStream<TcpStream>,
    report: &mut Report<'_>,
) {
    let upgraded = tokio::time::timeout(
        STEP_TIMEOUT,
        socket::upgrade(config, token, request, stream),
    )
    .await;
    let base_fix = "check AUTONOMIC_BASE_URL: it must be the platform's URL (and nothing between may strip the Upgrade header)";
    match upgraded {
        Ok(Ok(mut socket)) => {
            report.line(Line::ok(
                "websocket",
                format!(
                    "{endpoint} upgraded ({})",
                    crate::protocol::frame::SUBPROTOCOL
                ),
            ));
            report.line(Line::ok("token", format!("accepted ({}…)", token.prefix())));
            close(&mut socket).await;
        }
        Ok(Err(DialError::Rejected { status, prefix })) => {
            report.line(Line::skip(
                "websocket",
                format!("the token was refused first (HTTP {status})"),
            ));
            report.line(Line::fail(
                "token",
                format!("rejected (HTTP {status}) for token {prefix}…"),
                "set AUTONOMIC_AUTH_TOKEN (or the Secret behind AUTONOMIC_AUTH_TOKEN_FILE) to a current token from the platform's dashboard",
            ));
        }
        Ok(Err(DialError::NotFound { url })) => {
            report.line(Line::fail(
                "websocket",
                format!("no control plane at {url} (HTTP 404)"),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
        Ok(Err(DialError::Http(status))) => {
            report.line(Line::fail(
                "websocket",
                format!("{endpoint} is not a WebSocket endpoint: it answered the upgrade with HTTP {status}"),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
        Ok(Err(e)) => {
            report.line(Line::fail(
                "websocket",
                format!("{endpoint}: {e}"),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
        Err(_) => {
            report.line(Line::fail(
                "websocket",
                format!(
                    "{endpoint}: no answer to the upgrade within {} s",
                    STEP_TIMEOUT.as_secs()
                ),
                base_fix,
            ));
            report.line(Line::skip("token", "websocket failed"));
        }
    }
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
