//! Counters and gauges, rendered in the Prometheus text format. Plain atomics: a
//! metrics library would be more code than the handful of series we publish.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::crd::Kind;

#[derive(Default)]
pub struct Metrics {
    reconciles: [AtomicU64; 4],
    reconcile_errors: [AtomicU64; 4],
    /// This replica holds the Lease (always, without leader election) and reconciles.
    pub leader: AtomicBool,
}

fn idx(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Metrics {
    pub fn reconciled(&self, kind: Kind, ok: bool) {
        self.reconciles[idx(kind)].fetch_add(1, Relaxed);
        if !ok {
            self.reconcile_errors[idx(kind)].fetch_add(1, Relaxed);
        }
    }

    /// The exposition text; `series` are sampled by the caller at scrape time. A name
    /// ending in `_total` is a counter (Prometheus naming), any other a gauge.
    pub fn render(&self, series: &[(&str, &str, f64)]) -> String {
        let mut out = String::new();
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
        for (name, help, value) in series {
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
        out
    }
}
