//! The Helm charts (`charts/clickhouse-operator`, `charts/onprem-clickhouse-cluster`).
//!
//! - `helm lint` and `helm template` of both charts with default and non-default values.
//! - The chart's CRDs are exactly `deploy/crds.yaml`.
//! - Both charts' `values.schema.json` refuse misspelled keys and wrong types.
//! - On the real local Kubernetes (`hack/local-cluster.sh`): the operator installed by its chart
//!   runs IN the cluster (the node agent maps the `clickhouse-operator` image to the locally built
//!   binary, with the pod's ServiceAccount token), under the chart's RBAC only; the cluster of
//!   `onprem-clickhouse-cluster` becomes ready, a second one is refused by the quota and, with the
//!   quota off, by the operator; scale out, scale in, roll, pause, leader failover and delete; and
//!   the API server's audit log shows that no request of the operator was denied and which RBAC
//!   rules were never used.
//!
//! helm is built by `hack/helm.sh` (cached; `hack/setup.sh` builds it). If it cannot be built,
//! every test here says so and passes without checking anything.
//! `CHOP_KUBECONFIG=<dir>/kubeconfig` uses an already running local cluster (its audit log is
//! `<dir>/audit.log`); otherwise the cluster test starts its own and stops it at exit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_yaml::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn operator_chart() -> PathBuf {
    repo().join("charts/clickhouse-operator")
}

fn cluster_chart() -> PathBuf {
    repo().join("charts/onprem-clickhouse-cluster")
}

/// The helm binary from `hack/helm.sh`, or why there is none.
fn helm() -> Result<&'static Path, &'static str> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("hack/helm.sh"))
            .output()
            .map_err(|e| format!("cannot run hack/helm.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "hack/helm.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let path = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        let path = PathBuf::from(path);
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "hack/helm.sh printed no binary ({})",
                path.display()
            ))
        }
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(String::as_str)
}

macro_rules! helm_or_skip {
    () => {
        match helm() {
            Ok(h) => h,
            Err(why) => {
                skipped(&format!(
                    "helm cannot be built here, so the charts are not checked: {why}"
                ));
                return;
            }
        }
    };
}

/// Runs helm with its state folders under target/ (nothing in the user's home).
fn helm_cmd(helm: &Path) -> Command {
    let home = repo().join("target/helm-home");
    let mut c = Command::new(helm);
    c.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    c
}

fn run(mut cmd: Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn lint(helm: &Path, chart: &Path, sets: &[&str]) {
    let mut c = helm_cmd(helm);
    c.arg("lint").arg("--strict").arg(chart);
    for s in sets {
        c.arg("--set").arg(s);
    }
    run(c);
}

/// `helm template` → the rendered documents (CRDs included with `crds`).
fn template(helm: &Path, chart: &Path, namespace: &str, sets: &[&str], crds: bool) -> Vec<Value> {
    let mut c = helm_cmd(helm);
    c.arg("template")
        .arg("rel")
        .arg(chart)
        .arg("--namespace")
        .arg(namespace);
    if crds {
        c.arg("--include-crds");
    }
    for s in sets {
        c.arg("--set").arg(s);
    }
    let out = run(c);
    docs(&String::from_utf8_lossy(&out.stdout))
}

fn docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("helm printed valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn s<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(v, |v, k| match k.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(k),
        })
}

fn text(v: &Value, path: &str) -> String {
    match s(v, path) {
        Some(Value::String(x)) => x.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| text(d, "kind") == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| text(d, "kind") == kind && text(d, "metadata.name") == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn env_of(container: &Value) -> BTreeMap<String, String> {
    s(container, "env")
        .and_then(Value::as_sequence)
        .map(|env| {
            env.iter()
                .filter(|e| s(e, "value").is_some())
                .map(|e| (text(e, "name"), text(e, "value")))
                .collect()
        })
        .unwrap_or_default()
}

/// Every rule of every Role and ClusterRole: no wildcard, and only the listed verbs.
fn assert_no_wildcards(docs: &[Value]) {
    for d in docs
        .iter()
        .filter(|d| matches!(text(d, "kind").as_str(), "Role" | "ClusterRole"))
    {
        for rule in s(d, "rules").and_then(Value::as_sequence).unwrap() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                for item in s(rule, field)
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    assert_ne!(
                        item.as_str(),
                        Some("*"),
                        "wildcard in {} {}: {rule:?}",
                        text(d, "kind"),
                        text(d, "metadata.name")
                    );
                }
            }
        }
    }
}

