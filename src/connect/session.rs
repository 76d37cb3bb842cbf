//! One connection's life (PROTOCOL.md §4): hello → welcome → snapshot → deltas,
//! heartbeats, periodic snapshots, and the control plane's requests, in one `select!`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::frame::{self, Frame};
use super::shell::{Outgoing, Reply, Shells};
use super::{Link, wire};
use crate::audit::now_rfc3339;
use crate::connect::frame::{Delta, ErrorFrame, Heartbeat};
use crate::reconcile::Context;

/// How a session ended, which decides the wait before the next dial.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    Shutdown,
    /// The control plane closed the socket with this code and reason.
    Closed(u16, String),
    /// Nothing arrived for 3 heartbeat intervals.
    Dead,
    /// The socket failed or ended without a close frame.
    Dropped(String),
}

/// At most one delta per window: a change after a quiet window leaves at once, changes
/// arriving within the window after a delta leave together at its end (newest state
/// wins). Waiting the window for every change would add it to every change's latency.
const COALESCE: Duration = Duration::from_millis(100);

/// How long shell sessions get to end at shutdown, after the close (the connector has
/// 3 s in all, 2 s when the Lease is lost; the kill exec takes about 0.1 s).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What a session runs over: the dialled socket, or an in-memory pipe in tests.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

struct Conn<'a, S> {
    ws: WebSocketStream<S>,
    seq: u64,
    ctx: &'a Arc<Context>,
    shells: Shells,
    /// When the last ping left, for the round-trip gauge.
    ping_sent: Option<Instant>,
}

impl<S: Transport> Conn<'_, S> {
    fn link(&self) -> &Link {
        &self.ctx.link
    }

    async fn send(&mut self, frame: &Frame) -> Result<(), End> {
        self.send_message(Message::text(frame::encode(frame))).await
    }

    async fn send_message(&mut self, message: Message) -> Result<(), End> {
        self.link()
            .bytes_sent
            .fetch_add(message.len() as u64, Relaxed);
        self.ws
            .send(message)
            .await
            .map_err(|e| End::Dropped(format!("send failed: {e}")))
    }

    async fn reply(&mut self, reply: Reply, reference: &str) -> Result<(), End> {
        match reply {
            Reply::None => Ok(()),
            Reply::Frame(f) => self.send(&f).await,
            Reply::Error(code, message) => {
                self.error(code, message, Some(reference.to_owned())).await
            }
        }
    }

    async fn snapshot(&mut self) -> Result<(), End> {
        // Everything pending is in the snapshot.
        self.link().take_dirty();
        self.seq += 1;
        let text = wire::snapshot_text(self.ctx, self.seq);
        self.send_message(Message::text(text)).await?;
        self.link().snapshots_sent.fetch_add(1, Relaxed);
        Ok(())
    }

    async fn delta(&mut self) -> Result<(), End> {
        let changes = wire::pending_changes(self.ctx);
        if changes.is_empty() {
            return Ok(());
        }
        self.seq += 1;
        self.send(&Frame::Delta(Delta {
            seq: self.seq,
            changes,
        }))
        .await?;
        self.link().deltas_sent.fetch_add(1, Relaxed);
        Ok(())
    }

    async fn flush_audit(&mut self) -> Result<(), End> {
        let events = self.link().audit.drain();
        let mut iter = events.into_iter();
        while let Some(event) = iter.next() {
            if let Err(e) = self
                .send(&Frame::Audit(frame::Audit {
                    event: event.clone(),
                }))
                .await
            {
                // Not sent: back in the queue for the next connection.
                self.link()
                    .audit
                    .requeue(std::iter::once(event).chain(iter).collect());
                return Err(e);
            }
        }
        Ok(())
    }

    async fn error(
        &mut self,
        code: &str,
        message: String,
        reference: Option<String>,
    ) -> Result<(), End> {
        self.link().frames_rejected.fetch_add(1, Relaxed);
        let frame = Frame::Error(ErrorFrame {
            code: code.into(),
            message,
            reference,
        });
        self.send(&frame).await
    }

    async fn handle_text(&mut self, text: &str) -> Result<(), End> {
        let frame = match frame::decode(text) {
            Ok(Some(f)) => f,
            Ok(None) => {
                tracing::debug!("ignoring a frame of unknown type");
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(error = %e, "malformed frame from the control plane");
                return self.send_bad(&e).await;
            }
        };
        match frame {
            Frame::Heartbeat(_) | Frame::Welcome(_) => Ok(()),
            Frame::Resync => self.snapshot().await,
            Frame::Control(c) => {
                let result = super::control::answer(self.ctx, c).await;
                self.send(&result).await
            }
            Frame::IoOpen(o) => {
                let reply = self.shells.open(self.ctx, o);
                self.reply(reply, "io_open").await
            }
            Frame::IoResize(r) => {
                let reply = self.shells.resize(&r);
                self.reply(reply, "io_resize").await
            }
            Frame::IoClose(c) => {
                let reply = self.shells.close(&c);
                self.reply(reply, "io_close").await
            }
            Frame::Error(e) => {
                tracing::warn!(code = %e.code, message = %e.message, "the control plane reported an error");
                Ok(())
            }
            other => {
                let t = other.type_name();
                self.error(
                    "bad_frame",
                    format!("{t} is not sent by the control plane"),
                    Some(t.into()),
                )
                .await
            }
        }
    }

    /// Answers a frame that failed to decode with `error` (§3), and a malformed `io_open`
    /// also on its channel when that can be read (`io_close` `denied`).
    async fn send_bad(&mut self, e: &frame::DecodeError) -> Result<(), End> {
        self.link().frames_rejected.fetch_add(1, Relaxed);
        self.send(&Frame::bad_frame(e)).await?;
        match self.shells.refuse_malformed(self.ctx, e) {
            Some(close) => self.send(&close).await,
            None => Ok(()),
        }
    }

    async fn close(&mut self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_owned().into(),
        };
        let _ = tokio::time::timeout(Duration::from_millis(900), self.ws.close(Some(frame))).await;
    }
}

