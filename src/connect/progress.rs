//! When the peer last took bytes: a transport wrapper that notes every write that moved
//! some. A session's write is then bounded by the time without progress, not by the time
//! a whole message takes: a multi-megabyte snapshot over a slow link is not a dead peer
//! as long as bytes flow (PROTOCOL.md §4.5 bounds silence, not throughput).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_tungstenite::MaybeTlsStream;

/// The moment of the last write that moved bytes; shared between the wrapper and the
/// session that reads it.
#[derive(Clone, Debug)]
pub struct WriteClock(Arc<Mutex<Instant>>);

impl WriteClock {
    fn new() -> Self {
        WriteClock(Arc::new(Mutex::new(Instant::now())))
    }

    pub fn last(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tick(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

/// `inner`, with its writes noted on a [`WriteClock`].
#[derive(Debug)]
pub struct Progress<S> {
    inner: S,
    clock: WriteClock,
}

impl<S> Progress<S> {
    pub fn new(inner: S) -> Self {
        Progress {
            inner,
            clock: WriteClock::new(),
        }
    }

    pub fn clock(&self) -> WriteClock {
        self.clock.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Progress<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Progress<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written
            && n > 0
        {
            this.clock.tick();
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What a session runs over: the dialled socket, or an in-memory pipe in tests; either
/// way with a [`WriteClock`] below any TLS, so it counts bytes the network took.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send {
    fn write_clock(&self) -> WriteClock;
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Transport for Progress<S> {
    fn write_clock(&self) -> WriteClock {
        self.clock()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Transport for MaybeTlsStream<Progress<S>> {
    fn write_clock(&self) -> WriteClock {
        match self {
            MaybeTlsStream::Plain(s) => s.clock(),
            MaybeTlsStream::Rustls(s) => s.get_ref().0.clock(),
            // tokio-tungstenite's enum is non-exhaustive; the manager builds no other.
            _ => WriteClock::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn the_clock_moves_when_bytes_are_taken_not_while_blocked() {
        let (ours, mut theirs) = tokio::io::duplex(4);
        let mut ours = Progress::new(ours);
        let clock = ours.clock();
        let start = Instant::now();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        ours.write_all(b"abcd").await.unwrap();
        assert_eq!(clock.last() - start, std::time::Duration::from_secs(1));
        // The pipe is full: a blocked write moves nothing.
        let blocked = tokio::spawn(async move {
            ours.write_all(b"efgh").await.unwrap();
            ours
        });
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert_eq!(clock.last() - start, std::time::Duration::from_secs(1));
        let mut buf = [0; 4];
        theirs.read_exact(&mut buf).await.unwrap();
        blocked.await.unwrap();
        assert_eq!(clock.last() - start, std::time::Duration::from_secs(6));
    }
}
