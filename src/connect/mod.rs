//! Managed mode: the one outbound connection to the control plane (PROTOCOL.md).
//!
//! `run` dials, runs a session until it ends, waits as the backoff says, and dials again,
//! until shutdown. The reconcile loop never waits on any of this.

pub mod backoff;
pub mod control;
pub mod events;
pub mod frame;
pub mod http;
pub mod outbox;
pub mod progress;
pub mod session;
pub mod shell;
pub mod socket;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tracing::Instrument;

use crate::audit::AuditLog;
use crate::cluster::Kube;
use crate::config::{Config, Token};
use crate::crd::Key;
use crate::metrics::{DialFailure, Disconnect, LinkMetrics};
use crate::store::Store;
use crate::store::watch::Changed;
use backoff::{Reconnect, Retry};
use frame::{Frame, Hello, Host};
use session::End;

/// What the connector reads and acts through, handed over by the application.
pub struct Context {
    pub store: Arc<Store>,
    /// Control requests' writes; its client runs the shells' execs.
    pub kube: Kube,
    pub config: Arc<Config>,
    pub link: Arc<Link>,
}

/// What the connector shares with the rest of the manager: pending changes, the audit
/// queue, and the connection's state for probes and metrics.
#[derive(Default)]
pub struct Link {
    /// Each pending change with when it was first marked (for the delta latency).
    dirty: Mutex<HashMap<Key, (Changed, Instant)>>,
    pub dirty_notify: Notify,
    pub audit: AuditLog,
    /// The audit outbox in the manager's namespace (WebSocket transport, once the
    /// connector runs).
    pub outbox: std::sync::OnceLock<Arc<outbox::Outbox>>,
    pub connected: AtomicBool,
    pub reconnects: AtomicU64,
    pub snapshots_sent: AtomicU64,
    pub deltas_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_rejected: AtomicU64,
    /// Unix seconds of the last `welcome`, 0 before the first.
    pub last_welcome: AtomicU64,
    /// Shell sessions running now.
    pub sessions_open: AtomicU64,
    /// What the shells' input waiting for their processes holds in memory, all sessions
    /// together (bounded at 16 MiB, `shell::input`).
    pub shell_input: shell::input::Held,
    /// The last WebSocket ping's round trip in microseconds; 0 before the first.
    pub heartbeat_rtt_us: AtomicU64,
    /// Disconnects and dial failures by reason, delta latency, snapshot size and time.
    pub metrics: LinkMetrics,
    /// The Events recorded on the manager's pod, for their rate limit.
    pub events: events::Limit,
    /// The connection's state in words ("connected to …", "token rejected …",
    /// "connection refused …"): the leader publishes it on the Lease so that a standby's
    /// log shows it too (`kubectl logs deploy/…` may pick either pod).
    state: Mutex<String>,
}

impl Link {
    /// Notes a change for the next delta. Bounded by the number of watched objects: the
    /// newest state of an object wins, whatever the number of events.
    pub fn mark(&self, change: Changed) {
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        // The latency runs from the first mark: later ones join the same delta.
        let (old, since) = match dirty.remove(&change.key) {
            Some((old, since)) => (Some(old), since),
            None => (None, Instant::now()),
        };
        let merged = match old {
            // A pod event after its owner's removal must not hide the removal.
            Some(old) if old.removed && change.uid.is_empty() => old,
            Some(old) if change.uid.is_empty() => Changed {
                uid: old.uid,
                ..change
            },
            _ => change,
        };
        dirty.insert(merged.key.clone(), (merged, since));
        drop(dirty);
        self.dirty_notify.notify_one();
    }

    /// Records the connection's state in words; `true` when it changed.
    pub fn set_state(&self, state: impl Into<String>) -> bool {
        let state = state.into();
        let mut cur = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *cur != state;
        *cur = state;
        changed
    }

