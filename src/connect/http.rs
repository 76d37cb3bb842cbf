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
use crate::connect::frame::{Audit, ControlResult, Delta, Heartbeat, Snapshot};

/// A control plane that accepts and never answers must not stall reporting.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read; anything bigger is a misbehaving peer.
const MAX_ANSWER: usize = 16 << 20;

/// `control` requests of one answer carried out; the rest are answered `ok: false` at
/// once (each may take 10 s of API server time, and they run one after the other).
const MAX_CONTROLS: usize = 8;

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
    into_body(answer).map_err(|e| DialError::Handshake(format!("bad HTTP answer: {e}")))
}

/// Where an answer's body is.
enum Body {
    /// These bytes of the answer.
    Plain(std::ops::Range<usize>),
    /// Chunked, from this byte on.
    Chunked(usize),
}

/// Status and body of an HTTP/1.1 answer read to its end (`Connection: close`).
#[cfg(test)]
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let (status, body) = split_response(raw)?;
    let body = match body {
        Body::Plain(range) => raw[range].to_vec(),
        Body::Chunked(start) => dechunk(&raw[start..])?,
    };
    Ok((status, body))
}

/// As `parse_response`, keeping the answer's own buffer for the body when it is not
/// chunked: a 16 MiB answer is not held twice.
fn into_body(mut raw: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    let (status, body) = split_response(&raw)?;
    let body = match body {
        Body::Plain(range) => {
            raw.truncate(range.end);
            raw.drain(..range.start);
            raw
        }
        Body::Chunked(start) => dechunk(&raw[start..])?,
    };
    Ok((status, body))
}

/// The status and where the body is.
fn split_response(raw: &[u8]) -> Result<(u16, Body), String> {
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
    let start = head_end + 4;
    if chunked {
        return Ok((status, Body::Chunked(start)));
    }
    let end = match length {
        Some(n) if raw.len() - start < n => return Err("body shorter than content-length".into()),
        Some(n) => start + n,
        None => raw.len(),
    };
    Ok((status, Body::Plain(start..end)))
}

/// A chunked body's bytes.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
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
            return Ok(out);
        }
        if body.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

/// The elements of the JSON array `text`, each as its own text, found without building
/// a tree of the whole: 16 MiB of `[0,0,…]` would be a tree of hundreds of MiB. Only
/// the array's frame is checked here (strings and escapes, nesting, commas); each
/// element is decoded on its own, and refused past the frame limit like a WebSocket
/// message. Yields an error, then stops, where the structure breaks.
pub(crate) struct Elements<'a> {
    text: &'a str,
    pos: usize,
    done: bool,
}

