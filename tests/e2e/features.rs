//! Features users of other operators look for, on 18.16 servers: shard weights, `suspend`
//! and the one-shot rolling restart (docs/testing.md).

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::support::*;
use clickhouse_operator::api::{ClickHouseCluster, ClusterState};

const SERVERS: &str = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";

/// The server pods of `c`, by shard.
fn pods_by_shard(c: &ClickHouseCluster) -> Vec<String> {
    let map = &c.status.as_ref().unwrap().replica_state_map;
    let mut v: Vec<(i32, String)> = map
        .iter()
        .map(|(n, r)| (r.shard.get(), format!("{n}-0")))
        .collect();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

/// `spec.shardWeights` on 18.16: a Distributed insert sends each shard its weight's share of
/// the rows (weights 1 and 3, rows by `n % 4`: 1000 and 3000 of 4000), and a new weight is
/// reloaded without a restart (1 and 1: the next 4000 split 2000 and 2000).
#[tokio::test]
async fn a_distributed_insert_follows_the_shard_weights_and_a_new_weight_restarts_nothing() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "weights",
        json!({"shards": 2, "replicas": 1, "storage": {"size": "1Gi"},
            "keeper": {"replicas": 1}, "shardWeights": {"1": 3}}),
    )
    .await;
    let pods = pods_by_shard(&c);
    assert_eq!(pods.len(), 2);
    let mut chs = Vec::new();
    for p in &pods {
        let ch = sql_client(&client, &ns, "c1", p).await;
        exec(
            &ch,
            "CREATE TABLE default.t (n UInt64) ENGINE = MergeTree ORDER BY n",
        )
        .await;
        exec(
            &ch,
            "CREATE TABLE default.td AS default.t ENGINE = Distributed(c1, default, t, n)",
        )
        .await;
        chs.push(ch);
    }
    let counts = |want: [u64; 2]| {
        let chs = &chs;
        async move {
            wait_for(
                Duration::from_secs(60),
                "the rows on each shard",
                || async move {
                    let mut got = [0u64; 2];
                    for (i, ch) in chs.iter().enumerate() {
                        got[i] = query(ch, "SELECT count() AS v FROM default.t").await[0]
                            .parse()
                            .unwrap();
                    }
                    (got == want).then_some(())
                },
            )
            .await
        }
    };
    exec(
        &chs[0],
        "INSERT INTO default.td SELECT number FROM numbers(4000)",
    )
    .await;
    counts([1000, 3000]).await;

    let before = pod_ids(&client, &ns, SERVERS).await;
    patch_spec(&client, &ns, "c1", json!({"shardWeights": {"1": 1}})).await;
    wait_ready(&client, &ns, "c1", 2).await;
    // both servers have reloaded the new weight (18.16 resolves every host of the cluster here)
    for ch in &chs {
        let ch = ch.clone();
        wait_for(Duration::from_secs(60), "the new weight reloaded", || {
            let ch = ch.clone();
            async move {
                let w = query(
                    &ch,
                    "SELECT toString(max(shard_weight)) AS v FROM system.clusters \
                     WHERE cluster = 'c1'",
                )
                .await;
                (w == ["1"]).then_some(())
            }
        })
        .await;
    }
    exec(
        &chs[1],
        "INSERT INTO default.td SELECT number FROM numbers(4000, 4000)",
    )
    .await;
    counts([3000, 5000]).await;
    assert_eq!(
        pod_ids(&client, &ns, SERVERS).await,
        before,
        "a weight restarted a server"
    );
    finish(&client, &ns, op).await;
}

