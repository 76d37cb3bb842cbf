//! A fake control plane for the legacy HTTP transport (PROTOCOL.md §8): records every
//! `POST /api/autonomic/report` and answers with the frames queued for the manager.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One report as received.
#[derive(Clone, Debug)]
pub struct Post {
    pub path: String,
    pub authorization: String,
    pub frames: Vec<Value>,
}

#[derive(Default)]
struct State {
    posts: Vec<Post>,
    outbox: Vec<Value>,
    status: u16,
    /// Fail the post that follows an answer carrying a control (a network dying right
    /// after the control plane asked for something).
    fail_after_control: bool,
    fail_next: bool,
    /// Raw JSON text put in the next answer's array after the queued frames (for
    /// answers too big to build as values).
    raw: Vec<String>,
}

pub struct FakeReport {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeReport {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeReport {
    pub async fn start() -> FakeReport {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            status: 200,
            ..Default::default()
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 65536];
                    let (head_end, len) = loop {
                        let Ok(n) = s.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            break (end, len);
                        }
                    };
                    while buf.len() < head_end + 4 + len {
                        let Ok(n) = s.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let path = head
                        .lines()
                        .next()
                        .and_then(|l| l.split_whitespace().nth(1))
                        .unwrap_or("")
                        .to_owned();
                    let authorization = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("Authorization: ")
                                .or_else(|| l.strip_prefix("authorization: "))
                        })
                        .unwrap_or("")
                        .to_owned();
                    let frames: Vec<Value> =
                        serde_json::from_slice(&buf[head_end + 4..head_end + 4 + len])
                            .unwrap_or_default();
                    let (status, answer) = {
                        let mut st = state.lock().unwrap();
                        let mut answer = Vec::new();
                        if frames.iter().any(|f| f["type"] == "hello") {
                            answer.push(json!({"type": "welcome", "deployment_id": "dep-http", "heartbeat_interval_s": 2, "snapshot_interval_s": 300}));
                        }
                        let status = if st.fail_next { 503 } else { st.status };
                        st.fail_next = false;
                        if status == 200 {
                            if st.fail_after_control
                                && st.outbox.iter().any(|f| f["type"] == "control")
                            {
                                st.fail_next = true;
                            }
                            answer.append(&mut st.outbox);
                        }
                        st.posts.push(Post {
                            path,
                            authorization,
                            frames,
                        });
                        let mut text = serde_json::to_string(&answer).unwrap();
                        if status == 200 && !st.raw.is_empty() {
                            text.pop();
                            for raw in std::mem::take(&mut st.raw) {
                                if text.len() > 1 {
                                    text.push(',');
                                }
                                text.push_str(&raw);
                            }
                            text.push(']');
                        }
                        (status, text)
                    };
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = s.write_all(response.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        FakeReport { url, state, task }
    }

    pub fn fail_after_control(&self, on: bool) {
        self.state.lock().unwrap().fail_after_control = on;
    }

    pub fn set_status(&self, status: u16) {
        self.state.lock().unwrap().status = status;
    }

    /// Frames for the next answer.
    pub fn queue(&self, frame: Value) {
        self.state.lock().unwrap().outbox.push(frame);
    }

    /// Raw JSON for the next answer: one or more comma-separated elements, put in its
    /// array after the queued frames, as they are (an answer of many megabytes).
    pub fn queue_raw(&self, elements: String) {
        self.state.lock().unwrap().raw.push(elements);
    }

    pub fn posts(&self) -> Vec<Post> {
        self.state.lock().unwrap().posts.clone()
    }

    /// Every frame received, in order.
    pub fn frames(&self) -> Vec<Value> {
        self.posts().into_iter().flat_map(|p| p.frames).collect()
    }

    pub async fn wait_frame(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(f) = self.frames().into_iter().find(|f| pred(f)) {
                return f;
            }
            assert!(
                Instant::now() < deadline,
                "no frame for {what}; types seen: {:?}",
                self.frames()
                    .iter()
                    .map(|f| f["type"].clone())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
