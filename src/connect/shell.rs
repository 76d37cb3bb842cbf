//! Shell I/O (PROTOCOL.md §6): `io_open` becomes an exec with a PTY into an agent's
//! container, and bytes flow both ways as binary frames.
//!
//! Each session is one task that owns its exec. Output goes to the connection through
//! one bounded queue shared by all sessions: a flooding session waits for its turn
//! there (and the exec's own buffers push back to the process), so it neither starves
//! the other sessions nor grows memory, and the connection's loop keeps serving
//! heartbeats and deltas between its frames. Input goes to each session through its
//! own queue, bounded in bytes.
//!
//! Closing an exec's stream does not end the process on Kubernetes (the runtime keeps
//! it, PTY and all), so every command runs under a one-line `/bin/sh` wrapper that
//! prints its pid in an escape sequence and `exec`s the command. To end a session the
//! manager sends SIGHUP to that pid through a second exec, then SIGKILL after a grace
//! period; the kernel hangs up the terminal's foreground job when its session leader dies.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Client;
use kube::api::{Api, AttachParams, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};

use super::Context;
use super::frame::{
    DEFAULT_TERMINAL, DecodeError, Frame, IoClose, IoOpen, IoOpened, IoResize, Stream,
};
use crate::audit::{AuditAction, AuditDetail, AuditEvent, AuditTarget, now_rfc3339, uuid_v4};
use crate::crd::AgentPhase;

/// The containers of an agent's pod a shell may open in.
pub const ALLOWED_CONTAINERS: [&str; 2] = ["runtime", "agentlet"];

/// Largest payload of one output frame.
const CHUNK: usize = 32 * 1024;
/// Output frames waiting for the connection, all sessions together (≤ 2 MiB).
const OUTPUT_QUEUE: usize = 64;
/// Input bytes accepted for one session and not yet taken by its process. Past it the
/// session is closed: the control plane has no way to slow a user's paste down, and
/// dropping bytes silently would corrupt what they typed.
const STDIN_LIMIT: usize = 1 << 20;
/// The exec's own pipe buffers (kube's default is 1 KiB: slow for `cat` of a big file).
const EXEC_BUFFER: usize = 64 * 1024;
/// Bound on starting an exec (the API server or kubelet may not answer).
const EXEC_START_TIMEOUT: Duration = Duration::from_secs(20);
/// After SIGHUP, how long before the session is cut regardless.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long to wait for the exit status once the output has ended.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// The wrapper: `$0`-free, no quoting of the user's arguments (they are `$@`).
const WRAPPER: &str = r#"printf '\033]autonomic;pid=%s\007' "$$"; exec "$@""#;
const PID_MARKER: &[u8] = b"\x1b]autonomic;pid=";
/// SIGHUP, up to 2 s for the process to go, then SIGKILL.
const KILLER: &str = r#"kill -HUP "$1" 2>/dev/null || exit 0
for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$1" 2>/dev/null || exit 0; sleep 0.2; done
kill -KILL "$1" 2>/dev/null; exit 0"#;

/// What a session task reports to the connection.
#[derive(Debug)]
pub enum Event {
    Opened(u32),
    Output(u32, Stream, Vec<u8>),
    Exited(u32, Exit),
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The process's exit status, when known.
    pub code: Option<i32>,
    pub reason: String,
}

struct Session {
    open: IoOpen,
    pod: String,
    started: Instant,
    stdin: mpsc::UnboundedSender<Vec<u8>>,
    stdin_pending: Arc<AtomicUsize>,
    resize: watch::Sender<(u16, u16)>,
    close: watch::Sender<Option<String>>,
    /// Input handed to the process (not what was dropped at an overflow).
    bytes_in: u64,
    bytes_out: u64,
    /// Closed for too much unread input.
    overflowed: bool,
    task: tokio::task::JoinHandle<()>,
}

/// The sessions of one connection.
pub struct Shells {
    open: HashMap<u32, Session>,
    events_tx: mpsc::Sender<Event>,
    /// Polled by the connection's loop.
    pub events: mpsc::Receiver<Event>,
}

