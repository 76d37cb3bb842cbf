//! Capped exponential backoff with full jitter, a plain value: the randomness is an
//! argument of [`Backoff::next_delay_with`], so tests are deterministic; [`system_random`]
//! draws from the operating system through ring. The control-plane connection
//! (`connect::backoff`) and the watches (`store::watch`) each hold their own.

use std::sync::OnceLock;
use std::time::Duration;

/// Why a backoff was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBackoff {
    /// Delays are whole milliseconds (see [`Backoff::next_delay_with`]); a smaller
    /// floor, and above all zero, would retry in a tight loop.
    #[error("the initial backoff must be at least 1 ms, got {0:?}")]
    InitialTooSmall(Duration),
    #[error("the maximum backoff {max:?} is below the initial backoff {initial:?}")]
    MaxBelowInitial { initial: Duration, max: Duration },
}

/// Capped exponential backoff with full jitter: the `n`th delay (from 0) is uniform in
/// `[0, min(max, initial × 2ⁿ)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    /// Delays handed out since the last reset; saturates instead of wrapping.
    pub(crate) attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Result<Self, InvalidBackoff> {
        if initial < Duration::from_millis(1) {
            return Err(InvalidBackoff::InitialTooSmall(initial));
        }
        if max < initial {
            return Err(InvalidBackoff::MaxBelowInitial { initial, max });
        }
        Ok(Backoff {
            initial,
            max,
            attempt: 0,
        })
    }

    /// How many delays were handed out since the last reset.
    #[cfg(test)]
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The upper bound of the delay for `attempt`: `min(max, initial × 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        // Doubling from ≥ 1 ms reaches even `Duration::MAX` within 75 steps, so this loop is
        // short however large `attempt` is, and saturating math cannot overflow.
        let mut ceiling = self.initial;
        for _ in 0..attempt {
            if ceiling >= self.max {
                break;
            }
            ceiling = ceiling.saturating_mul(2);
        }
        ceiling.min(self.max)
    }

    /// The next delay, with `random` supplying uniformly distributed `u64`s.
    ///
    /// Delays are whole milliseconds: tokio's timer has millisecond resolution, so
    /// finer jitter would be rounded anyway, and whole milliseconds let paused-clock
    /// tests compare instants exactly.
    pub fn next_delay_with(&mut self, mut random: impl FnMut() -> u64) -> Duration {
        let ceiling = self.ceiling(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        // A ceiling past u64::MAX ms (585 million years) is clamped; then the
        // multiply-high maps `random` uniformly onto 0..=ceiling_ms without overflow.
        let ceiling_ms = u64::try_from(ceiling.as_millis())
            .unwrap_or(u64::MAX)
            .min(u64::MAX - 1);
        let span = u128::from(ceiling_ms) + 1;
        let ms = (u128::from(random()) * span) >> 64;
        // `ms <= ceiling_ms`, so the conversion cannot fail.
        Duration::from_millis(u64::try_from(ms).unwrap_or(ceiling_ms))
    }

    /// Back to the first, shortest delay: the session was welcomed.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A uniformly random `u64` from ring's `SystemRandom` (reached through rustls's ring
/// provider, which wraps it).
pub(crate) fn system_random() -> u64 {
    static SOURCE: OnceLock<&'static dyn rustls::crypto::SecureRandom> = OnceLock::new();
    let source = SOURCE.get_or_init(|| rustls::crypto::ring::default_provider().secure_random);
    let mut bytes = [0; 8];
    match source.fill(&mut bytes) {
        Ok(()) => u64::from_ne_bytes(bytes),
        // Without randomness wait the full ceiling: never shorter than the schedule.
        Err(_) => u64::MAX,
    }
}
