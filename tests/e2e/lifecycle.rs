//! The reconcile engine on the real local Kubernetes with real ClickHouse and ZooKeeper pods.

use std::collections::BTreeMap;
use std::time::Duration;

use clickhouse_operator::api::{ClusterState, ReplicaState};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;

/// (uid, restartCount) of every server pod, by pod name.
async fn server_pods(client: &Client, ns: &str, cluster: &str) -> BTreeMap<String, (String, i32)> {
    let selector = format!("clickhouse.com/cluster={cluster},app.kubernetes.io/component=server");
    pod_ids(client, ns, &selector).await
}

/// S0-05, S0-10, S0-19, S0-20, S1-01, S0-21…S0-29, S1-16: scale a shard out 1→3 (the new
/// replicas get the schema and the data, the first replica is not restarted), then in 3→1
/// (the backup replica stays, the others leave Keeper, their PVCs are labelled and cleaned).
#[tokio::test]
async fn scale_out_then_in_keeps_data_and_leaves_no_trace() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "scale",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let first = backup_replica(&c);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let s = sts.get(&first).await.unwrap();
    assert_eq!(s.spec.replicas, Some(1), "S0-10: one pod per StatefulSet");

    let ch = sql_client(&client, &ns, "c1", &format!("{first}-0")).await;
    exec(&ch, "CREATE TABLE default.events (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') ORDER BY id").await;
    exec(
        &ch,
        "INSERT INTO default.events SELECT number FROM system.numbers LIMIT 100",
    )
    .await;
    let before = server_pods(&client, &ns, "c1").await;

    patch_spec(&client, &ns, "c1", json!({"replicas": 3})).await;
    let c = wait_ready(&client, &ns, "c1", 2).await;
    let map = &c.status.as_ref().unwrap().replica_state_map;
    assert_eq!(map.len(), 3);
    assert!(map.values().all(|r| r.state == ReplicaState::Ready));
    assert_eq!(backup_replica(&c), first, "the backup replica stays");
    let after = server_pods(&client, &ns, "c1").await;
    assert_eq!(after.len(), 3);
    for (pod, id) in &before {
        assert_eq!(after.get(pod), Some(id), "S0-05: {pod} was not restarted");
    }
    for name in map.keys().filter(|n| **n != first) {
        let ch = sql_client(&client, &ns, "c1", &format!("{name}-0")).await;
        let tables = query(
            &ch,
            "SELECT name AS v FROM system.tables WHERE database = 'default'",
        )
        .await;
        assert!(
            tables.contains(&"events".to_string()),
            "S1-01: {name} got the table: {tables:?}"
        );
        exec(&ch, "SYSTEM SYNC REPLICA default.events").await;
        assert_eq!(
            query(&ch, "SELECT count() AS v FROM default.events").await,
            ["100"],
            "{name} replicated the rows"
        );
    }

    patch_spec(&client, &ns, "c1", json!({"replicas": 1})).await;
    let c = wait_ready(&client, &ns, "c1", 3).await;
    let map = &c.status.as_ref().unwrap().replica_state_map;
    assert_eq!(
        map.keys().collect::<Vec<_>>(),
        [&first],
        "S0-14: the backup replica is the one left"
    );
    let removed: Vec<String> = after
        .keys()
        .map(|p| p.strip_suffix("-0").unwrap_or(p).to_string())
        .filter(|r| *r != first)
        .collect();
    for r in &removed {
        assert!(
            sts.get_opt(r).await.unwrap().is_none(),
            "S0-26: {r} deleted"
        );
    }
    // S0-27 / S1-16: the removed replicas left Keeper.
    let ch = sql_client(&client, &ns, "c1", &format!("{first}-0")).await;
    let replicas = query(&ch, "SELECT name AS v FROM system.zookeeper WHERE path = '/clickhouse/tables/0/default/events/replicas'").await;
    assert_eq!(
        replicas,
        std::slice::from_ref(&first),
        "only the survivor is registered in Keeper"
    );
    assert_eq!(
        query(&ch, "SELECT count() AS v FROM default.events").await,
        ["100"]
    );
    // S0-28 / S0-29: their PVCs were labelled, then deleted by the PVC cleaner once unused.
    // Decision 39: a PVC someone else labelled the same way, with every label the operator
    // sets, is kept: the labels are not the operator's proof.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let foreign: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "app-data", "labels": {
            "clickhouse.com/delete-pvc": "true", "clickhouse.com/cluster": "c1",
            "app.kubernetes.io/managed-by": "clickhouse-operator"},
            "annotations": {"clickhouse.com/delete-pvc-proof": "00ff"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    pvcs.create(&Default::default(), &foreign).await.unwrap();
    wait_for(
        Duration::from_secs(120),
        "the removed replicas' PVCs to be cleaned",
        || {
            let pvcs = pvcs.clone();
            let removed = removed.clone();
            async move {
                let names: Vec<String> = pvcs
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .map(|p| p.name_any())
                    .collect();
                removed
                    .iter()
                    .all(|r| !names.contains(&format!("data-{r}-0")))
                    .then_some(())
            }
        },
    )
    .await;
    // the cleaner sweeps every 10 s: one more sweep after the foreign PVC was labelled
    tokio::time::sleep(Duration::from_secs(12)).await;
    let left = pvcs.list(&ListParams::default()).await.unwrap().items;
    assert!(
        left.iter().any(|p| p.name_any().contains(&first)),
        "the survivor's PVC is kept"
    );
    assert!(
        left.iter().any(|p| p.name_any() == "app-data"),
        "a PVC labelled by someone else is kept"
    );
    assert!(
        left.iter()
            .filter(|p| p.name_any() != "app-data")
            .all(|p| !p.labels().contains_key("clickhouse.com/delete-pvc"))
    );
    finish(&client, &ns, op).await;
}

