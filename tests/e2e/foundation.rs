//! The API and the operator runtime on a real kube-apiserver.

use std::time::Duration;

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

fn object(ns: &str, name: &str, spec: serde_json::Value) -> ClickHouseCluster {
    serde_json::from_value(json!({
        "apiVersion": "clickhouse.com/v1alpha1",
        "kind": "ClickHouseCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap()
}

/// The CRD's CEL rules are enforced by the API server itself: every violation is refused with
/// its message, and a valid resource is accepted.
#[tokio::test]
async fn crd_cel_rules_are_enforced_by_the_api_server() {
    let client = client().await;
    let ns = namespace(&client, "cel").await;
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let cases: &[(&str, serde_json::Value, &str)] = &[
        (
            "shards-1",
            json!({"shards": -1}),
            "spec.shards must be at least 0",
        ),
        (
            "shards0",
            json!({"shards": 0, "keeper": {"replicas": 0}}),
            "spec.shards is 0 (a Keeper-only cluster)",
        ),
        (
            "shards2000",
            json!({"shards": 2000}),
            "spec.shards must be at most 1024",
        ),
        (
            "replicas33",
            json!({"replicas": 33}),
            "spec.replicas must be at most 32",
        ),
        (
            "replicas0",
            json!({"replicas": 0}),
            "spec.replicas must be at least 1",
        ),
        (
            "keeper2",
            json!({"keeper": {"replicas": 2}}),
            "spec.keeper.replicas must be 0 or an odd number",
        ),
        (
            "keeper9",
            json!({"keeper": {"replicas": 9}}),
            "spec.keeper.replicas must be 0 or an odd number",
        ),
        (
            "badsize",
            json!({"storage": {"size": "ten gigs"}}),
            "spec.storage.size must be a quantity",
        ),
        (
            "pdb0",
            json!({"podDisruptionBudget": {"maxUnavailable": 0}}),
            "maxUnavailable must be at least 1",
        ),
        (
            "tls",
            json!({"tls": {"enabled": true}}),
            "serverCertSecret is required",
        ),
        (
            "users",
            json!({"users": {"secretName": "Bad_Name"}}),
            "secretName must be a valid Secret name",
        ),
        (
            "sched",
            json!({"backup": {"schedules": [
                {"name": "a", "schedule": "0 3 * * *", "destination": "x"},
                {"name": "a", "schedule": "0 4 * * *", "destination": "y"}]}}),
            "names must be unique",
        ),
        (
            "keep0",
            json!({"backup": {"schedules": [{"name": "a", "schedule": "0 3 * * *", "destination": "x", "keep": 0}]}}),
            "keep at least 1",
        ),
        (
            "domain",
            json!({"clusterDomain": "Corp_Example"}),
            "spec.clusterDomain must be a DNS name",
        ),
        ("Upper-Name", json!({}), "metadata.name must be a DNS label"),
        (
            &"n".repeat(41),
            json!({}),
            "metadata.name must be a DNS label",
        ),
    ];
    for (name, spec, message) in cases {
        let err = api
            .create(&PostParams::default(), &object(&ns, name, spec.clone()))
            .await
            .expect_err(&format!("{name} must be refused"));
        let text = err.to_string();
        assert!(
            text.contains(message),
            "{name}: expected {message:?} in {text}"
        );
    }
    // A valid resource is accepted, with the schema's defaults filled in by the API server.
    let ok = api
        .create(
            &PostParams::default(),
            &object(&ns, "ok", json!({"storage": {"size": "2Gi"}})),
        )
        .await
        .expect("a valid cluster is accepted");
    assert_eq!(ok.spec.shards, 1);
    assert_eq!(ok.spec.replicas, 2);
    assert_eq!(ok.spec.keeper.replicas, 3);
    // Transition rule: storage never shrinks, grows fine.
    let shrink = api
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"storage": {"size": "1Gi"}}})),
        )
        .await
        .expect_err("shrinking is refused");
    assert!(shrink.to_string().contains("cannot shrink"), "{shrink}");
    api.patch(
        "ok",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"storage": {"size": "3Gi"}}})),
    )
    .await
    .expect("growing is accepted");
    // Transition rule: the cluster domain is set at creation and stays
    api.create(
        &PostParams::default(),
        &object(&ns, "domain-ok", json!({"clusterDomain": "corp.example"})),
    )
    .await
    .expect("a cluster domain is accepted at creation");
    for (name, domain) in [
        ("ok", json!("corp.example")),
        ("domain-ok", json!("other.example")),
        ("domain-ok", json!(null)),
    ] {
        let err = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"clusterDomain": domain}})),
            )
            .await
            .expect_err("a changed cluster domain is refused");
        assert!(
            err.to_string().contains("clusterDomain cannot change"),
            "{name} → {domain}: {err}"
        );
    }
    // Transition rule: Keeper over TLS is set at creation and stays (docs/changes.md)
    for (name, tls) in [("ok", true), ("domain-ok", true)] {
        let err = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"keeper": {"tls": tls}}})),
            )
            .await
            .expect_err("switching Keeper TLS on is refused");
        assert!(
            err.to_string().contains("keeper.tls cannot change"),
            "{name}: {err}"
        );
    }
    api.patch(
        "ok",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"keeper": {"tls": false}}})),
    )
    .await
    .expect("writing the value it has is accepted");
    // schemaPolicy is free-form (S1-26): any value is accepted by the API server.
    api.create(
        &PostParams::default(),
        &object(
            &ns,
            "policy",
            json!({"schemaPolicy": {"replica": "bogus", "shard": "nOnE"}}),
        ),
    )
    .await
    .expect("schemaPolicy values are not restricted by the schema");
}

