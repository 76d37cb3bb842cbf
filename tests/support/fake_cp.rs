//! A fake control plane for the integration tests: it speaks `autonomic.v1`
//! (shared/spec/PROTOCOL.md §2–§4) on `127.0.0.1`, records every upgrade request and
//! every message it receives, and misbehaves on command (rejects upgrades, stays
//! silent, closes with a code, drops the TCP connection, goes away and comes back).
//!
//! The fake runs on a runtime of its own, on a thread of its own: it keeps answering
//! while a test blocks its own thread (for instance in `Manager::wait_log`), whatever
//! the test's runtime flavour, and a paused test clock does not stop it. Dropping the
//! [`FakeCp`] shuts that runtime down, which ends every task and closes every socket.
//!
//! [`FakeCp::start_tls`] serves the same over TLS (`wss`) with a certificate the test
//! supplies (see `support::pki`), for the private-CA tests of `AUTONOMIC_CA_FILE`.
//!
//! The HTTP request head is read by hand, so requests that are not (valid) WebSocket
//! upgrades are recorded and answered too (404 for another path, 400 for a bad
//! upgrade); accepted upgrades are handed to tungstenite's server handshake.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request as WsRequest, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

/// The subprotocol the manager offers and the fake chooses.
pub const SUBPROTOCOL: &str = "autonomic.v1";
/// The path under the base URL the manager dials (§2).
pub const CONNECT_PATH: &str = "/api/autonomic/connect";
/// How long [`FakeCp::wait_frame`] waits before it fails the test.
pub const FRAME_WAIT: Duration = Duration::from_secs(60);

/// How the fake answers the next upgrade requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Complete the handshake, answer `hello` with `welcome` and heartbeats with heartbeats.
    Accept,
    /// Answer the upgrade with this HTTP status (401, 403, 404, 500, …).
    Reject(u16),
    /// Complete the handshake, then never send a byte: no welcome, no heartbeats, not
    /// even the automatic pong or close replies. Messages are still recorded.
    Silent,
    /// As `Accept`, but `hello` gets no `welcome`: the manager waits its welcome timeout
    /// and, meanwhile, serves what the test sends (its session not yet past a snapshot).
    NoWelcome,
}

/// One message received from a client.
#[derive(Debug, Clone)]
pub struct Received {
    /// The connection it arrived on, 1-based in the order upgrades were accepted.
    pub conn: usize,
    pub at: Instant,
    pub kind: ReceivedKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ReceivedKind {
    /// A text message, parsed; `Value::String(raw)` when it is not JSON.
    Text(Value),
    Binary(Vec<u8>),
    /// A close frame: `(code, reason)` when it carried one.
    Close(Option<(u16, String)>),
}

impl Received {
    /// The `type` of a JSON text frame.
    pub fn frame_type(&self) -> Option<&str> {
        self.json()?.get("type")?.as_str()
    }

    /// The parsed text frame (a `Value::String` when it was not JSON).
    pub fn json(&self) -> Option<&Value> {
        match &self.kind {
            ReceivedKind::Text(v) => Some(v),
            _ => None,
        }
    }

