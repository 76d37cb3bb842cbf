//! A TCP fault proxy for the fault suite: listens on `127.0.0.1:<free port>`, forwards
//! every connection to a target address, and can be switched at any moment between
//! [`Fault`] modes that act on live connections and new ones alike. It works at the
//! TCP level, so TLS passes through it untouched.
//!
//! Like the fake control plane it runs on a runtime of its own, on a thread of its own:
//! it keeps forwarding while a test blocks its thread (in `Manager::wait_log`), and
//! dropping the [`FaultProxy`] closes every socket it holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// What the proxy does with bytes and connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways as fast as the peers go.
    Pass,
    /// Forward nothing either way and keep every socket open (the bytes wait in the
    /// kernel's buffers); new connections are accepted and held. Back to `Pass` (or
    /// `Slow`), held connections go on where they stopped, as after a healed partition.
    Stall,
    /// New connections are accepted and never answered nor forwarded, even after the
    /// mode changes (a SYN into the void, as close as user space gets); live ones stall.
    BlackHole,
    /// Forward at most this many bytes per second, each direction of each connection.
    Slow(u64),
    /// Close every live connection, both sides, with a TCP RST (SO_LINGER 0), and
    /// reset every new one at once (as a refusal looks to the dialler).
    Reset,
    /// Forward this many more bytes in each direction of every connection (live ones
    /// from the moment the mode is set, new ones from their start), then swallow
    /// everything that direction carries for the rest of the connection's life: the
    /// bytes are read and dropped, so the sender sees neither an error nor
    /// back-pressure, and the message in flight is cut wherever the count ends. A
    /// direction once swallowed stays so whatever the mode becomes (only a reset ends
    /// it), so the test can turn back to `Pass` for new connections at once.
    BlackHoleAfter(u64),
}

/// What every connection watches: the mode, and how many resets were asked for. A reset
/// is an event, not only a mode: a connection alive when one was asked ends with an RST
/// even if the mode has moved on before its task looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ctl {
    mode: Fault,
    resets: u64,
}

/// The proxy. Not `Clone`: dropping it shuts it down.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Ctl>,
    counts: Arc<Counts>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    live: AtomicUsize,
    resets: AtomicUsize,
    /// Directions of connections that [`Fault::BlackHoleAfter`] turned into a sink.
    swallowing: AtomicUsize,
    /// Bytes read and dropped by them.
    swallowed: AtomicU64,
}

impl FaultProxy {
    /// Starts forwarding to `target` (`host:port`, resolved on every connection), in
    /// mode [`Fault::Pass`].
    pub fn start(target: &str) -> FaultProxy {
        let (mode, mode_rx) = watch::channel(Ctl {
            mode: Fault::Pass,
            resets: 0,
        });
        let counts = Arc::new(Counts::default());
        let (shutdown, stopped) = oneshot::channel::<()>();
        let (bound, on_bound) = std::sync::mpsc::channel();
        let target = target.to_owned();
        let c = counts.clone();
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fault proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("fault proxy: bind 127.0.0.1:0");
                    bound.send(listener.local_addr().unwrap()).unwrap();
                    tokio::select! {
                        _ = stopped => {}
                        () = accept_loop(listener, target, mode_rx, c) => {}
                    }
                });
                // Dropping the runtime drops every task: each socket closes.
                drop(rt);
            })
            .expect("fault proxy thread");
        let addr = on_bound.recv().expect("the fault proxy bound a port");
        FaultProxy {
            addr,
            mode,
            counts,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Switches the mode; live connections follow at once. [`Fault::Reset`] resets every
    /// connection alive at this moment, however soon the mode changes again.
    pub fn set(&self, mode: Fault) {
        self.mode.send_modify(|c| {
            c.mode = mode;
            if mode == Fault::Reset {
                c.resets += 1;
            }
        });
    }

    pub fn mode(&self) -> Fault {
        self.mode.borrow().mode
    }

    /// Connections accepted so far (whatever became of them).
    pub fn accepted(&self) -> usize {
        self.counts.accepted.load(Relaxed)
    }

    /// Connections open right now (held, stalled or forwarding).
    pub fn live(&self) -> usize {
        self.counts.live.load(Relaxed)
    }

    /// Connections ended with an RST by [`Fault::Reset`].
    pub fn resets(&self) -> usize {
        self.counts.resets.load(Relaxed)
    }

    /// Directions (two per connection) that [`Fault::BlackHoleAfter`] has turned into
    /// a sink so far: their byte count ran out.
    pub fn swallowing(&self) -> usize {
        self.counts.swallowing.load(Relaxed)
    }

    /// Bytes read and dropped by swallowing directions.
    pub fn swallowed(&self) -> u64 {
        self.counts.swallowed.load(Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: String,
    mode: watch::Receiver<Ctl>,
    counts: Arc<Counts>,
) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                counts.accepted.fetch_add(1, Relaxed);
                let _ = client.set_nodelay(true);
                let live = Live::new(counts.clone());
                tokio::spawn(serve(client, target.clone(), mode.clone(), live));
            }
            // E.g. too many open files: do not spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Counts a connection as live for as long as it exists.
struct Live(Arc<Counts>);

impl Live {
    fn new(counts: Arc<Counts>) -> Live {
        counts.live.fetch_add(1, Relaxed);
        Live(counts)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Relaxed);
    }
}