/// S0-17, S2-15, S2-28: an image change restarts every replica once, one at a time, the
/// backup replica last; the status is never `ready` while a pod is outdated.
#[tokio::test]
async fn image_change_rolls_out_one_at_a_time_backup_last() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "roll",
        json!({"replicas": 3, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let backup = backup_replica(&c);
    let before = server_pods(&client, &ns, "c1").await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"image": "clickhouse/clickhouse-server:24.9"}),
    )
    .await;

    let (order, most_down) = watch_rollout(&client, &ns, "c1", &before, 3, 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        most_down <= 1,
        "S0-18: at most maxUnavailable=1 pod down at once, saw {most_down}"
    );
    assert_eq!(
        order.last(),
        Some(&format!("{backup}-0")),
        "S2-28: the backup replica last: {order:?}"
    );
    for p in pods
        .list(
            &ListParams::default()
                .labels("clickhouse.com/cluster=c1,app.kubernetes.io/component=server"),
        )
        .await
        .unwrap()
    {
        let image = p.spec.unwrap().containers[0].image.clone().unwrap();
        assert_eq!(image, "clickhouse/clickhouse-server:24.9");
    }
    finish(&client, &ns, op).await;
}

/// S0-03, S2-21, S2-22: pause stops every pod (stopping, then paused), keeps the PVCs and the
/// data; resume brings the cluster back to ready with its rows.
#[tokio::test]
async fn pause_and_resume_keep_the_data() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "pause",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replica = backup_replica(&c);
    let ch = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
    exec(
        &ch,
        "CREATE TABLE default.t (id UInt64) ENGINE = MergeTree ORDER BY id",
    )
    .await;
    exec(
        &ch,
        "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 42",
    )
    .await;

    patch_spec(&client, &ns, "c1", json!({"pause": true})).await;
    let c = wait_status(&client, &ns, "c1", READY, "paused", |s| {
        s.state == ClusterState::Paused
    })
    .await;
    assert!(
        c.status
            .unwrap()
            .replica_state_map
            .values()
            .all(|r| r.state == ReplicaState::Stopped)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.list(&ListParams::default().labels("clickhouse.com/cluster=c1"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    assert!(
        !pvcs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "PVCs are kept"
    );

    patch_spec(&client, &ns, "c1", json!({"pause": false})).await;
    wait_ready(&client, &ns, "c1", 3).await;
    let ch = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
    assert_eq!(
        query(&ch, "SELECT count() AS v FROM default.t").await,
        ["42"]
    );
    finish(&client, &ns, op).await;
}

/// S2-03, S2-17: changing a password in the users Secret triggers a pass, the new password
/// works on the replica and the old one no longer does, and no pod restarts.
#[tokio::test]
async fn users_secret_change_reloads_without_restart() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    let client = client().await;
    let ns = namespace(&client, "users").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "stringData": {"analyst": "first-password"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}, "users": {"secretName": "creds"}}),
    )
    .await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    let pod = format!("{}-0", backup_replica(&c));
    let before = server_pods(&client, &ns, "c1").await;
    let ip = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&pod)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let login = |password: &'static str| {
        let ip = ip.clone();
        async move {
            let c = clickhouse_operator::clickhouse::Client::new(
                clickhouse_operator::clickhouse::ClientConfig::new(
                    clickhouse_operator::clickhouse::Endpoint {
                        host: ip,
                        port: 8123,
                    },
                    clickhouse_operator::clickhouse::Credentials {
                        user: "analyst".into(),
                        password: password.into(),
                    },
                ),
            )
            .unwrap();
            c.query("SELECT 1 AS v", &Default::default()).await.is_ok()
        }
    };
    wait_for(
        Duration::from_secs(60),
        "analyst logs in with the first password",
        || async { login("first-password").await.then_some(()) },
    )
    .await;
    secrets
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"analyst": "second-password"}})),
        )
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(60),
        "the new password to work",
        || async { login("second-password").await.then_some(()) },
    )
    .await;
    assert!(
        !login("first-password").await,
        "the old password is refused"
    );
    assert_eq!(
        server_pods(&client, &ns, "c1").await,
        before,
        "no pod restarted"
    );
    finish(&client, &ns, op).await;
}

