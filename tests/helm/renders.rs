//! What the operator chart renders without a cluster, and what it is given rather than looks up:
//! the operator's networks (review M-3), the PVC-deletion key under GitOps (review L-11), where
//! the operator may read pods' logs and mint ServiceAccount tokens (review M-5), and what the
//! install notes say of it.

use std::collections::BTreeSet;

use serde_yaml::Value;

use crate::support::{
    docs, env_of, helm_or_skip, notes, of_kind, one, operator_chart, rule_triples, s, template,
    template_text, text,
};

/// Decision 71 (review M-3): `operatorNetworks` is required. Without it the chart refuses to
/// render (`helm template` as `helm install`), naming the value and what to put there, where it
/// used to look the Nodes' pod CIDRs up at install (missing Nodes added later and CNIs with
/// their own pools) and, rendered without a cluster, silently set nothing. Given, it is
/// `OPERATOR_NETWORKS` as written, the notes say so, and no template looks a Node up. The
/// clusters' NetworkPolicies need no address: `OPERATOR_POD_SELECTOR` names exactly the labels
/// of the operator's pods (and the exporter's), which they select in the release namespace.
#[test]
fn operator_networks_are_required_and_never_looked_up() {
    let helm = helm_or_skip!();
    let refused = template_text(helm, &operator_chart(), &[]).unwrap_err();
    assert!(
        refused.contains("operatorNetworks is required")
            && refused.contains("not the pod CIDR of one Node"),
        "{refused}"
    );
    let d = docs(
        &template_text(
            helm,
            &operator_chart(),
            &[
                "operatorNetworks={10.0.0.0/8,fd00::/8}",
                "exporter.enabled=true",
            ],
        )
        .unwrap(),
    );
    let dep = one(&d, "Deployment", "rel-clickhouse-operator");
    let env = env_of(s(dep, "spec.template.spec.containers.0").unwrap());
    assert_eq!(env["OPERATOR_NETWORKS"], "10.0.0.0/8,fd00::/8");
    // the selector the clusters' NetworkPolicies use selects the operator's and exporter's pods
    let selector: BTreeSet<(String, String)> = env["OPERATOR_POD_SELECTOR"]
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    for name in [
        "rel-clickhouse-operator",
        "rel-clickhouse-operator-exporter",
    ] {
        let labels: BTreeSet<(String, String)> =
            s(one(&d, "Deployment", name), "spec.template.metadata.labels")
                .and_then(Value::as_mapping)
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str().unwrap().into(), v.as_str().unwrap().into()))
                .collect();
        assert!(selector.is_subset(&labels), "{name}: {labels:?}");
    }
    let n = notes(helm, &operator_chart(), &["operatorNetworks={10.0.0.0/8}"]);
    assert!(n.contains("accepts logins from: 10.0.0.0/8"), "{n}");
    for entry in std::fs::read_dir(operator_chart().join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let src = std::fs::read_to_string(&path).unwrap();
        assert!(
            !src.contains("lookup \"v1\" \"Node\""),
            "{} looks Nodes up",
            path.display()
        );
    }
}

/// Decision 73 (review L-11): with `pvcDeleteKey.existingSecret`, two renders without a cluster
/// (as Argo CD and Flux render) are the same, byte for byte: the chart makes no key Secret and
/// both the operator and the PVC cleaner read the named one. Without it, the chart's own key is
/// made anew by each such render (what the notes warn of), so two renders differ.
#[test]
fn the_operator_chart_renders_the_same_twice_without_a_cluster() {
    let helm = helm_or_skip!();
    let gitops = [
        "operatorNetworks={10.244.0.0/16}",
        "pvcDeleteKey.existingSecret=pvc-key",
        "exporter.enabled=true",
    ];
    let first = template_text(helm, &operator_chart(), &gitops).unwrap();
    let second = template_text(helm, &operator_chart(), &gitops).unwrap();
    assert_eq!(first, second, "two renders differ");
    let d = docs(&first);
    assert!(
        !of_kind(&d, "Secret")
            .iter()
            .any(|s| text(s, "metadata.name").ends_with("pvc-delete-key")),
        "no key Secret of the chart's"
    );
    for name in [
        "rel-clickhouse-operator",
        "rel-clickhouse-operator-pvc-cleaner",
    ] {
        let env = s(
            one(&d, "Deployment", name),
            "spec.template.spec.containers.0.env",
        )
        .and_then(Value::as_sequence)
        .unwrap()
        .iter()
        .find(|e| text(e, "name") == "PVC_DELETE_KEY")
        .unwrap()
        .clone();
        assert_eq!(
            text(&env, "valueFrom.secretKeyRef.name"),
            "pvc-key",
            "{name}"
        );
        assert_eq!(text(&env, "valueFrom.secretKeyRef.key"), "key", "{name}");
    }
    let plain = ["operatorNetworks={10.244.0.0/16}"];
    assert_ne!(
        template_text(helm, &operator_chart(), &plain).unwrap(),
        template_text(helm, &operator_chart(), &plain).unwrap(),
        "the chart's own key is made anew by each render without a cluster"
    );
    let n = notes(helm, &operator_chart(), &plain);
    assert!(n.contains("set pvcDeleteKey.existingSecret there"), "{n}");
}