/// Waits for `welcome` until `deadline`, handling whatever else arrives meanwhile as the
/// session's loop would (a platform that sends no `welcome` may send requests at once).
/// `Ok(None)`: none came in time. `last_rx` is when the last message arrived.
async fn await_welcome<S: Transport>(
    conn: &mut Conn<'_, S>,
    deadline: Instant,
    shutdown: &mut watch::Receiver<bool>,
    last_rx: &mut Instant,
) -> Result<Option<frame::Welcome>, End> {
    loop {
        let msg = tokio::select! {
            msg = conn.ws.next() => msg,
            _ = sleep_until(deadline) => return Ok(None),
            _ = shutdown.changed() => return Err(End::Shutdown),
        };
        if !matches!(msg, Some(Ok(Message::Pong(_)))) {
            *last_rx = Instant::now();
        }
        match msg {
            Some(Ok(Message::Text(t))) => match frame::decode(&t) {
                Ok(Some(Frame::Welcome(w))) => return Ok(Some(w)),
                _ => conn.handle_text(&t).await?,
            },
            Some(Ok(Message::Binary(b))) => {
                let reply = conn.shells.input(&b);
                conn.reply(reply, "binary").await?;
            }
            Some(Ok(Message::Close(f))) => return Err(closed(f)),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(End::Dropped(e.to_string())),
            None => return Err(End::Dropped("closed before welcome".into())),
        }
    }
}

/// Set once this process went on without a `welcome`: the warning is logged once.
static NO_WELCOME_WARNED: AtomicBool = AtomicBool::new(false);

/// `true` the first time only (per `flag`): warn once, then stay quiet.
fn first_time(flag: &AtomicBool) -> bool {
    !flag.swap(true, Relaxed)
}

fn closed(f: Option<CloseFrame>) -> End {
    match f {
        Some(f) => End::Closed(u16::from(f.code), f.reason.to_string()),
        None => End::Closed(1005, String::new()),
    }
}

