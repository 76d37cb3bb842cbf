//! One connection's life (PROTOCOL.md §4): hello → welcome → snapshot → deltas,
//! heartbeats, periodic snapshots, and the control plane's requests, in one `select!`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::Context;
pub use super::progress::Transport;
use super::shell::Outgoing;
use crate::audit::now_rfc3339;
use crate::protocol::frame::{self, Frame};
use crate::protocol::frame::{Control, Heartbeat};

mod conn;

pub(super) use conn::PIECE;
use conn::{Answer, Conn, closed};

/// How a session ended, which decides the wait before the next dial.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    Shutdown,
    /// The control plane closed the socket with this code and reason.
    Closed(u16, String),
    /// Nothing arrived for 3 heartbeat intervals, or a frame could not be written
    /// within that bound (a peer that stopped reading, a half-open connection).
    Dead,
    /// The socket failed or ended without a close frame; a report failed.
    Dropped(String),
    /// The control plane refused the token in the middle of a session (a report
    /// answered 401 or 403): revoked.
    Rejected(String),
}

/// At most one delta per window: a change after a quiet window leaves at once, changes
/// arriving within the window after a delta leave together at its end (newest state
/// wins). Waiting the window for every change would add it to every change's latency.
const COALESCE: Duration = Duration::from_millis(100);

/// How long shell sessions get to end at shutdown, after the close (the connector has
/// 3 s in all, 2 s when the Lease is lost; the kill exec takes about 0.1 s).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

fn answer_control(ctx: Arc<Context>, c: Control) -> BoxFuture<'static, Frame> {
    async move { super::control::answer(&ctx, c).await }.boxed()
}