fn grants(d: &[Value], kind: &str, name: &str, resource: &str) -> bool {
    d.iter()
        .filter(|r| text(r, "kind") == kind && text(r, "metadata.name") == name)
        .any(|r| rule_triples(r).iter().any(|(_, res, _)| res == resource))
}

/// Decision 72 (review M-5): `pods/log` and ServiceAccount tokens are granted where they are
/// needed only. Cluster-wide (the default), the ClusterRole has neither: pods' logs only with
/// `rbac.clusterWidePodLogs`, and `serviceaccounts` get and `serviceaccounts/token` create only
/// by a Role in each namespace of `rbac.webIdentityNamespaces` (none by default). Namespaced,
/// the watched namespaces' Roles read pods' logs, tokens again only where listed, and a listed
/// namespace that is not watched is refused. The install notes of a cluster-wide install say
/// it is as good as cluster-admin and that a namespaced install is the one for shared clusters.
#[test]
fn pod_logs_and_service_account_tokens_are_granted_only_where_needed() {
    let helm = helm_or_skip!();
    let op = "rel-clickhouse-operator";
    let web = "rel-clickhouse-operator-web-identity";
    let d = template(helm, &operator_chart(), "ops", &[], false);
    for resource in ["pods/log", "serviceaccounts", "serviceaccounts/token"] {
        assert!(!grants(&d, "ClusterRole", op, resource), "{resource}");
    }
    assert!(
        of_kind(&d, "Role")
            .iter()
            .all(|r| text(r, "metadata.name") != web)
    );
    let d = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "rbac.webIdentityNamespaces={team-a}",
            "rbac.clusterWidePodLogs=true",
        ],
        false,
    );
    assert!(grants(&d, "ClusterRole", op, "pods/log"));
    assert!(!grants(&d, "ClusterRole", op, "serviceaccounts/token"));
    let role = one(&d, "Role", web);
    assert_eq!(text(role, "metadata.namespace"), "team-a");
    assert_eq!(
        rule_triples(role),
        [
            ("", "serviceaccounts", "get"),
            ("", "serviceaccounts/token", "create")
        ]
        .into_iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
    );
    let binding = one(&d, "RoleBinding", web);
    assert_eq!(text(binding, "subjects.0.name"), op);
    assert_eq!(text(binding, "subjects.0.namespace"), "ops");

    let d = template(
        helm,
        &operator_chart(),
        "ops",
        &[
            "watchNamespace=team-a\\,team-b",
            "rbac.webIdentityNamespaces={team-b}",
        ],
        false,
    );
    let in_ns = |ns: &str, name: &str, resource: &str| {
        d.iter()
            .filter(|r| {
                text(r, "kind") == "Role"
                    && text(r, "metadata.name") == name
                    && text(r, "metadata.namespace") == ns
            })
            .any(|r| rule_triples(r).iter().any(|(_, res, _)| res == resource))
    };
    for ns in ["team-a", "team-b"] {
        assert!(in_ns(ns, op, "pods/log"), "{ns}");
        assert!(!in_ns(ns, op, "serviceaccounts/token"), "{ns}");
    }
    assert!(in_ns("team-b", web, "serviceaccounts/token"));
    assert!(!in_ns("team-a", web, "serviceaccounts/token"));
    let refused = template_text(
        helm,
        &operator_chart(),
        &[
            crate::support::TEST_POD_NETWORK,
            "watchNamespace=team-a",
            "rbac.webIdentityNamespaces={team-c}",
        ],
    )
    .unwrap_err();
    assert!(
        refused.contains("team-c is not a watched namespace"),
        "{refused}"
    );

    let wide = notes(helm, &operator_chart(), &[crate::support::TEST_POD_NETWORK]);
    assert!(
        wide.contains("WARNING: watchNamespace is empty")
            && wide.contains("as good as cluster-admin")
            && wide.contains("install it once per trust")
            && wide.contains("no namespace (rbac.webIdentityNamespaces)"),
        "{wide}"
    );
    let namespaced = notes(
        helm,
        &operator_chart(),
        &[crate::support::TEST_POD_NETWORK, "watchNamespace=team-a"],
    );
    assert!(!namespaced.contains("WARNING"), "{namespaced}");
}
