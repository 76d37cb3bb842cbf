//! One watched source feeding one cache for good: list, then watch from the list's
//! version, resume, relist on 410 Gone.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Client, Resource, ResourceExt};

use crate::backoff::{Backoff, system_random};
use crate::store::cache::{Slot, slot, slot_of};
use crate::store::list::{Listed, PAGE};
use crate::store::{Cache, OFFER_SELECTOR, Store};

/// A watch request's server-side timeout; a stream that brings nothing (no event, no
/// bookmark) for a little longer is taken for dead and the watch resumed.
const WATCH_TIMEOUT_S: u32 = 290;
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_TIMEOUT_S as u64 + 10);

/// The waits between failed lists or watches (kube's watcher waited 0.8 s to 30 s).
const RETRY_FIRST: Duration = Duration::from_millis(800);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Where one watch reads: a type's objects in one namespace (or all), with a selector;
/// or the one cluster-scoped object `name`.
pub(super) struct Source {
    client: Client,
    scope: Option<String>,
    name: Option<String>,
    selector: Option<String>,
    /// A watch the RBAC refuses runs as one that listed nothing (and keeps retrying):
    /// what it would bring only widens what the manager does (offers, namespace labels).
    refusable: bool,
}

impl Source {
    /// A namespaced kind's objects in `scope` (or every namespace), with `selector`. The
    /// offer watches (TRUST.md §2) may be refused (a binary upgraded under an older
    /// chart's RBAC): the manager then runs with nothing offered, the safe side, rather
    /// than reconcile nothing at all.
    pub(super) fn namespaced(
        client: &Client,
        scope: Option<String>,
        selector: Option<&str>,
    ) -> Source {
        Source {
            client: client.clone(),
            scope,
            name: None,
            selector: selector.map(str::to_owned),
            refusable: selector == Some(OFFER_SELECTOR),
        }
    }

    /// A cluster-scoped kind's object `name` (or all of them): the namespaces, whose
    /// labels only widen what the manager does (TRUST.md §1, §2), so that a refused
    /// watch leaves every namespace at the configured level and the offer rule.
    pub(super) fn cluster_scoped(client: &Client, name: Option<String>) -> Source {
        Source {
            client: client.clone(),
            scope: None,
            name,
            selector: None,
            refusable: true,
        }
    }

    fn fields(&self) -> Option<String> {
        self.name.as_ref().map(|n| format!("metadata.name={n}"))
    }

    /// Whether a cache entry is this source's to prune when a list did not bring it.
    fn holds(&self, key: &str) -> bool {
        match (&self.name, &self.scope) {
            (Some(name), _) => key == &*slot("", name),
            (None, Some(ns)) => key.starts_with(&*slot(ns, "")),
            (None, None) => true,
        }
    }
}

/// Whether a list failed because the manager may not list that kind.
fn forbidden(err: &crate::store::list::ListError) -> bool {
    matches!(err, crate::store::list::ListError::Api(kube::Error::Api(s)) if s.code == 403)
}

/// How a watch ended: the server's timeout or silence (resume from the last version
/// seen), 410 Gone (list again), or a failure (resume after the backoff's wait).
enum End {
    Resume,
    Relist,
    Failed,
}

/// The end a watch request's or stream's error makes, logged.
fn ended_by(err: &kube::Error) -> End {
    match err {
        kube::Error::Api(status) => expired_or_failed(status),
        _ => {
            tracing::warn!(error = %err, "watch failed, retrying");
            End::Failed
        }
    }
}

/// The end a status from the API server makes (an error response, or an `ERROR` event),
/// logged: 410 Gone relists, anything else is a failure.
fn expired_or_failed(s: &kube::core::Status) -> End {
    if s.code == 410 {
        tracing::warn!(reason = %s.reason, message = %s.message, "watch expired (410 Gone): relisting");
        End::Relist
    } else {
        tracing::warn!(code = s.code, reason = %s.reason, message = %s.message, "watch failed, retrying");
        End::Failed
    }
}

