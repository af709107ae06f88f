//! The operator chart as it renders: its CRDs, the Deployment, RBAC and values with the defaults
//! and with a list of watched namespaces, the PodDisruptionBudget, operator-level defaults.

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;

use crate::support::{
    aggregated, assert_no_wildcards, env_of, helm_or_skip, lint, of_kind, one, operator_chart,
    repo, rule_triples, s, template, text,
};

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
