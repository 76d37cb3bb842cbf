//! The audit outbox: audit events that could not be sent at once, kept in the cluster so
//! that they outlive the manager (issue 27).
//!
//! One ConfigMap, [`NAME`], in the manager's own namespace, its key [`KEY`] holding one
//! event a line (JSON Lines), oldest first. The in-memory queue (`audit::AuditLog`)
//! stays the first place of every event; the outbox is its copy in the cluster:
//!
//! - An event recorded while no connection is past its snapshot wakes the writer
//!   ([`Outbox::run`]), which waits [`BATCH`] for more, then writes every event not yet
//!   in the outbox in one replace, and writes again no sooner than [`GAP`] later. An event
//!   sent at once costs no write.
//! - The outbox holds at most [`MAX_EVENTS`] events and [`MAX_BYTES`] bytes (the API
//!   server takes objects of up to 1 MiB); past either, the oldest are dropped and
//!   counted (`autonomic_audit_outbox_dropped_total`).
//! - The manager that holds the connection next reads the outbox after its snapshot
//!   ([`Outbox::read_for_send`]) and sends its events first, in order, then its own
//!   queue; each sent event's id is removed from the outbox by the writer, in batches.
//!   Ids are kept: a crash between the send and the removal sends an event twice (the
//!   platform sees the same `id` again), never loses one.
//! - Entries are input like any other (the namespace may be writable by others): a line
//!   that is not an event within bounds is skipped and counted
//!   (`autonomic_audit_outbox_malformed_total`), never a crash.
//! - An outbox that cannot be read or written (RBAC, API server down) leaves the events
//!   in memory, as before the outbox existed, with one warning until a write succeeds.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{Notify, watch};

use crate::audit::{AuditEvent, AuditLog, OutboxCounters, bound};

/// The ConfigMap, in the manager's namespace.
pub const NAME: &str = "autonomic-audit-outbox";
/// Its one key: the events, one JSON object a line, oldest first.
pub const KEY: &str = "events.jsonl";
/// At most this many events are kept in the outbox.
pub const MAX_EVENTS: usize = 1000;
/// At most this many bytes of events: half of the API server's 1 MiB object limit.
pub const MAX_BYTES: usize = 512 * 1024;
/// A line longer than this is no event of ours (a bounded event is under 40 KiB).
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// After the first event to keep, how long the writer waits for more to join the write.
pub const BATCH: Duration = Duration::from_millis(250);
/// The least time between two writes: at most one write a second.
pub const GAP: Duration = Duration::from_secs(1);
/// After a failed write (RBAC, API server down), the wait before the next try.
pub const RETRY: Duration = Duration::from_secs(10);
/// Each read or write of the outbox gives up after this.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Conflicting writers (another replica): a write is tried this many times in a row.
const ATTEMPTS: usize = 4;

/// The outbox's text and the version it was read at.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub text: String,
    pub version: String,
}

#[derive(Debug, PartialEq)]
pub enum WriteError {
    /// Someone wrote it since it was read (or created it meanwhile): read again.
    Conflict,
    Failed(String),
}

/// Where the outbox is kept: the ConfigMap, or a stand-in in tests.
pub trait Backend: Send + Sync {
    /// `None`: there is no outbox yet.
    fn read(&self) -> BoxFuture<'_, Result<Option<Stored>, String>>;
    /// Replaces the outbox read at `version`, or creates it (`None`).
    fn write(&self, text: String, version: Option<String>)
    -> BoxFuture<'_, Result<(), WriteError>>;
}

/// The ConfigMap [`NAME`] in `namespace`: get, create, and update with the
/// resourceVersion read (the chart's Role grants no more).
pub struct ConfigMapBackend {
    api: Api<ConfigMap>,
}

impl ConfigMapBackend {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        ConfigMapBackend {
            api: Api::namespaced(client, namespace),
        }
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Backend for ConfigMapBackend {
    fn read(&self) -> BoxFuture<'_, Result<Option<Stored>, String>> {
        async move {
            let got = tokio::time::timeout(CALL_TIMEOUT, self.api.get_opt(NAME))
                .await
                .map_err(|_| "the API server did not answer in time".to_owned())?
                .map_err(|e| e.to_string())?;
            Ok(got.map(|cm| Stored {
                version: cm.metadata.resource_version.unwrap_or_default(),
                text: cm.data.and_then(|mut d| d.remove(KEY)).unwrap_or_default(),
            }))
        }
        .boxed()
    }

