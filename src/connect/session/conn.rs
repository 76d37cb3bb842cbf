//! One connection's socket: what the session writes (frames, fragments, pings) within
//! the write bound, and what it does with each message the control plane sends.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::Frame as WsFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::{Bytes, Error as WsError, Message};
use tracing::Instrument;

use crate::connect::Context;
use crate::connect::Link;
use crate::connect::progress::Transport;
use crate::connect::progress::WriteClock;
use crate::connect::shell::{Reply, Shells};
use crate::protocol::frame::{self, Frame};
use crate::protocol::frame::{Control, ControlResult, Delta, ErrorFrame};
use crate::protocol::wire;

use super::{End, Seams};

/// A message longer than this leaves as fragments of about this size (RFC 6455 §5.4):
/// the socket's write buffer keeps the size of the largest frame it held, and a snapshot
/// is 8 MB at 10 000 Agents. A snapshot's fragments are written as they are built, so
/// its whole text is never held either. Pings and pongs may go between fragments; no
/// data frame does, since this task sends every one.
pub(in crate::connect) const PIECE: usize = 64 * 1024;

/// `text` (UTF-8) in pieces of about `piece` bytes, none splitting a character, each
/// with whether it is the last; views of the one buffer, not copies.
pub(super) fn split_text(text: Bytes, piece: usize) -> impl Iterator<Item = (Bytes, bool)> + Send {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= text.len() {
            return None;
        }
        let mut end = (at + piece.max(4)).min(text.len());
        // Back to the start of a character (never a continuation byte, 0b10xx_xxxx).
        while end < text.len() && text[end] & 0xC0 == 0x80 {
            end -= 1;
        }
        let part = text.slice(at..end);
        at = end;
        Some((part, at == text.len()))
    })
}

/// At most this many `control` requests run at once; past that one is answered
/// `ok: false` at once.
pub(super) const MAX_CONTROLS: usize = 8;

/// Carries out a `control` and gives the `control_result` to send (a seam for tests).
pub(super) type Answer = fn(Arc<Context>, Control) -> BoxFuture<'static, Frame>;

pub(super) struct Conn<'a, S> {
    pub(super) ws: WebSocketStream<S>,
    pub(super) seq: u64,
    pub(super) ctx: &'a Arc<Context>,
    pub(super) shells: Shells,
    /// When the last ping left, for the round-trip gauge.
    pub(super) ping_sent: Option<Instant>,
    /// `control` requests in flight, each its own task: a stalled API call does not
    /// stop the socket loop.
    pub(super) controls: JoinSet<Frame>,
    pub(super) answer: Answer,
    /// How long a write may go without the peer taking a byte before the session is dead.
    pub(super) write_bound: Duration,
    /// When the peer last took bytes.
    pub(super) written: WriteClock,
    /// Honoured while a write is blocked, too.
    pub(super) shutdown: watch::Receiver<bool>,
    /// Messages read between the pieces of a long message ([`Self::send_pieces`]), at
    /// most [`MAX_EARLY`]; the session's loop handles them next.
    pub(super) early: Vec<Message>,
}

/// The most messages, and bytes of them, kept unhandled while a long message is
/// written; past either the rest wait in the socket (the peer is held back, not
/// buffered). One message may be up to 1 MiB: the bytes bound keeps a peer that sends
/// many large ones during a snapshot to about 1 MiB here, not 64.
const MAX_EARLY: usize = 64;
const MAX_EARLY_BYTES: usize = 1 << 20;

impl<'a, S: Transport> Conn<'a, S> {
    /// A connection on `ws` with nothing sent or read yet; `write_bound` holds until a
    /// welcome sets its own.
    pub(super) fn new(
        ctx: &'a Arc<Context>,
        ws: WebSocketStream<S>,
        seams: Seams,
        shutdown: watch::Receiver<bool>,
        write_bound: Duration,
    ) -> Self {
        let written = ws.get_ref().write_clock();
        Conn {
            ws,
            seq: 0,
            ctx,
            shells: Shells::with_runner(seams.runner),
            ping_sent: None,
            controls: JoinSet::new(),
            answer: seams.answer,
            write_bound,
            written,
            shutdown,
            early: Vec::new(),
        }
    }
}

