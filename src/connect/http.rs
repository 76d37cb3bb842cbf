//! The legacy HTTP transport (PROTOCOL.md §8): no socket; frames are `POST`ed as a JSON
//! array to `<base>/api/autonomic/report` and the answer carries the control plane's
//! frames. Shares the dial loop (and so the link's state, metrics and Events), the
//! codec, the wire form, control handling and the audit queue.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Request, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Context;
use super::control;
use super::dial::Transport;
use super::session::End;
use super::socket::{DialError, tcp, tls, tls_config};
use crate::audit::now_rfc3339;
use crate::config::{Config, Token};
use crate::protocol::elements::Elements;
use crate::protocol::frame::{self, Audit, ControlResult, Delta, Frame, Heartbeat, Snapshot};
use crate::protocol::wire;

/// A control plane that accepts and never answers must not stall reporting.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read; anything bigger is a misbehaving peer.
const MAX_ANSWER: usize = 16 << 20;

/// `control` requests of one answer carried out; the rest are answered `ok: false` at
/// once (each may take 10 s of API server time, and they run one after the other).
const MAX_CONTROLS: usize = 8;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One `POST` on a connection of its own (hyper's HTTP/1 client over the stream dialled
/// as the WebSocket's is: proxy, TLS and trust store alike); the status and the body,
/// read up to [`MAX_ANSWER`].
async fn post(ctx: &Context, token: &Token, body: String) -> Result<(u16, Bytes), DialError> {
    let config = &ctx.config;
    let url = &config.base_url;
    let tcp = tcp(config).await?;
    let stream: Box<dyn Stream> = if url.tls {
        Box::new(tls(config, tls_config(config)?, tcp).await?)
    } else {
        Box::new(tcp)
    };
    let lost = |e: hyper::Error| DialError::Connect {
        target: url.authority(),
        reason: e.to_string(),
    };
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.map_err(lost)?;
    let request = Request::post(format!("{}/api/autonomic/report", url.path))
        .header(header::HOST, url.authority())
        .header(header::AUTHORIZATION, format!("Bearer {}", token.expose()))
        .header(
            header::USER_AGENT,
            format!("autonomic-manager/{}", crate::process::VERSION),
        )
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONNECTION, "close")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| DialError::Report(format!("cannot build the request: {e}")))?;
    let exchange = async {
        let response = sender.send_request(request).await.map_err(lost)?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| match e.downcast::<LengthLimitError>() {
                Ok(_) => DialError::Report("answer larger than 16 MiB".into()),
                Err(e) => DialError::Connect {
                    target: url.authority(),
                    reason: e.to_string(),
                },
            })?;
        Ok((status, body.to_bytes()))
    };
    // The connection is driven here, not spawned: when the post's time is up, dropping
    // this future closes the socket.
    tokio::pin!(exchange, conn);
    let mut driving = true;
    loop {
        tokio::select! {
            done = &mut exchange => return done,
            ended = &mut conn, if driving => {
                driving = false;
                ended.map_err(lost)?;
            }
        }
    }
}

/// What the report cycle keeps between posts, and across sessions: answers to the
/// control plane not delivered yet go with the next good post.
pub struct Http {
    seq: u64,
    /// Frames waiting for the next post (control results, answers to the cp).
    outbox: Vec<Frame>,
    welcomed: bool,
    heartbeat: Duration,
    snapshot_every: Duration,
    last_snapshot: Instant,
    last_post: Instant,
}

impl Default for Http {
    fn default() -> Self {
        let defaults = frame::Welcome::defaults();
        Http {
            seq: 0,
            outbox: Vec::new(),
            welcomed: false,
            heartbeat: defaults.heartbeat_interval(),
            snapshot_every: defaults.snapshot_interval(),
            last_snapshot: Instant::now(),
            last_post: Instant::now(),
        }
    }
}

/// What one post carried that is counted once it is delivered.
#[derive(Default)]
struct Carried {
    /// The snapshot's size and the time it took to build.
    snapshot: Option<(usize, Duration)>,
    /// When the delta's changes were first marked.
    delta: Option<Vec<Instant>>,
}

impl Http {
    fn snapshot(&mut self, ctx: &Context) -> Frame {
        ctx.link.take_dirty();
        self.seq += 1;
        self.last_snapshot = Instant::now();
        Frame::Snapshot(Snapshot {
            seq: self.seq,
            resources: wire::all(super::form(ctx)),
        })
    }

