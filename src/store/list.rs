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
//! there): Agents 2.7 s of the server from etcd, 0.7 s from the cache. Built-in kinds
//! are stored as protobuf, and one whole response is encoded before its first byte
//! leaves, while pages overlap the server's encoding with our reading: pods listed in
//! 3.1 s in pages of [`PAGE`] from etcd against 4.2 s whole from the cache, with the
//! Agents' list running alongside. Relists after a 410 are consistent reads from etcd
//! in pages for every kind (the cache may be behind what the watch already brought).
//!
//! A page's envelope, with its `continue` token, comes before its items: the next page is
//! asked for as soon as the items begin, so that the API server reads and encodes it
//! while this one is read and decoded, instead of each side waiting for the other.

use std::time::Duration;

use futures::{AsyncBufRead, AsyncBufReadExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::Client;
use kube::api::ListParams;
use serde::de::DeserializeOwned;

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

/// Lists the objects at `url_path` (a collection: `/api/v1/namespaces/x/pods`) with
/// `params`, following `continue` tokens, handing each object to `each` as it arrives.
/// An object that does not decode as `K` is logged and skipped: one odd object must not
/// keep the whole watch from listing. Returns the list's resourceVersion.
pub async fn list<K: DeserializeOwned>(
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
        let req = request
            .list(&page)
            .map_err(|e| ListError::Api(kube::Error::BuildRequest(e)))?;
        let client = client.clone();
        Ok::<_, ListError>(Asked {
            task: tokio::spawn(async move { client.request_stream(req).await }),
            token,
            at: tokio::time::Instant::now(),
        })
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
        let mut split = Splitter::default();
        let mut ahead = None;
        let mut looked = false;
        loop {
            if !looked && split.in_items {
                looked = true;
                if let Some(token) = split.continue_before_items() {
                    ahead = Some(ask(Some(token))?);
                }
            }
            let chunk = match tokio::time::timeout(STALL, body.fill_buf()).await {
                Err(_) => return Err(ListError::Stalled),
                Ok(chunk) => chunk?,
            };
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len();
            split.feed(chunk, &mut |item| match serde_json::from_slice::<K>(item) {
                Ok(obj) => each(obj),
                Err(e) => tracing::warn!(path = url_path, error = %e, "an object of the list does not decode: skipped"),
            })?;
            body.as_mut().consume(n);
        }
        let meta = split.finish()?;
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
}
