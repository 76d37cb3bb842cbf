//! One connection's life (PROTOCOL.md §4): hello → welcome → snapshot → deltas,
//! heartbeats, periodic snapshots, and the control plane's requests, in one `select!`.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::frame::{self, Frame};
use super::shell::{Outgoing, Reply, Shells};
use super::socket::Socket;
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
    NoWelcome,
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

struct Conn<'a> {
    ws: Socket,
    seq: u64,
    ctx: &'a Arc<Context>,
    shells: Shells,
    /// When the last ping left, for the round-trip gauge.
    ping_sent: Option<Instant>,
}

impl Conn<'_> {
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

/// Waits for `welcome`, answering malformed frames meanwhile.
async fn await_welcome(conn: &mut Conn<'_>) -> Result<frame::Welcome, End> {
    loop {
        match conn.ws.next().await {
            Some(Ok(Message::Text(t))) => match frame::decode(&t) {
                Ok(Some(Frame::Welcome(w))) => return Ok(w),
                Ok(_) => {}
                Err(e) => conn.send_bad(&e).await?,
            },
            Some(Ok(Message::Close(f))) => return Err(closed(f)),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(End::Dropped(e.to_string())),
            None => return Err(End::Dropped("closed before welcome".into())),
        }
    }
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

/// Runs one connected session until it ends.
pub async fn run(
    ctx: &Arc<Context>,
    ws: Socket,
    hello: Frame,
    shutdown: &mut watch::Receiver<bool>,
    on_welcome: impl FnOnce(),
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
        Err(End::NoWelcome) => {
            conn.close(1002, "no welcome").await;
            End::NoWelcome
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

async fn drive(
    conn: &mut Conn<'_>,
    hello: Frame,
    shutdown: &mut watch::Receiver<bool>,
    on_welcome: impl FnOnce(),
) -> Result<(), End> {
    conn.send(&hello).await?;
    let welcome_timeout = conn.ctx.config.welcome_timeout;
    let welcome = tokio::select! {
        w = tokio::time::timeout(welcome_timeout, await_welcome(conn)) => match w {
            Ok(w) => w?,
            Err(_) => return Err(End::NoWelcome),
        },
        _ = shutdown.changed() => return Err(End::Shutdown),
    };
    on_welcome();
    tracing::info!(deployment_id = %welcome.deployment_id, heartbeat_s = welcome.heartbeat_interval().as_secs(), "welcome from the control plane");
    conn.snapshot().await?;
    conn.flush_audit().await?;

    let heartbeat = welcome.heartbeat_interval();
    let mut heartbeat_tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    let snapshot_every = welcome.snapshot_interval();
    let mut snapshot_tick =
        tokio::time::interval_at(Instant::now() + snapshot_every, snapshot_every);
    let mut last_rx = Instant::now();
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
