//! What an Agent costs the API server (issue 14): the manager's own requests, counted
//! exactly from its client's trace of every HTTP request it sends (kube's `requesting`
//! event, in the span of the reconcile that sent it). The API server's own counters
//! (`scripts/bench`) cannot be read per client on a bed other tests share.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use autonomic_manager::crd::Agent;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use support::*;

const AGENTS: usize = 3;

fn agent(name: &str) -> Agent {
    yaml(&format!(
        "apiVersion: autonomic.sh/v1alpha1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{runtime: {{image: '{BUSYBOX_IMAGE}', command: [sleep, '3600']}}}}"
    ))
}

/// `(method, what)` of each request the manager sent while reconciling Agent `name`:
/// `what` is the resource path after the namespace (`secrets`, `pods`,
/// `agents/<name>/status`, `events`), the query left out.
fn requests_of(logs: &str, ns: &str, name: &str) -> Vec<(String, String)> {
    let span = format!("reconcile{{kind=Agent namespace={ns} object={name}}}");
    let field = |line: &str, key: &str| -> Option<String> {
        let start = line.find(key)? + key.len();
        line[start..].split_whitespace().next().map(str::to_owned)
    };
    logs.lines()
        .filter(|l| l.contains(&span) && l.ends_with("requesting"))
        .map(|l| {
            let method = field(l, "http.method=").expect("the request's method");
            let url = field(l, "http.url=").expect("the request's URL");
            let path = url.split('?').next().unwrap_or_default();
            let after = path
                .split_once(&format!("/namespaces/{ns}/"))
                .map_or(path, |(_, rest)| rest);
            // `agents/<name>/status` keeps its name; a child's name says nothing more.
            let what = if after.starts_with("agents/") {
                after.to_owned()
            } else {
                after.split('/').next().unwrap_or_default().to_owned()
            };
            (method, what)
        })
        .collect()
}

/// From creation to `Active` (to its settled `Pending` status without a node), an Agent
/// costs the manager one request for its config Secret (a POST: no GET before it), one
/// for its pod, one status write per change of its status (none that changes nothing)
/// and one Event per change of its phase: 4 when the pod is created and the status
/// written once, as on a bed whose pods stay Pending (the bench's 10 000 Agents).
#[tokio::test]
async fn an_agent_costs_one_request_per_child_and_per_status_change() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "requests").await;
    let agents: Api<Agent> = ns.api();
    // Every status each Agent had, as a watch from before their creation saw it.
    let statuses = tokio::spawn({
        let api = agents.clone();
        async move {
            let mut seen: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(e)) = events.next().await {
                if let watcher::Event::Apply(a) | watcher::Event::InitApply(a) = e {
                    let status = serde_json::to_value(&a.status).unwrap();
                    let list = seen.entry(a.name_any()).or_default();
                    if list.last() != Some(&status) && !status.is_null() {
                        list.push(status);
                    }
                    let done = |l: &Vec<serde_json::Value>| {
                        l.last().is_some_and(|s| {
                            let phase = s["phase"].as_str().unwrap_or_default();
                            phase == "Active" || (!has_node() && s["podName"].is_string())
                        })
                    };
                    if seen.len() == AGENTS && seen.values().all(done) {
                        return seen;
                    }
                }
            }
            panic!("the Agent watch ended");
        }
    });
    let mut m = Manager::start(
        &ns.name,
        &[(
            "AUTONOMIC_LOG",
            "info,autonomic_manager=debug,kube_client=debug",
        )],
    );
    m.wait_ready().await;
    for i in 0..AGENTS {
        agents
            .create(&PostParams::default(), &agent(&format!("a-{i}")))
            .await
            .expect("create");
    }
    let statuses = tokio::time::timeout(WAIT, statuses)
        .await
        .unwrap_or_else(|_| panic!("Agents not settled in time:\n{}", m.logs()))
        .unwrap();
    // The last status is seen before the requests that follow it (its Event) are sent;
    // and without a node a late second status write (the one this test is here to
    // catch) would come after. Read the log once the Agents' requests stopped moving
    // for 3 s.
    let total = |logs: &str| -> usize {
        statuses
            .keys()
            .map(|name| requests_of(logs, &ns.name, name).len())
            .sum()
    };
    let mut logs = m.logs();
    let mut quiet_since = tokio::time::Instant::now();
    let deadline = quiet_since + Duration::from_secs(60);
    while quiet_since.elapsed() < Duration::from_secs(3) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "requests still moving after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = m.logs();
        if total(&now) != total(&logs) {
            quiet_since = tokio::time::Instant::now();
        }
        logs = now;
    }
    m.stop("TERM");
    for (name, seen) in &statuses {
        let requests = requests_of(&logs, &ns.name, name);
        let count = |method: &str, what: &str| {
            requests
                .iter()
                .filter(|(m, w)| m == method && w == what)
                .count()
        };
        let phases: BTreeSet<&str> = seen.iter().filter_map(|s| s["phase"].as_str()).collect();
        let status_path = format!("agents/{name}/status");
        assert_eq!(count("POST", "secrets"), 1, "{name}: {requests:?}");
        assert_eq!(count("POST", "pods"), 1, "{name}: {requests:?}");
        assert_eq!(
            count("PATCH", &status_path),
            seen.len(),
            "{name}: one status write per status it had ({seen:#?}): {requests:?}"
        );
        assert_eq!(
            count("POST", "events"),
            phases.len(),
            "{name}: one Event per phase ({phases:?}): {requests:?}"
        );
        assert_eq!(
            requests.len(),
            2 + seen.len() + phases.len(),
            "{name}: nothing else (no GET, no second write): {requests:?}"
        );
        if seen.len() == 1 {
            assert_eq!(requests.len(), 4, "{name}: {requests:?}");
        }
    }
}
