//! autonomic-manager: the in-cluster operator of the autonomic.sh platform.
#![forbid(unsafe_code)]

pub mod cache;
pub mod config;
pub mod connect;
pub mod crd;
pub mod health;
pub mod metrics;
pub mod reconcile;

use std::future::Future;
use std::sync::Arc;

use config::Config;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why the manager stopped or a step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
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
}

impl Error {
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            context: context.into(),
            source,
        }
    }
}

/// Runs the manager until `shutdown` completes or a critical task ends.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let config = Arc::new(config);
    let client = kube::Client::try_default()
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    let metrics = Arc::new(metrics::Metrics::default());
    let ctx = reconcile::Context::new(client, config.clone(), metrics);

    let listener = tokio::net::TcpListener::bind(config.probe_addr)
        .await
        .map_err(|source| Error::Probe {
            addr: config.probe_addr,
            source,
        })?;
    let probe_addr = listener.local_addr().unwrap_or(config.probe_addr);
    tracing::info!(
        version = VERSION,
        managed = config.managed,
        namespaces = ?config.namespaces,
        probe_addr = %probe_addr,
        "autonomic-manager starting"
    );

    if config.managed {
        // Said loudly rather than pretended: the connector is not wired up yet.
        tracing::error!(
            "AUTONOMIC_MANAGED=true, but this build has no control-plane connection yet: reconciling unmanaged"
        );
    }
    let mut tasks = tokio::task::JoinSet::new();
    reconcile::spawn_watches(&ctx, Arc::new(|_| {}), &mut tasks);
    reconcile::spawn_workers(&ctx, &mut tasks);
    let health = health::serve(listener, ctx.clone());
    tokio::pin!(health);
    tokio::pin!(shutdown);

    let result = tokio::select! {
        () = &mut shutdown => Ok(()),
        r = &mut health => Err(Error::Probe { addr: probe_addr, source: r.err().unwrap_or_else(|| std::io::Error::other("stopped")) }),
        Some(r) = tasks.join_next() => Err(Error::TaskEnded(format!("{r:?}"))),
    };
    tasks.abort_all();
    tracing::info!("autonomic-manager stopped");
    result
}
