//! The application's one seam to the connection: the changes waiting for the next delta,
//! the audit queue, and the link's figures. The figures are private: they move only
//! through the three transitions of the dial loop (a dial failed, a session is up, it
//! ended), which set the state in words, count the metric and record the Event together,
//! whatever the transport, and through what a session reports it sent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod figures;

use crate::audit::AuditLog;
use crate::connect::backoff::Retry;
use crate::connect::session::End;
use crate::connect::socket::DialError;
use crate::connect::{Context, events, outbox, shell};
use crate::crd::Key;
use crate::metrics::Histogram;
use crate::store::watch::Changed;
pub use figures::{DialFailure, Disconnect};

/// What the connector shares with the rest of the manager: pending changes, the audit
/// queue, and the connection's state for probes and metrics.
pub struct Link {
    /// Each pending change with when it was first marked (for the delta latency).
    dirty: Mutex<HashMap<Key, (Changed, Instant)>>,
    pub dirty_notify: Notify,
    pub audit: AuditLog,
    /// The audit outbox in the manager's namespace (WebSocket transport, once the
    /// connector runs).
    pub outbox: OnceLock<Arc<outbox::Outbox>>,
    /// What the shells' input waiting for their processes holds in memory, all sessions
    /// together (bounded at 16 MiB, `shell::input`).
    pub shell_input: shell::input::Held,
    /// The Events recorded on the manager's pod, for their rate limit.
    pub events: events::Limit,
    /// The connection's state in words ("connected to …", "token rejected …",
    /// "connection refused …"): the leader publishes it on the Lease so that a standby's
    /// log shows it too (`kubectl logs deploy/…` may pick either pod).
    state: Mutex<String>,
    connected: AtomicBool,
    reconnects: AtomicU64,
    snapshots_sent: AtomicU64,
    deltas_sent: AtomicU64,
    bytes_sent: AtomicU64,
    frames_rejected: AtomicU64,
    /// Unix seconds of the last `welcome`, 0 before the first.
    last_welcome: AtomicU64,
    sessions_open: AtomicU64,
    /// The last WebSocket ping's round trip in microseconds; 0 before the first.
    heartbeat_rtt_us: AtomicU64,
    disconnects: [AtomicU64; Disconnect::ALL.len()],
    dial_failures: [AtomicU64; DialFailure::ALL.len()],
    /// From the first watch event that marked an object changed to the write of the
    /// delta frame carrying it.
    delta_latency: Histogram,
    snapshot_bytes: Histogram,
    /// The size of the last snapshot sent: what a close 1009 most likely refused.
    last_snapshot_bytes: AtomicUsize,
    /// Building and writing one snapshot frame.
    snapshot_duration: Histogram,
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

