//! Shell I/O (PROTOCOL.md §6): `io_open` becomes an exec with a PTY into an agent's
//! container, and bytes flow both ways as binary frames.
//!
//! Each session is one task that owns its exec. Output goes to the connection through
//! one bounded queue shared by all sessions: a flooding session waits for its turn
//! there (and the exec's own buffers push back to the process), so it neither starves
//! the other sessions nor grows memory, and the connection's loop keeps serving
//! heartbeats and deltas between its frames. Input goes to each session through its
//! own buffer of bytes ([`input`]), bounded in the memory it holds.
//!
//! Closing an exec's stream does not end the process on Kubernetes (the runtime keeps
//! it, PTY and all), so every command runs under a one-line `/bin/sh` wrapper that
//! prints its pid in an escape sequence and `exec`s the command. To end a session the
//! manager sends SIGHUP to that pid through a second exec, then SIGKILL after a grace
//! period; the kernel hangs up the terminal's foreground job when its session leader dies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use super::Context;
use crate::audit::{AuditAction, AuditDetail, AuditEvent, AuditTarget, now_rfc3339};
use crate::process::uuid_v4;
use crate::protocol::frame::{
    DEFAULT_TERMINAL, DecodeError, Frame, IoClose, IoOpen, IoOpened, IoResize, Stream,
};

mod authorize;
mod exec;
mod exit;
pub(crate) mod input;

use authorize::authorize;
pub(crate) use exec::Exec;
pub use exit::Exit;
use input::Input;

/// Runs one session's exec to its end: [`exec_runner`] (the API server's exec
/// subresource), or in the session's tests a stand-in process on the same channels,
/// so that a flood is tested in process on the paused clock.
pub(crate) type Runner = fn(Exec) -> BoxFuture<'static, ()>;

/// The real exec.
pub(crate) fn exec_runner(exec: Exec) -> BoxFuture<'static, ()> {
    exec.run().boxed()
}

/// Output frames waiting for the connection, all sessions together (≤ 2 MiB).
const OUTPUT_QUEUE: usize = 64;
/// The reason of the `io_close` of a session whose input went past its bound
/// ([`input`]): the control plane has no way to slow a user's paste down, and dropping
/// bytes silently would corrupt what they typed, so the session is closed.
pub const OVERFLOW: &str = "overflow";

/// What a session task reports to the connection.
#[derive(Debug)]
pub enum Event {
    Opened(u32),
    Output(u32, Stream, Vec<u8>),
    Exited(u32, Exit),
}

struct Session {
    open: IoOpen,
    pod: String,
    started: Instant,
    stdin: Arc<Input>,
    resize: watch::Sender<(u16, u16)>,
    close: watch::Sender<Option<String>>,
    /// Input handed to the process (not what was dropped at an overflow).
    bytes_in: u64,
    bytes_out: u64,
    /// Closed for too much unread input: which bound it broke.
    overflow: Option<String>,
    task: tokio::task::JoinHandle<()>,
}

/// The sessions of one connection.
pub struct Shells {
    open: HashMap<u32, Session>,
    events_tx: mpsc::Sender<Event>,
    /// Polled by the connection's loop.
    pub events: mpsc::Receiver<Event>,
    runner: Runner,
}

impl Default for Shells {
    fn default() -> Self {
        Shells::with_runner(exec_runner)
    }
}

/// What the connection should send after handing a frame to [`Shells`].
#[derive(Debug, PartialEq)]
pub enum Reply {
    None,
    Frame(Box<Frame>),
    /// An `error` frame: code and message.
    Error(&'static str, String),
}

impl Shells {
    /// Sessions whose execs `runner` runs.
    pub(crate) fn with_runner(runner: Runner) -> Shells {
        let (events_tx, events) = mpsc::channel(OUTPUT_QUEUE);
        Shells {
            open: HashMap::new(),
            events_tx,
            events,
            runner,
        }
    }