    /// The wire resources a `snapshot` or `delta` carries (a removal carries none);
    /// empty for any other frame.
    pub fn resources(&self) -> Vec<&Value> {
        let Some(j) = self.json() else {
            return Vec::new();
        };
        match self.frame_type() {
            Some("snapshot") => j["resources"].as_array().into_iter().flatten().collect(),
            Some("delta") => j["changes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| &c["resource"])
                .filter(|r| !r.is_null())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A short label for failure messages: `1:hello`, `2:<binary>`, `1:<close 1000>`.
    fn label(&self) -> String {
        let what = match &self.kind {
            ReceivedKind::Text(Value::String(_)) => "<not json>".to_owned(),
            ReceivedKind::Text(v) => v
                .get("type")
                .and_then(Value::as_str)
                .map_or_else(|| "<no type>".to_owned(), str::to_owned),
            ReceivedKind::Binary(_) => "<binary>".to_owned(),
            ReceivedKind::Close(Some((code, _))) => format!("<close {code}>"),
            ReceivedKind::Close(None) => "<close>".to_owned(),
        };
        format!("{}:{what}", self.conn)
    }
}

/// One upgrade request, accepted or not.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request path, without the query string.
    pub path: String,
    /// Header names lowercased; repeated headers joined with `", "`.
    pub headers: BTreeMap<String, String>,
    /// The HTTP status answered (101 when the upgrade was accepted).
    pub status: u16,
}

/// The fake control plane. Not `Clone`: dropping it shuts it down.
pub struct FakeCp {
    inner: Arc<Inner>,
    rt: tokio::runtime::Handle,
    port: u16,
    prefix: String,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    state: Mutex<State>,
    /// Served path: `<prefix without trailing slash>/api/autonomic/connect`.
    path: String,
    /// Set in TLS mode: every accepted TCP connection runs a TLS handshake first.
    tls: Option<TlsAcceptor>,
    /// The address listened on (loopback unless started with `start_tls_on`).
    ip: std::net::Ipv4Addr,
}

/// A byte stream the fake serves on: plain TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type Stream = Box<dyn Io>;

struct State {
    mode: Mode,
    /// The one bearer token accepted, when set.
    token: Option<String>,
    heartbeat_interval_s: u64,
    snapshot_interval_s: u64,
    deployment_id: String,
    auto_heartbeat: bool,
    /// Send a heartbeat of its own this often on each new connection (§4.5: both sides
    /// send them), besides the answers of `auto_heartbeat`.
    heartbeat_every: Option<Duration>,
    accepted: usize,
    /// The most connections ever open at one instant.
    max_open: usize,
    tls_failures: usize,
    requests: Vec<Request>,
    frames: Vec<Received>,
    /// Binary messages keep at most this many payload bytes (a flood would fill memory).
    binary_keep: usize,
    /// The largest message taken from a connection accepted from now on; a larger one
    /// is refused as a platform does: close 1009, the rest read and dropped.
    max_message: Option<usize>,
    /// Payload bytes received per shell channel, whole (before `binary_keep`).
    binary_bytes: BTreeMap<u32, u64>,
    conns: Vec<Conn>,
    listener: Option<JoinHandle<()>>,
    sockets: Vec<JoinHandle<()>>,
}

struct Conn {
    id: usize,
    open: bool,
    tx: mpsc::UnboundedSender<Cmd>,
}

enum Cmd {
    Send(Message, oneshot::Sender<Result<(), String>>),
    Close(u16, String, oneshot::Sender<Result<(), String>>),
    Drop(oneshot::Sender<()>),
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked elsewhere must not turn every later call into a panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, conn: usize, at: Instant, kind: ReceivedKind) {
        self.state().record(conn, at, kind);
    }

    fn mark_closed(&self, conn: usize) {
        self.state().mark_closed(conn);
    }

    /// Records a close frame and marks its connection closed under one lock, so no one
    /// sees the frame while the connection still looks open.
    fn record_close(&self, conn: usize, frame: Option<(u16, String)>) {
        let mut s = self.state();
        s.record(conn, Instant::now(), ReceivedKind::Close(frame));
        s.mark_closed(conn);
    }
}

impl State {
    fn record(&mut self, conn: usize, at: Instant, kind: ReceivedKind) {
        self.frames.push(Received { conn, at, kind });
    }

    fn mark_closed(&mut self, conn: usize) {
        if let Some(c) = self.conns.iter_mut().find(|c| c.id == conn) {
            c.open = false;
        }
    }
}

impl FakeCp {
    /// Listens on `127.0.0.1:<free port>` and serves `/api/autonomic/connect`.
    pub async fn start() -> FakeCp {
        FakeCp::start_with_prefix("").await
    }

    /// Serves `<prefix>/api/autonomic/connect`; every other path gets 404. A trailing
    /// slash on the prefix is not doubled in the served path, but [`url`](Self::url)
    /// keeps it as given, so tests can hand the manager a base URL ending in `/`.
    pub async fn start_with_prefix(prefix: &str) -> FakeCp {
        FakeCp::start_inner(prefix, None).await
    }

