//! Counters, gauges and histograms, rendered in the Prometheus text format. Plain atomics:
//! a metrics library would be more code than the handful of series we publish.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::crd::Kind;

/// Every metric family `/metrics` exports, by name (a histogram by its base name, its
/// samples being `_bucket`, `_sum` and `_count`). The one list: a test checks that the
/// rendered text has exactly these families, and the chart's test that every expression
/// of the dashboard and the alert rules names one of them.
pub const SERIES: &[&str] = &[
    "autonomic_build_info",
    "autonomic_reconciles_total",
    "autonomic_reconcile_errors_total",
    "autonomic_reconcile_duration_seconds",
    "autonomic_connected",
    "autonomic_managed",
    "autonomic_leader",
    "autonomic_shell_sessions_open",
    "autonomic_shell_input_bytes",
    "autonomic_heartbeat_rtt_seconds",
    "autonomic_last_welcome_timestamp_seconds",
    "autonomic_reconnects_total",
    "autonomic_snapshots_sent_total",
    "autonomic_deltas_sent_total",
    "autonomic_bytes_sent_total",
    "autonomic_frames_rejected_total",
    "autonomic_audit_queued",
    "autonomic_audit_queued_bytes",
    "autonomic_audit_dropped_total",
    "autonomic_audit_outbox_events",
    "autonomic_audit_outbox_writes_total",
    "autonomic_audit_outbox_dropped_total",
    "autonomic_audit_outbox_malformed_total",
    "autonomic_audit_outbox_delivered_total",
    "autonomic_queue_depth",
    "autonomic_watches_synced",
    "autonomic_agents",
    "autonomic_tools",
    "autonomic_disconnects_total",
    "autonomic_dial_failures_total",
    "autonomic_delta_latency_seconds",
    "autonomic_snapshot_bytes",
    "autonomic_snapshot_duration_seconds",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// The families of [`SERIES`] that are histograms.
pub const HISTOGRAMS: &[&str] = &[
    "autonomic_reconcile_duration_seconds",
    "autonomic_delta_latency_seconds",
    "autonomic_snapshot_bytes",
    "autonomic_snapshot_duration_seconds",
];

/// The families of [`SERIES`] read from `/proc/self`: exported on Linux only.
pub const PROCESS_SERIES: &[&str] = &[
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// Reconcile durations: a cached no-op takes about a millisecond, an API round trip tens.
const RECONCILE_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// A histogram of fixed buckets. `bounds` are the buckets' upper edges, ascending; a
/// value equal to an edge falls in that bucket (Prometheus' `le`). Counts are per bucket,
/// made cumulative when rendered; the last count is the overflow (`+Inf` only).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    /// The sum of observations, an `f64`'s bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "ascending bounds");
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.partition_point(|b| *b < value);
        self.counts[bucket].fetch_add(1, Relaxed);
        // No float atomics: a compare-and-swap loop, uncontended in practice.
        let _ = self.sum.fetch_update(Relaxed, Relaxed, |s| {
            Some((f64::from_bits(s) + value).to_bits())
        });
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Observations so far.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    #[cfg(test)]
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Relaxed))
    }

    /// The `_bucket`, `_sum` and `_count` lines; `labels` are the family's others
    /// (`kind="Agent"`), or empty. `_count` equals the `+Inf` bucket, always.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sum = f64::from_bits(self.sum.load(Relaxed));
        let _ = writeln!(
            out,
            "{name}_sum{braces} {sum}\n{name}_count{braces} {cumulative}"
        );
    }
}

/// One family of a single sample: a name ending in `_total` is a counter (Prometheus
/// naming), any other a gauge.
pub fn family(out: &mut String, name: &str, help: &str, value: f64) {
    let kind = if name.ends_with("_total") {
        "counter"
    } else {
        "gauge"
    };
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

pub struct Metrics {
    reconciles: [AtomicU64; 4],
    reconcile_errors: [AtomicU64; 4],
    reconcile_duration: [Histogram; 4],
    /// This replica holds the Lease (always, without leader election) and reconciles.
    pub leader: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Default::default(),
            reconcile_errors: Default::default(),
            reconcile_duration: std::array::from_fn(|_| Histogram::new(RECONCILE_SECONDS)),
            leader: AtomicBool::new(false),
        }
    }
}

