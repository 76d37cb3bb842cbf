//! How long to wait before dialling the control plane again (PROTOCOL.md §4.6–4.8).
//!
//! [`Backoff`] is a plain value: capped exponential growth with full jitter. The
//! randomness is an argument of [`Backoff::next_delay_with`], so tests are deterministic;
//! [`Reconnect::delay`] draws from the operating system through ring. [`Reconnect`]
//! holds the three waits of the spec and picks one per [`Retry`].

use std::time::Duration;

pub(crate) use crate::backoff::system_random;
pub use crate::backoff::{Backoff, InvalidBackoff};

/// Why the session is about to wait before dialling again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Refused, unreachable, TLS, 404, dead connection (a silent peer too), close
    /// 4002 `protocol error`, …: the normal schedule.
    Normal,
    /// Upgrade answered 401/403, or close 4001 `token revoked`: the same growth, with
    /// a longer cap so a revoked token does not hammer the platform.
    Rejected,
    /// Close 4000 or reason `evicted by newer connection`: a newer connection took the
    /// deployment; wait the fixed eviction delay so two installs sharing a token do not
    /// flap.
    Evicted,
    /// Close 1009 (RFC 6455 "message too big"): the control plane refused a message, in
    /// practice the snapshot, the one message that grows with the cluster. Dialling
    /// again would send it again: the normal schedule, then the dial loop waits until
    /// the snapshot has shrunk below the refused size, or [`TOO_BIG_RETRY`].
    TooBig,
}

/// After a snapshot was refused as too big, the longest wait before trying it again
/// unshrunk: the platform may have raised its limit (one resend an hour, not a loop).
pub const TOO_BIG_RETRY: Duration = Duration::from_secs(3600);

impl Retry {
    /// The schedule for an upgrade refused with this HTTP status.
    pub fn for_upgrade_status(status: u16) -> Retry {
        match status {
            401 | 403 => Retry::Rejected,
            _ => Retry::Normal,
        }
    }

    /// The schedule after the control plane closed the socket with this code and reason.
    ///
    /// Eviction is recognised by the code 4000 or by the documented reason
    /// [`EVICTION_REASON`] (ASCII case and surrounding blanks aside) whatever the code:
    /// a real platform, or a proxy in front of it, may close with another code, and
    /// missing an eviction makes two installs sharing a token flap. Then 4001 is a
    /// revoked token; anything else the normal schedule (4002 included).
    pub fn for_close(code: u16, reason: &str) -> Retry {
        if code == 4000 || reason.trim().eq_ignore_ascii_case(EVICTION_REASON) {
            return Retry::Evicted;
        }
        match code {
            4001 => Retry::Rejected,
            1009 => Retry::TooBig,
            _ => Retry::Normal,
        }
    }
}

/// The close reason of an eviction (PROTOCOL.md §4.7).
pub const EVICTION_REASON: &str = "evicted by newer connection";

/// The rejected-token cap as a multiple of the normal cap: §4.6 says 60 s and 5 min,
/// and keeping the ratio makes `AUTONOMIC_BACKOFF_MAX_MS` tune both schedules.
pub const REJECTED_CAP_FACTOR: u32 = 5;

/// The waits between connection attempts, one schedule per [`Retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    normal: Backoff,
    rejected: Backoff,
    eviction_delay: Duration,
}

impl Reconnect {
    /// `initial` and `max` are the normal schedule; the rejected one shares `initial`
    /// and caps at `max × REJECTED_CAP_FACTOR`.
    pub fn new(
        initial: Duration,
        max: Duration,
        eviction_delay: Duration,
    ) -> Result<Self, InvalidBackoff> {
        Ok(Reconnect {
            normal: Backoff::new(initial, max)?,
            rejected: Backoff::new(initial, max.saturating_mul(REJECTED_CAP_FACTOR))?,
            eviction_delay,
        })
    }

    /// How long to wait before the next dial, advancing that reason's schedule; the
    /// jitter is drawn from `random` (see [`Backoff::next_delay_with`]).
    pub fn delay(&mut self, why: Retry, random: impl FnMut() -> u64) -> Duration {
        match why {
            Retry::Normal | Retry::TooBig => self.normal.next_delay_with(random),
            Retry::Rejected => self.rejected.next_delay_with(random),
            Retry::Evicted => self.eviction_delay,
        }
    }

    /// A `welcome` arrived: both schedules start over.
    pub fn reset(&mut self) {
        self.normal.reset();
        self.rejected.reset();
    }

    #[cfg(test)]
    fn normal(&self) -> &Backoff {
        &self.normal
    }