    /// `io_open`: checks the rule of §6, then starts the exec. A refusal is audited as
    /// `session.denied` and answered with `io_close` `denied`.
    pub fn open(&mut self, ctx: &Context, o: IoOpen) -> Reply {
        if self.open.contains_key(&o.channel) {
            return Reply::Error(
                "channel_in_use",
                format!("channel {} already carries a session", o.channel),
            );
        }
        let pod = match authorize(&ctx.store, &ctx.config, &o, self.open.len()) {
            Ok(pod) => pod,
            Err(reason) => {
                tracing::warn!(channel = o.channel, session_id = %o.session_id, actor = %o.actor, namespace = %o.target.namespace, agent = %o.target.agent, container = %o.target.container, %reason, "shell session denied");
                return Reply::Frame(Box::new(super::control::deny_session(ctx, o, &reason)));
            }
        };
        record(
            ctx,
            AuditAction::SessionOpen,
            &o,
            &pod,
            AuditDetail::default(),
        );
        let stdin = Arc::new(Input::new(ctx.link.shell_input.clone()));
        // Without a PTY the size is never used.
        let (resize, resize_rx) = watch::channel(o.size().unwrap_or(DEFAULT_TERMINAL));
        let (close, close_rx) = watch::channel(None);
        let exec = Exec {
            client: ctx.kube.client().clone(),
            channel: o.channel,
            namespace: o.target.namespace.clone(),
            pod: pod.clone(),
            container: o.target.container.clone(),
            command: o.command.clone(),
            tty: o.tty,
            stdin: stdin.clone(),
            resize: resize_rx,
            close: close_rx,
            events: self.events_tx.clone(),
        };
        let span = tracing::info_span!("shell", channel = o.channel, session_id = %o.session_id);
        let task = tokio::spawn((self.runner)(exec).instrument(span));
        ctx.link.shell_opened();
        self.open.insert(
            o.channel,
            Session {
                open: o,
                pod,
                started: Instant::now(),
                stdin,
                resize,
                close,
                bytes_in: 0,
                bytes_out: 0,
                overflow: None,
                task,
            },
        );
        Reply::None
    }

    /// An `io_open` that failed to decode (`err`, already answered with `error`): when its
    /// channel can be read and carries no session, it is refused there too, as any other
    /// refusal (`io_close` `denied`, audited `session.denied`), so the control plane's
    /// session gets its answer. A channel with a live session is left alone: an
    /// `io_close` on it would end that session in the control plane's eyes.
    pub fn refuse_malformed(&self, ctx: &Context, err: &DecodeError) -> Option<Frame> {
        let o = err.malformed_io_open()?;
        if self.open.contains_key(&o.channel) {
            return None;
        }
        let reason = err.to_string();
        tracing::warn!(channel = o.channel, session_id = %o.session_id, actor = %o.actor, %reason, "shell session denied");
        Some(super::control::deny_malformed_session(ctx, o, &reason))
    }

    /// A binary frame from the control plane: stdin for a session.
    pub fn input(&mut self, bytes: &[u8]) -> Reply {
        let chunk = match crate::protocol::frame::decode_io(bytes) {
            Ok(c) => c,
            Err(e) => return Reply::Error("bad_frame", e.to_string()),
        };
        let Some(s) = self.open.get_mut(&chunk.channel) else {
            return no_session(chunk.channel);
        };
        if chunk.stream != Stream::Stdin {
            return Reply::Error(
                "bad_frame",
                format!(
                    "stream {} is not written by the control plane (0 = stdin)",
                    chunk.stream as u8
                ),
            );
        }
        if chunk.data.is_empty() {
            return Reply::None;
        }
        if s.overflow.is_some() {
            // Closing already: its io_close follows; more input goes nowhere.
            return Reply::None;
        }
        // A session whose process has ended keeps taking input until its `Exited` is
        // handled: bounded the same, and dropped with it.
        if let Err(why) = s.stdin.push(chunk.data) {
            tracing::warn!(channel = chunk.channel, reason = %why, "closing shell session: input overflow");
            s.overflow = Some(why);
            let _ = s.close.send(Some(OVERFLOW.into()));
            return Reply::None;
        }
        s.bytes_in += chunk.data.len() as u64;
        Reply::None
    }

