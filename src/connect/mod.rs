//! Managed mode: the one outbound connection to the control plane (PROTOCOL.md).
//!
//! `run` waits for what `hello` and the first snapshot need, then hands over to the one
//! dial loop (`dial`) over the configured transport. The reconcile loop never waits on
//! any of this; what the rest of the manager sees of it is the [`Link`].

pub mod backoff;
pub mod control;
mod dial;
pub mod events;
pub mod http;
pub mod link;
pub mod outbox;
pub mod progress;
pub mod session;
pub mod shell;
pub mod socket;

use std::sync::Arc;

use tokio::sync::watch;
use tracing::Instrument;

use crate::cluster::Kube;
use crate::config::{Config, Token};
use crate::protocol::frame::{self, Frame, Hello, Host};
use crate::protocol::wire;
use crate::store::Store;
use backoff::Reconnect;
pub use dial::read_token;
pub use link::Link;

/// What the connector reads and acts through, handed over by the application.
pub struct Context {
    pub store: Arc<Store>,
    /// Control requests' writes; its client runs the shells' execs.
    pub kube: Kube,
    pub config: Arc<Config>,
    pub link: Arc<Link>,
}

/// The wire form as this manager sends it: from the store, env values masked unless
/// the admin said otherwise.
fn form(ctx: &Context) -> wire::Form<'_> {
    wire::Form::new(&ctx.store, ctx.config.send_env_values)
}

/// `io` only over the WebSocket: the HTTP transport cannot carry a shell's bytes.
fn hello(ctx: &Context, ids: &Ids, io: bool) -> Frame {
    let c = &ctx.config;
    Frame::Hello(Hello {
        protocol: frame::PROTOCOL_VERSION,
        version: crate::process::VERSION.to_owned(),
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
            boot_id: crate::process::boot_id().to_owned(),
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
        let http = http::Http::default();
        return dial::run(ctx, shutdown, ids, reconnect, http, backoff::system_random).await;
    }
    let socket = dial::Socket::new(|config: Arc<Config>, token: Token| async move {
        socket::dial(&config, &token).await
    });
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
    dial::run(
        ctx,
        shutdown,
        ids,
        reconnect,
        socket,
        backoff::system_random,
    )
    .await;
    // The sessions' last events (their closes) are recorded by now: one last write.
    let _ = stop_writer.send(true);
    let _ = writer.await;
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
