//! Invariants 3 and 9: objects edited or deleted by hand come back, and a new operator version
//! restarts no ClickHouse or Keeper pod.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;

/// (uid, restartCount) of every pod of the namespace.
async fn pods(client: &Client, ns: &str) -> BTreeMap<String, (String, i32)> {
    pod_ids(client, ns, "").await
}

/// Invariant 3: the client Service and the common ConfigMap deleted by hand, and a field of the
/// headless Service edited by hand, are restored on the next pass, and no pod restarts.
#[tokio::test]
async fn objects_deleted_or_edited_by_hand_come_back() {
    let client = client().await;
    let ns = namespace(&client, "restore").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let before = pods(&client, &ns).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    services
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    configs
        .delete("c1-common", &DeleteParams::default())
        .await
        .unwrap();
    services
        .patch(
            "c1-headless",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"publishNotReadyAddresses": false}})),
        )
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), "the objects back", || {
        let (services, configs) = (services.clone(), configs.clone());
        async move {
            let client_svc = services.get_opt("c1").await.ok()??;
            configs.get_opt("c1-common").await.ok()??;
            let headless = services.get("c1-headless").await.ok()?;
            let restored = headless.spec?.publish_not_ready_addresses == Some(true);
            (restored && client_svc.uid().is_some()).then_some(())
        }
    })
    .await;
    wait_status(&client, &ns, "c1", READY, "ready again", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    assert_eq!(pods(&client, &ns).await, before, "no pod restarted");
    finish(&client, &ns, op).await;
}

/// Invariant 9: objects written by an earlier operator version (here: without the hash
/// annotations this version adds) are taken over by the new one without restarting a pod.
#[tokio::test]
async fn a_new_operator_version_restarts_no_pod() {
    let client = client().await;
    let ns = namespace(&client, "upgrade").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    drop(op);
    let before = pods(&client, &ns).await;
    // What the previous version left: the same objects without the hash annotations.
    let strip = json!({"metadata": {"annotations": {
        "clickhouse.com/object-hash": null, "clickhouse.com/template-hash": null}}});
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for s in sts.list(&ListParams::default()).await.unwrap().items {
        sts.patch(
            &s.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&strip),
        )
        .await
        .unwrap();
    }
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for c in configs.list(&ListParams::default()).await.unwrap().items {
        configs
            .patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&strip),
            )
            .await
            .unwrap();
    }
    let op = start_operator(&client, &ns, false).await;
    wait_for(
        Duration::from_secs(60),
        "the new version's annotations",
        || {
            let sts = sts.clone();
            async move {
                let all = sts.list(&ListParams::default()).await.ok()?.items;
                all.iter()
                    .all(|s| s.annotations().contains_key("clickhouse.com/object-hash"))
                    .then_some(())
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    wait_status(&client, &ns, "c1", READY, "ready", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    assert_eq!(pods(&client, &ns).await, before, "no pod restarted");
    finish(&client, &ns, op).await;
}