    /// The connection's state in words; empty before the first dial.
    pub fn state(&self) -> String {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Takes the pending changes.
    pub fn take_dirty(&self) -> Vec<Changed> {
        self.take_pending().into_iter().map(|(c, _)| c).collect()
    }

    /// Takes the pending changes, each with when it was first marked.
    pub fn take_pending(&self) -> Vec<(Changed, Instant)> {
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        // Taken, not drained: a start marks every object, and a drained map would keep
        // room for all of them.
        std::mem::take(&mut *dirty).into_values().collect()
    }

    /// The changes first marked at `marked` were written just now, in a delta.
    pub fn deltas_written(&self, marked: &[Instant]) {
        let now = Instant::now();
        for at in marked {
            self.metrics
                .delta_latency
                .observe_duration(now.saturating_duration_since(*at));
        }
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

/// `io` only over the WebSocket: the HTTP transport cannot carry a shell's bytes.
fn hello(ctx: &Context, ids: &Ids, io: bool) -> Frame {
    let c = &ctx.config;
    Frame::Hello(Hello {
        protocol: frame::PROTOCOL_VERSION,
        version: crate::VERSION.to_owned(),
        boot_id: ids.boot_id.clone(),
        cluster_id: ids.cluster_id.clone(),
        host: Host {
            hostname: std::env::var("HOSTNAME").unwrap_or_else(|_| c.pod_name.clone()),
            namespace: c.pod_namespace.clone(),
            pod: c.pod_name.clone(),
            node: c.node_name.clone(),
            kubernetes_version: ids.kubernetes_version.clone(),
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
        },
        capabilities: ["snapshot", "delta", "io", "control", "audit"]
            .into_iter()
            .filter(|c| io || *c != "io")
            .map(String::from)
            .collect(),
    })
}

/// What `hello` says about this process and its cluster, read once per process.
struct Ids {
    boot_id: String,
    cluster_id: String,
    kubernetes_version: String,
}

/// `AUTONOMIC_CLUSTER_ID`, else the uid of the `kube-system` namespace: it lives as long
/// as the cluster, so the id survives restarts, rollouts, failovers and reinstalls (the
/// usual choice of cluster agents). Only when it cannot be read (RBAC, a cluster without
/// `kube-system`) does the id fall back to the manager's namespace and pod, said loudly.
async fn cluster_id(ctx: &Context) -> String {
    if let Some(id) = &ctx.config.cluster_id {
        return id.clone();
    }
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(ctx.kube.client().clone());
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), api.get("kube-system"));
    match read.await {
        Ok(Ok(ns)) if ns.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()) => {
            ns.metadata.uid.unwrap_or_default()
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the API server did not answer in 10 s".into(),
                Ok(Ok(_)) => "it has no uid".into(),
            };
            let id = format!("{}/{}", ctx.config.pod_namespace, ctx.config.pod_name);
            tracing::warn!(error = %why, cluster_id = %id, "cannot read namespace kube-system for a stable cluster id; this id changes with every restart: set AUTONOMIC_CLUSTER_ID");
            id
        }
    }
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

/// Holds the connection until `shutdown` turns true.
pub async fn run(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let config = ctx.config.clone();
    // Validated by the configuration parser (0 < initial <= max).
    let Ok(reconnect) = Reconnect::new(
        config.backoff_initial,
        config.backoff_max,
        config.eviction_delay,
    ) else {
        tracing::error!("invalid backoff configuration: managed mode disabled");
        return;
    };
    // The first snapshot must hold everything: wait for the initial lists of what the
    // wire form reads, asking the cluster's identity for `hello` meanwhile.
    let ids = async {
        Ids {
            boot_id: crate::boot_id().to_owned(),
            cluster_id: cluster_id(&ctx).await,
            kubernetes_version: match ctx.kube.client().apiserver_version().await {
                Ok(v) => v.git_version,
                Err(_) => String::new(),
            },
        }
    };
    let ids = tokio::select! {
        (ids, ()) = async { tokio::join!(ids, ctx.store.wire_synced.wait()) } => ids,
        _ = shutdown.changed() => return,
    };
    if config.transport == crate::config::Transport::Http {
        let hello = hello(&ctx, &ids, false);
        return http::run(ctx, hello, shutdown, reconnect).await;
    }
    let dial =
        |config: Arc<Config>, token: Token| async move { socket::dial(&config, &token).await };
    // The audit outbox (issue 27): written while events cannot be sent, drained by the
    // next session after its snapshot.
    let backend = outbox::ConfigMapBackend::new(ctx.kube.client().clone(), &config.pod_namespace);
    let outbox = ctx
        .link
        .outbox
        .get_or_init(|| Arc::new(outbox::Outbox::new(Arc::new(backend))))
        .clone();
    let (stop_writer, writer_stop) = watch::channel(false);
    let writer = tokio::spawn({
        let link = ctx.link.clone();
        async move { outbox.run(&link.audit, writer_stop).await }
            .instrument(tracing::info_span!("outbox"))
    });
    run_with(ctx, shutdown, ids, reconnect, dial, backoff::system_random).await;
    // The sessions' last events (their closes) are recorded by now: one last write.
    let _ = stop_writer.send(true);
    let _ = writer.await;
}

