//! The legacy HTTP transport (PROTOCOL.md §8): no socket; frames are `POST`ed as a JSON
//! array to `<base>/api/autonomic/report` and the answer carries the control plane's
//! frames. Shares the codec, the wire form, control handling and the audit queue.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Context;
use super::backoff::{Reconnect, Retry};
use super::frame::{self, Frame};
use super::socket::{DialError, tcp, tls, tls_config};
use super::{control, read_token, wire};
use crate::audit::now_rfc3339;
use crate::config::Token;
use crate::connect::frame::{Audit, Delta, Heartbeat, Snapshot};

/// A control plane that accepts and never answers must not stall reporting.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read; anything bigger is a misbehaving peer.
const MAX_ANSWER: usize = 16 << 20;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One `POST`; returns the status and the body.
async fn post(ctx: &Context, token: &Token, body: &str) -> Result<(u16, Vec<u8>), DialError> {
    let config = &ctx.config;
    let url = &config.base_url;
    let tcp = tcp(config).await?;
    let mut stream: Box<dyn Stream> = if url.tls {
        Box::new(tls(config, tls_config(config)?, tcp).await?)
    } else {
        Box::new(tcp)
    };
    let request = format!(
        "POST {}/api/autonomic/report HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nUser-Agent: autonomic-manager/{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        url.path,
        url.authority(),
        token.expose(),
        crate::VERSION,
        body.len()
    );
    let io = |e: std::io::Error| DialError::Connect {
        target: url.authority(),
        reason: e.to_string(),
    };
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    stream.write_all(body.as_bytes()).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER as u64 + 1)
        .read_to_end(&mut answer)
        .await
        .map_err(io)?;
    if answer.len() > MAX_ANSWER {
        return Err(DialError::Handshake("answer larger than 16 MiB".into()));
    }
    parse_response(&answer).map_err(|e| DialError::Handshake(format!("bad HTTP answer: {e}")))
}

/// Status and body of an HTTP/1.1 answer read to its end (`Connection: close`).
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header end")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "header not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or("no status")?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if k == "content-length" {
            length = Some(v.parse::<usize>().map_err(|_| "bad content-length")?);
        }
    }
    let mut body = &raw[head_end + 4..];
    if chunked {
        let mut out = Vec::new();
        loop {
            let line_end = body
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or("truncated chunk")?;
            let size_text = std::str::from_utf8(&body[..line_end]).map_err(|_| "bad chunk size")?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| "bad chunk size")?;
            body = &body[line_end + 2..];
            if size == 0 {
                return Ok((status, out));
            }
            if body.len() < size {
                return Err("truncated chunk".into());
            }
            out.extend_from_slice(&body[..size]);
            body = body.get(size + 2..).unwrap_or_default();
        }
    }
    if let Some(n) = length {
        body = body.get(..n).ok_or("body shorter than content-length")?;
    }
    Ok((status, body.to_vec()))
}

/// What a report cycle keeps between posts.
struct Reporter {
    seq: u64,
    /// Frames waiting for the next post (control results, answers to the cp).
    outbox: Vec<Frame>,
    welcomed: bool,
    heartbeat: Duration,
    snapshot_every: Duration,
    last_snapshot: Instant,
    /// When the changes in the pending delta were first marked, for the delta latency
    /// once the post carrying it succeeds.
    marked: Vec<Instant>,
}

impl Reporter {
    fn snapshot(&mut self, ctx: &Context) -> Frame {
        ctx.link.take_dirty();
        self.seq += 1;
        self.last_snapshot = Instant::now();
        ctx.link.snapshots_sent.fetch_add(1, Relaxed);
        Frame::Snapshot(Snapshot {
            seq: self.seq,
            resources: wire::all(ctx),
        })
    }

    fn delta(&mut self, ctx: &Context) -> Option<Frame> {
        let (changes, marked) = wire::pending_changes(ctx);
        if changes.is_empty() {
            return None;
        }
        self.marked = marked;
        self.seq += 1;
        ctx.link.deltas_sent.fetch_add(1, Relaxed);
        Some(Frame::Delta(Delta {
            seq: self.seq,
            changes,
        }))
    }

    /// Acts on the frames of an answer.
    async fn absorb(&mut self, ctx: &Context, frames: Vec<Frame>) {
        for f in frames {
            match f {
                Frame::Welcome(w) => {
                    self.welcomed = true;
                    self.heartbeat = w.heartbeat_interval();
                    self.snapshot_every = w.snapshot_interval();
                }
                Frame::Resync => {
                    let s = self.snapshot(ctx);
                    self.outbox.push(s);
                }
                Frame::Control(c) => {
                    let result = control::answer(ctx, c).await;
                    self.outbox.push(result);
                }
                Frame::IoOpen(o) => {
                    // §8: no shell I/O over this transport.
                    let close =
                        control::deny_session(ctx, o, "no shell I/O over the HTTP transport");
                    self.outbox.push(close);
                }
                Frame::Heartbeat(_) => {}
                other => tracing::debug!(
                    frame = other.type_name(),
                    "ignoring a frame in a report answer"
                ),
            }
        }
    }
}

