//! The link's figures: the reasons a dial fails and a session ends (each label written
//! once), the histograms' buckets, and the `/metrics` families the link exports.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use tokio::sync::Notify;

use super::Link;
use crate::audit::AuditLog;
use crate::metrics::{Histogram, family};

/// Change seen → delta written: deltas coalesce for 100 ms, so most fall below 0.15 s.
const DELTA_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Snapshot frames: about 1 KB per Agent, so 1 KiB to 64 MiB in powers of 4.
const SNAPSHOT_BYTES: &[f64] = &[
    1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];
const SNAPSHOT_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Defines a closed set of reasons with their label values, each name written once.
macro_rules! reasons {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $label:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vm])* $variant,)+ }

        impl $name {
            pub const ALL: &[$name] = &[$($name::$variant,)+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $label,)+ }
            }

            pub(super) fn index(self) -> usize {
                self as usize
            }
        }
    };
}

reasons! {
    /// Why a control-plane session ended, as `autonomic_disconnects_total` counts it.
    Disconnect {
        /// Nothing arrived, or nothing could be written, for 3 heartbeat intervals.
        Dead = "dead",
        /// The socket failed or ended without a close frame; a report failed.
        Dropped = "dropped",
        /// Closed by the control plane, for another reason than the two below.
        Closed = "closed",
        /// Closed by the control plane: a newer connection with the same token.
        Evicted = "evicted",
        /// Closed by the control plane: the token is revoked.
        Rejected = "rejected",
        /// Closed by the control plane with 1009: a message (the snapshot) too big.
        TooBig = "message_too_big",
        /// The manager's own shutdown (or the loss of its Lease).
        Shutdown = "shutdown",
    }
}

reasons! {
    /// Why a dial failed, as `autonomic_dial_failures_total` counts it.
    DialFailure {
        /// The control plane's name did not resolve.
        Dns = "dns",
        /// TCP to the control plane failed.
        Connect = "connect",
        Tls = "tls",
        /// The egress proxy failed or refused the tunnel.
        Proxy = "proxy",
        /// The upgrade or the first report was answered with an HTTP status other than
        /// 401/403.
        HttpStatus = "http_status",
        /// A step of the dial got no answer within its bound.
        Timeout = "timeout",
        /// Refused with 401 or 403, or no token could be read.
        Token = "token",
        /// The peer answered, but not as the control plane does.
        Handshake = "handshake",
    }
}

impl Default for Link {
    fn default() -> Self {
        Link {
            dirty: Mutex::default(),
            dirty_notify: Notify::new(),
            audit: AuditLog::default(),
            outbox: OnceLock::new(),
            shell_input: Default::default(),
            events: Default::default(),
            state: Mutex::default(),
            connected: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
            snapshots_sent: AtomicU64::new(0),
            deltas_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            frames_rejected: AtomicU64::new(0),
            last_welcome: AtomicU64::new(0),
            sessions_open: AtomicU64::new(0),
            heartbeat_rtt_us: AtomicU64::new(0),
            disconnects: Default::default(),
            dial_failures: Default::default(),
            delta_latency: Histogram::new(DELTA_SECONDS),
            snapshot_bytes: Histogram::new(SNAPSHOT_BYTES),
            last_snapshot_bytes: AtomicUsize::new(0),
            snapshot_duration: Histogram::new(SNAPSHOT_SECONDS),
        }
    }
}

/// The link's single-sample families: name, help, and how to read it.
type Sample = (&'static str, &'static str, fn(&Link) -> f64);

fn n(a: &AtomicU64) -> f64 {
    a.load(Relaxed) as f64
}