/// The bound on a write without progress: the dead-connection bound of §4.5 (3 heartbeat
/// intervals; the default interval until a `welcome` sets it). A socket that takes no
/// bytes for that long is as dead as one that sends none; one that takes them slowly is
/// not (see [`super::progress`]).
fn write_bound(heartbeat: Duration) -> Duration {
    heartbeat.saturating_mul(3)
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

/// Runs one connected session until it ends. `on_welcome` is called once the session
/// is established: with `true` when a `welcome` came, `false` when it went on without.
pub async fn run<S: Transport>(
    ctx: &Arc<Context>,
    ws: WebSocketStream<S>,
    hello: Frame,
    shutdown: &mut watch::Receiver<bool>,
    on_welcome: impl FnOnce(bool),
) -> End {
    let seams = Seams {
        answer: answer_control,
        runner: super::shell::exec_runner,
    };
    run_with(ctx, ws, hello, shutdown, on_welcome, seams).await
}

/// What a session does through the API server, replaced in tests: `control` and the
/// shells' execs.
#[derive(Clone, Copy)]
struct Seams {
    answer: Answer,
    runner: super::shell::Runner,
}

async fn run_with<S: Transport>(
    ctx: &Arc<Context>,
    ws: WebSocketStream<S>,
    hello: Frame,
    shutdown: &mut watch::Receiver<bool>,
    on_welcome: impl FnOnce(bool),
    seams: Seams,
) -> End {
    let bound = write_bound(frame::Welcome::defaults().heartbeat_interval());
    let mut conn = Conn::new(ctx, ws, seams, shutdown.clone(), bound);
    let driven = drive(&mut conn, hello, shutdown, on_welcome).await;
    // What is recorded from here on waits for the next connection (and the outbox).
    ctx.link.audit.set_live(false);
    let end = match driven {
        // A shutdown asked for is reported as such even when the peer went away in the
        // same instant and its branch of the select won.
        Ok(()) | Err(End::Shutdown) | Err(End::Dropped(_)) if *shutdown.borrow() => {
            conn.close(1000, "shutdown").await;
            End::Shutdown
        }
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
    // A `control` in flight runs to its end (bounded by CONTROL_TIMEOUT) and is audited
    // there, for the next connection to receive; only its `control_result` has no
    // connection left. Dropping the set would abort it halfway: an action applied, or
    // not, and never audited.
    conn.controls.detach_all();
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
    let mut last_rx = Instant::now();
    let welcome = welcome(conn, shutdown, &mut last_rx, on_welcome).await?;
    let heartbeat = welcome.heartbeat_interval();
    conn.write_bound = write_bound(heartbeat);
    conn.snapshot().await?;
    conn.drain_audit().await?;

    let mut heartbeat_tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    let snapshot_every = welcome.snapshot_interval();
    let mut snapshot_tick =
        tokio::time::interval_at(Instant::now() + snapshot_every, snapshot_every);
    let mut delta_due: Option<Instant> = None;
    let mut last_delta = Instant::now();
    let link = conn.ctx.link.clone();
    loop {
        for msg in std::mem::take(&mut conn.early) {
            conn.on_message(Some(Ok(msg)), &mut last_rx).await?;
        }
        tokio::select! {
            _ = shutdown.changed() => return Err(End::Shutdown),
            msg = conn.ws.next() => conn.on_message(msg, &mut last_rx).await?,
            _ = link.dirty_notify.notified(), if delta_due.is_none() => {
                delta_due = Some((last_delta + COALESCE).max(Instant::now()));
            }
            _ = sleep_until(delta_due.unwrap_or_else(Instant::now)), if delta_due.is_some() => {
                delta_due = None;
                last_delta = Instant::now();
                conn.delta().await?;
            }
            _ = link.audit.notify.notified() => conn.flush_audit().await?,
            // §4.5 to the moment: a check only at the next heartbeat tick would find a
            // silent peer dead up to one interval late (60 s instead of 45 s).
            // A long write may have held this loop while the peer's frames arrived: what
            // is already buffered is read before the silence is called.
            () = sleep_until(last_rx + heartbeat.saturating_mul(3)) => {
                match conn.ws.next().now_or_never() {
                    Some(msg) => conn.on_message(msg, &mut last_rx).await?,
                    None => {
                        tracing::warn!(silent_s = last_rx.elapsed().as_secs(), "nothing from the control plane for 3 heartbeat intervals: reconnecting");
                        return Err(End::Dead);
                    }
                }
            }
            _ = heartbeat_tick.tick() => {
                // Due with the silence bound: the bound's branch decides first, and a
                // peer found dead gets no ping.
                if Instant::now() >= last_rx + heartbeat.saturating_mul(3) {
                    continue;
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
            Some(done) = conn.controls.join_next(), if !conn.controls.is_empty() => match done {
                Ok(result) => conn.send(&result).await?,
                Err(e) => tracing::warn!(error = %e, "a control request failed"),
            },
        }
    }
}

/// Waits for `welcome` (or its timeout) and says which came (`on_welcome`): the
/// intervals the session runs with.
async fn welcome<S: Transport>(
    conn: &mut Conn<'_, S>,
    shutdown: &mut watch::Receiver<bool>,
    last_rx: &mut Instant,
    on_welcome: impl FnOnce(bool),
) -> Result<frame::Welcome, End> {
    let welcome_timeout = conn.ctx.config.welcome_timeout;
    let deadline = *last_rx + welcome_timeout;
    // §4.1: no welcome in time, the socket open → go on with the default intervals: a
    // platform that sends none must still see the cluster. A peer that sends nothing at
    // all is found dead by the heartbeat check below (§4.5), counted from `last_rx`.
    let welcome = match await_welcome(conn, deadline, shutdown, last_rx).await? {
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
    Ok(welcome)
}

#[cfg(test)]
mod tests {
    use super::conn::{MAX_CONTROLS, PIECE, split_text};
    use super::*;
    use crate::protocol::frame::ControlResult;
    use crate::protocol::wire;
    use futures::SinkExt;
    use std::sync::Mutex;
    use tokio_tungstenite::tungstenite::Bytes;
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

    /// Asks the session to stop, reads until its close and expects `End::Shutdown`.
    async fn stopped(mut cp: Peer, stop: watch::Sender<bool>, task: tokio::task::JoinHandle<End>) {
        stop.send(true).unwrap();
        while let Some(Ok(msg)) = cp.next().await {
            if msg.is_close() {
                break;
            }
        }
        drop(cp);
        assert_eq!(task.await.unwrap(), End::Shutdown);
    }

    /// A session over an in-memory pipe, on the paused clock: the peer is the test.
    async fn start() -> (
        Peer,
        watch::Sender<bool>,
        Arc<Mutex<Vec<bool>>>,
        tokio::task::JoinHandle<End>,
    ) {
        start_with(1 << 20, answer_control).await
    }

    /// As [`start`], with a pipe of `buffer` bytes each way and `answer` for `control`.
    async fn start_with(
        buffer: usize,
        answer: Answer,
    ) -> (
        Peer,
        watch::Sender<bool>,
        Arc<Mutex<Vec<bool>>>,
        tokio::task::JoinHandle<End>,
    ) {
        start_in(crate::connect::test_context(), buffer, answer).await
    }

    /// As [`start_with`], in `ctx` (whose link the test marks changes on).
    async fn start_in(
        ctx: Arc<Context>,
        buffer: usize,
        answer: Answer,
    ) -> (
        Peer,
        watch::Sender<bool>,
        Arc<Mutex<Vec<bool>>>,
        tokio::task::JoinHandle<End>,
    ) {
        assert_eq!(ctx.config.welcome_timeout, Duration::from_secs(10));
        let (ours, theirs) = tokio::io::duplex(buffer);
        let ours = crate::connect::progress::Progress::new(ours);
        let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        let cp = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        let (stop, mut stopping) = watch::channel(false);
        let established = Arc::new(Mutex::new(Vec::new()));
        let seen = established.clone();
        let hello = Frame::Resync; // any frame: the session sends it first
        let task = tokio::spawn(async move {
            let on_welcome = move |welcomed| seen.lock().unwrap().push(welcomed);
            let seams = Seams {
                answer,
                runner: crate::connect::shell::exec_runner,
            };
            run_with(&ctx, ws, hello, &mut stopping, on_welcome, seams).await
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
        assert_eq!(a.event.action, crate::audit::AuditAction::SessionDenied);

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
        stopped(cp, stop, task).await;
    }

    /// Issue 27: after its snapshot a session sends the outbox's events (an earlier
    /// manager's) first, in order, then its own queue, each once; what was in the outbox
    /// is removed once sent; an event recorded while live costs no write.
    #[tokio::test(start_paused = true)]
    async fn the_outbox_is_sent_after_the_snapshot_before_newer_events_and_emptied() {
        use crate::connect::outbox::{MemoryBackend, Outbox, parse, tests::event};
        let ctx = crate::connect::test_context();
        let backend = Arc::new(MemoryBackend::default());
        let outbox = Arc::new(Outbox::new(backend.clone()));
        assert!(ctx.link.outbox.set(outbox.clone()).is_ok());
        let line = |id: &str| serde_json::to_string(&event(id)).unwrap();
        // An earlier manager's p1..p3 and a line that is none; this one's o1 is in the
        // outbox too (its writer ran), o2 not yet.
        backend.set_text(&format!(
            "{}\n{}\n{{broken\n{}\n{}\n",
            line("p1"),
            line("p2"),
            line("p3"),
            line("o1")
        ));
        ctx.link.audit.record(event("o1"));
        ctx.link
            .audit
            .mark_saved(&["o1".to_owned()].into_iter().collect());
        ctx.link.audit.record(event("o2"));
        let (stop_writer, writer_stop) = watch::channel(false);
        let writer = tokio::spawn({
            let (o, link) = (outbox.clone(), ctx.link.clone());
            async move { o.run(&link.audit, writer_stop).await }
        });

        let (mut cp, stop, _, task) = start_in(ctx.clone(), 1 << 20, answer_control).await;
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        let Frame::Snapshot(_) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        let mut sent = Vec::new();
        for _ in 0..5 {
            let Frame::Audit(a) = next_frame(&mut cp).await else {
                panic!("expected an audit event")
            };
            sent.push(a.event.id);
        }
        assert_eq!(sent, ["p1", "p2", "p3", "o1", "o2"]);
        assert_eq!(ctx.link.audit.outbox.malformed.load(Relaxed), 1);
        assert_eq!(ctx.link.audit.outbox.delivered.load(Relaxed), 3);
        // Removed once sent, in one write.
        let writes = backend.writes.load(Relaxed);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(backend.text(), "");
        assert_eq!(backend.writes.load(Relaxed), writes + 1);
        // Read twice (the drain, the removal), counted once.
        assert_eq!(ctx.link.audit.outbox.malformed.load(Relaxed), 1);
        // Live: an event is sent at once and never written.
        ctx.link.audit.record(event("n1"));
        let Frame::Audit(a) = next_frame(&mut cp).await else {
            panic!("expected an audit event")
        };
        assert_eq!(a.event.id, "n1");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(backend.writes.load(Relaxed), writes + 1);
        assert!(parse(&backend.text(), &Default::default()).is_empty());
        stopped(cp, stop, task).await;
        stop_writer.send(true).unwrap();
        writer.await.unwrap();
    }

    /// The once-only gate of the missing welcome's warning (the warning itself is not
    /// captured here: its flag is the process's).
    #[test]
    fn first_time_is_true_once_per_flag() {
        let flag = AtomicBool::new(false);
        assert!(first_time(&flag));
        assert!(!first_time(&flag));
        assert!(!first_time(&flag));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_dead_three_intervals_after_its_last_frame_not_a_tick_later() {
        let (mut cp, _stop, _, task) = start().await;
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        let Frame::Snapshot(_) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        // The heartbeat at 2 s is answered at 2.5 s; then the peer says nothing more.
        let welcomed_at = Instant::now();
        assert!(matches!(next_frame(&mut cp).await, Frame::Heartbeat(_)));
        tokio::time::sleep(Duration::from_millis(500)).await;
        cp.send(Message::text(r#"{"type":"heartbeat","sent_at":"t"}"#))
            .await
            .unwrap();
        let reader = tokio::spawn(async move { while let Some(Ok(_)) = cp.next().await {} });
        let end = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the silent peer was never found dead")
            .unwrap();
        assert_eq!(end, End::Dead);
        // Dead at 2.5 s + 3 × 2 s (then the bounded close), not at the tick of 10 s.
        let dead_after = Instant::now() - welcomed_at;
        assert!(
            dead_after >= Duration::from_millis(8500) && dead_after < Duration::from_secs(10),
            "{dead_after:?}"
        );
        reader.abort();
    }

    const WELCOME_2S: &str = r#"{"type":"welcome","deployment_id":"d","heartbeat_interval_s":2}"#;

    /// A session whose peer reads `hello`, sends a welcome (heartbeat 2 s, so the write
    /// bound is 6 s) and then reads nothing more, over a pipe too small for the snapshot.
    async fn stalled_writer() -> (Peer, watch::Sender<bool>, tokio::task::JoinHandle<End>) {
        let (mut cp, stop, _, task) = start_with(16, answer_control).await;
        assert_eq!(next_frame(&mut cp).await, Frame::Resync);
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        (cp, stop, task)
    }

    /// How a session blocked on a write ended; a minute of paused time is ample.
    async fn ended(task: tokio::task::JoinHandle<End>) -> End {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the session hangs on a blocked write")
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_ends_the_session_as_dead_within_the_bound() {
        let (cp, _stop, task) = stalled_writer().await;
        let welcomed_at = Instant::now();
        // The snapshot cannot be written: dead after the bound (3 × 2 s), plus the
        // 0.9 s the close may take (it cannot be written either), not never.
        assert_eq!(ended(task).await, End::Dead);
        assert_eq!(
            Instant::now() - welcomed_at,
            Duration::from_secs(6) + Duration::from_millis(900)
        );
        drop(cp);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_is_honoured_while_a_write_is_blocked() {
        let (cp, stop, task) = stalled_writer().await;
        let welcomed_at = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.send(true).unwrap();
        assert_eq!(ended(task).await, End::Shutdown);
        // At once, but for the bounded close (0.9 s).
        assert_eq!(
            Instant::now() - welcomed_at,
            Duration::from_secs(1) + Duration::from_millis(900)
        );
        drop(cp);
    }

    /// An API server that never answers.
    fn stalled_answer(_: Arc<Context>, _: Control) -> BoxFuture<'static, Frame> {
        futures::future::pending().boxed()
    }

    fn control(id: &str) -> Message {
        Message::text(format!(
            r#"{{"type":"control","id":"{id}","action":"pause","target":{{"kind":"Agent","namespace":"n","name":"a"}},"actor":"u"}}"#
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_keep_flowing_while_control_requests_stall() {
        let (mut cp, stop, _, task) = start_with(1 << 20, stalled_answer).await;
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        let Frame::Snapshot(_) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        let welcomed_at = Instant::now();
        for i in 0..MAX_CONTROLS {
            cp.send(control(&format!("c{i}"))).await.unwrap();
        }
        // Past the cap: refused at once.
        cp.send(control("busy")).await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(10), next_frame(&mut cp)).await;
        let Ok(Frame::ControlResult(r)) = answered else {
            panic!("expected control_result")
        };
        assert_eq!((r.id.as_str(), r.ok), ("busy", false));
        assert_eq!(Instant::now(), welcomed_at);
        // The stalled requests hold nothing up: heartbeats at 2 s and 4 s.
        for at in [2, 4] {
            let frame = tokio::time::timeout(Duration::from_secs(10), next_frame(&mut cp))
                .await
                .expect("no heartbeat while a control request stalls");
            assert!(matches!(frame, Frame::Heartbeat(_)), "{frame:?}");
            assert_eq!(Instant::now() - welcomed_at, Duration::from_secs(at));
            cp.send(Message::text(r#"{"type":"heartbeat","sent_at":"t"}"#))
                .await
                .unwrap();
        }
        stopped(cp, stop, task).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_control_request_is_answered_when_its_task_completes() {
        fn slow_answer(_: Arc<Context>, c: Control) -> BoxFuture<'static, Frame> {
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Frame::ControlResult(ControlResult {
                    id: c.id,
                    ok: true,
                    error: None,
                })
            }
            .boxed()
        }
        let (mut cp, stop, _, task) = start_with(1 << 20, slow_answer).await;
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        next_frame(&mut cp).await;
        let sent_at = Instant::now();
        cp.send(control("c")).await.unwrap();
        let result = loop {
            match next_frame(&mut cp).await {
                Frame::ControlResult(r) => break r,
                Frame::Heartbeat(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!((result.id.as_str(), result.ok), ("c", true));
        assert_eq!(Instant::now() - sent_at, Duration::from_secs(3));
        stopped(cp, stop, task).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_control_in_flight_when_the_connection_drops_runs_to_its_end() {
        static FINISHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        fn slow_answer(_: Arc<Context>, c: Control) -> BoxFuture<'static, Frame> {
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                // Where the real answer audits what it did.
                FINISHED.store(true, std::sync::atomic::Ordering::SeqCst);
                Frame::ControlResult(ControlResult {
                    id: c.id,
                    ok: true,
                    error: None,
                })
            }
            .boxed()
        }
        let (mut cp, _stop, _, task) = start_with(1 << 20, slow_answer).await;
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        next_frame(&mut cp).await;
        cp.send(control("c")).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The control plane goes away while the request runs.
        drop(cp);
        assert!(matches!(task.await.unwrap(), End::Dropped(_)));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            FINISHED.load(std::sync::atomic::Ordering::SeqCst),
            "the control was cut off with its connection, unaudited"
        );
    }

    /// A change to an object the store does not hold: a removal in the delta.
    fn removed(name: &str) -> crate::store::watch::Changed {
        crate::store::watch::Changed {
            key: crate::crd::Key::new(crate::crd::Kind::Agent, "ns", name),
            removed: true,
            uid: format!("uid-{name}"),
        }
    }

    /// The names in a delta, sorted.
    fn names(frame: Frame) -> Vec<String> {
        let Frame::Delta(delta) = frame else {
            panic!("expected a delta, got {frame:?}")
        };
        let mut names: Vec<String> = delta
            .changes
            .into_iter()
            .map(|c| match c {
                frame::Change::Remove { name, .. } => name,
                other => panic!("expected a removal, got {other:?}"),
            })
            .collect();
        names.sort();
        names
    }

    #[tokio::test(start_paused = true)]
    async fn changes_within_100ms_leave_as_one_delta_and_deltas_keep_100ms_apart() {
        let ms = Duration::from_millis;
        let ctx = crate::connect::test_context();
        let link = ctx.link.clone();
        let (mut cp, stop, _, task) = start_in(ctx, 1 << 20, answer_control).await;
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        let Frame::Snapshot(_) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        // Within the window that began with the snapshot: changes at 0, 10 and 50 ms
        // leave together, in one delta, at its end.
        let t = Instant::now();
        for (at, name) in [(0, "a"), (10, "b"), (50, "c")] {
            tokio::time::sleep_until(t + ms(at)).await;
            link.mark(removed(name));
        }
        assert_eq!(names(next_frame(&mut cp).await), ["a", "b", "c"]);
        assert_eq!(Instant::now() - t, ms(100));
        assert_eq!(link.deltas(), 1);

        // A change 20 ms after that delta waits for its window's end: 100 ms after it.
        let delta_at = Instant::now();
        tokio::time::sleep(ms(20)).await;
        link.mark(removed("d"));
        assert_eq!(names(next_frame(&mut cp).await), ["d"]);
        assert_eq!(Instant::now() - delta_at, ms(100));

        // After a quiet window a change leaves at once.
        tokio::time::sleep(ms(500)).await;
        let marked_at = Instant::now();
        link.mark(removed("e"));
        assert_eq!(names(next_frame(&mut cp).await), ["e"]);
        assert_eq!(Instant::now(), marked_at);

        // Each change's latency, from its mark to its delta's write: 100, 90 and 50 ms
        // in the first, 80 ms, then 0.
        let (latency, snapshot_bytes, snapshot_duration) = link.histograms();
        assert_eq!(latency.count(), 5);
        assert!((latency.sum() - 0.32).abs() < 1e-9, "{}", latency.sum());
        // The snapshot's size and time were observed too.
        assert_eq!(snapshot_bytes.count(), 1);
        assert!(snapshot_bytes.sum() > 20.0);
        assert_eq!(snapshot_duration.count(), 1);
        stopped(cp, stop, task).await;
    }

    #[tokio::test(start_paused = true)]
    async fn full_snapshots_follow_at_the_welcomes_interval() {
        let (mut cp, stop, _, task) = start().await;
        next_frame(&mut cp).await;
        cp.send(Message::text(
            r#"{"type":"welcome","deployment_id":"d","heartbeat_interval_s":10,"snapshot_interval_s":30}"#,
        ))
        .await
        .unwrap();
        let Frame::Snapshot(first) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        assert_eq!(first.seq, 1);
        let welcomed_at = Instant::now();
        for (at, seq) in [(30, 2), (60, 3)] {
            // Heartbeats in between are answered, so the peer is not silent.
            let snapshot = loop {
                match next_frame(&mut cp).await {
                    Frame::Heartbeat(_) => cp
                        .send(Message::text(r#"{"type":"heartbeat","sent_at":"t"}"#))
                        .await
                        .unwrap(),
                    Frame::Snapshot(s) => break s,
                    other => panic!("unexpected {other:?}"),
                }
            };
            assert_eq!(Instant::now() - welcomed_at, Duration::from_secs(at));
            assert_eq!(snapshot.seq, seq);
        }
        stopped(cp, stop, task).await;
    }

    /// Runs a session on `ws` with the default seams: its stop switch and its task.
    fn spawn_session<S: Transport + 'static>(
        ctx: Arc<Context>,
        ws: WebSocketStream<S>,
    ) -> (watch::Sender<bool>, tokio::task::JoinHandle<End>) {
        let (stop, mut stopping) = watch::channel(false);
        let task = tokio::spawn(async move {
            let seams = Seams {
                answer: answer_control,
                runner: crate::connect::shell::exec_runner,
            };
            run_with(&ctx, ws, Frame::Resync, &mut stopping, |_| {}, seams).await
        });
        (stop, task)
    }

    /// A context whose store holds `n` Agents, their runtime given `args`.
    fn context_with_agents(n: usize, args: serde_json::Value) -> Arc<Context> {
        let ctx = crate::connect::test_context();
        for i in 0..n {
            let agent: crate::crd::Agent = serde_json::from_value(serde_json::json!({
                "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
                "metadata": {"name": format!("agent-{i:04}"), "namespace": "team", "uid": format!("u-{i}")},
                "spec": {"runtime": {"image": "registry.example/agent:1.2.3", "args": args}},
            }))
            .unwrap();
            ctx.store.agents.insert(agent);
        }
        ctx
    }

    /// A snapshot larger than a piece leaves as fragments of one message: a peer that
    /// takes no frame over 70 KiB still gets the whole snapshot (200 KB here), the same
    /// JSON as the text written at once.
    #[tokio::test(start_paused = true)]
    async fn a_large_snapshot_leaves_in_fragments_of_one_message() {
        let ctx = context_with_agents(300, serde_json::json!(["é".repeat(100)]));
        let whole = wire::snapshot_text_of(1, wire::all(super::super::form(&ctx)).into_iter());
        assert!(whole.len() > 2 * PIECE, "{} bytes", whole.len());
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let ours = crate::connect::progress::Progress::new(ours);
        let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        let small_frames = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_frame_size(Some(PIECE + 6 * 1024));
        let mut cp =
            WebSocketStream::from_raw_socket(theirs, Role::Server, Some(small_frames)).await;
        let (stop, task) = spawn_session(ctx, ws);
        next_frame(&mut cp).await;
        cp.send(Message::text(r#"{"type":"welcome","deployment_id":"d"}"#))
            .await
            .unwrap();
        let text = loop {
            match cp.next().await {
                Some(Ok(Message::Text(t))) => break t,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("expected the snapshot, got {other:?}"),
            }
        };
        let read = |t: &str| serde_json::from_str::<serde_json::Value>(t).expect("JSON");
        assert_eq!(read(text.as_str()), read(&whole));
        stopped(cp, stop, task).await;
    }

    #[test]
    fn text_splits_into_pieces_on_character_boundaries() {
        let text = "aé€😀".repeat(1000);
        for piece in [4, 5, 7, 64, 100_000] {
            let parts: Vec<(Bytes, bool)> = split_text(Bytes::from(text.clone()), piece).collect();
            assert!(
                parts
                    .iter()
                    .all(|(p, _)| std::str::from_utf8(p).is_ok() && p.len() <= piece.max(4))
            );
            assert_eq!(parts.iter().filter(|(_, last)| *last).count(), 1);
            assert!(parts.last().unwrap().1);
            let joined: Vec<u8> = parts.iter().flat_map(|(p, _)| p.to_vec()).collect();
            assert_eq!(joined, text.as_bytes());
        }
    }

    /// The control plane's end of a pipe, reading at most `chunk` bytes a second.
    struct SlowReader {
        inner: tokio::io::DuplexStream,
        pause: std::pin::Pin<Box<tokio::time::Sleep>>,
    }

    impl tokio::io::AsyncRead for SlowReader {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            use std::future::Future;
            std::task::ready!(self.pause.as_mut().poll(cx));
            let read = std::task::ready!(std::pin::Pin::new(&mut self.inner).poll_read(cx, buf));
            let next = Instant::now() + Duration::from_secs(1);
            self.pause.as_mut().reset(next);
            std::task::Poll::Ready(read)
        }
    }

    impl tokio::io::AsyncWrite for SlowReader {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// A snapshot that takes minutes to go through a slow link is not a dead peer: the
    /// write bound (3 heartbeat intervals, 6 s here) counts time without progress, not
    /// the whole message; and heartbeats the peer sent meanwhile count once read.
    #[tokio::test(start_paused = true)]
    async fn a_slow_link_is_not_a_dead_peer_while_bytes_flow() {
        let ctx = context_with_agents(300, serde_json::json!([]));
        let (ours, theirs) = tokio::io::duplex(1024);
        let ours = crate::connect::progress::Progress::new(ours);
        let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        let slow = SlowReader {
            inner: theirs,
            pause: Box::pin(tokio::time::sleep(Duration::ZERO)),
        };
        let cp = WebSocketStream::from_raw_socket(slow, Role::Server, None).await;
        let (stop, task) = spawn_session(ctx, ws);
        let (mut tx, mut rx) = cp.split();
        // The peer keeps its own heartbeats going all along (§4.5: both sides send them).
        let beats = tokio::spawn(async move {
            tx.send(Message::text(WELCOME_2S)).await.unwrap();
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let beat = Message::text(r#"{"type":"heartbeat","sent_at":"t"}"#);
                if tx.send(beat).await.is_err() {
                    return;
                }
            }
        });
        let start = Instant::now();
        let mut snapshot = None;
        while snapshot.is_none() {
            match rx.next().await {
                Some(Ok(Message::Text(t))) => {
                    if let Ok(Some(Frame::Snapshot(s))) = frame::decode(&t) {
                        snapshot = Some((s, t.len()));
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("the session ended during the snapshot: {other:?}"),
            }
        }
        let (snapshot, bytes) = snapshot.unwrap();
        let took = Instant::now() - start;
        assert_eq!(snapshot.resources.len(), 300);
        assert!(
            took > Duration::from_secs(60),
            "{took:?} for {bytes} bytes: not slow"
        );
        // Still alive afterwards: its next heartbeat arrives.
        loop {
            match rx.next().await {
                Some(Ok(Message::Text(t))) if t.contains("\"heartbeat\"") => break,
                Some(Ok(_)) => {}
                other => panic!("the session ended after the snapshot: {other:?}"),
            }
        }
        assert!(!task.is_finished());
        stop.send(true).unwrap();
        beats.abort();
        drop(rx);
        let _ = task.await;
    }

    /// A stand-in for a shell's process, on the exec's own channels: `flood` writes
    /// 64 chunks of 1 KiB every 20 ms for as long as it lives (each chunk waits for room
    /// in the queue all sessions share, as the exec pump's do); `deaf` reads nothing;
    /// `cat` echoes its input. Each ends when the session is closed, with 129 as after SIGHUP.
    fn stand_in(exec: crate::connect::shell::Exec) -> BoxFuture<'static, ()> {
        use crate::connect::shell::{Event, Exit};
        async move {
            let crate::connect::shell::Exec {
                channel,
                command,
                stdin,
                mut close,
                events,
                ..
            } = exec;
            let flood = command == ["flood"];
            let deaf = command == ["deaf"];
            let mut buf = vec![0u8; 32 * 1024];
            if events.send(Event::Opened(channel)).await.is_err() {
                return;
            }
            let burst = || async {
                for _ in 0..64 {
                    let out = Event::Output(channel, frame::Stream::Stdout, vec![b'x'; 1024]);
                    let _ = events.send(out).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let reason = loop {
                tokio::select! {
                    _ = close.changed() => break close.borrow().clone().unwrap_or_default(),
                    () = burst(), if flood => {}
                    n = stdin.take(&mut buf), if !flood && !deaf => {
                        let echo = Event::Output(channel, frame::Stream::Stdout, buf[..n].to_vec());
                        let _ = events.send(echo).await;
                    }
                }
            };
            let exit = Exit {
                code: Some(129),
                reason,
            };
            let _ = events.send(Event::Exited(channel, exit)).await;
        }
        .boxed()
    }

    /// A context whose store holds Agent `team/ag`, Active, with its pod running: a
    /// shell may be opened in it.
    fn context_with_an_agent() -> Arc<Context> {
        let ctx = crate::connect::test_context();
        let agent: crate::crd::Agent = serde_json::from_value(serde_json::json!({
            "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
            "metadata": {"name": "ag", "namespace": "team", "uid": "a-ag"},
            "spec": {"runtime": {"image": "x"}},
            "status": {"phase": "Active"},
        }))
        .unwrap();
        let pod: crate::store::PodView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ag", "namespace": "team", "ownerReferences": [{
                "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent", "name": "ag",
                "uid": "a-ag", "controller": true}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "runtime", "ready": true, "restartCount": 0}]},
        }))
        .unwrap();
        let namespace: crate::store::NamespaceView =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "team"}})).unwrap();
        ctx.store.namespaces.insert(namespace);
        ctx.store.agents.insert(agent);
        ctx.store.pods.insert(pod);
        ctx
    }

    fn io_open(channel: u32, command: &str) -> Message {
        Message::text(format!(
            r#"{{"type":"io_open","channel":{channel},"session_id":"s{channel}","actor":"ada","target":{{"namespace":"team","agent":"ag"}},"command":["{command}"],"tty":false}}"#
        ))
    }

    /// A session past its snapshot (heartbeats every 2 s) whose shells run [`stand_in`],
    /// in a store that holds Agent `team/ag` ([`context_with_an_agent`]).
    async fn shells_session() -> (
        Arc<Context>,
        Peer,
        watch::Sender<bool>,
        tokio::task::JoinHandle<End>,
    ) {
        let ctx = context_with_an_agent();
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let ours = crate::connect::progress::Progress::new(ours);
        let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        let mut cp = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
        let (stop, mut stopping) = watch::channel(false);
        let session_ctx = ctx.clone();
        let task = tokio::spawn(async move {
            let seams = Seams {
                answer: answer_control,
                runner: stand_in,
            };
            run_with(
                &session_ctx,
                ws,
                Frame::Resync,
                &mut stopping,
                |_| {},
                seams,
            )
            .await
        });
        next_frame(&mut cp).await;
        cp.send(Message::text(WELCOME_2S)).await.unwrap();
        let Frame::Snapshot(_) = next_frame(&mut cp).await else {
            panic!("expected a snapshot")
        };
        (ctx, cp, stop, task)
    }

    /// TRUST.md §5 on the paused clock: sixteen sessions whose processes read nothing get
    /// two million one-byte stdin messages. The manager holds exactly the bytes waiting
    /// (one buffer a session, not a message each): 65 536 a session, 1 MiB in all; then
    /// session 1 is filled to its 1 MiB bound one byte at a time, and the next byte closes
    /// it with `overflow`, audited with the bound it broke, its memory given back. The
    /// connection and the other fifteen go on.
    #[tokio::test(start_paused = true)]
    async fn a_million_one_byte_messages_cost_a_megabyte_and_the_bound_closes_with_overflow() {
        use crate::connect::shell::input::SESSION_LIMIT;
        let (ctx, mut cp, stop, task) = shells_session().await;
        let held = || ctx.link.shell_input.load(Relaxed);
        for channel in 1..=16 {
            cp.send(io_open(channel, "deaf")).await.unwrap();
        }
        let mut opened = 0;
        while opened < 16 {
            if let Frame::IoOpened(_) = next_frame(&mut cp).await {
                opened += 1;
            }
        }
        // Every frame before an `io_resize` of a channel without a session has been
        // handled when its `unknown_channel` error comes back.
        async fn handled(cp: &mut Peer) {
            let probe = r#"{"type":"io_resize","channel":999,"cols":1,"rows":1}"#;
            cp.send(Message::text(probe)).await.unwrap();
            loop {
                match next_frame(cp).await {
                    Frame::Error(e) if e.code == "unknown_channel" => return,
                    Frame::Heartbeat(_) | Frame::Audit(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        let byte =
            |channel: u32| Message::binary(frame::encode_io(channel, frame::Stream::Stdin, b"x"));
        for _ in 0..65_536 {
            for channel in 1..=16 {
                cp.feed(byte(channel)).await.unwrap();
            }
        }
        cp.flush().await.unwrap();
        handled(&mut cp).await;
        assert_eq!(held(), 16 * 65_536, "a byte a message, nothing more");

        for _ in 65_536..SESSION_LIMIT {
            cp.feed(byte(1)).await.unwrap();
        }
        cp.flush().await.unwrap();
        handled(&mut cp).await;
        assert_eq!(held(), SESSION_LIMIT + 15 * 65_536);
        cp.send(byte(1)).await.unwrap();
        let (close, audit) = {
            let (mut close, mut audit) = (None, None);
            while close.is_none() || audit.is_none() {
                match next_frame(&mut cp).await {
                    Frame::IoClose(c) => close = Some(c),
                    Frame::Audit(a)
                        if a.event.action == crate::audit::AuditAction::SessionClose =>
                    {
                        audit = Some(a.event)
                    }
                    Frame::Heartbeat(_) | Frame::Audit(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            (close.unwrap(), audit.unwrap())
        };
        assert_eq!(
            (close.channel, close.exit_code, close.reason.as_deref()),
            (1, Some(129), Some("overflow"))
        );
        assert_eq!(
            audit.detail.reason.as_deref(),
            Some("overflow: over 1048576 bytes of input waiting for the process to read them")
        );
        assert_eq!(audit.detail.bytes_in, Some(SESSION_LIMIT as u64));
        assert_eq!(
            held(),
            15 * 65_536,
            "the closed session's memory is given back"
        );
        assert_eq!(ctx.link.shells_open(), 15);
        stopped(cp, stop, task).await;
    }

    /// §6 on the paused clock: one shell floods its output (3.2 MB a second here, in
    /// bursts that fill the queue all sessions share) while another does an echo round
    /// every second. Heartbeats leave at exactly 2, 4, … 10 s; each echo comes back in
    /// the instant it was typed, with at most the shared queue's worth of flood frames
    /// (64) ahead of it; `io_close` ends the flood at once, audited. Ten seconds of the
    /// session in a fraction of a second of wall time.
    #[tokio::test(start_paused = true)]
    async fn a_flood_stalls_neither_an_echo_session_nor_heartbeats() {
        let (ctx, mut cp, stop, task) = shells_session().await;
        let welcomed = Instant::now();
        cp.send(io_open(1, "flood")).await.unwrap();
        cp.send(io_open(2, "cat")).await.unwrap();

        let mut heartbeats = Vec::new();
        let mut opened = Vec::new();
        let mut flood_bytes = 0usize;
        // Flood frames since the echo in flight was typed, and when it was.
        let mut echo: Option<(Instant, usize, Vec<u8>)> = None;
        let mut rounds = Vec::new();
        let mut round = 0u32;
        let mut next_round = welcomed + Duration::from_millis(500);
        while Instant::now() < welcomed + Duration::from_millis(10_500) {
            match cp.next().await {
                Some(Ok(Message::Binary(b))) => {
                    let io = frame::decode_io(&b).unwrap();
                    match io.channel {
                        1 => {
                            flood_bytes += io.data.len();
                            if let Some((_, ahead, _)) = echo.as_mut() {
                                *ahead += 1;
                            }
                        }
                        2 => {
                            let (typed_at, ahead, text) =
                                echo.take().expect("an echo nobody typed");
                            assert_eq!(io.data, &text[..]);
                            rounds.push((Instant::now() - typed_at, ahead));
                        }
                        other => panic!("output on channel {other}"),
                    }
                }
                Some(Ok(Message::Text(t))) => match frame::decode(&t).unwrap().unwrap() {
                    Frame::Heartbeat(_) => {
                        heartbeats.push(Instant::now() - welcomed);
                        cp.send(Message::text(r#"{"type":"heartbeat","sent_at":"t"}"#))
                            .await
                            .unwrap();
                    }
                    Frame::IoOpened(o) => opened.push(o.channel),
                    Frame::Audit(_) => {}
                    other => panic!("unexpected {other:?}"),
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("the session ended: {other:?}"),
            }
            if echo.is_none() && Instant::now() >= next_round && opened.contains(&2) {
                round += 1;
                let text = format!("round {round}\n").into_bytes();
                cp.send(Message::binary(frame::encode_io(
                    2,
                    frame::Stream::Stdin,
                    &text,
                )))
                .await
                .unwrap();
                echo = Some((Instant::now(), 0, text));
                next_round += Duration::from_secs(1);
            }
        }
        let s = Duration::from_secs;
        assert_eq!(heartbeats, [s(2), s(4), s(6), s(8), s(10)]);
        assert_eq!(rounds.len(), 10, "{rounds:?}");
        for (took, ahead) in &rounds {
            assert_eq!(*took, Duration::ZERO, "{rounds:?}");
            assert!(
                *ahead <= 64,
                "{ahead} flood frames ahead of an echo: {rounds:?}"
            );
        }
        // 64 KiB every 20 ms for 10.5 s, give or take the last burst.
        assert!(flood_bytes >= 525 * 64 * 1024 - 64 * 1024, "{flood_bytes}");

        // io_close ends the flood in the instant it is asked: its io_close follows the
        // frames already queued, with 129.
        let asked = Instant::now();
        cp.send(Message::text(r#"{"type":"io_close","channel":1}"#))
            .await
            .unwrap();
        let mut after = 0;
        let close = loop {
            match cp.next().await {
                Some(Ok(Message::Binary(_))) => after += 1,
                Some(Ok(Message::Text(t))) => match frame::decode(&t).unwrap().unwrap() {
                    Frame::IoClose(c) => break c,
                    Frame::Heartbeat(_) | Frame::Audit(_) => {}
                    other => panic!("unexpected {other:?}"),
                },
                _ => {}
            }
        };
        assert_eq!(Instant::now(), asked);
        assert_eq!((close.channel, close.exit_code), (1, Some(129)));
        assert!(after <= 65, "{after} flood frames after io_close");
        assert_eq!(ctx.link.shells_open(), 1);
        stopped(cp, stop, task).await;
    }
}