impl Default for Shells {
    fn default() -> Self {
        let (events_tx, events) = mpsc::channel(OUTPUT_QUEUE);
        Shells {
            open: HashMap::new(),
            events_tx,
            events,
        }
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
    /// `io_open`: checks the rule of §6, then starts the exec. A refusal is audited as
    /// `session.denied` and answered with `io_close` `denied`.
    pub fn open(&mut self, ctx: &Context, o: IoOpen) -> Reply {
        if self.open.contains_key(&o.channel) {
            return Reply::Error(
                "channel_in_use",
                format!("channel {} already carries a session", o.channel),
            );
        }
        let pod = match authorize(ctx, &o, self.open.len()) {
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
        let (stdin, stdin_rx) = mpsc::unbounded_channel();
        let stdin_pending = Arc::new(AtomicUsize::new(0));
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
            stdin: stdin_rx,
            stdin_pending: stdin_pending.clone(),
            resize: resize_rx,
            close: close_rx,
            events: self.events_tx.clone(),
        };
        let task = tokio::spawn(exec.run());
        ctx.link.sessions_open.fetch_add(1, Relaxed);
        self.open.insert(
            o.channel,
            Session {
                open: o,
                pod,
                started: Instant::now(),
                stdin,
                stdin_pending,
                resize,
                close,
                bytes_in: 0,
                bytes_out: 0,
                overflowed: false,
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
        let chunk = match super::frame::decode_io(bytes) {
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
        if s.overflowed {
            // Closing already: its io_close follows; more input goes nowhere.
            return Reply::None;
        }
        let pending = s.stdin_pending.fetch_add(chunk.data.len(), Relaxed) + chunk.data.len();
        if pending > STDIN_LIMIT {
            let reason = format!(
                "input overflow: over {STDIN_LIMIT} bytes waiting for the process to read them"
            );
            tracing::warn!(channel = chunk.channel, %reason, "closing shell session");
            s.overflowed = true;
            let _ = s.close.send(Some(reason));
            return Reply::None;
        }
        s.bytes_in += chunk.data.len() as u64;
        // The session task holds the receiver until it ends; a closed channel means it is
        // ending and its `Exited` is on the way.
        let _ = s.stdin.send(chunk.data.to_vec());
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
                Some(Outgoing::Binary(super::frame::encode_io(
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

/// The §6 rule: an Agent this manager reconciles, Active and not paused, its own pod
/// running, and one of its two containers. Returns the pod's name.
pub fn authorize(ctx: &Context, o: &IoOpen, open: usize) -> Result<String, String> {
    let t = &o.target;
    if open >= ctx.config.max_sessions {
        return Err(format!(
            "too many shell sessions: {} open, the limit is {} (AUTONOMIC_MAX_SESSIONS)",
            open, ctx.config.max_sessions
        ));
    }
    if !ALLOWED_CONTAINERS.contains(&t.container.as_str()) {
        return Err(format!(
            "container {:?} is not allowed (runtime or agentlet only)",
            t.container
        ));
    }
    if o.command.is_empty() || o.command.iter().any(|a| a.contains('\0')) {
        return Err("the command is empty or holds a NUL byte".into());
    }
    if !ctx.config.watches(&t.namespace) {
        return Err(format!(
            "namespace {:?} is not watched by this manager",
            t.namespace
        ));
    }
    let agent = ctx
        .store
        .agents
        .get(&t.namespace, &t.agent)
        .ok_or_else(|| format!("agent {}/{} not found", t.namespace, t.agent))?;
    if agent.spec.paused {
        return Err(format!("agent {}/{} is paused", t.namespace, t.agent));
    }
    let phase = agent.status.as_ref().and_then(|s| s.phase);
    if phase != Some(AgentPhase::Active) {
        let phase = phase.map_or("unknown".to_owned(), |p| format!("{p:?}"));
        return Err(format!(
            "agent {}/{} is {phase}, not Active",
            t.namespace, t.agent
        ));
    }
    let pod_name = agent
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .unwrap_or_else(|| t.agent.clone());
    let pod = ctx
        .store
        .owned_pod(&t.namespace, &pod_name, agent.metadata.uid.as_deref())
        .ok_or_else(|| format!("agent {}/{} has no pod of its own", t.namespace, t.agent))?;
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) != Some("Running") {
        return Err(format!("pod {pod_name} is not running"));
    }
    // A running pod reports every container (the cache keeps no container specs).
    let has_container = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == t.container));
    if !has_container {
        return Err(format!("pod {pod_name} has no container {:?}", t.container));
    }
    Ok(pod_name)
}

/// Audits the close, updates the gauge, and returns the `io_close` to send.
fn finish(ctx: &Context, s: Session, exit: Exit) -> Frame {
    ctx.link.sessions_open.fetch_sub(1, Relaxed);
    let duration_ms = s.started.elapsed().as_millis() as u64;
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
            reason: Some(exit.reason.clone()),
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

/// One session's exec, run as its own task.
struct Exec {
    client: Client,
    channel: u32,
    namespace: String,
    pod: String,
    container: String,
    command: Vec<String>,
    tty: bool,
    stdin: mpsc::UnboundedReceiver<Vec<u8>>,
    stdin_pending: Arc<AtomicUsize>,
    resize: watch::Receiver<(u16, u16)>,
    close: watch::Receiver<Option<String>>,
    events: mpsc::Sender<Event>,
}

impl Exec {
    async fn run(mut self) {
        let exit = self.exec().await;
        let _ = self.events.send(Event::Exited(self.channel, exit)).await;
    }

    async fn exec(&mut self) -> Exit {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = AttachParams::default()
            .container(self.container.clone())
            .stdin(true)
            .stdout(true)
            .stderr(!self.tty)
            .tty(self.tty)
            .max_stdin_buf_size(EXEC_BUFFER)
            .max_stdout_buf_size(EXEC_BUFFER)
            .max_stderr_buf_size(EXEC_BUFFER);
        let command = wrapped(&self.command);
        let started = tokio::select! {
            r = timeout(EXEC_START_TIMEOUT, api.exec(&self.pod, command, &params)) => r,
            _ = self.close.changed() => return self.closed_reason("closed before the exec started"),
        };
        let mut process = match started {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return failed(format!("exec failed: {e}")),
            Err(_) => {
                return failed(format!(
                    "exec did not start within {} s",
                    EXEC_START_TIMEOUT.as_secs()
                ));
            }
        };
        if self.events.send(Event::Opened(self.channel)).await.is_err() {
            return failed("the connection is gone".into());
        }
        let mut size = process.terminal_size();
        if let Some(tx) = size.as_mut() {
            let (cols, rows) = *self.resize.borrow_and_update();
            let _ = tx.try_send(terminal(cols, rows));
        }
        let (Some(mut stdout), Some(mut stdin), Some(status)) =
            (process.stdout(), process.stdin(), process.take_status())
        else {
            return failed("exec streams missing".into());
        };
        let mut stderr = process.stderr();
        let mut marker = PidMarker::default();
        let mut out_open = true;
        let mut err_open = stderr.is_some();
        let mut out_buf = vec![0u8; CHUNK];
        let mut err_buf = vec![0u8; CHUNK];
        let mut cut_at: Option<Instant> = None;
        let mut kill_pending = false;
        let mut reason: Option<String> = None;
        let spawn_kill = |pid: u32| {
            let (ns, pod, container) = (&self.namespace, &self.pod, &self.container);
            tokio::spawn(kill(
                self.client.clone(),
                ns.clone(),
                pod.clone(),
                container.clone(),
                pid,
            ));
        };
        // Stdin is fed from its own future so that a process not reading its input
        // cannot stop its output from being read (the exec's pipes would deadlock).
        let pending = self.stdin_pending.clone();
        let stdin_rx = &mut self.stdin;
        let feed = async move {
            while let Some(chunk) = stdin_rx.recv().await {
                pending.fetch_sub(chunk.len(), Relaxed);
                if stdin.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            // Keep the writer: dropping it would close the whole exec stream (v4).
            std::future::pending::<()>().await;
        };
        tokio::pin!(feed);
        while out_open || err_open {
            tokio::select! {
                r = stdout.read(&mut out_buf), if out_open => match r {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => {
                        let data = marker.feed(&out_buf[..n]);
                        if kill_pending && let Some(pid) = marker.pid {
                            kill_pending = false;
                            spawn_kill(pid);
                        }
                        // Once closed, output is drained, not sent: no one reads it, and
                        // waiting for room would hold up the process's end.
                        if !data.is_empty() && cut_at.is_none() && self.events.send(Event::Output(self.channel, Stream::Stdout, data)).await.is_err() {
                            process.abort();
                            return failed("the connection is gone".into());
                        }
                    }
                },
                r = read_some(&mut stderr, &mut err_buf), if err_open => match r {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => {
                        let data = err_buf[..n].to_vec();
                        if cut_at.is_none() && self.events.send(Event::Output(self.channel, Stream::Stderr, data)).await.is_err() {
                            process.abort();
                            return failed("the connection is gone".into());
                        }
                    }
                },
                _ = &mut feed => {}
                Ok(()) = self.resize.changed() => {
                    let (cols, rows) = *self.resize.borrow_and_update();
                    if let Some(tx) = size.as_mut() {
                        let _ = tx.try_send(terminal(cols, rows));
                    }
                }
                Ok(()) = self.close.changed(), if cut_at.is_none() => {
                    reason = self.close.borrow().clone();
                    cut_at = Some(Instant::now() + KILL_GRACE);
                    match marker.pid {
                        Some(pid) => spawn_kill(pid),
                        // The pid is still on its way: the kill follows it (above).
                        None => kill_pending = true,
                    }
                }
                _ = sleep_until(cut_at.unwrap_or_else(Instant::now)), if cut_at.is_some() => {
                    process.abort();
                    break;
                }
            }
        }
        let code = match timeout(STATUS_TIMEOUT, status).await {
            Ok(Some(s)) => exit_code(&s),
            _ => None,
        };
        Exit {
            code,
            reason: reason.unwrap_or_else(|| "exited".into()),
        }
    }

    fn closed_reason(&self, fallback: &str) -> Exit {
        failed(
            self.close
                .borrow()
                .clone()
                .unwrap_or_else(|| fallback.to_owned()),
        )
    }
}

fn failed(reason: String) -> Exit {
    Exit { code: None, reason }
}

fn terminal(cols: u16, rows: u16) -> TerminalSize {
    TerminalSize {
        width: cols.max(1),
        height: rows.max(1),
    }
}

async fn read_some<R: AsyncRead + Unpin>(
    r: &mut Option<R>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

/// The user's command under the pid-printing wrapper.
fn wrapped(command: &[String]) -> Vec<String> {
    ["/bin/sh", "-c", WRAPPER, "sh"]
        .into_iter()
        .map(String::from)
        .chain(command.iter().cloned())
        .collect()
}

/// Ends the session's process: SIGHUP, then SIGKILL (see the module's doc).
async fn kill(client: Client, namespace: String, pod: String, container: String, pid: u32) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    // The API server wants at least one stream; the killer prints nothing.
    let params = AttachParams::default()
        .container(container)
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let command = ["/bin/sh", "-c", KILLER, "sh", &pid.to_string()];
    let run = async {
        let process = api
            .exec(&pod, command, &params)
            .await
            .map_err(|e| e.to_string())?;
        process.join().await.map_err(|e| e.to_string())
    };
    let result = timeout(KILL_GRACE, run)
        .await
        .unwrap_or_else(|_| Err("the kill exec did not finish in time".into()));
    if let Err(error) = result {
        tracing::warn!(%namespace, %pod, pid, %error, "could not end a shell session's process");
    }
}

/// The exit code in an exec's final status: `Success` is 0, a failure carries it as
/// the cause `ExitCode`.
pub fn exit_code(s: &Status) -> Option<i32> {
    if s.status.as_deref() == Some("Success") {
        return Some(0);
    }
    s.details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))?
        .message
        .as_deref()?
        .parse()
        .ok()
}

/// Finds and removes the wrapper's pid announcement at the start of the output.
#[derive(Debug, Default)]
pub struct PidMarker {
    pub pid: Option<u32>,
    /// Output held back while the announcement may still be arriving.
    held: Vec<u8>,
    done: bool,
}

/// Past this many bytes without the announcement, output is passed on as it is.
const MARKER_WINDOW: usize = 256;

impl PidMarker {
    /// Feeds output; returns what to pass on.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        if self.done {
            return data.to_vec();
        }
        self.held.extend_from_slice(data);
        if let Some(start) = find(&self.held, PID_MARKER) {
            let digits = start + PID_MARKER.len();
            if let Some(len) = self.held[digits..].iter().position(|&b| b == 0x07) {
                self.pid = std::str::from_utf8(&self.held[digits..digits + len])
                    .ok()
                    .and_then(|s| s.parse().ok());
                self.done = true;
                let mut out = self.held[..start].to_vec();
                out.extend_from_slice(&self.held[digits + len + 1..]);
                self.held = Vec::new();
                return out;
            }
        }
        if self.held.len() > MARKER_WINDOW {
            self.done = true;
            return std::mem::take(&mut self.held);
        }
        Vec::new()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[tokio::test]
    async fn a_malformed_io_open_is_refused_on_its_channel() {
        let ctx = crate::connect::test_context();
        let mut shells = Shells::default();
        let text = r#"{"type":"io_open","channel":7,"session_id":"s-1","actor":"ada","target":{"namespace":"ns","agent":"ag"},"tty":"no"}"#;
        let err = crate::connect::frame::decode(text).unwrap_err();
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
        let err = crate::connect::frame::decode(r#"{"type":"io_open","channel":"7"}"#).unwrap_err();
        assert_eq!(shells.refuse_malformed(&ctx, &err), None);
        // Another frame's error is not a session's.
        let err = crate::connect::frame::decode(r#"{"type":"io_resize","channel":7}"#).unwrap_err();
        assert_eq!(shells.refuse_malformed(&ctx, &err), None);
        assert!(ctx.link.audit.drain().is_empty());

        // A live session on that channel is not closed by someone else's bad frame.
        let (stdin, _stdin_rx) = mpsc::unbounded_channel();
        let (resize, _) = watch::channel(DEFAULT_TERMINAL);
        let (close, _) = watch::channel(None);
        let good = r#"{"type":"io_open","channel":7,"session_id":"s-0","actor":"ada","target":{"namespace":"ns","agent":"ag"}}"#;
        let Ok(Some(Frame::IoOpen(open))) = crate::connect::frame::decode(good) else {
            unreachable!()
        };
        shells.open.insert(
            7,
            Session {
                open,
                pod: "ag".into(),
                started: Instant::now(),
                stdin,
                stdin_pending: Default::default(),
                resize,
                close,
                bytes_in: 0,
                bytes_out: 0,
                overflowed: false,
                task: tokio::spawn(async {}),
            },
        );
        let err = crate::connect::frame::decode(text).unwrap_err();
        assert_eq!(shells.refuse_malformed(&ctx, &err), None);
        assert!(ctx.link.audit.drain().is_empty());
    }

    #[test]
    fn the_pid_announcement_is_removed_however_it_is_split() {
        let stream = b"\0\x1b]autonomic;pid=4242\x07hello\r\n";
        for split in 0..stream.len() {
            let mut m = PidMarker::default();
            let mut out = m.feed(&stream[..split]);
            out.extend(m.feed(&stream[split..]));
            assert_eq!(out, b"\0hello\r\n", "split at {split}");
            assert_eq!(m.pid, Some(4242));
        }
        // Later output is passed through untouched, even if it looks like a marker.
        let mut m = PidMarker::default();
        m.feed(b"\x1b]autonomic;pid=1\x07");
        assert_eq!(
            m.feed(b"\x1b]autonomic;pid=2\x07"),
            b"\x1b]autonomic;pid=2\x07"
        );
        assert_eq!(m.pid, Some(1));
    }

    #[test]
    fn output_without_an_announcement_is_not_held_forever() {
        let mut m = PidMarker::default();
        let mut out = Vec::new();
        for _ in 0..10 {
            out.extend(m.feed(&[b'x'; 40]));
        }
        assert_eq!(out.len(), 400);
        assert_eq!(m.pid, None);
    }

    #[test]
    fn the_wrapper_passes_arguments_untouched() {
        let cmd = vec!["echo".to_owned(), "a b; rm -rf /".to_owned()];
        let w = wrapped(&cmd);
        assert_eq!(&w[..2], ["/bin/sh", "-c"]);
        assert_eq!(&w[3..], ["sh", "echo", "a b; rm -rf /"]);
    }

    #[test]
    fn exit_codes_from_the_exec_status() {
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&ok), Some(0));
        let three = Status {
            status: Some("Failure".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(&three), Some(3));
        let other = Status {
            status: Some("Failure".into()),
            message: Some("container not found".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&other), None);
    }
}