/// S2-18: a larger storage size with volume scaling grows the PVC in place and recreates the
/// StatefulSet with its pod kept (same uid, no restart); without the flag nothing changes and
/// the status says why.
#[tokio::test]
async fn storage_grows_in_place_without_restart() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "grow",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replica = backup_replica(&c);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pvc_name = format!("data-{replica}-0");
    let sts_uid = sts.get(&replica).await.unwrap().uid();
    let before = server_pods(&client, &ns, "c1").await;

    // Without volume scaling: refused, reported, nothing changes.
    patch_spec(&client, &ns, "c1", json!({"storage": {"size": "2Gi"}})).await;
    wait_status(
        &client,
        &ns,
        "c1",
        READY,
        "the refusal to be reported",
        |s| {
            s.observed_generation == Some(2)
                && s.message
                    .as_deref()
                    .is_some_and(|m| m.contains("enableVolumeScaling"))
        },
    )
    .await;
    let size = |p: PersistentVolumeClaim| {
        p.spec.unwrap().resources.unwrap().requests.unwrap()["storage"]
            .0
            .clone()
    };
    assert_eq!(size(pvcs.get(&pvc_name).await.unwrap()), "1Gi");

    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"storageScaling": {"enableVolumeScaling": true}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 3).await;
    assert_eq!(size(pvcs.get(&pvc_name).await.unwrap()), "2Gi");
    assert_ne!(
        sts.get(&replica).await.unwrap().uid(),
        sts_uid,
        "the StatefulSet was recreated"
    );
    assert_eq!(
        server_pods(&client, &ns, "c1").await,
        before,
        "its pod was kept"
    );
    finish(&client, &ns, op).await;
}

