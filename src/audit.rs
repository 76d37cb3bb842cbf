//! Audit events (PROTOCOL.md §7): one structured log line each, and a bounded queue that
//! holds them while the connection is down; overflow drops the oldest and is counted.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::sync::Notify;

use crate::connect::frame::AuditEvent;

/// At least the spec's 10 000.
pub const QUEUE_CAPACITY: usize = 10_000;

pub struct AuditLog {
    queue: Mutex<VecDeque<AuditEvent>>,
    capacity: usize,
    dropped: AtomicU64,
    recorded: AtomicU64,
    /// Woken when an event is queued.
    pub notify: Notify,
}

impl Default for AuditLog {
    fn default() -> Self {
        Self::with_capacity(QUEUE_CAPACITY)
    }
}

impl AuditLog {
    pub fn with_capacity(capacity: usize) -> Self {
        AuditLog {
            queue: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            notify: Notify::new(),
        }
    }

    /// Logs the event and queues it for the control plane.
    pub fn record(&self, event: AuditEvent) {
        tracing::info!(
            target: "audit",
            id = %event.id,
            action = %event.action.as_str(),
            actor = %event.actor,
            kind = %event.target.kind,
            namespace = %event.target.namespace,
            name = %event.target.name,
            detail = %serde_json::to_string(&event.detail).unwrap_or_default(),
            "audit"
        );
        self.recorded.fetch_add(1, Relaxed);
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= self.capacity {
            q.pop_front();
            self.dropped.fetch_add(1, Relaxed);
        }
        q.push_back(event);
        drop(q);
        self.notify.notify_one();
    }

    /// Takes every queued event, oldest first.
    pub fn drain(&self) -> Vec<AuditEvent> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.drain(..).collect()
    }

    /// Puts events back at the front (a send failed), keeping the bound.
    pub fn requeue(&self, events: Vec<AuditEvent>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for e in events.into_iter().rev() {
            if q.len() >= self.capacity {
                self.dropped.fetch_add(1, Relaxed);
                continue;
            }
            q.push_front(e);
        }
    }

    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

/// A v4 UUID from the system's randomness.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    // Without randomness (never seen in practice) fall back to the clock: ids stay unique
    // enough for an audit trail, and nothing may crash over it.
    let random = rustls::crypto::ring::default_provider().secure_random;
    if random.fill(&mut b).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b = nanos.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Now, RFC 3339.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::frame::{AuditAction, AuditDetail, AuditTarget};

    fn event(n: usize) -> AuditEvent {
        AuditEvent {
            id: format!("e{n}"),
            time: now_rfc3339(),
            action: AuditAction::ControlDone,
            actor: "a".into(),
            session_id: None,
            target: AuditTarget {
                kind: "Agent".into(),
                namespace: "n".into(),
                name: "x".into(),
                pod: None,
                container: None,
            },
            detail: AuditDetail::default(),
        }
    }

    #[test]
    fn overflow_drops_the_oldest_and_counts() {
        let log = AuditLog::with_capacity(3);
        for n in 0..5 {
            log.record(event(n));
        }
        assert_eq!(log.dropped(), 2);
        let ids: Vec<_> = log.drain().into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["e2", "e3", "e4"]);
        assert_eq!(log.queued(), 0);
    }

    #[test]
    fn default_capacity_is_at_least_ten_thousand() {
        let log = AuditLog::default();
        for n in 0..10_000 {
            log.record(event(n));
        }
        assert_eq!((log.queued(), log.dropped()), (10_000, 0));
    }

    #[test]
    fn logged_action_names_are_the_wire_names() {
        use AuditAction::*;
        for a in [
            SessionOpen,
            SessionClose,
            SessionDenied,
            ControlDone,
            ControlDenied,
        ] {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
    }

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = uuid_v4();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, uuid_v4());
    }
}