fn idx(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Metrics {
    pub fn reconciled(&self, kind: Kind, ok: bool, took: Duration) {
        self.reconciles[idx(kind)].fetch_add(1, Relaxed);
        if !ok {
            self.reconcile_errors[idx(kind)].fetch_add(1, Relaxed);
        }
        self.reconcile_duration[idx(kind)].observe_duration(took);
    }

    /// The exposition text; `series` are sampled by the caller at scrape time (see
    /// [`family`]), `more` writes the families of other parts (the link's). Then the
    /// process's own figures where the platform has them.
    pub fn render(&self, series: &[(&str, &str, f64)], more: impl FnOnce(&mut String)) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP autonomic_build_info The running build: 1, with its version, git revision and target as labels.\n\
             # TYPE autonomic_build_info gauge\n\
             autonomic_build_info{{version=\"{}\",revision=\"{}\",target=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            env!("AUTONOMIC_BUILD_REVISION"),
            env!("AUTONOMIC_BUILD_TARGET"),
        );
        let per_kind = [
            (
                "autonomic_reconciles_total",
                "Reconciles run, by kind.",
                &self.reconciles,
            ),
            (
                "autonomic_reconcile_errors_total",
                "Reconciles that failed and were retried, by kind.",
                &self.reconcile_errors,
            ),
        ];
        for (name, help, values) in per_kind {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for kind in Kind::ALL {
                let _ = writeln!(
                    out,
                    "{name}{{kind=\"{kind}\"}} {}",
                    values[idx(kind)].load(Relaxed)
                );
            }
        }
        let name = "autonomic_reconcile_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time a reconcile took, by kind (failed ones too).\n# TYPE {name} histogram"
        );
        for kind in Kind::ALL {
            self.reconcile_duration[idx(kind)].render(&mut out, name, &format!("kind=\"{kind}\""));
        }
        for (name, help, value) in series {
            family(&mut out, name, help, *value);
        }
        more(&mut out);
        if let Some(p) = process::read() {
            p.render(&mut out);
        }
        out
    }
}

/// The process's own figures, named as Prometheus' client libraries name them, read from
/// `/proc/self` on Linux (absent elsewhere).
pub mod process {
    use std::fmt::Write;

    /// Linux reports CPU times and start times in clock ticks of `USER_HZ`, which is 100
    /// on every architecture Linux runs (the kernel's ABI; `sysconf(_SC_CLK_TCK)` would
    /// need `unsafe` to ask).
    const TICKS_PER_SECOND: f64 = 100.0;

    #[derive(Debug, Clone, PartialEq)]
    pub struct Stats {
        pub resident_bytes: f64,
        pub cpu_seconds: f64,
        pub start_time_seconds: f64,
        pub open_fds: f64,
        /// The soft limit; infinite when unlimited.
        pub max_fds: f64,
    }

