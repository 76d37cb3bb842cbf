//! The chart's alert rules, evaluated by a real Prometheus: the PrometheusRule the chart
//! renders is checked by `promtool check rules` (Debian's prometheus 2.42, installed by
//! scripts/lib.sh `ensure_prometheus`) and unit-tested by `promtool test rules` with
//! `tests/prometheus/alerts_test.yml`: for every alert, a case where it fires and one
//! where it must not.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use support::*;

#[test]
fn the_shipped_alert_rules_pass_promtool_and_their_unit_tests() {
    let docs = documents(&render_chart(
        "autonomic-system",
        &["manager.prometheusRule.enabled=true".to_owned()],
    ));
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("no PrometheusRule rendered");
    let alerts: Vec<&str> = rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(alerts.len(), 4, "{alerts:?}");

    // promtool reads a rule file: the PrometheusRule's spec is one (JSON is YAML).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let work = log_dir().join(format!("promtool-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("rules.yml"), rule["spec"].to_string()).unwrap();
    let tests = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/prometheus/alerts_test.yml"
    );
    std::fs::copy(tests, work.join("alerts_test.yml")).unwrap();
    let checked =
        run_ok(
            Command::new("promtool")
                .current_dir(&work)
                .args(["check", "rules", "rules.yml"]),
        );
    assert!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    let tested = run_ok(Command::new("promtool").current_dir(&work).args([
        "test",
        "rules",
        "alerts_test.yml",
    ]));
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a case where it fires and one where it must not.
    let cases: Value = serde_saphyr::from_str(&std::fs::read_to_string(tests).unwrap()).unwrap();
    let mut seen: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for case in cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
    {
        let entry = seen.entry(case["alertname"].as_str().unwrap()).or_default();
        if case["exp_alerts"].as_array().is_some_and(|a| a.is_empty()) {
            entry.1 = true;
        } else {
            entry.0 = true;
        }
    }
    for alert in alerts {
        assert_eq!(
            seen.get(alert),
            Some(&(true, true)),
            "{alert}: no case where it fires and one where it must not"
        );
    }
}