/// Feeds one cache from one source for good: lists (the first time, for the custom
/// resources and pods, from the API server's watch cache, whole; otherwise from etcd,
/// in pages), then watches from
/// the list's version, resuming after each end, stall or failure (with backoff) and
/// listing again on 410. `on_change` runs for every change, in order, with `true` for a
/// removal; a list's objects are upserted as they arrive and what it did not bring is
/// pruned at its end, so the cache is never empty meanwhile.
///
/// The stream is counted in the sync gate when `drive` is called, not when its future
/// first runs: otherwise the gate could say "synced" while a spawned stream has not
/// started (a Tool decided before the Agent watch listed would see no users).
pub(super) fn drive<K>(
    source: Source,
    wire: bool,
    store: Arc<Store>,
    cache: fn(&Store) -> &Cache<K>,
    on_change: impl Fn(&K, bool) + Send + Sync,
) -> impl Future<Output = ()> + Send
where
    K: Resource<DynamicType = ()> + ResourceExt + Clone + Listed + Debug + Send + Sync + 'static,
{
    store.synced.expect();
    if wire {
        store.wire_synced.expect();
    }
    async move {
        if !wire {
            // Secrets and Services list once the wire form's watches have, and the
            // first snapshot is out (`Store::later`): on a busy API server they would
            // slow both, and nothing but the reconcilers waits for them.
            store.wire_synced.wait().await;
            store.later.wait().await;
        }
        let path = K::url_path(&(), source.scope.as_deref());
        let mut feed = Feed {
            request: kube::core::Request::new(&path),
            path,
            source,
            wire,
            store,
            cache,
            on_change,
            retry: Backoff::new(RETRY_FIRST, RETRY_MAX).expect("valid backoff"),
            first_sync: true,
        };
        // The version to resume watching from; none: list first.
        let mut version: Option<String> = None;
        loop {
            version = match version.take() {
                None => feed.list().await,
                Some(from) => feed.watch(from).await,
            };
        }
    }
}

/// What [`drive`]'s loop keeps from one list or watch to the next.
struct Feed<K: 'static, F> {
    path: String,
    request: kube::core::Request,
    source: Source,
    wire: bool,
    store: Arc<Store>,
    cache: fn(&Store) -> &Cache<K>,
    on_change: F,
    retry: Backoff,
    first_sync: bool,
}

