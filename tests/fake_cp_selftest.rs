//! The fake control plane, driven by a plain tokio-tungstenite client: no cluster,
//! no manager. If these fail, the connection tests' failures mean nothing.
mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::fake_cp::*;
use support::wait_until;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

const TOKEN: &str = "Bearer tok-selftest-123456";

/// Dials `<base>/api/autonomic/connect` (or `path` under the base) as the manager does.
async fn dial_path(base: &str, path: &str) -> Result<(Client, String), Error> {
    let url = format!("{}{path}", base.replacen("http://", "ws://", 1));
    let mut req = url.into_client_request().unwrap();
    let h = req.headers_mut();
    h.insert("authorization", TOKEN.parse().unwrap());
    h.insert("sec-websocket-protocol", "autonomic.v1".parse().unwrap());
    h.insert("user-agent", "autonomic-manager/selftest".parse().unwrap());
    let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
    let proto = resp
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    Ok((ws, proto))
}

async fn dial(cp: &FakeCp) -> Client {
    let (ws, proto) = dial_path(&cp.url(), "/api/autonomic/connect")
        .await
        .expect("upgrade accepted");
    assert_eq!(proto, "autonomic.v1");
    ws
}

fn status_of(r: Result<(Client, String), Error>) -> u16 {
    match r {
        Err(Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("expected an HTTP error, got {e}"),
        Ok(_) => panic!("expected an HTTP error, the upgrade was accepted"),
    }
}

/// The next data or close message from the fake (pings/pongs skipped), within `within`.
async fn next_msg(ws: &mut Client, within: Duration) -> Option<Message> {
    tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(m)) => return Some(m),
                _ => return None,
            }
        }
    })
    .await
    .expect("a message (or the end) within the timeout")
}

async fn next_json(ws: &mut Client) -> Value {
    match next_msg(ws, Duration::from_secs(10)).await {
        Some(Message::Text(t)) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// Asserts nothing arrives within `d`.
async fn assert_quiet(ws: &mut Client, d: Duration) {
    if let Ok(m) = tokio::time::timeout(d, ws.next()).await {
        panic!("expected silence, got {m:?}");
    }
}

fn hello() -> Value {
    json!({"type": "hello", "protocol": 1, "version": "0.0.0", "boot_id": "b",
           "cluster_id": "ns/host", "host": {}, "capabilities": []})
}

async fn send_json(ws: &mut Client, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

#[tokio::test]
async fn hello_gets_welcome_and_request_is_recorded() {
    let cp = FakeCp::start().await;
    assert!(cp.url().starts_with("http://127.0.0.1:"));
    assert!(!cp.connected());
    let mut ws = dial(&cp).await;
    send_json(&mut ws, hello()).await;
    let w = next_json(&mut ws).await;
    assert_eq!(
        w,
        json!({"type": "welcome", "deployment_id": "dep-test",
               "heartbeat_interval_s": 15, "snapshot_interval_s": 300})
    );
    cp.set_welcome(2, 30);
    send_json(&mut ws, hello()).await;
    let w = next_json(&mut ws).await;
    assert_eq!(w["heartbeat_interval_s"], 2);
    assert_eq!(w["snapshot_interval_s"], 30);

    let f = cp
        .wait_frame("hello", |f| f.frame_type() == Some("hello"))
        .await;
    assert_eq!(f.conn, 1);
    assert_eq!(f.json().unwrap()["cluster_id"], "ns/host");
    assert!(cp.connected());
    assert_eq!((cp.accepted(), cp.attempts()), (1, 1));
    let req = &cp.requests()[0];
    assert_eq!(req.path, "/api/autonomic/connect");
    assert_eq!(req.status, 101);
    assert_eq!(req.headers["authorization"], TOKEN);
    assert_eq!(req.headers["sec-websocket-protocol"], "autonomic.v1");
    assert_eq!(req.headers["user-agent"], "autonomic-manager/selftest");

    // The client's close is recorded and the connection counts as gone.
    ws.close(None).await.unwrap();
    let c = cp
        .wait_frame("client close", |f| matches!(f.kind, ReceivedKind::Close(_)))
        .await;
    assert_eq!(c.conn, 1);
    assert!(!cp.connected());
}

#[tokio::test]
async fn heartbeat_is_answered_unless_turned_off() {
    let cp = FakeCp::start().await;
    let mut ws = dial(&cp).await;
    send_json(
        &mut ws,
        json!({"type": "heartbeat", "sent_at": "2026-01-01T00:00:00Z"}),
    )
    .await;
    let hb = next_json(&mut ws).await;
    assert_eq!(hb["type"], "heartbeat");
    let at = hb["sent_at"].as_str().unwrap();
    assert_eq!(at.len(), "2026-01-01T00:00:00.000Z".len(), "{at}");
    assert!(at.ends_with('Z') && at.as_bytes()[10] == b'T', "{at}");
    let year: i32 = at[..4].parse().unwrap();
    assert!(year >= 2025, "{at}");

    cp.set_auto_heartbeat(false);
    send_json(
        &mut ws,
        json!({"type": "heartbeat", "sent_at": "2026-01-01T00:00:01Z"}),
    )
    .await;
    cp.wait_frame("the second heartbeat", |f| {
        f.json()
            .is_some_and(|v| v["sent_at"] == "2026-01-01T00:00:01Z")
    })
    .await;
    assert_quiet(&mut ws, Duration::from_millis(500)).await;
    let n = cp
        .frames()
        .iter()
        .filter(|f| f.frame_type() == Some("heartbeat"))
        .count();
    assert_eq!(n, 2);
}

#[test]
fn rfc3339_formats_by_hand() {
    let at =
        |s: u64, ms: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms));
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
    assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
    assert_eq!(at(951_868_800, 0), "2000-03-01T00:00:00.000Z");
    assert_eq!(at(1_798_761_599, 999), "2026-12-31T23:59:59.999Z");
    assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
    let _ = rfc3339(SystemTime::now());
}

#[tokio::test]
async fn reject_mode_answers_the_status() {
    let cp = FakeCp::start().await;
    for code in [401, 403, 404, 500, 503] {
        cp.set_mode(Mode::Reject(code));
        let r = dial_path(&cp.url(), "/api/autonomic/connect").await;
        assert_eq!(status_of(r), code);
    }
    assert_eq!((cp.accepted(), cp.attempts()), (0, 5));
    let statuses: Vec<u16> = cp.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [401, 403, 404, 500, 503]);
    assert!(cp.requests()[0].headers.contains_key("authorization"));
    assert!(!cp.connected());

    cp.set_mode(Mode::Accept);
    let _ws = dial(&cp).await;
    assert_eq!((cp.accepted(), cp.attempts()), (1, 6));
}