/// The chart's CRDs are the generated ones (`clickhouse-operator crd > deploy/crds.yaml`), byte
/// for byte. Helm installs crds/ on `helm install` only.
#[test]
fn chart_crds_are_identical_to_deploy_crds() {
    let chart = std::fs::read(operator_chart().join("crds/crds.yaml"))
        .expect("charts/clickhouse-operator/crds/crds.yaml");
    let deploy = std::fs::read(repo().join("deploy/crds.yaml")).expect("deploy/crds.yaml");
    assert!(
        chart == deploy,
        "charts/clickhouse-operator/crds/crds.yaml differs from deploy/crds.yaml: run \
         `cp deploy/crds.yaml charts/clickhouse-operator/crds/crds.yaml`"
    );
}

/// Every RBAC rule of the chart says why it is there (a comment right above it).
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

#[test]
fn every_rbac_rule_of_the_chart_says_why() {
    let mut missing = Vec::new();
    for file in [
        "templates/_helpers.tpl",
        "templates/rbac.yaml",
        "templates/exporter.yaml",
        "templates/aggregated-roles.yaml",
    ] {
        let src = std::fs::read_to_string(operator_chart().join(file)).unwrap();
        let lines: Vec<&str> = src.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim_start().starts_with("- apiGroups:") {
                let above = lines[..i]
                    .iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .map(|l| l.trim_start())
                    .unwrap_or("");
                if !above.starts_with('#') {
                    missing.push(format!("{file}:{}: {l}", i + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "RBAC rules without a comment saying why:\n{}",
        missing.join("\n")
    );
}

/// Decision 40: the chart's pods are reached on their metrics port only (from
/// `networkPolicy.metricsFrom`), the PVC cleaner not at all.
#[test]
fn the_chart_closes_its_own_pods_but_their_metrics_port() {
    let helm = helm_or_skip!();
    let d = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "exporter.enabled=true",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
        ],
        false,
    );
    let by_component = |c: &str| -> Value {
        of_kind(&d, "NetworkPolicy")
            .into_iter()
            .find(|p| {
                s(p, "spec.podSelector.matchLabels")
                    .and_then(|m| m.get("app.kubernetes.io/component"))
                    .and_then(Value::as_str)
                    == Some(c)
            })
            .unwrap_or_else(|| panic!("a NetworkPolicy for {c}"))
            .clone()
    };
    for (component, port) in [("operator", "8080"), ("exporter", "9116")] {
        let p = by_component(component);
        assert_eq!(text(&p, "spec.ingress.0.ports.0.port"), port, "{component}");
        assert_eq!(
            text(
                &p,
                "spec.ingress.0.from.0.namespaceSelector.matchLabels.team"
            ),
            "monitoring"
        );
        assert!(s(&p, "spec.ingress.1").is_none(), "one way in: {component}");
    }
    let cleaner = by_component("pvc-cleaner");
    assert!(
        s(&cleaner, "spec.ingress").is_none(),
        "nothing reaches the PVC cleaner"
    );
    let off = template(
        helm,
        &operator_chart(),
        "ops",
        &["networkPolicy.enabled=false"],
        false,
    );
    assert!(of_kind(&off, "NetworkPolicy").is_empty());
}

/// Decision 40: the chart adds the three kinds to the built-in roles: `view` reads them
/// (status too), `edit` and `admin` also write them; none writes a status; off with
/// `rbac.aggregatedRoles=false`.
#[test]
fn the_built_in_roles_cover_the_three_kinds() {
    let helm = helm_or_skip!();
    let d = template(helm, &operator_chart(), "ops", &[], false);
    for role in ["view", "edit", "admin"] {
        let r = one(
            &d,
            "ClusterRole",
            &format!("rel-clickhouse-operator-{role}"),
        );
        let label = s(r, "metadata.labels")
            .and_then(|l| l.get(format!("rbac.authorization.k8s.io/aggregate-to-{role}")))
            .and_then(Value::as_str);
        assert_eq!(label, Some("true"), "{role}");
        let triples = rule_triples(r);
        for kind in [
            "clickhouseclusters",
            "clickhousebackups",
            "clickhouserestores",
        ] {
            let can = |verb: &str| {
                triples
                    .iter()
                    .any(|(g, res, v)| g == "clickhouse.com" && res == kind && v == verb)
            };
            assert!(
                can("get") && can("list") && can("watch"),
                "{role} reads {kind}"
            );
            assert_eq!(can("create"), role != "view", "{role} creates {kind}");
            assert_eq!(can("delete"), role != "view", "{role} deletes {kind}");
            let status = format!("{kind}/status");
            assert!(
                !triples
                    .iter()
                    .any(|(_, res, v)| *res == status && v != "get" && v != "list" && v != "watch")
            );
        }
    }
    let off = template(
        helm,
        &operator_chart(),
        "ops",
        &["rbac.aggregatedRoles=false"],
        false,
    );
    assert!(
        of_kind(&off, "ClusterRole")
            .iter()
            .all(|r| !text(r, "metadata.name").ends_with("-view"))
    );
}

/// S0-08, S0-09 and the operator chart: `helm lint --strict` passes with default and non-default
/// values.
#[test]
fn helm_lint_passes_with_default_and_custom_values() {
    let helm = helm_or_skip!();
    lint(helm, &operator_chart(), &[]);
    lint(
        helm,
        &operator_chart(),
        &[
            "watchNamespace=team-a\\,team-b",
            "image.repository=registry.example/clickhouse-operator",
            "image.tag=1.2.3",
            "maxConcurrentReconciles=4",
            "log.format=text",
            "log.level=debug",
            "replicaCount=3",
            "metrics.serviceMonitor.enabled=true",
            "pvcCleaner.enabled=false",
        ],
    );
    lint(helm, &cluster_chart(), &[]);
    lint(
        helm,
        &cluster_chart(),
        &[
            "resourceQuota.enabled=false",
            "spec.shards=2",
            "usersSecret.create=true",
            "usersSecret.users.analyst=secret",
        ],
    );
}

/// The operator chart with its defaults: cluster-wide RBAC without wildcards, 2 replicas with
/// leader election, a hardened pod, probes on /healthz and /readyz at 8080, a metrics Service,
/// no ServiceMonitor, and the PVC cleaner as its own Deployment with its own ServiceAccount.
#[test]
fn operator_chart_defaults_render_a_hardened_leader_elected_deployment() {
    let helm = helm_or_skip!();
    let d = template(helm, &operator_chart(), "ops", &[], false);
    assert!(of_kind(&d, "CustomResourceDefinition").is_empty());
    let with_crds = template(helm, &operator_chart(), "ops", &[], true);
    let crds: BTreeSet<String> = of_kind(&with_crds, "CustomResourceDefinition")
        .iter()
        .map(|c| text(c, "metadata.name"))
        .collect();
    assert!(
        crds.contains("clickhouseclusters.clickhouse.com"),
        "{crds:?}"
    );
    assert!(
        crds.contains("clickhousebackups.clickhouse.com"),
        "{crds:?}"
    );

    let dep = one(&d, "Deployment", "rel-clickhouse-operator");
    assert_eq!(text(dep, "metadata.namespace"), "ops");
    assert_eq!(text(dep, "spec.replicas"), "2");
    let pod = s(dep, "spec.template.spec").unwrap();
    assert_eq!(text(pod, "serviceAccountName"), "rel-clickhouse-operator");
    assert_eq!(text(pod, "securityContext.runAsNonRoot"), "true");
    assert_eq!(
        text(pod, "securityContext.seccompProfile.type"),
        "RuntimeDefault"
    );
    let c = s(pod, "containers.0").unwrap();
    assert_eq!(text(c, "image"), "clickhouse-operator:0.1.0");
    assert_eq!(text(c, "args.0"), "run");
    assert_eq!(text(c, "securityContext.readOnlyRootFilesystem"), "true");
    assert_eq!(text(c, "securityContext.allowPrivilegeEscalation"), "false");
    assert_eq!(text(c, "securityContext.runAsNonRoot"), "true");
    assert_eq!(
        text(c, "securityContext.seccompProfile.type"),
        "RuntimeDefault"
    );
    assert_eq!(text(c, "securityContext.capabilities.drop.0"), "ALL");
    assert_eq!(text(c, "livenessProbe.httpGet.path"), "/healthz");
    assert_eq!(text(c, "readinessProbe.httpGet.path"), "/readyz");
    assert_eq!(text(c, "livenessProbe.httpGet.port"), "http");
    assert_eq!(text(c, "ports.0.name"), "http");
    assert_eq!(text(c, "ports.0.containerPort"), "8080");
    assert!(s(c, "resources.requests.cpu").is_some());
    let env = env_of(c);
    assert_eq!(env["WATCH_NAMESPACE"], "");
    assert_eq!(env["MAX_CONCURRENT_RECONCILES"], "1");
    assert_eq!(env["LOG_FORMAT"], "json");
    assert_eq!(env["LOG_LEVEL"], "info");
    assert_eq!(env["HTTP_ADDR"], "0.0.0.0:8080");
    assert_eq!(env["LEADER_ELECTION"], "true");
    assert_eq!(env["LEASE_NAME"], "rel-clickhouse-operator-leader");
    assert_eq!(env["PVC_CLEANER"], "false");
    let from_field: BTreeMap<String, String> = s(c, "env")
        .and_then(Value::as_sequence)
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                text(e, "name"),
                text(s(e, "valueFrom")?, "fieldRef.fieldPath"),
            ))
        })
        .collect();
    assert_eq!(from_field["POD_NAME"], "metadata.name");
    assert_eq!(from_field["POD_NAMESPACE"], "metadata.namespace");

    // metrics Service on 8080, no ServiceMonitor unless asked
    let svc = one(&d, "Service", "rel-clickhouse-operator-metrics");
    assert_eq!(text(svc, "spec.ports.0.port"), "8080");
    assert_eq!(text(svc, "spec.ports.0.targetPort"), "http");
    assert!(of_kind(&d, "ServiceMonitor").is_empty());

    // the PVC cleaner alone, under its own ServiceAccount
    let cleaner = one(&d, "Deployment", "rel-clickhouse-operator-pvc-cleaner");
    assert_eq!(text(cleaner, "spec.replicas"), "1");
    assert_eq!(
        text(cleaner, "spec.template.spec.serviceAccountName"),
        "rel-clickhouse-operator-pvc-cleaner"
    );
    let cc = s(cleaner, "spec.template.spec.containers.0").unwrap();
    assert_eq!(text(cc, "args.0"), "pvc-cleaner");
    assert_eq!(text(cc, "securityContext.readOnlyRootFilesystem"), "true");
    one(&d, "ServiceAccount", "rel-clickhouse-operator-pvc-cleaner");
    // decision 39: the operator and the cleaner share the key of the PVC deletion proof,
    // from the chart's Secret, never inline
    let key_of = |container: &Value| -> String {
        let e = s(container, "env")
            .and_then(Value::as_sequence)
            .unwrap()
            .iter()
            .find(|e| text(e, "name") == "PVC_DELETE_KEY")
            .expect("PVC_DELETE_KEY")
            .clone();
        assert!(s(&e, "value").is_none(), "not inline");
        text(&e, "valueFrom.secretKeyRef.name")
    };
    assert_eq!(key_of(c), "rel-clickhouse-operator-pvc-delete-key");
    assert_eq!(key_of(cc), "rel-clickhouse-operator-pvc-delete-key");
    let key = one(&d, "Secret", "rel-clickhouse-operator-pvc-delete-key");
    assert!(text(key, "data.key").len() >= 48, "a random key");

    // cluster-wide: a ClusterRole per component, the Lease Role in the release namespace only
    assert_no_wildcards(&d);
    let op_role = one(&d, "ClusterRole", "rel-clickhouse-operator");
    let cleaner_role = one(&d, "ClusterRole", "rel-clickhouse-operator-pvc-cleaner");
    one(&d, "ClusterRoleBinding", "rel-clickhouse-operator");
    one(
        &d,
        "ClusterRoleBinding",
        "rel-clickhouse-operator-pvc-cleaner",
    );
    let lease = one(&d, "Role", "rel-clickhouse-operator-leader-election");
    assert_eq!(text(lease, "metadata.namespace"), "ops");
    let rules = |r: &Value| rule_triples(r);
    assert!(
        !rules(op_role)
            .iter()
            .any(|(g, r, v)| g.is_empty() && r == "persistentvolumeclaims" && v == "delete"),
        "only the PVC cleaner deletes PVCs"
    );
    assert!(rules(cleaner_role).contains(&(
        "".into(),
        "persistentvolumeclaims".into(),
        "delete".into()
    )));
    assert!(
        !rules(op_role)
            .iter()
            .any(|(g, _, _)| g == "coordination.k8s.io"),
        "the Lease is only in the release namespace"
    );
}