    /// Like [`start`](Self::start), over TLS: serves `wss` on `127.0.0.1:<free port>`
    /// with the certificate chain `cert_pem` (leaf first) and its private key `key_pem`
    /// (PKCS#8, PKCS#1 or SEC1). [`url`](Self::url) then starts with `https://`.
    /// A client that does not finish the TLS handshake is counted in
    /// [`tls_failures`](Self::tls_failures) and never reaches the WebSocket layer.
    pub async fn start_tls(cert_pem: &str, key_pem: &str) -> FakeCp {
        FakeCp::start_inner("", Some(tls_acceptor(cert_pem, key_pem))).await
    }

    /// Like [`start_tls`](Self::start_tls), listening on `ip` instead of loopback: the
    /// test bed's bridge address, where pods (an in-cluster manager) reach it.
    pub async fn start_tls_on(ip: std::net::Ipv4Addr, cert_pem: &str, key_pem: &str) -> FakeCp {
        FakeCp::start_on(ip, "", Some(tls_acceptor(cert_pem, key_pem))).await
    }

    /// Like [`start`](Self::start), on a given port of `127.0.0.1` (retrying for up to
    /// 10 s while it is taken): a new control plane where an old one (dropped) listened,
    /// as a restarted control plane comes back at the same address.
    pub async fn start_at(port: u16) -> FakeCp {
        FakeCp::start_on_port(std::net::Ipv4Addr::LOCALHOST, port, "", None).await
    }

    async fn start_inner(prefix: &str, tls: Option<TlsAcceptor>) -> FakeCp {
        FakeCp::start_on(std::net::Ipv4Addr::LOCALHOST, prefix, tls).await
    }

    async fn start_on(ip: std::net::Ipv4Addr, prefix: &str, tls: Option<TlsAcceptor>) -> FakeCp {
        FakeCp::start_on_port(ip, 0, prefix, tls).await
    }

