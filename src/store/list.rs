//! Lists read as the API server sends them: each object is decoded and handed on as soon
//! as its bytes have arrived, so a list's body is never held whole.
//!
//! kube's `Api::list` reads a whole page into one buffer, copies it into a string, and
//! decodes every object of the page before the first is used: a page is held about three
//! times over. That forced small pages (a fresh manager with 10 000 Agents made about a
//! hundred list requests, which on a busy API server took most of its start), and pages
//! of 8 for Secrets, which anyone may label as ours at 1 MiB each. Read this way, what a
//! list holds at once is one object, whatever the page size.
//!
//! Where a list is served from, measured on the test bed with 10 000 Agents, pods and
//! Secrets: a custom resource is stored in etcd as JSON and read back through the
//! API server's unstructured decoding, so its first list is one request served from
//! the watch cache (`resourceVersion=0`, as client-go's informers do; `limit` is ignored
//! there): Agents 2.7 s of the server from etcd, 0.7 s from the cache. Pods are asked
//! for as protobuf ([`super::proto`]), which the server encodes several times faster
//! than JSON, and their first list too is one request to the cache, as the informers
//! of the controller manager and the scheduler ask: 10 000 pods in 0.34 s whole from
//! the cache, 0.8 s in pages of [`PAGE`] from etcd (as JSON: 2.0 s either way). The other
//! built-in kinds are listed in pages from etcd, after the first snapshot. Relists after
//! a 410 are consistent reads from etcd in pages for every kind (the cache may be behind
//! what the watch already brought).
//!
//! A page's envelope, with its `continue` token, comes before its items: the next page is
//! asked for as soon as the items begin, so that the API server reads and encodes it
//! while this one is read and decoded, instead of each side waiting for the other.

use std::time::Duration;

use futures::{AsyncBufRead, AsyncBufReadExt, TryStreamExt};
use http_body_util::BodyExt;
use hyper::header::{ACCEPT, HeaderValue};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::Client;
use kube::api::ListParams;
use kube::core::Status;
use serde::de::DeserializeOwned;

use super::proto::{self, Malformed};
use super::{NamespaceView, OfferedSecret, OfferedServiceAccount, PodView, SecretView};
use crate::crd::{Agent, Memory, Runtime, Tool};

/// Objects per page of a list read from etcd, where the API server pages.
pub const PAGE: u32 = 500;

/// The largest object a list may carry. The API server stores at most 1.5 MiB an object
/// (etcd's request limit), which its JSON form may exceed a little; past this the body is
/// not a list of Kubernetes objects.
pub const MAX_OBJECT: usize = 8 << 20;

/// The largest part of a list outside its items (kind, apiVersion, metadata).
const MAX_ENVELOPE: usize = 64 << 10;

/// How long a list's answer may take to start, or its body stall, before the list is
/// abandoned (and retried).
pub(super) const STALL: Duration = Duration::from_secs(60);

