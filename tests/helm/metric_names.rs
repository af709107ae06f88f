//! The names of the metrics: the naming options reach the programs, and the dashboards and alerts
//! read only series and labels the exporter and the operator serve under each naming.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_yaml::Value;

use crate::support::{env_of, helm_cmd, helm_or_skip, one, operator_chart, s, template, text};

/// The naming options reach the exporter as `EXPORTER_METRIC_NAMES` and
/// `EXPORTER_CLUSTER_LABEL` (defaults `clickhouse` and `clickhouse_cluster`: ClickHouse's own
/// names), the operator as `METRICS_CLUSTER_LABEL` (default `clickhouse_cluster`) and the server
/// PodMonitor as the label it gives the cluster; the names of earlier versions are set by
/// `exporter.metricNames=operator`, `exporter.clusterLabel=cluster` and
/// `metrics.clusterLabel=cluster`; the schema takes only the values the programs know.
#[test]
fn naming_options_reach_the_exporter_the_operator_and_the_server_podmonitor() {
    use clickhouse_operator::exporter::{MetricNames, Naming};
    use clickhouse_operator::runtime::metrics::ClusterLabel;
    let helm = helm_or_skip!();
    let render = |sets: &[&str]| {
        let mut all = vec!["exporter.enabled=true", "serverPodMonitor.enabled=true"];
        all.extend_from_slice(sets);
        let d = template(helm, &operator_chart(), "ops", &all, false);
        let exporter = one(&d, "Deployment", "rel-clickhouse-operator-exporter");
        let operator = one(&d, "Deployment", "rel-clickhouse-operator");
        let pm = one(&d, "PodMonitor", "rel-clickhouse-operator-servers");
        let cluster_target = s(pm, "spec.podMetricsEndpoints.0.relabelings")
            .and_then(Value::as_sequence)
            .unwrap()
            .iter()
            .find(|r| {
                text(r, "sourceLabels.0") == "__meta_kubernetes_pod_label_clickhouse_com_cluster"
            })
            .map(|r| text(r, "targetLabel"))
            .unwrap();
        let e = env_of(s(exporter, "spec.template.spec.containers.0").unwrap());
        let o = env_of(s(operator, "spec.template.spec.containers.0").unwrap());
        // every value the chart passes is one the programs take
        let naming = Naming::parse(
            Some(&e["EXPORTER_METRIC_NAMES"]),
            Some(&e["EXPORTER_CLUSTER_LABEL"]),
        )
        .unwrap();
        let operator_label =
            ClusterLabel::parse(Some(&o["METRICS_CLUSTER_LABEL"]), "METRICS_CLUSTER_LABEL")
                .unwrap();
        (naming, operator_label, cluster_target)
    };
    let (naming, operator_label, target) = render(&[]);
    assert_eq!(
        naming,
        Naming {
            names: MetricNames::ClickHouse,
            cluster_label: ClusterLabel::ClickHouseCluster,
        }
    );
    assert_eq!(operator_label, ClusterLabel::ClickHouseCluster);
    assert_eq!(target, "clickhouse_cluster");
    let (naming, operator_label, target) = render(&[
        "exporter.metricNames=operator",
        "exporter.clusterLabel=cluster",
        "metrics.clusterLabel=cluster",
    ]);
    assert_eq!(
        naming,
        Naming {
            names: MetricNames::Operator,
            cluster_label: ClusterLabel::Cluster,
        }
    );
    assert_eq!(operator_label, ClusterLabel::Cluster);
    assert_eq!(target, "cluster");
    for bad in [
        "exporter.clusterLabel=k8s",
        "exporter.metricNames=prometheus",
        "metrics.clusterLabel=k8s",
    ] {
        let mut c = helm_cmd(helm);
        c.args(["template", "rel"]).arg(operator_chart()).args([
            "--set",
            crate::support::TEST_POD_NETWORK,
            "--set",
            "exporter.enabled=true",
            "--set",
            bad,
        ]);
        assert!(
            !c.output().unwrap().status.success(),
            "the schema took {bad}"
        );
    }
}

