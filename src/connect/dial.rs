//! The one dial loop: reads the token, dials over a [`Transport`] (the WebSocket, or the
//! HTTP report cycle of §8), runs a session until it ends, waits as the backoff says,
//! and dials again, until shutdown. Both transports go through the link's three
//! transitions ([`super::link`]), so their state, metrics and Events are the same.

use std::marker::PhantomData;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tracing::Instrument;

use super::backoff::{Reconnect, Retry, TOO_BIG_RETRY};
use super::link::{self, Failed};
use super::session::{self, End, PIECE};
use super::socket::DialError;
use super::{Context, Ids, hello};
use crate::config::{Config, Token};
use crate::protocol::frame::Frame;
use crate::protocol::wire;

/// A way of carrying sessions to the control plane.
pub(super) trait Transport {
    /// What a dial opens.
    type Conn;
    /// Whether the shells' bytes can go this way (`io` in `hello`).
    const SHELLS: bool;

    /// Where it dials, for the logs and the state in words.
    fn url(config: &Config) -> String;

    /// Opens a connection (the HTTP transport: posts `hello` and the first snapshot).
    async fn dial(
        &mut self,
        ctx: &Arc<Context>,
        token: &Token,
        hello: &Frame,
    ) -> Result<Self::Conn, DialError>;

    /// Runs one session on `conn` until it ends; `up` once it is up, with whether a
    /// `welcome` came.
    async fn session(
        &mut self,
        ctx: &Arc<Context>,
        conn: Self::Conn,
        hello: Frame,
        shutdown: &mut watch::Receiver<bool>,
        up: impl FnOnce(bool) + Send,
    ) -> End;
}

/// The WebSocket: `dial` opens the socket (a seam: tests hand over in-memory pipes),
/// and the session is [`session::run`].
pub(super) struct Socket<D, S> {
    dial: D,
    stream: PhantomData<fn() -> S>,
}

impl<D, S> Socket<D, S> {
    pub(super) fn new(dial: D) -> Self {
        Socket {
            dial,
            stream: PhantomData,
        }
    }
}

impl<D, Fut, S> Transport for Socket<D, S>
where
    D: FnMut(Arc<Config>, Token) -> Fut,
    Fut: Future<Output = Result<WebSocketStream<S>, DialError>>,
    S: session::Transport,
{
    type Conn = WebSocketStream<S>;
    const SHELLS: bool = true;

    fn url(config: &Config) -> String {
        config.base_url.endpoint(true, "connect")
    }

    async fn dial(
        &mut self,
        ctx: &Arc<Context>,
        token: &Token,
        _hello: &Frame,
    ) -> Result<Self::Conn, DialError> {
        (self.dial)(ctx.config.clone(), token.clone()).await
    }

    async fn session(
        &mut self,
        ctx: &Arc<Context>,
        ws: Self::Conn,
        hello: Frame,
        shutdown: &mut watch::Receiver<bool>,
        up: impl FnOnce(bool) + Send,
    ) -> End {
        session::run(ctx, ws, hello, shutdown, up).await
    }
}

/// The token as it is now: the file (re-read before every dial, so a rotated Secret
/// needs no restart) or the variable.
pub fn read_token(config: &Config) -> Result<Token, String> {
    if let Some(path) = &config.token_file {
        return match std::fs::read_to_string(path) {
            Ok(s) if !s.trim().is_empty() => Ok(Token::new(s)),
            Ok(_) => Err(format!("token file {} is empty", path.display())),
            Err(e) => Err(format!("token file {}: {e}", path.display())),
        };
    }
    config
        .token
        .clone()
        .ok_or_else(|| "no token configured".to_owned())
}

/// Completes when the token on disk differs from `last` (rotated, or created after
/// install): the kubelet refreshes a mounted Secret in place, and the new token is worth
/// a dial at once, even in the middle of a long backoff after a rejection. Never
/// completes without a token file.
async fn token_changed(config: &Config, last: Option<&Token>) {
    if config.token_file.is_none() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(TOKEN_POLL).await;
        if let Ok(now) = read_token(config)
            && Some(&now) != last
        {
            return;
        }
    }
}