#[tokio::test]
async fn wrong_path_is_404_and_prefix_is_served() {
    let cp = FakeCp::start().await;
    let r = dial_path(&cp.url(), "/api/autonomic/other").await;
    assert_eq!(status_of(r), 404);
    let r = dial_path(&cp.url(), "/x/api/autonomic/connect").await;
    assert_eq!(status_of(r), 404);
    assert_eq!(cp.requests()[1].path, "/x/api/autonomic/connect");
    assert_eq!(cp.accepted(), 0);

    let cp = FakeCp::start_with_prefix("/tenant/eu").await;
    assert!(cp.url().ends_with("/tenant/eu"), "{}", cp.url());
    let r = dial_path(
        &cp.url().replace("/tenant/eu", ""),
        "/api/autonomic/connect",
    )
    .await;
    assert_eq!(status_of(r), 404);
    let mut ws = dial(&cp).await;
    send_json(&mut ws, hello()).await;
    assert_eq!(next_json(&mut ws).await["type"], "welcome");
    assert_eq!(cp.requests()[1].path, "/tenant/eu/api/autonomic/connect");

    // A trailing slash stays in url() (the manager must not double it) but not in the path.
    let cp = FakeCp::start_with_prefix("/p/").await;
    assert!(cp.url().ends_with("/p/"), "{}", cp.url());
    let r = dial_path(&cp.url(), "/api/autonomic/connect").await;
    assert_eq!(status_of(r), 404, "a doubled slash is another path");
    let base = cp.url().trim_end_matches('/').to_owned();
    dial_path(&base, "/api/autonomic/connect").await.unwrap();
    assert_eq!(cp.accepted(), 1);
}