/// The WebSocket dial loop of [`run`]: dials with `dial`, runs a session until it ends,
/// waits as `reconnect` says (its jitter drawn from `random`), and dials again, until
/// shutdown. Needs no cluster: tests run it in process on the paused clock.
async fn run_with<D, Fut, S>(
    ctx: Arc<Context>,
    mut shutdown: watch::Receiver<bool>,
    ids: Ids,
    mut reconnect: Reconnect,
    mut dial: D,
    mut random: impl FnMut() -> u64,
) where
    D: FnMut(Arc<Config>, Token) -> Fut,
    Fut: Future<Output = Result<WebSocketStream<S>, socket::DialError>>,
    S: session::Transport,
{
    let config = ctx.config.clone();
    let link = ctx.link.clone();
    let url = config.base_url.endpoint(true, "connect");
    // The token of the last dial: a different one on disk ends the wait for the next.
    let mut last_token = None;
    // Dials so far: each session's span names its connection.
    let mut dials: u64 = 0;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let why = match read_token(&config) {
            Err(e) => {
                tracing::error!(error = %e, "cannot read the deployment token");
                link.set_state(format!(
                    "not connected: cannot read the deployment token: {e}"
                ));
                link.metrics.dial_failed(DialFailure::Token);
                Retry::Normal
            }
            Ok(token) => {
                last_token = Some(token.clone());
                dials += 1;
                let dialled = tokio::select! {
                    d = dial(config.clone(), token.clone()) => d,
                    _ = shutdown.changed() => return,
                };
                match dialled {
                    Err(e) => {
                        tracing::warn!(%url, token_prefix = %token.prefix(), error = %e, "connection to the control plane failed");
                        let state = format!("not connected to {url}: {e}");
                        let changed = link.set_state(state.clone());
                        let failure = e.failure();
                        link.metrics.dial_failed(failure);
                        if failure == DialFailure::Token {
                            events::record(&ctx, events::Change::TokenRejected, changed, &state);
                        }
                        e.status()
                            .map(Retry::for_upgrade_status)
                            .unwrap_or(Retry::Normal)
                    }
                    Ok(ws) => {
                        tracing::info!(%url, token_prefix = %token.prefix(), "connected to the control plane");
                        let state = format!("connected to {url} (token {}…)", token.prefix());
                        let changed = link.set_state(state.clone());
                        let hello = hello(&ctx, &ids, true);
                        let end = session::run(&ctx, ws, hello, &mut shutdown, |welcomed| {
                            reconnect.reset();
                            link.connected.store(true, Relaxed);
                            // When the session is up (what readiness says), not at the
                            // upgrade: a token revoked at once is no connection.
                            events::record(&ctx, events::Change::Connected, changed, &state);
                            if welcomed {
                                let now = std::time::SystemTime::now()
                                    .duration_since(std::time::UNIX_EPOCH)
                                    .map(|d| d.as_secs())
                                    .unwrap_or_default();
                                link.last_welcome.store(now, Relaxed);
                            }
                        })
                        .instrument(tracing::info_span!("session", connection = dials))
                        .await;
                        link.connected.store(false, Relaxed);
                        let (why, disconnect, state) = match end {
                            End::Shutdown => {
                                tracing::info!("control-plane connection closed for shutdown");
                                link.set_state("not connected: shutting down");
                                link.metrics.disconnected(Disconnect::Shutdown);
                                return;
                            }
                            End::Closed(code, reason) => match Retry::for_close(code, &reason) {
                                Retry::Evicted => {
                                    tracing::warn!(code, %reason, "evicted by a newer connection for this deployment: two installs probably share one token; waiting the eviction delay before dialling again");
                                    (
                                        Retry::Evicted,
                                        Disconnect::Evicted,
                                        format!("evicted by a newer connection ({code} {reason})"),
                                    )
                                }
                                Retry::Rejected => {
                                    tracing::warn!(code, %reason, token_prefix = %token.prefix(), "token rejected: revoked by the control plane");
                                    (
                                        Retry::Rejected,
                                        Disconnect::Rejected,
                                        format!(
                                            "token rejected: revoked by the control plane (token {}…)",
                                            token.prefix()
                                        ),
                                    )
                                }
                                Retry::Normal => {
                                    tracing::warn!(code, %reason, "the control plane closed the connection");
                                    (
                                        Retry::Normal,
                                        Disconnect::Closed,
                                        format!(
                                            "not connected: closed by the control plane ({code} {reason})"
                                        ),
                                    )
                                }
                            },
                            End::Dead => (
                                Retry::Normal,
                                Disconnect::Dead,
                                "not connected: the connection went silent".to_owned(),
                            ),
                            End::Dropped(why) => {
                                tracing::warn!(error = %why, "connection to the control plane lost");
                                (
                                    Retry::Normal,
                                    Disconnect::Dropped,
                                    format!("not connected: connection lost ({why})"),
                                )
                            }
                        };
                        link.metrics.disconnected(disconnect);
                        let changed = link.set_state(state.clone());
                        let change = match disconnect {
                            Disconnect::Evicted => events::Change::Evicted,
                            Disconnect::Rejected => events::Change::TokenRejected,
                            _ => events::Change::ConnectionLost,
                        };
                        events::record(&ctx, change, changed, &state);
                        why
                    }
                }
            }
        };
        let delay = reconnect.delay_with(why, &mut random);
        link.reconnects.fetch_add(1, Relaxed);
        tracing::info!(delay_ms = delay.as_millis() as u64, reason = ?why, "reconnecting after a delay");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = token_changed(&config, last_token.as_ref()) => {
                tracing::info!("the deployment token changed on disk: dialling now");
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// A context whose client points nowhere, for tests that never reach the API server.
#[cfg(test)]
pub(crate) fn test_context() -> Arc<Context> {
    test_context_with(Config::parse(|_| None).expect("the default configuration"))
}

/// [`test_context`] with this configuration.
#[cfg(test)]
pub(crate) fn test_context_with(config: Config) -> Arc<Context> {
    let kube_config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URI"));
    let client = kube::Client::try_from(kube_config).expect("a client");
    Arc::new(Context {
        store: Default::default(),
        kube: Kube::new(client, "test"),
        config: Arc::new(config),
        link: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Kind;

    fn changed(name: &str, removed: bool, uid: &str) -> Changed {
        Changed {
            key: Key::new(Kind::Agent, "ns", name),
            removed,
            uid: uid.into(),
        }
    }

    #[test]
    fn bursts_coalesce_per_object_and_removals_are_not_hidden() {
        let link = Link::default();
        for _ in 0..1000 {
            link.mark(changed("a", false, "u1"));
        }
        link.mark(changed("b", false, "u2"));
        // The owner is removed, then an event of its pod arrives (no uid): still a removal.
        link.mark(changed("b", true, "u2"));
        link.mark(changed("b", false, ""));
        let mut pending = link.take_dirty();
        pending.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(
            pending,
            vec![changed("a", false, "u1"), changed("b", true, "u2")]
        );
        assert!(link.take_dirty().is_empty());
        // A pod event keeps the uid its owner's event carried.
        link.mark(changed("c", false, "u3"));
        link.mark(changed("c", false, ""));
        assert_eq!(link.take_dirty(), vec![changed("c", false, "u3")]);
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
        let dir = std::env::temp_dir().join(format!("autonomic-token-{}", crate::boot_id()));
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
    use futures::{SinkExt, StreamExt};
    use socket::DialError;
    use std::time::Duration;
    use tokio::io::DuplexStream;
    use tokio::sync::{mpsc, oneshot};
    use tokio::time::Instant;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

    type Pipe = WebSocketStream<DuplexStream>;
    type Ours = WebSocketStream<super::progress::Progress<DuplexStream>>;

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
            let ours = super::progress::Progress::new(ours);
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
        let task = tokio::spawn(run_with(
            ctx.clone(),
            shutdown,
            ids,
            reconnect.expect("the default schedules"),
            dial,
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
        assert_eq!(ctx.link.metrics.dial_failures(DialFailure::Connect), 8);

        // Connected and welcomed, then closed with 4002: the normal schedule, from 1 s.
        let mut cp = dial.accept().await;
        welcome(&mut cp).await;
        close(&mut cp, 4002, "protocol error").await;
        let closed_at = Instant::now();
        let dial = next_dial(&mut dials).await;
        assert_eq!(dial.at - closed_at, secs(1));
        assert_eq!(ctx.link.metrics.disconnects(Disconnect::Closed), 1);
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
        assert_eq!(ctx.link.metrics.disconnects(Disconnect::Evicted), 1);
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
        assert_eq!(ctx.link.metrics.disconnects(Disconnect::Rejected), 6);
        assert_eq!(ctx.link.metrics.dial_failures(DialFailure::Token), 5);
        // No session came up: never a Connected Event, and TokenRejected admitted.
        assert_eq!(ctx.link.events.last(events::Change::Connected), None);
        assert!(
            ctx.link
                .events
                .last(events::Change::TokenRejected)
                .is_some()
        );
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