/// S0-01, S2-06: the operator takes the Lease and writes status on a resource; an unknown
/// schemaPolicy value is used as All with a Warning event (decision 10).
#[tokio::test]
async fn operator_takes_the_lease_and_reports_status() {
    let client = client().await;
    let ns = namespace(&client, "run").await;
    let op = start_operator(&client, &ns, true).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"schemaPolicy": {"replica": "bogus", "shard": "distributedtablesonly"}}),
    )
    .await;
    let c = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "a status",
        |s| s.observed_generation == Some(1),
    )
    .await;
    let s = c.status.unwrap();
    assert_ne!(s.state, ClusterState::Error, "{s:?}");
    let policy = s.schema_policy.unwrap();
    assert_eq!(
        (policy.replica.as_str(), policy.shard.as_str()),
        ("All", "DistributedTablesOnly")
    );
    assert!(
        s.conditions
            .iter()
            .any(|c| c.r#type == "ReconcileSucceeded" && c.status == "True")
    );
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get("clickhouse-operator-leader")
        .await
        .expect("the operator created its Lease");
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(format!("operator-{ns}").as_str())
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    wait_for(
        Duration::from_secs(30),
        "a SchemaPolicyReplaced event",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .find(|e| e.reason.as_deref() == Some("SchemaPolicyReplaced"))
                    .map(|_| ())
            }
        },
    )
    .await;
    finish(&client, &ns, op).await;
}

/// S0-07 / decision 18: a second ClickHouseCluster in a namespace gets error, a condition and
/// a Warning event; the first is untouched.
#[tokio::test]
async fn second_cluster_in_a_namespace_is_refused() {
    let Scenario { client, ns, op } = Scenario::start("one").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 1}}),
    )
    .await;
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "c1 reconciled",
        |s| s.observed_generation == Some(1),
    )
    .await;
    // Creation timestamps have one-second resolution: make sure c2 is strictly newer.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_cluster(&client, &ns, "c2", json!({})).await;
    let c2 = wait_status(
        &client,
        &ns,
        "c2",
        Duration::from_secs(60),
        "c2 refused",
        |s| s.state == ClusterState::Error,
    )
    .await;
    let s = c2.status.unwrap();
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("already managed by ClickHouseCluster c1"),
        "{s:?}"
    );
    let cond = s
        .conditions
        .iter()
        .find(|c| c.r#type == "ReconcileSucceeded")
        .unwrap();
    assert_eq!(cond.reason, "ErrorReconcile");
    let c1: ClickHouseCluster = Api::namespaced(client.clone(), &ns)
        .get("c1")
        .await
        .unwrap();
    assert_ne!(c1.status.unwrap().state, ClusterState::Error);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    wait_for(
        Duration::from_secs(30),
        "a NamespaceConflict event on c2",
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("NamespaceConflict")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("c2")
                            && e.type_.as_deref() == Some("Warning")
                    })
                    .map(|_| ())
            }
        },
    )
    .await;
    finish(&client, &ns, op).await;
}