/// §4.5: nothing at all from the control plane for 3 heartbeat intervals means the
/// connection is dead.
pub fn silent_too_long(last_rx: Instant, now: Instant, heartbeat: Duration) -> bool {
    now.saturating_duration_since(last_rx) >= heartbeat.saturating_mul(3)
}

/// Runs one connected session until it ends. `on_welcome` is called once the session
/// is established: with `true` when a `welcome` came, `false` when it went on without.
pub async fn run<S: Transport>(
    ctx: &Arc<Context>,
    ws: WebSocketStream<S>,
    hello: Frame,
    shutdown: &mut watch::Receiver<bool>,
    on_welcome: impl FnOnce(bool),
) -> End {
    let mut conn = Conn {
        ws,
        seq: 0,
        ctx,
        shells: Shells::default(),
        ping_sent: None,
    };
    let end = match drive(&mut conn, hello, shutdown, on_welcome).await {
        Ok(()) | Err(End::Shutdown) => {
            conn.close(1000, "shutdown").await;
            End::Shutdown
        }
        Err(End::Dead) => {
            conn.close(1001, "no heartbeat from the control plane")
                .await;
            End::Dead
        }
        Err(end) => end,
    };
    // §6: every exec of this connection ends with it, and is audited. After the close,
    // so that a replica stepping down is off the control plane first.
    let (why, grace) = match end {
        End::Shutdown => ("manager shutting down", SHUTDOWN_GRACE),
        _ => (
            "connection to the control plane lost",
            Duration::from_secs(5),
        ),
    };
    conn.shells.end_all(ctx, why, grace).await;
    end
}