    pub fn resize(&mut self, r: &IoResize) -> Reply {
        match self.open.get(&r.channel) {
            Some(s) => {
                s.resize.send_replace((r.cols, r.rows));
                Reply::None
            }
            None => no_session(r.channel),
        }
    }

    /// `io_close` from the control plane: end the process. The session's own `io_close`
    /// (with the exit code) follows when it has ended.
    pub fn close(&mut self, c: &IoClose) -> Reply {
        match self.open.get(&c.channel) {
            Some(s) => {
                let _ = s.close.send(Some("closed by the control plane".into()));
                Reply::None
            }
            None => no_session(c.channel),
        }
    }

    /// An event from a session task, turned into what the connection sends: a text
    /// frame, or the bytes of a binary one.
    pub fn event(&mut self, ctx: &Context, ev: Event) -> Option<Outgoing> {
        match ev {
            Event::Opened(channel) => Some(Outgoing::Text(Box::new(Frame::IoOpened(IoOpened {
                channel,
            })))),
            Event::Output(channel, stream, data) => {
                let s = self.open.get_mut(&channel)?;
                s.bytes_out += data.len() as u64;
                Some(Outgoing::Binary(crate::protocol::frame::encode_io(
                    channel, stream, &data,
                )))
            }
            Event::Exited(channel, exit) => {
                let s = self.open.remove(&channel)?;
                Some(Outgoing::Text(Box::new(finish(ctx, s, exit))))
            }
        }
    }