#[tokio::test]
async fn close_4000_reaches_the_client_and_newest_connection_is_current() {
    let cp = FakeCp::start().await;
    let mut first = dial(&cp).await;
    let mut second = dial(&cp).await;
    assert_eq!(cp.accepted(), 2);

    // send() goes to the newest open connection.
    cp.send(json!({"type": "resync"})).await;
    assert_eq!(next_json(&mut second).await["type"], "resync");
    assert_quiet(&mut first, Duration::from_millis(200)).await;

    cp.close(4000, "evicted by newer connection").await;
    match next_msg(&mut second, Duration::from_secs(10)).await {
        Some(Message::Close(Some(CloseFrame { code, reason }))) => {
            assert_eq!(u16::from(code), 4000);
            assert_eq!(reason.as_str(), "evicted by newer connection");
        }
        other => panic!("expected close 4000, got {other:?}"),
    }
    // Reading on lets tungstenite flush its answer to the close, as a client loop would.
    assert!(
        next_msg(&mut second, Duration::from_secs(10))
            .await
            .is_none()
    );
    // The client's answer to the close is recorded on connection 2.
    let echo = cp
        .wait_frame("close echo", |f| {
            f.conn == 2 && matches!(f.kind, ReceivedKind::Close(_))
        })
        .await;
    assert_eq!(
        echo.kind,
        ReceivedKind::Close(Some((4000, "evicted by newer connection".into())))
    );

    // Connection 1 is current again.
    assert!(cp.connected());
    cp.send(json!({"type": "resync"})).await;
    assert_eq!(next_json(&mut first).await["type"], "resync");
    cp.close(4001, "token revoked").await;
    match next_msg(&mut first, Duration::from_secs(10)).await {
        Some(Message::Close(Some(f))) => assert_eq!(u16::from(f.code), 4001),
        other => panic!("expected close 4001, got {other:?}"),
    }
    assert!(!cp.connected());
}

#[tokio::test]
async fn frames_of_every_kind_are_sent_and_recorded() {
    let cp = FakeCp::start().await;
    let mut ws = dial(&cp).await;
    cp.send_raw("{not json").await;
    match next_msg(&mut ws, Duration::from_secs(10)).await {
        Some(Message::Text(t)) => assert_eq!(t.as_str(), "{not json"),
        other => panic!("{other:?}"),
    }
    cp.send_binary(vec![0, 0, 0, 7, 1, b'h', b'i']).await;
    match next_msg(&mut ws, Duration::from_secs(10)).await {
        Some(Message::Binary(b)) => assert_eq!(&b[..], &[0, 0, 0, 7, 1, b'h', b'i']),
        other => panic!("{other:?}"),
    }

    ws.send(Message::text("garbage")).await.unwrap();
    ws.send(Message::binary(vec![0, 0, 0, 1, 0, b'x']))
        .await
        .unwrap();
    send_json(&mut ws, json!({"type": "delta", "seq": 2, "changes": []})).await;
    let d = cp
        .wait_frame("delta", |f| f.frame_type() == Some("delta"))
        .await;
    assert_eq!(d.json().unwrap()["seq"], 2);
    let frames = cp.frames();
    assert_eq!(frames.len(), 3);
    assert_eq!(
        frames[0].kind,
        ReceivedKind::Text(Value::String("garbage".into()))
    );
    assert_eq!(frames[0].frame_type(), None);
    assert_eq!(
        frames[1].kind,
        ReceivedKind::Binary(vec![0, 0, 0, 1, 0, b'x'])
    );
    assert!(frames[0].at <= frames[1].at && frames[1].at <= frames[2].at);
}

#[tokio::test]
async fn drop_connection_sends_no_close_frame() {
    let cp = FakeCp::start().await;
    let mut ws = dial(&cp).await;
    assert!(cp.connected());
    cp.drop_connection().await;
    assert!(!cp.connected());
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        Ok(None) | Ok(Some(Err(_))) => {}
        other => panic!("expected the TCP connection to end without a close frame, got {other:?}"),
    }
}

#[tokio::test]
async fn stop_and_restart_on_the_same_port() {
    let cp = FakeCp::start().await;
    let url = cp.url();
    let mut ws = dial(&cp).await;
    send_json(&mut ws, hello()).await;
    next_json(&mut ws).await;

    cp.stop().await;
    assert!(!cp.connected());
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        Ok(None) | Ok(Some(Err(_))) => {}
        other => panic!("expected the connection to end, got {other:?}"),
    }
    match dial_path(&url, "/api/autonomic/connect").await {
        Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused),
        Err(e) => panic!("expected connection refused, got {e}"),
        Ok(_) => panic!("expected connection refused, the upgrade was accepted"),
    }
    cp.stop().await; // idempotent

    cp.restart().await;
    assert_eq!(cp.url(), url);
    let mut ws = dial(&cp).await;
    send_json(&mut ws, hello()).await;
    assert_eq!(next_json(&mut ws).await["type"], "welcome");
    assert_eq!(cp.accepted(), 2);
    let h = cp
        .wait_frame("hello on the second connection", |f| {
            f.conn == 2 && f.frame_type() == Some("hello")
        })
        .await;
    assert_eq!(h.conn, 2);
}

