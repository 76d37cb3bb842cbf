//! Renders the results files of a run into BENCHMARKS.md, between its markers. The
//! prose around the markers is written by hand; every figure between them comes from
//! the results files and the machine.

use std::fmt::Write;

use serde_json::{Map, Value};

use crate::plot;

const BEGIN: &str = "<!-- BEGIN RESULTS: written by scripts/bench, do not edit -->";
const END: &str = "<!-- END RESULTS -->";

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "?".into())
}

/// The date and time, to the minute, in UTC.
pub fn now() -> String {
    sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
}

/// The commit measured, as the results files record it when the run starts (rendering
/// later, e.g. after a merge, must not name another commit).
pub fn commit() -> String {
    let dirty = if sh(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!BENCHMARKS.md",
            ":!benches/results",
            ":!benches/charts",
        ],
    )
    .is_empty()
    {
        ""
    } else {
        " (with uncommitted changes)"
    };
    format!("{}{dirty}", sh("git", &["rev-parse", "--short=12", "HEAD"]))
}

fn machine(kubernetes: &str, args: &str, commit: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("?", |(_, v)| v.trim());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: f64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let mut s = String::new();
    let _ = writeln!(s, "| Machine | |\n|---|---|");
    let _ = writeln!(s, "| CPUs (`nproc`) | {} |", sh("nproc", &[]));
    let _ = writeln!(s, "| CPU | {cpu} |");
    let _ = writeln!(s, "| Memory | {:.1} GiB |", mem_kb / 1048576.0);
    let _ = writeln!(s, "| Kernel | {} |", sh("uname", &["-r"]));
    let _ = writeln!(s, "| Kubernetes | {kubernetes} |");
    let _ = writeln!(s, "| Commit | {commit} |");
    let _ = writeln!(s, "| Date | {} |", now());
    let _ = writeln!(s, "| Command | `scripts/bench{args}` |");
    s
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

/// Merges the results files (objects) into one.
fn load(files: &[String]) -> Map<String, Value> {
    let mut all = Map::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let Value::Object(m) = serde_json::from_str(&text).expect("results JSON") else {
            panic!("{file}: not an object");
        };
        all.extend(m);
    }
    all
}

/// One figure of a run, rendered.
type Figure = Box<dyn Fn(&Map<String, Value>) -> String>;

/// The headline figures of an earlier run beside this one's: what the fixes changed.
fn before_after(
    s: &mut String,
    before: &Map<String, Value>,
    now: &Map<String, Value>,
    label: &str,
) {
    fn at(r: &Map<String, Value>, n: u64, list: &str, field: &str) -> f64 {
        r.get(list)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| x["agents"] == n))
            .map_or(f64::NAN, |x| f(&x[field]))
    }
    fn at_1000(r: &Map<String, Value>, list: &str, field: &str) -> f64 {
        at(r, 1000, list, field)
    }
    /// The manager's requests per Agent while timed (the bench's own create left out).
    fn timed_requests(r: &Map<String, Value>, n: u64) -> String {
        let t = r
            .get("throughput")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| x["agents"] == n));
        let Some(req) = t.and_then(|t| t["requests_per_agent"].as_object()) else {
            return "not run".into();
        };
        let own: f64 = req
            .iter()
            .filter(|(k, _)| *k != "POST agents")
            .map(|(_, v)| f(v))
            .sum();
        format!("{own:.2}")
    }
    let rows: [(&str, Figure); 11] = [
        ("Binary size", Box::new(|r| mb(f(&r["binary"]["bytes"])))),
        (
            "Peak RSS, 1 000 Agents",
            Box::new(|r| mb(at_1000(r, "footprint", "rss_peak_bytes"))),
        ),
        (
            "Steady RSS, 1 000 Agents",
            Box::new(|r| mb(at_1000(r, "footprint", "rss_steady_bytes"))),
        ),
        (
            "Delta latency p50 / p99 (plain watch p99)",
            Box::new(|r| {
                let d = &r["delta"]["result"];
                format!(
                    "{:.1} / {:.1} ms ({:.1} ms)",
                    f(&d["manager_p50_ms"]),
                    f(&d["manager_p99_ms"]),
                    f(&d["raw_p99_ms"])
                )
            }),
        ),
        (
            "Snapshot encode, 10 000 objects",
            Box::new(|r| format!("{:.1} ms", f(&r["snapshot_encode"]["encode_median_ms"]))),
        ),
        (
            "Throughput ratio, 1 000 Agents",
            Box::new(|r| format!("{:.2}", at_1000(r, "throughput", "ratio"))),
        ),
        (
            "Peak RSS, 10 000 Agents",
            Box::new(|r| mb(at(r, 10_000, "footprint", "rss_peak_bytes"))),
        ),
        (
            "Steady RSS, 10 000 Agents",
            Box::new(|r| mb(at(r, 10_000, "footprint", "rss_steady_bytes"))),
        ),
        (
            "Start → first snapshot, 10 000 Agents",
            Box::new(|r| {
                format!(
                    "{:.1} s",
                    at(r, 10_000, "footprint", "snapshot_after_start_ms") / 1000.0
                )
            }),
        ),
        (
            "The manager's API requests per Agent while timed (until its pod exists)",
            Box::new(|r| timed_requests(r, 10_000)),
        ),
        (
            "The manager's API requests per Agent, creation → settled",
            Box::new(|r| {
                let v = at(
                    r,
                    10_000,
                    "throughput",
                    "manager_requests_settled_per_agent",
                );
                if v.is_nan() {
                    "not counted".into()
                } else {
                    format!("{v:.2}")
                }
            }),
        ),
    ];
    let _ = writeln!(
        s,
        "\n**Before and after the fixes** (before: {label}, an earlier run whose machine that file does not record: its times compare with these only roughly; a figure it did not measure is left out):\n\n| Figure | Before | Now |\n|---|---|---|"
    );
    for (name, fig) in rows {
        let (b, n) = (fig(before), fig(now));
        if b.contains("NaN") || b.starts_with("not ") {
            continue;
        }
        let _ = writeln!(s, "| {name} | {b} | {n} |");
    }
}