    /// The connection's state in words; empty before the first dial.
    pub fn state(&self) -> String {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the connection's state in words; `true` when it changed.
    fn set_state(&self, state: impl Into<String>) -> bool {
        let state = state.into();
        let mut cur = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *cur != state;
        *cur = state;
        changed
    }

    /// Whether a session is up now (what readiness asks of a managed leader).
    pub fn is_connected(&self) -> bool {
        self.connected.load(Relaxed)
    }

    /// The connector stopped (the Lease lost, shutdown): no session is up.
    pub fn stopped(&self) {
        self.connected.store(false, Relaxed);
    }

    /// Bytes of frames written to the control plane.
    pub fn sent(&self, bytes: usize) {
        self.bytes_sent.fetch_add(bytes as u64, Relaxed);
    }

    /// A snapshot of `bytes` went out, built and written in `took`; `true` for the
    /// process's first.
    pub fn snapshot_sent(&self, bytes: usize, took: Duration) -> bool {
        self.last_snapshot_bytes.store(bytes, Relaxed);
        self.snapshot_bytes.observe(bytes as f64);
        self.snapshot_duration.observe_duration(took);
        self.snapshots_sent.fetch_add(1, Relaxed) == 0
    }

    /// A snapshot's writing ended after `bytes` (the session ended under it): at least
    /// what a close 1009 refused, so the size a next snapshot must be under.
    pub fn snapshot_cut(&self, bytes: usize) {
        self.last_snapshot_bytes.store(bytes, Relaxed);
    }

    /// The size of the last snapshot sent (or cut short), 0 before the first.
    pub fn last_snapshot_bytes(&self) -> usize {
        self.last_snapshot_bytes.load(Relaxed)
    }

    /// A delta went out carrying the changes first marked at `marked`.
    pub fn delta_sent(&self, marked: &[Instant]) {
        let now = Instant::now();
        for at in marked {
            self.delta_latency
                .observe_duration(now.saturating_duration_since(*at));
        }
        self.deltas_sent.fetch_add(1, Relaxed);
    }

    /// A frame from the control plane was answered with an error.
    pub fn frame_rejected(&self) {
        self.frames_rejected.fetch_add(1, Relaxed);
    }

    /// The round trip of the last WebSocket ping.
    pub fn heartbeat_rtt(&self, rtt: Duration) {
        let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
        self.heartbeat_rtt_us.store(us.max(1), Relaxed);
    }

    pub fn shell_opened(&self) {
        self.sessions_open.fetch_add(1, Relaxed);
    }

    pub fn shell_closed(&self) {
        self.sessions_open.fetch_sub(1, Relaxed);
    }

    #[cfg(test)]
    pub fn disconnects(&self, why: Disconnect) -> u64 {
        self.disconnects[why.index()].load(Relaxed)
    }

    #[cfg(test)]
    pub fn dial_failures(&self, why: DialFailure) -> u64 {
        self.dial_failures[why.index()].load(Relaxed)
    }

    #[cfg(test)]
    pub fn deltas(&self) -> u64 {
        self.deltas_sent.load(Relaxed)
    }

    #[cfg(test)]
    pub fn shells_open(&self) -> u64 {
        self.sessions_open.load(Relaxed)
    }

    /// The delta latency, the snapshot's size and its time.
    #[cfg(test)]
    pub fn histograms(&self) -> (&Histogram, &Histogram, &Histogram) {
        (
            &self.delta_latency,
            &self.snapshot_bytes,
            &self.snapshot_duration,
        )
    }
}

/// The first transition: a dial failed (`Err` of the dial, or no token to dial with).
pub(super) fn dial_failed(ctx: &Context, why: Failed<'_>) {
    let link = &ctx.link;
    let (failure, state) = match why {
        Failed::Token(e) => {
            tracing::error!(error = %e, "cannot read the deployment token");
            (
                DialFailure::Token,
                format!("not connected: cannot read the deployment token: {e}"),
            )
        }
        Failed::Dial { url, prefix, error } => {
            tracing::warn!(%url, token_prefix = %prefix, error = %error, "connection to the control plane failed");
            (error.failure(), format!("not connected to {url}: {error}"))
        }
    };
    let changed = link.set_state(state.clone());
    link.dial_failures[failure.index()].fetch_add(1, Relaxed);
    if failure == DialFailure::Token {
        events::record(ctx, events::Change::TokenRejected, changed, &state);
    }
}

/// Why a dial failed, for [`dial_failed`].
pub(super) enum Failed<'a> {
    Token(&'a str),
    Dial {
        url: &'a str,
        prefix: &'a str,
        error: &'a DialError,
    },
}

/// The second: the session is up (what readiness says), not merely dialled: a token
/// revoked at once is no connection. `welcomed`: a `welcome` came (else it went on with
/// the default intervals).
pub(super) fn up(ctx: &Context, url: &str, prefix: &str, welcomed: bool) {
    let link = &ctx.link;
    tracing::info!(%url, token_prefix = %prefix, "connected to the control plane");
    let state = format!("connected to {url} (token {prefix}…)");
    let changed = link.set_state(state.clone());
    link.connected.store(true, Relaxed);
    events::record(ctx, events::Change::Connected, changed, &state);
    if welcomed {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        link.last_welcome.store(now, Relaxed);
    }
}

/// The third: the session ended as `end`. Its schedule for the next dial; `None` at
/// shutdown.
pub(super) fn ended(ctx: &Context, end: &End, prefix: &str) -> Option<Retry> {
    let link = &ctx.link;
    link.connected.store(false, Relaxed);
    let o = outcome(end, prefix);
    match end {
        End::Shutdown => tracing::info!("control-plane connection closed for shutdown"),
        End::Closed(code, reason) => match o.disconnect {
            Disconnect::Evicted => {
                tracing::warn!(code, %reason, "evicted by a newer connection for this deployment: two installs probably share one token; waiting the eviction delay before dialling again");
            }
            Disconnect::Rejected => {
                tracing::warn!(code, %reason, token_prefix = %prefix, "token rejected: revoked by the control plane");
            }
            Disconnect::TooBig => {
                let snapshot_bytes = link.last_snapshot_bytes();
                tracing::error!(code, %reason, snapshot_bytes, "the control plane refused a message as too big, most likely the snapshot: the platform must accept a message of this size (see docs/operations.md); not dialling again until the snapshot is smaller, or for an hour");
            }
            _ => tracing::warn!(code, %reason, "the control plane closed the connection"),
        },
        End::Rejected(why) => {
            tracing::warn!(error = %why, token_prefix = %prefix, "token rejected: revoked by the control plane");
        }
        End::Dead => {}
        End::Dropped(why) => tracing::warn!(error = %why, "connection to the control plane lost"),
    }
    link.disconnects[o.disconnect.index()].fetch_add(1, Relaxed);
    let changed = link.set_state(o.state.clone());
    if let Some(change) = o.change {
        events::record(ctx, change, changed, &o.state);
    }
    o.retry
}

/// A wait before the next dial begins (the reconnects' count).
pub(super) fn waiting(ctx: &Context) {
    ctx.link.reconnects.fetch_add(1, Relaxed);
}

/// How a session's end is told: the schedule of the next dial (`None`: no next dial),
/// the metric's reason, the state in words, the Event.
#[derive(Debug, PartialEq)]
pub(super) struct Outcome {
    pub retry: Option<Retry>,
    pub disconnect: Disconnect,
    pub state: String,
    pub change: Option<events::Change>,
}

/// The one mapping from a session's end to everything that follows it.
pub(super) fn outcome(end: &End, prefix: &str) -> Outcome {
    let (retry, disconnect, state) = match end {
        End::Shutdown => (
            None,
            Disconnect::Shutdown,
            "not connected: shutting down".to_owned(),
        ),
        End::Closed(code, reason) => match Retry::for_close(*code, reason) {
            Retry::Evicted => (
                Some(Retry::Evicted),
                Disconnect::Evicted,
                format!("evicted by a newer connection ({code} {reason})"),
            ),
            Retry::Rejected => (
                Some(Retry::Rejected),
                Disconnect::Rejected,
                format!("token rejected: revoked by the control plane (token {prefix}…)"),
            ),
            Retry::TooBig => (
                Some(Retry::TooBig),
                Disconnect::TooBig,
                format!(
                    "not connected: the control plane refused a message as too big ({code} {reason}); dialling again once the snapshot is smaller"
                ),
            ),
            Retry::Normal => (
                Some(Retry::Normal),
                Disconnect::Closed,
                format!("not connected: closed by the control plane ({code} {reason})"),
            ),
        },
        End::Rejected(_) => (
            Some(Retry::Rejected),
            Disconnect::Rejected,
            format!("token rejected: revoked by the control plane (token {prefix}…)"),
        ),
        End::Dead => (
            Some(Retry::Normal),
            Disconnect::Dead,
            "not connected: the connection went silent".to_owned(),
        ),
        End::Dropped(why) => (
            Some(Retry::Normal),
            Disconnect::Dropped,
            format!("not connected: connection lost ({why})"),
        ),
    };
    let change = match disconnect {
        Disconnect::Shutdown => None,
        Disconnect::Evicted => Some(events::Change::Evicted),
        Disconnect::Rejected => Some(events::Change::TokenRejected),
        _ => Some(events::Change::ConnectionLost),
    };
    Outcome {
        retry,
        disconnect,
        state,
        change,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Kind;
    use events::Change;

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

    /// Every way a session ends, over either transport, and what follows it.
    #[test]
    fn each_end_has_one_schedule_reason_state_and_event() {
        use Disconnect as D;
        use Retry as R;
        let closed = |code: u16, reason: &str| End::Closed(code, reason.into());
        type Row = (End, Option<R>, D, &'static str, Option<Change>);
        let table: Vec<Row> = vec![
            (
                End::Shutdown,
                None,
                D::Shutdown,
                "not connected: shutting down",
                None,
            ),
            (
                closed(4000, "evicted by newer connection"),
                Some(R::Evicted),
                D::Evicted,
                "evicted by a newer connection (4000 evicted by newer connection)",
                Some(Change::Evicted),
            ),
            (
                closed(1008, "Evicted by newer connection"),
                Some(R::Evicted),
                D::Evicted,
                "evicted by a newer connection (1008 Evicted by newer connection)",
                Some(Change::Evicted),
            ),
            (
                closed(4001, "token revoked"),
                Some(R::Rejected),
                D::Rejected,
                "token rejected: revoked by the control plane (token tok_ab…)",
                Some(Change::TokenRejected),
            ),
            (
                End::Rejected("token rejected (HTTP 401) for token tok_ab…".into()),
                Some(R::Rejected),
                D::Rejected,
                "token rejected: revoked by the control plane (token tok_ab…)",
                Some(Change::TokenRejected),
            ),
            (
                closed(4002, "protocol error"),
                Some(R::Normal),
                D::Closed,
                "not connected: closed by the control plane (4002 protocol error)",
                Some(Change::ConnectionLost),
            ),
            (
                closed(1009, "message too big"),
                Some(R::TooBig),
                D::TooBig,
                "not connected: the control plane refused a message as too big (1009 message too big); dialling again once the snapshot is smaller",
                Some(Change::ConnectionLost),
            ),
            (
                End::Dead,
                Some(R::Normal),
                D::Dead,
                "not connected: the connection went silent",
                Some(Change::ConnectionLost),
            ),
            (
                End::Dropped("reset by peer".into()),
                Some(R::Normal),
                D::Dropped,
                "not connected: connection lost (reset by peer)",
                Some(Change::ConnectionLost),
            ),
        ];
        for (end, retry, disconnect, state, change) in table {
            let want = Outcome {
                retry,
                disconnect,
                state: state.into(),
                change,
            };
            assert_eq!(outcome(&end, "tok_ab"), want, "{end:?}");
        }
    }
}