#[tokio::test]
async fn silent_mode_sends_nothing() {
    let cp = FakeCp::start().await;
    cp.set_mode(Mode::Silent);
    let mut ws = dial(&cp).await;
    assert_eq!(cp.requests()[0].status, 101);
    send_json(&mut ws, hello()).await;
    send_json(
        &mut ws,
        json!({"type": "heartbeat", "sent_at": "2026-01-01T00:00:00Z"}),
    )
    .await;
    ws.send(Message::Ping(b"p".to_vec().into())).await.unwrap();
    cp.wait_frame("heartbeat", |f| f.frame_type() == Some("heartbeat"))
        .await;
    // No welcome, no heartbeat, not even a pong.
    if let Ok(m) = tokio::time::timeout(Duration::from_millis(1500), ws.next()).await {
        panic!("silent mode sent {m:?}");
    }
    assert!(cp.connected());

    // The mode applies to the next upgrades only: the silent connection stays silent.
    cp.set_mode(Mode::Accept);
    send_json(&mut ws, hello()).await;
    assert_quiet(&mut ws, Duration::from_millis(500)).await;
    let mut ws2 = dial(&cp).await;
    send_json(&mut ws2, hello()).await;
    assert_eq!(next_json(&mut ws2).await["type"], "welcome");
}

#[tokio::test]
async fn dropping_the_fake_closes_everything() {
    let cp = FakeCp::start().await;
    let url = cp.url();
    let mut ws = dial(&cp).await;
    drop(cp);
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        Ok(None) | Ok(Some(Err(_))) => {}
        other => panic!("expected the connection to end, got {other:?}"),
    }
    assert!(dial_path(&url, "/api/autonomic/connect").await.is_err());
}

/// Works even from a test that blocks its own (single) runtime thread: the fake
/// answers from a runtime of its own.
#[tokio::test]
async fn answers_while_the_test_thread_blocks() {
    let cp = FakeCp::start().await;
    let url = cp.url();
    let t = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let (mut ws, _) = dial_path(&url, "/api/autonomic/connect").await.unwrap();
                send_json(&mut ws, hello()).await;
                next_json(&mut ws).await
            })
    });
    // Blocks this runtime's only thread until the other side got its welcome.
    let w = t.join().unwrap();
    assert_eq!(w["type"], "welcome");
    assert_eq!(cp.accepted(), 1);
}

/// A rustls client config trusting only `ca` (no roots at all without it).
fn tls_client(ca: Option<&std::path::Path>) -> tokio_tungstenite::Connector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_tungstenite::Connector::Rustls(std::sync::Arc::new(config))
}

/// Dials `wss://<host>:<port>/api/autonomic/connect` with `connector`.
async fn dial_tls(
    host: &str,
    cp: &FakeCp,
    connector: tokio_tungstenite::Connector,
) -> Result<Client, Error> {
    let url = format!("wss://{host}:{}/api/autonomic/connect", cp.port());
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "autonomic.v1".parse().unwrap());
    tokio_tungstenite::connect_async_tls_with_config(req, None, false, Some(connector))
        .await
        .map(|(ws, _)| ws)
}

#[tokio::test]
async fn tls_mode_serves_wss_to_clients_that_trust_the_ca() {
    let (ca, cert, key) = support::pki::test_pki();
    let cp = FakeCp::start_tls(&cert, &key).await;
    assert_eq!(cp.url(), format!("https://127.0.0.1:{}", cp.port()));

    // A client that does not trust the CA fails the handshake; nothing is accepted.
    let err = dial_tls("127.0.0.1", &cp, tls_client(None))
        .await
        .expect_err("an untrusted certificate is refused");
    assert!(err.to_string().contains("certificate"), "{err}");
    // Plain ws to the TLS port gets no upgrade either.
    assert!(
        dial_path(
            &cp.url().replacen("https://", "http://", 1),
            "/api/autonomic/connect"
        )
        .await
        .is_err()
    );
    wait_until("two failed TLS handshakes", || async {
        cp.tls_failures() >= 2
    })
    .await;
    assert_eq!((cp.tls_failures(), cp.accepted(), cp.attempts()), (2, 0, 0));

    // Trusting the CA: the IP SAN and the DNS SAN both verify, and the protocol runs.
    for (n, host) in [(1, "127.0.0.1"), (2, "localhost")] {
        let mut ws = dial_tls(host, &cp, tls_client(Some(&ca)))
            .await
            .unwrap_or_else(|e| panic!("wss to {host}: {e}"));
        send_json(&mut ws, hello()).await;
        assert_eq!(next_json(&mut ws).await["type"], "welcome");
        let f = cp
            .wait_frame("hello over wss", |f| {
                f.conn == n && f.frame_type() == Some("hello")
            })
            .await;
        assert_eq!(f.json().unwrap()["cluster_id"], "ns/host");
        assert_eq!(cp.accepted(), n);
    }
}