/// S2-10 / S2-36: a spec the API server admits but the operator refuses gives `error` with the
/// field in the message and reason ErrorReconcile; fixing it clears the error.
#[tokio::test]
async fn invalid_spec_reports_error_and_recovers() {
    let Scenario { client, ns, op } = Scenario::start("inv").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "crVersion": "99.0.0"}),
    )
    .await;
    let c = wait_status(&client, &ns, "c1", Duration::from_secs(60), "error", |s| {
        s.state == ClusterState::Error
    })
    .await;
    let s = c.status.unwrap();
    assert!(
        s.message.as_deref().unwrap().contains("spec.crVersion"),
        "{s:?}"
    );
    assert!(
        s.conditions
            .iter()
            .any(|c| c.reason == "ErrorReconcile" && c.status == "False")
    );
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    api.patch(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"crVersion": null}})),
    )
    .await
    .unwrap();
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "error cleared",
        |s| s.state != ClusterState::Error && s.observed_generation == Some(2),
    )
    .await;
    finish(&client, &ns, op).await;
}

/// Architecture rule and invariant 6: a pass in which nothing changed sends no write. Over
/// several re-checks (every 5 s) of a ready cluster, with real pods, the operator's write
/// counter does not move; a second operator started on it (a restart) writes nothing either.
/// The cluster's metric series (state, pods) follow its status and are removed with the cluster
/// (docs/monitoring.md, "The operator's metrics"). The idle passes read the watch-fed caches,
/// none the API server (decision 41), and once one found nothing to do the next stop at a
/// glance at the server (decision 60).
#[tokio::test]
async fn idle_passes_write_nothing() {
    let Scenario { client, ns, op } = Scenario::start("idle").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_status(&client, &ns, "c1", Duration::from_secs(300), "ready", |s| {
        s.state == ClusterState::Ready
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("clickhouse_operator_api_writes_total"))
            .map(str::to_string)
    };
    let passes = |m: &str| {
        m.lines()
            .find(|l| {
                l.starts_with("clickhouse_operator_reconciles_total{kind=\"ClickHouseCluster\"}")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = op.metrics.encode();
    tokio::time::sleep(Duration::from_secs(17)).await;
    let after = op.metrics.encode();
    assert!(
        passes(&after) >= passes(&before) + 3,
        "the 5 s re-check ran: {before}\n{after}"
    );
    assert_eq!(writes(&before), writes(&after), "no write on idle passes");
    // decision 41: idle passes plan from the watch-fed caches, not from lists of the API server
    let observed = |m: &str, source: &str| {
        let series =
            format!("clickhouse_operator_cluster_observations_total{{source=\"{source}\"}}");
        m.lines()
            .find(|l| l.starts_with(&series))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(
        observed(&before, "api"),
        observed(&after, "api"),
        "an idle pass read the API server: {after}"
    );
    // decision 60: a check that finds the caches unchanged and the server saying what it said
    // goes no further than that glance
    assert!(
        observed(&after, "glance") > observed(&before, "glance"),
        "idle checks stop at a glance: {after}"
    );
    assert!(
        observed(&after, "cache") + observed(&after, "glance")
            >= observed(&before, "cache") + observed(&before, "glance") + 3,
        "idle passes read the caches or stop at a glance: {after}"
    );
    // A restarted operator on a healthy cluster changes nothing (invariant 6).
    drop(op);
    let op = start_operator(&client, &ns, false).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let m = op.metrics.encode();
    assert!(passes(&m) >= 1, "the new operator ran passes: {m}");
    assert_eq!(
        writes(&m),
        None,
        "the restarted operator wrote nothing: {m}"
    );
    // the cluster's series follow its status (docs/monitoring.md)
    for line in [
        format!(
            r#"clickhouse_operator_cluster_state{{namespace="{ns}",clickhouse_cluster="c1",state="ready"}} 1"#
        ),
        format!(
            r#"clickhouse_operator_cluster_state{{namespace="{ns}",clickhouse_cluster="c1",state="error"}} 0"#
        ),
        format!(
            r#"clickhouse_operator_cluster_pods{{namespace="{ns}",clickhouse_cluster="c1",component="clickhouse",count="ready"}} 1"#
        ),
        format!(
            r#"clickhouse_operator_cluster_pods{{namespace="{ns}",clickhouse_cluster="c1",component="keeper",count="desired"}} 1"#
        ),
    ] {
        assert!(m.contains(&line), "{line}\n{m}");
    }
    let metrics = op.metrics.clone();
    finish(&client, &ns, op).await;
    // the operator is gone with `finish`; the series were removed when the cluster was
    assert!(
        !metrics
            .encode()
            .contains(&format!(r#"namespace="{ns}",clickhouse_cluster="c1""#)),
        "{}",
        metrics.encode()
    );
}
