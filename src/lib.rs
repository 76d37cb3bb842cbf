//! autonomic-manager: the in-cluster operator of the autonomic.sh platform.
#![forbid(unsafe_code)]

pub mod audit;
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
    let mut kube_config = kube::Config::infer()
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    // HTTPS_PROXY is the control plane's egress (PROTOCOL.md §1), not the API server's:
    // kube's kubeconfig loader would apply it to the API server too (in-cluster it does not).
    kube_config.proxy_url = None;
    let client =
        kube::Client::try_from(kube_config).map_err(|e| Error::KubeConfig(e.to_string()))?;
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

    let mut tasks = tokio::task::JoinSet::new();
    let notify: Arc<dyn Fn(reconcile::Changed) + Send + Sync> = if config.managed {
        let link = ctx.link.clone();
        Arc::new(move |c| link.mark(c))
    } else {
        Arc::new(|_| {})
    };
    reconcile::spawn_watches(&ctx, notify, &mut tasks);
    reconcile::spawn_workers(&ctx, &mut tasks);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let connector = config
        .managed
        .then(|| tokio::spawn(connect::run(ctx.clone(), stopping)));
    let health = health::serve(listener, ctx.clone());
    tokio::pin!(health);
    tokio::pin!(shutdown);

    let result = tokio::select! {
        () = &mut shutdown => Ok(()),
        r = &mut health => Err(Error::Probe { addr: probe_addr, source: r.err().unwrap_or_else(|| std::io::Error::other("stopped")) }),
        Some(r) = tasks.join_next() => Err(Error::TaskEnded(format!("{r:?}"))),
    };
    // Shutdown is one path: the connector closes its socket with 1000, bounded in time.
    let _ = stop.send(true);
    if let Some(connector) = connector {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(4), connector).await;
    }
    tasks.abort_all();
    tracing::info!("autonomic-manager stopped");
    result
}
