//! A minimal HTTP `CONNECT` proxy for the tests of managed mode and `check`.

/// A minimal HTTP `CONNECT` proxy on `127.0.0.1`, on a thread and runtime of its own (the
/// test thread blocks in `Manager::wait_log`). It records each request line's method and
/// target (`CONNECT 127.0.0.1:1234`) and its `Proxy-Authorization` header, then either
/// tunnels or refuses with `refuse`.
pub struct ConnectProxy {
    pub port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    authorizations: std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConnectProxy {
    pub fn start(refuse: Option<u16>) -> ConnectProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let authorizations = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let record = seen.clone();
        let record_auth = authorizations.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serve = async {
                    while let Ok((mut client, _)) = listener.accept().await {
                        let record = record.clone();
                        let record_auth = record_auth.clone();
                        tokio::spawn(async move {
                            let mut head = Vec::new();
                            let mut buf = [0u8; 1024];
                            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                                match client.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => head.extend_from_slice(&buf[..n]),
                                }
                            }
                            let text = String::from_utf8_lossy(&head).into_owned();
                            let first: Vec<&str> =
                                text.lines().next().unwrap_or("").split(' ').collect();
                            let (method, target) = (first[0], first.get(1).copied());
                            record
                                .lock()
                                .unwrap()
                                .push(format!("{method} {}", target.unwrap_or("")));
                            let auth = text.lines().find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("proxy-authorization")
                                    .then(|| v.trim().to_owned())
                            });
                            record_auth.lock().unwrap().push(auth);
                            let upstream = match (refuse, method, target) {
                                (None, "CONNECT", Some(t)) => {
                                    tokio::net::TcpStream::connect(t).await.ok()
                                }
                                _ => None,
                            };
                            let Some(mut upstream) = upstream else {
                                let status = refuse.unwrap_or(502);
                                let answer = format!(
                                    "HTTP/1.1 {status} Refused\r\ncontent-length: 0\r\n\
                                     connection: close\r\n\r\n"
                                );
                                let _ = client.write_all(answer.as_bytes()).await;
                                let _ = client.shutdown().await;
                                return;
                            };
                            let _ = client
                                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                                .await;
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        });
                    }
                };
                tokio::select! {
                    _ = stopped => {}
                    _ = serve => {}
                }
            });
            // Dropping the runtime ends every tunnel.
            drop(rt);
        });
        ConnectProxy {
            port,
            seen,
            authorizations,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.authorizations.lock().unwrap().clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