/// S2-42 and S2-43 on 18.16: while suspended, a change that would restart the servers waits
/// (no pod restarted, the state `suspended` with its condition); resumed, it is rolled out. A
/// timestamp in `clickhouse.com/restart-at` restarts each server once; the same timestamp
/// left there, then the annotation removed, restarts nothing more.
#[tokio::test]
async fn a_suspended_cluster_is_left_alone_and_a_restart_timestamp_restarts_each_server_once() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "suspend",
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1}}),
    )
    .await;
    let first = pod_ids(&client, &ns, SERVERS).await;
    assert_eq!(first.len(), 2);

    patch_spec(&client, &ns, "c1", json!({"suspend": true})).await;
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "suspended",
        |s| {
            s.state == ClusterState::Suspended
                && s.conditions
                    .iter()
                    .any(|c| c.r#type == "Suspended" && c.status == "True")
        },
    )
    .await;
    // a change that restarts the servers waits while suspended
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"annotations": {"team": "db"}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        pod_ids(&client, &ns, SERVERS).await,
        first,
        "a pod restarted while suspended"
    );
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        api.get("c1").await.unwrap().status.unwrap().state,
        ClusterState::Suspended
    );

    patch_spec(&client, &ns, "c1", json!({"suspend": false})).await;
    let (restarted, _) = watch_rollout(&client, &ns, "c1", &first, 2, 4).await;
    assert_eq!(restarted.len(), 2, "{restarted:?}");
    let resumed = wait_ready(&client, &ns, "c1", 4).await;
    assert!(
        resumed
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.r#type == "Suspended" && c.status == "False")
    );

    // one rolling restart per timestamp
    let annotate = |value: serde_json::Value| {
        let api = api.clone();
        async move {
            api.patch(
                "c1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations":
                    {"clickhouse.com/restart-at": value}}})),
            )
            .await
            .expect("annotate the cluster");
        }
    };
    let before = pod_ids(&client, &ns, SERVERS).await;
    annotate(json!("2026-12-04T18:00:00Z")).await;
    // the annotation bumps no generation: wait for both pods replaced and the cluster ready
    let after = wait_for(Duration::from_secs(300), "each server restarted", || {
        let (client, ns, api, before) = (client.clone(), ns.clone(), api.clone(), &before);
        async move {
            let now = pod_ids(&client, &ns, SERVERS).await;
            let s = api.get("c1").await.ok()?.status?;
            let replaced = now.len() == 2
                && now
                    .iter()
                    .all(|(name, (uid, _))| before.get(name).map(|(u, _)| u) != Some(uid));
            (replaced
                && s.state == ClusterState::Ready
                && s.restarted_at.as_deref() == Some("2026-12-04T18:00:00Z"))
            .then_some(now)
        }
    })
    .await;
    // and only once: nothing more while the annotation stays
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(pod_ids(&client, &ns, SERVERS).await, after);
    annotate(serde_json::Value::Null).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        pod_ids(&client, &ns, SERVERS).await,
        after,
        "removing the annotation restarted a server"
    );
    finish(&client, &ns, op).await;
}

/// Operator-level defaults (decision 52) on 18.16: an operator started with a defaults file
/// (`CLUSTER_DEFAULTS_FILE`, what the chart's `clusterDefaults` mount) gives a cluster that sets
/// none of them its servers' toleration and pull secret, and a profile
/// setting that the servers apply; the cluster's own setting wins; the cluster object is not
/// written with them.
#[tokio::test]
async fn operator_defaults_reach_a_clusters_pods_and_settings_under_its_own() {
    use k8s_openapi::api::core::v1::Pod;
    let client = client().await;
    let ns = namespace(&client, "defaults").await;
    let dir = std::env::temp_dir().join(format!("chop-e2e-defaults-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster-defaults.yaml");
    std::fs::write(
        &file,
        "pod:\n  template: {spec: {imagePullSecrets: [{name: registry}]}}\n  \
         tolerations: [{key: dedicated, value: clickhouse, effect: NoSchedule}]\n\
         configuration:\n  profiles:\n    default: {max_memory_usage: 1234567890, \
         max_execution_time: 77}\n",
    )
    .unwrap();
    let path = file.display().to_string();
    let op = start_operator_env(&client, &ns, &[("CLUSTER_DEFAULTS_FILE", &path)]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1},
            "configuration": {"profiles": {"default": {"max_execution_time": "60"}}}}),
    )
    .await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    assert!(c.spec.pod.tolerations.is_empty(), "the cluster was written");
    let pod = format!(
        "{}-0",
        c.status
            .as_ref()
            .unwrap()
            .replica_state_map
            .keys()
            .next()
            .unwrap()
    );
    let spec = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&pod)
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "registry");
    assert!(
        spec.tolerations
            .unwrap_or_default()
            .iter()
            .any(|t| t.key.as_deref() == Some("dedicated")),
        "no toleration from the defaults"
    );
    let ch = sql_client(&client, &ns, "c1", &pod).await;
    assert_eq!(
        query(
            &ch,
            "SELECT value AS v FROM system.settings WHERE name IN \
             ('max_memory_usage', 'max_execution_time') ORDER BY name"
        )
        .await,
        ["60", "1234567890"]
    );
    finish(&client, &ns, op).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The storage class of each PVC of `ns`, by name.