    /// From `/proc/self/stat` (CPU ticks and start ticks after boot), `/proc/self/status`
    /// (`VmRSS`), `/proc/stat` (`btime`), `/proc/self/limits` and the count of
    /// `/proc/self/fd`.
    pub fn parse(
        stat: &str,
        status: &str,
        proc_stat: &str,
        limits: &str,
        open_fds: usize,
    ) -> Option<Stats> {
        // The command name (field 2) is in parentheses and may hold spaces or ')':
        // fields are counted after its last ')'. The first after it is field 3 (state).
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        let cpu_ticks = field(14)? + field(15)?;
        let start_ticks = field(22)?;
        let rss_kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let boot: f64 = proc_stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let soft = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))?
            .split_whitespace()
            .next()?;
        let max_fds = if soft == "unlimited" {
            f64::INFINITY
        } else {
            soft.parse().ok()?
        };
        Some(Stats {
            resident_bytes: rss_kb * 1024.0,
            cpu_seconds: cpu_ticks / TICKS_PER_SECOND,
            start_time_seconds: boot + start_ticks / TICKS_PER_SECOND,
            open_fds: open_fds as f64,
            max_fds,
        })
    }

    /// This process's figures now; `None` off Linux or when `/proc` cannot be read.
    pub fn read() -> Option<Stats> {
        if !cfg!(target_os = "linux") {
            return None;
        }
        let read = |p: &str| std::fs::read_to_string(p).ok();
        // Counts the descriptor that reads the directory too, as the Go client does.
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
        parse(
            &read("/proc/self/stat")?,
            &read("/proc/self/status")?,
            &read("/proc/stat")?,
            &read("/proc/self/limits")?,
            open_fds,
        )
    }

    impl Stats {
        pub(super) fn render(&self, out: &mut String) {
            let series = [
                (
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    "gauge",
                    self.resident_bytes,
                ),
                (
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                    "counter",
                    self.cpu_seconds,
                ),
                (
                    "process_open_fds",
                    "Number of open file descriptors.",
                    "gauge",
                    self.open_fds,
                ),
                (
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    "gauge",
                    self.max_fds,
                ),
                (
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    "gauge",
                    self.start_time_seconds,
                ),
            ];
            for (name, help, kind, value) in series {
                // The text format spells infinity `+Inf`.
                let value = if value == f64::INFINITY {
                    "+Inf".to_owned()
                } else {
                    value.to_string()
                };
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value on an edge falls in that edge's bucket (`le` is "less or equal"); past the
    /// last edge only in `+Inf`; buckets are cumulative and `_count` is the `+Inf` bucket.
    #[test]
    fn histogram_buckets_by_edge_and_renders_cumulative() {
        static EDGES: &[f64] = &[0.1, 1.0, 10.0];
        let h = Histogram::new(EDGES);
        for v in [0.0, 0.1, 0.10001, 1.0, 5.0, 10.0, 11.0, 1e9] {
            h.observe(v);
        }
        assert_eq!(h.count(), 8);
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "kind=\"Agent\"");
        let sum = 0.0 + 0.1 + 0.10001 + 1.0 + 5.0 + 10.0 + 11.0 + 1e9;
        assert_eq!(
            out,
            format!(
                "x_seconds_bucket{{kind=\"Agent\",le=\"0.1\"}} 2\n\
                 x_seconds_bucket{{kind=\"Agent\",le=\"1\"}} 4\n\
                 x_seconds_bucket{{kind=\"Agent\",le=\"10\"}} 6\n\
                 x_seconds_bucket{{kind=\"Agent\",le=\"+Inf\"}} 8\n\
                 x_seconds_sum{{kind=\"Agent\"}} {sum}\n\
                 x_seconds_count{{kind=\"Agent\"}} 8\n"
            )
        );
        let empty = Histogram::new(EDGES);
        let mut out = String::new();
        empty.render(&mut out, "y", "");
        assert_eq!(
            out,
            "y_bucket{le=\"0.1\"} 0\ny_bucket{le=\"1\"} 0\ny_bucket{le=\"10\"} 0\n\
             y_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n"
        );
    }

    #[test]
    fn every_bucket_list_ascends() {
        let b = RECONCILE_SECONDS;
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
    }

    #[test]
    fn durations_observe_in_seconds() {
        let h = Histogram::new(&[0.05, 0.1, 0.15, 0.25]);
        h.observe_duration(Duration::from_millis(120));
        let mut out = String::new();
        h.render(&mut out, "d", "");
        assert!(out.contains("d_bucket{le=\"0.1\"} 0\n"), "{out}");
        assert!(out.contains("d_bucket{le=\"0.15\"} 1\n"), "{out}");
        assert!(out.contains("d_sum 0.12\n"), "{out}");
    }

    // Taken from a real process; the command name holds a space and a parenthesis.
    const STAT: &str = "4242 (autonomic (mgr)) S 1 4242 4242 0 -1 4194560 2954 0 0 0 \
                        250 75 0 0 20 0 6 0 123456 27000000 4321 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 17064 0 0 0 17 1 0 0 0 0 0";
    const STATUS: &str =
        "Name:\tautonomic-manag\nVmPeak:\t  30000 kB\nVmRSS:\t   17284 kB\nThreads:\t6\n";
    const PROC_STAT: &str = "cpu  1 2 3 4\nintr 1 2\nctxt 99\nbtime 1764750000\nprocesses 77\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            1024                 1048576              files     \n";

    #[test]
    fn proc_files_parse() {
        let p = process::parse(STAT, STATUS, PROC_STAT, LIMITS, 12).expect("parsed");
        assert_eq!(
            p,
            process::Stats {
                resident_bytes: 17284.0 * 1024.0,
                cpu_seconds: 3.25,
                start_time_seconds: 1764750000.0 + 1234.56,
                open_fds: 12.0,
                max_fds: 1024.0,
            }
        );
        let unlimited = LIMITS.replace(
            "1024                 1048576",
            "unlimited            unlimited",
        );
        let p = process::parse(STAT, STATUS, PROC_STAT, &unlimited, 3).unwrap();
        assert_eq!(p.max_fds, f64::INFINITY);
        let mut out = String::new();
        p.render(&mut out);
        assert!(out.contains("\nprocess_max_fds +Inf\n"), "{out}");
        // Truncated or foreign files: nothing rather than nonsense.
        assert_eq!(
            process::parse("4242 (x) S 1 2", STATUS, PROC_STAT, LIMITS, 1),
            None
        );
        assert_eq!(
            process::parse(STAT, "Name:\tx\n", PROC_STAT, LIMITS, 1),
            None
        );
        assert_eq!(process::parse(STAT, STATUS, "cpu 1\n", LIMITS, 1), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_sanely() {
        let p = process::read().expect("/proc/self");
        assert!(p.resident_bytes > 1e6, "{p:?}");
        assert!(p.open_fds >= 3.0 && p.open_fds <= p.max_fds, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86400.0 * 365.0,
            "{p:?}"
        );
    }
}
