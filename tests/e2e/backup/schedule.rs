//! Backups beside the cluster's life: a schedule that keeps two and stops while paused, a
//! rollout and a shard removal that wait while a backup runs.

use super::*;

/// S2-40: a schedule `*/1 * * * *` with `keep: 2` creates a backup each minute (incremental
/// on the one before); retention removes the oldest successful ones with their data, never a
/// part a kept backup still references; no backup is created while the cluster is paused.
/// Decision 26: the cluster's `backup.agent` settings reach every agent pod (labels, annotations,
/// tolerations, resources, pull secrets, environment), and with `HTTP_PROXY` among them every
/// agent reaches the bucket through that proxy (a relay in this test process that counts what
/// it carried) while still reaching its server directly.
#[tokio::test]
async fn scheduled_backups_run_each_minute_keep_two_and_stop_while_paused() {
    let (server, client, ns, op) = setup("sched", &[]).await;
    let relay = proxy().await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"},
                          "schedules": [{"name": "minutely", "schedule": "*/1 * * * *",
                                         "keep": 2, "incremental": true}],
                          "agent": {"env": [{"name": "HTTP_PROXY", "value": relay.for_pods}],
                                    "labels": {"team": "db"}, "annotations": {"example.com/note": "backup"},
                                    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}],
                                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                                    "imagePullSecrets": [{"name": "registry"}]}}}),
    )
    .await;
    // every agent pod, as created, while the test runs
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let agent_pods = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Pod>::new()));
    let watcher = {
        let (pods, seen) = (pods.clone(), agent_pods.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods
                    .list(
                        &ListParams::default()
                            .labels("app.kubernetes.io/name=clickhouse-backup-agent"),
                    )
                    .await
                {
                    let mut seen = seen.lock().unwrap();
                    for p in list.items {
                        if !seen.iter().any(|s| s.metadata.uid == p.metadata.uid) {
                            seen.push(p);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    wait_ready(&client, &ns, "c1", 1).await;
    let ch = sql_client(&client, &ns, "c1", "c1-0-0-0").await;
    exec(
        &ch,
        "CREATE TABLE default.t (x UInt64) ENGINE = MergeTree ORDER BY x",
    )
    .await;
    exec(
        &ch,
        "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 100000",
    )
    .await;
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    let lp = kube::api::ListParams::default().labels("clickhouse.com/schedule=minutely");
    let mut seen = std::collections::BTreeSet::new();
    let mut most_succeeded = 0;
    let started = std::time::Instant::now();
    let kept = loop {
        assert!(
            started.elapsed() < Duration::from_secs(330),
            "four scheduled backups did not happen in time: {seen:?}"
        );
        let now = api.list(&lp).await.unwrap().items;
        let succeeded: Vec<&ClickHouseBackup> = now
            .iter()
            .filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.state == BackupState::Succeeded)
            })
            .collect();
        most_succeeded = most_succeeded.max(succeeded.len());
        seen.extend(now.iter().map(|b| b.name_any()));
        let settled = now.iter().all(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| matches!(s.state, BackupState::Succeeded | BackupState::Failed))
        });
        if seen.len() >= 4 && settled && succeeded.len() == 2 {
            break succeeded.into_iter().cloned().collect::<Vec<_>>();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    println!(
        "scheduled backups seen: {seen:?}; kept: {:?}",
        kept.iter().map(|b| b.name_any()).collect::<Vec<_>>()
    );
    // retention runs every few seconds: a new success may stand beside the two for one tick
    assert!(
        most_succeeded <= 3,
        "{most_succeeded} successful backups at once"
    );
    let b = bucket(&format!("{ns}/c1"));
    for gone in seen
        .iter()
        .filter(|n| !kept.iter().any(|k| k.name_any() == **n))
    {
        assert!(
            b.get(&manifest::manifest_key(gone), u64::MAX)
                .await
                .unwrap()
                .is_none(),
            "{gone}'s manifest is removed"
        );
    }
    for k in &kept {
        let m = b
            .get(&manifest::shard_manifest_key(&k.name_any(), 0), u64::MAX)
            .await
            .unwrap()
            .expect("a kept backup's shard manifest");
        let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
        for p in m.tables.iter().flat_map(|t| t.parts.iter()) {
            let files = b.list(&format!("{}/", p.key)).await.unwrap();
            assert_eq!(
                files.len(),
                p.files.len(),
                "{} of {} is whole",
                p.key,
                k.name_any()
            );
        }
    }
    assert!(
        kept.iter()
            .any(|k| k.status.as_ref().unwrap().bytes_reused > 0),
        "incremental backups reuse parts"
    );
    patch_spec(&client, &ns, "c1", json!({"pause": true})).await;
    wait_status(&client, &ns, "c1", READY, "paused", |s| {
        s.state == clickhouse_operator::api::ClusterState::Paused
    })
    .await;
    let before: Vec<String> = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|b| b.name_any())
        .collect();
    tokio::time::sleep(Duration::from_secs(75)).await;
    let after: Vec<String> = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|b| b.name_any())
        .collect();
    let created: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    assert!(
        created.is_empty(),
        "backups created while paused: {created:?}"
    );
    watcher.abort();
    let seen = agent_pods.lock().unwrap().clone();
    assert!(!seen.is_empty(), "agent pods were seen");
    for p in &seen {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("team").map(String::as_str),
            Some("db"),
            "{:?}",
            p.metadata.name
        );
        assert_eq!(
            p.metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .get("example.com/note")
                .map(String::as_str),
            Some("backup")
        );
        let spec = p.spec.clone().unwrap();
        assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "registry");
        assert!(
            spec.tolerations
                .unwrap_or_default()
                .iter()
                .any(|t| t.key.as_deref() == Some("dedicated"))
        );
        let c = &spec.containers[0];
        assert!(
            c.resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some_and(|r| r.contains_key("memory"))
        );
        assert!(
            c.env
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|e| e.name == "HTTP_PROXY")
        );
    }
    let relayed = relay.relayed.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "{} agent pods, {relayed} connections to the bucket through the proxy",
        seen.len()
    );
    assert!(
        relayed > 0,
        "the agents reached the bucket through the proxy"
    );
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// S2-27: a Smart Update waits while a backup of the cluster is `Running` and says so; no
/// server pod is deleted until the backup is over. Here the backup's agent cannot start (the
/// operator is told to run an image that does not exist), so the backup stays `Running` until
/// the operator gives up on its agent (after two minutes) and fails it, naming the cause; then
/// the rollout goes on and every pod restarts once.
#[tokio::test]
async fn a_rollout_waits_while_a_backup_runs() {
    let (server, client, ns, op) = setup(
        "bkroll",
        &[("OPERATOR_IMAGE", "registry.invalid/agent:none")],
    )
    .await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let before = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    start_backup(&client, &ns, "slow", json!({"clusterName": "c1"})).await;
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    wait_for(Duration::from_secs(60), "backup slow Running", || {
        let api = api.clone();
        async move {
            let s = api.get("slow").await.ok()?.status?;
            (s.state == BackupState::Running).then_some(())
        }
    })
    .await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"env": [{"name": "ROLLED", "value": "1"}]}}),
    )
    .await;
    let cluster = wait_status(&client, &ns, "c1", READY, "the rollout waiting", |s| {
        s.observed_generation == Some(2)
            && s.message
                .as_deref()
                .is_some_and(|m| m.contains("waiting for backup slow"))
    })
    .await;
    println!("{:?}", cluster.status.and_then(|s| s.message));
    let mut waited = std::time::Instant::now();
    loop {
        let b = api.get("slow").await.unwrap();
        let state = b.status.as_ref().unwrap().state;
        if state != BackupState::Running {
            let message = b.status.unwrap().message.unwrap_or_default();
            println!("backup slow: {state:?}: {message}");
            assert_eq!(state, BackupState::Failed);
            assert!(message.contains("cannot start"), "{message}");
            break;
        }
        assert_eq!(
            pod_ids(&client, &ns, "app.kubernetes.io/component=server").await,
            before,
            "no server pod restarted while the backup runs"
        );
        assert!(
            waited.elapsed() < Duration::from_secs(240),
            "the backup never ended"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    waited = std::time::Instant::now();
    wait_ready(&client, &ns, "c1", 2).await;
    println!("rolled {:?} after the backup ended", waited.elapsed());
    let after = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    for (pod, (uid, _)) in &before {
        assert_ne!(&after[pod].0, uid, "{pod} restarted after the backup");
    }
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, false).await;
    finish(&client, &ns, op).await;
}