/// How often a token file is looked at while waiting to dial again. Reading a small
/// file once a second costs nothing; a kubelet's Secret refresh takes far longer.
const TOKEN_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// How often, after the control plane refused a snapshot as too big, the snapshot the
/// caches would send now is measured.
const SHRINK_POLL: std::time::Duration = std::time::Duration::from_secs(60);

/// Completes once the snapshot the caches would send now is smaller than `refused`
/// bytes (at once when nothing was refused), or after [`TOO_BIG_RETRY`]. Measuring
/// writes the snapshot in pieces and counts them, never the whole text at once, and
/// yields between pieces.
async fn snapshot_shrunk(ctx: &Context, refused: usize) {
    if refused == 0 {
        return;
    }
    let give_up = tokio::time::Instant::now() + TOO_BIG_RETRY;
    loop {
        let now = tokio::time::Instant::now();
        if now >= give_up {
            tracing::info!(
                refused_bytes = refused,
                "an hour since the control plane refused the snapshot as too big: trying it again"
            );
            return;
        }
        tokio::time::sleep(SHRINK_POLL.min(give_up - now)).await;
        let mut bytes = 0;
        for (piece, _) in wire::snapshot_pieces(super::form(ctx), 0, PIECE) {
            bytes += piece.len();
            tokio::task::yield_now().await;
        }
        if bytes < refused {
            tracing::info!(
                refused_bytes = refused,
                snapshot_bytes = bytes,
                "the snapshot is smaller than the one the control plane refused: dialling again"
            );
            return;
        }
    }
}