/// Why a list failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("reading the list: {0}")]
    Read(#[from] std::io::Error),
    #[error("the list's answer stalled for {}s", STALL.as_secs())]
    Stalled,
    #[error("the list's body is malformed: {0}")]
    Malformed(&'static str),
}

/// A page asked for, its request under way on a task of its own and aborted when dropped
/// unanswered (the list failed, or ended without the page asked for ahead).
struct Asked<T> {
    task: tokio::task::JoinHandle<T>,
    /// The `continue` token it was asked with.
    token: Option<String>,
    /// When it was asked: its answer must start within [`STALL`] of this.
    at: tokio::time::Instant,
}

impl<T> Drop for Asked<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a kind's lists are read: as JSON, or, for a kind with a protobuf reader (pods,
/// [`super::proto`]), asked for and read as protobuf, and as JSON when the server answers
/// so (a proxy may pass JSON only).
pub trait Listed: DeserializeOwned {
    /// Reads one object of a protobuf list; `None`: the kind is listed as JSON.
    const PROTOBUF: Option<ReadProtobuf<Self>> = None;
}

/// Reads one object of a protobuf list.
pub type ReadProtobuf<K> = fn(&[u8]) -> Result<K, Malformed>;

impl Listed for PodView {
    const PROTOBUF: Option<ReadProtobuf<Self>> = Some(super::proto::pod);
}

impl Listed for Agent {}
impl Listed for Tool {}
impl Listed for Runtime {}
impl Listed for Memory {}
impl Listed for Service {}
impl Listed for SecretView {}
impl Listed for OfferedSecret {}
impl Listed for OfferedServiceAccount {}
impl Listed for NamespaceView {}

/// Lists the objects at `url_path` (a collection: `/api/v1/namespaces/x/pods`) with
/// `params`, following `continue` tokens, handing each object to `each` as it arrives.
/// An object that does not decode as `K` is logged and skipped: one odd object must not
/// keep the whole watch from listing. Returns the list's resourceVersion.
pub async fn list<K: Listed>(
    client: &Client,
    url_path: &str,
    params: ListParams,
    mut each: impl FnMut(K),
) -> Result<String, ListError> {
    let request = kube::core::Request::new(url_path);
    let ask = |token: Option<String>| {
        let page = ListParams {
            continue_token: token.clone(),
            ..params.clone()
        };
        let mut req = request
            .list(&page)
            .map_err(|e| ListError::Api(kube::Error::BuildRequest(e)))?;
        if K::PROTOBUF.is_some() {
            req.headers_mut()
                .insert(ACCEPT, HeaderValue::from_static(proto::ACCEPT));
        }
        let client = client.clone();
        Ok::<_, ListError>(Asked {
            task: tokio::spawn(send(client, req)),
            token,
            at: tokio::time::Instant::now(),
        })
    };
    let decode = |item: &[u8], protobuf: bool| -> Result<K, String> {
        match (protobuf, K::PROTOBUF) {
            (false, _) => serde_json::from_slice(item).map_err(|e| e.to_string()),
            (true, Some(read)) => read(item).map_err(|e| e.0.to_string()),
            (true, None) => Err("protobuf, not asked for".into()),
        }
    };
    let mut asked = ask(params.continue_token.clone())?;
    loop {
        // The client's own read timeout is the API server's watch length (295 s). The
        // answer must start within STALL of the asking, for a page asked ahead too (an
        // answer already in is taken, however late it is looked at).
        let body = match tokio::time::timeout_at(asked.at + STALL, &mut asked.task).await {
            Err(_) => return Err(ListError::Stalled),
            Ok(Err(gone)) => return Err(ListError::Read(std::io::Error::other(gone))),
            Ok(Ok(body)) => body?,
        };
        futures::pin_mut!(body);
        let mut split = None;
        let mut ahead = None;
        let mut looked = false;
        loop {
            let chunk = match tokio::time::timeout(STALL, body.fill_buf()).await {
                Err(_) => return Err(ListError::Stalled),
                Ok(chunk) => chunk?,
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len();
            let split = split.get_or_insert_with(|| Split::of(chunk));
            let protobuf = matches!(split, Split::Proto(_));
            split.feed(chunk, &mut |item| match decode(item, protobuf) {
                Ok(obj) => each(obj),
                Err(e) => tracing::warn!(path = url_path, error = %e, "an object of the list does not decode: skipped"),
            })?;
            body.as_mut().consume(n);
            if !looked && split.in_items() {
                looked = true;
                if let Some(token) = split.continue_before_items() {
                    ahead = Some(ask(Some(token))?);
                }
            }
        }
        let meta = split.ok_or(ListError::Malformed("empty"))?.finish()?;
        match meta.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                asked = match ahead {
                    Some(next) if next.token.as_deref() == Some(&*token) => next,
                    _ => ask(Some(token))?,
                };
            }
            None => {
                return meta
                    .resource_version
                    .filter(|v| !v.is_empty())
                    .ok_or(ListError::Malformed("no resourceVersion"));
            }
        }
    }
}

/// Sends a list's request: its body as it comes, or the API server's refusal with its
/// `Status` (as JSON or protobuf, whichever the server wrote) as `kube::Error::Api`.
async fn send(
    client: Client,
    req: hyper::Request<Vec<u8>>,
) -> Result<impl AsyncBufRead, ListError> {
    let res = client.send(req.map(kube::client::Body::from)).await?;
    let code = res.status();
    if !code.is_client_error() && !code.is_server_error() {
        let body = res.into_body().into_data_stream();
        return Ok(body.map_err(std::io::Error::other).into_async_read());
    }
    let body = http_body_util::Limited::new(res.into_body(), MAX_ENVELOPE)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let status = match proto::status(&body) {
        Ok((c, reason, message)) => {
            Status::failure(&message, &reason).with_code(if c == 0 { code.as_u16() } else { c })
        }
        Err(_) => serde_json::from_slice::<Status>(&body).unwrap_or_else(|_| {
            Status::failure(String::from_utf8_lossy(&body).trim(), "").with_code(code.as_u16())
        }),
    };
    Err(ListError::Api(kube::Error::Api(status.boxed())))
}

