//! Monitoring of the operator chart: the exporter with its ServiceMonitor, alerts and dashboards,
//! the alert rules under promtool, the runbook links.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_yaml::Value;

use crate::support::{
    assert_no_wildcards, env_of, helm_or_skip, of_kind, one, operator_chart, repo, rule_triples, s,
    template, text,
};

/// docs/monitoring.md: the exporter is off by default; on, it is its own Deployment (`exporter`,
/// one replica, the hardened pod of the operator) with its own ServiceAccount whose rights are read
/// only (list clusters and pods, per watched namespace when the operator watches a list; get the
/// one Secret the operator publishes the clusters' exporter credentials in, decision 36), a
/// Service, and on request a ServiceMonitor and a PrometheusRule with the alerts people page on;
/// Grafana dashboards (cluster overview, host, Keeper, operator) in a ConfigMap with the sidecar's
/// label, on request.
#[test]
fn exporter_renders_read_only_with_its_monitor_and_alerts_on_request() {
    let helm = helm_or_skip!();
    let off = template(helm, &operator_chart(), "ops", &[], false);
    assert!(
        !off.iter()
            .any(|d| text(d, "metadata.name").ends_with("-exporter")),
        "off by default"
    );
    let on = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "exporter.enabled=true",
            "exporter.serviceMonitor.enabled=true",
            "exporter.prometheusRule.enabled=true",
        ],
        false,
    );
    assert_no_wildcards(&on);
    let name = "rel-clickhouse-operator-exporter";
    let dep = one(&on, "Deployment", name);
    let c = &s(dep, "spec.template.spec.containers")
        .and_then(Value::as_sequence)
        .unwrap()[0];
    assert_eq!(text(c, "args.0"), "exporter");
    assert_eq!(
        env_of(c).get("HTTP_ADDR").map(String::as_str),
        Some("0.0.0.0:9116")
    );
    assert_eq!(text(dep, "spec.template.spec.serviceAccountName"), name);
    assert_eq!(text(c, "securityContext.readOnlyRootFilesystem"), "true");
    let role = one(&on, "ClusterRole", name);
    let rules = rule_triples(role);
    for r in &rules {
        assert!(
            matches!(r.2.as_str(), "list" | "get"),
            "the exporter only reads: {rules:?}"
        );
    }
    assert!(rules.contains(&(
        "clickhouse.com".to_string(),
        "clickhouseclusters".to_string(),
        "list".to_string()
    )));
    // decision 36: no Secret of any namespace; one Secret of its own, named
    assert!(
        !rules.iter().any(|r| r.1 == "secrets"),
        "the exporter reads no Secret cluster-wide: {rules:?}"
    );
    let credentials = "rel-clickhouse-operator-exporter-credentials";
    one(&on, "Secret", credentials);
    let own = one(&on, "Role", &format!("{name}-credentials"));
    assert_eq!(
        rule_triples(own),
        BTreeSet::from([("".to_string(), "secrets".to_string(), "get".to_string())])
    );
    assert_eq!(text(own, "rules.0.resourceNames.0"), credentials);
    assert_eq!(
        s(own, "rules.0.resourceNames")
            .and_then(Value::as_sequence)
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        env_of(c)
            .get("EXPORTER_CREDENTIALS_SECRET")
            .map(String::as_str),
        Some(credentials)
    );
    let operator = one(&on, "Deployment", "rel-clickhouse-operator");
    let oc = &s(operator, "spec.template.spec.containers")
        .and_then(Value::as_sequence)
        .unwrap()[0];
    assert_eq!(
        env_of(oc)
            .get("EXPORTER_CREDENTIALS_SECRET")
            .map(String::as_str),
        Some(credentials),
        "the operator publishes where the exporter reads"
    );
    let publishes = one(
        &on,
        "Role",
        "rel-clickhouse-operator-publishes-exporter-credentials",
    );
    assert_eq!(text(publishes, "rules.0.resourceNames.0"), credentials);
    one(&on, "Service", name);
    // each series keeps its server's namespace and pod, not the exporter pod's
    assert_eq!(
        text(
            one(&on, "ServiceMonitor", name),
            "spec.endpoints.0.honorLabels"
        ),
        "true"
    );
    let alerts: BTreeSet<String> = s(one(&on, "PrometheusRule", name), "spec.groups.0.rules")
        .and_then(Value::as_sequence)
        .unwrap()
        .iter()
        .map(|r| text(r, "alert"))
        .collect();
    for a in [
        "ClickHouseReplicaReadOnly",
        "ClickHouseReplicationDelay",
        "ClickHouseTooManyParts",
        "ClickHouseKeeperSessionExpired",
        "ClickHouseDiskAlmostFull",
        "ClickHouseClusterInError",
        "ClickHouseNoRecentBackup",
    ] {
        assert!(alerts.contains(a), "{a}: {alerts:?}");
    }
    // the servers' own endpoint, scraped on the pods (spec.serverMetrics)
    let pods = template(
        helm,
        &operator_chart(),
        "ops",
        &["serverPodMonitor.enabled=true"],
        false,
    );
    let pm = one(&pods, "PodMonitor", "rel-clickhouse-operator-servers");
    assert_eq!(text(pm, "spec.podMetricsEndpoints.0.port"), "prometheus");
    let selector = s(pm, "spec.selector.matchLabels").unwrap();
    assert_eq!(
        selector
            .get("app.kubernetes.io/component")
            .and_then(Value::as_str),
        Some("server")
    );
    // dashboards for Grafana's sidecar: four, each valid JSON with panels
    assert!(
        of_kind(&on, "ConfigMap").is_empty(),
        "no dashboards unless asked"
    );
    let dashboards = template(
        helm,
        &operator_chart(),
        "ops",
        &["dashboards.enabled=true"],
        false,
    );
    let cm = one(
        &dashboards,
        "ConfigMap",
        "rel-clickhouse-operator-dashboards",
    );
    assert_eq!(text(cm, "metadata.labels.grafana_dashboard"), "1");
    let data = s(cm, "data").and_then(Value::as_mapping).unwrap();
    let names: BTreeSet<String> = data
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "cluster-overview.json",
            "host.json",
            "keeper.json",
            "operator.json"
        ]
        .map(String::from)
        .into()
    );
    for (k, v) in data {
        let d: serde_json::Value =
            serde_json::from_str(v.as_str().unwrap()).unwrap_or_else(|e| panic!("{k:?}: {e}"));
        assert!(!d["panels"].as_array().unwrap().is_empty(), "{k:?}");
    }
    let scoped = template(
        helm,
        &operator_chart(),
        "ops",
        &["exporter.enabled=true", "watchNamespace=a\\,b"],
        false,
    );
    let roles: Vec<String> = of_kind(&scoped, "Role")
        .iter()
        .filter(|r| text(r, "metadata.name") == name)
        .map(|r| text(r, "metadata.namespace"))
        .collect();
    assert_eq!(roles, ["a", "b"]);
    assert!(
        of_kind(&scoped, "ClusterRole")
            .iter()
            .all(|r| text(r, "metadata.name") != name)
    );
}

