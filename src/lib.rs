//! autonomic-manager: the in-cluster operator of the autonomic.sh platform.
#![forbid(unsafe_code)]

mod audit;
mod backoff;
pub mod check;
pub mod cli;
mod cluster;
pub mod config;
mod connect;
pub mod crd;
mod egress;
mod health;
mod leader;
mod metrics;
mod process;
mod protocol;
mod reconcile;
mod store;
mod text;

/// What the integration tests and the benchmarks reach of the internals, named one by
/// one: every other module is private, so the compiler reports what nothing uses.
#[doc(hidden)]
pub mod internals {
    pub use crate::connect::link::{DialFailure, Disconnect};
    pub use crate::metrics::{HISTOGRAMS, PROCESS_SERIES, SERIES};
    pub use crate::protocol::frame::{
        Frame, Snapshot, Stream, decode, decode_io, encode, encode_io,
    };
    pub use crate::protocol::wire::{Form, all as wire_forms, snapshot_text};
    pub use crate::reconcile::agent::{AgentletDefaults, desired_pod as agent_pod};
    pub use crate::reconcile::tool::{IDLE, desired_pod as tool_pod};
    pub use crate::store::list::{Listed, list};
    pub use crate::store::proto::ACCEPT as PROTOBUF_ACCEPT;
    pub use crate::store::{PodView, SecretView, Store, trim};
}

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use config::Config;
use tracing::Instrument;

pub use process::{VERSION, boot_id};

/// Managed, how long after the wire form's lists the others wait at most for the first
/// snapshot to be out (see `Store::later`).
const LATER_BOUND: Duration = Duration::from_secs(5);

/// Why the manager stopped or a step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] cluster::Error),
    #[error("unable to load a Kubernetes client configuration (KUBECONFIG or in-cluster): {0}")]
    KubeConfig(String),
    #[error("probe server on {addr}: {source}")]
    Probe {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("a critical task ended: {0}")]
    TaskEnded(String),
    #[error("lost leadership: {0}")]
    LostLease(#[from] leader::Lost),
}

/// What runs only while this replica leads: the reconcile workers and the connector.
struct Term {
    workers: tokio::task::JoinSet<()>,
    stop: tokio::sync::watch::Sender<bool>,
    connector: Option<tokio::task::JoinHandle<()>>,
}

impl Term {
    fn start(ctx: &Arc<reconcile::Context>, connect: Option<&Arc<connect::Context>>) -> Term {
        ctx.metrics.leader.store(true, Relaxed);
        let mut workers = tokio::task::JoinSet::new();
        reconcile::spawn_workers(ctx, &mut workers);
        // The standby's watches queued what they saw; a resync covers anything else.
        ctx.queue_all();
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let connector = connect.map(|c| {
            let span = tracing::info_span!("connector");
            tokio::spawn(connect::run(c.clone(), stopping).instrument(span))
        });
        Term {
            workers,
            stop,
            connector,
        }
    }

    /// Stops writing at once, then closes the connection (1000), bounded by `within`.
    async fn end(mut self, link: &connect::Link, metrics: &metrics::Metrics, within: Duration) {
        self.workers.abort_all();
        let _ = self.stop.send(true);
        if let Some(mut connector) = self.connector.take()
            && tokio::time::timeout(within, &mut connector).await.is_err()
        {
            // Dropping the socket closes it without the close handshake.
            connector.abort();
            let _ = connector.await;
        }
        link.stopped();
        metrics.leader.store(false, Relaxed);
    }
}

/// Completes when the election changes this replica's role: won (standby) or lost
/// (leading). Without election, wins at once and then never completes.
async fn elect(elector: &mut Option<leader::Elector>, leading: bool) -> Option<leader::Lost> {
    match (elector, leading) {
        (None, false) => None,
        (None, true) => std::future::pending().await,
        (Some(e), false) => {
            e.acquire().await;
            None
        }
        (Some(e), true) => Some(e.hold().await),
    }
}

