//! Invariant 11: one slow or broken cluster never delays another, with the default
//! `MAX_CONCURRENT_RECONCILES=1` (one pass at a time for all clusters).

use std::time::{Duration, Instant};

use clickhouse_operator::api::ClusterState;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::json;

use crate::support::*;

/// Cluster A loses its only Keeper member (its pod cannot be scheduled any more) and is then
/// scaled in, so its passes meet a Keeper that does not answer; a change to cluster B in
/// another namespace is still applied within 10 s, every time.
#[tokio::test]
async fn a_cluster_waiting_on_an_unreachable_keeper_does_not_delay_another() {
    let client = client().await;
    let a = namespace(&client, "slow").await;
    let b = namespace(&client, "fast").await;
    let op = start_operator(&client, &format!("{a},{b}"), false).await;
    create_cluster(
        &client,
        &a,
        "c1",
        json!({"replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    create_cluster(
        &client,
        &b,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 0}, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &a, "c1", 1).await;
    wait_ready(&client, &b, "c1", 1).await;
    let ch = sql_client(&client, &a, "c1", "c1-0-0-0").await;
    exec(&ch, "CREATE TABLE default.t ON CLUSTER c1 (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/t', '{replica}') ORDER BY x").await;
    // Keeper of A goes away, then A is scaled in: its scale-in needs Keeper.
    patch_spec(
        &client,
        &a,
        "c1",
        json!({"keeper": {"pod": {"nodeSelector": {"example.com/no-such-node": "x"}}}}),
    )
    .await;
    wait_status(&client, &a, "c1", READY, "A's Keeper gone", |s| {
        s.keeper.ready == 0 && s.observed_generation == Some(2)
    })
    .await;
    patch_spec(&client, &a, "c1", json!({"replicas": 1})).await;
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &b);
    let mut worst = Duration::ZERO;
    for i in 0..4 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let value = format!("{}", 100 + i);
        let changed = Instant::now();
        patch_spec(
            &client,
            &b,
            "c1",
            json!({"configuration": {"profiles": {"default": {"max_threads": value}}}}),
        )
        .await;
        wait_for(
            Duration::from_secs(60),
            "B's users Secret or ConfigMap to change",
            || {
                let (configs, value) = (configs.clone(), value.clone());
                let client = client.clone();
                let b = b.clone();
                async move {
                    let secret: k8s_openapi::api::core::v1::Secret =
                        Api::namespaced(client, &b).get("c1-users").await.ok()?;
                    let in_secret = secret
                        .data
                        .unwrap_or_default()
                        .values()
                        .any(|v| String::from_utf8_lossy(&v.0).contains(&format!(">{value}<")));
                    let in_config = configs
                        .list(&Default::default())
                        .await
                        .ok()?
                        .items
                        .iter()
                        .flat_map(|c| c.data.clone().unwrap_or_default().into_values())
                        .any(|v| v.contains(&format!(">{value}<")));
                    (in_secret || in_config).then_some(())
                }
            },
        )
        .await;
        worst = worst.max(changed.elapsed());
    }
    let state_a = wait_status(&client, &a, "c1", READY, "A's status", |_| true)
        .await
        .status
        .unwrap();
    println!(
        "B's change applied within {worst:?} at worst while A is {} ({:?})",
        state_a.state, state_a.message
    );
    assert_ne!(
        state_a.state,
        ClusterState::Ready,
        "A cannot finish its scale-in without Keeper"
    );
    assert!(worst <= Duration::from_secs(10), "B waited {worst:?}");
    // Keeper back: A finishes its scale-in.
    patch_spec(
        &client,
        &a,
        "c1",
        json!({"keeper": {"pod": {"nodeSelector": null}}}),
    )
    .await;
    wait_ready(&client, &a, "c1", 4).await;
    finish_all(&client, &[&a, &b], op).await;
}
