//! `/livez`, `/readyz` and `/metrics` on the probe address: a minimal HTTP/1.1 server,
//! enough for kubelet probes and Prometheus scrapes.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::reconcile::Context;

/// Serves until the listener fails.
pub async fn serve(listener: TcpListener, ctx: Arc<Context>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            // A client that never finishes its request must not hold a task forever.
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(stream, &ctx)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, ctx: &Context) -> std::io::Result<()> {
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

fn readiness(ctx: &Context) -> Result<(), &'static str> {
    if !ctx.synced.is_synced() {
        return Err("watches not synced");
    }
    // A standby never connects; it is ready once warm, or a Deployment of two replicas
    // would never finish rolling out.
    if ctx.config.managed && ctx.metrics.leader.load(Relaxed) && !ctx.link.connected.load(Relaxed) {
        return Err("not connected to the control plane");
    }
    Ok(())
}

fn metrics(ctx: &Context) -> String {
    let link = &ctx.link;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed) as f64;
    ctx.metrics.render(&[
        (
            "autonomic_connected",
            "1 while the control-plane session is up.",
            f64::from(u8::from(link.connected.load(Relaxed))),
        ),
        (
            "autonomic_leader",
            "1 while this replica holds the leader Lease and reconciles.",
            f64::from(u8::from(ctx.metrics.leader.load(Relaxed))),
        ),
        (
            "autonomic_shell_sessions_open",
            "Shell sessions open now.",
            n(&link.sessions_open),
        ),
        (
            "autonomic_heartbeat_rtt_seconds",
            "Round trip of the WebSocket ping sent with the last heartbeat (0 before the first).",
            n(&link.heartbeat_rtt_us) / 1e6,
        ),
        (
            "autonomic_last_welcome_timestamp_seconds",
            "Unix time of the last welcome.",
            n(&link.last_welcome),
        ),
        (
            "autonomic_reconnects_total",
            "Dials after a session ended or failed.",
            n(&link.reconnects),
        ),
        (
            "autonomic_snapshots_sent_total",
            "Snapshot frames sent.",
            n(&link.snapshots_sent),
        ),
        (
            "autonomic_deltas_sent_total",
            "Delta frames sent.",
            n(&link.deltas_sent),
        ),
        (
            "autonomic_bytes_sent_total",
            "Bytes of frames sent: text, shell output and pings.",
            n(&link.bytes_sent),
        ),
        (
            "autonomic_frames_rejected_total",
            "Frames from the control plane answered with an error.",
            n(&link.frames_rejected),
        ),
        (
            "autonomic_audit_queued",
            "Audit events waiting to be sent.",
            link.audit.queued() as f64,
        ),
        (
            "autonomic_audit_dropped_total",
            "Audit events dropped because the queue was full.",
            link.audit.dropped() as f64,
        ),
        (
            "autonomic_queue_depth",
            "Objects waiting to be reconciled.",
            ctx.queue.depth() as f64,
        ),
        (
            "autonomic_watches_synced",
            "1 once every watch has listed its objects.",
            f64::from(u8::from(ctx.synced.is_synced())),
        ),
        (
            "autonomic_agents",
            "Agents in the cache.",
            ctx.agents.len() as f64,
        ),
        (
            "autonomic_tools",
            "Tools in the cache.",
            ctx.tools.len() as f64,
        ),
    ])
}