    /// The frames of the next post, written: `hello` and a snapshot when `hello` is
    /// given, else a snapshot when due or the pending delta; then the answers waiting and
    /// the audit queue; a heartbeat when nothing else goes or one is due.
    fn frames(
        &mut self,
        ctx: &Context,
        hello: Option<&Frame>,
        carried: &mut Carried,
    ) -> (Vec<String>, Vec<Frame>, Vec<crate::audit::AuditEvent>) {
        let mut texts = Vec::new();
        let started = Instant::now();
        let snapshot = if let Some(hello) = hello {
            self.seq = 0;
            texts.push(frame::encode(hello));
            Some(self.snapshot(ctx))
        } else if self.last_snapshot.elapsed() >= self.snapshot_every {
            Some(self.snapshot(ctx))
        } else {
            None
        };
        if let Some(s) = snapshot {
            let text = frame::encode(&s);
            carried.snapshot = Some((text.len(), started.elapsed()));
            texts.push(text);
        } else {
            let (changes, marked) = wire::changes(super::form(ctx), ctx.link.take_pending());
            if !changes.is_empty() {
                self.seq += 1;
                let delta = Frame::Delta(Delta {
                    seq: self.seq,
                    changes,
                });
                texts.push(frame::encode(&delta));
                carried.delta = Some(marked);
            }
        }
        let answers = std::mem::take(&mut self.outbox);
        texts.extend(answers.iter().map(frame::encode));
        let audits = ctx.link.audit.drain();
        for event in &audits {
            texts.push(frame::encode(&Frame::Audit(Audit {
                event: event.clone(),
            })));
        }
        if texts.is_empty() || self.last_post.elapsed() >= self.heartbeat {
            texts.push(frame::encode(&Frame::Heartbeat(Heartbeat {
                sent_at: now_rfc3339(),
            })));
        }
        (texts, answers, audits)
    }

