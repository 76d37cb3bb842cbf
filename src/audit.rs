//! Audit events (PROTOCOL.md §7): one structured log line each, and a bounded queue that
//! holds them while the connection is down; overflow drops the oldest and is counted.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::text::{CUT_MARK, MAX_ID_BYTES, MAX_TEXT_BYTES, cap_utf8_marked};

/// §7: one session open, close or denial, or one `control` done or refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Unique per event.
    pub id: String,
    /// RFC 3339.
    pub time: String,
    pub action: AuditAction,
    pub actor: String,
    /// Set for session events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub target: AuditTarget,
    #[serde(default)]
    pub detail: AuditDetail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuditAction {
    #[serde(rename = "session.open")]
    SessionOpen,
    #[serde(rename = "session.close")]
    SessionClose,
    #[serde(rename = "session.denied")]
    SessionDenied,
    #[serde(rename = "control.done")]
    ControlDone,
    #[serde(rename = "control.denied")]
    ControlDenied,
}

impl AuditAction {
    /// The wire name, e.g. `session.close`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::SessionOpen => "session.open",
            AuditAction::SessionClose => "session.close",
            AuditAction::SessionDenied => "session.denied",
            AuditAction::ControlDone => "control.done",
            AuditAction::ControlDenied => "control.denied",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditTarget {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// What is known about the event; each field only where it applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// At least the spec's 10 000.
pub const QUEUE_CAPACITY: usize = 10_000;

/// What the queued events may cost in memory, together (TRUST.md §5): 10 000 typical
/// events take about 5 MiB, 10 000 of the largest size ([`bound`]) would take about
/// 400 MiB; past this the oldest go.
pub const QUEUE_MAX_BYTES: usize = 8 << 20;

/// An event's cost in memory: the queued structure itself (its strings' headers are in
/// it) and what its strings hold on the heap, with a header for each argument of the
/// command (those live on the heap too).
pub fn cost(event: &AuditEvent) -> usize {
    let t = &event.target;
    let d = &event.detail;
    let text = [
        &event.id,
        &event.time,
        &event.actor,
        &t.kind,
        &t.namespace,
        &t.name,
    ]
    .into_iter()
    .chain(
        [&event.session_id, &t.pod, &t.container, &d.reason]
            .into_iter()
            .flatten(),
    )
    .map(String::len)
    .sum::<usize>();
    let command = d
        .command
        .iter()
        .flatten()
        .map(|a| std::mem::size_of::<String>() + a.len())
        .sum::<usize>();
    std::mem::size_of::<Queued>() + text + command
}

/// Arguments of a command kept in an audit event; more are replaced by one [`CUT_MARK`].
pub const MAX_COMMAND_ARGS: usize = 32;

/// Cuts an event's strings so that it is bounded whatever its source: identifiers
/// (actor, session id, target names) to [`MAX_ID_BYTES`], free text (reason, each
/// command argument) to [`MAX_TEXT_BYTES`], the command to [`MAX_COMMAND_ARGS`]
/// arguments. An event is then at most about 40 KiB of JSON. The frame decoder already
/// cuts what the control plane sends; this also covers what the manager adds.
pub fn bound(event: &mut AuditEvent) {
    let id = |s: &mut String| cap_utf8_marked(s, MAX_ID_BYTES);
    let text = |s: &mut String| cap_utf8_marked(s, MAX_TEXT_BYTES);
    id(&mut event.id);
    id(&mut event.time);
    id(&mut event.actor);
    let t = &mut event.target;
    for s in [&mut t.kind, &mut t.namespace, &mut t.name] {
        id(s);
    }
    for s in [&mut event.session_id, &mut t.pod, &mut t.container]
        .into_iter()
        .flatten()
    {
        id(s);
    }
    let d = &mut event.detail;
    if let Some(reason) = &mut d.reason {
        text(reason);
    }
    if let Some(command) = &mut d.command {
        if command.len() > MAX_COMMAND_ARGS {
            command.truncate(MAX_COMMAND_ARGS - 1);
            command.push(CUT_MARK.to_owned());
        }
        command.iter_mut().for_each(text);
    }
}

/// A queued event, and whether it is also in the in-cluster outbox (`connect::outbox`).
#[derive(Debug, Clone, PartialEq)]
pub struct Queued {
    pub event: AuditEvent,
    /// Written to the outbox: once sent, it is to be removed from there.
    pub saved: bool,
}

/// The queue and what its events cost ([`cost`]).
#[derive(Default)]
struct Queue {
    events: VecDeque<Queued>,
    bytes: usize,
}

impl Queue {
    fn push_back(&mut self, e: Queued) {
        self.bytes += cost(&e.event);
        self.events.push_back(e);
    }

    fn push_front(&mut self, e: Queued) {
        self.bytes += cost(&e.event);
        self.events.push_front(e);
    }

    fn pop_front(&mut self) {
        if let Some(e) = self.events.pop_front() {
            self.bytes -= cost(&e.event);
        }
    }

    fn drain(&mut self) -> Vec<Queued> {
        self.bytes = 0;
        self.events.drain(..).collect()
    }
}

pub struct AuditLog {
    queue: Mutex<Queue>,
    capacity: usize,
    max_bytes: usize,
    dropped: AtomicU64,
    recorded: AtomicU64,
    /// A connection is up and past its snapshot: an event recorded now is sent at once.
    live: AtomicBool,
    /// Woken when an event is queued.
    pub notify: Notify,
    /// Woken when an event is queued that cannot be sent at once, or when the connection
    /// ends with events queued: the outbox's writer keeps them in the cluster.
    pub keep: Notify,
    /// The outbox's figures, for `/metrics`.
    pub outbox: OutboxCounters,
}

/// What the outbox did, counted.
#[derive(Default)]
pub struct OutboxCounters {
    /// Events dropped from the outbox because it was full (the oldest first).
    pub dropped: AtomicU64,
    /// Entries of the outbox that could not be read as an event, skipped.
    pub malformed: AtomicU64,
    /// Writes of the outbox (each a batch).
    pub writes: AtomicU64,
    /// Events in the outbox as last read or written.
    pub events: AtomicU64,
    /// Events sent from the outbox (written by this or an earlier manager).
    pub delivered: AtomicU64,
}

impl Default for AuditLog {
    fn default() -> Self {
        Self::with_capacity(QUEUE_CAPACITY)
    }
}

impl AuditLog {
    pub fn with_capacity(capacity: usize) -> Self {
        AuditLog {
            queue: Mutex::new(Queue::default()),
            capacity: capacity.max(1),
            max_bytes: QUEUE_MAX_BYTES,
            dropped: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            live: AtomicBool::new(false),
            notify: Notify::new(),
            keep: Notify::new(),
            outbox: OutboxCounters::default(),
        }
    }

    /// Logs the event and queues it for the control plane, both [`bound`]ed.
    pub fn record(&self, mut event: AuditEvent) {
        bound(&mut event);
        tracing::info!(
            target: "audit",
            id = %event.id,
            action = %event.action.as_str(),
            actor = %event.actor,
            // Absent from the line where the event has none (control events).
            session_id = event.session_id.as_deref(),
            kind = %event.target.kind,
            namespace = %event.target.namespace,
            name = %event.target.name,
            pod = event.target.pod.as_deref(),
            container = event.target.container.as_deref(),
            detail = %serde_json::to_string(&event.detail).unwrap_or_default(),
            "audit"
        );
        self.recorded.fetch_add(1, Relaxed);
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(Queued {
            event,
            saved: false,
        });
        // The oldest go first, past the count or the bytes (the newest always stays).
        while q.events.len() > self.capacity || (q.bytes > self.max_bytes && q.events.len() > 1) {
            q.pop_front();
            self.dropped.fetch_add(1, Relaxed);
        }
        drop(q);
        self.notify.notify_one();
        if !self.is_live() {
            self.keep.notify_one();
        }
    }

    /// Takes every queued event, oldest first.
    pub fn drain(&self) -> Vec<AuditEvent> {
        self.drain_queued().into_iter().map(|q| q.event).collect()
    }

    /// Takes every queued event with whether it is in the outbox, oldest first.
    pub fn drain_queued(&self) -> Vec<Queued> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.drain()
    }

    /// Puts events back at the front (a send failed), keeping the bound.
    pub fn requeue(&self, events: Vec<AuditEvent>) {
        self.requeue_queued(
            events
                .into_iter()
                .map(|event| Queued {
                    event,
                    saved: false,
                })
                .collect(),
        );
    }

    /// Puts events back at the front (a send failed), keeping the bound.
    pub fn requeue_queued(&self, events: Vec<Queued>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for e in events.into_iter().rev() {
            if q.events.len() >= self.capacity || q.bytes + cost(&e.event) > self.max_bytes {
                self.dropped.fetch_add(1, Relaxed);
                continue;
            }
            q.push_front(e);
        }
        let unsaved = q.events.iter().any(|e| !e.saved);
        drop(q);
        if unsaved && !self.is_live() {
            self.keep.notify_one();
        }
    }

    /// The queued events not yet in the outbox, oldest first (copies: they stay queued).
    pub fn unsaved(&self) -> Vec<AuditEvent> {
        let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.events
            .iter()
            .filter(|e| !e.saved)
            .map(|e| e.event.clone())
            .collect()
    }

    /// The events of these ids are in the outbox now.
    pub fn mark_saved(&self, ids: &std::collections::HashSet<String>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        for e in q.events.iter_mut().filter(|e| ids.contains(&e.event.id)) {
            e.saved = true;
        }
    }

    /// A connection is up and past its snapshot (`true`), or it ended (`false`): the
    /// writer of the outbox is woken when events wait.
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Relaxed);
        if !live && self.queued() > 0 {
            self.keep.notify_one();
        }
    }

    pub fn is_live(&self) -> bool {
        self.live.load(Relaxed)
    }

    pub fn queued(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .len()
    }

    /// What the queued events cost in memory ([`cost`]).
    pub fn queued_bytes(&self) -> usize {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

/// Now, RFC 3339.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::uuid_v4;

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

    /// A `Write` into a shared buffer, for a JSON subscriber's output.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The `fields` of each JSON log line `f` writes with target `audit`.
    fn audit_lines(f: impl FnOnce()) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|l| l["target"] == "audit")
            .map(|l| l["fields"].as_object().unwrap().clone())
            .collect()
    }

    use crate::text::assert_cut;

    #[test]
    fn megabyte_strings_are_bounded_in_the_event_and_the_log_line() {
        // The lead byte puts each cut inside a multi-byte character.
        for (unit, lead) in [("x", 0), ("é", 1), ("€", 1), ("€", 2), ("🦀", 3)] {
            let big = format!(
                "{}{}",
                "a".repeat(lead),
                unit.repeat((1 << 20) / unit.len())
            );
            let mut e = event(0);
            e.action = AuditAction::SessionClose;
            e.actor = big.clone();
            e.session_id = Some(big.clone());
            e.target.pod = Some(big.clone());
            e.target.container = Some(big.clone());
            e.detail.reason = Some(big.clone());
            e.detail.command = Some(vec![big.clone(); MAX_COMMAND_ARGS + 8]);
            let log = AuditLog::default();
            let lines = audit_lines(|| log.record(e));
            let e = log.drain().pop().unwrap();
            assert_cut(&e.actor, &big, MAX_ID_BYTES);
            assert_cut(e.session_id.as_deref().unwrap(), &big, MAX_ID_BYTES);
            assert_cut(e.target.pod.as_deref().unwrap(), &big, MAX_ID_BYTES);
            assert_cut(e.target.container.as_deref().unwrap(), &big, MAX_ID_BYTES);
            assert_cut(e.detail.reason.as_deref().unwrap(), &big, MAX_TEXT_BYTES);
            let command = e.detail.command.as_deref().unwrap();
            assert_eq!(command.len(), MAX_COMMAND_ARGS);
            assert_eq!(command.last().unwrap(), CUT_MARK);
            for arg in &command[..MAX_COMMAND_ARGS - 1] {
                assert_cut(arg, &big, MAX_TEXT_BYTES);
            }
            assert!(serde_json::to_string(&e).unwrap().len() < 40 << 10);

            let [line] = &lines[..] else {
                panic!("one audit line, got {lines:?}");
            };
            for name in ["actor", "session_id", "pod", "container"] {
                assert_cut(line[name].as_str().unwrap(), &big, MAX_ID_BYTES);
            }
            let detail: AuditDetail =
                serde_json::from_str(line["detail"].as_str().unwrap()).unwrap();
            assert_eq!(detail, e.detail);
            let text = serde_json::to_string(line).unwrap();
            assert!(text.len() < 40 << 10, "a log line of {} bytes", text.len());
        }
    }

    #[test]
    fn the_log_line_names_the_session_pod_and_container_when_known() {
        let log = AuditLog::default();
        let mut session = event(1);
        session.action = AuditAction::SessionOpen;
        session.actor = "ada@example.com".into();
        session.session_id = Some("s-1".into());
        session.target.pod = Some("x-0".into());
        session.target.container = Some("runtime".into());
        let lines = audit_lines(|| {
            log.record(session);
            log.record(event(2));
        });
        let [session, control] = &lines[..] else {
            panic!("two audit lines, got {lines:?}");
        };
        let field = |line: &serde_json::Map<_, _>, name: &str| {
            line.get(name)
                .and_then(|v: &serde_json::Value| v.as_str())
                .map(str::to_owned)
        };
        for (name, want) in [
            ("action", "session.open"),
            ("actor", "ada@example.com"),
            ("session_id", "s-1"),
            ("pod", "x-0"),
            ("container", "runtime"),
        ] {
            assert_eq!(field(session, name).as_deref(), Some(want), "{name}");
        }
        assert_eq!(field(control, "action").as_deref(), Some("control.done"));
        for absent in ["session_id", "pod", "container"] {
            assert!(!control.contains_key(absent), "{absent} in {control:?}");
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

    /// TRUST.md §5: the largest events the platform can cause (a denied `io_open` of
    /// many long arguments), queued while nothing can be sent: the queue stays within
    /// 8 MiB of memory, drops the oldest and counts them; a requeue keeps the bound too.
    #[test]
    fn the_queue_keeps_its_bytes_bound() {
        let log = AuditLog::default();
        let big = |n: usize| {
            let mut e = event(n);
            e.actor = "a".repeat(10_000);
            e.detail.command = Some(vec!["x".repeat(10_000); 100]);
            e.detail.reason = Some("r".repeat(10_000));
            e
        };
        for n in 0..2_000 {
            log.record(big(n));
        }
        let one = {
            let mut e = big(0);
            bound(&mut e);
            cost(&e)
        };
        assert!(
            (30_000..45_000).contains(&one),
            "an event of the largest size costs {one}"
        );
        assert!(
            log.queued_bytes() <= QUEUE_MAX_BYTES,
            "{}",
            log.queued_bytes()
        );
        let kept = log.queued();
        assert!(kept.abs_diff(QUEUE_MAX_BYTES / one) <= 1, "{kept} kept");
        assert_eq!(log.dropped(), 2_000 - kept as u64);
        let events = log.drain();
        assert_eq!(events.last().unwrap().id, "e1999", "the newest kept");
        assert_eq!(log.queued_bytes(), 0);
        // Put back with more than fits: the bound holds, the rest counted.
        let mut twice = events.clone();
        twice.extend(events);
        let dropped = log.dropped();
        log.requeue(twice);
        assert!(log.queued_bytes() <= QUEUE_MAX_BYTES);
        assert!(log.queued() >= kept);
        assert_eq!(
            log.queued() as u64 + log.dropped() - dropped,
            2 * kept as u64
        );
    }

    /// PROTOCOL.md §7 wants at least 10 000 events kept, TRUST.md §5 at most 8 MiB: a
    /// typical event (a denied shell, names of ordinary length) fits 10 000 times.
    #[test]
    fn ten_thousand_typical_events_fit_in_the_bytes_bound() {
        let mut e = event(0);
        e.id = uuid_v4();
        e.action = AuditAction::SessionDenied;
        e.actor = "alice.sommerville@example.com".into();
        e.session_id = Some(uuid_v4());
        e.target.namespace = "team-analytics-prod".into();
        e.target.name = "nightly-report-writer".into();
        e.target.pod = Some("nightly-report-writer".into());
        e.target.container = Some("runtime".into());
        e.detail.command = Some(vec!["/bin/sh".into(), "-l".into()]);
        e.detail.reason =
            Some("agent team-analytics-prod/nightly-report-writer is Pending, not Active".into());
        let one = cost(&e);
        assert!(
            QUEUE_CAPACITY * one <= QUEUE_MAX_BYTES,
            "{one} bytes an event"
        );
        let log = AuditLog::default();
        for _ in 0..QUEUE_CAPACITY + 10 {
            log.record(e.clone());
        }
        assert_eq!(log.queued(), QUEUE_CAPACITY);
        assert_eq!(log.dropped(), 10);
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
}