/// promtool from `hack/promtool.sh` (built by `hack/setup.sh`): unlike helm it is required, a
/// missing promtool fails the test.
fn promtool() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("hack/promtool.sh"))
        .output()
        .expect("run hack/promtool.sh");
    assert!(
        out.status.success(),
        "hack/promtool.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    )
}

/// docs/monitoring.md, "Alerts": the alert rules the chart renders pass `promtool check rules`, and
/// `promtool test rules` (tests/helm/alerts_test.yaml) shows each alert firing on the series
/// it watches only after its `for:` duration and staying silent on healthy values, with the
/// annotations users will read. A rule with a broken expression or a changed threshold fails.
#[test]
fn alert_rules_pass_promtool_and_fire_on_the_series_they_watch() {
    let helm = helm_or_skip!();
    let promtool = promtool();
    let docs = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "exporter.enabled=true",
            "exporter.prometheusRule.enabled=true",
        ],
        false,
    );
    let rule = one(&docs, "PrometheusRule", "rel-clickhouse-operator-exporter");
    let groups = s(rule, "spec.groups").unwrap().clone();
    let dir = repo()
        .join("target")
        .join(format!("promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut file = serde_yaml::Mapping::new();
    file.insert("groups".into(), groups);
    let rules = serde_yaml::to_string(&file).unwrap();
    std::fs::write(dir.join("rules.yaml"), &rules).unwrap();
    std::fs::copy(
        repo().join("tests/helm/alerts_test.yaml"),
        dir.join("alerts_test.yaml"),
    )
    .unwrap();
    let check = |args: &[&str]| {
        Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool")
    };
    let out = check(&["check", "rules", "rules.yaml"]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check rules:\n{said}");
    assert!(said.contains("SUCCESS: 9 rules found"), "{said}");
    let out = check(&["test", "rules", "alerts_test.yaml"]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool test rules:\n{said}");
    // the checks can fail: a broken expression, and a threshold the tests do not expect
    std::fs::write(
        dir.join("rules.yaml"),
        rules.replace("clickhouse_up == 0", "clickhouse_up == == 0"),
    )
    .unwrap();
    assert!(!check(&["check", "rules", "rules.yaml"]).status.success());
    std::fs::write(dir.join("rules.yaml"), rules.replace("> 300", "> 500")).unwrap();
    assert!(
        !check(&["test", "rules", "alerts_test.yaml"])
            .status
            .success()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The alerts link their runbook when `runbookBaseUrl` is set, each to a section of
/// `docs/runbooks.md` that exists; without it they carry no link.
#[test]
fn every_alert_links_a_runbook_section_that_exists() {
    let helm = helm_or_skip!();
    let runbooks = std::fs::read_to_string(repo().join("docs/runbooks.md")).unwrap();
    let anchors: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    for (base, linked) in [("https://docs.example.com/runbooks.md", true), ("", false)] {
        let docs = template(
            helm,
            &operator_chart(),
            "ops",
            &[
                "exporter.enabled=true",
                "exporter.prometheusRule.enabled=true",
                &format!("exporter.prometheusRule.runbookBaseUrl={base}"),
            ],
            false,
        );
        let rule = one(&docs, "PrometheusRule", "rel-clickhouse-operator-exporter");
        let rules = s(rule, "spec.groups.0.rules")
            .unwrap()
            .as_sequence()
            .unwrap();
        assert_eq!(rules.len(), 9);
        for r in rules {
            let alert = text(r, "alert");
            let url = s(r, "annotations.runbook_url").and_then(Value::as_str);
            if linked {
                let want = format!("{base}#{}", alert.to_lowercase());
                assert_eq!(url, Some(want.as_str()), "{alert}");
                assert!(
                    anchors.contains(&alert.to_lowercase()),
                    "no section {alert} in docs/runbooks.md"
                );
            } else {
                assert_eq!(url, None, "{alert}");
            }
        }
    }
}