    /// One report: posts the next frames and checks the answer. Not delivered, the
    /// answers and audits go back, and the next post starts over with `hello`.
    async fn report(
        &mut self,
        ctx: &Context,
        token: &Token,
        hello: Option<&Frame>,
    ) -> Result<Answer, DialError> {
        let mut carried = Carried::default();
        let (texts, answers, audits) = self.frames(ctx, hello, &mut carried);
        let body = format!("[{}]", texts.join(","));
        drop(texts);
        let sent = body.len();
        let posted = tokio::time::timeout(POST_TIMEOUT, post(ctx, token, body))
            .await
            .unwrap_or_else(|_| {
                Err(DialError::Timeout(
                    "no answer to a report within 30 s".into(),
                ))
            });
        let answer = posted.and_then(|(status, answer)| match status {
            200 => checked(answer)
                .map_err(|e| DialError::Report(format!("not a JSON array of frames: {e}"))),
            401 | 403 => Err(DialError::Rejected {
                status,
                prefix: token.prefix(),
            }),
            404 => Err(DialError::NotFound {
                url: ctx.config.base_url.endpoint(false, "report"),
            }),
            status => Err(DialError::Http(status)),
        });
        match &answer {
            Ok(_) => {
                self.last_post = Instant::now();
                let link = &ctx.link;
                link.sent(sent);
                if let Some((bytes, took)) = carried.snapshot {
                    link.snapshot_sent(bytes, took);
                }
                if let Some(marked) = carried.delta {
                    link.delta_sent(&marked);
                }
            }
            Err(_) => {
                self.outbox.splice(0..0, answers);
                ctx.link.audit.requeue(audits);
                self.welcomed = false;
            }
        }
        answer
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
pub struct Answer(Bytes);

impl Answer {
    fn text(&self) -> &str {
        // Checked as UTF-8 when made.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// The answer's body if it is a JSON array of elements, checked whole before any of its
/// frames is acted on (a broken answer is a failed post), without a tree of it.
fn checked(body: Bytes) -> Result<Answer, String> {
    let text = std::str::from_utf8(&body).map_err(|e| e.to_string())?;
    Elements::count(text)?;
    Ok(Answer(body))
}

impl Transport for Http {
    type Conn = (Token, Answer);
    const SHELLS: bool = false;

    fn url(config: &Config) -> String {
        config.base_url.endpoint(false, "report")
    }

    /// The first report: `hello` and a snapshot.
    async fn dial(
        &mut self,
        ctx: &Arc<Context>,
        token: &Token,
        hello: &Frame,
    ) -> Result<Self::Conn, DialError> {
        self.welcomed = false;
        let answer = self.report(ctx, token, Some(hello)).await?;
        Ok((token.clone(), answer))
    }

    /// Posts at most 1 s after a change (100 ms, as deltas coalesce) and at least every
    /// heartbeat interval, until a post fails. Until a `welcome` comes, each post starts
    /// over with `hello` and a snapshot.
    async fn session(
        &mut self,
        ctx: &Arc<Context>,
        (token, first): Self::Conn,
        hello: Frame,
        shutdown: &mut watch::Receiver<bool>,
        up: impl FnOnce(bool) + Send,
    ) -> End {
        self.absorb(ctx, first).await;
        up(self.welcomed);
        let link = &ctx.link;
        loop {
            if self.outbox.is_empty() {
                let until_heartbeat = self.heartbeat.saturating_sub(self.last_post.elapsed());
                tokio::select! {
                    _ = link.dirty_notify.notified() => {
                        tokio::time::sleep(COALESCE.min(until_heartbeat)).await;
                    }
                    _ = link.audit.notify.notified() => {}
                    _ = tokio::time::sleep(until_heartbeat) => {}
                    _ = shutdown.changed() => return End::Shutdown,
                }
            }
            if *shutdown.borrow() {
                return End::Shutdown;
            }
            let hello = (!self.welcomed).then_some(&hello);
            match self.report(ctx, &token, hello).await {
                Ok(answer) => self.absorb(ctx, answer).await,
                Err(e @ DialError::Rejected { .. }) => return End::Rejected(e.to_string()),
                Err(DialError::Timeout(e)) => {
                    tracing::warn!(error = %e, "the control plane did not answer a report: reconnecting");
                    return End::Dead;
                }
                Err(e) => return End::Dropped(e.to_string()),
            }
        }
    }
}

/// Changes after a quiet spell wait this long for the ones that follow them.
const COALESCE: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves each of `answers` (raw HTTP/1.1 bytes) to one connection on loopback, and
    /// gives a context whose control plane is there.
    async fn serving(answers: Vec<Vec<u8>>) -> Arc<Context> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            for answer in answers {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 1 << 16];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            }
        });
        let config = Config::parse(|k| match k {
            "AUTONOMIC_BASE_URL" => Some(url.clone()),
            _ => None,
        })
        .expect("config");
        crate::connect::test_context_with(config)
    }

    /// hyper reads what the old hand-written parser did (a length, chunks, or the body to
    /// the close), and the 16 MiB bound holds for every form.
    #[tokio::test]
    async fn answers_with_length_chunked_or_neither_and_the_bound() {
        let big = vec![b'0'; MAX_ANSWER + 1];
        let mut oversized =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.len()).into_bytes();
        oversized.extend_from_slice(&big);
        let mut oversized_chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for piece in big.chunks(1 << 20) {
            oversized_chunked.extend(format!("{:x}\r\n", piece.len()).into_bytes());
            oversized_chunked.extend_from_slice(piece);
            oversized_chunked.extend_from_slice(b"\r\n");
        }
        oversized_chunked.extend_from_slice(b"0\r\n\r\n");
        let answers: Vec<Vec<u8>> = vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[{}\r\n1\r\n]\r\n0\r\n\r\n"
                .to_vec(),
            b"HTTP/1.1 401 Unauthorized\r\nConnection: close\r\n\r\nno".to_vec(),
            b"garbage\r\n\r\n".to_vec(),
            oversized,
            oversized_chunked,
        ];
        let ctx = serving(answers).await;
        let token = Token::new("tok_test_0123456789");
        let post = || post(&ctx, &token, "[]".into());
        assert_eq!(post().await.unwrap(), (200, Bytes::from_static(b"[]")));
        assert_eq!(post().await.unwrap(), (200, Bytes::from_static(b"[{}]")));
        assert_eq!(post().await.unwrap(), (401, Bytes::from_static(b"no")));
        assert!(matches!(post().await, Err(DialError::Connect { .. })));
        for _ in 0..2 {
            match post().await {
                Err(DialError::Report(why)) => assert_eq!(why, "answer larger than 16 MiB"),
                other => panic!("{other:?}"),
            }
        }
    }

    /// However many `resync`s one answer holds (here 10 000), one snapshot answers them;
    /// the `control`s past 8 are refused at once, each answered.
    #[tokio::test]
    async fn one_snapshot_answers_every_resync_of_an_answer() {
        let ctx = crate::connect::test_context();
        let mut r = Http {
            welcomed: true,
            ..Http::default()
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
        r.absorb(&ctx, checked(Bytes::from(text)).unwrap()).await;
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