/// The names in a PromQL expression: its series (`name` or `name{…}`) with the labels of their
/// matchers, and the labels of its `by`, `without`, `on`, `ignoring` and `group_*` lists and of
/// `label_values(…, label)`; strings, ranges, numbers, functions and keywords aside.
#[derive(Debug, Default)]
struct PromqlNames {
    series: Vec<(String, BTreeSet<String>)>,
    labels: BTreeSet<String>,
}

fn promql_names(expr: &str) -> PromqlNames {
    // aggregations may take their `by (…)` before their argument
    const KEYWORDS: [&str; 20] = [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "atan2",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let mut out = PromqlNames::default();
    let mut expr = expr.trim().to_string();
    // Grafana's `label_values(selector, label)`
    if let Some(inner) = expr
        .strip_prefix("label_values(")
        .and_then(|e| e.strip_suffix(')'))
    {
        let (selector, label) = inner.rsplit_once(',').unwrap_or((inner, ""));
        let label = label.trim();
        if !label.is_empty() {
            out.labels.insert(label.to_string());
        }
        expr = selector.to_string();
    }
    let c: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_string = |mut i: usize| {
        let q = c[i];
        i += 1;
        while i < c.len() && c[i] != q {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    let skip_space = |mut i: usize| {
        while i < c.len() && c[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '"' || ch == '\'' || ch == '`' {
            i = skip_string(i);
        } else if ch == '[' {
            while i < c.len() && c[i] != ']' {
                i += 1;
            }
        } else if ch == '$' || ch.is_ascii_digit() || ch == '.' {
            // a variable, a number or a duration
            i += 1;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
        } else if ident(ch) {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let next = skip_space(i);
            let after = c.get(next).copied();
            if LISTS.contains(&word.as_str()) {
                if after == Some('(') {
                    let mut j = next + 1;
                    let mut label = String::new();
                    while j < c.len() && c[j] != ')' {
                        if ident(c[j]) {
                            label.push(c[j]);
                        } else if !label.is_empty() {
                            out.labels.insert(std::mem::take(&mut label));
                        }
                        j += 1;
                    }
                    if !label.is_empty() {
                        out.labels.insert(label);
                    }
                    i = j + 1;
                }
            } else if after == Some('(') || KEYWORDS.contains(&word.as_str()) {
                // a function or a keyword
            } else {
                let mut matchers = BTreeSet::new();
                if after == Some('{') {
                    let mut j = next + 1;
                    while j < c.len() && c[j] != '}' {
                        if c[j] == '"' || c[j] == '\'' || c[j] == '`' {
                            j = skip_string(j);
                        } else if ident(c[j]) {
                            let st = j;
                            while j < c.len() && ident(c[j]) {
                                j += 1;
                            }
                            matchers.insert(c[st..j].iter().collect::<String>());
                        } else {
                            j += 1;
                        }
                    }
                    i = j + 1;
                }
                out.series.push((word, matchers));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Each series the operator serves, with its labels: every family given a series.
fn operator_series(
    label: clickhouse_operator::runtime::metrics::ClusterLabel,
) -> BTreeMap<String, BTreeSet<String>> {
    use clickhouse_operator::runtime::metrics::{ErrorLabels, KindLabels, Metrics, ObjectLabels};
    let m = Metrics::new(label);
    let status = serde_json::from_value(serde_json::json!({"state": "ready"})).unwrap();
    m.record_cluster(
        "n",
        "c1",
        &clickhouse_operator::controller::cluster::gauges(&status),
    );
    m.record_backup("n", "c1", 1.0);
    m.record_backup_failure("ClickHouseBackup", "Bucket");
    m.queued("ClickHouseCluster").started();
    m.pass_started("ClickHouseCluster");
    m.observe_pass("ClickHouseCluster", std::time::Duration::from_millis(5));
    m.reconciled::<()>(
        "ClickHouseCluster",
        &Ok(kube::runtime::controller::Action::await_change()),
    );
    m.reconciled("ClickHouseCluster", &Err(()));
    m.set_max_concurrent_reconciles(&["ClickHouseCluster"], 1);
    m.observed("cache");
    m.errors
        .get_or_create(&ErrorLabels {
            kind: "ClickHouseCluster".into(),
            reason: "InvalidSpec".into(),
        })
        .inc();
    m.writes
        .get_or_create(&KindLabels { kind: "Pod".into() })
        .inc();
    m.last_success
        .get_or_create(&ObjectLabels {
            kind: "ClickHouseCluster".into(),
            namespace: "n".into(),
            name: "c1".into(),
        })
        .set(1.0);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in m.encode().lines().filter(|l| !l.starts_with('#')) {
        let (name, rest) = line.split_at(line.find(['{', ' ']).unwrap_or(line.len()));
        let labels = out.entry(name.to_string()).or_default();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            for pair in inner.0.split(',') {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.to_string());
                }
            }
        }
    }
    out
}

/// What a dashboard or alert of the chart reads that the exporter and the operator, named as
/// `sets` name them, do not serve: a series no program serves, or a label its series do not
/// carry.
fn unserved(helm: &Path, sets: &[&str]) -> Vec<String> {
    let mut all = vec![
        "exporter.enabled=true",
        "exporter.prometheusRule.enabled=true",
        "dashboards.enabled=true",
    ];
    all.extend_from_slice(sets);
    unserved_in(&template(helm, &operator_chart(), "ops", &all, false))
}

/// [`unserved`] in rendered documents.
fn unserved_in(d: &[Value]) -> Vec<String> {
    use clickhouse_operator::exporter::{self, Naming};
    use clickhouse_operator::runtime::metrics::ClusterLabel;
    let e = env_of(
        s(
            one(d, "Deployment", "rel-clickhouse-operator-exporter"),
            "spec.template.spec.containers.0",
        )
        .unwrap(),
    );
    let o = env_of(
        s(
            one(d, "Deployment", "rel-clickhouse-operator"),
            "spec.template.spec.containers.0",
        )
        .unwrap(),
    );
    let naming = Naming::parse(
        Some(&e["EXPORTER_METRIC_NAMES"]),
        Some(&e["EXPORTER_CLUSTER_LABEL"]),
    )
    .unwrap();
    let operator = operator_series(
        ClusterLabel::parse(Some(&o["METRICS_CLUSTER_LABEL"]), "METRICS_CLUSTER_LABEL").unwrap(),
    );
    let server_labels: BTreeSet<String> = exporter::LABELS
        .iter()
        .copied()
        .chain([naming.cluster_label.name()])
        .map(String::from)
        .collect();
    // (where, expression, labels its text reads besides the expression's: annotations)
    let mut reads: Vec<(String, String, BTreeSet<String>)> = Vec::new();
    let rule = one(d, "PrometheusRule", "rel-clickhouse-operator-exporter");
    for r in s(rule, "spec.groups.0.rules")
        .and_then(Value::as_sequence)
        .unwrap()
    {
        let mut annotated = BTreeSet::new();
        for a in s(r, "annotations")
            .and_then(Value::as_mapping)
            .into_iter()
            .flatten()
        {
            let t = a.1.as_str().unwrap_or_default();
            for part in t.split("$labels.").skip(1) {
                annotated.insert(
                    part.chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect(),
                );
            }
        }
        reads.push((text(r, "alert"), text(r, "expr"), annotated));
    }
    let cm = one(d, "ConfigMap", "rel-clickhouse-operator-dashboards");
    for (file, json) in s(cm, "data").and_then(Value::as_mapping).unwrap() {
        let v: serde_json::Value = serde_json::from_str(json.as_str().unwrap()).unwrap();
        let file = file.as_str().unwrap();
        for t in v["templating"]["list"].as_array().unwrap() {
            if t["type"] == "query" {
                reads.push((
                    format!("{file} ${}", t["name"].as_str().unwrap()),
                    t["query"].as_str().unwrap().to_string(),
                    BTreeSet::new(),
                ));
            }
        }
        for p in v["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                reads.push((
                    format!("{file} {}", p["title"].as_str().unwrap()),
                    t["expr"].as_str().unwrap().to_string(),
                    BTreeSet::new(),
                ));
            }
        }
    }
    assert!(reads.len() > 30, "{reads:?}");
    let mut wrong = Vec::new();
    for (at, expr, annotated) in reads {
        let names = promql_names(&expr);
        assert!(!names.series.is_empty(), "{at}: no series in {expr}");
        let mut carried = BTreeSet::new();
        for (series, matchers) in &names.series {
            let labels = if naming.may_serve(series) {
                server_labels.clone()
            } else if let Some(labels) = operator.get(series) {
                labels.clone()
            } else {
                wrong.push(format!("{at}: {series} is served by no one ({expr})"));
                continue;
            };
            for m in matchers.difference(&labels) {
                wrong.push(format!("{at}: {series} has no label {m} ({expr})"));
            }
            carried.extend(labels);
        }
        for l in names.labels.union(&annotated) {
            if !carried.contains(l) {
                wrong.push(format!("{at}: no series of {expr} has the label {l}"));
            }
        }
    }
    wrong
}

/// docs/monitoring.md: every series the chart's dashboards and alert rules read is one the
/// exporter or the operator serves, with the labels they read, under the default names
/// (ClickHouse's own, `clickhouse_cluster`), under the names of earlier versions
/// (`exporter.metricNames=operator`, `exporter.clusterLabel=cluster`,
/// `metrics.clusterLabel=cluster`), and with only the servers' label changed; a series or a
/// label no one serves is found.
#[test]
fn dashboards_and_alerts_read_only_what_is_served_under_each_naming() {
    let helm = helm_or_skip!();
    for sets in [
        &[][..],
        &[
            "exporter.metricNames=operator",
            "exporter.clusterLabel=cluster",
            "metrics.clusterLabel=cluster",
        ][..],
        &["exporter.clusterLabel=cluster"][..],
        &["metrics.clusterLabel=cluster"][..],
    ] {
        let wrong = unserved(helm, sets);
        assert!(wrong.is_empty(), "{sets:?}:\n{}", wrong.join("\n"));
    }
    // the check finds what is not served: an alert on a series of the earlier names, an
    // annotation and a dashboard reading the label `cluster`, under the default names
    let mut d = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "exporter.enabled=true",
            "exporter.prometheusRule.enabled=true",
            "dashboards.enabled=true",
        ],
        false,
    );
    for doc in d.iter_mut() {
        match text(doc, "kind").as_str() {
            "PrometheusRule" => {
                let rule = &mut doc["spec"]["groups"][0]["rules"][0];
                rule["expr"] = "clickhouse_metric_Query > 100".into();
                rule["annotations"]["summary"] = "{{ $labels.cluster }}".into();
            }
            "ConfigMap" if text(doc, "metadata.name").ends_with("-dashboards") => {
                let data = &mut doc["data"]["keeper.json"];
                *data = data
                    .as_str()
                    .unwrap()
                    .replace("keeper_up{", "keeper_up{cluster=\\\"c1\\\",")
                    .into();
            }
            _ => {}
        }
    }
    let wrong = unserved_in(&d);
    for expected in [
        "ClickHouseServerDown: clickhouse_metric_Query is served by no one",
        "ClickHouseServerDown: no series of clickhouse_metric_Query > 100 has the label cluster",
        "keeper.json Members up: keeper_up has no label cluster",
    ] {
        assert!(
            wrong.iter().any(|w| w.starts_with(expected)),
            "{expected}:\n{}",
            wrong.join("\n")
        );
    }
    assert_eq!(wrong.len(), 3, "{wrong:?}");
    let names = promql_names(
        r#"sum by (pod, cluster) (rate(clickhouse_event_Query_total{namespace="$namespace",clickhouse_cluster=~"a|b"}[5m])) > 2 * 3600"#,
    );
    assert_eq!(
        names.series,
        [(
            "clickhouse_event_Query_total".to_string(),
            ["clickhouse_cluster", "namespace"].map(String::from).into()
        )]
    );
    assert_eq!(names.labels, ["cluster", "pod"].map(String::from).into());
    let default = clickhouse_operator::exporter::Naming::default();
    assert!(!default.may_serve("clickhouse_event_Query_total"));
    let names = promql_names(r#"label_values(clickhouse_up{namespace="$namespace"}, cluster)"#);
    assert_eq!(names.series[0].0, "clickhouse_up");
    assert!(names.labels.contains("cluster"));
    assert!(
        !operator_series(Default::default()).contains_key("clickhouse_operator_workqueue_depth")
    );
}
