//! Who may do what to what the operator chart installs: every RBAC rule says why, the built-in
//! roles cover the three kinds, and NetworkPolicies close the chart's own pods.

use serde_yaml::Value;

use crate::support::{helm_or_skip, of_kind, one, operator_chart, rule_triples, s, template, text};

/// Every RBAC rule of the chart says why it is there (a comment right above it).
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
