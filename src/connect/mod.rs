//! Managed mode: the one outbound connection to the control plane (PROTOCOL.md).
//!
//! `run` dials, runs a session until it ends, waits as the backoff says, and dials again,
//! until shutdown. The reconcile loop never waits on any of this.

pub mod backoff;
pub mod control;
pub mod frame;
pub mod http;
pub mod session;
pub mod shell;
pub mod socket;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};

use crate::audit::AuditLog;
use crate::config::{Config, Token};
use crate::reconcile::{Changed, Context, Key};
use backoff::{Reconnect, Retry};
use frame::{Frame, Hello, Host};
use session::End;

/// What the connector shares with the rest of the manager: pending changes, the audit
/// queue, and the connection's state for probes and metrics.
#[derive(Default)]
pub struct Link {
    dirty: Mutex<HashMap<Key, Changed>>,
    pub dirty_notify: Notify,
    pub audit: AuditLog,
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
    /// The last WebSocket ping's round trip in microseconds; 0 before the first.
    pub heartbeat_rtt_us: AtomicU64,
}

impl Link {
    /// Notes a change for the next delta. Bounded by the number of watched objects: the
    /// newest state of an object wins, whatever the number of events.
    pub fn mark(&self, change: Changed) {
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        let merged = match dirty.remove(&change.key) {
            // A pod event after its owner's removal must not hide the removal.
            Some(old) if old.removed && change.uid.is_empty() => old,
            Some(old) if change.uid.is_empty() => Changed {
                uid: old.uid,
                ..change
            },
            _ => change,
        };
        dirty.insert(merged.key.clone(), merged);
        drop(dirty);
        self.dirty_notify.notify_one();
    }

    /// Takes the pending changes.
    pub fn take_dirty(&self) -> Vec<Changed> {
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        dirty.drain().map(|(_, c)| c).collect()
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
fn hello(ctx: &Context, boot_id: &str, kubernetes_version: &str, io: bool) -> Frame {
    let c = &ctx.config;
    Frame::Hello(Hello {
        protocol: frame::PROTOCOL_VERSION,
        version: crate::VERSION.to_owned(),
        boot_id: boot_id.to_owned(),
        cluster_id: c.cluster_id.clone(),
        host: Host {
            hostname: std::env::var("HOSTNAME").unwrap_or_else(|_| c.pod_name.clone()),
            namespace: c.pod_namespace.clone(),
            pod: c.pod_name.clone(),
            node: c.node_name.clone(),
            kubernetes_version: kubernetes_version.to_owned(),
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

/// Holds the connection until `shutdown` turns true.
pub async fn run(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let config = ctx.config.clone();
    let link = ctx.link.clone();
    let boot_id = crate::boot_id().to_owned();
    // Validated by the configuration parser (0 < initial <= max).
    let Ok(mut reconnect) = Reconnect::new(
        config.backoff_initial,
        config.backoff_max,
        config.eviction_delay,
    ) else {
        tracing::error!("invalid backoff configuration: managed mode disabled");
        return;
    };
    // The first snapshot must hold everything: wait for the watches' initial lists.
    while !ctx.synced.is_synced() {
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            _ = shutdown.changed() => return,
        }
    }
    let kubernetes_version = match ctx.client.apiserver_version().await {
        Ok(v) => v.git_version,
        Err(_) => String::new(),
    };
    if config.transport == crate::config::Transport::Http {
        let hello = hello(&ctx, &boot_id, &kubernetes_version, false);
        return http::run(ctx, hello, shutdown, reconnect).await;
    }
    let url = config.base_url.endpoint(true, "connect");
    loop {
        if *shutdown.borrow() {
            return;
        }
        let why = match read_token(&config) {
            Err(e) => {
                tracing::error!(error = %e, "cannot read the deployment token");
                Retry::Normal
            }
            Ok(token) => {
                let dialled = tokio::select! {
                    d = socket::dial(&config, &token) => d,
                    _ = shutdown.changed() => return,
                };
                match dialled {
                    Err(e) => {
                        tracing::warn!(%url, token_prefix = %token.prefix(), error = %e, "connection to the control plane failed");
                        e.status()
                            .map(Retry::for_upgrade_status)
                            .unwrap_or(Retry::Normal)
                    }
                    Ok(ws) => {
                        tracing::info!(%url, token_prefix = %token.prefix(), "connected to the control plane");
                        let hello = hello(&ctx, &boot_id, &kubernetes_version, true);
                        let end = session::run(&ctx, ws, hello, &mut shutdown, || {
                            reconnect.reset();
                            link.connected.store(true, Relaxed);
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map(|d| d.as_secs())
                                .unwrap_or_default();
                            link.last_welcome.store(now, Relaxed);
                        })
                        .await;
                        link.connected.store(false, Relaxed);
                        match end {
                            End::Shutdown => {
                                tracing::info!("control-plane connection closed for shutdown");
                                return;
                            }
                            End::Closed(4000, reason) => {
                                tracing::warn!(%reason, "evicted by a newer connection for this deployment: two installs probably share one token; waiting the eviction delay before dialling again");
                                Retry::Evicted
                            }
                            End::Closed(4001, reason) => {
                                tracing::warn!(%reason, token_prefix = %token.prefix(), "token rejected: revoked by the control plane");
                                Retry::Rejected
                            }
                            End::Closed(code, reason) => {
                                tracing::warn!(code, %reason, "the control plane closed the connection");
                                Retry::for_close_code(code)
                            }
                            End::Dead => Retry::Normal,
                            End::NoWelcome => {
                                tracing::warn!(
                                    timeout_s = config.welcome_timeout.as_secs(),
                                    "no welcome from the control plane"
                                );
                                Retry::Normal
                            }
                            End::Dropped(why) => {
                                tracing::warn!(error = %why, "connection to the control plane lost");
                                Retry::Normal
                            }
                        }
                    }
                }
            }
        };
        let delay = reconnect.delay(why);
        link.reconnects.fetch_add(1, Relaxed);
        tracing::info!(delay_ms = delay.as_millis() as u64, reason = ?why, "reconnecting after a delay");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => return,
        }
    }
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