impl<S: Transport> Conn<'_, S> {
    pub(super) fn link(&self) -> &Link {
        &self.ctx.link
    }

    pub(super) async fn send(&mut self, frame: &Frame) -> Result<(), End> {
        let text = frame::encode(frame);
        if text.len() <= PIECE {
            return self.send_message(Message::text(text)).await;
        }
        self.send_pieces(split_text(Bytes::from(text), PIECE))
            .await
            .map(drop)
    }

    /// Sends one text message as fragments, each piece one, in order: the first a text
    /// frame, the rest continuations, the one marked last final. Returns the bytes sent.
    pub(super) async fn send_pieces(
        &mut self,
        pieces: impl Iterator<Item = (Bytes, bool)> + Send,
    ) -> Result<usize, End> {
        let mut bytes = 0;
        let mut opcode = OpCode::Data(Data::Text);
        for (piece, last) in pieces {
            bytes += piece.len();
            let fragment = WsFrame::message(piece, opcode, last);
            if let Err(end) = self.send_message(Message::Frame(fragment)).await {
                return Err(self.close_behind(end));
            }
            opcode = OpCode::Data(Data::Continue);
            // What the peer sent meanwhile: a close ends the session now, not after the
            // whole message (a platform refusing the message as too big says so, 1009,
            // while it is still being written, and may hang up soon after).
            self.read_ready()?;
        }
        Ok(bytes)
    }

    /// Reads what the peer has already sent, without waiting, into [`Self::early`] (at
    /// most [`MAX_EARLY`] messages and about [`MAX_EARLY_BYTES`]): a close, an error or
    /// the stream's end ends the session.
    fn read_ready(&mut self) -> Result<(), End> {
        let mut held: usize = self.early.iter().map(Message::len).sum();
        while self.early.len() < MAX_EARLY && held < MAX_EARLY_BYTES {
            match self.ws.next().now_or_never() {
                None => break,
                Some(Some(Ok(Message::Close(f)))) => return Err(closed(f)),
                Some(Some(Ok(m))) => {
                    held += m.len();
                    self.early.push(m);
                }
                Some(Some(Err(e))) => return Err(End::Dropped(e.to_string())),
                Some(None) => return Err(End::Dropped("connection closed".into())),
            }
        }
        Ok(())
    }

    /// A write failed as `end`: a peer that refused the message may have said why (a
    /// close, 1009) before hanging up, and that close is what ended the session. What
    /// else was read early goes with the session.
    fn close_behind(&mut self, end: End) -> End {
        if !matches!(end, End::Dropped(_)) {
            return end;
        }
        self.early.clear();
        match self.read_ready() {
            Err(close @ End::Closed(..)) => close,
            _ => end,
        }
    }

    pub(super) async fn send_message(&mut self, message: Message) -> Result<(), End> {
        self.link().sent(message.len());
        let bound = self.write_bound;
        let mut shutdown = self.shutdown.clone();
        let written = self.written.clone();
        let started = Instant::now();
        let send = self.ws.send(message);
        tokio::pin!(send);
        loop {
            let stalled_until = written.last().max(started) + bound;
            tokio::select! {
                sent = &mut send => {
                    return sent.map_err(|e| End::Dropped(format!("send failed: {e}")));
                }
                () = sleep_until(stalled_until) => {
                    if written.last().max(started) + bound <= Instant::now() {
                        tracing::warn!(bound_s = bound.as_secs(), "the control plane took no bytes within the bound: reconnecting");
                        return Err(End::Dead);
                    }
                }
                _ = shutdown.wait_for(|stop| *stop) => return Err(End::Shutdown),
            }
        }
    }

    pub(super) async fn reply(&mut self, reply: Reply, reference: &str) -> Result<(), End> {
        match reply {
            Reply::None => Ok(()),
            Reply::Frame(f) => self.send(&f).await,
            Reply::Error(code, message) => {
                self.error(code, message, Some(reference.to_owned())).await
            }
        }
    }

    pub(super) async fn snapshot(&mut self) -> Result<(), End> {
        // Everything pending is in the snapshot.
        self.link().take_dirty();
        self.seq += 1;
        let started = Instant::now();
        let pieces = wire::snapshot_pieces(crate::connect::form(self.ctx), self.seq, PIECE);
        let mut written = 0;
        let sent = self
            .send_pieces(pieces.map(|(p, last)| {
                written += p.len();
                (Bytes::from(p), last)
            }))
            .await;
        let bytes = sent.inspect_err(|_| self.ctx.link.snapshot_cut(written))?;
        let took = started.elapsed();
        let ms = took.as_millis() as u64;
        if self.link().snapshot_sent(bytes, took) {
            tracing::info!(seq = self.seq, bytes, ms, "first snapshot sent");
        } else if took > Duration::from_secs(1) {
            // One message (PROTOCOL.md §4): the changes made meanwhile waited for it.
            tracing::info!(
                seq = self.seq,
                bytes,
                ms,
                "a snapshot held the link for over a second: the changes made meanwhile leave after it"
            );
        }
        // The first snapshot is out: the lists it did not need may start.
        self.ctx.store.later.open();
        Ok(())
    }

    pub(super) async fn delta(&mut self) -> Result<(), End> {
        let link = self.link();
        let (changes, marked) = wire::changes(crate::connect::form(self.ctx), link.take_pending());
        if changes.is_empty() {
            return Ok(());
        }
        self.seq += 1;
        self.send(&Frame::Delta(Delta {
            seq: self.seq,
            changes,
        }))
        .await?;
        self.link().delta_sent(&marked);
        Ok(())
    }

    pub(super) async fn flush_audit(&mut self) -> Result<(), End> {
        let queued = self.link().audit.drain_queued();
        self.send_audit(queued, false).await
    }

    /// After the snapshot: the outbox's events first (written by this manager or an
    /// earlier one), in order, then this manager's queue, the events of both once.
    /// From here on an event recorded is sent at once.
    pub(super) async fn drain_audit(&mut self) -> Result<(), End> {
        let link = self.link();
        let outbox = match link.outbox.get() {
            Some(o) => o.read_for_send(&link.audit.outbox).await,
            None => Vec::new(),
        };
        link.audit.set_live(true);
        let queued = link.audit.drain_queued();
        let ours: std::collections::HashSet<&str> =
            queued.iter().map(|q| q.event.id.as_str()).collect();
        // The outbox's events this manager did not queue itself came before its own.
        let mut all: Vec<crate::audit::Queued> = outbox
            .into_iter()
            .filter(|e| !ours.contains(e.id.as_str()))
            .map(|event| crate::audit::Queued { event, saved: true })
            .collect();
        let delivered = all.len() as u64;
        all.extend(queued);
        // Every id of the backlog is for removal, not only those known to be in the
        // outbox: the writer may be writing one of them right now (it chose them while
        // no connection was live). An id not there costs a read, no write.
        self.send_audit(all, true).await?;
        self.link()
            .audit
            .outbox
            .delivered
            .fetch_add(delivered, Relaxed);
        Ok(())
    }

    /// Sends the events in order; those in the outbox (all, with `remove_all`) are
    /// removed from it once sent. A failed send puts the rest back at the front of the
    /// queue.
    pub(super) async fn send_audit(
        &mut self,
        queued: Vec<crate::audit::Queued>,
        remove_all: bool,
    ) -> Result<(), End> {
        let mut sent = Vec::new();
        let mut iter = queued.into_iter();
        let mut result = Ok(());
        while let Some(q) = iter.next() {
            let frame = Frame::Audit(frame::Audit {
                event: q.event.clone(),
            });
            if let Err(e) = self.send(&frame).await {
                // Not sent: back in the queue for the next connection.
                self.link()
                    .audit
                    .requeue_queued(std::iter::once(q).chain(iter).collect());
                result = Err(e);
                break;
            }
            if q.saved || remove_all {
                sent.push(q.event.id);
            }
        }
        if !sent.is_empty()
            && let Some(outbox) = self.link().outbox.get()
        {
            outbox.sent(sent);
        }
        result
    }

    pub(super) async fn error(
        &mut self,
        code: &str,
        message: String,
        reference: Option<String>,
    ) -> Result<(), End> {
        self.link().frame_rejected();
        let frame = Frame::Error(ErrorFrame {
            code: code.into(),
            message,
            reference,
        });
        self.send(&frame).await
    }

    /// One message from the peer. `last_rx` moves for anything but a pong: the peer's
    /// WebSocket library answers pings even when the control plane behind it is hung.
    pub(super) async fn on_message(
        &mut self,
        msg: Option<Result<Message, WsError>>,
        last_rx: &mut Instant,
    ) -> Result<(), End> {
        if !matches!(msg, Some(Ok(Message::Pong(_)))) {
            *last_rx = Instant::now();
        }
        match msg {
            Some(Ok(Message::Text(t))) => self.handle_text(&t).await,
            Some(Ok(Message::Binary(b))) => {
                let reply = self.shells.input(&b);
                self.reply(reply, "binary").await
            }
            Some(Ok(Message::Pong(_))) => {
                if let Some(sent) = self.ping_sent.take() {
                    self.link().heartbeat_rtt(sent.elapsed());
                }
                Ok(())
            }
            Some(Ok(Message::Close(f))) => Err(closed(f)),
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(End::Dropped(e.to_string())),
            None => Err(End::Dropped("connection closed".into())),
        }
    }

    pub(super) async fn handle_text(&mut self, text: &str) -> Result<(), End> {
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
                if self.controls.len() >= MAX_CONTROLS {
                    tracing::warn!(id = %c.id, "too many control requests in flight: refused");
                    let busy = Frame::ControlResult(ControlResult {
                        id: c.id,
                        ok: false,
                        error: Some(format!(
                            "{MAX_CONTROLS} control requests are already in progress"
                        )),
                    });
                    return self.send(&busy).await;
                }
                let span = tracing::info_span!("control", id = %c.id);
                self.controls
                    .spawn((self.answer)(self.ctx.clone(), c).instrument(span));
                Ok(())
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
                tracing::warn!(code = %e.code, detail = %e.message, "the control plane reported an error");
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
    pub(super) async fn send_bad(&mut self, e: &frame::DecodeError) -> Result<(), End> {
        self.link().frame_rejected();
        self.send(&Frame::bad_frame(e)).await?;
        match self.shells.refuse_malformed(self.ctx, e) {
            Some(close) => self.send(&close).await,
            None => Ok(()),
        }
    }

    pub(super) async fn close(&mut self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_owned().into(),
        };
        let _ = tokio::time::timeout(Duration::from_millis(900), self.ws.close(Some(frame))).await;
    }
}