/// A list's body being split, as JSON or protobuf: whichever it starts as.
enum Split {
    Json(Splitter),
    Proto(ProtoSplitter),
}

impl Split {
    fn of(first: &[u8]) -> Self {
        if first.first() == proto::MAGIC.first() {
            Split::Proto(ProtoSplitter::default())
        } else {
            Split::Json(Splitter::default())
        }
    }

    fn feed(&mut self, chunk: &[u8], each: &mut impl FnMut(&[u8])) -> Result<(), ListError> {
        match self {
            Split::Json(s) => s.feed(chunk, each),
            Split::Proto(s) => s.feed(chunk, each),
        }
    }

    fn in_items(&self) -> bool {
        match self {
            Split::Json(s) => s.in_items,
            Split::Proto(s) => s.in_items,
        }
    }

    fn continue_before_items(&self) -> Option<String> {
        match self {
            Split::Json(s) => s.continue_before_items(),
            Split::Proto(s) => s.continue_before_items(),
        }
    }

    fn finish(self) -> Result<ListMeta, ListError> {
        match self {
            Split::Json(s) => s.finish(),
            Split::Proto(s) => s.finish(),
        }
    }
}

/// Splits a list's protobuf body, arriving in pieces, into its items (each whole, as
/// bytes) and its metadata. The body is the magic, then a `runtime.Unknown` whose `raw`
/// (field 2) is the list; the list's metadata (field 1) comes before its items (field 2),
/// as Go writes fields in their order.
#[derive(Default)]
struct ProtoSplitter {
    /// What has come and is not yet read.
    buf: Vec<u8>,
    magic: bool,
    /// Inside the envelope's `raw`: how much of it is still to come.
    raw_left: Option<usize>,
    raw_read: bool,
    meta: Option<ListMeta>,
    in_items: bool,
}

impl ProtoSplitter {
    fn feed(&mut self, chunk: &[u8], each: &mut impl FnMut(&[u8])) -> Result<(), ListError> {
        let bad = |e: Malformed| ListError::Malformed(e.0);
        self.buf.extend_from_slice(chunk);
        let mut at = 0;
        loop {
            let rest = &self.buf[at..];
            if !self.magic {
                if rest.len() < proto::MAGIC.len() {
                    break;
                }
                if !rest.starts_with(proto::MAGIC) {
                    return Err(ListError::Malformed("neither JSON nor protobuf"));
                }
                self.magic = true;
                at += proto::MAGIC.len();
                continue;
            }
            let Some(h) = proto::head(rest).map_err(bad)? else {
                break;
            };
            if !self.raw_read && h.field == 2 && h.wire == proto::LEN {
                self.raw_read = true;
                self.raw_left = Some(h.len).filter(|&n| n > 0);
                at += h.size;
                continue;
            }
            let in_raw = self.raw_left.is_some();
            if in_raw && h.field == 2 && h.len > MAX_OBJECT {
                return Err(ListError::Malformed("an object larger than 8 MiB"));
            }
            if !(in_raw && h.field == 2) && h.len > MAX_ENVELOPE {
                return Err(ListError::Malformed("a list envelope larger than 64 KiB"));
            }
            let whole = h.size + h.len;
            if rest.len() < whole {
                break;
            }
            if let Some(left) = self.raw_left {
                let left = left
                    .checked_sub(whole)
                    .ok_or(ListError::Malformed("a field past the list's end"))?;
                self.raw_left = Some(left).filter(|&n| n > 0);
                if h.wire == proto::LEN {
                    let value = &rest[h.size..whole];
                    match h.field {
                        1 => self.meta = Some(proto::list_meta(value).map_err(bad)?),
                        2 => {
                            self.in_items = true;
                            each(value);
                        }
                        _ => {}
                    }
                }
            }
            at += whole;
        }
        self.buf.drain(..at);
        Ok(())
    }

    fn continue_before_items(&self) -> Option<String> {
        let meta = self.meta.as_ref().filter(|_| self.in_items)?;
        meta.continue_.clone().filter(|c| !c.is_empty())
    }

    fn finish(self) -> Result<ListMeta, ListError> {
        if !self.raw_read || self.raw_left.is_some() || !self.buf.is_empty() {
            return Err(ListError::Malformed("truncated"));
        }
        self.meta.ok_or(ListError::Malformed("not a list"))
    }
}

