//! Several volumes per server replica (docs/configuration.md, "Storage") on the local Kubernetes
//! with real ClickHouse 18.16 servers: further disks and a log volume become PVCs of their own with
//! the labels and annotations of `spec.storage`, mounted where the generated
//! `storage_configuration` declares them; a disk added to a running cluster under writes restarts
//! each server once, one at a time, and loses no acknowledged row; a disk cannot be removed, and
//! the Keeper's volume grows in place. 18.16 predates storage policies (19.15) and ignores
//! `storage_configuration`, so parts moving between disks is proven on ClickHouse 26.x by
//! `tests/modern_config/ports_and_disks.rs` (`disks_and_a_storage_policy_move_expired_parts_to_the_cold_disk`), not
//! here.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::support::*;
use crate::workload::Workload;
use clickhouse_operator::api::ClickHouseCluster;

const SERVERS: &str = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";

fn storage(disks: &[&str]) -> serde_json::Value {
    let disks: Vec<_> = disks
        .iter()
        .map(|d| json!({"name": d, "size": "1Gi"}))
        .collect();
    json!({"size": "1Gi", "labels": {"team": "db"},
        "annotations": {"example.com/backup": "skip"},
        "disks": disks, "logs": {"size": "1Gi"},
        "policies": {"tiered": {"volumes": [{"name": "hot", "disks": ["default"]},
            {"name": "cold", "disks": ["cold"]}]}}})
}

/// docs/configuration.md, "Storage": a cluster with a further disk and a log volume: every replica
/// has the PVCs `disk-cold-<pod>` and `logs-<pod>` with the user's labels and annotations; the
/// server writes its log into the log volume (found in that PVC's folder on the node) and the disk
/// is mounted at the path `storage_configuration` names. A disk added under writes restarts every
/// server exactly once, at most one down at a time, every acknowledged row is on every replica
/// after, and the new PVCs exist; removing a disk is refused by the API server. The Keeper's volume
/// grows in place with volume scaling, no Keeper pod restarted.
#[tokio::test]
async fn disks_and_a_log_volume_get_their_own_pvcs_and_a_disk_added_under_writes_loses_nothing() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "disks",
        json!({"replicas": 2, "keeper": {"replicas": 1}, "storage": storage(&["cold"]),
            "storageScaling": {"enableVolumeScaling": true}}),
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let servers: Vec<String> = replica_names(&c)
        .into_iter()
        .map(|r| format!("{r}-0"))
        .collect();
    assert_eq!(servers.len(), 2);
    for pod in &servers {
        for claim in ["data", "disk-cold", "logs"] {
            let p = pvcs.get(&format!("{claim}-{pod}")).await.unwrap();
            let labels = p.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get("team").map(String::as_str),
                Some("db"),
                "{claim}-{pod}"
            );
            assert_eq!(
                labels.get("clickhouse.com/cluster").map(String::as_str),
                Some("c1")
            );
            let annotations = p.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(
                annotations.get("example.com/backup").map(String::as_str),
                Some("skip"),
                "{claim}-{pod}"
            );
        }
        let log = volume_path(&client, &ns, &format!("logs-{pod}"))
            .await
            .join("clickhouse-server.log");
        let text = std::fs::read_to_string(&log).unwrap_or_else(|e| {
            panic!("the server's log in its log volume {}: {e}", log.display())
        });
        assert!(text.contains("Ready for connections"), "{}", log.display());
        let spec = pods.get(pod).await.unwrap().spec.unwrap();
        let mounts = spec.containers[0].volume_mounts.clone().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m.name == "disk-cold" && m.mount_path == "/var/lib/clickhouse-disks/cold"),
            "{mounts:?}"
        );
    }

    // a second disk, added while a writer runs
    let writer = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = pod_ids(&client, &ns, SERVERS).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"storage": storage(&["cold", "warm"])}),
    )
    .await;
    let (order, most_down) = watch_rollout(&client, &ns, "c1", &before, 2, 2).await;
    assert!(
        most_down <= 1,
        "one server at a time: {most_down} down at once ({order:?})"
    );
    let acked = writer.stop_and_check(&client, &ns).await;
    assert!(acked > 0);
    for pod in &servers {
        pvcs.get(&format!("disk-warm-{pod}")).await.unwrap();
        let spec = pods.get(pod).await.unwrap().spec.unwrap();
        let mounts = spec.containers[0].volume_mounts.clone().unwrap();
        assert!(mounts.iter().any(|m| m.name == "disk-warm"), "{mounts:?}");
    }

    // a disk cannot be removed: the API server refuses the change
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let err = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"storage": storage(&["warm"])}})),
        )
        .await
        .expect_err("removing a disk is refused");
    assert!(
        err.to_string().contains("a disk cannot be removed"),
        "{err}"
    );

    // the Keeper's volume grows in place
    let keeper_before = pod_ids(
        &client,
        &ns,
        "clickhouse.com/cluster=c1,app.kubernetes.io/component=keeper",
    )
    .await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"keeper": {"replicas": 1, "storage": {"size": "2Gi"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 3).await;
    wait_for(Duration::from_secs(60), "the Keeper PVC at 2Gi", || {
        let pvcs = pvcs.clone();
        async move {
            let p = pvcs.get("data-c1-keeper-0").await.ok()?;
            let size = p.spec?.resources?.requests?.get("storage")?.0.clone();
            (size == "2Gi").then_some(())
        }
    })
    .await;
    assert_eq!(
        pod_ids(
            &client,
            &ns,
            "clickhouse.com/cluster=c1,app.kubernetes.io/component=keeper"
        )
        .await,
        keeper_before,
        "no Keeper pod restarted"
    );
    finish(&client, &ns, op).await;
}

