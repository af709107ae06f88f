//! The cluster chart (`onprem-clickhouse-cluster`) as it renders: its one-cluster quota and the
//! ClickHouseCluster of its values.

use serde_yaml::Value;

use crate::support::{cluster_chart, helm_or_skip, of_kind, one, s, template, text};

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

/// Review L-7: the users Secret's keys are quoted, so that user names YAML would read as
/// something else (`0123` a number, `true` a boolean, `on` a boolean to YAML 1.1 readers such as
/// the API server's) stay the names given, and the Secret holds exactly those users.
#[test]
fn the_users_secret_keeps_user_names_that_look_like_other_yaml() {
    let helm = helm_or_skip!();
    let d = template(
        helm,
        &cluster_chart(),
        "analytics",
        &[
            "usersSecret.create=true",
            "usersSecret.users.0123=pw-digits",
            "usersSecret.users.true=pw-true",
            "usersSecret.users.on=pw-on",
        ],
        false,
    );
    let secret = one(&d, "Secret", "rel-user-passwords");
    let data = s(secret, "stringData").and_then(Value::as_mapping).unwrap();
    for (user, pw) in [("0123", "pw-digits"), ("true", "pw-true"), ("on", "pw-on")] {
        assert_eq!(
            data.get(Value::String(user.into())).and_then(Value::as_str),
            Some(pw),
            "{user} as a string key: {data:?}"
        );
    }
    assert_eq!(data.len(), 3, "{data:?}");
}

/// Review L-9: the cluster chart's notes warn when `spec.networkPolicy.clients` is empty (the
/// servers' client ports open to every pod), and not when clients are named or the policies
/// are off.
#[test]
fn the_cluster_charts_notes_warn_when_every_pod_may_reach_the_servers() {
    let helm = helm_or_skip!();
    let warning = "WARNING: spec.networkPolicy.clients is empty";
    let n = crate::support::notes(helm, &cluster_chart(), &[]);
    assert!(n.contains(warning), "{n}");
    for sets in [
        &["spec.networkPolicy.clients[0].podSelector.matchLabels.role=app"][..],
        &["spec.networkPolicy.enabled=false"][..],
    ] {
        let n = crate::support::notes(helm, &cluster_chart(), sets);
        assert!(!n.contains(warning), "{sets:?}: {n}");
    }
}