    async fn start_on_port(
        ip: std::net::Ipv4Addr,
        port: u16,
        prefix: &str,
        tls: Option<TlsAcceptor>,
    ) -> FakeCp {
        let prefix = if prefix.is_empty() || prefix.starts_with('/') {
            prefix.to_owned()
        } else {
            format!("/{prefix}")
        };
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                mode: Mode::Accept,
                token: None,
                heartbeat_interval_s: 15,
                snapshot_interval_s: 300,
                deployment_id: "dep-test".into(),
                auto_heartbeat: true,
                heartbeat_every: None,
                accepted: 0,
                max_open: 0,
                tls_failures: 0,
                requests: Vec::new(),
                frames: Vec::new(),
                binary_keep: usize::MAX,
                max_message: None,
                binary_bytes: BTreeMap::new(),
                conns: Vec::new(),
                listener: None,
                sockets: Vec::new(),
            }),
            path: format!("{}{CONNECT_PATH}", prefix.trim_end_matches('/')),
            tls,
            ip,
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("fake control plane runtime");
        let handle = rt.handle().clone();
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fake-cp".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime drops every task: listener and sockets close.
                drop(rt);
            })
            .expect("fake control plane thread");
        let mut cp = FakeCp {
            inner,
            rt: handle,
            port: 0,
            prefix,
            shutdown: Some(shutdown),
            thread: Some(thread),
        };
        cp.port = cp.listen(port).await;
        cp
    }

    /// The base URL to give the manager (`AUTONOMIC_BASE_URL`).
    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{}{}", self.inner.ip, self.port, self.prefix)
    }

    /// The port listened on; the same across [`stop`](Self::stop)/[`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How the next upgrade requests are answered.
    pub fn set_mode(&self, mode: Mode) {
        self.inner.state().mode = mode;
    }

    /// Accept only upgrades carrying `Bearer <token>` (401 for any other); None: any.
    pub fn set_token(&self, token: Option<&str>) {
        self.inner.state().token = token.map(str::to_owned);
    }

    /// The intervals the next `welcome` frames carry (defaults 15 and 300).
    pub fn set_welcome(&self, heartbeat_interval_s: u64, snapshot_interval_s: u64) {
        let mut s = self.inner.state();
        s.heartbeat_interval_s = heartbeat_interval_s;
        s.snapshot_interval_s = snapshot_interval_s;
    }

    /// Whether a `heartbeat` from the manager is answered with one (default true).
    pub fn set_auto_heartbeat(&self, on: bool) {
        self.inner.state().auto_heartbeat = on;
    }

    /// Whether each connection accepted from now on sends a heartbeat of its own every
    /// `every` (default None: heartbeats only answer the manager's), as a control plane
    /// following §4.5 does: it then keeps talking while the manager's own heartbeats
    /// wait behind a large snapshot on a slow link.
    pub fn set_heartbeat_every(&self, every: Option<Duration>) {
        self.inner.state().heartbeat_every = every;
    }

    /// Upgrades accepted (101) so far.
    pub fn accepted(&self) -> usize {
        self.inner.state().accepted
    }

    /// The most connections that were ever open at the same instant (a connection
    /// counts from its upgrade until its close frame arrives or its socket ends).
    pub fn max_connections(&self) -> usize {
        self.inner.state().max_open
    }
    /// TLS mode: connections whose TLS handshake failed (the client did not trust the
    /// certificate, or spoke plain HTTP) or did not finish within 10 s.
    pub fn tls_failures(&self) -> usize {
        self.inner.state().tls_failures
    }

    /// Upgrade requests seen so far, accepted or not.
    pub fn attempts(&self) -> usize {
        self.inner.state().requests.len()
    }

    /// Every upgrade request, in arrival order, with the status answered.
    pub fn requests(&self) -> Vec<Request> {
        self.inner.state().requests.clone()
    }

    /// Refuse a message over `n` bytes on connections accepted from now on: close 1009
    /// "message too big" once that much has come, then read and drop the rest.
    pub fn set_max_message(&self, n: usize) {
        self.inner.state().max_message = Some(n);
    }

    /// Keep at most `n` payload bytes of each binary message from now on (the byte
    /// counts of [`FakeCp::binary_bytes`] stay whole).
    pub fn set_binary_keep(&self, n: usize) {
        self.inner.state().binary_keep = n;
    }

    /// Shell payload bytes received on `channel` (stdout and stderr), all connections.
    pub fn binary_bytes(&self, channel: u32) -> u64 {
        self.inner
            .state()
            .binary_bytes
            .get(&channel)
            .copied()
            .unwrap_or(0)
    }

    /// The kept output bytes of `channel` on `stream` (1 stdout, 2 stderr), in order.
    pub fn output(&self, channel: u32, stream: u8) -> Vec<u8> {
        let mut out = Vec::new();
        for f in &self.inner.state().frames {
            if let ReceivedKind::Binary(b) = &f.kind
                && b.len() >= 5
                && b[..4] == channel.to_be_bytes()
                && b[4] == stream
            {
                out.extend_from_slice(&b[5..]);
            }
        }
        out
    }

    /// Every message received, all connections, in arrival order.
    pub fn frames(&self) -> Vec<Received> {
        self.inner.state().frames.clone()
    }

    /// Returns the first frame ever received (any connection, oldest first) for which
    /// `pred` holds, polling until there is one. Filter on `conn` or `at` to wait for a
    /// later one. Panics after [`FRAME_WAIT`] naming `what` and the frames seen.
    pub async fn wait_frame(&self, what: &str, pred: impl Fn(&Received) -> bool) -> Received {
        self.wait_frame_within(what, FRAME_WAIT, pred).await
    }

    /// [`wait_frame`](Self::wait_frame) with a wait of its own (a benchmark's start at
    /// 100 000 Agents takes longer than [`FRAME_WAIT`]).
    pub async fn wait_frame_within(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&Received) -> bool,
    ) -> Received {
        // Real time: a paused test clock must neither stall nor shorten the wait.
        let deadline = Instant::now() + within;
        loop {
            if let Some(f) = self.inner.state().frames.iter().find(|f| pred(f)) {
                return f.clone();
            }
            if Instant::now() >= deadline {
                panic!(
                    "fake control plane: no frame for {what:?} within {within:?}; \
                     frames seen (conn:type): [{}]; upgrades accepted {} of {}",
                    summarize(&self.frames()),
                    self.accepted(),
                    self.attempts()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends a JSON text frame on the current connection; returns once it is written.
    pub async fn send(&self, frame: Value) {
        self.send_message(Message::text(frame.to_string())).await;
    }

    /// Sends arbitrary text (garbage, truncated JSON, …) on the current connection.
    pub async fn send_raw(&self, text: &str) {
        self.send_message(Message::text(text)).await;
    }

    /// Sends a binary message on the current connection.
    pub async fn send_binary(&self, bytes: Vec<u8>) {
        self.send_message(Message::binary(bytes)).await;
    }

    /// Sends any message (a raw frame too, e.g. one fragment of a message) on the
    /// current connection and says how it went instead of failing the test: a
    /// manager may refuse a hostile message by ending the connection mid-write.
    pub async fn try_send(&self, msg: Message) -> Result<(), String> {
        let open = {
            let s = self.inner.state();
            s.conns
                .iter()
                .filter(|c| c.open)
                .max_by_key(|c| c.id)
                .map(|c| (c.id, c.tx.clone()))
        };
        let (id, tx) = open.ok_or("no open connection")?;
        let (ack, done) = oneshot::channel();
        let _ = tx.send(Cmd::Send(msg, ack));
        done.await
            .unwrap_or_else(|_| Err(format!("connection {id} ended before the send")))
    }

    /// Sends `msgs` in order on the current connection, waiting for the writer every
    /// 10 000 of them rather than after each: for floods of millions of small messages.
    pub async fn send_flood(&self, msgs: impl IntoIterator<Item = Message>) {
        let (id, tx) = self.current("send");
        let mut last = None;
        for (i, msg) in msgs.into_iter().enumerate() {
            let (ack, done) = oneshot::channel();
            let _ = tx.send(Cmd::Send(msg, ack));
            last = Some(done);
            if i % 10_000 == 9_999 {
                Self::sent(id, last.take()).await;
            }
        }
        Self::sent(id, last).await;
    }

    async fn sent(id: usize, done: Option<oneshot::Receiver<Result<(), String>>>) {
        let Some(done) = done else { return };
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("fake control plane: send on connection {id} failed: {e}"),
            Err(_) => panic!("fake control plane: connection {id} ended before the send"),
        }
    }

    /// The `deployment_id` the next `welcome` frames carry (default `dep-test`).
    pub fn set_deployment_id(&self, id: &str) {
        self.inner.state().deployment_id = id.to_owned();
    }

    async fn send_message(&self, msg: Message) {
        self.send_flood([msg]).await;
    }

    /// Closes the current connection with a close frame (e.g. 4000 `evicted by newer
    /// connection`). The connection stops being current at once; the fake then waits
    /// (up to 5 s, in the background) for the client's closing answer, which is recorded.
    pub async fn close(&self, code: u16, reason: &str) {
        let (id, tx) = self.current("close");
        self.inner.mark_closed(id);
        let (ack, done) = oneshot::channel();
        let _ = tx.send(Cmd::Close(code, reason.to_owned(), ack));
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("fake control plane: close of connection {id} failed: {e}"),
            Err(_) => panic!("fake control plane: connection {id} ended before the close"),
        }
    }

    /// Drops the current connection's TCP socket without a close frame.
    pub async fn drop_connection(&self) {
        let (id, tx) = self.current("drop");
        self.inner.mark_closed(id);
        let (ack, done) = oneshot::channel();
        let _ = tx.send(Cmd::Drop(ack));
        // An error means the task ended on its own meanwhile: dropped all the same.
        let _ = done.await;
    }

    /// Stops listening and drops every connection, like a control plane going down.
    /// Returns once the port is closed. A no-op when already stopped.
    pub async fn stop(&self) {
        let listener = self.inner.state().listener.take();
        if let Some(task) = listener {
            task.abort();
            let _ = task.await;
        }
        let sockets = std::mem::take(&mut self.inner.state().sockets);
        for task in sockets {
            task.abort();
            let _ = task.await;
        }
        let mut s = self.inner.state();
        for c in &mut s.conns {
            c.open = false;
        }
    }

    /// Listens again on the same port (retrying for up to 10 s while it is taken).
    /// A no-op when listening.
    pub async fn restart(&self) {
        if self.inner.state().listener.is_none() {
            self.listen(self.port).await;
        }
    }

    /// Whether a connection is open right now (one the fake has not closed or dropped
    /// and whose client has not closed or gone away).
    pub fn connected(&self) -> bool {
        self.inner.state().conns.iter().any(|c| c.open)
    }

    /// The newest open connection.
    fn current(&self, what: &str) -> (usize, mpsc::UnboundedSender<Cmd>) {
        let s = self.inner.state();
        s.conns
            .iter()
            .filter(|c| c.open)
            .max_by_key(|c| c.id)
            .map(|c| (c.id, c.tx.clone()))
            .unwrap_or_else(|| {
                panic!(
                    "fake control plane: {what}: no open connection (accepted {}, frames seen: [{}])",
                    s.accepted,
                    summarize(&s.frames)
                )
            })
    }

    /// Binds `port` (0: any) on the fake's runtime and starts accepting; returns the port.
    async fn listen(&self, port: u16) -> u16 {
        let inner = self.inner.clone();
        let (bound, on_bound) = oneshot::channel();
        let task = self.rt.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let listener = loop {
                match bind(inner.ip, port) {
                    Ok(l) => break l,
                    Err(e) if port == 0 || Instant::now() >= deadline => {
                        let _ = bound.send(Err(e));
                        return;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            let _ = bound.send(listener.local_addr().map(|a| a.port()));
            accept_loop(inner, listener).await;
        });
        let port = match on_bound.await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => panic!("fake control plane: cannot listen on 127.0.0.1:{port}: {e}"),
            Err(_) => panic!("fake control plane: listener task ended"),
        };
        self.inner.state().listener = Some(task);
        port
    }
}

impl Drop for FakeCp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `1:hello, 1:snapshot, 1:delta×12, …`: consecutive repeats folded.
fn summarize(frames: &[Received]) -> String {
    let mut out: Vec<(String, usize)> = Vec::new();
    for f in frames {
        let l = f.label();
        match out.last_mut() {
            Some((last, n)) if *last == l => *n += 1,
            _ => out.push((l, 1)),
        }
    }
    out.into_iter()
        .map(|(l, n)| if n > 1 { format!("{l}×{n}") } else { l })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binds with SO_REUSEADDR so a restart is not refused while old sockets sit in TIME_WAIT.
fn bind(ip: std::net::Ipv4Addr, port: u16) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from((ip, port)))?;
    socket.listen(1024)
}

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                let task = tokio::spawn(serve_tcp(inner.clone(), tcp));
                let mut s = inner.state();
                s.sockets.retain(|t| !t.is_finished());
                s.sockets.push(task);
            }
            // E.g. too many open files: do not spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The server side of TLS mode, from PEM text; panics (failing the test) on bad input.
