//! Where the real scheduler puts the pods over three nodes in three zones.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;

use super::{SERVERS, placement};
use crate::support::*;

/// Placement by the real scheduler over three nodes in three zones: a shard of three replicas
/// with `antiAffinity: Required` and `topologySpreadKey: topology.kubernetes.io/zone` has one
/// replica per zone, and so have the three Keeper members (`antiAffinity: Required`); a fourth
/// replica, which no node may take, stays Pending with the scheduler's reason in the status
/// while the others run undisturbed (no pod replaced), and asking for three again removes it.
#[tokio::test]
async fn required_anti_affinity_and_zone_spread_as_the_scheduler_places_them() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let ns = namespace(&client, "nodeplace").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 3, "storage": {"size": "1Gi"},
               "pod": {"antiAffinity": "Required", "topologySpreadKey": "topology.kubernetes.io/zone"},
               "keeper": {"replicas": 3, "pod": {"antiAffinity": "Required"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // one node per zone: node-1 zone-a, node-2 zone-b, node-3 zone-c
    for selector in [
        SERVERS,
        "clickhouse.com/cluster=c1,app.kubernetes.io/component=keeper",
    ] {
        let placed = placement(&pods, selector).await;
        let nodes: BTreeSet<&String> = placed.values().map(|(n, _)| n).collect();
        assert_eq!(nodes.len(), 3, "{selector}: {placed:?}");
    }
    let before = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    patch_spec(&client, &ns, "c1", json!({"replicas": 4})).await;
    let reason = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(120),
        "the scheduler's reason in the status",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("cannot be scheduled"))
        },
    )
    .await
    .status
    .unwrap()
    .message
    .unwrap_or_default();
    println!("status: {reason}");
    assert!(
        reason.contains("anti-affinity"),
        "the scheduler's reason: {reason}"
    );
    let placed = placement(&pods, SERVERS).await;
    assert_eq!(placed.values().filter(|(_, r)| *r).count(), 3, "{placed:?}");
    let now = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    for (pod, id) in &before {
        assert_eq!(now.get(pod), Some(id), "{pod} was disturbed");
    }
    patch_spec(&client, &ns, "c1", json!({"replicas": 3})).await;
    wait_ready(&client, &ns, "c1", 3).await;
    assert_eq!(placement(&pods, SERVERS).await.len(), 3);
    finish(&client, &ns, op).await;
}