impl<'a> Elements<'a> {
    pub(crate) fn new(text: &'a str) -> Elements<'a> {
        let trimmed = text.trim_start();
        let pos = text.len() - trimmed.len();
        let (pos, done) = match trimmed.as_bytes().first() {
            Some(b'[') => match trimmed[1..].trim_start().as_bytes().first() {
                // `[]`: no element; the tail is checked below.
                Some(b']') => (text.len() - trimmed[1..].trim_start().len() + 1, true),
                _ => (pos + 1, false),
            },
            _ => (usize::MAX, false),
        };
        Elements { text, pos, done }
    }

    /// Checks the whole array's structure, building nothing; the number of elements.
    pub(crate) fn count(text: &str) -> Result<usize, &'static str> {
        let mut n = 0;
        let mut it = Elements::new(text);
        for e in &mut it {
            e?;
            n += 1;
        }
        if it.pos == usize::MAX {
            return Err("not a JSON array");
        }
        if !text[it.pos..].trim().is_empty() {
            return Err("text after the array");
        }
        Ok(n)
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = Result<&'a str, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.pos == usize::MAX {
            return None;
        }
        let bytes = self.text.as_bytes();
        let start = self.pos;
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for (i, &b) in bytes.iter().enumerate().skip(start) {
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                }
                continue;
            }
            let last = match b {
                b'"' => {
                    in_string = true;
                    continue;
                }
                b'[' | b'{' => {
                    depth += 1;
                    continue;
                }
                b']' | b'}' if depth > 0 => {
                    depth -= 1;
                    continue;
                }
                b']' => true,
                b'}' => break,
                b',' if depth == 0 => false,
                _ => continue,
            };
            let element = self.text[start..i].trim();
            self.pos = i + 1;
            self.done = last;
            if element.is_empty() {
                self.done = true;
                return Some(Err("an empty element"));
            }
            return Some(Ok(element));
        }
        self.done = true;
        Some(Err("unbalanced or unterminated array"))
    }
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

    /// Acts on the frames of an answer (checked by [`checked`]), decoding one at a time:
    /// however many `resync`s it holds, one snapshot answers them; past
    /// [`MAX_CONTROLS`] the `control`s of one answer are refused at once.
    async fn absorb(&mut self, ctx: &Context, answer: Answer) {
        let mut resync = false;
        let mut controls = 0;
        let mut malformed = 0u64;
        for text in Elements::new(answer.text()).map_while(Result::ok) {
            let f = match frame::decode(text) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(e) => {
                    malformed += 1;
                    if malformed == 1 {
                        tracing::warn!(error = %e, "malformed frame in a report answer");
                    }
                    // A malformed io_open is still answered on its channel.
                    if let Some(o) = e.malformed_io_open() {
                        let close = control::deny_malformed_session(ctx, o, &e.to_string());
                        self.outbox.push(close);
                    }
                    continue;
                }
            };
            match f {
                Frame::Welcome(w) => {
                    self.welcomed = true;
                    self.heartbeat = w.heartbeat_interval();
                    self.snapshot_every = w.snapshot_interval();
                }
                Frame::Resync => resync = true,
                Frame::Control(c) if controls >= MAX_CONTROLS => {
                    tracing::warn!(id = %c.id, "too many control requests in one report answer: refused");
                    self.outbox.push(Frame::ControlResult(ControlResult {
                        id: c.id,
                        ok: false,
                        error: Some(format!(
                            "{MAX_CONTROLS} control requests at most in one answer"
                        )),
                    }));
                }
                Frame::Control(c) => {
                    controls += 1;
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
        if malformed > 1 {
            tracing::warn!(
                malformed,
                "malformed frames in one report answer (the first one logged)"
            );
        }
        if resync {
            let s = self.snapshot(ctx);
            self.outbox.push(s);
        }
    }
}

/// An answer whose text is UTF-8 and a JSON array (see [`checked`]).
struct Answer(Vec<u8>);

impl Answer {
    fn text(&self) -> &str {
        // Checked as UTF-8 when made.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The answer's body if it is a JSON array of elements, checked whole before any of its
/// frames is acted on (a broken answer is a failed post), without a tree of it.
fn checked(body: Vec<u8>) -> Result<Answer, String> {
    let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
    Elements::count(text)?;
    Ok(Answer(body))
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
                Ok((200, answer)) => match checked(answer) {
                    Ok(answer) => {
                        link.bytes_sent.fetch_add(body.len() as u64, Relaxed);
                        Ok(answer)
                    }
                    Err(e) => Err((
                        format!("answer is not a JSON array of frames: {e}"),
                        Retry::Normal,
                    )),
                },
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

    fn elements(text: &str) -> Result<Vec<&str>, &'static str> {
        Elements::count(text)?;
        Elements::new(text).collect()
    }

    #[test]
    fn the_elements_of_an_answer_are_found_without_a_tree() {
        assert_eq!(elements("[]"), Ok(vec![]));
        assert_eq!(elements(" [ ] \n"), Ok(vec![]));
        assert_eq!(elements("[1]"), Ok(vec!["1"]));
        assert_eq!(
            elements(r#" [ {"a":[1,{"b":"],}"}]} , "x\",]" ,[[]],null ] "#),
            Ok(vec![
                r#"{"a":[1,{"b":"],}"}]}"#,
                r#""x\",]""#,
                "[[]]",
                "null"
            ])
        );
        // Every element is exactly what serde_json sees as one.
        let text = r#"[{"type":"resync"},{"type":"control","id":"a,b]","target":{"k":[1,2]}}]"#;
        let values: Vec<serde_json::Value> = serde_json::from_str(text).unwrap();
        let found = elements(text).unwrap();
        assert_eq!(found.len(), values.len());
        for (f, v) in found.iter().zip(&values) {
            assert_eq!(&serde_json::from_str::<serde_json::Value>(f).unwrap(), v);
        }
        for bad in [
            "",
            "{}",
            "1",
            "[",
            "[1",
            "[1,]",
            "[,1]",
            "[1,,2]",
            "[}",
            "[{]",
            "[1]]",
            "[1] x",
            r#"["unterminated]"#,
            "[{\"a\":1}}]",
        ] {
            assert!(elements(bad).is_err(), "{bad:?} passed as an array");
        }
    }

    /// However many `resync`s one answer holds (here 10 000), one snapshot answers them;
    /// the `control`s past 8 are refused at once, each answered.
    #[tokio::test]
    async fn one_snapshot_answers_every_resync_of_an_answer() {
        let ctx = crate::connect::test_context();
        let mut r = Reporter {
            seq: 0,
            outbox: Vec::new(),
            welcomed: true,
            heartbeat: Duration::from_secs(15),
            snapshot_every: Duration::from_secs(300),
            last_snapshot: Instant::now(),
            marked: Vec::new(),
        };
        let mut text = String::from("[");
        for i in 0..10_000 {
            text.push_str(r#"{"type":"resync"},"#);
            if i % 1000 == 0 {
                // Outside any watched namespace: refused without an API call.
                text.push_str(&format!(
                    r#"{{"type":"control","id":"c{i}","action":"pause","actor":"u","target":{{"kind":"Gadget","namespace":"n","name":"a"}}}},"#
                ));
            }
        }
        text.push_str(r#"{"type":"heartbeat","sent_at":"t"}]"#);
        r.absorb(&ctx, checked(text.into_bytes()).unwrap()).await;
        let snapshots = r
            .outbox
            .iter()
            .filter(|f| matches!(f, Frame::Snapshot(_)))
            .count();
        assert_eq!(snapshots, 1);
        let results: Vec<&ControlResult> = r
            .outbox
            .iter()
            .filter_map(|f| match f {
                Frame::ControlResult(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 10);
        assert!(results.iter().all(|c| !c.ok));
        let busy = results
            .iter()
            .filter(|c| c.error.as_deref() == Some("8 control requests at most in one answer"))
            .count();
        assert_eq!(busy, 2);
    }
}