    fn write(
        &self,
        text: String,
        version: Option<String>,
    ) -> BoxFuture<'_, Result<(), WriteError>> {
        async move {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(NAME.into()),
                    resource_version: version.clone(),
                    labels: Some(
                        [(
                            "app.kubernetes.io/managed-by".to_owned(),
                            "autonomic-manager".to_owned(),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                data: Some([(KEY.to_owned(), text)].into()),
                ..Default::default()
            };
            let pp = PostParams::default();
            let call = async {
                match version {
                    None => self.api.create(&pp, &cm).await.map(drop),
                    Some(_) => self.api.replace(NAME, &pp, &cm).await.map(drop),
                }
            };
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Err(_) => Err(WriteError::Failed(
                    "the API server did not answer in time".into(),
                )),
                Ok(Err(e)) if conflict(&e) => Err(WriteError::Conflict),
                Ok(Err(e)) => Err(WriteError::Failed(e.to_string())),
                Ok(Ok(())) => Ok(()),
            }
        }
        .boxed()
    }
}

/// The events of the outbox's text, oldest first: each line read as an event with the
/// same bounds as any input (at most [`MAX_LINE_BYTES`], an id, its strings cut by
/// [`bound`]); anything else, and a repeated id, is skipped and counted. Of more than
/// [`MAX_EVENTS`], the oldest are dropped and counted as the writer's bound would.
pub fn parse(text: &str, counters: &OutboxCounters) -> Vec<AuditEvent> {
    let mut events = Vec::new();
    let mut ids = HashSet::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let event = (line.len() <= MAX_LINE_BYTES)
            .then(|| serde_json::from_str::<AuditEvent>(line).ok())
            .flatten()
            .filter(|e| !e.id.is_empty());
        match event {
            Some(mut e) => {
                bound(&mut e);
                if ids.insert(e.id.clone()) {
                    events.push(e);
                } else {
                    counters.malformed.fetch_add(1, Relaxed);
                }
            }
            None => {
                counters.malformed.fetch_add(1, Relaxed);
            }
        }
    }
    if events.len() > MAX_EVENTS {
        let over = events.len() - MAX_EVENTS;
        events.drain(..over);
        counters.dropped.fetch_add(over as u64, Relaxed);
    }
    events
}

/// The outbox's text for `events` (oldest first) within [`MAX_EVENTS`] and [`MAX_BYTES`],
/// and how many of the oldest did not fit.
pub fn render(events: &[AuditEvent]) -> (String, usize) {
    let mut lines: Vec<String> = Vec::new();
    let mut bytes = 0;
    // Newest first, until a bound is met.
    for e in events.iter().rev() {
        let Ok(line) = serde_json::to_string(e) else {
            continue;
        };
        if lines.len() >= MAX_EVENTS || bytes + line.len() + 1 > MAX_BYTES {
            break;
        }
        bytes += line.len() + 1;
        lines.push(line);
    }
    let dropped = events.len() - lines.len();
    let mut text = String::with_capacity(bytes);
    for line in lines.iter().rev() {
        text.push_str(line);
        text.push('\n');
    }
    (text, dropped)
}

/// The outbox of this manager: its backend, the ids sent whose removal is pending.
pub struct Outbox {
    backend: Arc<dyn Backend>,
    /// Ids sent from the outbox (or of events in it), to be removed from it.
    sent: Mutex<HashSet<String>>,
    /// Woken when ids are to be removed.
    removals: Notify,
    /// A failed write was warned about; cleared by the next good one.
    warned: AtomicBool,
    /// The version of the outbox whose malformed and surplus entries were counted: each
    /// is counted once, however often that version is read (the next write drops them).
    counted: Mutex<String>,
}