/// Splits a list's JSON body, arriving in pieces, into the elements of its top-level
/// `items` array (each whole, as bytes) and the rest (the envelope: kind, apiVersion,
/// metadata), kept with `items` empty. Only the structure is checked here (strings and
/// escapes, nesting); each element is decoded on its own.
#[derive(Default)]
struct Splitter {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The last string at depth 1 (a key, when an array follows), up to 6 bytes.
    key: Vec<u8>,
    /// Inside the top-level `items` array.
    in_items: bool,
    item: Vec<u8>,
    envelope: Vec<u8>,
}

impl Splitter {
    fn feed(&mut self, chunk: &[u8], each: &mut impl FnMut(&[u8])) -> Result<(), ListError> {
        for &b in chunk {
            let before = self.depth;
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                } else if before == 1 && self.key.len() < 6 {
                    self.key.push(b);
                }
            } else {
                match b {
                    b'"' => {
                        self.in_string = true;
                        if before == 1 {
                            self.key.clear();
                        }
                    }
                    b'{' | b'[' => {
                        self.depth += 1;
                        if before == 1 && b == b'[' && self.key == b"items" {
                            self.in_items = true;
                        }
                    }
                    b'}' | b']' => {
                        self.depth = before
                            .checked_sub(1)
                            .ok_or(ListError::Malformed("unbalanced"))?;
                    }
                    _ => {}
                }
            }
            let after = self.depth;
            if self.in_items && (before >= 3 || after >= 3) {
                self.item.push(b);
                if self.item.len() > MAX_OBJECT {
                    return Err(ListError::Malformed("an object larger than 8 MiB"));
                }
                if after == 2 && before == 3 {
                    each(&self.item);
                    self.item.clear();
                }
            } else if !self.in_items || before != 2 || after != 2 {
                // The envelope, with the items array's brackets but not its elements.
                if self.in_items && after == 1 {
                    self.in_items = false;
                }
                self.envelope.push(b);
                if self.envelope.len() > MAX_ENVELOPE {
                    return Err(ListError::Malformed("a list envelope larger than 64 KiB"));
                }
            }
        }
        Ok(())
    }

    /// The list's metadata, once the whole body was fed.
    fn finish(self) -> Result<ListMeta, ListError> {
        if self.depth != 0 || self.in_string || self.envelope.is_empty() {
            return Err(ListError::Malformed("truncated"));
        }
        meta_of(&self.envelope).ok_or(ListError::Malformed("not a list"))
    }

    /// The `continue` token of a list whose envelope came before its items, read while
    /// the items are being fed (the envelope then ends with the items' `[`).
    fn continue_before_items(&self) -> Option<String> {
        if !self.in_items || self.envelope.last() != Some(&b'[') {
            return None;
        }
        let mut closed = Vec::with_capacity(self.envelope.len() + 2);
        closed.extend_from_slice(&self.envelope);
        closed.extend_from_slice(b"]}");
        meta_of(&closed)?.continue_.filter(|c| !c.is_empty())
    }
}

