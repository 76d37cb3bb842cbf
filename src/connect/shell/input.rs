//! A session's input waiting for its process (TRUST.md §5): one buffer of bytes however
//! the control plane cut it into messages, bounded in the memory it holds (its
//! capacity, not its payload): 1 MiB for a session, 16 MiB for all the manager's
//! sessions together. A million one-byte messages cost a megabyte, not a million
//! allocations.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// What one session's waiting input may hold in memory.
pub const SESSION_LIMIT: usize = 1 << 20;
/// What the waiting input of all the manager's sessions may hold, together.
pub const ALL_LIMIT: usize = 16 << 20;
/// The smallest buffer allocated: a keystroke's worth, and then some.
const MIN_CAPACITY: usize = 64;

/// The memory the waiting input of every session holds, together: one per manager
/// (`Link::shell_input`), so sessions of an ending connection count until they end.
pub type Held = Arc<AtomicUsize>;

/// One session's input: appended by the connection, taken by the session's exec.
pub struct Input {
    bytes: Mutex<VecDeque<u8>>,
    ready: Notify,
    held: Held,
}

impl Input {
    pub fn new(held: Held) -> Input {
        Input {
            bytes: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            held,
        }
    }

    /// Appends `data` for the process, or says which bound it would break (nothing of
    /// it is kept then). Called by the connection's one task, so no other `push` can
    /// race the check of [`ALL_LIMIT`]; a `take` meanwhile only frees memory.
    pub fn push(&self, data: &[u8]) -> Result<(), String> {
        let mut q = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let len = q.len() + data.len();
        if len > SESSION_LIMIT {
            return Err(format!(
                "over {SESSION_LIMIT} bytes of input waiting for the process to read them"
            ));
        }
        let capacity = q.capacity();
        if len > capacity {
            // Doubling, as a Vec grows, but never past the session's bound.
            let target = (capacity * 2).max(len).clamp(MIN_CAPACITY, SESSION_LIMIT);
            let more = target - capacity;
            if self.held.load(Relaxed) + more > ALL_LIMIT {
                return Err(format!(
                    "over {ALL_LIMIT} bytes of input waiting in all sessions together"
                ));
            }
            let additional = target - q.len();
            q.reserve_exact(additional);
            self.held.fetch_add(q.capacity() - capacity, Relaxed);
        }
        q.extend(data);
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// Waits for input, then moves as much of it as fits into `out`: the bytes moved
    /// (never 0). Cancel-safe: nothing is taken until it returns. An emptied buffer is
    /// given back, so an idle session holds nothing.
    pub async fn take(&self, out: &mut [u8]) -> usize {
        loop {
            {
                let mut q = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
                if !q.is_empty() && !out.is_empty() {
                    let n = out.len().min(q.len());
                    let (a, b) = q.as_slices();
                    let from_a = n.min(a.len());
                    out[..from_a].copy_from_slice(&a[..from_a]);
                    out[from_a..n].copy_from_slice(&b[..n - from_a]);
                    q.drain(..n);
                    if q.is_empty() {
                        self.held.fetch_sub(q.capacity(), Relaxed);
                        *q = VecDeque::new();
                    }
                    return n;
                }
            }
            // A `push` between the check and here leaves a permit: no wake-up is lost.
            self.ready.notified().await;
        }
    }

    /// Bytes waiting (for the tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.bytes.lock().unwrap().len()
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        let q = self.bytes.get_mut().unwrap_or_else(|e| e.into_inner());
        self.held.fetch_sub(q.capacity(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However the bytes are cut, the session's bound is 1 MiB of memory: a million
    /// one-byte pushes and one push of a megabyte fill it alike, the next byte is
    /// refused, and what is held is the buffer's capacity, never more than the bound.
    #[tokio::test]
    async fn the_bound_is_in_bytes_of_memory_however_the_input_is_cut() {
        for cut in [1, 7, 4096, SESSION_LIMIT] {
            let held = Held::default();
            let input = Input::new(held.clone());
            let chunk = vec![b'x'; cut];
            for _ in 0..SESSION_LIMIT / cut {
                input.push(&chunk).unwrap();
            }
            let rest = SESSION_LIMIT % cut;
            input.push(&chunk[..rest]).unwrap();
            assert_eq!(input.len(), SESSION_LIMIT, "cut {cut}");
            assert_eq!(
                input.push(b"y").unwrap_err(),
                "over 1048576 bytes of input waiting for the process to read them"
            );
            assert_eq!(held.load(Relaxed), SESSION_LIMIT, "cut {cut}");
            // Taken in 32 KiB pieces, in order; emptied, it holds nothing.
            let mut out = vec![0u8; 32 * 1024];
            let mut taken = 0;
            while taken < SESSION_LIMIT {
                let n = input.take(&mut out).await;
                assert!(out[..n].iter().all(|b| *b == b'x'));
                taken += n;
            }
            assert_eq!(held.load(Relaxed), 0);
            input.push(b"z").unwrap();
            assert_eq!(held.load(Relaxed), MIN_CAPACITY);
            drop(input);
            assert_eq!(held.load(Relaxed), 0, "dropped, it gives its memory back");
        }
    }

    /// All sessions together hold at most 16 MiB: the 17th session's first megabyte
    /// does not fit while 16 are full, and fits once one of them was read.
    #[tokio::test]
    async fn all_sessions_together_hold_at_most_sixteen_mib() {
        let held = Held::default();
        let inputs: Vec<Input> = (0..17).map(|_| Input::new(held.clone())).collect();
        let mib = vec![b'x'; SESSION_LIMIT];
        for input in &inputs[..16] {
            input.push(&mib).unwrap();
        }
        assert_eq!(held.load(Relaxed), ALL_LIMIT);
        assert_eq!(
            inputs[16].push(b"a").unwrap_err(),
            "over 16777216 bytes of input waiting in all sessions together"
        );
        let mut out = vec![0u8; SESSION_LIMIT];
        assert_eq!(inputs[0].take(&mut out).await, SESSION_LIMIT);
        inputs[16].push(&mib).unwrap();
        assert_eq!(held.load(Relaxed), ALL_LIMIT);
    }

    /// Order is kept across the ring's wrap, and a waiting `take` wakes on a `push`.
    #[tokio::test(start_paused = true)]
    async fn bytes_come_out_in_order_and_a_waiting_take_wakes() {
        let input = Arc::new(Input::new(Held::default()));
        let reader = {
            let input = input.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut out = [0u8; 5];
                while got.len() < 1000 {
                    let n = input.take(&mut out).await;
                    got.extend_from_slice(&out[..n]);
                }
                got
            })
        };
        let want: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        for piece in want.chunks(3) {
            input.push(piece).unwrap();
            tokio::task::yield_now().await;
        }
        assert_eq!(reader.await.unwrap(), want);
    }
}