/// Decision 44 and S2-13, under write load: a storage driver that grows the file system only
/// when the volume is mounted again (the node agent does so for a claim annotated
/// `local-kubelet.clickhouse.com/expansion: offline`, as drivers without online expansion do,
/// reporting `FileSystemResizePending` meanwhile). Growing the data volumes leaves both PVCs
/// pending; the operator restarts each server pod once, one at a time and the backup replica
/// last, the restart completes each resize, the PVCs report the new size with no resize
/// condition left, the cluster is `ready`, and every acknowledged row is on every replica.
#[tokio::test]
async fn a_volume_whose_file_system_grows_at_mount_gets_one_careful_restart() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "fsgrow",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi",
                           "annotations": {"local-kubelet.clickhouse.com/expansion": "offline"}},
               "storageScaling": {"enableVolumeScaling": true}}),
    )
    .await;
    let backup = backup_replica(&c);
    let workload = Workload::start(&client, &ns, "c1").await;
    let before = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    patch_spec(&client, &ns, "c1", json!({"storage": {"size": "2Gi"}})).await;
    let (order, most_down) = watch_rollout(&client, &ns, "c1", &before, 2, 2).await;
    println!("restart order: {order:?}, most down at once: {most_down}");
    assert_eq!(most_down, 1, "one replica down at a time");
    assert_eq!(
        order.last(),
        Some(&format!("{backup}-0")),
        "the backup replica last"
    );
    let after = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    for r in replica_names(&c) {
        let p = pvcs.get(&format!("data-{r}-0")).await.unwrap();
        let status = p.status.unwrap();
        assert_eq!(
            status.capacity.unwrap()["storage"].0,
            "2Gi",
            "data-{r}-0 grown at its pod's mount"
        );
        let left: Vec<_> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_.contains("Resiz") && c.status == "True")
            .collect();
        assert!(
            left.is_empty(),
            "no resize condition left on data-{r}-0: {left:?}"
        );
    }
    // passes later: no further restart
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        pod_ids(&client, &ns, "app.kubernetes.io/component=server").await,
        after,
        "one restart each"
    );
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    assert!(batches > 0);
    finish(&client, &ns, op).await;
}