/// S0-01, S1-03: a 2-shard cluster answers `ON CLUSTER` DDL and a query through a Distributed
/// table sums both shards; servers reach each other as the cluster's own account.
#[tokio::test]
async fn distributed_query_sums_both_shards() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "dist",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replicas: Vec<String> = c
        .status
        .unwrap()
        .replica_state_map
        .keys()
        .map(|k| k.to_string())
        .collect();
    let ch = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[0])).await;
    exec(&ch, "CREATE TABLE default.local ON CLUSTER c1 (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/local', '{replica}') ORDER BY id").await;
    exec(&ch, "CREATE TABLE default.dist ON CLUSTER c1 AS default.local ENGINE = Distributed(c1, default, local, id)").await;
    // 18.16 has no SYSTEM FLUSH DISTRIBUTED: insert synchronously instead.
    ch.exec(
        "INSERT INTO default.dist SELECT number FROM system.numbers LIMIT 1000",
        &clickhouse_operator::clickhouse::QueryOptions::new().setting("insert_distributed_sync", 1),
    )
    .await
    .expect("insert through the Distributed table");
    wait_for(
        Duration::from_secs(60),
        "1000 rows through the Distributed table",
        || {
            let ch = ch.clone();
            async move {
                (query(&ch, "SELECT count() AS v FROM default.dist").await == ["1000"])
                    .then_some(())
            }
        },
    )
    .await;
    for r in &replicas {
        let ch = sql_client(&client, &ns, "c1", &format!("{r}-0")).await;
        let local: u64 = query(&ch, "SELECT count() AS v FROM default.local").await[0]
            .parse()
            .unwrap();
        assert!(
            local > 0 && local < 1000,
            "{r} holds a part of the rows: {local}"
        );
    }
    finish(&client, &ns, op).await;
}