/// Decision 77 (S0-13, S0-15, S0-21): a shard removed while a backup reads from it waits for
/// the backup to end. A 2-shard cluster is backed up through a relay that holds the agents'
/// requests (the backup stays `Running`, reading from each shard's backup replica); the user
/// removes shard 1 (`allow-data-loss`): pass after pass, no replica is condemned, the leaving
/// replica's StatefulSet stays, and the status says the removal waits for the backup and which
/// replica it reads from. Once the relay lets the agents through, the backup ends `Succeeded`
/// with both shards' rows, then the shard is removed, and the kept shard has all of its rows.
/// Without the wait the shard's backup replica is condemned at once and the backup fails with
/// `ReplicaRemoved` (the guarantees watch also fails any backup that does).
#[tokio::test]
async fn a_shard_removed_during_a_backup_waits_for_it_and_the_backup_succeeds() {
    use clickhouse_operator::api::ReplicaState;
    use k8s_openapi::api::apps::v1::StatefulSet;
    let (_, client, ns, op) = setup("bkshard", &[]).await;
    let s3 = gated_s3().await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": {"endpoint": s3.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let map = ready.status.unwrap().replica_state_map;
    let on = |shard: i32| {
        map.iter()
            .find(|(_, r)| r.shard.get() == shard)
            .map(|(n, _)| n.to_string())
            .unwrap()
    };
    let (kept, leaving) = (on(0), on(1));
    let ch = sql_client(&client, &ns, "c1", &format!("{kept}-0")).await;
    exec(&ch, "CREATE TABLE default.events ON CLUSTER c1 (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') ORDER BY id").await;
    for (replica, rows) in [(&kept, 1000), (&leaving, 2000)] {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(
            &c,
            &format!("INSERT INTO default.events SELECT number FROM system.numbers LIMIT {rows}"),
        )
        .await;
    }

    start_backup(&client, &ns, "held", json!({"clusterName": "c1"})).await;
    let backups: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    wait_for(Duration::from_secs(60), "backup held Running", || {
        let backups = backups.clone();
        async move {
            let s = backups.get("held").await.ok()?.status?;
            (s.state == BackupState::Running).then_some(())
        }
    })
    .await;
    remove_shards(&client, &ns, "c1", 1).await;
    let said = format!("removing shard 1 waits for backup held to end: it reads from {leaving}");
    let waiting = wait_status(
        &client,
        &ns,
        "c1",
        READY,
        "the shard removal waiting",
        |s| {
            s.observed_generation == Some(2)
                && s.message.as_deref().is_some_and(|m| m.contains(&said))
        },
    )
    .await;
    println!("{:?}", waiting.status.and_then(|s| s.message));
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let status = clusters.get("c1").await.unwrap().status.unwrap();
        let state = status.replica_state_map[leaving.as_str()].state;
        assert_eq!(
            state,
            ReplicaState::Ready,
            "{leaving} while the backup runs"
        );
        assert!(statefulsets.get_opt(&leaving).await.unwrap().is_some());
        let b = backups.get("held").await.unwrap().status.unwrap();
        assert_eq!(b.state, BackupState::Running, "{:?}", b.message);
    }

    s3.open.send(true).unwrap();
    let done = wait_backup_done(&client, &ns, "held").await.status.unwrap();
    assert_eq!(done.state, BackupState::Succeeded, "{:?}", done.message);
    let ran_on: BTreeMap<i32, (String, u64)> = done
        .shards
        .iter()
        .map(|s| (s.shard, (s.replica.clone(), s.bytes_uploaded)))
        .collect();
    assert_eq!(ran_on.len(), 2, "{ran_on:?}");
    assert!(ran_on.values().all(|(_, bytes)| *bytes > 0), "{ran_on:?}");
    assert_eq!(ran_on[&1].0, leaving);
    let b = bucket(&format!("{ns}/c1"));
    let m = b
        .get(&manifest::shard_manifest_key("held", 1), u64::MAX)
        .await
        .unwrap()
        .expect("the removed shard's manifest");
    let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
    assert!(
        m.tables
            .iter()
            .any(|t| t.name == "events" && !t.parts.is_empty())
    );

    let after = wait_ready(&client, &ns, "c1", 2).await;
    let map = after.status.unwrap().replica_state_map;
    assert_eq!(
        map.keys().map(|n| n.as_str()).collect::<Vec<_>>(),
        [kept.as_str()]
    );
    wait_for(
        Duration::from_secs(60),
        "the removed shard's StatefulSet gone",
        || {
            let statefulsets = statefulsets.clone();
            let leaving = leaving.clone();
            async move {
                statefulsets
                    .get_opt(&leaving)
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(
        query(&ch, "SELECT count() AS v FROM default.events").await,
        ["1000"]
    );
    finish(&client, &ns, op).await;
}