/// Runs the manager until `shutdown` completes or a critical task ends: builds the
/// Kubernetes client (kubeconfig or in-cluster) and binds the probe address, then
/// [`serve`]s.
pub async fn run(mut config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let mut kube_config = kube::Config::infer()
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    // HTTPS_PROXY is the control plane's egress (PROTOCOL.md §1), not the API server's:
    // kube's kubeconfig loader would apply it to the API server too (in-cluster it does not).
    kube_config.proxy_url = None;
    config.own_service_account = cluster::service_account(&kube_config);
    let client =
        kube::Client::try_from(kube_config).map_err(|e| Error::KubeConfig(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(config.probe_addr)
        .await
        .map_err(|source| Error::Probe {
            addr: config.probe_addr,
            source,
        })?;
    serve(config, client, listener, shutdown).await
}

/// The manager on a given client and probe listener. The application owns the shared
/// state and hands each part what it uses: the store to everyone, the link (the
/// control-plane connection's state) to the connector, the probes and the elector.
pub async fn serve(
    config: Config,
    client: kube::Client,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let config = Arc::new(config);
    let probe_addr = listener.local_addr().unwrap_or(config.probe_addr);
    let store = Arc::new(store::Store::with_max_spec_bytes(config.max_spec_bytes));
    let link = Arc::new(connect::Link::default());
    let metrics = Arc::new(metrics::Metrics::default());
    let kube = cluster::Kube::new(client.clone(), &config.pod_name);
    let ctx = reconcile::Context::new(store.clone(), kube.clone(), config.clone(), metrics.clone());
    let connect = config.managed.then(|| {
        Arc::new(connect::Context {
            store: store.clone(),
            kube,
            config: config.clone(),
            link: link.clone(),
        })
    });

    announce(&config, probe_addr);

    let mut tasks = tokio::task::JoinSet::new();
    let on_change = listener_of(&ctx, &link, config.managed);
    open_later_lists(&store, config.managed);
    store::watch::spawn(&store, &client, &config.namespaces, &on_change, &mut tasks);
    let mut elector = config
        .leader_election
        .then(|| elector(&config, &client, &link));
    let probe = Arc::new(health::Probe {
        store: store.clone(),
        link: link.clone(),
        metrics: metrics.clone(),
        queue: ctx.queue.clone(),
        managed: config.managed,
    });
    let health = health::serve(listener, probe);
    tokio::pin!(health);
    tokio::pin!(shutdown);

    let mut term: Option<Term> = None;
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            r = &mut health => break Err(Error::Probe { addr: probe_addr, source: r.err().unwrap_or_else(|| std::io::Error::other("stopped")) }),
            Some(r) = tasks.join_next() => break Err(Error::TaskEnded(format!("{r:?}"))),
            lost = elect(&mut elector, term.is_some()) => match lost {
                None => term = Some(Term::start(&ctx, connect.as_ref())),
                Some(lost) => break Err(Error::LostLease(lost)),
            },
        }
    };
    let lost = matches!(result, Err(Error::LostLease(_)));
    wind_down(term, lost, &link, &metrics, elector.as_mut()).await;
    tasks.abort_all();
    tracing::info!("autonomic-manager stopped");
    result
}

/// The start-up line: version, mode, namespaces, proxy (without its password) and the
/// probes' address.
fn announce(config: &Config, probe_addr: std::net::SocketAddr) {
    tracing::info!(
        version = VERSION,
        managed = config.managed,
        namespaces = ?config.namespaces,
        // Without its password (Proxy's Display).
        https_proxy = %config.https_proxy.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string),
        probe_addr = %probe_addr,
        "autonomic-manager starting"
    );
}

/// What the watches tell of every change: the work queue and, when managed, the next
/// delta.
fn listener_of(
    ctx: &Arc<reconcile::Context>,
    link: &Arc<connect::Link>,
    managed: bool,
) -> store::watch::Listener {
    let (ctx, link) = (ctx.clone(), link.clone());
    let listener: store::watch::Listener = Arc::new(move |seen| {
        ctx.route(seen);
        if managed && let Some(changed) = seen.changed() {
            link.mark(changed);
        }
    });
    listener
}

/// Watches and caches always run: a standby is warm and takes over fast. Unmanaged,
/// every list starts at once; managed, the lists the first snapshot does not need wait
/// for it to be out (the session opens `later`), or [`LATER_BOUND`] after the lists it
/// needs (a standby, an unreachable control plane).
fn open_later_lists(store: &Arc<store::Store>, managed: bool) {
    if managed {
        let store = store.clone();
        tokio::spawn(async move {
            store.wire_synced.wait().await;
            tokio::time::sleep(LATER_BOUND).await;
            store.later.open();
        });
    } else {
        store.later.open();
    }
}

/// The elector of this process (`<pod>_<boot id>`), which writes the link's state in
/// words on the Lease.
fn elector(config: &Config, client: &kube::Client, link: &Arc<connect::Link>) -> leader::Elector {
    let identity = format!("{}_{}", config.pod_name, boot_id());
    tracing::info!(%identity, namespace = %config.pod_namespace, lease = leader::LEASE_NAME, "leader election on");
    let link = link.clone();
    let managed = config.managed;
    let state: leader::LinkState = Arc::new(move || match (managed, link.state()) {
        (false, _) => "unmanaged: no control-plane connection (manager.managed=false)".into(),
        (true, s) if s.is_empty() => "not connected yet: dialling the control plane".into(),
        (true, s) => s,
    });
    leader::Elector::new(client.clone(), &config.pod_namespace, identity, state)
}

/// One shutdown path: stop writing, close the socket with 1000, then release the Lease
/// (so the successor never overlaps this connection), all within 5 s. Leadership
/// `lost`: stop at once and exit non-zero; the kubelet restarts the container as a
/// fresh standby (what controller-runtime does).
async fn wind_down(
    term: Option<Term>,
    lost: bool,
    link: &connect::Link,
    metrics: &metrics::Metrics,
    elector: Option<&mut leader::Elector>,
) {
    if let Some(term) = term {
        if lost {
            tracing::error!(
                "leadership lost: stopped reconciling; closing the control-plane connection"
            );
        }
        let within = Duration::from_secs(if lost { 2 } else { 3 });
        term.end(link, metrics, within).await;
    }
    // Also as a standby: a shutdown may have cut short an acquire the server applied.
    if !lost && let Some(elector) = elector {
        elector.release().await;
    }
}