impl Outbox {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Outbox {
            backend,
            sent: Mutex::new(HashSet::new()),
            removals: Notify::new(),
            warned: AtomicBool::new(false),
            counted: Mutex::new(String::new()),
        }
    }

    /// The events of `stored`, its malformed and surplus entries counted once per
    /// version.
    fn events_of(&self, stored: &Stored, counters: &OutboxCounters) -> Vec<AuditEvent> {
        let local = OutboxCounters::default();
        let events = parse(&stored.text, &local);
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        if *counted != stored.version {
            counted.clone_from(&stored.version);
            counters
                .malformed
                .fetch_add(local.malformed.load(Relaxed), Relaxed);
            counters
                .dropped
                .fetch_add(local.dropped.load(Relaxed), Relaxed);
        }
        events
    }

    /// The outbox's events, for a connection past its snapshot to send first, but for
    /// those this manager sent already and has yet to remove (a connection may come and
    /// go within one write's gap). An outbox that cannot be read gives none (they stay
    /// for the next connection).
    pub async fn read_for_send(&self, counters: &OutboxCounters) -> Vec<AuditEvent> {
        match self.backend.read().await {
            Ok(Some(stored)) => {
                let mut events = self.events_of(&stored, counters);
                counters.events.store(events.len() as u64, Relaxed);
                let sent = self.pending_removals();
                events.retain(|e| !sent.contains(&e.id));
                events
            }
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, outbox = NAME, "cannot read the audit outbox: its events stay there for the next connection");
                Vec::new()
            }
        }
    }

    /// These ids were sent: the writer removes them from the outbox.
    pub fn sent(&self, ids: impl IntoIterator<Item = String>) {
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        let before = sent.len();
        sent.extend(ids);
        let more = sent.len() > before;
        drop(sent);
        if more {
            self.removals.notify_one();
        }
    }

    fn pending_removals(&self) -> HashSet<String> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether there is anything to write: removals, or (no connection live) queued
    /// events not yet in the outbox.
    fn has_work(&self, audit: &AuditLog) -> bool {
        !self
            .sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
            || (!audit.is_live() && !audit.unsaved().is_empty())
    }

    /// One write: the outbox read, the sent ids removed, the queued events not in it
    /// added (only while no connection is live), bounded; nothing written when nothing
    /// changed. Conflicts are read again and retried.
    pub async fn sync(&self, audit: &AuditLog) -> Result<(), String> {
        let counters = &audit.outbox;
        for _ in 0..ATTEMPTS {
            let removals = self.pending_removals();
            let add = if audit.is_live() {
                Vec::new()
            } else {
                audit.unsaved()
            };
            if removals.is_empty() && add.is_empty() {
                return Ok(());
            }
            let stored = self.backend.read().await?;
            let mut events = match &stored {
                Some(s) => self.events_of(s, counters),
                None => Vec::new(),
            };
            let (old_text, version) = match stored {
                Some(s) => (s.text, Some(s.version)),
                None => (String::new(), None),
            };
            events.retain(|e| !removals.contains(&e.id));
            let present: HashSet<String> = events.iter().map(|e| e.id.clone()).collect();
            let added: HashSet<String> = add.iter().map(|e| e.id.clone()).collect();
            events.extend(add.into_iter().filter(|e| !present.contains(&e.id)));
            let (text, dropped) = render(&events);
            let kept = events.len() - dropped;
            if text != old_text || version.is_none() && !text.is_empty() {
                match self.backend.write(text, version).await {
                    Ok(()) => {}
                    Err(WriteError::Conflict) => continue,
                    Err(WriteError::Failed(e)) => return Err(e),
                }
                counters.writes.fetch_add(1, Relaxed);
                counters.dropped.fetch_add(dropped as u64, Relaxed);
            }
            counters.events.store(kept as u64, Relaxed);
            // In the outbox now (or dropped from it, counted): not to be written again.
            audit.mark_saved(&added);
            let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
            sent.retain(|id| !removals.contains(id));
            return Ok(());
        }
        Err(format!("{ATTEMPTS} writes in a row met another writer's"))
    }

    /// The writer: keeps the outbox in step with what could not be sent, batched
    /// ([`BATCH`]) and at most one write per [`GAP`], until `stop` turns true; then one
    /// last write of what is left (bounded by [`CALL_TIMEOUT`] per call).
    pub async fn run(&self, audit: &AuditLog, mut stop: watch::Receiver<bool>) {
        loop {
            while !self.has_work(audit) {
                tokio::select! {
                    _ = audit.keep.notified() => {}
                    _ = self.removals.notified() => {}
                    () = stopped(&mut stop) => return self.last(audit).await,
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(BATCH) => {}
                () = stopped(&mut stop) => return self.last(audit).await,
            }
            let wait = match self.sync(audit).await {
                Ok(()) => {
                    if self.warned.swap(false, Relaxed) {
                        tracing::info!(outbox = NAME, "the audit outbox is written again");
                    }
                    GAP
                }
                Err(e) => {
                    if !self.warned.swap(true, Relaxed) {
                        tracing::warn!(error = %e, outbox = NAME, "cannot write the audit outbox: audit events that cannot be sent are kept in memory only (lost if the manager dies before it reconnects)");
                    } else {
                        tracing::debug!(error = %e, "the audit outbox still cannot be written");
                    }
                    RETRY
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                () = stopped(&mut stop) => return self.last(audit).await,
            }
        }
    }

    /// At shutdown: what could not be sent is written once more (sessions end with the
    /// connection, and their `session.close` is recorded after it).
    async fn last(&self, audit: &AuditLog) {
        if self.has_work(audit)
            && let Err(e) = self.sync(audit).await
        {
            tracing::warn!(error = %e, outbox = NAME, "cannot write the audit outbox at shutdown");
        }
    }
}

/// Completes when `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// An outbox in memory, for tests: counts reads and writes, fails on demand.
#[cfg(test)]
#[derive(Default)]
pub struct MemoryBackend {
    pub stored: Mutex<Option<Stored>>,
    pub writes: std::sync::atomic::AtomicU64,
    pub fail: AtomicBool,
    /// When each write happened (the paused clock).
    pub written_at: Mutex<Vec<tokio::time::Instant>>,
}

#[cfg(test)]
impl MemoryBackend {
    pub fn text(&self) -> String {
        self.stored
            .lock()
            .unwrap()
            .as_ref()
            .map(|s| s.text.clone())
            .unwrap_or_default()
    }

    pub fn set_text(&self, text: &str) {
        let mut s = self.stored.lock().unwrap();
        let version = s.as_ref().map_or(0, |s| s.version.parse::<u64>().unwrap()) + 1;
        *s = Some(Stored {
            text: text.into(),
            version: version.to_string(),
        });
    }
}

#[cfg(test)]
impl Backend for MemoryBackend {
    fn read(&self) -> BoxFuture<'_, Result<Option<Stored>, String>> {
        let r = if self.fail.load(Relaxed) {
            Err("forbidden".to_owned())
        } else {
            Ok(self.stored.lock().unwrap().clone())
        };
        async move { r }.boxed()
    }

    fn write(
        &self,
        text: String,
        version: Option<String>,
    ) -> BoxFuture<'_, Result<(), WriteError>> {
        let r = if self.fail.load(Relaxed) {
            Err(WriteError::Failed("forbidden".into()))
        } else {
            let mut s = self.stored.lock().unwrap();
            let current = s.as_ref().map(|s| s.version.clone());
            if current != version {
                Err(WriteError::Conflict)
            } else {
                let next = current.map_or(0, |v| v.parse::<u64>().unwrap()) + 1;
                *s = Some(Stored {
                    text,
                    version: next.to_string(),
                });
                self.writes.fetch_add(1, Relaxed);
                self.written_at
                    .lock()
                    .unwrap()
                    .push(tokio::time::Instant::now());
                Ok(())
            }
        };
        async move { r }.boxed()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::audit::{AuditAction, AuditDetail, AuditTarget};
    use std::sync::atomic::AtomicU64;
    use tokio::time::Instant;

    pub(crate) fn event(id: &str) -> AuditEvent {
        AuditEvent {
            id: id.into(),
            time: "2026-12-04T18:00:00Z".into(),
            action: AuditAction::ControlDone,
            actor: "ada@example.com".into(),
            session_id: None,
            target: AuditTarget {
                kind: "Agent".into(),
                namespace: "team".into(),
                name: "triage".into(),
                pod: None,
                container: None,
            },
            detail: AuditDetail {
                command: Some(vec!["restart".into()]),
                ..Default::default()
            },
        }
    }

    fn ids(events: &[AuditEvent]) -> Vec<String> {
        events.iter().map(|e| e.id.clone()).collect()
    }

    fn n(a: &AtomicU64) -> u64 {
        a.load(Relaxed)
    }

    #[test]
    fn malformed_entries_are_skipped_and_counted() {
        let counters = OutboxCounters::default();
        let good = |id: &str| serde_json::to_string(&event(id)).unwrap();
        let huge = format!(
            r#"{{"id":"big","time":"t","action":"control.done","actor":"{}","target":{{"kind":"Agent","namespace":"n","name":"x"}}}}"#,
            "a".repeat(MAX_LINE_BYTES)
        );
        let long_actor = good("cut").replace("ada@example.com", &"b".repeat(10_000));
        let text = [
            good("a"),
            "not json".into(),
            "{}".into(),
            r#"{"id":"x","action":"session.exploded"}"#.into(),
            good("b").replace(r#""id":"b""#, r#""id":"""#),
            huge,
            good("a"),
            String::new(),
            long_actor,
            "[1,2,3]".into(),
            good("c"),
        ]
        .join("\n");
        let events = parse(&text, &counters);
        assert_eq!(ids(&events), ["a", "cut", "c"]);
        // Not json, {}, an unknown action, an empty id, a line too long, a repeated id,
        // an array.
        assert_eq!(n(&counters.malformed), 7);
        // Read with the bounds of any input: the actor is cut.
        assert!(events[1].actor.len() <= crate::text::MAX_ID_BYTES + 8);
        assert_eq!(n(&counters.dropped), 0);
    }

    #[test]
    fn the_bound_keeps_the_newest_within_count_and_bytes() {
        let events: Vec<_> = (0..20_000).map(|i| event(&format!("e{i:05}"))).collect();
        let (text, dropped) = render(&events);
        assert!(text.len() <= MAX_BYTES, "{} bytes", text.len());
        assert_eq!(text.lines().count(), MAX_EVENTS);
        assert_eq!(dropped, 20_000 - MAX_EVENTS);
        let counters = OutboxCounters::default();
        let kept = parse(&text, &counters);
        assert_eq!(kept.first().unwrap().id, "e19000");
        assert_eq!(kept.last().unwrap().id, "e19999");
        assert_eq!(n(&counters.malformed), 0);

        // Big events: the byte bound holds before the count's.
        let mut big = event("x");
        big.detail.reason = Some("r".repeat(crate::text::MAX_TEXT_BYTES));
        // The largest event a bound allows: about 33 KiB.
        big.detail.command = Some(vec![
            "c".repeat(crate::text::MAX_TEXT_BYTES);
            crate::audit::MAX_COMMAND_ARGS
        ]);
        let bigs: Vec<_> = (0..200)
            .map(|i| AuditEvent {
                id: format!("b{i}"),
                ..big.clone()
            })
            .collect();
        let (text, dropped) = render(&bigs);
        assert!(text.len() <= MAX_BYTES && text.len() > MAX_BYTES / 2);
        assert_eq!(text.lines().count() + dropped, 200);
        assert!(dropped > 0);

        // More than the count in a stored outbox (someone else's): the oldest dropped.
        let lines: String = (0..MAX_EVENTS + 5)
            .map(|i| serde_json::to_string(&event(&format!("s{i}"))).unwrap() + "\n")
            .collect();
        let counters = OutboxCounters::default();
        let read = parse(&lines, &counters);
        assert_eq!((read.len(), n(&counters.dropped)), (MAX_EVENTS, 5));
        assert_eq!(read[0].id, "s5");
    }

    /// The log lines written while its guard lives (this thread: the paused clock's
    /// runtime runs every task on it).
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Logs {
        fn set_default(&self) -> tracing::subscriber::DefaultGuard {
            let writer = self.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_default(subscriber)
        }

        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }

        fn count(&self, needle: &str) -> usize {
            self.text().matches(needle).count()
        }
    }

    fn outbox() -> (Arc<MemoryBackend>, Arc<Outbox>) {
        let backend = Arc::new(MemoryBackend::default());
        (backend.clone(), Arc::new(Outbox::new(backend)))
    }

    fn writer(
        outbox: &Arc<Outbox>,
        audit: &Arc<AuditLog>,
    ) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, stopping) = watch::channel(false);
        let (o, a) = (outbox.clone(), audit.clone());
        let task = tokio::spawn(async move { o.run(&a, stopping).await });
        (stop, task)
    }

    #[tokio::test(start_paused = true)]
    async fn writes_are_batched_and_at_most_one_a_second() {
        let (backend, outbox) = outbox();
        let audit = Arc::new(AuditLog::default());
        let (_stop, _task) = writer(&outbox, &audit);
        let start = Instant::now();
        // 100 events in 100 ms: one write, BATCH after the first.
        for i in 0..100 {
            audit.record(event(&format!("a{i}")));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(*backend.written_at.lock().unwrap(), [start + BATCH]);
        assert_eq!(backend.text().lines().count(), 100);
        assert!(audit.unsaved().is_empty());
        assert_eq!(
            audit.queued(),
            100,
            "still queued in memory, for this process"
        );

        // An event every 10 ms for 10 s: at most one write a second, none lost.
        for i in 0..1000 {
            audit.record(event(&format!("b{i}")));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let at = backend.written_at.lock().unwrap().clone();
        assert!(at.len() <= 1 + 11, "{} writes", at.len());
        for pair in at.windows(2) {
            assert!(pair[1] - pair[0] >= GAP + BATCH, "{:?}", pair[1] - pair[0]);
        }
        let stored = parse(&backend.text(), &audit.outbox);
        assert_eq!(stored.len(), MAX_EVENTS);
        assert_eq!(stored.last().unwrap().id, "b999");
        assert_eq!(n(&audit.outbox.dropped), 100);
        assert_eq!(n(&audit.outbox.writes), at.len() as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_written_for_events_sent_at_once() {
        let (backend, outbox) = outbox();
        let audit = Arc::new(AuditLog::default());
        let (_stop, _task) = writer(&outbox, &audit);
        audit.set_live(true);
        for i in 0..100 {
            audit.record(event(&format!("a{i}")));
            // The session sends them.
            audit.drain_queued();
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(n(&backend.writes), 0);
        assert!(backend.stored.lock().unwrap().is_none(), "not even created");

        // The connection ends with an event it could not send: kept.
        audit.record(event("late"));
        audit.set_live(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(ids(&parse(&backend.text(), &audit.outbox)), ["late"]);
    }

    #[tokio::test(start_paused = true)]
    async fn sent_events_are_removed_and_others_writers_entries_kept() {
        let (backend, outbox) = outbox();
        let audit = Arc::new(AuditLog::default());
        // Another manager's events, and a line that is none.
        let line = |id: &str| serde_json::to_string(&event(id)).unwrap();
        backend.set_text(&format!("{}\ngarbage\n{}\n", line("p1"), line("p2")));
        let (_stop, _task) = writer(&outbox, &audit);
        audit.record(event("o1"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            ids(&parse(&backend.text(), &OutboxCounters::default())),
            ["p1", "p2", "o1"]
        );
        assert!(n(&audit.outbox.malformed) >= 1);
        // A session sent p1 and o1: removed in one write; the malformed line goes too.
        audit.set_live(true);
        outbox.sent(["p1".to_owned(), "o1".to_owned()]);
        let writes = n(&backend.writes);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(n(&backend.writes), writes + 1);
        assert_eq!(backend.text(), line("p2") + "\n");
        assert_eq!(n(&audit.outbox.events), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflicting_write_is_read_again_and_merged() {
        let (backend, outbox) = outbox();
        let audit = AuditLog::default();
        audit.record(event("mine"));
        backend.set_text("");
        // The other replica writes between our read and our write: we read again.
        struct Racing {
            inner: Arc<MemoryBackend>,
            raced: AtomicBool,
        }
        impl Backend for Racing {
            fn read(&self) -> BoxFuture<'_, Result<Option<Stored>, String>> {
                let r = self.inner.stored.lock().unwrap().clone();
                if !self.raced.swap(true, Relaxed) {
                    let line = serde_json::to_string(&event("theirs")).unwrap();
                    self.inner.set_text(&(line + "\n"));
                }
                async move { Ok(r) }.boxed()
            }
            fn write(
                &self,
                text: String,
                version: Option<String>,
            ) -> BoxFuture<'_, Result<(), WriteError>> {
                self.inner.write(text, version)
            }
        }
        let racing = Outbox::new(Arc::new(Racing {
            inner: backend.clone(),
            raced: AtomicBool::new(false),
        }));
        racing.sync(&audit).await.unwrap();
        drop(outbox);
        assert_eq!(
            ids(&parse(&backend.text(), &OutboxCounters::default())),
            ["theirs", "mine"]
        );
    }

    /// The writer chose an event while no connection was live and is writing it when a
    /// session sends it (the session puts every id of its backlog up for removal): the
    /// next write takes it out again, so no later connection sends it twice.
    #[tokio::test(start_paused = true)]
    async fn an_event_sent_while_the_writer_writes_it_is_removed_after() {
        struct Gated {
            inner: Arc<MemoryBackend>,
            gate: Arc<tokio::sync::Semaphore>,
        }
        impl Backend for Gated {
            fn read(&self) -> BoxFuture<'_, Result<Option<Stored>, String>> {
                async move {
                    self.gate.acquire().await.unwrap().forget();
                    self.inner.read().await
                }
                .boxed()
            }
            fn write(
                &self,
                text: String,
                version: Option<String>,
            ) -> BoxFuture<'_, Result<(), WriteError>> {
                self.inner.write(text, version)
            }
        }
        let backend = Arc::new(MemoryBackend::default());
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let outbox = Arc::new(Outbox::new(Arc::new(Gated {
            inner: backend.clone(),
            gate: gate.clone(),
        })));
        let audit = Arc::new(AuditLog::default());
        let (_stop, _task) = writer(&outbox, &audit);
        audit.record(event("x"));
        // The writer has chosen x and waits on its read.
        tokio::time::sleep(BATCH * 2).await;
        // A session gets past its snapshot and sends its backlog, x among it.
        audit.set_live(true);
        let backlog = audit.drain_queued();
        outbox.sent(backlog.into_iter().map(|q| q.event.id));
        gate.add_permits(1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(ids(&parse(&backend.text(), &audit.outbox)), ["x"]);
        // A next connection within the gap reads the outbox: x was sent, not again.
        gate.add_permits(1);
        assert!(outbox.read_for_send(&audit.outbox).await.is_empty());
        // The next write, a GAP later, removes it.
        gate.add_permits(1);
        tokio::time::sleep(GAP + BATCH).await;
        assert_eq!(backend.text(), "");
        assert!(outbox.pending_removals().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_outbox_that_cannot_be_written_warns_once_and_keeps_memory() {
        let (backend, outbox) = outbox();
        backend.fail.store(true, Relaxed);
        let audit = Arc::new(AuditLog::default());
        let logs = Logs::default();
        let _guard = logs.set_default();
        let (_stop, _task) = writer(&outbox, &audit);
        for i in 0..50 {
            audit.record(event(&format!("a{i}")));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let warnings = logs.count("cannot write the audit outbox");
        assert_eq!(warnings, 1, "{}", logs.text());
        assert_eq!((audit.queued(), audit.unsaved().len()), (50, 50));
        // Tried again every RETRY, not at every event.
        assert_eq!(n(&backend.writes), 0);
        // Writable again: everything kept in memory reaches it.
        backend.fail.store(false, Relaxed);
        tokio::time::sleep(RETRY + GAP).await;
        assert_eq!(parse(&backend.text(), &audit.outbox).len(), 50);
        assert_eq!(logs.count("cannot write the audit outbox"), 1);
        assert_eq!(logs.count("the audit outbox is written again"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_left_at_shutdown_is_written_once_more() {
        let (backend, outbox) = outbox();
        let audit = Arc::new(AuditLog::default());
        let (stop, task) = writer(&outbox, &audit);
        audit.record(event("close"));
        // Stopped within the batch window: written anyway, at once.
        stop.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(ids(&parse(&backend.text(), &audit.outbox)), ["close"]);
    }
}