/// Decision 75, S0-22: while a client keeps querying through the client
/// Service, a replica leaving in a scale-in has its tables dropped only once the Service no
/// longer routes to its pod: no query through the Service fails for a dropped table.
///
/// The EndpointSlice controller drops a pod from the Service's slices within a second of it
/// leaving the selection, faster than the sync that comes next, so an extra slice for the
/// client Service listing the leaving pod (as a mesh or a lagging controller keeps one) holds
/// it in the Service's routes for as long as the test wants: the node agent's proxy, as
/// kube-proxy, routes through every slice of the Service. The client opens a connection per
/// query, as connections opened before the pod left keep reaching it (kube-proxy's conntrack
/// does the same). Rows are written through the Service throughout, and every acknowledged
/// batch is checked on every replica afterwards.
#[tokio::test]
async fn scale_in_drops_the_tables_only_once_the_client_service_no_longer_routes_to_the_pod() {
    use clickhouse_operator::clickhouse::QueryOptions;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "routes",
        json!({"replicas": 3, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let workload = crate::workload::Workload::start(&client, &ns, "c1").await;
    // S0-21: the newest replica is the one condemned
    let map = c.status.as_ref().unwrap().replica_state_map.clone();
    let (leaving, _) = map.iter().max_by_key(|(_, r)| r.index).unwrap();
    let leaving = leaving.clone();
    let pod = format!("{leaving}-0");
    let address = pod_ip(&client, &ns, &pod).await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let managed = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=c1"))
        .await
        .unwrap()
        .items;
    let ports = managed
        .iter()
        .find_map(|s| s.ports.clone())
        .expect("the client Service's slice has its ports");
    let extra: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "c1-held", "labels": {
            "kubernetes.io/service-name": "c1",
            "endpointslice.kubernetes.io/managed-by": "e2e.clickhouse.com"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [{"addresses": [address], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": pod, "namespace": ns}}],
    }))
    .unwrap();
    slices.create(&Default::default(), &extra).await.unwrap();
    // a client connected to the leaving pod itself, as one connected before it left would be
    let direct = sql_client(&client, &ns, "c1", &pod).await;
    exec(&direct, "CREATE TABLE default.probe ON CLUSTER c1 (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/probe', '{replica}') ORDER BY id").await;
    exec(&direct, "CREATE TABLE default.probe_all ON CLUSTER c1 AS default.probe ENGINE = Distributed(c1, default, probe, id)").await;

    // the client: a query a tenth of a second through the Service, each on a new connection
    let ip = service_ip(&client, &ns, "c1").await;
    let config = sql_config_at(&client, &ns, "c1", &ip, Duration::from_secs(5)).await;
    let stop = Arc::new(AtomicBool::new(false));
    type Answers = Vec<(std::time::Instant, Result<String, String>)>;
    let answers: Arc<Mutex<Answers>> = Arc::default();
    let reader = {
        let (stop, answers) = (stop.clone(), answers.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // a client of its own: a new connection
                let ch = clickhouse_operator::clickhouse::Client::new(config.clone()).unwrap();
                // the replica that answered (its `{replica}` macro), from the table
                let q = "SELECT (SELECT substitution FROM system.macros WHERE macro = 'replica') \
                         AS h, count() AS n FROM default.events";
                let answer = match ch.query(q, &QueryOptions::new()).await {
                    Ok(rows) => rows
                        .iter()
                        .next()
                        .and_then(|r| r.str("h").ok().map(str::to_string))
                        .ok_or_else(|| "no row".to_string()),
                    Err(e) => Err(e.to_string()),
                };
                answers
                    .lock()
                    .unwrap()
                    .push((std::time::Instant::now(), answer));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    patch_spec(&client, &ns, "c1", json!({"replicas": 2})).await;
    let waiting = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(120),
        "the scale-in to wait for the client Service",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("no longer routes to it") && m.contains(&pod))
        },
    )
    .await;
    // held: the leaving pod is out of the Service's selection, still routed, and untouched
    let held_from = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let c = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(10),
        "a status",
        |_| true,
    )
    .await;
    let entry = &c.status.as_ref().unwrap().replica_state_map[&leaving];
    assert_eq!(entry.state, ReplicaState::Condemned);
    assert_eq!(
        entry.scale_in_step,
        Some(clickhouse_operator::api::ScaleInStep::OutOfTraffic),
        "{leaving} is neither synced nor emptied while the Service routes to it: {:?}",
        waiting.status.and_then(|s| s.message)
    );
    let labels = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&pod)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert!(
        !labels.contains_key("clickhouse.com/serving"),
        "{pod} left the Service's selection"
    );
    let reached = answers
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, a)| *t > held_from && a.as_deref() == Ok(leaving.as_str()))
        .count();
    assert!(
        reached > 0,
        "the held slice kept routing queries to {pod} (otherwise this test proves nothing)"
    );
    // out of the cluster's hosts, the leaving server still forwards a Distributed insert to
    // the others as the cluster's account, which accepts it until it is deleted
    let forwarded = QueryOptions::new()
        .setting("insert_distributed_sync", 1)
        .setting("prefer_localhost_replica", 0);
    direct
        .exec(
            "INSERT INTO default.probe_all SELECT number FROM system.numbers LIMIT 10",
            &forwarded,
        )
        .await
        .expect("an insert through the leaving server's Distributed table");

    // the slice goes: the scale-in goes on and completes
    slices.delete("c1-held", &Default::default()).await.unwrap();
    let c = wait_ready(&client, &ns, "c1", 2).await;
    stop.store(true, Ordering::SeqCst);
    reader.await.unwrap();
    assert!(
        !c.status
            .as_ref()
            .unwrap()
            .replica_state_map
            .contains_key(&leaving),
        "{leaving} was removed"
    );
    for (survivor, _) in map.iter().filter(|(n, _)| **n != leaving) {
        let ch = sql_client(&client, &ns, "c1", &format!("{survivor}-0")).await;
        exec(&ch, "SYSTEM SYNC REPLICA default.probe").await;
        let rows = query(&ch, "SELECT count() AS v FROM default.probe").await;
        assert_eq!(rows, ["10"], "the forwarded insert is on {survivor}");
    }
    let answers = answers.lock().unwrap().clone();
    let failed: Vec<&String> = answers
        .iter()
        .filter_map(|(_, a)| a.as_ref().err())
        .collect();
    let served = answers.len() - failed.len();
    eprintln!(
        "{served} queries through the Service answered, {} failed",
        failed.len()
    );
    assert!(served > 100, "the client kept querying: {served} answers");
    assert!(
        failed.is_empty(),
        "no query through the client Service fails during the scale-in: {failed:#?}"
    );
    let attempts = workload.stop_and_check_attempts(&client, &ns).await;
    let acked = attempts.iter().filter(|(_, r)| r.is_ok()).count();
    let errors: Vec<&String> = attempts
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert!(
        acked > 10,
        "{acked} batches acknowledged; the failures: {:#?}",
        &errors[..errors.len().min(5)]
    );
    finish(&client, &ns, op).await;
}