async fn claim_classes(
    client: &kube::Client,
    ns: &str,
) -> std::collections::BTreeMap<String, Option<String>> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::ResourceExt;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let class = p.spec.as_ref().and_then(|s| s.storage_class_name.clone());
            (p.name_any(), class)
        })
        .collect()
}

/// Decision 59 on 18.16: the operator's default storage classes reach a new cluster's volumes
/// (servers' and Keeper's, bound by a provisioner of that class) and its status keeps them;
/// with the defaults changed, that cluster changes nothing (it stays `ready`, no refusal) and
/// a shard added to it takes its recorded class, while a cluster created afterwards takes the
/// new one. The cluster objects are not written with them.
#[tokio::test]
async fn default_storage_classes_reach_new_clusters_and_stay_with_them() {
    use k8s_openapi::api::storage::v1::StorageClass;
    let client = client().await;
    let ns = namespace(&client, "classes").await;
    let ns2 = namespace(&client, "classes2").await;
    let (fast, slow) = (format!("{ns}-fast"), format!("{ns}-slow"));
    let scs: Api<StorageClass> = Api::all(client.clone());
    for class in [&fast, &slow] {
        let sc: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": class},
            "provisioner": "local-kubelet.local/hostpath",
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}))
        .unwrap();
        scs.create(&Default::default(), &sc).await.unwrap();
    }
    let dir = std::env::temp_dir().join(format!("chop-e2e-classes-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let defaults = |class: &str| {
        let file = dir.join(format!("{class}.yaml"));
        std::fs::write(
            &file,
            format!(
                "storage: {{storageClassName: {class}}}
keeper: {{storage: {{storageClassName: {class}}}}}
"
            ),
        )
        .unwrap();
        file.display().to_string()
    };
    let spec = json!({"replicas": 1, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1}});
    let op = start_operator_env(&client, &ns, &[("CLUSTER_DEFAULTS_FILE", &defaults(&fast))]).await;
    create_cluster(&client, &ns, "c1", spec.clone()).await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    assert_eq!(
        c.spec.storage.data.storage_class_name, None,
        "the cluster was written"
    );
    let recorded = c.status.unwrap().default_storage_classes.unwrap();
    assert_eq!(recorded.server.as_deref(), Some(fast.as_str()));
    assert_eq!(recorded.keeper.as_deref(), Some(fast.as_str()));
    let made = claim_classes(&client, &ns).await;
    assert!(
        made.len() >= 2 && made.values().all(|c| c.as_deref() == Some(fast.as_str())),
        "{made:?}"
    );
    drop(op);

    // the defaults change: the running cluster keeps its class, a new one takes the new class
    let slow_file = defaults(&slow);
    let op = start_operator_env(&client, &ns, &[("CLUSTER_DEFAULTS_FILE", &slow_file)]).await;
    let op2 = start_operator_env(&client, &ns2, &[("CLUSTER_DEFAULTS_FILE", &slow_file)]).await;
    patch_spec(&client, &ns, "c1", json!({"shards": 2})).await;
    let c = wait_ready(&client, &ns, "c1", 2).await;
    let status = c.status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .all(|c| !c.message.contains("storageClassName")),
        "{status:?}"
    );
    let made = claim_classes(&client, &ns).await;
    assert!(
        made.len() >= 3 && made.values().all(|c| c.as_deref() == Some(fast.as_str())),
        "{made:?}"
    );
    create_cluster(&client, &ns2, "c1", spec).await;
    wait_ready(&client, &ns2, "c1", 1).await;
    let made = claim_classes(&client, &ns2).await;
    assert!(
        made.len() >= 2 && made.values().all(|c| c.as_deref() == Some(slow.as_str())),
        "{made:?}"
    );
    finish(&client, &ns2, op2).await;
    finish(&client, &ns, op).await;
    for class in [&fast, &slow] {
        let _ = scs.delete(class, &Default::default()).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The server pods of the cluster with, for each, (Ready, its server container running, its
/// restart count, whether it has a liveness probe).
async fn server_containers(
    client: &kube::Client,
    ns: &str,
) -> std::collections::BTreeMap<String, (bool, bool, i32, bool)> {
    use clickhouse_operator::plan::facts::pod_ready;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(SERVERS))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let c = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first().cloned());
            let running = c
                .as_ref()
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some());
            let restarts = c.map(|c| c.restart_count).unwrap_or_default();
            let liveness = p
                .spec
                .as_ref()
                .is_some_and(|s| s.containers[0].liveness_probe.is_some());
            (p.name_any(), (pod_ready(&p), running, restarts, liveness))
        })
        .collect()
}