async fn drive<S: Transport>(
    conn: &mut Conn<'_, S>,
    hello: Frame,
    shutdown: &mut watch::Receiver<bool>,
    on_welcome: impl FnOnce(bool),
) -> Result<(), End> {
    conn.send(&hello).await?;
    let welcome_timeout = conn.ctx.config.welcome_timeout;
    let mut last_rx = Instant::now();
    let deadline = last_rx + welcome_timeout;
    // §4.1: no welcome in time, the socket open → go on with the default intervals: a
    // platform that sends none must still see the cluster. A peer that sends nothing at
    // all is found dead by the heartbeat check below (§4.5), counted from `last_rx`.
    let welcome = match await_welcome(conn, deadline, shutdown, &mut last_rx).await? {
        Some(w) => {
            on_welcome(true);
            tracing::info!(deployment_id = %w.deployment_id, heartbeat_s = w.heartbeat_interval().as_secs(), "welcome from the control plane");
            w
        }
        None => {
            on_welcome(false);
            let w = frame::Welcome::defaults();
            if first_time(&NO_WELCOME_WARNED) {
                tracing::warn!(
                    timeout_s = welcome_timeout.as_secs(),
                    heartbeat_s = w.heartbeat_interval_s,
                    snapshot_s = w.snapshot_interval_s,
                    "no welcome from the control plane in time: going on with the default intervals (logged once)"
                );
            } else {
                tracing::debug!(
                    "no welcome from the control plane: going on with the default intervals"
                );
            }
            w
        }
    };
    conn.snapshot().await?;
    conn.flush_audit().await?;

    let heartbeat = welcome.heartbeat_interval();
    let mut heartbeat_tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    let snapshot_every = welcome.snapshot_interval();
    let mut snapshot_tick =
        tokio::time::interval_at(Instant::now() + snapshot_every, snapshot_every);
    let mut delta_due: Option<Instant> = None;
    let mut last_delta = Instant::now();
    let link = conn.ctx.link.clone();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Err(End::Shutdown),
            msg = conn.ws.next() => {
                // Pongs do not count: the peer's WebSocket library sends them even when
                // the control plane behind it is hung.
                if !matches!(msg, Some(Ok(Message::Pong(_)))) {
                    last_rx = Instant::now();
                }
                match msg {
                    Some(Ok(Message::Text(t))) => conn.handle_text(&t).await?,
                    Some(Ok(Message::Binary(b))) => {
                        let reply = conn.shells.input(&b);
                        conn.reply(reply, "binary").await?;
                    }
                    Some(Ok(Message::Pong(_))) => {
                        if let Some(sent) = conn.ping_sent.take() {
                            let rtt = sent.elapsed().as_micros() as u64;
                            link.heartbeat_rtt_us.store(rtt.max(1), Relaxed);
                        }
                    }
                    Some(Ok(Message::Close(f))) => return Err(closed(f)),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(End::Dropped(e.to_string())),
                    None => return Err(End::Dropped("connection closed".into())),
                }
            }
            _ = link.dirty_notify.notified(), if delta_due.is_none() => {
                delta_due = Some((last_delta + COALESCE).max(Instant::now()));
            }
            _ = sleep_until(delta_due.unwrap_or_else(Instant::now)), if delta_due.is_some() => {
                delta_due = None;
                last_delta = Instant::now();
                conn.delta().await?;
            }
            _ = link.audit.notify.notified() => conn.flush_audit().await?,
            _ = heartbeat_tick.tick() => {
                if silent_too_long(last_rx, Instant::now(), heartbeat) {
                    tracing::warn!(silent_s = last_rx.elapsed().as_secs(), "nothing from the control plane for 3 heartbeat intervals: reconnecting");
                    return Err(End::Dead);
                }
                conn.send(&Frame::Heartbeat(Heartbeat { sent_at: now_rfc3339() })).await?;
                // The peer's WebSocket layer answers a ping at once: the round trip.
                conn.ping_sent = Some(Instant::now());
                conn.send_message(Message::Ping(Default::default())).await?;
            }
            Some(ev) = conn.shells.events.recv() => {
                match conn.shells.event(conn.ctx, ev) {
                    Some(Outgoing::Text(f)) => conn.send(&f).await?,
                    Some(Outgoing::Binary(b)) => conn.send_message(Message::binary(b)).await?,
                    None => {}
                }
            }
            _ = snapshot_tick.tick() => conn.snapshot().await?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio_tungstenite::tungstenite::protocol::Role;

    type Peer = WebSocketStream<tokio::io::DuplexStream>;

    /// The next text frame from the manager (pings answered, pongs skipped), decoded.
    async fn next_frame(cp: &mut Peer) -> Frame {
        loop {
            match cp.next().await {
                Some(Ok(Message::Text(t))) => return frame::decode(&t).unwrap().unwrap(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("expected a frame, got {other:?}"),
            }
        }
    }

    /// A session over an in-memory pipe, on the paused clock: the peer is the test.
    async fn start() -> (
        Peer,
        watch::Sender<bool>,
        Arc<Mutex<Vec<bool>>>,
        tokio::task::JoinHandle<End>,
    ) {
        let ctx = crate::connect::test_context();
        assert_eq!(ctx.config.welcome_timeout, Duration::from_secs(10));
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        let cp = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        let (stop, mut stopping) = watch::channel(false);
        let established = Arc::new(Mutex::new(Vec::new()));
        let seen = established.clone();
        let hello = Frame::Resync; // any frame: the session sends it first
        let task = tokio::spawn(async move {
            run(&ctx, ws, hello, &mut stopping, move |welcomed| {
                seen.lock().unwrap().push(welcomed)
            })
            .await
        });
        (cp, stop, established, task)
    }

    #[tokio::test(start_paused = true)]
    async fn without_welcome_the_session_goes_on_with_the_default_intervals() {
        let start_at = Instant::now();
        let (mut cp, _stop, established, task) = start().await;
        assert_eq!(next_frame(&mut cp).await, Frame::Resync, "hello first");
        // A request before any welcome is served, not dropped: here a malformed io_open,
        // answered with `error` and on its channel.
        cp.send(Message::text(
            r#"{"type":"io_open","channel":5,"session_id":"s","actor":"a","tty":false}"#,
        ))
        .await
        .unwrap();
        let Frame::Error(e) = next_frame(&mut cp).await else {
            panic!("expected error")
        };
        assert_eq!(e.code, "bad_frame");
        let Frame::IoClose(c) = next_frame(&mut cp).await else {
            panic!("expected io_close")
        };
        assert_eq!((c.channel, c.reason.as_deref()), (5, Some("denied")));

        // No welcome within the 10 s: a snapshot anyway, at 10 s.
        let Frame::Snapshot(snapshot) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        assert_eq!(snapshot.seq, 1);
        assert_eq!(Instant::now() - start_at, Duration::from_secs(10));
        assert_eq!(*established.lock().unwrap(), [false]);
        // The audit of the denial follows the snapshot.
        let Frame::Audit(a) = next_frame(&mut cp).await else {
            panic!("expected the audit event")
        };
        assert_eq!(a.event.action, frame::AuditAction::SessionDenied);

        // The default heartbeat: 15 s after the snapshot.
        cp.send(Message::text(r#"{"type":"heartbeat","sent_at":"t"}"#))
            .await
            .unwrap();
        let Frame::Heartbeat(_) = next_frame(&mut cp).await else {
            panic!("expected a heartbeat")
        };
        assert_eq!(Instant::now() - start_at, Duration::from_secs(25));

        // A peer that then says nothing is dead after 3 default intervals (45 s after its
        // last frame at 10 s): closed with 1001.
        let close = loop {
            match cp.next().await {
                Some(Ok(Message::Close(f))) => break f,
                Some(Ok(_)) => {}
                other => panic!("expected a close, got {other:?}"),
            }
        };
        assert_eq!(u16::from(close.unwrap().code), 1001);
        assert_eq!(Instant::now() - start_at, Duration::from_secs(55));
        drop(cp);
        assert_eq!(task.await.unwrap(), End::Dead);
    }

    #[tokio::test(start_paused = true)]
    async fn a_welcome_in_time_sets_the_intervals() {
        let start_at = Instant::now();
        let (mut cp, stop, established, task) = start().await;
        next_frame(&mut cp).await;
        tokio::time::sleep(Duration::from_secs(9)).await;
        cp.send(Message::text(
            r#"{"type":"welcome","deployment_id":"d","heartbeat_interval_s":2}"#,
        ))
        .await
        .unwrap();
        let Frame::Snapshot(_) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        assert_eq!(Instant::now() - start_at, Duration::from_secs(9));
        assert_eq!(*established.lock().unwrap(), [true]);
        let Frame::Heartbeat(_) = next_frame(&mut cp).await else {
            panic!("expected a heartbeat")
        };
        assert_eq!(Instant::now() - start_at, Duration::from_secs(11));
        stop.send(true).unwrap();
        let _ = cp.next().await;
        drop(cp);
        assert_eq!(task.await.unwrap(), End::Shutdown);
    }

    #[test]
    fn the_missing_welcome_is_warned_about_once() {
        let flag = AtomicBool::new(false);
        assert!(first_time(&flag));
        assert!(!first_time(&flag));
        assert!(!first_time(&flag));
    }

    #[tokio::test(start_paused = true)]
    async fn dead_after_three_silent_heartbeat_intervals() {
        let heartbeat = Duration::from_secs(15);
        let last_rx = Instant::now();
        let mut tick = tokio::time::interval_at(last_rx + heartbeat, heartbeat);
        // Ticks at 15 s and 30 s: still alive; at 45 s: dead.
        for alive in [true, true, false] {
            tick.tick().await;
            assert_eq!(silent_too_long(last_rx, Instant::now(), heartbeat), !alive);
        }
        assert_eq!(Instant::now() - last_rx, Duration::from_secs(45));
        // Anything received resets the clock.
        assert!(!silent_too_long(Instant::now(), Instant::now(), heartbeat));
        // A huge interval from the peer cannot overflow.
        assert!(!silent_too_long(last_rx, Instant::now(), Duration::MAX));
    }
}
