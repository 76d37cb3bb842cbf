//! `autonomic-manager check`: the preflight. It walks the path a user would debug, in
//! order — configuration, identity, API server, RBAC, CRDs, then (managed mode) DNS,
//! proxy, TLS, WebSocket upgrade and token — and prints one line per step, with the fix
//! when it fails. Each network step is bounded by [`STEP_TIMEOUT`], each line by
//! [`MAX_LINE`]. The dial's steps are `connect::socket`'s own, run one at a time.

use std::fmt;
use std::time::Duration;

use crate::config::{Config, ConfigError, Transport};
use crate::text::cap_utf8_marked;

mod cluster;
mod dial;
mod rbac;

use cluster::cluster_steps;
use dial::control_plane_steps;
pub use rbac::{RULES, Rule, Scope};

/// How long one network step may take.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest line printed, in bytes: what a step reports (an error from a peer, a
/// list of missing permissions) is cut to fit, the fix kept whole.
pub const MAX_LINE: usize = 600;
const MAX_TEXT: usize = 360;
const MAX_FIX: usize = 200;

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    Fail,
    /// Not run: unmanaged, or an earlier step failed.
    Skip,
    /// Passed, with something the admin should know (a permission held and not used).
    Warn,
}

/// One step's line: `ok   api server: https://10.0.0.1:443 (v1.33.1)`,
/// `FAIL rbac: cannot watch pods in namespace x — fix: …`, `-    dns: skipped: unmanaged`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub status: Status,
    pub step: &'static str,
    pub text: String,
    pub fix: Option<String>,
}

impl Line {
    pub fn ok(step: &'static str, text: impl Into<String>) -> Line {
        Line::new(Status::Ok, step, text.into(), None)
    }
    pub fn fail(step: &'static str, text: impl Into<String>, fix: impl Into<String>) -> Line {
        Line::new(Status::Fail, step, text.into(), Some(fix.into()))
    }
    pub fn warn(step: &'static str, text: impl Into<String>, fix: impl Into<String>) -> Line {
        Line::new(Status::Warn, step, text.into(), Some(fix.into()))
    }
    pub fn skip(step: &'static str, why: impl Into<String>) -> Line {
        Line::new(Status::Skip, step, format!("skipped: {}", why.into()), None)
    }

    /// Text from peers and the cluster made one bounded line: control characters become
    /// spaces, the text and the fix are cut with a visible mark.
    fn new(status: Status, step: &'static str, text: String, fix: Option<String>) -> Line {
        let one_line = |s: String, max: usize| {
            let mut s: String = s
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            cap_utf8_marked(&mut s, max);
            s
        };
        Line {
            status,
            step,
            text: one_line(text, MAX_TEXT),
            fix: fix.map(|f| one_line(f, MAX_FIX)),
        }
    }

    /// The line for a configuration `check` cannot run with (exit 2, as for `run`).
    pub fn configuration_refused(e: &ConfigError) -> Line {
        Line::fail(
            "configuration",
            e.to_string(),
            "correct that variable (autonomic-manager --help lists them all)",
        )
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = match self.status {
            Status::Ok => "ok  ",
            Status::Fail => "FAIL",
            Status::Skip => "-   ",
            Status::Warn => "warn",
        };
        write!(f, "{head} {}: {}", self.step, self.text)?;
        if let Some(fix) = &self.fix {
            write!(f, " — fix: {fix}")?;
        }
        Ok(())
    }
}

/// What the lines say so far.
struct Report<'a> {
    print: &'a mut dyn FnMut(&Line),
    failed: usize,
}

impl Report<'_> {
    fn line(&mut self, line: Line) {
        if line.status == Status::Fail {
            self.failed += 1;
        }
        (self.print)(&line);
    }
}

/// Runs every step on `config` (parsed already: a refusal is
/// [`Line::configuration_refused`] and exit 2), handing each line to `print` as it is
/// known. `true` when none failed.
pub async fn run(config: &Config, print: &mut dyn FnMut(&Line)) -> bool {
    let mut report = Report { print, failed: 0 };
    report.line(Line::ok("configuration", configuration_text(config)));
    cluster_steps(config, &mut report).await;
    if config.managed {
        control_plane_steps(config, &mut report).await;
    } else {
        for step in ["dns", "proxy", "tls", "websocket", "token"] {
            report.line(Line::skip(step, "unmanaged"));
        }
    }
    report.failed == 0
}

fn configuration_text(config: &Config) -> String {
    let watching = if config.namespaces.is_empty() {
        "all namespaces".to_owned()
    } else {
        format!("namespaces {}", config.namespaces.join(", "))
    };
    if !config.managed {
        return format!("unmanaged, watching {watching}");
    }
    let endpoint = match config.transport {
        Transport::Ws => config.base_url.endpoint(true, "connect"),
        Transport::Http => config.base_url.endpoint(false, "report"),
    };
    format!("managed ({endpoint}), watching {watching}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_documented_and_stay_bounded() {
        assert_eq!(
            Line::ok("api server", "https://10.0.0.1:443 (v1.33.1)").to_string(),
            "ok   api server: https://10.0.0.1:443 (v1.33.1)"
        );
        assert_eq!(
            Line::fail("rbac", "cannot watch pods in namespace x", "grant it").to_string(),
            "FAIL rbac: cannot watch pods in namespace x — fix: grant it"
        );
        assert_eq!(
            Line::skip("dns", "unmanaged").to_string(),
            "-    dns: skipped: unmanaged"
        );
        // A peer's megabyte, with newlines: one line, cut with a mark, the fix whole.
        let long = format!("line one\nline two\r{}", "é".repeat(1 << 20));
        let line = Line::fail("websocket", long, "check AUTONOMIC_BASE_URL").to_string();
        assert!(line.len() <= MAX_LINE, "{}", line.len());
        assert!(!line.contains(['\n', '\r']));
        assert!(line.starts_with("FAIL websocket: line one line two é"));
        assert!(
            line.ends_with("é… — fix: check AUTONOMIC_BASE_URL"),
            "{line}"
        );
        let huge = Line::fail("x", "t".repeat(5000), "f".repeat(5000)).to_string();
        assert!(huge.len() <= MAX_LINE, "{}", huge.len());
    }
}