const SAMPLES: &[Sample] = &[
    (
        "autonomic_connected",
        "1 while the control-plane session is up.",
        |l| f64::from(u8::from(l.is_connected())),
    ),
    (
        "autonomic_shell_sessions_open",
        "Shell sessions open now.",
        |l| n(&l.sessions_open),
    ),
    (
        "autonomic_shell_input_bytes",
        "Memory held by shell input waiting for its processes, all sessions (at most 16 MiB).",
        |l| l.shell_input.load(Relaxed) as f64,
    ),
    (
        "autonomic_heartbeat_rtt_seconds",
        "Round trip of the WebSocket ping sent with the last heartbeat (0 before the first).",
        |l| n(&l.heartbeat_rtt_us) / 1e6,
    ),
    (
        "autonomic_last_welcome_timestamp_seconds",
        "Unix time of the last welcome.",
        |l| n(&l.last_welcome),
    ),
    (
        "autonomic_reconnects_total",
        "Dials after a session ended or failed.",
        |l| n(&l.reconnects),
    ),
    (
        "autonomic_snapshots_sent_total",
        "Snapshot frames sent.",
        |l| n(&l.snapshots_sent),
    ),
    ("autonomic_deltas_sent_total", "Delta frames sent.", |l| {
        n(&l.deltas_sent)
    }),
    (
        "autonomic_bytes_sent_total",
        "Bytes of frames sent: text, shell output and pings.",
        |l| n(&l.bytes_sent),
    ),
    (
        "autonomic_frames_rejected_total",
        "Frames from the control plane answered with an error.",
        |l| n(&l.frames_rejected),
    ),
    (
        "autonomic_audit_queued",
        "Audit events waiting to be sent.",
        |l| l.audit.queued() as f64,
    ),
    (
        "autonomic_audit_queued_bytes",
        "What the queued audit events cost in memory (bounded at 8 MiB).",
        |l| l.audit.queued_bytes() as f64,
    ),
    (
        "autonomic_audit_dropped_total",
        "Audit events dropped because the queue was full (10 000 events or 8 MiB).",
        |l| l.audit.dropped() as f64,
    ),
    (
        "autonomic_audit_outbox_events",
        "Audit events in the in-cluster outbox, as last read or written.",
        |l| n(&l.audit.outbox.events),
    ),
    (
        "autonomic_audit_outbox_writes_total",
        "Writes of the audit outbox (each a batch of events or removals).",
        |l| n(&l.audit.outbox.writes),
    ),
    (
        "autonomic_audit_outbox_dropped_total",
        "Audit events dropped from the outbox because it was full (the oldest).",
        |l| n(&l.audit.outbox.dropped),
    ),
    (
        "autonomic_audit_outbox_malformed_total",
        "Entries of the audit outbox skipped because they were no event.",
        |l| n(&l.audit.outbox.malformed),
    ),
    (
        "autonomic_audit_outbox_delivered_total",
        "Audit events sent from the outbox that this manager had not queued itself.",
        |l| n(&l.audit.outbox.delivered),
    ),
];

impl Link {
    /// The link's families of `/metrics`, the audit queue's and outbox's among them.
    pub fn render(&self, out: &mut String) {
        for (name, help, value) in SAMPLES {
            family(out, name, help, value(self));
        }
        let by_reason =
            |out: &mut String, name: &str, help: &str, values: &[AtomicU64], labels: &[&str]| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
                for (value, reason) in values.iter().zip(labels) {
                    let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {}", value.load(Relaxed));
                }
            };
        by_reason(
            out,
            "autonomic_disconnects_total",
            "Control-plane sessions ended, by reason.",
            &self.disconnects,
            &Disconnect::ALL
                .iter()
                .map(|d| d.as_str())
                .collect::<Vec<_>>(),
        );
        by_reason(
            out,
            "autonomic_dial_failures_total",
            "Dials of the control plane that failed, by reason.",
            &self.dial_failures,
            &DialFailure::ALL
                .iter()
                .map(|d| d.as_str())
                .collect::<Vec<_>>(),
        );
        for (name, help, h) in [
            (
                "autonomic_delta_latency_seconds",
                "From a watch event marking an object changed to the write of the delta frame carrying it.",
                &self.delta_latency,
            ),
            (
                "autonomic_snapshot_bytes",
                "Size of the snapshot frames sent.",
                &self.snapshot_bytes,
            ),
            (
                "autonomic_snapshot_duration_seconds",
                "Time to build and write a snapshot frame.",
                &self.snapshot_duration,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            h.render(out, name, "");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bucket_list_ascends() {
        for b in [DELTA_SECONDS, SNAPSHOT_BYTES, SNAPSHOT_SECONDS] {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
    }

    #[test]
    fn each_reason_has_its_own_label_and_counter() {
        let labels: Vec<&str> = Disconnect::ALL.iter().map(|d| d.as_str()).collect();
        assert_eq!(
            labels,
            [
                "dead",
                "dropped",
                "closed",
                "evicted",
                "rejected",
                "message_too_big",
                "shutdown"
            ]
        );
        for (i, d) in DialFailure::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
        let link = Link::default();
        link.dial_failures[DialFailure::Tls.index()].fetch_add(1, Relaxed);
        link.disconnects[Disconnect::Evicted.index()].fetch_add(2, Relaxed);
        let mut out = String::new();
        link.render(&mut out);
        assert!(
            out.contains("autonomic_disconnects_total{reason=\"evicted\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("autonomic_disconnects_total{reason=\"dead\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("autonomic_dial_failures_total{reason=\"tls\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("autonomic_dial_failures_total{reason=\"dns\"} 0"),
            "{out}"
        );
    }
}
