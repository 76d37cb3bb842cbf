//! `/livez`, `/readyz` and `/metrics` on the probe address: a minimal HTTP/1.1 server,
//! enough for kubelet probes and Prometheus scrapes.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::connect::Link;
use crate::metrics::Metrics;
use crate::reconcile::Queue;
use crate::store::Store;

/// What the probes and `/metrics` read, handed over by the application.
#[derive(Clone, Default)]
pub struct Probe {
    pub store: Arc<Store>,
    pub link: Arc<Link>,
    pub metrics: Arc<Metrics>,
    pub queue: Arc<Queue>,
    /// Managed mode: a leader that is not connected is not ready.
    pub managed: bool,
}

/// Probe connections answered at once. Kubelet and Prometheus need a handful.
pub const MAX_CONNECTIONS: usize = 64;

/// A client that never finishes its request holds a slot at most this long.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The pause after a failed `accept` (e.g. EMFILE), so a descriptor shortage does not spin.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Serves forever: a failed `accept` is logged and retried, never fatal.
pub async fn serve(listener: TcpListener, ctx: Arc<Probe>) -> std::io::Result<()> {
    serve_with(listener, ctx, MAX_CONNECTIONS, Arc::default()).await
}

/// Where connections come from: the listener, or in tests one that fails on demand.
trait Accept {
    fn accept_one(&self) -> impl Future<Output = std::io::Result<TcpStream>> + Send;
}

impl Accept for TcpListener {
    async fn accept_one(&self) -> std::io::Result<TcpStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// [`serve`] with at most `limit` connections in progress, counted in `in_progress`.
///
/// Past the limit the server stops accepting until a slot frees, rather than accepting
/// and closing at once: waiting connections stay in the kernel's backlog (bounded by the
/// kernel, no descriptor and no task here), a slot frees within [`ANSWER_TIMEOUT`], and a
/// kubelet probe that arrives during a flood is answered late instead of refused.
async fn serve_with(
    listener: impl Accept,
    ctx: Arc<Probe>,
    limit: usize,
    in_progress: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(limit.max(1)));
    let mut burst = AcceptBurst::default();
    loop {
        // Never closed, so this cannot fail.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            continue;
        };
        let stream = match listener.accept_one().await {
            Ok(stream) => stream,
            Err(error) => {
                if burst.failed() {
                    tracing::warn!(%error, retry_ms = ACCEPT_RETRY.as_millis() as u64, "probe server cannot accept a connection; retrying");
                }
                drop(slot);
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        if let Some(errors) = burst.succeeded() {
            tracing::info!(errors, "probe server accepting again");
        }
        let ctx = ctx.clone();
        let in_progress = in_progress.clone();
        in_progress.fetch_add(1, Relaxed);
        tokio::spawn(async move {
            // A client that never finishes its request must not hold a slot forever.
            let _ = tokio::time::timeout(ANSWER_TIMEOUT, answer(stream, &ctx)).await;
            in_progress.fetch_sub(1, Relaxed);
            drop(slot);
        });
    }
}

/// Failed accepts in a row: the first of a burst is logged, the rest only counted, so a
/// descriptor shortage writes one line per burst, not ten a second.
#[derive(Debug, Default)]
struct AcceptBurst {
    errors: u64,
}

impl AcceptBurst {
    /// An accept failed: true when it is the first of a burst (log it).
    fn failed(&mut self) -> bool {
        self.errors += 1;
        self.errors == 1
    }