/// The charts of this run, written beside the results as SVG files and linked below the
/// tables (the pictures of what the tables list: memory against Agents, latencies).
fn pictures(s: &mut String, footprints: &[Value], delta: &Value, shell: &Value) {
    let dir = "benches/charts";
    let charts = [
        ("memory", "Memory against Agents", plot::memory(footprints)),
        (
            "delta-latency",
            "Delta latency distribution",
            plot::delta(delta),
        ),
        (
            "echo-latency",
            "Keystroke echo distribution",
            plot::echo(shell),
        ),
    ];
    let drawn: Vec<_> = charts
        .into_iter()
        .filter_map(|(file, alt, chart)| Some((file, alt, chart?)))
        .collect();
    if drawn.is_empty() {
        return;
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let _ = writeln!(s, "\n**Pictures** (drawn from the same results):\n");
    for (file, alt, chart) in drawn {
        let path = format!("{dir}/{file}.svg");
        std::fs::write(&path, plot::svg(&chart)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let _ = writeln!(s, "![{alt}]({path})\n");
    }
}

pub fn render(md: &str, files: &[String], before: &[String]) {
    let r = load(files);
    let null = Value::Null;
    let get = |k: &str| r.get(k).unwrap_or(&null);
    let kubernetes = get("kubernetes").as_str().unwrap_or("?");
    let args = std::env::var("BENCH_ARGS").unwrap_or_default();
    let mut s = String::new();
    let commit = get("commit").as_str().map_or_else(commit, str::to_owned);
    s.push_str(&machine(kubernetes, &args, &commit));
    s.push('\n');

    // --- the summary, one row per item of the issue
    let _ = writeln!(
        s,
        "| # | Measure | Result | Reference (same run) | Ratio | Goal | Met |\n|---|---|---|---|---|---|---|"
    );
    let bin = get("binary");
    let size = f(&bin["bytes"]);
    let _ = writeln!(
        s,
        "| 1 | Binary, stripped static musl | {} ({size:.0} bytes); static: {}, stripped: {} | | | ≤ 8 MB, static | {} |",
        mb(size),
        bin["static"],
        bin["stripped"],
        met(size <= 8e6 && bin["static"] == true)
    );
    let footprints = get("footprint").as_array().cloned().unwrap_or_default();
    match footprints.iter().find(|x| x["agents"] == 1000) {
        Some(fp) => {
            let peak = f(&fp["rss_peak_bytes"]);
            let steady = f(&fp["rss_steady_bytes"]);
            let _ = writeln!(
                s,
                "| 2 | Memory, 1 000 Agents + pods, managed | peak {} / steady {} | | | ≤ 24 MB (peak) | {} |",
                mb(peak),
                mb(steady),
                met(peak <= 24e6)
            );
        }
        None => {
            let _ = writeln!(s, "| 2 | Memory, 1 000 Agents | not run | | | ≤ 24 MB | |");
        }
    }
    let d = &get("delta")["result"];
    if d.is_object() {
        let (p50, p99) = (f(&d["manager_p50_ms"]), f(&d["manager_p99_ms"]));
        let (r50, r99) = (f(&d["raw_p50_ms"]), f(&d["raw_p99_ms"]));
        let _ = writeln!(
            s,
            "| 3 | Delta latency, patch → delta at the control plane ({} changes, {} Agents) | p50 {p50:.1} ms / p99 {p99:.1} ms | plain watch p50 {r50:.1} ms / p99 {r99:.1} ms | p99 +{:.1} ms | p99 ≤ 150 ms and ≤ watch + 100 ms | {} |",
            d["changes"],
            get("delta")["agents"],
            p99 - r99,
            met(p99 <= 150.0 && p99 <= r99 + 100.0)
        );
    }
    let e = get("snapshot_encode");
    if e.is_object() {
        let big = footprints.iter().find(|x| x["agents"] == 10_000);
        let e2e = big.map_or_else(
            || "end to end at 10 000: run with `--large`".to_owned(),
            |b| {
                format!(
                    "end to end (hello → snapshot at the control plane) {:.0} ms",
                    f(&b["snapshot_after_hello_ms"])
                )
            },
        );
        let enc = f(&e["encode_median_ms"]);
        let _ = writeln!(
            s,
            "| 4 | Snapshot of {} objects: encode (median of {}) | {enc:.1} ms, {} | {e2e} | | encode ≤ 50 ms | {} |",
            e["resources"],
            e["runs"],
            mb(f(&e["bytes"])),
            met(enc <= 50.0)
        );
    }
    let throughput = get("throughput").as_array().cloned().unwrap_or_default();
    if let Some(t) = throughput.iter().find(|x| x["agents"] == 1000) {
        let ratio = f(&t["ratio"]);
        let _ = writeln!(
            s,
            "| 5 | 1 000 Agents created at once → 1 000 pods exist | {:.1} s | 1 000 equivalent pods created directly: {:.1} s{} | {ratio:.2} | ≥ 0.8 | {} |",
            f(&t["manager_s"]),
            f(&t["direct_s"]),
            writes(t, "pods exist"),
            met(ratio >= 0.8)
        );
    }
    // The work queue's fairness: another namespace's new Agents during each burst.
    for t in &throughput {
        let during = &t["creating_manager"]["during"];
        let list =
            |k: &str| -> Vec<f64> { during[k].as_array().into_iter().flatten().map(f).collect() };
        let (pod, delta) = (list("pod_ms"), list("delta_ms"));
        if pod.is_empty() {
            continue;
        }
        let worst = pod.iter().copied().fold(0.0, f64::max);
        let burst = f(&t["manager_s"]) * 1000.0;
        let _ = writeln!(
            s,
            "| 5b | During the burst of {} Agents (its pods after {:.1} s): a new Agent in another namespace the manager watches, one a second → its pod exists; its `delta` at the control plane ({} of them) | pod median {:.0} ms, max {worst:.0} ms; delta median {:.0} ms, max {:.0} ms | | | the pod not held back by the burst: under a tenth of the burst's time | {} |",
            t["agents"],
            burst / 1000.0,
            pod.len(),
            crate::quantile(&pod, 0.5),
            crate::quantile(&delta, 0.5),
            crate::quantile(&delta, 1.0),
            met(worst < burst / 10.0)
        );
    }
    let rc = &get("reconnect")["result"];
    if rc.is_object() {
        let _ = writeln!(
            s,
            "| 6 | Reconnect: control plane back → snapshot ({} Agents, median of {}) | {:.0} ms (max {:.0} ms) | backoff floor {} ms | | | |",
            get("reconnect")["agents"],
            rc["rounds"],
            f(&rc["median_ms"]),
            f(&rc["max_ms"]),
            rc["backoff_floor_ms"]
        );
    }
    let sh_ = get("shell");
    if sh_.is_object() {
        let direct = f(&sh_["direct_bytes_per_s"]);
        let echo = format!(
            "echo p50 {:.1} ms / p99 {:.1} ms",
            f(&sh_["direct_echo_p50_ms"]),
            f(&sh_["direct_echo_p99_ms"])
        );
        match sh_["not_measured"].as_str() {
            Some(why) => {
                let _ = writeln!(
                    s,
                    "| 7 | Shell proxy: `cat` of {} | **not yet measured**: {} | `kubectl exec`: {}/s; {echo} | | ≥ 0.8× direct | not measured |",
                    mb(f(&sh_["file_bytes"])),
                    why.replace('|', "\\|"),
                    mb(direct)
                );
            }
            None => {
                let ratio = f(&sh_["ratio"]);
                let _ = writeln!(
                    s,
                    "| 7 | Shell proxy: `cat` of {}; keystroke echo | {}/s; echo p50 {:.1} ms / p99 {:.1} ms | `kubectl exec`: {}/s; {echo} | {ratio:.2} | ≥ 0.8× direct | {} |",
                    mb(f(&sh_["file_bytes"])),
                    mb(f(&sh_["proxy_bytes_per_s"])),
                    f(&sh_["proxy_echo_p50_ms"]),
                    f(&sh_["proxy_echo_p99_ms"]),
                    mb(direct),
                    met(ratio >= 0.8)
                );
            }
        }
    } else {
        let _ = writeln!(
            s,
            "| 7 | Shell proxy | not run: no test bed with a node | | | ≥ 0.8× direct | |"
        );
    }

    // --- the install users run (tests/helm.rs, run by scripts/bench on the full bed)
    let inst = get("install");
    if let Some(runs) = inst["runs"].as_array().filter(|r| !r.is_empty()) {
        let col = |k: &str| seconds(runs, k);
        let _ = writeln!(
            s,
            "| 8 | Two-replica Helm install: `helm upgrade … --set manager.managed=true` returned → hello and snapshot at the control plane | {} | | | a few seconds | |",
            col("upgrade_to_snapshot_ms")
        );
        let _ = writeln!(
            s,
            "| 9 | Rejected token fixed in the Secret → the next connection carries it (the kubelet's Secret refresh included: most of it) | {} | | | | |",
            col("secret_rotated_to_connection_ms")
        );
        let _ = writeln!(
            s,
            "| 10 | Leader pod deleted → the standby's hello | {} | | | | |",
            col("leader_deleted_to_hello_ms")
        );
    }

    // --- issue 24: the platform's install path (tests/helm_repo.rs, tests/mirror.rs)
    let path = get("install_path");
    match (path["repo"].as_array(), path["mirror"].as_array()) {
        (Some(repo), Some(mirror)) if !repo.is_empty() && !mirror.is_empty() => {
            let goal = repo.iter().map(|r| f(&r["upgrade_to_connected_log_ms"]));
            let _ = writeln!(
                s,
                "| 15 | Chart repository: `helm repo add exo …` → `connected` in `kubectl logs deploy/autonomic-manager --tail=50` | {} (the `helm upgrade` → `connected` part: {}) | | | ≤ 10 s after the upgrade | {} |",
                seconds(repo, "repo_add_to_connected_log_ms"),
                seconds(repo, "upgrade_to_connected_log_ms"),
                met(goal.fold(0.0, f64::max) <= 10_000.0)
            );
            let _ = writeln!(
                s,
                "| 16 | Air-gapped: `skopeo copy` of the multi-arch image into the mirror registry; install from `oci://` → Available, the image pulled from the mirror | copy {}; install {} | | | | |",
                seconds(mirror, "skopeo_copy_ms"),
                seconds(mirror, "install_from_mirror_to_available_ms")
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "| 15–16 | Chart repository and mirror install | not run (`--bulk-only`, or no results) | | | ≤ 10 s after the upgrade | |"
            );
        }
    }

    // --- issue 14: the figures at 10 000 Agents
    let big = footprints.iter().find(|x| x["agents"] == 10_000);
    match big {
        Some(fp) => {
            let peak = f(&fp["rss_peak_bytes"]);
            let start = f(&fp["snapshot_after_start_ms"]) / 1000.0;
            let _ = writeln!(
                s,
                "| 11 | Memory, 10 000 Agents + pods + Secrets, managed: a fresh manager | peak {} ({:.1} MiB) / steady {} | | | ≤ 48 MiB (peak) | {} |",
                mb(peak),
                peak / 1048576.0,
                mb(f(&fp["rss_steady_bytes"])),
                met(peak <= 48.0 * 1048576.0)
            );
            let creating = throughput
                .iter()
                .find(|t| t["agents"] == 10_000)
                .map(|t| &t["creating_manager"])
                .filter(|c| c["rss_peak_bytes"].is_number());
            if let Some(c) = creating {
                let peak = f(&c["rss_peak_bytes"]);
                let _ = writeln!(
                    s,
                    "| 11b | Memory, the manager that created the 10 000 Agents' pods and Secrets in one burst (item 5), once settled | peak {} ({:.1} MiB) / now {} | | | ≤ 48 MiB (peak) | {} |",
                    mb(peak),
                    peak / 1048576.0,
                    mb(f(&c["rss_bytes"])),
                    met(peak <= 48.0 * 1048576.0)
                );
            }
            // Each run's time (several fresh managers, one after the other), the goal held
            // against the slowest.
            let runs: Vec<f64> = fp["runs"].as_array().map_or_else(
                || vec![start],
                |r| {
                    r.iter()
                        .map(|r| f(&r["snapshot_after_start_ms"]) / 1000.0)
                        .collect()
                },
            );
            let worst = runs.iter().copied().fold(start, f64::max);
            let each: Vec<String> = runs.iter().map(|t| format!("{t:.2}")).collect();
            let _ = writeln!(
                s,
                "| 12 | A fresh manager with 10 000 Agents: start → first snapshot at the control plane (the API server settled first) | {start:.2} s median of {} runs ({} s; hello → snapshot {:.2} s) | | | ≤ 3 s (the slowest run) | {} |",
                runs.len(),
                each.join(", "),
                f(&fp["snapshot_after_hello_ms"]) / 1000.0,
                met(worst <= 3.0)
            );
        }
        None => {
            let _ = writeln!(
                s,
                "| 11 | Memory, 10 000 Agents | not run: `--large` | | | ≤ 64 MiB (peak) | |\n| 12 | Start → first snapshot, 10 000 Agents | not run: `--large` | | | ≤ 3 s | |"
            );
        }
    }
    let quick = get("restart_after_burst");
    if quick.is_object() {
        let start = f(&quick["snapshot_after_start_ms"]) / 1000.0;
        let _ = writeln!(
            s,
            "| 12c | A restart right after the burst of {} Agents (the API server not let settle): start → first snapshot at the control plane | {start:.2} s (hello → snapshot {:.2} s; peak {}) | | | ≤ 3 s | {} |",
            quick["agents"],
            f(&quick["snapshot_after_hello_ms"]) / 1000.0,
            mb(f(&quick["rss_peak_bytes"])),
            met(start <= 3.0)
        );
    }
    let fo = get("failover");
    if fo.is_object() {
        let t = f(&fo["exit_to_snapshot_ms"]) / 1000.0;
        let _ = writeln!(
            s,
            "| 12b | A failover with {} Agents: the leader stopped (SIGTERM, Lease released) → the standby's first snapshot at the control plane, from the leader's exit | {t:.2} s (the stop itself {:.2} s) | | | ≤ 3 s | {} |",
            fo["agents"],
            f(&fo["stop_to_exit_ms"]) / 1000.0,
            met(t <= 3.0)
        );
    }
    if let Some(t) = throughput
        .iter()
        .rev()
        .find(|t| t["manager_requests_settled_per_agent"].is_number())
    {
        let own = f(&t["manager_requests_settled_per_agent"]);
        let _ = writeln!(
            s,
            "| 13 | The manager's API requests per Agent, creation → settled ({} Agents, `apiserver_request_total`; the pods stay Pending on this bed) | {own:.2} | | | ≤ 4 | {} |",
            t["agents"],
            met(own <= 4.0)
        );
    }
    for (key, row, bed) in [
        (
            "burst",
            "14",
            "on the bed's real node, real containers; it runs at most 110 pods",
        ),
        (
            "burst_hollow",
            "14b",
            "on 12 hollow nodes: kubemark's kubelet, a fake container runtime, the real node cordoned",
        ),
    ] {
        let b = get(key);
        if b.is_object() {
            let ratio = f(&b["ratio"]);
            let runs = b["runs"].as_array().map_or(&[][..], Vec::as_slice);
            if runs.len() > 1 {
                // Issue 25's form: the median of the runs, each run's figures shown.
                let each: Vec<String> = runs
                    .iter()
                    .map(|r| {
                        // Where the Agents' time went, when the run recorded it.
                        let parts = recorded(r, "pods_running_s", |r| {
                            format!(
                                " (pods made {:.1} s, Running {:.1} s)",
                                f(&r["pods_made_s"]),
                                f(&r["pods_running_s"])
                            )
                        });
                        let alone = recorded(r, "writes_s", |r| {
                            format!(
                                "; the writes alone {:.1} s = {:.2}",
                                f(&r["writes_s"]),
                                f(&r["writes_ratio"])
                            )
                        });
                        format!(
                            "{:.1} s{parts} / {:.1} s = {:.2}{alone}",
                            f(&r["manager_s"]),
                            f(&r["direct_s"]),
                            f(&r["ratio"])
                        )
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    "| {row} | A burst of {n} Agents created at once → all `Active` ({bed}), {} runs | median {:.1} s | {n} bare pods of the same shape → all `Running`: median {:.1} s{} | median {ratio:.2} (runs, Agents / bare pods: {}) | ≤ 1.5× (issue 14); ≤ 1.1×, median (issue 25) | {}; {} |",
                    runs.len(),
                    f(&b["manager_s"]),
                    f(&b["direct_s"]),
                    writes(b, "their pods `Running`, median"),
                    each.join("; "),
                    met(ratio <= 1.5),
                    met(ratio <= 1.1),
                    n = b["agents"],
                );
                continue;
            }
            let _ = writeln!(
                s,
                "| {row} | A burst of {n} Agents created at once → all `Active` ({bed}) | {:.1} s | {n} bare pods of the same shape → all `Running`: {:.1} s | {ratio:.2} | ≤ 1.5× | {} |",
                f(&b["manager_s"]),
                f(&b["direct_s"]),
                met(ratio <= 1.5),
                n = b["agents"],
            );
        } else {
            let _ = writeln!(
                s,
                "| {row} | A burst of Agents → `Active` against bare pods → `Running` ({bed}) | not run: no such bed | | | ≤ 1.5× | |"
            );
        }
    }
    huge(&mut s, get("huge"));

    // --- memory by object count
    let _ = writeln!(
        s,
        "\n**Memory and snapshot by object count** (a fresh manager on a namespace that already holds the Agents, their pods and Secrets; steady = median VmRSS over 5 s after the snapshot, peak = VmHWM):\n"
    );
    let _ = writeln!(
        s,
        "| Agents | Steady RSS | of which heap/stacks / binary pages | Peak RSS | Growth per Agent (steady) | Snapshot size | Hello → snapshot | Start → snapshot |\n|---|---|---|---|---|---|---|---|"
    );
    // The curve runs on to the `--huge` run's fresh managers: one on the way (30 000), one
    // at its end (100 000).
    let huge_run = get("huge");
    let from_huge: Vec<Value> = huge_run["curve"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(Some(&huge_run["fresh"]).filter(|f| f.is_object()))
        .cloned()
        .collect();
    let curve: Vec<Value> = footprints.iter().chain(&from_huge).cloned().collect();
    let mut prev: Option<&Value> = None;
    for (i, fp) in curve.iter().enumerate() {
        let run = if i >= footprints.len() {
            " (`--huge`)"
        } else {
            ""
        };
        let growth = prev.map_or_else(
            || "".to_owned(),
            |p| {
                let dn = f(&fp["agents"]) - f(&p["agents"]);
                let db = f(&fp["rss_steady_bytes"]) - f(&p["rss_steady_bytes"]);
                format!("{:.0} bytes", db / dn)
            },
        );
        let _ = writeln!(
            s,
            "| {}{run} | {} | {} / {} | {} | {growth} | {:.0} bytes | {:.0} ms | {:.0} ms |",
            fp["agents"],
            mb(f(&fp["rss_steady_bytes"])),
            mb(f(&fp["rss_anon_bytes"])),
            mb(f(&fp["rss_file_bytes"])),
            mb(f(&fp["rss_peak_bytes"])),
            f(&fp["snapshot_bytes"]),
            f(&fp["snapshot_after_hello_ms"]),
            f(&fp["snapshot_after_start_ms"]),
        );
        prev = Some(fp);
    }
    // What one cached object holds on the heap, measured in the bench process.
    if let Some(fp) = footprints
        .iter()
        .rev()
        .find(|fp| fp["heap_each"].is_array())
    {
        let _ = writeln!(
            s,
            "\n**Heap per cached object** ({} of each, listed from the API server, read and trimmed as the manager's cache does; bytes requested from the allocator, its overhead not counted):\n\n| Object | Heap held | As JSON from the API server |\n|---|---|---|",
            fp["agents"]
        );
        for h in fp["heap_each"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "| {} | {:.0} bytes | {:.0} bytes |",
                h["kind"].as_str().unwrap_or("?"),
                f(&h["heap_bytes_each"]),
                f(&h["json_bytes_each"])
            );
        }
    }
    if !throughput.is_empty() {
        let _ = writeln!(
            s,
            "\n**Reconcile throughput** ({} creates in flight for each; the Agents' writes: the Agent, then its Secret, pod, status and Event, made by a plain client without a manager, the most a manager's four writes per Agent allow here):\n\n| Agents | Manager: Agents → pods | Direct: pods | Ratio (direct / manager) | The Agents' writes alone → pods | Ratio (direct / writes) | Manager / writes |\n|---|---|---|---|---|---|---|",
            throughput[0]["concurrency"]
        );
        for t in &throughput {
            let (alone, bound, against) = if t["writes_s"].is_number() {
                (
                    format!("{:.1} s", f(&t["writes_s"])),
                    format!("{:.2}", f(&t["writes_ratio"])),
                    format!("{:.2}", f(&t["manager_s"]) / f(&t["writes_s"])),
                )
            } else {
                ("not run".into(), String::new(), String::new())
            };
            let _ = writeln!(
                s,
                "| {} | {:.1} s | {:.1} s | {:.2} | {alone} | {bound} | {against} |",
                t["agents"],
                f(&t["manager_s"]),
                f(&t["direct_s"]),
                f(&t["ratio"])
            );
        }
        // What the API server was asked, from its own counters, over each timed window.
        for t in &throughput {
            let list = |v: &Value| -> String {
                let items: Vec<String> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                let total: f64 = v.as_object().into_iter().flatten().map(|(_, n)| f(n)).sum();
                format!("{total:.1} in all: {}", items.join(", "))
            };
            // Where the CPU went in each timed window: whether the machine was busy, and
            // by whom.
            let cpu = |c: &Value| -> String {
                let window = f(&c["window_s"]);
                let all = window * f(&c["cores"]);
                format!(
                    "{window:.1} s, {:.1} of {all:.1} core-seconds busy ({:.0} %): API server {:.1}, manager {:.1}, bench {:.1}, the rest (etcd, the kernel) {:.1}",
                    f(&c["machine_s"]),
                    100.0 * f(&c["machine_s"]) / all.max(1e-9),
                    f(&c["apiserver_s"]),
                    f(&c["manager_s"]),
                    f(&c["bench_s"]),
                    f(&c["rest_s"]),
                )
            };
            let manager_cpu = &t["creating_manager"]["cpu"];
            if manager_cpu.is_object() && t["direct_cpu"].is_object() {
                let _ = writeln!(
                    s,
                    "\nCPU over the timed windows, {} Agents: manager run {}; direct run {}.",
                    t["agents"],
                    cpu(manager_cpu),
                    cpu(&t["direct_cpu"])
                );
            }
            if t["requests_per_agent"].is_object() {
                let _ = writeln!(
                    s,
                    "\nAPI requests per object, {} Agents, from the API server's `apiserver_request_total` (the bench's own create of each Agent included): manager run, per Agent, while timed: {}; until no counter moved for 3 s: {}; direct run, per pod: {}.",
                    t["agents"],
                    list(&t["requests_per_agent"]),
                    if t["requests_settled_per_agent"].is_object() {
                        list(&t["requests_settled_per_agent"])
                    } else {
                        "not counted".into()
                    },
                    list(&t["requests_per_pod_direct"])
                );
            }
        }
    }
    for file in before {
        before_after(&mut s, &load(&[file.to_owned()]), &r, &format!("`{file}`"));
    }
    pictures(&mut s, &curve, &get("delta")["result"], get("shell"));
    let _ = writeln!(
        s,
        "\nRaw results: `{}`. MB = 10^6 bytes.",
        files.join("`, `")
    );

    let old = std::fs::read_to_string(md).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{BEGIN}\n{s}{}", &old[..b], &old[e..])
        }
        _ => format!("{old}\n{BEGIN}\n{s}{END}\n"),
    };
    std::fs::write(md, new).unwrap_or_else(|e| panic!("{md}: {e}"));
    eprintln!("{md} updated");
}

/// The runs' figures of `key` (milliseconds) as "median x s (min, max; n runs)".
fn seconds(runs: &[Value], key: &str) -> String {
    let mut v: Vec<f64> = runs.iter().map(|r| f(&r[key])).collect();
    v.sort_by(f64::total_cmp);
    format!(
        "median {:.1} s (min {:.1}, max {:.1}; {} runs)",
        v[v.len() / 2] / 1000.0,
        v[0] / 1000.0,
        v[v.len() - 1] / 1000.0,
        v.len()
    )
}

/// Rows 17-20 (issue 25): the `--huge` run, with the commit and date it ran at (it runs
/// alone, not with the rest).
fn huge(s: &mut String, h: &Value) {
    if !h.is_object() {
        let _ = writeln!(
            s,
            "| 17-20 | 100 000 Agents with their pods and Secrets | not run: `scripts/bench --huge` | | | | |"
        );
        return;
    }
    let n = &h["agents"];
    let created = &h["created"];
    let during = &created["manager"]["during"];
    let pods: Vec<f64> = during["pod_ms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(f)
        .collect();
    let fairness = if pods.is_empty() {
        String::new()
    } else {
        format!(
            "; meanwhile another namespace's new Agents → their pods: median {:.0} ms, max {:.0} ms ({} of them)",
            crate::quantile(&pods, 0.5),
            crate::quantile(&pods, 1.0),
            pods.len()
        )
    };
    let own_peak = f(&created["manager"]["rss_peak_bytes"]);
    // Made in two bursts since the curve has a point on the way; one before that.
    let (what, first) = if created["first"].is_number() {
        let first_peak = f(&created["first_manager"]["rss_peak_bytes"]);
        (
            format!(
                "created at once in two bursts, {} then the rest, each by a manager of its own making their pods and Secrets",
                created["first"]
            ),
            format!(
                "the first {} after {:.0} s, its manager's peak {} ({:.0} MiB); the rest: ",
                created["first"],
                f(&created["first_s"]),
                mb(first_peak),
                first_peak / 1048576.0
            ),
        )
    } else {
        (
            "created at once, one manager making their pods and Secrets".to_owned(),
            String::new(),
        )
    };
    let _ = writeln!(
        s,
        "| 17 | {n} Agents {what} (`scripts/bench --huge` at `{}`, {}) | {first}all pods after {:.0} s; the manager's peak {} ({:.0} MiB){fairness} | | | | |",
        h["commit"].as_str().unwrap_or("?"),
        h["date"].as_str().unwrap_or("?"),
        f(&created["manager_s"]),
        mb(own_peak),
        own_peak / 1048576.0,
    );
    let fresh = &h["fresh"];
    let start = f(&fresh["snapshot_after_start_ms"]) / 1000.0;
    let snapshot = f(&fresh["snapshot_bytes"]);
    let lists = &h["plain_lists"];
    let reference = if lists.is_object() {
        let json = &lists["json_paged"];
        let (how, before) = if lists["pods_protobuf"] == true {
            (
                " (Agents as JSON, pods as protobuf, each whole from the watch cache)",
                format!(
                    "; with the pods as JSON in pages from etcd, as before: Agents {:.1} s, pods {:.1} s ({})",
                    f(&json["agents_ms"]) / 1000.0,
                    f(&json["pods_ms"]) / 1000.0,
                    mb(f(&json["pods_bytes"])),
                ),
            )
        } else {
            ("", String::new())
        };
        format!(
            "the same two lists side by side by a plain client that decodes nothing{how}: Agents {:.1} s ({}), pods {:.1} s ({}){before}",
            f(&lists["agents_ms"]) / 1000.0,
            mb(f(&lists["agents_bytes"])),
            f(&lists["pods_ms"]) / 1000.0,
            mb(f(&lists["pods_bytes"])),
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "| 18 | A fresh manager with {n} Agents + pods + Secrets: start → first snapshot at the control plane (the API server settled first) | {start:.1} s (hello → snapshot {:.1} s); the snapshot one message of {} | {reference} | | ≤ 15 s | {} |",
        f(&fresh["snapshot_after_hello_ms"]) / 1000.0,
        mb(snapshot),
        met(start <= 15.0)
    );
    let (peak, steady) = (f(&fresh["rss_peak_bytes"]), f(&fresh["rss_steady_bytes"]));
    let _ = writeln!(
        s,
        "| 19 | Its memory | peak {} ({:.0} MiB) / steady {} (steady + the snapshot's text: {}) | | | ≤ 384 MiB and ≤ steady + one snapshot's text (peak) | {} |",
        mb(peak),
        peak / 1048576.0,
        mb(steady),
        mb(steady + snapshot),
        met(peak <= 384.0 * 1048576.0 && peak <= steady + snapshot)
    );
    let fo = &h["failover"];
    let t = f(&fo["exit_to_snapshot_ms"]) / 1000.0;
    let _ = writeln!(
        s,
        "| 20 | A failover with {n} Agents: the leader stopped (SIGTERM) → the standby's first snapshot | {t:.1} s | | | ≤ 20 s | {} |",
        met(t <= 20.0)
    );
    let d = &h["delta"];
    let p99 = f(&d["manager_p99_ms"]);
    let _ = writeln!(
        s,
        "| 20b | Delta latency in steady state at {n} Agents ({} changes, one at a time) | p50 {:.1} ms / p99 {p99:.1} ms | plain watch p99 {:.1} ms | | p99 ≤ 150 ms | {} |",
        d["changes"],
        f(&d["manager_p50_ms"]),
        f(&d["raw_p99_ms"]),
        met(p99 <= 150.0)
    );
}

/// The reference of the Agents' writes made by a plain client (`writes_s`), when the run
/// has it: their time, its ratio to the direct pods', and the manager's time against it.
fn writes(r: &Value, until: &str) -> String {
    recorded(r, "writes_s", |r| {
        format!(
            "; the Agents' own writes made directly, no manager ({until}): {:.1} s (ratio {:.2}; the manager's time {:.2}× theirs)",
            f(&r["writes_s"]),
            f(&r["writes_ratio"]),
            f(&r["manager_s"]) / f(&r["writes_s"])
        )
    })
}

/// `text(r)` when the run recorded `key` (a results file of an older bench has not).
fn recorded(r: &Value, key: &str, text: impl Fn(&Value) -> String) -> String {
    if r[key].is_number() {
        text(r)
    } else {
        String::new()
    }
}
