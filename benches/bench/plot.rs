//! The pictures of `BENCHMARKS.md`: small SVG line charts drawn from the results files
//! (memory against Agents, latency distributions), beside the tables they illustrate.
//! Hand-written SVG: a chart is a few dozen elements, and GitHub renders the file as an
//! image.

use std::fmt::Write;

use serde_json::Value;

const W: f64 = 640.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// One line of a chart: its legend and its points (x, y), drawn in order.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels, lines and an optional horizontal goal line.
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub goal: Option<(f64, String)>,
    /// The y axis's top when it is known (a fraction ends at 1), else from the data.
    pub y_top: Option<f64>,
}

/// Ticks at 1, 2 or 5 × 10^k covering [0, max]: (step, top of the axis).
fn ticks(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (step, (max / step).ceil() * step)
}

fn label(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        let n = v as i64;
        // Thousands separated by a thin space, as the tables write them.
        let digits = n.abs().to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push('\u{2009}');
            }
            out.push(c);
        }
        if n < 0 { format!("-{out}") } else { out }
    } else {
        format!("{v:.2}").trim_end_matches('0').to_owned()
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The chart as an SVG document. Both axes start at 0 and are linear.
pub fn svg(c: &Chart) -> String {
    let finite = |v: f64| v.is_finite();
    let pts = c.series.iter().flat_map(|s| s.points.iter());
    let x_max = pts
        .clone()
        .map(|p| p.0)
        .filter(|v| finite(*v))
        .fold(0.0, f64::max);
    let y_max = pts
        .map(|p| p.1)
        .chain(c.goal.as_ref().map(|g| g.0))
        .filter(|v| finite(*v))
        .fold(0.0, f64::max);
    let (xs, xt) = ticks(x_max);
    let (ys, yt) = ticks(c.y_top.unwrap_or(y_max * 1.05));
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |v: f64| LEFT + v / xt * pw;
    let y = |v: f64| TOP + ph - v / yt * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        escape(&c.title)
    );
    // Grid and tick labels.
    let mut v = 0.0;
    while v <= yt + ys / 2.0 {
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            label(v)
        );
        v += ys;
    }
    let mut v = 0.0;
    while v <= xt + xs / 2.0 {
        let xx = x(v);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            label(v)
        );
        v += xs;
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 12.0,
        escape(&c.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(&c.y_label)
    );
    if let Some((g, name)) = &c.goal {
        let gy = y(*g);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{gy:.1}" x2="{:.1}" y2="{gy:.1}" stroke="#888" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
            W - RIGHT,
            W - RIGHT - 4.0,
            gy - 5.0,
            escape(name)
        );
    }
    for (i, series) in c.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = series
            .points
            .iter()
            .filter(|p| finite(p.0) && finite(p.1))
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (px, py) = p.split_once(',').unwrap_or_default();
            let _ = writeln!(s, r#"<circle cx="{px}" cy="{py}" r="3" fill="{colour}"/>"#);
        }
        // A fraction's curves rise to the top right: their legend sits at the bottom
        // right, the others' at the top left.
        let (lx, ly) = match c.y_top {
            Some(_) => (
                W - RIGHT - 300.0,
                TOP + ph - 12.0 - 18.0 * (c.series.len() - 1 - i) as f64,
            ),
            None => (LEFT + 10.0, TOP + 16.0 + 18.0 * i as f64),
        };
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 24.0,
            ly - 4.0,
            lx + 30.0,
            escape(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Memory against Agents, from the footprint runs (one point per size).
pub fn memory(footprints: &[Value]) -> Option<Chart> {
    if footprints.len() < 2 {
        return None;
    }
    let mib = |fp: &Value, k: &str| (num(&fp["agents"]), num(&fp[k]) / (1024.0 * 1024.0));
    Some(Chart {
        title: "Manager memory against Agents (fresh managed manager)".into(),
        x_label: "Agents (each with its pod and config Secret)".into(),
        y_label: "MiB".into(),
        series: vec![
            Series {
                name: "peak RSS (VmHWM)".into(),
                points: footprints
                    .iter()
                    .map(|f| mib(f, "rss_peak_bytes"))
                    .collect(),
            },
            Series {
                name: "steady RSS".into(),
                points: footprints
                    .iter()
                    .map(|f| mib(f, "rss_steady_bytes"))
                    .collect(),
            },
            // The chart's rule for `limits.memory` (values.yaml, docs/design.md).
            Series {
                name: "sizing rule: 8 MiB + 8 KiB per Agent".into(),
                points: footprints
                    .iter()
                    .map(|f| (num(&f["agents"]), 8.0 + num(&f["agents"]) * 8.0 / 1024.0))
                    .collect(),
            },
        ],
        goal: Some(
            if footprints.iter().any(|f| num(&f["agents"]) >= 100_000.0) {
                (384.0, "goal: 384 MiB at 100 000 Agents".into())
            } else {
                (48.0, "goal: 48 MiB at 10 000 Agents".into())
            },
        ),
        y_top: None,
    })
}

/// A distribution as (latency, fraction of samples at or below it): the quantiles the
/// bench keeps (`<prefix>_cdf_ms`, at 0, 5 %, …, 100 %), or, from older results, the
/// points it has (p50, p99, max).
fn cdf(result: &Value, prefix: &str) -> Vec<(f64, f64)> {
    if let Some(qs) = result[format!("{prefix}_cdf_ms")].as_array() {
        let n = (qs.len().max(2) - 1) as f64;
        return qs
            .iter()
            .enumerate()
            .map(|(i, q)| (num(q), i as f64 / n))
            .collect();
    }
    [("p50", 0.5), ("p99", 0.99), ("max", 1.0)]
        .into_iter()
        .filter_map(|(k, frac)| {
            let v = num(&result[format!("{prefix}_{k}_ms")]);
            v.is_finite().then_some((v, frac))
        })
        .collect()
}

fn distribution(title: &str, x_label: &str, result: &Value, lines: &[(&str, &str)]) -> Chart {
    Chart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: "fraction of samples at or below".into(),
        series: lines
            .iter()
            .map(|(prefix, name)| Series {
                name: (*name).into(),
                points: cdf(result, prefix),
            })
            .filter(|s| !s.points.is_empty())
            .collect(),
        goal: None,
        y_top: Some(1.0),
    }
}

/// Delta latency: the manager's (patch → delta) against a plain watch (patch → event).
pub fn delta(result: &Value) -> Option<Chart> {
    result.is_object().then(|| {
        distribution(
            "Delta latency: a patch until it is seen",
            "ms",
            result,
            &[
                ("manager", "manager: patch → delta at the control plane"),
                ("raw", "plain watch: patch → event"),
            ],
        )
    })
}

/// Keystroke echo through the manager's shell against `kubectl exec -i`.
pub fn echo(shell: &Value) -> Option<Chart> {
    (shell.is_object() && shell["not_measured"].is_null()).then(|| {
        distribution(
            "Keystroke echo: one byte to cat and back",
            "ms",
            shell,
            &[
                ("proxy_echo", "through the manager's shell"),
                ("direct_echo", "kubectl exec -i"),
            ],
        )
    })
}