    /// The connection is ending: ends every exec, waits up to `grace` for them, and
    /// audits each close. Output still in flight is dropped (there is nowhere to send it).
    pub async fn end_all(&mut self, ctx: &Context, reason: &str, grace: Duration) {
        if self.open.is_empty() {
            return;
        }
        tracing::info!(
            sessions = self.open.len(),
            reason,
            "ending every shell session"
        );
        for s in self.open.values() {
            let _ = s.close.send(Some(reason.to_owned()));
        }
        let deadline = Instant::now() + grace;
        while !self.open.is_empty() {
            tokio::select! {
                ev = self.events.recv() => match ev {
                    Some(Event::Exited(channel, exit)) => {
                        if let Some(s) = self.open.remove(&channel) {
                            finish(ctx, s, Exit { reason: reason.to_owned(), ..exit });
                        }
                    }
                    // Never sent: not counted in `bytes_out`.
                    Some(Event::Output(..) | Event::Opened(_)) => {}
                    None => break,
                },
                _ = sleep_until(deadline) => break,
            }
        }
        // Whatever did not end in time is cut: dropping the exec aborts its stream.
        for (_, s) in self.open.drain() {
            s.task.abort();
            finish(
                ctx,
                s,
                Exit {
                    code: None,
                    reason: format!("{reason}; the exec did not end in time and was cut"),
                },
            );
        }
    }
}

fn no_session(channel: u32) -> Reply {
    Reply::Error(
        "unknown_channel",
        format!("no session on channel {channel}"),
    )
}

impl Drop for Shells {
    fn drop(&mut self) {
        // `end_all` runs on every path out of a connection; this only guards a panic path.
        for s in self.open.values() {
            s.task.abort();
        }
    }
}

/// A frame for the connection: a text (control) frame or a binary (shell) one.
#[derive(Debug)]
pub enum Outgoing {
    Text(Box<Frame>),
    Binary(Vec<u8>),
}

/// Audits the close, updates the gauge, and returns the `io_close` to send.
fn finish(ctx: &Context, s: Session, exit: Exit) -> Frame {
    ctx.link.shell_closed();
    let duration_ms = s.started.elapsed().as_millis() as u64;
    // The audit says which bound an overflow broke; the `io_close` says `overflow`.
    let audited = match &s.overflow {
        Some(why) if exit.reason == OVERFLOW => format!("{OVERFLOW}: {why}"),
        _ => exit.reason.clone(),
    };
    tracing::info!(channel = s.open.channel, session_id = %s.open.session_id, exit_code = ?exit.code, bytes_in = s.bytes_in, bytes_out = s.bytes_out, duration_ms, reason = %exit.reason, "shell session ended");
    record(
        ctx,
        AuditAction::SessionClose,
        &s.open,
        &s.pod,
        AuditDetail {
            exit_code: exit.code,
            bytes_in: Some(s.bytes_in),
            bytes_out: Some(s.bytes_out),
            duration_ms: Some(duration_ms),
            reason: Some(audited),
            ..Default::default()
        },
    );
    Frame::IoClose(IoClose {
        channel: s.open.channel,
        exit_code: exit.code,
        reason: Some(exit.reason),
    })
}

fn record(ctx: &Context, action: AuditAction, o: &IoOpen, pod: &str, detail: AuditDetail) {
    ctx.link.audit.record(AuditEvent {
        id: uuid_v4(),
        time: now_rfc3339(),
        action,
        actor: o.actor.clone(),
        session_id: Some(o.session_id.clone()),
        target: AuditTarget {
            kind: "Agent".into(),
            namespace: o.target.namespace.clone(),
            name: o.target.agent.clone(),
            pod: Some(pod.to_owned()),
            container: Some(o.target.container.clone()),
        },
        detail: AuditDetail {
            command: Some(o.command.clone()),
            ..detail
        },
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_malformed_io_open_is_refused_on_its_channel() {
        let ctx = crate::connect::test_context();
        let mut shells = Shells::default();
        let text = r#"{"type":"io_open","channel":7,"session_id":"s-1","actor":"ada","target":{"namespace":"ns","agent":"ag"},"tty":"no"}"#;
        let err = crate::protocol::frame::decode(text).unwrap_err();
        let answer = shells.refuse_malformed(&ctx, &err);
        assert_eq!(
            answer,
            Some(Frame::IoClose(IoClose {
                channel: 7,
                exit_code: None,
                reason: Some("denied".into()),
            }))
        );
        let audit = ctx.link.audit.drain();
        assert_eq!(audit.len(), 1);
        let event = &audit[0];
        assert_eq!(event.action, AuditAction::SessionDenied);
        assert_eq!(
            (event.actor.as_str(), event.session_id.as_deref()),
            ("ada", Some("s-1"))
        );
        assert_eq!(
            (event.target.namespace.as_str(), event.target.name.as_str()),
            ("ns", "ag")
        );
        let reason = event.detail.reason.as_deref().unwrap();
        assert!(
            reason.starts_with("bad `io_open` frame: ") && reason.contains("boolean"),
            "{reason}"
        );

        // No readable channel: the `error` frame is the only answer.
        let err =
            crate::protocol::frame::decode(r#"{"type":"io_open","channel":"7"}"#).unwrap_err();
        assert_eq!(shells.refuse_malformed(&ctx, &err), None);
        // Another frame's error is not a session's.
        let err =
            crate::protocol::frame::decode(r#"{"type":"io_resize","channel":7}"#).unwrap_err();
        assert_eq!(shells.refuse_malformed(&ctx, &err), None);
        assert!(ctx.link.audit.drain().is_empty());

        // A live session on that channel is not closed by someone else's bad frame.
        let stdin = Arc::new(Input::new(Default::default()));
        let (resize, _) = watch::channel(DEFAULT_TERMINAL);
        let (close, _) = watch::channel(None);
        let good = r#"{"type":"io_open","channel":7,"session_id":"s-0","actor":"ada","target":{"namespace":"ns","agent":"ag"}}"#;
        let Ok(Some(Frame::IoOpen(open))) = crate::protocol::frame::decode(good) else {
            unreachable!()
        };
        shells.open.insert(
            7,
            Session {
                open,
                pod: "ag".into(),
                started: Instant::now(),
                stdin,
                resize,
                close,
                bytes_in: 0,
                bytes_out: 0,
                overflow: None,
                task: tokio::spawn(async {}),
            },
        );
        let err = crate::protocol::frame::decode(text).unwrap_err();
        assert_eq!(shells.refuse_malformed(&ctx, &err), None);
        assert!(ctx.link.audit.drain().is_empty());
    }
}