/// Decision 56 on 18.16, under row writes: a setting the server refuses at start leaves one
/// replica crash-looping (the rollout stops there); `troubleshoot: true` gives that replica at
/// once a container that stays up without the server (running, not Ready, its restart count
/// still, no liveness probe), the server's exit written to its log, and the condition
/// `Troubleshoot`; the other replica serves throughout. The setting reverted and
/// `troubleshoot` off, the cluster is `ready` and every acknowledged row is on both replicas.
#[tokio::test]
async fn a_server_that_cannot_start_is_kept_up_for_troubleshooting() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "troubleshoot",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let workload = crate::workload::Workload::start(&client, &ns, "c1").await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"configuration": {"settings": {"uncompressed_cache_size": "not-a-number"}}}),
    )
    .await;
    let broken = wait_for(
        Duration::from_secs(240),
        "a server crash-looping on the bad setting",
        || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                server_containers(&client, &ns)
                    .await
                    .into_iter()
                    .find(|(_, (ready, _, restarts, _))| !ready && *restarts >= 1)
                    .map(|(p, _)| p)
            }
        },
    )
    .await;
    println!("{broken} cannot start");
    patch_spec(&client, &ns, "c1", json!({"troubleshoot": true})).await;
    // the broken replica gets the new template at once and stays up
    let kept = wait_for(
        Duration::from_secs(120),
        "the broken server's container up without its server",
        || {
            let client = client.clone();
            let ns = ns.clone();
            let broken = broken.clone();
            async move {
                let now = server_containers(&client, &ns).await;
                let (ready, running, restarts, liveness) = *now.get(&broken)?;
                (!ready && running && !liveness).then_some(restarts)
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let now = server_containers(&client, &ns).await;
    let (ready, running, restarts, _) = now[&broken];
    assert!(
        !ready && running && restarts == kept,
        "{broken} should stay up, not Ready, without restarts: {now:?}"
    );
    let logs: Vec<String> = std::fs::read_dir(pod_log_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{ns}_{broken}_"))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("clickhouse.log")).ok())
        .collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("clickhouse-server exited with status")
                && l.contains("spec.troubleshoot")),
        "the server's exit in {broken}'s log"
    );
    let c: ClickHouseCluster = Api::namespaced(client.clone(), &ns)
        .get("c1")
        .await
        .unwrap();
    let status = c.status.unwrap_or_default();
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.r#type == "Troubleshoot" && c.status == "True"),
        "{:?}",
        status.conditions
    );
    assert!(
        now.values().any(|(ready, ..)| *ready),
        "the other replica serves: {now:?}"
    );

    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"troubleshoot": false,
               "configuration": {"settings": {"uncompressed_cache_size": null}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 4).await;
    let rows = workload.stop_and_check(&client, &ns).await;
    println!("{rows} acknowledged batches on both replicas");
    finish(&client, &ns, op).await;
}