/// Dials over `transport`, runs a session until it ends, waits as `reconnect` says (its
/// jitter drawn from `random`), and dials again, until shutdown. Needs no cluster: tests
/// run it in process on the paused clock.
pub(super) async fn run<T: Transport>(
    ctx: Arc<Context>,
    mut shutdown: watch::Receiver<bool>,
    ids: Ids,
    mut reconnect: Reconnect,
    mut transport: T,
    mut random: impl FnMut() -> u64,
) {
    let config = ctx.config.clone();
    let url = T::url(&config);
    // The token of the last dial: a different one on disk ends the wait for the next.
    let mut last_token = None;
    // Dials so far: each session's span names its connection.
    let mut dials: u64 = 0;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let retry = match read_token(&config) {
            Err(e) => {
                link::dial_failed(&ctx, Failed::Token(&e));
                Retry::Normal
            }
            Ok(token) => {
                last_token = Some(token.clone());
                dials += 1;
                let hello = hello(&ctx, &ids, T::SHELLS);
                let dialled = tokio::select! {
                    d = transport.dial(&ctx, &token, &hello) => d,
                    _ = shutdown.changed() => return,
                };
                let prefix = token.prefix();
                match dialled {
                    Err(error) => {
                        let why = Failed::Dial {
                            url: &url,
                            prefix: &prefix,
                            error: &error,
                        };
                        link::dial_failed(&ctx, why);
                        error
                            .status()
                            .map(Retry::for_upgrade_status)
                            .unwrap_or(Retry::Normal)
                    }
                    Ok(conn) => {
                        let end = transport
                            .session(&ctx, conn, hello, &mut shutdown, |welcomed| {
                                reconnect.reset();
                                link::up(&ctx, &url, &prefix, welcomed);
                            })
                            .instrument(tracing::info_span!("session", connection = dials))
                            .await;
                        match link::ended(&ctx, &end, &prefix) {
                            Some(retry) => retry,
                            None => return,
                        }
                    }
                }
            }
        };
        let delay = reconnect.delay(retry, &mut random);
        link::waiting(&ctx);
        tracing::info!(delay_ms = delay.as_millis() as u64, reason = ?retry, "reconnecting after a delay");
        tokio::select! {
            () = wait_to_redial(&ctx, retry, delay, last_token.as_ref()) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The wait before the next dial: `delay`, then, after a refused snapshot, until it has
/// shrunk ([`snapshot_shrunk`]). A new token on disk ends it early, but not after a
/// refused snapshot: a new token does not make it smaller.
async fn wait_to_redial(
    ctx: &Context,
    retry: Retry,
    delay: std::time::Duration,
    last_token: Option<&Token>,
) {
    let too_big = retry == Retry::TooBig;
    let refused = if too_big {
        ctx.link.last_snapshot_bytes()
    } else {
        0
    };
    let wait = async {
        tokio::time::sleep(delay).await;
        snapshot_shrunk(ctx, refused).await;
    };
    tokio::select! {
        () = wait => {}
        _ = token_changed(&ctx.config, last_token), if !too_big => {
            tracing::info!("the deployment token changed on disk: dialling now");
        }
    }
}

#[cfg(test)]
mod token_tests {
    use super::*;
    use std::time::Duration;

    fn config_with_file(path: &std::path::Path) -> Config {
        let path = path.display().to_string();
        Config::parse(|k| (k == "AUTONOMIC_AUTH_TOKEN_FILE").then(|| path.clone())).expect("config")
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_token_on_disk_ends_the_wait_within_a_poll() {
        let dir =
            std::env::temp_dir().join(format!("autonomic-token-{}", crate::process::boot_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "tok_old_0123456789\n").unwrap();
        let config = config_with_file(&file);
        let old = read_token(&config).unwrap();

        // The same token: the wait goes on (a long backoff is not cut short).
        let same =
            tokio::time::timeout(Duration::from_secs(30), token_changed(&config, Some(&old)));
        assert!(same.await.is_err());

        // Rotated on disk: noticed at the next poll, at most TOKEN_POLL later.
        std::fs::write(&file, "tok_new_9876543210\n").unwrap();
        let start = tokio::time::Instant::now();
        token_changed(&config, Some(&old)).await;
        assert!(start.elapsed() <= TOKEN_POLL, "{:?}", start.elapsed());

        // No token yet (a Secret created after install): its arrival ends the wait.
        std::fs::remove_file(&file).unwrap();
        let waiting = tokio::spawn({
            let config = config.clone();
            async move { token_changed(&config, None).await }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!waiting.is_finished());
        std::fs::write(&file, "tok_first_0000000000").unwrap();
        tokio::time::timeout(TOKEN_POLL * 2, waiting)
            .await
            .expect("the new token ends the wait")
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_token_file_nothing_ends_the_wait() {
        let config =
            Config::parse(|k| (k == "AUTONOMIC_AUTH_TOKEN").then(|| "tok_x".into())).unwrap();
        let wait = tokio::time::timeout(Duration::from_secs(3600), token_changed(&config, None));
        assert!(wait.await.is_err());
    }
}

/// The dial loop in process, on the paused clock: each dial is handed to the test, which
/// refuses it or accepts it with an in-memory pipe whose far end it plays.
#[cfg(test)]
mod dial_tests {
    use super::*;
    use crate::connect::link::{DialFailure, Disconnect};
    use crate::connect::{events, frame, progress, test_context_with};
    use futures::{SinkExt, StreamExt};
    use std::time::Duration;
    use tokio::io::DuplexStream;
    use tokio::sync::{mpsc, oneshot};
    use tokio::time::Instant;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

    type Pipe = WebSocketStream<DuplexStream>;
    type Ours = WebSocketStream<progress::Progress<DuplexStream>>;

    /// One dial of the loop: when it began, and where the test's answer goes.
    struct Dial {
        at: Instant,
        answer: oneshot::Sender<Result<Ours, DialError>>,
    }

    impl Dial {
        fn fail(self, error: DialError) {
            let _ = self.answer.send(Err(error));
        }

        fn refuse(self) {
            self.fail(DialError::Connect {
                target: "cp.example.com:443".into(),
                reason: "connection refused".into(),
            });
        }

        /// Connects the loop to a pipe and gives the control plane's end.
        async fn accept(self) -> Pipe {
            let (ours, theirs) = tokio::io::duplex(1 << 20);
            let ours = progress::Progress::new(ours);
            let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
            let cp = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
            let _ = self.answer.send(Ok(ws));
            cp
        }
    }

    /// The loop with a token, a 7 s eviction delay, the default schedules, and jitter
    /// always at its ceiling, so every wait is exact.
    fn start() -> (
        mpsc::UnboundedReceiver<Dial>,
        watch::Sender<bool>,
        Arc<Context>,
        tokio::task::JoinHandle<()>,
    ) {
        let config = Config::parse(|k| match k {
            "AUTONOMIC_AUTH_TOKEN" => Some("tok_test_0123456789".into()),
            "AUTONOMIC_EVICTION_DELAY_S" => Some("7".into()),
            _ => None,
        })
        .expect("config");
        let ctx = test_context_with(config);
        let c = &ctx.config;
        let reconnect = Reconnect::new(c.backoff_initial, c.backoff_max, c.eviction_delay);
        let ids = Ids {
            boot_id: "boot".into(),
            cluster_id: "cluster".into(),
            kubernetes_version: "v1.31.0".into(),
        };
        let (dialled, dials) = mpsc::unbounded_channel();
        let dial = move |_: Arc<Config>, _: Token| {
            let (answer, answered) = oneshot::channel();
            let _ = dialled.send(Dial {
                at: Instant::now(),
                answer,
            });
            async move {
                match answered.await {
                    Ok(result) => result,
                    Err(_) => std::future::pending().await,
                }
            }
        };
        let (stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(run(
            ctx.clone(),
            shutdown,
            ids,
            reconnect.expect("the default schedules"),
            Socket::new(dial),
            || u64::MAX,
        ));
        (dials, stop, ctx, task)
    }

    /// The next text frame from the manager (pings and pongs skipped), decoded.
    async fn next_frame(cp: &mut Pipe) -> Frame {
        loop {
            match cp.next().await {
                Some(Ok(Message::Text(t))) => return frame::decode(&t).unwrap().unwrap(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("expected a frame, got {other:?}"),
            }
        }
    }

    /// Plays the control plane up to the first snapshot: hello → welcome → snapshot.
    async fn welcome(cp: &mut Pipe) {
        assert!(matches!(next_frame(cp).await, Frame::Hello(_)));
        let welcome = r#"{"type":"welcome","deployment_id":"d","heartbeat_interval_s":15}"#;
        cp.send(Message::text(welcome)).await.unwrap();
        assert!(matches!(next_frame(cp).await, Frame::Snapshot(_)));
    }

    async fn close(cp: &mut Pipe, code: u16, reason: &str) {
        let frame = CloseFrame {
            code: code.into(),
            reason: reason.to_owned().into(),
        };
        cp.close(Some(frame)).await.unwrap();
    }

    async fn next_dial(dials: &mut mpsc::UnboundedReceiver<Dial>) -> Dial {
        dials.recv().await.expect("the loop dials again")
    }

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn failed_dials_back_off_from_1s_doubling_to_60s_and_a_welcome_starts_over() {
        let (mut dials, _stop, ctx, _task) = start();
        let mut dial = next_dial(&mut dials).await;
        let mut gaps = Vec::new();
        for _ in 0..8 {
            let at = dial.at;
            dial.refuse();
            dial = next_dial(&mut dials).await;
            gaps.push(dial.at - at);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 60, 60].map(secs));
        assert_eq!(ctx.link.dial_failures(DialFailure::Connect), 8);

        // Connected and welcomed, then closed with 4002: the normal schedule, from 1 s.
        let mut cp = dial.accept().await;
        welcome(&mut cp).await;
        close(&mut cp, 4002, "protocol error").await;
        let closed_at = Instant::now();
        let dial = next_dial(&mut dials).await;
        assert_eq!(dial.at - closed_at, secs(1));
        assert_eq!(ctx.link.disconnects(Disconnect::Closed), 1);
        assert!(
            ctx.link
                .events
                .last(events::Change::ConnectionLost)
                .is_some()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_eviction_waits_exactly_the_eviction_delay() {
        let (mut dials, _stop, ctx, _task) = start();
        let mut cp = next_dial(&mut dials).await.accept().await;
        welcome(&mut cp).await;
        close(&mut cp, 4000, "evicted by newer connection").await;
        let closed_at = Instant::now();
        let dial = next_dial(&mut dials).await;
        assert_eq!(dial.at - closed_at, secs(7));
        assert!(
            ctx.link.state().starts_with("evicted"),
            "{}",
            ctx.link.state()
        );
        // Counted, and told on the pod: the Event was admitted (it is sent only where
        // the pod is known, POD_UID; this test has no pod).
        assert_eq!(ctx.link.disconnects(Disconnect::Evicted), 1);
        let evicted_at = ctx.link.events.last(events::Change::Evicted);
        assert_eq!(evicted_at, Some(closed_at));
        assert!(ctx.link.events.last(events::Change::Connected).is_some());

        // The documented reason alone is an eviction too, before any welcome as well.
        let mut cp = dial.accept().await;
        assert!(matches!(next_frame(&mut cp).await, Frame::Hello(_)));
        close(&mut cp, 1008, "Evicted by newer connection").await;
        let closed_at = Instant::now();
        assert_eq!(next_dial(&mut dials).await.at - closed_at, secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_token_backs_off_up_to_5_minutes() {
        let (mut dials, _stop, ctx, _task) = start();
        let mut dial = next_dial(&mut dials).await;
        let mut gaps = Vec::new();
        // Closes 4001 (revoked) before any welcome and upgrades refused with 401, in
        // turn: one schedule, capped at 5 × the normal cap.
        for n in 0..11 {
            let ended_at = if n % 2 == 0 {
                let mut cp = dial.accept().await;
                assert!(matches!(next_frame(&mut cp).await, Frame::Hello(_)));
                close(&mut cp, 4001, "token revoked").await;
                let closed_at = Instant::now();
                dial = next_dial(&mut dials).await;
                assert!(ctx.link.state().starts_with("token rejected"));
                closed_at
            } else {
                let at = dial.at;
                dial.fail(DialError::Rejected {
                    status: 401,
                    prefix: "tok_test".into(),
                });
                dial = next_dial(&mut dials).await;
                at
            };
            gaps.push(dial.at - ended_at);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300].map(secs));
        // Six closes with 4001 and five 401s, counted apart.
        assert_eq!(ctx.link.disconnects(Disconnect::Rejected), 6);
        assert_eq!(ctx.link.dial_failures(DialFailure::Token), 5);
        // No session came up: never a Connected Event, and TokenRejected admitted.
        assert_eq!(ctx.link.events.last(events::Change::Connected), None);
        assert!(
            ctx.link
                .events
                .last(events::Change::TokenRejected)
                .is_some()
        );
    }

    /// Keeps Agents `big-0`… in the caches, `count` of them, each with `args` of `n`
    /// strings of 200 bytes (a spec stays under the cache's 256 KiB bound up to about a
    /// thousand): the snapshot's size follows `count × n`.
    fn agents_of_size(ctx: &Context, count: usize, n: usize) {
        for i in 0..count {
            let agent: crate::crd::Agent = serde_json::from_value(serde_json::json!({
                "apiVersion": "autonomic.sh/v1alpha1", "kind": "Agent",
                "metadata": {"name": format!("big-{i}"), "namespace": "team", "uid": format!("u-{i}")},
                "spec": {"runtime": {"image": "img:1", "args": vec!["x".repeat(200); n]}},
            }))
            .unwrap();
            ctx.store.agents.insert(agent);
        }
    }

    /// A snapshot the control plane refuses as too big (close 1009) is not sent again
    /// as it was: counted and told, no dial while the caches' snapshot is as large, the
    /// next dial once it is smaller; unshrunk, one try an hour (the platform may have
    /// raised its limit).
    #[tokio::test(start_paused = true)]
    async fn a_snapshot_refused_as_too_big_is_sent_again_only_smaller_or_an_hour_later() {
        let (mut dials, _stop, ctx, _task) = start();
        agents_of_size(&ctx, 1, 200);
        let mut cp = next_dial(&mut dials).await.accept().await;
        welcome(&mut cp).await;
        let refused = ctx.link.last_snapshot_bytes();
        assert!(refused > 40_000, "{refused} bytes");
        close(&mut cp, 1009, "message too big").await;
        let closed_at = Instant::now();
        tokio::time::sleep(secs(1)).await;
        assert_eq!(ctx.link.disconnects(Disconnect::TooBig), 1);
        assert!(ctx.link.state().contains("too big"), "{}", ctx.link.state());

        // As large for 30 minutes (a change that does not shrink it included): no dial.
        agents_of_size(&ctx, 1, 201);
        let none = tokio::time::timeout(secs(1800), dials.recv()).await;
        assert!(none.is_err(), "dialled again with a snapshot as large");
        // Smaller: dialled at the next measure, within SHRINK_POLL.
        agents_of_size(&ctx, 1, 100);
        let shrunk_at = Instant::now();
        let dial = next_dial(&mut dials).await;
        assert!(
            dial.at - shrunk_at <= SHRINK_POLL,
            "{:?}",
            dial.at - shrunk_at
        );
        assert!(dial.at - closed_at > secs(1800));

        // Refused again and never smaller: the next try is an hour (and the normal
        // schedule's first second) after the refusal, not before.
        let mut cp = dial.accept().await;
        welcome(&mut cp).await;
        close(&mut cp, 1009, "").await;
        let closed_at = Instant::now();
        let dial = next_dial(&mut dials).await;
        assert_eq!(dial.at - closed_at, secs(1) + TOO_BIG_RETRY);
        assert_eq!(ctx.link.disconnects(Disconnect::TooBig), 2);
    }

    /// A platform that refuses a message past its limit: reads `limit` bytes, sends a
    /// close 1009, then either reads and drops the rest as RFC 6455 §5.5.1 says or hangs
    /// up. Raw bytes, as a server that stopped parsing would.
    async fn refusing_peer(mut theirs: DuplexStream, limit: usize, hang_up: bool) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 8192];
        let mut read = 0;
        while read < limit {
            match theirs.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
        let reason = b"message too big";
        let mut close = vec![0x88, 2 + reason.len() as u8];
        close.extend_from_slice(&1009u16.to_be_bytes());
        close.extend_from_slice(reason);
        theirs.write_all(&close).await.unwrap();
        if !hang_up {
            while let Ok(n) = theirs.read(&mut buf).await
                && n > 0
            {}
        }
    }

    /// A platform refusing a message says so (1009) once it has read its limit, while
    /// the manager is still writing the snapshot: the manager stops at the next piece
    /// (or, if the platform hung up, finds the close behind the failed write), counts it
    /// as too big, and takes what it wrote as the size the next snapshot must be under.
    #[tokio::test(start_paused = true)]
    async fn a_close_mid_snapshot_ends_its_writing_and_counts_as_too_big() {
        let (mut dials, _stop, ctx, _task) = start();
        agents_of_size(&ctx, 10, 400);
        let whole = wire::snapshot_text(super::super::form(&ctx), 1).len();
        for (round, hang_up) in [false, true].into_iter().enumerate() {
            let dial = next_dial(&mut dials).await;
            // A pipe far smaller than the snapshot: the writing waits on the reading.
            let (ours, theirs) = tokio::io::duplex(16 * 1024);
            let ours = progress::Progress::new(ours);
            let ws = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
            let _ = dial.answer.send(Ok(ws));
            tokio::spawn(refusing_peer(theirs, 128 * 1024, hang_up));
            tokio::time::sleep(secs(30)).await;
            assert_eq!(
                ctx.link.disconnects(Disconnect::TooBig),
                round as u64 + 1,
                "hang up {hang_up}: {}",
                ctx.link.state()
            );
            let cut = ctx.link.last_snapshot_bytes();
            assert!(
                (128 * 1024..whole).contains(&cut),
                "cut after {cut} bytes of {whole}"
            );
            // Not dialled again while the snapshot is as large: only an hour later.
            let none = tokio::time::timeout(secs(1800), dials.recv()).await;
            assert!(none.is_err(), "dialled again with a snapshot as large");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_during_the_wait_ends_the_loop_at_once() {
        let (mut dials, stop, _ctx, task) = start();
        next_dial(&mut dials).await.refuse();
        // Half-way through the 1 s wait.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stopped_at = Instant::now();
        stop.send(true).unwrap();
        tokio::time::timeout(secs(3600), task)
            .await
            .expect("the loop ends")
            .unwrap();
        assert_eq!(Instant::now() - stopped_at, Duration::ZERO);
        assert!(dials.recv().await.is_none(), "no dial after shutdown");
    }
}