/// (apiGroup, resource, verb) of every rule of a Role or ClusterRole.
/// A ClusterRole the chart aggregates into the built-in `view`, `edit` or `admin` role.
fn aggregated(role: &Value) -> bool {
    s(role, "metadata.labels")
        .and_then(Value::as_mapping)
        .is_some_and(|l| {
            l.keys().any(|k| {
                k.as_str()
                    .is_some_and(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"))
            })
        })
}

fn rule_triples(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in s(role, "rules")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let list = |f: &str| -> Vec<String> {
            s(rule, f)
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

/// S2-07 and the values: with WATCH_NAMESPACE set, Roles in those namespaces only and nothing
/// cluster-wide; image, MAX_CONCURRENT_RECONCILES, log format and level, resources, replicas,
/// the ServiceMonitor and the PVC cleaner switch come from the values.
#[test]
fn operator_chart_with_watch_namespace_renders_namespaced_roles_only() {
    let helm = helm_or_skip!();
    let d = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "watchNamespace=team-a\\, team-b\\,team-a",
            "image.repository=registry.example/clickhouse-operator",
            "image.tag=1.2.3",
            "maxConcurrentReconciles=4",
            "log.format=text",
            "log.level=debug",
            "replicaCount=3",
            "resources.limits.memory=1Gi",
            "metrics.serviceMonitor.enabled=true",
        ],
        false,
    );
    assert_no_wildcards(&d);
    assert!(
        of_kind(&d, "ClusterRole").iter().all(|r| aggregated(r)),
        "no cluster-wide rights but the roles aggregated into view, edit and admin for tenants"
    );
    assert!(
        of_kind(&d, "ClusterRoleBinding").is_empty(),
        "no cluster-wide rights"
    );
    let roles: BTreeSet<(String, String)> = of_kind(&d, "Role")
        .iter()
        .map(|r| (text(r, "metadata.namespace"), text(r, "metadata.name")))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("team-a", "rel-clickhouse-operator"),
        ("team-b", "rel-clickhouse-operator"),
        ("team-a", "rel-clickhouse-operator-pvc-cleaner"),
        ("team-b", "rel-clickhouse-operator-pvc-cleaner"),
        ("ops", "rel-clickhouse-operator-leader-election"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(roles, expected);
    for b in of_kind(&d, "RoleBinding") {
        assert_eq!(
            text(b, "subjects.0.namespace"),
            "ops",
            "bindings name the release's ServiceAccounts"
        );
    }
    let dep = one(&d, "Deployment", "rel-clickhouse-operator");
    assert_eq!(text(dep, "spec.replicas"), "3");
    let c = s(dep, "spec.template.spec.containers.0").unwrap();
    assert_eq!(
        text(c, "image"),
        "registry.example/clickhouse-operator:1.2.3"
    );
    assert_eq!(text(c, "resources.limits.memory"), "1Gi");
    let env = env_of(c);
    assert_eq!(env["WATCH_NAMESPACE"], "team-a,team-b");
    assert_eq!(env["MAX_CONCURRENT_RECONCILES"], "4");
    assert_eq!(env["LOG_FORMAT"], "text");
    assert_eq!(env["LOG_LEVEL"], "debug");
    let cleaner = one(&d, "Deployment", "rel-clickhouse-operator-pvc-cleaner");
    let cc = s(cleaner, "spec.template.spec.containers.0").unwrap();
    assert_eq!(env_of(cc)["WATCH_NAMESPACE"], "team-a,team-b");
    let sm = one(&d, "ServiceMonitor", "rel-clickhouse-operator");
    assert_eq!(text(sm, "spec.endpoints.0.port"), "http-metrics");
    assert_eq!(text(sm, "spec.endpoints.0.path"), "/metrics");
    // a cluster's series keep the cluster's namespace, not the operator pod's
    assert_eq!(text(sm, "spec.endpoints.0.honorLabels"), "true");

    // the PVC cleaner switched off: no Deployment, ServiceAccount or Role of it
    let off = template(
        helm,
        &operator_chart(),
        "ops",
        &["watchNamespace=team-a", "pvcCleaner.enabled=false"],
        false,
    );
    assert!(
        !off.iter()
            .any(|o| text(o, "metadata.name").ends_with("pvc-cleaner")),
        "pvcCleaner.enabled=false leaves nothing of the cleaner"
    );
}

/// S0-08, S0-09: the quota is rendered by default with `count/clickhouseclusters.clickhouse.com:
/// "1"`, omitted with `resourceQuota.enabled=false`, and values.yaml carries the warning; the
/// ClickHouseCluster comes from the values.
#[test]
fn onprem_chart_renders_the_one_cluster_quota_unless_disabled() {
    let helm = helm_or_skip!();
    let d = template(helm, &cluster_chart(), "analytics", &[], false);
    let quotas = of_kind(&d, "ResourceQuota");
    assert_eq!(quotas.len(), 1, "one ResourceQuota by default");
    let q = quotas[0];
    assert_eq!(text(q, "metadata.namespace"), "analytics");
    let hard = s(q, "spec.hard").and_then(Value::as_mapping).unwrap();
    assert_eq!(hard.len(), 1, "{hard:?}");
    assert_eq!(
        hard.get("count/clickhouseclusters.clickhouse.com")
            .and_then(Value::as_str),
        Some("1"),
        "the quota value is the string \"1\""
    );
    let chc = one(&d, "ClickHouseCluster", "rel");
    assert_eq!(text(chc, "apiVersion"), "clickhouse.com/v1alpha1");
    assert_eq!(text(chc, "metadata.namespace"), "analytics");
    assert_eq!(text(chc, "spec.replicas"), "2");
    assert_eq!(text(chc, "spec.keeper.replicas"), "3");
    assert!(of_kind(&d, "Secret").is_empty());

    let off = template(
        helm,
        &cluster_chart(),
        "analytics",
        &[
            "resourceQuota.enabled=false",
            "nameOverride=events",
            "spec.shards=2",
            "spec.replicas=3",
            "usersSecret.create=true",
            "usersSecret.users.analyst=pw",
        ],
        false,
    );
    assert!(
        of_kind(&off, "ResourceQuota").is_empty(),
        "resourceQuota.enabled=false omits the quota"
    );
    let chc = one(&off, "ClickHouseCluster", "events");
    assert_eq!(text(chc, "spec.shards"), "2");
    assert_eq!(text(chc, "spec.replicas"), "3");
    assert_eq!(text(chc, "spec.users.secretName"), "events-user-passwords");
    let secret = one(&off, "Secret", "events-user-passwords");
    assert_eq!(text(secret, "stringData.analyst"), "pw");

    let values = std::fs::read_to_string(cluster_chart().join("values.yaml")).unwrap();
    assert!(
        values.contains("leads to a degraded cluster the operator cannot reconcile"),
        "values.yaml warns that disabling the quota leads to a degraded cluster"
    );
    let readme = std::fs::read_to_string(cluster_chart().join("README.md")).unwrap();
    assert!(readme.contains("degraded cluster the operator cannot reconcile"));
}

/// Values that cannot work are refused by `helm template` with a message naming them: a
/// ServiceMonitor without the metrics Service, a users Secret named like one the operator owns.
#[test]
fn charts_refuse_values_that_cannot_work() {
    let helm = helm_or_skip!();
    let refused = |chart: PathBuf, sets: &[&str], message: &str| {
        let mut c = helm_cmd(helm);
        c.arg("template").arg("r").arg(&chart);
        for s in sets {
            c.arg("--set").arg(s);
        }
        let out = c.output().expect("helm template");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{sets:?}: {stderr}"
        );
    };
    refused(
        operator_chart(),
        &[
            "metrics.service.enabled=false",
            "metrics.serviceMonitor.enabled=true",
        ],
        "metrics.serviceMonitor.enabled needs metrics.service.enabled",
    );
    for name in ["r-users", "r-operator"] {
        refused(
            cluster_chart(),
            &[
                "usersSecret.create=true",
                &format!("usersSecret.name={name}"),
            ],
            "is a Secret the operator owns",
        );
    }
}

/// Both charts carry a `values.schema.json`: a misspelled key or a value of the wrong type fails
/// `helm template` (and so `helm install`) naming it, while correct values pass. The cluster
/// chart's `spec` is checked against the CRD's schema, its free-form maps and pod templates
/// stay free.
#[test]
fn values_schemas_refuse_misspelled_keys_and_wrong_types() {
    let helm = helm_or_skip!();
    let render = |chart: &Path, sets: &[&str]| {
        let mut c = helm_cmd(helm);
        c.arg("template").arg("r").arg(chart);
        for s in sets {
            c.arg("--set").arg(s);
        }
        let out = c.output().expect("helm template");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (chart, sets, says) in [
        (
            operator_chart(),
            &["replicaCont=3"][..],
            "'replicaCont' not allowed",
        ),
        (
            operator_chart(),
            &["image.tagg=1.2.3"][..],
            "'tagg' not allowed",
        ),
        (operator_chart(), &["replicaCount=two"][..], "/replicaCount"),
        (operator_chart(), &["log.format=xml"][..], "/log/format"),
        (
            operator_chart(),
            &["exporter.enabled=yes"][..],
            "/exporter/enabled",
        ),
        (
            cluster_chart(),
            &["spec.replcas=2"][..],
            "'replcas' not allowed",
        ),
        (
            cluster_chart(),
            &["spec.keeper.replcas=1"][..],
            "'replcas' not allowed",
        ),
        (cluster_chart(), &["spec.shards=two"][..], "/spec/shards"),
        (
            cluster_chart(),
            &["spec.updateStrategy=Fast"][..],
            "/spec/updateStrategy",
        ),
        (
            cluster_chart(),
            &["resourceQuota.enable=false"][..],
            "'enable' not allowed",
        ),
        (
            cluster_chart(),
            &["usersSecret.users.analyst.password=x"][..],
            "/usersSecret/users/analyst",
        ),
    ] {
        let (ok, stderr) = render(&chart, sets);
        assert!(
            !ok && stderr.contains(says),
            "{sets:?} passed or said: {stderr}"
        );
    }
    for (chart, sets) in [
        (operator_chart(), &[][..]),
        (
            operator_chart(),
            &[
                "replicaCount=3",
                "image.tag=1.2.3",
                "log.format=text",
                "exporter.enabled=true",
                "exporter.tokenSecret.name=exporter-token",
                "operatorNetworks={10.0.0.0/8}",
                "podLabels.team=db",
            ][..],
        ),
        (cluster_chart(), &[][..]),
        (
            cluster_chart(),
            &[
                "spec.replicas=3",
                "spec.keeper.replicas=1",
                "spec.updateStrategy=RollingUpdate",
                "spec.clientService.annotations.team=analytics",
                "spec.configuration.settings.logger/level=debug",
                "spec.pod.template.spec.priorityClassName=high",
                "usersSecret.create=true",
                "usersSecret.users.analyst=pw",
            ][..],
        ),
    ] {
        let (ok, stderr) = render(&chart, sets);
        assert!(ok, "{sets:?}: {stderr}");
    }
}

// ------------------------------------------------------------------------------------------------
// On the real local Kubernetes
// ------------------------------------------------------------------------------------------------

#[path = "helm/in_cluster.rs"]
mod in_cluster;

/// A test whose tool is missing is skipped here and said so; in CI (`CI=true`, set by
/// `.ci/run`), where everything is installed, a missing tool fails it instead.
fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

/// Every value of the operator chart's `values.yaml` is in the chart README's table (itself, or
/// a value it belongs to, such as `resources` for `resources.requests.cpu`), and the table names
/// no value that does not exist: a value added, renamed or removed without the README fails.
/// In the table, `` `a.b`, `.c` `` stands for `a.b` and `a.c`.
#[test]
fn the_operator_charts_readme_names_every_value_and_no_other() {
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(operator_chart().join("values.yaml")).unwrap(),
    )
    .unwrap();
    fn leaves(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) if !m.is_empty() => {
                for (k, v) in m {
                    let k = k.as_str().unwrap();
                    let p = if path.is_empty() {
                        k.to_string()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, &p, out);
                }
            }
            _ => out.push(path.to_string()),
        }
    }
    let mut all = Vec::new();
    leaves(&values, "", &mut all);
    let readme = std::fs::read_to_string(operator_chart().join("README.md")).unwrap();
    let mut named = BTreeSet::new();
    for row in readme.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap().trim_start_matches("| ");
        let mut parent = String::new();
        for token in first.split('`').skip(1).step_by(2) {
            let full = match token.strip_prefix('.') {
                Some(rest) => format!("{parent}.{rest}"),
                None => token.to_string(),
            };
            parent = full
                .rsplit_once('.')
                .map_or(String::new(), |(p, _)| p.to_string());
            named.insert(full);
        }
    }
    let covered = |leaf: &str| {
        let mut p = leaf.to_string();
        loop {
            if named.contains(&p) {
                return true;
            }
            match p.rsplit_once('.') {
                Some((up, _)) => p = up.to_string(),
                None => return false,
            }
        }
    };
    let missing: Vec<&String> = all.iter().filter(|l| !covered(l)).collect();
    assert!(
        missing.is_empty(),
        "values not in charts/clickhouse-operator/README.md: {missing:?}"
    );
    let unknown: Vec<&String> = named
        .iter()
        .filter(|n| {
            !all.iter()
                .any(|l| l == *n || l.starts_with(&format!("{n}.")))
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "the README names values that do not exist: {unknown:?}"
    );
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

/// With more than one replica the operator gets a PodDisruptionBudget that keeps one of its pods
/// through a drain, selecting exactly the Deployment's pods; with one replica, or switched off,
/// none (it would block every drain).
#[test]
fn the_operator_keeps_a_pod_through_voluntary_evictions() {
    let helm = helm_or_skip!();
    let docs = template(helm, &operator_chart(), "ops", &[], false);
    let pdb = one(&docs, "PodDisruptionBudget", "rel-clickhouse-operator");
    let deployment = one(&docs, "Deployment", "rel-clickhouse-operator");
    assert_eq!(text(pdb, "spec.minAvailable"), "1");
    assert_eq!(
        s(pdb, "spec.selector.matchLabels"),
        s(deployment, "spec.selector.matchLabels")
    );
    for sets in [
        &["replicaCount=1"][..],
        &["podDisruptionBudget.enabled=false"][..],
    ] {
        let docs = template(helm, &operator_chart(), "ops", sets, false);
        assert!(of_kind(&docs, "PodDisruptionBudget").is_empty(), "{sets:?}");
    }
}

/// Operator-level defaults (decision 52): the chart's `clusterDefaults` become a ConfigMap the
/// operator's pod mounts and names in `CLUSTER_DEFAULTS_FILE`, with a hash of them on the pod so
/// that a change restarts the operator; the file is what the operator parses; without them,
/// nothing of it is rendered.
#[test]
fn cluster_defaults_reach_the_operator_as_a_file_it_reads() {
    let helm = helm_or_skip!();
    let none = template(helm, &operator_chart(), "ops", &[], false);
    assert!(
        !none
            .iter()
            .any(|d| text(d, "metadata.name") == "rel-clickhouse-operator-cluster-defaults")
    );
    let dep = one(&none, "Deployment", "rel-clickhouse-operator");
    assert!(
        !env_of(s(dep, "spec.template.spec.containers.0").unwrap())
            .contains_key("CLUSTER_DEFAULTS_FILE")
    );

    let sets = [
        "clusterDefaults.pod.template.spec.imagePullSecrets[0].name=registry",
        "clusterDefaults.pod.nodeSelector.pool=db",
        "clusterDefaults.configuration.settings.max_concurrent_queries=200",
    ];
    let d = template(helm, &operator_chart(), "ops", &sets, false);
    let cm = one(&d, "ConfigMap", "rel-clickhouse-operator-cluster-defaults");
    let file = s(cm, "data")
        .and_then(|d| d.get("cluster-defaults.yaml"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let defaults = clickhouse_operator::api::defaults::ClusterDefaults::parse(&file)
        .unwrap_or_else(|e| panic!("{e}: {file}"));
    let spec = defaults
        .apply(&serde_json::from_value(serde_json::json!({})).unwrap())
        .unwrap();
    assert_eq!(
        spec.pod.node_selector.get("pool").map(String::as_str),
        Some("db"),
        "{file}\n{spec:?}"
    );
    assert_eq!(spec.configuration.settings["max_concurrent_queries"], "200");
    let dep = one(&d, "Deployment", "rel-clickhouse-operator");
    let container = s(dep, "spec.template.spec.containers.0").unwrap();
    assert_eq!(
        env_of(container)["CLUSTER_DEFAULTS_FILE"],
        "/etc/clickhouse-operator/defaults/cluster-defaults.yaml"
    );
    assert_eq!(
        text(container, "volumeMounts.0.mountPath"),
        "/etc/clickhouse-operator/defaults"
    );
    assert_eq!(
        text(dep, "spec.template.spec.volumes.0.configMap.name"),
        "rel-clickhouse-operator-cluster-defaults"
    );
    let hash = s(dep, "spec.template.metadata.annotations")
        .and_then(|a| a.get("clickhouse.com/cluster-defaults-hash"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert_eq!(hash.len(), 16, "{dep:?}");
    lint(helm, &operator_chart(), &sets);
}

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