pub(super) fn closed(f: Option<CloseFrame>) -> End {
    match f {
        Some(f) => End::Closed(u16::from(f.code), f.reason.to_string()),
        None => End::Closed(1005, String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// A connection over an in-memory pipe with room for `buffer` bytes, and its peer.
    async fn conn(
        ctx: &Arc<Context>,
        buffer: usize,
    ) -> (
        Conn<'_, crate::connect::progress::Progress<tokio::io::DuplexStream>>,
        WebSocketStream<tokio::io::DuplexStream>,
    ) {
        let (ours, theirs) = tokio::io::duplex(buffer);
        let ours = crate::connect::progress::Progress::new(ours);
        let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        let peer = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        let seams = Seams {
            answer: |_, _| unreachable!("no control in these tests"),
            runner: crate::connect::shell::exec_runner,
        };
        let shutdown = watch::channel(false).1;
        let conn = Conn::new(ctx, ws, seams, shutdown, Duration::from_secs(30));
        (conn, peer)
    }

    /// What a peer sends while a long message is written waits in the socket past 64
    /// messages or 1 MiB of them, whichever comes first: it is read later, in order,
    /// never dropped and never held beyond the bound.
    #[tokio::test(start_paused = true)]
    async fn early_reads_stop_at_64_messages_or_a_mebibyte() {
        let ctx = crate::connect::test_context();
        let (mut conn, mut peer) = conn(&ctx, 8 << 20).await;
        // Ten messages of 200 KiB: the sixth takes what is held past 1 MiB.
        for i in 0..10u8 {
            let body = char::from(b'a' + i).to_string().repeat(200 << 10);
            peer.send(Message::text(body)).await.unwrap();
        }
        conn.read_ready().unwrap();
        assert_eq!(conn.early.len(), 6);
        // Nothing more is taken while they are held.
        conn.read_ready().unwrap();
        assert_eq!(conn.early.len(), 6);
        conn.early.clear();
        conn.read_ready().unwrap();
        let firsts: String = conn
            .early
            .iter()
            .map(|m| m.to_text().unwrap().chars().next().unwrap())
            .collect();
        assert_eq!(firsts, "ghij", "the rest, in order");

        // A hundred small ones: 64 held, the other 36 read once those are handled.
        conn.early.clear();
        for i in 0..100 {
            peer.send(Message::text(i.to_string())).await.unwrap();
        }
        conn.read_ready().unwrap();
        assert_eq!(conn.early.len(), MAX_EARLY);
        conn.early.clear();
        conn.read_ready().unwrap();
        assert_eq!(conn.early.len(), 36);
        assert_eq!(conn.early[35].to_text().unwrap(), "99");
    }

    /// A close behind the early messages ends the session with the peer's code (a
    /// platform refusing a message as too big says 1009).
    #[tokio::test(start_paused = true)]
    async fn a_close_read_early_ends_the_session_with_its_code() {
        let ctx = crate::connect::test_context();
        let (mut conn, mut peer) = conn(&ctx, 1 << 20).await;
        peer.send(Message::text("{}")).await.unwrap();
        peer.close(Some(CloseFrame {
            code: CloseCode::Size,
            reason: "message too big".into(),
        }))
        .await
        .unwrap();
        assert_eq!(
            conn.read_ready(),
            Err(End::Closed(1009, "message too big".into()))
        );
    }
}