/// Reports until `shutdown` turns true.
pub async fn run(
    ctx: Arc<Context>,
    hello: Frame,
    mut shutdown: watch::Receiver<bool>,
    mut reconnect: Reconnect,
) {
    let config = ctx.config.clone();
    let link = ctx.link.clone();
    let mut r = Reporter {
        seq: 0,
        outbox: Vec::new(),
        welcomed: false,
        heartbeat: Duration::from_secs(15),
        snapshot_every: Duration::from_secs(300),
        last_snapshot: Instant::now(),
        marked: Vec::new(),
    };
    let mut last_post = Instant::now();
    loop {
        if *shutdown.borrow() {
            return;
        }
        // Build this post: hello + snapshot when not welcomed yet, else deltas & co.
        let mut frames = Vec::new();
        if !r.welcomed {
            r.seq = 0;
            frames.push(hello.clone());
            frames.push(r.snapshot(&ctx));
        } else if r.last_snapshot.elapsed() >= r.snapshot_every {
            frames.push(r.snapshot(&ctx));
        } else if let Some(d) = r.delta(&ctx) {
            frames.push(d);
        }
        let answers = std::mem::take(&mut r.outbox);
        frames.extend(answers.iter().cloned());
        let audits = link.audit.drain();
        frames.extend(
            audits
                .iter()
                .cloned()
                .map(|event| Frame::Audit(Audit { event })),
        );
        if frames.is_empty() || last_post.elapsed() >= r.heartbeat {
            frames.push(Frame::Heartbeat(Heartbeat {
                sent_at: now_rfc3339(),
            }));
        }
        let body = format!(
            "[{}]",
            frames
                .iter()
                .map(frame::encode)
                .collect::<Vec<_>>()
                .join(",")
        );
        let outcome = match read_token(&config) {
            Err(e) => Err((
                format!("cannot read the deployment token: {e}"),
                Retry::Normal,
            )),
            Ok(token) => match tokio::time::timeout(POST_TIMEOUT, post(&ctx, &token, &body))
                .await
                .unwrap_or_else(|_| Err(DialError::Handshake("no answer within 30 s".into())))
            {
                Ok((200, answer)) => {
                    match serde_json::from_slice::<Vec<serde_json::Value>>(&answer) {
                        Ok(values) => {
                            let mut decoded = Vec::new();
                            for v in &values {
                                match frame::decode(&v.to_string()) {
                                    Ok(Some(f)) => decoded.push(f),
                                    Ok(None) => {}
                                    // A malformed io_open is still answered on its channel.
                                    Err(e) => {
                                        tracing::warn!(error = %e, "malformed frame in a report answer");
                                        if let Some(o) = e.malformed_io_open() {
                                            let close = control::deny_malformed_session(
                                                &ctx,
                                                o,
                                                &e.to_string(),
                                            );
                                            r.outbox.push(close);
                                        }
                                    }
                                }
                            }
                            link.bytes_sent.fetch_add(body.len() as u64, Relaxed);
                            Ok(decoded)
                        }
                        Err(e) => Err((
                            format!("answer is not a JSON array of frames: {e}"),
                            Retry::Normal,
                        )),
                    }
                }
                Ok((401 | 403, _)) => Err((
                    format!("token rejected for token {}…", token.prefix()),
                    Retry::Rejected,
                )),
                Ok((404, _)) => Err((
                    "no control plane at the report URL (HTTP 404): check AUTONOMIC_BASE_URL"
                        .into(),
                    Retry::Normal,
                )),
                Ok((status, _)) => {
                    Err((format!("report refused with HTTP {status}"), Retry::Normal))
                }
                Err(e) => Err((
                    e.to_string(),
                    e.status()
                        .map(Retry::for_upgrade_status)
                        .unwrap_or(Retry::Normal),
                )),
            },
        };
        let wait = match outcome {
            Ok(answer) => {
                last_post = Instant::now();
                link.deltas_written(&std::mem::take(&mut r.marked));
                r.absorb(&ctx, answer).await;
                link.connected.store(r.welcomed, Relaxed);
                if r.welcomed {
                    reconnect.reset();
                }
                None
            }
            Err((why, retry)) => {
                tracing::warn!(error = %why, "report to the control plane failed");
                // Not delivered: answers and audits go back; the next good post starts over
                // with hello and a snapshot, then carries them.
                r.outbox.splice(0..0, answers);
                link.audit.requeue(audits);
                link.connected.store(false, Relaxed);
                // The next post is a snapshot: the delta's changes are in it.
                r.marked.clear();
                r.welcomed = false;
                Some(reconnect.delay(retry))
            }
        };
        match wait {
            Some(delay) => {
                link.reconnects.fetch_add(1, Relaxed);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return,
                }
            }
            None if !r.outbox.is_empty() => {}
            None => {
                // Post again at most 1 s after a change, and at least every heartbeat.
                let until_heartbeat = r.heartbeat.saturating_sub(last_post.elapsed());
                tokio::select! {
                    _ = link.dirty_notify.notified() => tokio::time::sleep(Duration::from_millis(100).min(until_heartbeat)).await,
                    _ = link.audit.notify.notified() => {}
                    _ = tokio::time::sleep(until_heartbeat) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_with_length_chunked_or_neither() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]trailing";
        assert_eq!(parse_response(plain).unwrap(), (200, b"[]".to_vec()));
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[{}\r\n1\r\n]\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (200, b"[{}]".to_vec()));
        let to_eof = b"HTTP/1.1 401 Unauthorized\r\n\r\nno";
        assert_eq!(parse_response(to_eof).unwrap(), (401, b"no".to_vec()));
        for bad in [
            &b"garbage"[..],
            b"HTTP/1.1 abc\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            assert!(
                parse_response(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