/// The metadata of a list's envelope (its items left out).
fn meta_of(envelope: &[u8]) -> Option<ListMeta> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        #[serde(default)]
        metadata: ListMeta,
    }
    serde_json::from_slice::<Envelope>(envelope)
        .ok()
        .map(|e| e.metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::proto::tests::{W, list_body, msg};

    /// Splits `body` fed in pieces of `piece` bytes.
    fn split(body: &str, piece: usize) -> Result<(Vec<String>, ListMeta), ListError> {
        let mut s = Splitter::default();
        let mut items = Vec::new();
        for chunk in body.as_bytes().chunks(piece) {
            s.feed(chunk, &mut |i| {
                items.push(String::from_utf8(i.to_vec()).unwrap())
            })?;
        }
        Ok((items, s.finish()?))
    }

    #[test]
    fn items_are_split_whole_in_any_pieces_and_the_envelope_kept() {
        let body = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c1"},
            "items":[{"metadata":{"name":"a \"}]{[","annotations":{"items":"[{"}}},
              {"metadata":{"name":"b\\"},"spec":{"x":[1,{"y":[]}]}} ],"extra":{"items":[{"no":1}]}}"#;
        for piece in [1, 2, 3, 7, 64, 10_000] {
            let (items, meta) = split(body, piece).unwrap();
            assert_eq!(
                items,
                [
                    r#"{"metadata":{"name":"a \"}]{[","annotations":{"items":"[{"}}}"#,
                    r#"{"metadata":{"name":"b\\"},"spec":{"x":[1,{"y":[]}]}}"#,
                ],
                "pieces of {piece}"
            );
            assert_eq!(meta.resource_version.as_deref(), Some("42"));
            assert_eq!(meta.continue_.as_deref(), Some("c1"));
        }
        let (items, meta) = split(r#"{"metadata":{"resourceVersion":"7"},"items":[]}"#, 3).unwrap();
        assert!(items.is_empty());
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn broken_bodies_are_errors_not_panics() {
        for bad in [
            r#"{"items":[{"a":1}"#,
            r#"{"items":[{"a":"1}]}"#,
            r#"}"#,
            "",
            r#"{"items":[]"#,
        ] {
            assert!(split(bad, 4).is_err(), "{bad:?}");
        }
        // An element past the object bound, and an envelope past its own.
        let huge = format!(r#"{{"items":[{{"a":"{}"}}]}}"#, "x".repeat(MAX_OBJECT));
        assert!(split(&huge, 1 << 16).is_err());
        let fat = format!(
            r#"{{"metadata":{{"x":"{}"}},"items":[]}}"#,
            "x".repeat(MAX_ENVELOPE)
        );
        assert!(split(&fat, 1 << 16).is_err());
    }

    /// Splits `body` fed in pieces of `piece` bytes; the metadata's `continue` is the
    /// one known before the items ended.
    fn split_proto(body: &[u8], piece: usize) -> Result<(Vec<Vec<u8>>, ListMeta), ListError> {
        let mut s = ProtoSplitter::default();
        let mut items = Vec::new();
        let mut early = None;
        for chunk in body.chunks(piece) {
            s.feed(chunk, &mut |i| items.push(i.to_vec()))?;
            early = early.or_else(|| s.continue_before_items());
        }
        let meta = s.finish()?;
        assert_eq!(
            early, meta.continue_,
            "the token known before the items ended"
        );
        Ok((items, meta))
    }

    #[test]
    fn protobuf_items_are_split_whole_in_any_pieces() {
        let big = vec![7u8; 300];
        let body = list_body(
            &[(2, W::B(b"42")), (3, W::B(b"c1"))],
            &[b"\x0a\x01a", &big, b""],
        );
        for piece in [1, 2, 3, 7, 64, 10_000] {
            let (items, meta) = split_proto(&body, piece).unwrap();
            assert_eq!(
                items,
                [b"\x0a\x01a".to_vec(), big.clone(), vec![]],
                "pieces of {piece}"
            );
            assert_eq!(meta.resource_version.as_deref(), Some("42"));
            assert_eq!(meta.continue_.as_deref(), Some("c1"));
        }
        let (items, meta) = split_proto(&list_body(&[(2, W::B(b"7"))], &[]), 3).unwrap();
        assert!(items.is_empty());
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert!(matches!(Split::of(&body), Split::Proto(_)));
        assert!(matches!(Split::of(b"{\"kind\""), Split::Json(_)));
    }

    #[test]
    fn broken_protobuf_bodies_are_errors_not_panics() {
        let body = list_body(&[(2, W::B(b"42"))], &[b"\x0a\x01a", b"\x0a\x01b"]);
        // Cut anywhere in the list (the envelope's two empty fields after it may be
        // left out).
        for cut in 0..body.len() - 4 {
            assert!(split_proto(&body[..cut], 5).is_err(), "cut at {cut}");
        }
        assert!(split_proto(b"k8s\x01....", 4).is_err(), "no magic");
        let mut group = proto::MAGIC.to_vec();
        group.push(0x0b);
        assert!(
            split_proto(&group, 4).is_err(),
            "a wire type protobuf lists never have"
        );
        // An item past the object bound, the list's metadata past the envelope's:
        // refused from their heads, before their bytes come.
        for head in [
            &[0x12, 0x80, 0x80, 0x80, 0x10][..],
            &[0x0a, 0x81, 0x80, 0x04],
        ] {
            let mut b = proto::MAGIC.to_vec();
            b.extend([0x12, 0x90, 0x80, 0x80, 0x10]); // raw: 32 MiB + 16
            b.extend(head);
            assert!(matches!(split_proto(&b, 64), Err(ListError::Malformed(_))));
        }
        let mut fat = proto::MAGIC.to_vec();
        fat.extend([0x0a, 0x81, 0x80, 0x04]); // type meta: 64 KiB + 1
        assert!(split_proto(&fat, 64).is_err());
        // A list item running past the list's own end.
        let mut past = proto::MAGIC.to_vec();
        past.extend(msg(&[(2, W::B(&[0x12, 0x05, 1, 2]))]));
        past.extend([3, 4, 5]);
        assert!(split_proto(&past, 3).is_err());
    }
}