/// S0-27, decision 2: a shard removed while the pod of its only replica is gone (here it is
/// stopped after the shard was synced, before its tables could be dropped on it): with no
/// replica of its own shard left, a server of another shard finds what the replica left in
/// Keeper at the paths the shard's tables had; 18.16 cannot drop it (no `SYSTEM DROP REPLICA
/// … FROM ZKPATH`), so the condition `KeeperMetadataLeft` names each node, and each named node
/// is there. (A server with the statement drops them: `modern_sql` parses it, and
/// `clickhouse::replicas::a_gone_shards_keeper_metadata_is_found_from_another_shard` finds
/// the same nodes on real servers.)
#[tokio::test]
async fn a_removed_shard_whose_pod_is_gone_names_what_it_left_in_keeper() {
    use clickhouse_operator::controller::{AfterStep, StepPoint};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "goneshard",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let map = c.status.as_ref().unwrap().replica_state_map.clone();
    let name_of = |shard: i32| {
        map.iter()
            .find(|(_, r)| r.shard.0 == shard)
            .map(|(n, _)| n.to_string())
            .unwrap()
    };
    let (kept, leaving) = (name_of(0), name_of(1));
    let ch = sql_client(&client, &ns, "c1", &format!("{kept}-0")).await;
    exec(&ch, "CREATE TABLE default.events ON CLUSTER c1 (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') ORDER BY id").await;
    for r in [&kept, &leaving] {
        let ch = sql_client(&client, &ns, "c1", &format!("{r}-0")).await;
        exec(
            &ch,
            "INSERT INTO default.events SELECT number FROM system.numbers LIMIT 10",
        )
        .await;
    }
    drop(op);

    // an operator that stops right before the leaving replica's tables would be dropped on it
    let stopped = Arc::new(AtomicBool::new(false));
    let hook: AfterStep = {
        let (stopped, leaving) = (stopped.clone(), leaving.clone());
        Arc::new(move |point, step| {
            let at = point == StepPoint::Before
                && step.describe().contains("DropObjects")
                && step.describe().contains(&format!("\"{leaving}\""));
            stopped.fetch_or(at, Ordering::SeqCst) || at
        })
    };
    let held = start_operator_with(
        &client,
        &ns,
        clickhouse_operator::controller::Faults {
            after_step: Some(hook),
            ..Default::default()
        },
    )
    .await;
    remove_shards(&client, &ns, "c1", 1).await;
    wait_for(
        Duration::from_secs(240),
        "the scale-in to reach the drop of the leaving replica's tables",
        || {
            let stopped = stopped.clone();
            async move { stopped.load(Ordering::SeqCst).then_some(()) }
        },
    )
    .await;
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // its pod goes away for good
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    sts.patch(
        &leaving,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = format!("{leaving}-0");
    wait_for(
        Duration::from_secs(120),
        "the leaving pod to be gone",
        || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move { pods.get_opt(&pod).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;

    let op = start_operator(&client, &ns, false).await;
    let c = wait_status(
        &client,
        &ns,
        "c1",
        READY,
        "the removed shard's replica to be gone, its Keeper metadata named",
        |s| {
            !s.replica_state_map.contains_key(leaving.as_str())
                && s.conditions
                    .iter()
                    .any(|c| c.r#type == "KeeperMetadataLeft" && c.status == "True")
        },
    )
    .await;
    let left = c
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "KeeperMetadataLeft")
        .unwrap()
        .message;
    let node = format!("/clickhouse/tables/1/default/events/replicas/{leaving}");
    assert!(left.contains(&node), "the condition names {node}: {left}");
    let ch = sql_client(&client, &ns, "c1", &format!("{kept}-0")).await;
    assert_eq!(
        query(
            &ch,
            "SELECT name AS v FROM system.zookeeper WHERE path = '/clickhouse/tables/1/default/events/replicas'"
        )
        .await,
        std::slice::from_ref(&leaving),
        "what the condition names is there"
    );
    assert_eq!(
        query(&ch, "SELECT count() AS v FROM default.events").await,
        ["10"],
        "the kept shard keeps its rows"
    );
    assert!(
        sts.get_opt(&leaving).await.unwrap().is_none(),
        "{leaving} deleted"
    );
    finish(&client, &ns, op).await;
}

/// S0-24: a scale-in waits while a surviving replica is down. Of three replicas, the middle
/// one's server is stopped (SIGSTOP: its pod stays, not Ready, for the minute before its
/// liveness probe would restart it) while rows are written through
/// the client Service; the scale-in to two condemns the newest replica and then waits: pass
/// after pass its StatefulSet stays, its table is still there, it is not synced, and the status
/// names the replica that is not ready. Once the server goes on, the scale-in completes, and
/// every acknowledged row is on both replicas left.
#[tokio::test]
async fn scale_in_waits_while_a_surviving_replica_is_down_and_completes_once_it_is_back() {
    use clickhouse_operator::api::ScaleInStep;
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "survivor",
        json!({"replicas": 3, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let workload = crate::workload::Workload::start(&client, &ns, "c1").await;
    let mut by_age: Vec<(String, i64)> = c
        .status
        .as_ref()
        .unwrap()
        .replica_state_map
        .iter()
        .map(|(n, r)| (n.to_string(), r.index))
        .collect();
    by_age.sort_by_key(|(_, i)| *i);
    let (down, leaving) = (by_age[1].0.clone(), by_age[2].0.clone());
    let pod = format!("{down}-0");
    let pid = pid_of(
        "clickhouse-server",
        &pod,
        Some(&pod_ip(&client, &ns, &pod).await),
    );
    // SAFETY: a signal to a process of this machine
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped_at = std::time::Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for(
        Duration::from_secs(90),
        "the stopped server's pod not Ready",
        || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                let p = pods.get(&pod).await.ok()?;
                let ready = p
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (!ready).then_some(())
            }
        },
    )
    .await;
    patch_spec(&client, &ns, "c1", json!({"replicas": 2})).await;
    let said = format!("scale-in of {leaving} waits until every StatefulSet is Ready");
    let waiting = wait_status(&client, &ns, "c1", READY, "the scale-in waiting", |s| {
        s.observed_generation == Some(2)
            && s.message
                .as_deref()
                .is_some_and(|m| m.contains(&said) && m.contains(&down))
    })
    .await;
    println!("{:?}", waiting.status.and_then(|s| s.message));
    let clusters: Api<clickhouse_operator::api::ClickHouseCluster> =
        Api::namespaced(client.clone(), &ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let on_leaving = sql_client(&client, &ns, "c1", &format!("{leaving}-0")).await;
    // the liveness probe (6 × 10 s) restarts the stopped server after a minute, as a kubelet
    // does, which would end the wait: the checks end before that
    for check in 0..5 {
        if check > 0 && stopped_at.elapsed() > Duration::from_secs(45) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let status = clusters.get("c1").await.unwrap().status.unwrap();
        let r = &status.replica_state_map[leaving.as_str()];
        assert_eq!(r.state, ReplicaState::Condemned);
        assert!(
            r.scale_in_step.is_none_or(|s| s < ScaleInStep::Synced),
            "{leaving} went on to {:?} while {down} is down",
            r.scale_in_step
        );
        assert!(statefulsets.get_opt(&leaving).await.unwrap().is_some());
        let tables = query(
            &on_leaving,
            "SELECT count() AS v FROM system.tables WHERE database = 'default' AND name = 'events'",
        )
        .await;
        assert_eq!(tables, ["1"], "{leaving}'s table is not dropped");
    }
    // SAFETY: as above
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let after = wait_ready(&client, &ns, "c1", 2).await;
    let map = after.status.unwrap().replica_state_map;
    assert!(
        !map.contains_key(leaving.as_str()) && map.len() == 2,
        "{map:?}"
    );
    assert!(statefulsets.get_opt(&leaving).await.unwrap().is_none());
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} acknowledged batches on both replicas");
    finish(&client, &ns, op).await;
}