impl<K, F> Feed<K, F>
where
    K: Resource<DynamicType = ()> + ResourceExt + Clone + Listed + Debug,
    F: Fn(&K, bool),
{
    /// Lists into the cache and prunes what the list did not bring: the version to
    /// watch from, or `None` after a failure and the backoff's wait.
    async fn list(&mut self) -> Option<String> {
        let started = tokio::time::Instant::now();
        // The first list of a custom resource or of pods (as protobuf) from the API
        // server's watch cache, whole, as client-go's informers list; the other built-in
        // kinds, and every relist (the watch expired: 410), consistently from etcd, in
        // pages (see `store::list`).
        let whole = K::group(&()) == crate::crd::GROUP || K::PROTOBUF.is_some();
        let params = ListParams {
            label_selector: self.source.selector.clone(),
            field_selector: self.source.fields(),
            ..if self.first_sync && whole {
                ListParams::default().match_any()
            } else {
                ListParams::default().limit(PAGE)
            }
        };
        let c = (self.cache)(&self.store);
        let on_change = &self.on_change;
        let mut seen: HashSet<Slot> = HashSet::new();
        let listed = crate::store::list::list(&self.source.client, &self.path, params, |obj: K| {
            seen.insert(slot_of(&obj));
            on_change(&c.insert(obj), false);
        })
        .await;
        match listed {
            Ok(v) => {
                for gone in c.prune(|k| self.source.holds(k), &seen) {
                    on_change(&gone, true);
                }
                self.retry.reset();
                if self.first_sync {
                    self.first_sync = false;
                    tracing::info!(
                        objects = c.count(),
                        ms = started.elapsed().as_millis() as u64,
                        "listed"
                    );
                    self.store.synced.mark();
                    if self.wire {
                        self.store.wire_synced.mark();
                    }
                }
                Some(v)
            }
            Err(err) => {
                if self.first_sync && self.source.refusable && forbidden(&err) {
                    self.first_sync = false;
                    tracing::error!(error = %err, "may not list what the admin offered to agents or labelled on namespaces: running without it (every serviceAccountName and Secret reference refused, every namespace at the configured pod security level) until the RBAC allows it; grant list and watch, as the chart does");
                    self.store.synced.mark();
                } else {
                    tracing::warn!(error = %err, "list failed, retrying");
                }
                tokio::time::sleep(self.retry.next_delay_with(system_random)).await;
                None
            }
        }
    }

    /// Watches from version `from` until the watch ends: the version to resume from
    /// (after the backoff's wait when it failed), or `None` to list again.
    async fn watch(&mut self, from: String) -> Option<String> {
        let params = WatchParams {
            label_selector: self.source.selector.clone(),
            field_selector: self.source.fields(),
            ..WatchParams::default().timeout(WATCH_TIMEOUT_S)
        };
        let mut at = from;
        let watched = match self.request.watch(&params, &at) {
            Err(e) => Err(kube::Error::BuildRequest(e)),
            Ok(mut req) => {
                req.extensions_mut().insert("watch");
                self.source.client.request_events::<K>(req).await
            }
        };
        let end = match watched {
            Err(err) => ended_by(&err),
            Ok(stream) => self.follow(stream.boxed(), &mut at).await,
        };
        match end {
            End::Relist => None,
            End::Resume => Some(at),
            End::Failed => {
                tokio::time::sleep(self.retry.next_delay_with(system_random)).await;
                Some(at)
            }
        }
    }

    /// Applies a watch's events to the cache, `at` following their versions, until
    /// the stream ends, idles or fails.
    async fn follow(
        &mut self,
        mut stream: futures::stream::BoxStream<'_, kube::Result<WatchEvent<K>>>,
        at: &mut String,
    ) -> End {
        let c = (self.cache)(&self.store);
        loop {
            let event = match tokio::time::timeout(WATCH_IDLE, stream.next()).await {
                // Idle past the server's own timeout, or ended: resume.
                Err(_) | Ok(None) => return End::Resume,
                Ok(Some(Ok(event))) => event,
                // One event that does not decode: skipped, as a list skips
                // such an object (resuming before it would meet it again).
                Ok(Some(Err(kube::Error::SerdeError(err)))) => {
                    tracing::warn!(error = %err, "a watch event does not decode: skipped");
                    continue;
                }
                Ok(Some(Err(err))) => return ended_by(&err),
            };
            match event {
                WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                    *at = obj.resource_version().unwrap_or(std::mem::take(at));
                    (self.on_change)(&c.insert(obj), false);
                }
                WatchEvent::Deleted(obj) => {
                    *at = obj.resource_version().unwrap_or(std::mem::take(at));
                    let gone = c.remove(&slot_of(&obj)).unwrap_or_else(|| Arc::new(obj));
                    (self.on_change)(&gone, true);
                }
                WatchEvent::Bookmark(b) => *at = b.metadata.resource_version,
                WatchEvent::Error(e) => return expired_or_failed(&e),
            }
            self.retry.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The loop's order of requests and its clock, against a scripted API server in
    //! process (the tests on the test bed check it against a real one: restarts, 410s,
    //! compactions); here the paused clock times the idle bound exactly.
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::sync::Mutex;

    use futures::channel::mpsc;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use tokio::time::Instant;
    use tokio_tungstenite::tungstenite::Bytes;
    use tokio_tungstenite::tungstenite::http::{Request, Response};

    use super::*;
    use crate::store::{Agent, MANAGED_SELECTOR, NamespaceView, OfferedSecret};

    type Chunk = Result<Frame<Bytes>, Infallible>;
    type Chunks = mpsc::UnboundedSender<Chunk>;

    /// Answers each request with the next body the test queued (else one that never
    /// comes; `None`: no answer at all), and keeps every request's URI with when it came.
    #[derive(Default)]
    struct Scripted {
        bodies: Mutex<VecDeque<Option<mpsc::UnboundedReceiver<Chunk>>>>,
        /// The status of each answer, in turn; 200 when none is queued.
        statuses: Mutex<VecDeque<u16>>,
        seen: Mutex<VecDeque<(String, Instant)>>,
        /// Each request's `Accept` header ("" when none), in turn.
        accepts: Mutex<VecDeque<String>>,
        arrived: tokio::sync::Notify,
    }

    impl Scripted {
        /// Queues a body; returns its sender (dropped: the body ends).
        fn answer(&self) -> Chunks {
            let (tx, rx) = mpsc::unbounded();
            self.bodies.lock().unwrap().push_back(Some(rx));
            tx
        }
        /// Queues an answer `403 Forbidden`, as the API server gives a request its RBAC
        /// does not allow.
        fn refuse(&self) {
            let tx = self.answer();
            self.statuses.lock().unwrap().push_back(403);
            send(
                &tx,
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"forbidden"}"#,
            );
        }
        /// Queues a request that is never answered, not even its headers.
        fn never(&self) {
            self.bodies.lock().unwrap().push_back(None);
        }
        async fn next_request(&self) -> (String, Instant) {
            loop {
                let arrived = self.arrived.notified();
                if let Some(r) = self.seen.lock().unwrap().pop_front() {
                    return r;
                }
                arrived.await;
            }
        }
    }

    fn send(tx: &Chunks, text: &str) {
        tx.unbounded_send(Ok(Frame::data(Bytes::from(text.to_owned()))))
            .unwrap();
    }

    /// Ends a watch as the API server does when its version is too old: 410 Gone.
    fn expire(watch: &Chunks) {
        send(
            watch,
            r#"{"type":"ERROR","object":{"kind":"Status","status":"Failure","reason":"Expired","code":410,"message":"too old resource version"}}
"#,
        );
    }

    /// An object as served (an Agent's spec may be empty; a pod's is not read).
    fn object(name: &str, rv: u32) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"spec":{{}}}}"#
        )
    }

    /// Sends a list's last page, holding `item`, at version `rv`, and ends it; the watch
    /// that follows starts from `rv`.
    async fn last_page_then_watch(api: &Scripted, page: Chunks, rv: u32, item: &str) {
        send(
            &page,
            &format!(r#"{{"metadata":{{"resourceVersion":"{rv}"}},"items":[{item}]}}"#),
        );
        drop(page);
        let (uri, _) = api.next_request().await;
        assert!(
            uri.contains("watch=true") && uri.contains(&format!("resourceVersion={rv}")),
            "{uri}"
        );
    }

    fn client(api: &Arc<Scripted>) -> Client {
        let api = api.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                let body = api.bodies.lock().unwrap().pop_front();
                let status = api.statuses.lock().unwrap().pop_front().unwrap_or(200);
                let uri = req.uri().to_string();
                let accept = req.headers().get("accept").map(|a| a.to_str().unwrap());
                api.accepts
                    .lock()
                    .unwrap()
                    .push_back(accept.unwrap_or_default().into());
                api.seen.lock().unwrap().push_back((uri, Instant::now()));
                api.arrived.notify_waiters();
                let body = match body {
                    Some(Some(body)) => body,
                    Some(None) => std::future::pending().await,
                    None => {
                        let (tx, rx) = mpsc::unbounded();
                        std::mem::forget(tx);
                        rx
                    }
                };
                let mut response = Response::new(StreamBody::new(body));
                *response.status_mut() = status.try_into().unwrap();
                Ok::<_, Infallible>(response)
            }
        });
        Client::new(service, "ns")
    }

    /// A custom resource's first list from the watch cache, whole; the watch from its
    /// version; a silent
    /// watch resumed exactly at the idle bound from the last version seen; 410 Gone → a
    /// consistent list in pages, pruning what it did not bring; then a watch again.
    #[tokio::test(start_paused = true)]
    async fn lists_watches_resumes_at_the_idle_bound_and_relists_on_410() {
        let api = Arc::new(Scripted::default());
        let store = Arc::new(Store::default());
        let removed = Arc::new(Mutex::new(Vec::new()));
        let source = Source::namespaced(&client(&api), Some("ns".into()), Some(MANAGED_SELECTOR));
        let list = api.answer();
        let gone = removed.clone();
        let on_change = move |p: &Agent, rm: bool| {
            if rm {
                gone.lock().unwrap().push(p.name_any());
            }
        };
        let task = tokio::spawn(drive(source, true, store.clone(), |s| &s.agents, on_change));

        let (uri, _) = api.next_request().await;
        assert!(
            uri.starts_with("/apis/autonomic.sh/v1alpha1/namespaces/ns/agents?"),
            "{uri}"
        );
        assert!(
            uri.contains("resourceVersion=0") && !uri.contains("limit"),
            "{uri}"
        );
        assert!(
            uri.contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dautonomic"),
            "{uri}"
        );
        let watch = api.answer();
        // The list in pieces that cut its items anywhere.
        let body = format!(
            r#"{{"kind":"AgentList","metadata":{{"resourceVersion":"10"}},"items":[{},{}]}}"#,
            object("a", 9),
            object("b", 10)
        );
        for piece in body.as_bytes().chunks(7) {
            send(&list, std::str::from_utf8(piece).unwrap());
        }
        drop(list);

        let (uri, listed_at) = api.next_request().await;
        assert!(store.wire_synced.is_synced() && store.agents.count() == 2);
        assert!(
            uri.contains("watch=true") && uri.contains("resourceVersion=10"),
            "{uri}"
        );
        assert!(uri.contains("timeoutSeconds=290"), "{uri}");
        send(
            &watch,
            &format!("{{\"type\":\"MODIFIED\",\"object\":{}}}\n", object("a", 11)),
        );
        // Then silence, the connection open: resumed from 11 at exactly the idle bound.
        let resumed = api.answer();
        let (uri, at) = api.next_request().await;
        assert_eq!(at - listed_at, WATCH_IDLE);
        assert!(
            uri.contains("watch=true") && uri.contains("resourceVersion=11"),
            "{uri}"
        );
        drop(watch);

        let relist = api.answer();
        expire(&resumed);
        let (uri, at) = api.next_request().await;
        assert_eq!(at - listed_at, WATCH_IDLE, "the relist at once");
        assert!(
            uri.contains("limit=500") && !uri.contains("resourceVersion"),
            "{uri}"
        );
        let rewatch = api.answer();
        last_page_then_watch(&api, relist, 12, &object("a", 12)).await;
        assert_eq!(*removed.lock().unwrap(), ["b"]);
        let a = store.agents.get("ns", "a").unwrap();
        assert_eq!(a.metadata.resource_version.as_deref(), Some("12"));
        drop(rewatch);
        task.abort();
    }

    /// The loop over every namespace's Services (a built-in kind listed as JSON), gated
    /// as the wire form's kinds are, against `api`, into a store of its own.
    fn services_loop(api: &Arc<Scripted>) -> (Arc<Store>, tokio::task::JoinHandle<()>) {
        let store = Arc::new(Store::default());
        let source = Source::namespaced(&client(api), None, None);
        let task = tokio::spawn(drive(
            source,
            true,
            store.clone(),
            |s| &s.services,
            |_, _| {},
        ));
        (store, task)
    }

    /// Pods are asked for as protobuf: the first list whole from the watch cache, as
    /// client-go's informers ask, read as protobuf; the relist after 410 in pages from
    /// etcd, read as JSON when the server answers JSON (a proxy may pass JSON only).
    #[tokio::test(start_paused = true)]
    async fn pods_are_listed_as_protobuf_and_read_as_whatever_comes() {
        use crate::store::proto::tests::{W, list_body, msg};
        let api = Arc::new(Scripted::default());
        let list = api.answer();
        let store = Arc::new(Store::default());
        let source = Source::namespaced(&client(&api), None, Some(MANAGED_SELECTOR));
        let task = tokio::spawn(drive(source, true, store.clone(), |s| &s.pods, |_, _| {}));
        let (uri, _) = api.next_request().await;
        assert!(uri.starts_with("/api/v1/pods?"), "{uri}");
        assert!(
            uri.contains("resourceVersion=0") && !uri.contains("limit"),
            "{uri}"
        );
        assert_eq!(
            api.accepts.lock().unwrap().pop_front().as_deref(),
            Some(crate::store::proto::ACCEPT)
        );
        let pod = |name: &[u8], rv: &[u8]| {
            let meta = msg(&[(1, W::B(name)), (3, W::B(b"ns")), (6, W::B(rv))]);
            msg(&[(1, W::M(meta)), (3, W::M(msg(&[(1, W::B(b"Running"))])))])
        };
        let body = list_body(&[(2, W::B(b"5"))], &[&pod(b"a", b"4"), &pod(b"b", b"5")]);
        let watch = api.answer();
        for piece in body.chunks(5) {
            list.unbounded_send(Ok(Frame::data(Bytes::from(piece.to_vec()))))
                .unwrap();
        }
        drop(list);
        let (uri, _) = api.next_request().await;
        assert!(
            uri.contains("watch=true") && uri.contains("resourceVersion=5"),
            "{uri}"
        );
        assert_eq!(store.pods.count(), 2);
        let a = store.pods.get("ns", "a").unwrap();
        assert_eq!(a.status.as_ref().unwrap().phase.as_deref(), Some("Running"));

        let relist = api.answer();
        expire(&watch);
        let (uri, _) = api.next_request().await;
        assert!(
            uri.contains("limit=500") && !uri.contains("resourceVersion"),
            "{uri}"
        );
        api.accepts.lock().unwrap().pop_front(); // the watch's
        assert_eq!(
            api.accepts.lock().unwrap().pop_front().as_deref(),
            Some(crate::store::proto::ACCEPT)
        );
        last_page_then_watch(&api, relist, 7, &object("a", 7)).await;
        assert_eq!(store.pods.count(), 1, "b pruned");
        let a = store.pods.get("ns", "a").unwrap();
        assert_eq!(a.metadata.resource_version.as_deref(), Some("7"));
        task.abort();
    }

    /// A built-in kind's first list (but pods') is paged from etcd; a list that fails is retried
    /// after the backoff's first wait at most; the gate stays closed until one succeeds.
    #[tokio::test(start_paused = true)]
    async fn a_broken_list_is_retried_after_a_backoff() {
        let api = Arc::new(Scripted::default());
        let broken = api.answer();
        let (store, task) = services_loop(&api);
        let (uri, first) = api.next_request().await;
        // A built-in kind lists from etcd in pages, even the first time.
        assert!(uri.starts_with("/api/v1/services?"), "{uri}");
        assert!(
            uri.contains("limit=500") && !uri.contains("resourceVersion"),
            "{uri}"
        );
        send(&broken, r#"{"metadata":{"resourceVersion":"1"},"items":[{"#);
        drop(broken);
        let ok = api.answer();
        let (_, second) = api.next_request().await;
        assert!(second - first <= RETRY_FIRST, "{:?}", second - first);
        assert!(!store.wire_synced.is_synced());
        send(&ok, r#"{"metadata":{"resourceVersion":"1"},"items":[]}"#);
        drop(ok);
        api.next_request().await; // the watch
        assert!(store.wire_synced.is_synced());
        task.abort();
    }

    /// A page's envelope comes before its items: the next page is asked for as soon as
    /// the items begin, while this page is still being read, and the list is whole.
    #[tokio::test(start_paused = true)]
    async fn the_next_page_is_asked_for_while_this_one_is_read() {
        let api = Arc::new(Scripted::default());
        let first = api.answer();
        let (store, task) = services_loop(&api);
        api.next_request().await;
        let second = api.answer();
        send(
            &first,
            &format!(
                r#"{{"metadata":{{"resourceVersion":"5","continue":"c1"}},"items":[{},"#,
                object("a", 4)
            ),
        );
        let (uri, _) = tokio::time::timeout(Duration::from_secs(1), api.next_request())
            .await
            .expect("the next page asked for before this one ended");
        assert!(
            uri.contains("continue=c1") && uri.contains("limit=500"),
            "{uri}"
        );
        assert!(!store.wire_synced.is_synced());
        send(&first, &format!("{}]}}", object("b", 5)));
        drop(first);
        last_page_then_watch(&api, second, 5, &object("c", 5)).await;
        assert_eq!(store.services.count(), 3);
        task.abort();
    }

    /// A page asked for ahead whose answer never starts is given up 60 s after it was
    /// asked, not 60 s after the page before it ended: the bound on an answer's start
    /// is the same for every page.
    #[tokio::test(start_paused = true)]
    async fn a_page_asked_ahead_is_given_up_60_s_after_its_asking() {
        let api = Arc::new(Scripted::default());
        let first = api.answer();
        let (store, task) = services_loop(&api);
        api.next_request().await;
        api.never();
        send(
            &first,
            r#"{"metadata":{"resourceVersion":"5","continue":"c1"},"items":["#,
        );
        let (uri, asked) = api.next_request().await;
        assert!(uri.contains("continue=c1"), "{uri}");
        let stall = crate::store::list::STALL;
        tokio::time::sleep(stall / 2).await;
        send(&first, &format!("{}]}}", object("a", 4)));
        drop(first);
        let ok = api.answer();
        let (uri, retried) = api.next_request().await;
        assert!(!uri.contains("continue"), "the list starts over: {uri}");
        let waited = retried - asked;
        assert!(
            waited >= stall && waited <= stall + RETRY_FIRST,
            "{waited:?}"
        );
        last_page_then_watch(&api, ok, 6, &object("a", 6)).await;
        assert!(store.wire_synced.is_synced());
        task.abort();
    }

    /// A list whose answer does not start, or whose body stops, for 60 s is given up and
    /// retried after a backoff; the cache counts as synced only once one list is whole.
    #[tokio::test(start_paused = true)]
    async fn a_list_stalled_before_or_in_its_body_is_retried_after_60_s() {
        let api = Arc::new(Scripted::default());
        api.never();
        let stalled = api.answer();
        let (store, task) = services_loop(&api);
        let (_, first) = api.next_request().await;
        let stall = crate::store::list::STALL;
        let (_, second) = tokio::time::timeout(2 * stall, api.next_request())
            .await
            .expect("no retry of a list whose answer never started");
        let waited = second - first;
        assert!(
            waited >= stall && waited <= stall + RETRY_FIRST,
            "{waited:?}"
        );
        send(
            &stalled,
            r#"{"metadata":{"resourceVersion":"1"},"items":[{"#,
        );
        let ok = api.answer();
        let (_, third) = api.next_request().await;
        let waited = third - second;
        assert!(
            waited >= stall && waited <= stall + 2 * RETRY_FIRST,
            "{waited:?}"
        );
        assert!(!store.wire_synced.is_synced());
        send(&ok, r#"{"metadata":{"resourceVersion":"1"},"items":[]}"#);
        drop(ok);
        api.next_request().await; // the watch
        assert!(store.wire_synced.is_synced());
        drop(stalled);
        task.abort();
    }

    /// A refused offer watch (a binary under an older chart's RBAC) opens the sync gate
    /// with nothing offered, so the manager still reconciles (refusing every reference);
    /// any other refused watch keeps the gate closed, and both keep retrying.
    #[tokio::test(start_paused = true)]
    async fn a_refused_offer_watch_runs_with_nothing_offered_and_retries() {
        for (selector, opens) in [(OFFER_SELECTOR, true), (MANAGED_SELECTOR, false)] {
            let api = Arc::new(Scripted::default());
            let store = Arc::new(Store::default());
            // The wire form's watches have listed and the first snapshot is out.
            store.wire_synced.expect();
            store.wire_synced.mark();
            store.later.open();
            let source = Source::namespaced(&client(&api), Some("ns".into()), Some(selector));
            api.refuse();
            let task = tokio::spawn(drive(
                source,
                false,
                store.clone(),
                |s| &s.offered_secrets,
                |_: &OfferedSecret, _| {},
            ));
            let (uri, _) = api.next_request().await;
            assert!(uri.contains("/secrets?"), "{uri}");
            // Refused again: still retrying, the gate as the first refusal left it.
            api.refuse();
            api.next_request().await;
            assert_eq!(store.synced.is_synced(), opens, "{selector}");
            task.abort();
        }
    }

    /// A refused namespace watch (TRUST.md's labels) opens the sync gate too, with no
    /// namespace known (every one at the configured level), and retries; a namespace
    /// watched by name asks for that one alone.
    #[tokio::test(start_paused = true)]
    async fn a_refused_namespace_watch_runs_with_no_labels_and_retries() {
        let api = Arc::new(Scripted::default());
        let store = Arc::new(Store::default());
        store.wire_synced.expect();
        store.wire_synced.mark();
        store.later.open();
        let source = Source::cluster_scoped(&client(&api), Some("team-a".into()));
        api.refuse();
        let task = tokio::spawn(drive(
            source,
            false,
            store.clone(),
            |s| &s.namespaces,
            |_: &NamespaceView, _| {},
        ));
        let (uri, _) = api.next_request().await;
        assert!(
            uri.contains("/api/v1/namespaces?")
                && uri.contains("fieldSelector=metadata.name%3Dteam-a"),
            "{uri}"
        );
        api.refuse();
        api.next_request().await;
        assert!(store.synced.is_synced());
        assert_eq!(store.namespaces.count(), 0);
        task.abort();
    }
}