/// Closes with an RST instead of a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn serve(client: TcpStream, target: String, mut mode: watch::Receiver<Ctl>, live: Live) {
    let born = mode.borrow_and_update().resets;
    // Before dialling: wait for a mode that forwards.
    loop {
        let now = *mode.borrow_and_update();
        if now.resets != born {
            live.0.resets.fetch_add(1, Relaxed);
            return reset(client);
        }
        match now.mode {
            Fault::Pass | Fault::Slow(_) | Fault::BlackHoleAfter(_) => break,
            Fault::Reset => {
                live.0.resets.fetch_add(1, Relaxed);
                return reset(client);
            }
            Fault::BlackHole => {
                // Never answered, whatever comes later; an RST still ends it.
                let _ = mode.wait_for(|c| c.resets != born).await;
                live.0.resets.fetch_add(1, Relaxed);
                return reset(client);
            }
            Fault::Stall => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
        }
    }
    let Ok(upstream) = TcpStream::connect(&target).await else {
        // As a refusal looks to the dialler.
        return reset(client);
    };
    let _ = upstream.set_nodelay(true);
    let (mut client, mut upstream) = (client, upstream);
    let end = {
        let (mut cr, mut cw) = client.split();
        let (mut ur, mut uw) = upstream.split();
        let up = pump(&mut cr, &mut uw, mode.clone(), born, &live.0);
        let down = pump(&mut ur, &mut cw, mode.clone(), born, &live.0);
        tokio::pin!(up, down);
        let (mut a, mut b) = (None, None);
        loop {
            tokio::select! {
                e = &mut up, if a.is_none() => a = Some(e),
                e = &mut down, if b.is_none() => b = Some(e),
            }
            match (a, b) {
                (Some(End::Reset), _) | (_, Some(End::Reset)) => break End::Reset,
                (Some(End::Error), _) | (_, Some(End::Error)) => break End::Error,
                (Some(_), Some(_)) => break End::Eof,
                _ => {}
            }
        }
    };
    if end == End::Reset {
        live.0.resets.fetch_add(1, Relaxed);
        reset(client);
        reset(upstream);
    }
    // Otherwise both drop here: a FIN to whichever side is still open.
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The source closed its side; the close was passed on.
    Eof,
    /// Reading or writing failed: the connection is over both ways.
    Error,
    /// The mode turned to [`Fault::Reset`].
    Reset,
}

/// One direction of one connection, obeying the mode at every step.
async fn pump<R, W>(
    rd: &mut R,
    wr: &mut W,
    mut mode: watch::Receiver<Ctl>,
    born: u64,
    counts: &Counts,
) -> End
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    // Bytes this direction may still forward under `BlackHoleAfter` (armed when that
    // mode is first seen, disarmed by another mode before it runs out).
    let mut budget: Option<u64> = None;
    loop {
        let now = *mode.borrow_and_update();
        if now.resets != born {
            return End::Reset;
        }
        if !matches!(now.mode, Fault::BlackHoleAfter(_)) {
            budget = None;
        }
        let limit = match now.mode {
            Fault::BlackHoleAfter(n) => match *budget.get_or_insert(n) {
                0 => {
                    counts.swallowing.fetch_add(1, Relaxed);
                    return swallow(rd, &mut buf, mode, born, counts).await;
                }
                left => usize::try_from(left).unwrap_or(usize::MAX).min(buf.len()),
            },
            Fault::Reset => return End::Reset,
            Fault::Stall | Fault::BlackHole => {
                if mode.changed().await.is_err() {
                    return End::Error;
                }
                continue;
            }
            Fault::Pass => buf.len(),
            // Twenty steps a second: smooth enough, and at least one byte a step.
            Fault::Slow(rate) => ((rate / 20) as usize).clamp(1, buf.len()),
        };
        let n = tokio::select! {
            r = rd.read(&mut buf[..limit]) => match r {
                Ok(0) => {
                    let _ = wr.shutdown().await;
                    return End::Eof;
                }
                Ok(n) => n,
                Err(_) => return End::Error,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return End::Error;
                }
                continue;
            }
        };
        // A change of mode while the bytes are on their way: they are already read, so
        // they go out (only a reset drops them), then the new mode rules.
        tokio::select! {
            w = wr.write_all(&buf[..n]) => if w.is_err() {
                return End::Error;
            },
            _ = mode.wait_for(|c| c.resets != born) => return End::Reset,
        }
        if let Some(left) = budget.as_mut() {
            *left -= n as u64;
        }
        if let Fault::Slow(rate) = now.mode {
            let pause = Duration::from_secs_f64(n as f64 / rate.max(1) as f64);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = mode.wait_for(|c| c.resets != born) => return End::Reset,
            }
        }
    }
}

/// A direction past its `BlackHoleAfter` count: reads and drops whatever comes, passes
/// on nothing (not even the source's close), until a reset.
async fn swallow<R>(
    rd: &mut R,
    buf: &mut [u8],
    mut mode: watch::Receiver<Ctl>,
    born: u64,
    counts: &Counts,
) -> End
where
    R: tokio::io::AsyncRead + Unpin,
{
    let reset = async {
        let _ = mode.wait_for(|c| c.resets != born).await;
    };
    tokio::pin!(reset);
    loop {
        tokio::select! {
            r = rd.read(buf) => match r {
                Ok(0) | Err(_) => {
                    (&mut reset).await;
                    return End::Reset;
                }
                Ok(n) => {
                    counts.swallowed.fetch_add(n as u64, Relaxed);
                }
            },
            () = &mut reset => return End::Reset,
        }
    }
}