    #[cfg(test)]
    fn rejected(&self) -> &Backoff {
        &self.rejected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's schedules (§4.6–4.8), the configuration's defaults.
    fn spec() -> Reconnect {
        let config = crate::config::Config::parse(|_| None).unwrap();
        let r = Reconnect::new(
            config.backoff_initial,
            config.backoff_max,
            config.eviction_delay,
        );
        assert_eq!(r, Reconnect::new(secs(1), secs(60), secs(300)));
        r.unwrap()
    }

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// xorshift64*: a seeded stand-in for the system source.
    fn seeded(mut state: u64) -> impl FnMut() -> u64 {
        state |= 1;
        move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    #[test]
    fn new_validates() {
        assert_eq!(
            Backoff::new(Duration::ZERO, secs(1)),
            Err(InvalidBackoff::InitialTooSmall(Duration::ZERO))
        );
        assert_eq!(
            Backoff::new(Duration::from_micros(999), secs(1)),
            Err(InvalidBackoff::InitialTooSmall(Duration::from_micros(999)))
        );
        assert_eq!(
            Backoff::new(secs(2), secs(1)),
            Err(InvalidBackoff::MaxBelowInitial {
                initial: secs(2),
                max: secs(1)
            })
        );
        assert!(Backoff::new(secs(1), secs(1)).is_ok());
        assert!(Backoff::new(Duration::from_millis(1), Duration::MAX).is_ok());
        assert!(Reconnect::new(Duration::ZERO, secs(1), secs(1)).is_err());
    }

    #[test]
    fn normal_ceilings_double_from_1s_and_cap_at_60s() {
        let normal = *spec().normal();
        let ceilings: Vec<u64> = (0..9).map(|n| normal.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn rejected_ceilings_reach_5_minutes() {
        let rejected = *spec().rejected();
        let ceilings: Vec<u64> = (0..11).map(|n| rejected.ceiling(n).as_secs()).collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    }

    #[test]
    fn huge_attempts_do_not_overflow() {
        for (initial, max) in [
            (secs(1), secs(60)),
            (Duration::from_millis(1), Duration::MAX),
            (Duration::MAX, Duration::MAX),
        ] {
            let mut backoff = Backoff::new(initial, max).unwrap();
            for n in 0..200 {
                assert!(backoff.ceiling(n) <= backoff.ceiling(n + 1));
            }
            for n in [127, 128, 1000, u32::MAX - 1, u32::MAX] {
                assert_eq!(backoff.ceiling(n), max, "{initial:?} {max:?} {n}");
            }
            backoff.attempt = u32::MAX - 1;
            let mut random = seeded(3);
            for _ in 0..3 {
                assert!(backoff.next_delay_with(&mut random) <= max);
            }
            assert_eq!(backoff.attempt(), u32::MAX);
            // The extremes of the random source stay in range too.
            assert_eq!(backoff.next_delay_with(|| 0), Duration::ZERO);
            assert!(backoff.next_delay_with(|| u64::MAX) <= max);
        }
    }

    #[test]
    fn jittered_delays_stay_within_their_ceiling() {
        let schedules = [
            Backoff::new(secs(1), secs(60)).unwrap(),
            Backoff::new(secs(1), secs(300)).unwrap(),
            Backoff::new(Duration::from_millis(1), Duration::from_millis(7)).unwrap(),
            Backoff::new(Duration::from_millis(50), secs(2)).unwrap(),
        ];
        for seed in 0..500 {
            let mut random = seeded(seed);
            for schedule in schedules {
                let mut backoff = schedule;
                for n in 0..40 {
                    let delay = backoff.next_delay_with(&mut random);
                    assert!(delay <= schedule.ceiling(n), "seed {seed} attempt {n}");
                    assert_eq!(delay.subsec_nanos() % 1_000_000, 0, "whole ms");
                }
            }
        }
    }

    #[test]
    fn jitter_spans_the_whole_range() {
        // Full jitter: both ends of [0, ceiling] are reachable and the mean is half.
        let mut backoff = Backoff::new(secs(60), secs(60)).unwrap();
        assert_eq!(backoff.next_delay_with(|| 0), Duration::ZERO);
        assert_eq!(backoff.next_delay_with(|| u64::MAX), secs(60));
        let mut random = seeded(42);
        let n = 20_000;
        let total: Duration = (0..n).map(|_| backoff.next_delay_with(&mut random)).sum();
        let mean = total.as_secs_f64() / f64::from(n);
        assert!((29.0..31.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn system_randomness_stays_in_range_and_varies() {
        let mut reconnect = Reconnect::new(secs(60), secs(60), secs(1)).unwrap();
        let delays: Vec<Duration> = (0..32)
            .map(|_| reconnect.delay(Retry::Normal, system_random))
            .collect();
        assert!(delays.iter().all(|d| *d <= secs(60)));
        assert!(delays.iter().any(|d| *d != delays[0]), "{delays:?}");
    }

    #[test]
    fn reset_returns_to_the_floor() {
        let mut backoff = Backoff::new(secs(1), secs(60)).unwrap();
        for _ in 0..10 {
            backoff.next_delay_with(|| u64::MAX);
        }
        assert_eq!(backoff.attempt(), 10);
        assert_eq!(backoff.next_delay_with(|| u64::MAX), secs(60));
        backoff.reset();
        assert_eq!(backoff.attempt(), 0);
        assert_eq!(backoff.next_delay_with(|| u64::MAX), secs(1));
        assert_eq!(backoff.next_delay_with(|| u64::MAX), secs(2));
    }

    #[test]
    fn reconnect_picks_the_schedule_for_the_reason() {
        let mut reconnect = spec();
        let max = || u64::MAX;
        let delays: Vec<u64> = (0..8)
            .map(|_| reconnect.delay(Retry::Normal, max).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        // Each reason grows on its own; eviction is fixed and un-jittered.
        let delays: Vec<u64> = (0..11)
            .map(|_| reconnect.delay(Retry::Rejected, max).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(reconnect.delay(Retry::Evicted, || 0), secs(300));
        assert_eq!(reconnect.delay(Retry::Evicted, system_random), secs(300));
        reconnect.reset();
        assert_eq!(reconnect.delay(Retry::Normal, max), secs(1));
        assert_eq!(reconnect.delay(Retry::Rejected, max), secs(1));

        // Tuned for tests: the rejected cap keeps its ratio to the normal one.
        let mut fast = Reconnect::new(
            Duration::from_millis(10),
            Duration::from_millis(40),
            Duration::from_millis(500),
        )
        .unwrap();
        assert_eq!(
            fast.rejected().ceiling(u32::MAX),
            Duration::from_millis(200)
        );
        let delays: Vec<u128> = (0..6)
            .map(|_| fast.delay(Retry::Rejected, max).as_millis())
            .collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 200]);
        assert_eq!(
            fast.delay(Retry::Evicted, system_random),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn retry_reasons_follow_the_spec() {
        assert_eq!(Retry::for_upgrade_status(401), Retry::Rejected);
        assert_eq!(Retry::for_upgrade_status(403), Retry::Rejected);
        for status in [404, 500, 502, 200] {
            assert_eq!(Retry::for_upgrade_status(status), Retry::Normal);
        }
    }

    #[test]
    fn close_code_and_reason_classify_the_retry() {
        use Retry::*;
        // (code, reason, retry): §4.7, eviction by either the code or the documented reason.
        let cases: &[(u16, &str, Retry)] = &[
            (4000, "evicted by newer connection", Evicted),
            (4000, "", Evicted),
            (4000, "anything", Evicted),
            (1000, "evicted by newer connection", Evicted),
            (1008, "evicted by newer connection", Evicted),
            (4999, "Evicted by newer connection", Evicted),
            (1000, " evicted by newer connection ", Evicted),
            (4002, "evicted by newer connection", Evicted),
            (4001, "evicted by newer connection", Evicted),
            (4001, "token revoked", Rejected),
            (4001, "", Rejected),
            (4002, "protocol error", Normal),
            (1009, "message too big", TooBig),
            (1009, "", TooBig),
            (1000, "", Normal),
            (1000, "bye", Normal),
            (1001, "going away", Normal),
            (1006, "", Normal),
            (1011, "internal error", Normal),
            (4999, "", Normal),
            // Not the documented text: only a look-alike.
            (1000, "evicted", Normal),
            (1000, "not evicted by newer connection", Normal),
        ];
        for &(code, reason, retry) in cases {
            assert_eq!(Retry::for_close(code, reason), retry, "{code} {reason:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn sleeping_the_delays_advances_paused_time_by_exactly_them() {
        let mut backoff = Backoff::new(Duration::from_millis(250), secs(60)).unwrap();
        let mut random = seeded(7);
        let start = tokio::time::Instant::now();
        let mut expected = Duration::ZERO;
        for _ in 0..12 {
            let delay = backoff.next_delay_with(&mut random);
            let before = tokio::time::Instant::now();
            tokio::time::sleep(delay).await;
            assert_eq!(tokio::time::Instant::now() - before, delay);
            expected += delay;
        }
        assert_eq!(tokio::time::Instant::now() - start, expected);
        assert!(expected > Duration::ZERO);
    }
}