fn tls_acceptor(cert_pem: &str, key_pem: &str) -> TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("fake control plane: bad certificate PEM: {e}"));
    assert!(
        !certs.is_empty(),
        "fake control plane: no certificate in the certificate PEM"
    );
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .unwrap_or_else(|e| panic!("fake control plane: bad private key PEM: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("fake control plane: TLS protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap_or_else(|e| panic!("fake control plane: certificate and key do not fit: {e}"));
    TlsAcceptor::from(Arc::new(config))
}

/// One accepted TCP connection: the TLS handshake first in TLS mode, then the HTTP.
async fn serve_tcp(inner: Arc<Inner>, tcp: TcpStream) {
    let stream: Stream = match inner.tls.clone() {
        None => Box::new(tcp),
        Some(acceptor) => {
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => Box::new(tls),
                Ok(Err(_)) | Err(_) => {
                    inner.state().tls_failures += 1;
                    return;
                }
            }
        }
    };
    serve_socket(inner, stream).await;
}

/// What the request head said.
struct Head {
    raw: Vec<u8>,
    method: String,
    path: String,
    version: String,
    headers: BTreeMap<String, String>,
}

/// Reads the request head (up to the blank line). None: the client sent no complete
/// head within 10 s, or too big a one, or went away.
async fn read_head(tcp: &mut Stream) -> Option<Head> {
    let mut raw = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                return Some(i);
            }
            if raw.len() > 64 * 1024 {
                return None;
            }
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => raw.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .ok()??;
    let text = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_owned();
    let target = first.next().unwrap_or("");
    let version = first.next().unwrap_or("").to_owned();
    // Absolute form (`http://host/path`) as a proxy would send it.
    let target = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let path = target.split(['?', '#']).next().unwrap_or("").to_owned();
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim();
            headers
                .entry(name)
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(value);
                })
                .or_insert_with(|| value.to_owned());
        }
    }
    Some(Head {
        raw,
        method,
        path,
        version,
        headers,
    })
}