    /// An accept succeeded: the length of the burst it ends, if any.
    fn succeeded(&mut self) -> Option<u64> {
        (self.errors > 0).then(|| std::mem::take(&mut self.errors))
    }
}

async fn answer(mut stream: TcpStream, ctx: &Probe) -> std::io::Result<()> {
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let path = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("GET "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or("");
    let (code, body) = match path {
        "/livez" => (200, "ok\n".to_owned()),
        "/readyz" => match readiness(ctx) {
            Ok(()) => (200, "ok\n".to_owned()),
            Err(why) => (503, format!("{why}\n")),
        },
        "/metrics" => (200, metrics(ctx)),
        _ => (404, "not found\n".to_owned()),
    };
    let reason = match code {
        200 => "OK",
        503 => "Service Unavailable",
        _ => "Not Found",
    };
    let content_type = if path == "/metrics" {
        "text/plain; version=0.0.4"
    } else {
        "text/plain"
    };
    let response = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn readiness(ctx: &Probe) -> Result<(), &'static str> {
    let leading = ctx.metrics.leader.load(Relaxed);
    // A managed standby is warm once the lists the first snapshot needs are in. The
    // others wait for that snapshot (which only a leader sends), else `LATER_BOUND`:
    // waiting for them too would hold every rolling update back by as long.
    let warm = if ctx.managed && !leading {
        ctx.store.wire_synced.is_synced()
    } else {
        ctx.store.synced.is_synced()
    };
    if !warm {
        return Err("watches not synced");
    }
    // A standby never connects; it is ready once warm, or a Deployment of two replicas
    // would never finish rolling out.
    if ctx.managed && leading && !ctx.link.is_connected() {
        return Err("not connected to the control plane");
    }
    Ok(())
}

fn metrics(ctx: &Probe) -> String {
    ctx.metrics.render(
        &[
            (
                "autonomic_managed",
                "1 in managed mode: the manager holds a control-plane connection while leading.",
                f64::from(u8::from(ctx.managed)),
            ),
            (
                "autonomic_leader",
                "1 while this replica holds the leader Lease and reconciles.",
                f64::from(u8::from(ctx.metrics.leader.load(Relaxed))),
            ),
            (
                "autonomic_queue_depth",
                "Objects waiting to be reconciled.",
                ctx.queue.depth() as f64,
            ),
            (
                "autonomic_watches_synced",
                "1 once every watch has listed its objects.",
                f64::from(u8::from(ctx.store.synced.is_synced())),
            ),
            (
                "autonomic_agents",
                "Agents in the cache.",
                ctx.store.agents.count() as f64,
            ),
            (
                "autonomic_tools",
                "Tools in the cache.",
                ctx.store.tools.count() as f64,
            ),
        ],
        |out| ctx.link.render(out),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test(start_paused = true)]
    async fn held_connections_never_exceed_the_limit_and_livez_still_answers() {
        const N: usize = 4;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let in_progress = Arc::new(AtomicUsize::new(0));
        let server = tokio::spawn(serve_with(listener, Arc::default(), N, in_progress.clone()));
        // N + 10 clients connect and send nothing.
        let mut held = Vec::new();
        let mut peak = 0;
        for _ in 0..N + 10 {
            held.push(TcpStream::connect(addr).await.unwrap());
            tokio::time::sleep(Duration::from_millis(1)).await;
            peak = peak.max(in_progress.load(Relaxed));
        }
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            peak = peak.max(in_progress.load(Relaxed));
        }
        assert_eq!(peak, N, "connections in progress");
        drop(held);
        let answer = get(addr, "/livez").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(answer.ends_with("ok\n"), "{answer}");
        assert!(!server.is_finished());
        server.abort();
    }

    /// A listener whose first `failures` accepts fail as if out of descriptors.
    struct Failing {
        listener: TcpListener,
        failures: AtomicUsize,
    }

    impl Accept for Failing {
        async fn accept_one(&self) -> std::io::Result<TcpStream> {
            let left = self.failures.load(Relaxed);
            if left > 0 {
                self.failures.store(left - 1, Relaxed);
                return Err(std::io::Error::other("Too many open files (os error 24)"));
            }
            self.listener.accept_one().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_do_not_end_serve_and_pause_between_retries() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let start = tokio::time::Instant::now();
        let server = tokio::spawn(serve_with(
            Failing {
                listener,
                failures: AtomicUsize::new(3),
            },
            Arc::default(),
            MAX_CONNECTIONS,
            Arc::default(),
        ));
        let answer = get(addr, "/livez").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
        assert!(!server.is_finished(), "serve ended: {:?}", server.await);
        // Three failures, each followed by a pause: no spinning.
        assert!(start.elapsed() >= 3 * ACCEPT_RETRY, "{:?}", start.elapsed());
        server.abort();
    }

    /// The rendered text has exactly the families of `metrics::SERIES`, each once, with
    /// its HELP and TYPE: the one list the chart's dashboard and alerts are checked
    /// against cannot drift from what is exported.
    #[test]
    fn metrics_has_exactly_the_listed_families() {
        use crate::metrics::{HISTOGRAMS, PROCESS_SERIES, SERIES};
        let text = metrics(&Probe::default());
        let mut typed = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(kind == "histogram", HISTOGRAMS.contains(&name), "{line}");
                typed.push(name.to_owned());
            } else if !line.starts_with("# HELP ") {
                // Every sample belongs to the family typed last.
                let family = typed.last().expect("a TYPE first");
                let name = line.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|_| HISTOGRAMS.contains(&family.as_str()))
                    .unwrap_or(name);
                assert_eq!(base, family, "{line}");
            }
        }
        let mut expected: Vec<&str> = SERIES
            .iter()
            .copied()
            .filter(|s| cfg!(target_os = "linux") || !PROCESS_SERIES.contains(s))
            .collect();
        let mut seen: Vec<&str> = typed.iter().map(String::as_str).collect();
        expected.sort_unstable();
        seen.sort_unstable();
        assert_eq!(seen, expected);
        assert!(text.contains("autonomic_build_info{version=\""), "{text}");
    }

    /// A managed standby is ready once the snapshot's lists are in; a leader, and any
    /// unmanaged replica, once every list is.
    #[test]
    fn a_managed_standby_is_ready_without_the_later_lists() {
        let probe = |managed: bool, leading: bool| {
            let p = Probe {
                managed,
                ..Probe::default()
            };
            p.store.synced.expect();
            p.store.synced.expect();
            p.store.wire_synced.expect();
            p.store.wire_synced.mark();
            p.store.synced.mark();
            p.metrics.leader.store(leading, Relaxed);
            p
        };
        assert_eq!(readiness(&probe(true, false)), Ok(()));
        assert_eq!(readiness(&probe(true, true)), Err("watches not synced"));
        assert_eq!(readiness(&probe(false, true)), Err("watches not synced"));
        let all = probe(false, true);
        all.store.synced.mark();
        assert_eq!(readiness(&all), Ok(()));
    }

    /// Failed accepts are logged once per burst, and a success ends the burst.
    #[test]
    fn accept_errors_log_once_per_burst() {
        let mut burst = AcceptBurst::default();
        assert_eq!(burst.succeeded(), None);
        assert!(burst.failed());
        assert!(!burst.failed());
        assert!(!burst.failed());
        assert_eq!(burst.succeeded(), Some(3));
        assert_eq!(burst.succeeded(), None);
        assert!(burst.failed(), "a new burst logs again");
    }
}
