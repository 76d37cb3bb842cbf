//! One session's exec: the process under the pid-announcing wrapper, its output pumped
//! to the connection in chunks, its input and resizes passed on, and its end (SIGHUP,
//! then SIGKILL) when the session closes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, AttachParams, AttachedProcess, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, SimplexStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};
use tracing::Instrument;

use super::exit::{Exit, exit_code, failed};
use super::input::Input;
use super::{Event, Stream};

/// Largest payload of one output frame.
const CHUNK: usize = 32 * 1024;
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

/// One session's exec, run as its own task. Crate-visible so that the session's
/// in-process tests can run a stand-in process on the same channels (see
/// [`super::Runner`]).
pub(crate) struct Exec {
    pub(crate) client: Client,
    pub(crate) channel: u32,
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) container: String,
    pub(crate) command: Vec<String>,
    pub(crate) tty: bool,
    pub(crate) stdin: Arc<Input>,
    pub(crate) resize: watch::Receiver<(u16, u16)>,
    pub(crate) close: watch::Receiver<Option<String>>,
    pub(crate) events: mpsc::Sender<Event>,
}

impl Exec {
    pub(super) async fn run(mut self) {
        let exit = self.exec().await;
        let _ = self.events.send(Event::Exited(self.channel, exit)).await;
    }

    /// Starts the process under the wrapper and tells the session it is open.
    async fn start(&mut self) -> Result<AttachedProcess, Exit> {
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
            _ = self.close.changed() => return Err(self.closed_reason("closed before the exec started")),
        };
        let process = match started {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(failed(format!("exec failed: {e}"))),
            Err(_) => {
                return Err(failed(format!(
                    "exec did not start within {} s",
                    EXEC_START_TIMEOUT.as_secs()
                )));
            }
        };
        if self.events.send(Event::Opened(self.channel)).await.is_err() {
            return Err(failed("the connection is gone".into()));
        }
        Ok(process)
    }

    /// The process's life: output pumped out, input and resizes in, and its end.
    async fn exec(&mut self) -> Exit {
        let mut process = match self.start().await {
            Ok(p) => p,
            Err(exit) => return exit,
        };
        let mut size = process.terminal_size();
        if let Some(tx) = size.as_mut() {
            let (cols, rows) = *self.resize.borrow_and_update();
            let _ = tx.try_send(terminal(cols, rows));
        }
        let (Some(stdout), Some(stdin), Some(status)) =
            (process.stdout(), process.stdin(), process.take_status())
        else {
            return failed("exec streams missing".into());
        };
        let stderr = process.stderr();
        // Stdin is fed from its own future so that a process not reading its input
        // cannot stop its output from being read (the exec's pipes would deadlock).
        let feed = feed(self.stdin.clone(), stdin);
        let streams = Streams {
            stdout,
            stderr,
            size,
        };
        let reason = match self.pump(&mut process, streams, feed).await {
            Ok(reason) => reason,
            Err(gone) => return gone,
        };
        let code = match timeout(STATUS_TIMEOUT, status).await {
            Ok(Some(s)) => exit_code(&s),
            _ => None,
        };
        Exit {
            code,
            reason: reason.unwrap_or_else(|| "exited".into()),
        }
    }

    /// Pumps output out and resizes in until the output ends or the session, closed,
    /// cuts the process after [`KILL_GRACE`]: why it was closed, if it was; `Err` when
    /// the connection is gone.
    async fn pump(
        &mut self,
        process: &mut AttachedProcess,
        mut streams: Streams,
        feed: impl Future<Output = ()>,
    ) -> Result<Option<String>, Exit> {
        let mut marker = PidMarker::default();
        let mut out_open = true;
        let mut err_open = streams.stderr.is_some();
        let mut out_buf = vec![0u8; CHUNK];
        let mut err_buf = vec![0u8; CHUNK];
        let mut cut_at: Option<Instant> = None;
        let mut kill_pending = false;
        let mut reason: Option<String> = None;
        tokio::pin!(feed);
        while out_open || err_open {
            tokio::select! {
                r = streams.stdout.read(&mut out_buf), if out_open => match r {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => {
                        let data = marker.feed(&out_buf[..n]);
                        if kill_pending && let Some(pid) = marker.pid {
                            kill_pending = false;
                            self.spawn_kill(pid);
                        }
                        // Once closed, output is drained, not sent: no one reads it, and
                        // waiting for room would hold up the process's end.
                        if !data.is_empty() && cut_at.is_none() {
                            self.send_output(process, Stream::Stdout, data).await?;
                        }
                    }
                },
                r = read_some(&mut streams.stderr, &mut err_buf), if err_open => match r {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => {
                        if cut_at.is_none() {
                            self.send_output(process, Stream::Stderr, err_buf[..n].to_vec()).await?;
                        }
                    }
                },
                _ = &mut feed => {}
                Ok(()) = self.resize.changed() => {
                    let (cols, rows) = *self.resize.borrow_and_update();
                    if let Some(tx) = streams.size.as_mut() {
                        let _ = tx.try_send(terminal(cols, rows));
                    }
                }
                Ok(()) = self.close.changed(), if cut_at.is_none() => {
                    reason = self.close.borrow().clone();
                    cut_at = Some(Instant::now() + KILL_GRACE);
                    match marker.pid {
                        Some(pid) => self.spawn_kill(pid),
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
        Ok(reason)
    }

    /// Sends one output frame; the process is aborted when the connection is gone.
    async fn send_output(
        &self,
        process: &mut AttachedProcess,
        stream: Stream,
        data: Vec<u8>,
    ) -> Result<(), Exit> {
        let event = Event::Output(self.channel, stream, data);
        if self.events.send(event).await.is_err() {
            process.abort();
            return Err(failed("the connection is gone".into()));
        }
        Ok(())
    }

    /// Ends the process `pid` in a task of its own, in the session's span (the kill's
    /// log lines name its channel).
    fn spawn_kill(&self, pid: u32) {
        let (ns, pod, container) = (&self.namespace, &self.pod, &self.container);
        tokio::spawn(
            kill(
                self.client.clone(),
                ns.clone(),
                pod.clone(),
                container.clone(),
                pid,
            )
            .in_current_span(),
        );
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

/// The exec's output streams and its terminal's size channel (a TTY's only).
struct Streams {
    stdout: ReadHalf<SimplexStream>,
    stderr: Option<ReadHalf<SimplexStream>>,
    size: Option<futures::channel::mpsc::Sender<TerminalSize>>,
}

/// Feeds the session's input to the process's stdin until the pipe closes, then holds
/// the writer: dropping it would close the whole exec stream (v4).
async fn feed(input: Arc<Input>, mut stdin: impl AsyncWrite + Unpin) {
    // A fixed buffer: what waits beyond it is in `input`, bounded there.
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = input.take(&mut chunk).await;
        if stdin.write_all(&chunk[..n]).await.is_err() {
            break;
        }
    }
    std::future::pending::<()>().await;
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
}