fn has_token(headers: &BTreeMap<String, String>, name: &str, token: &str) -> bool {
    headers
        .get(name)
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

fn is_upgrade(head: &Head) -> bool {
    head.method == "GET"
        && head.version == "HTTP/1.1"
        && has_token(&head.headers, "upgrade", "websocket")
        && has_token(&head.headers, "connection", "upgrade")
        && head
            .headers
            .get("sec-websocket-version")
            .map(String::as_str)
            == Some("13")
        && head.headers.contains_key("sec-websocket-key")
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Fake Control Plane Says No",
    }
}

async fn serve_socket(inner: Arc<Inner>, mut tcp: Stream) {
    let Some(head) = read_head(&mut tcp).await else {
        return;
    };
    let (mode, index, status) = {
        let mut s = inner.state();
        let mode = s.mode;
        let status = if head.path != inner.path {
            404
        } else if !is_upgrade(&head) {
            400
        } else {
            match mode {
                Mode::Reject(code) => code,
                _ if s.token.as_ref().is_some_and(|t| {
                    head.headers.get("authorization") != Some(&format!("Bearer {t}"))
                }) =>
                {
                    401
                }
                Mode::Accept | Mode::Silent | Mode::NoWelcome => 101,
            }
        };
        s.requests.push(Request {
            path: head.path.clone(),
            headers: head.headers.clone(),
            status,
        });
        (mode, s.requests.len() - 1, status)
    };
    if status != 101 {
        let body = format!("{status} {}\n", reason_phrase(status));
        let extra = if status == 401 {
            "www-authenticate: Bearer\r\n"
        } else {
            ""
        };
        let response = format!(
            "HTTP/1.1 {status} {}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
             {extra}connection: close\r\n\r\n{body}",
            reason_phrase(status),
            body.len()
        );
        let _ = tcp.write_all(response.as_bytes()).await;
        let _ = tcp.shutdown().await;
        return;
    }

    let offered = has_token(&head.headers, "sec-websocket-protocol", SUBPROTOCOL);
    let wire = Wire {
        tcp,
        replay: head.raw,
        pos: 0,
        muted: false,
    };
    // The connection is counted and becomes current before the 101 is written, so a
    // client that has its answer can rely on accepted() and send().
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut registered = None;
    // The closure's type (and its large error type) is tungstenite's `Callback`.
    #[allow(clippy::result_large_err)]
    let callback = |_: &WsRequest, mut response: Response| {
        if offered {
            response.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_static(SUBPROTOCOL),
            );
        }
        let mut s = inner.state();
        s.accepted += 1;
        let id = s.accepted;
        s.conns.retain(|c| c.open);
        s.conns.push(Conn { id, open: true, tx });
        s.max_open = s.max_open.max(s.conns.len());
        registered = Some(id);
        Ok(response)
    };
    let max_message = inner.state().max_message;
    let ws_config = max_message.map(|n| {
        tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(n))
            .max_frame_size(Some(n))
    });
    let handshake =
        tokio_tungstenite::accept_hdr_async_with_config(wire, callback, ws_config).await;
    let Some(id) = registered else {
        // Validated above, so only I/O gets here: the client went away.
        inner.state().requests[index].status = 400;
        return;
    };
    let _guard = ConnGuard {
        inner: inner.clone(),
        id,
    };
    let Ok(mut ws) = handshake else {
        return;
    };
    let silent = mode == Mode::Silent;
    ws.get_mut().muted = silent;
    let every = inner.state().heartbeat_every;
    let mut beat = every.map(|d| tokio::time::interval_at(tokio::time::Instant::now() + d, d));

    loop {
        tokio::select! {
            _ = async {
                match beat.as_mut() {
                    Some(b) => {
                        b.tick().await;
                    }
                    None => std::future::pending().await,
                }
            }, if !silent => {
                let frame = json!({"type": "heartbeat", "sent_at": rfc3339(SystemTime::now())});
                if ws.send(Message::text(frame.to_string())).await.is_err() {
                    break;
                }
            }
            cmd = rx.recv() => match cmd {
                None => break,
                Some(Cmd::Send(msg, ack)) => {
                    let r = ws.send(msg).await.map_err(|e| e.to_string());
                    let failed = r.is_err();
                    let _ = ack.send(r);
                    if failed {
                        break;
                    }
                }
                Some(Cmd::Close(code, reason, ack)) => {
                    let frame = CloseFrame { code: code.into(), reason: reason.into() };
                    let r = ws.close(Some(frame)).await.map_err(|e| e.to_string());
                    let _ = ack.send(r);
                    // Wait for the client's closing answer, recording it, then hang up.
                    let _ = tokio::time::timeout(Duration::from_secs(5), async {
                        while let Some(Ok(msg)) = ws.next().await {
                            record_message(&inner, id, msg);
                        }
                    })
                    .await;
                    break;
                }
                Some(Cmd::Drop(ack)) => {
                    drop(ws);
                    let _ = ack.send(());
                    return;
                }
            },
            msg = ws.next() => {
                if let (Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(_))), Some(_)) = (&msg, max_message) {
                    let frame = CloseFrame { code: 1009.into(), reason: "message too big".into() };
                    let _ = ws.close(Some(frame)).await;
                    // What still comes is read and dropped until the client closes too.
                    let _ = tokio::time::timeout(Duration::from_secs(30), async {
                        while let Some(Ok(next)) = ws.next().await {
                            if matches!(next, Message::Close(_)) {
                                break;
                            }
                        }
                    })
                    .await;
                    break;
                }
                let Some(Ok(msg)) = msg else { break };
                if let Some(reply) = record_message(&inner, id, msg) {
                    if silent {
                        continue;
                    }
                    if ws.send(Message::text(reply.to_string())).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// Marks the connection closed however its task ends (returns, or is aborted by stop()).
struct ConnGuard {
    inner: Arc<Inner>,
    id: usize,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.inner.mark_closed(self.id);
    }
}

/// Records a received message; returns the frame the protocol answers it with, if any.
fn record_message(inner: &Inner, id: usize, msg: Message) -> Option<Value> {
    // When the whole message is in, before it is parsed: a large snapshot's parse is the
    // fake's time, not the manager's.
    let at = Instant::now();
    match msg {
        Message::Text(text) => {
            let value = serde_json::from_str::<Value>(text.as_str())
                .unwrap_or_else(|_| Value::String(text.as_str().to_owned()));
            let kind = value.get("type").and_then(Value::as_str).map(str::to_owned);
            inner.record(id, at, ReceivedKind::Text(value));
            let s = inner.state();
            match kind.as_deref() {
                Some("hello") if s.mode == Mode::NoWelcome => None,
                Some("hello") => Some(json!({
                    "type": "welcome",
                    "deployment_id": s.deployment_id,
                    "heartbeat_interval_s": s.heartbeat_interval_s,
                    "snapshot_interval_s": s.snapshot_interval_s,
                })),
                Some("heartbeat") if s.auto_heartbeat => Some(json!({
                    "type": "heartbeat",
                    "sent_at": rfc3339(SystemTime::now()),
                })),
                _ => None,
            }
        }
        Message::Binary(bytes) => {
            let keep = {
                let mut s = inner.state();
                if bytes.len() >= 5 {
                    let channel = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    *s.binary_bytes.entry(channel).or_default() += bytes.len() as u64 - 5;
                }
                s.binary_keep
            };
            let kept = &bytes[..bytes.len().min(keep.saturating_add(5))];
            inner.record(id, at, ReceivedKind::Binary(kept.to_vec()));
            None
        }
        Message::Close(frame) => {
            let frame = frame.map(|f| (u16::from(f.code), f.reason.as_str().to_owned()));
            inner.record_close(id, frame);
            None
        }
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => None,
    }
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-12-01T10:00:00.000Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let sod = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// The stream under a connection (TCP, or TLS over it): replays the request head already read (so
/// tungstenite can run its handshake), and in Silent mode swallows every write.
struct Wire {
    tcp: Stream,
    replay: Vec<u8>,
    pos: usize,
    muted: bool,
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.replay.len() {
            let n = buf.remaining().min(this.replay.len() - this.pos);
            buf.put_slice(&this.replay[this.pos..this.pos + n]);
            this.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.muted {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.muted {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.muted {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}
