//! Backups that fail on the way: a backup replica killed, the operator killed after every step
//! of a backup and its restore.

use super::*;

/// S0-04, decision 26: the backup replica's pod deleted (its server stopped, the pod recreated by
/// its StatefulSet) while the agent works. The backup ends `Failed`
/// naming the replica and the cause, its manifest is never written (nothing looks complete), and
/// the next backup, once the replica is back, succeeds and holds every row.
/// Decision 26: the cluster has a further disk (`storage.disks`), which backups once refused: the
/// agent mounts it beside the data volume, and the backup and its restore hold every row. 18.16
/// ignores storage policies, so its parts are all on the data volume here; a freeze that
/// snapshots parts on several disks is read from each (`backup::agent`, not run here).
#[tokio::test]
async fn a_backup_whose_backup_replica_is_killed_fails_and_the_next_one_succeeds() {
    let (server, client, ns, op) = setup("bkkill", &[]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi", "disks": [{"name": "cold", "size": "1Gi"}]},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let map = ready.status.unwrap().replica_state_map;
    let victim = map
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| n.clone())
        .unwrap();
    let ch = sql_client(&client, &ns, "c1", &format!("{victim}-0")).await;
    exec(&ch, "CREATE TABLE default.events ON CLUSTER c1 (batch UInt64, id UInt64, payload String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)").await;
    // many parts, so that the agent is still at work when its server is killed
    for first in [0, 100, 200, 300, 400, 500] {
        exec(&ch, &format!("INSERT INTO default.events SELECT {first} + number % 100, number, toString(rand64()) FROM system.numbers LIMIT 100000")).await;
    }
    let rows = query(&ch, "SELECT count() AS v FROM default.events").await[0].clone();

    start_backup(&client, &ns, "killed", json!({"clusterName": "c1"})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}=killed"));
    wait_for(Duration::from_secs(120), "the agent at work", || {
        let (pods, lp) = (pods.clone(), lp.clone());
        async move {
            let listed = pods.list(&lp).await.ok()?.items;
            listed
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .then_some(())
        }
    })
    .await;
    let agent = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .unwrap();
    let claims: Vec<String> = agent
        .spec
        .unwrap()
        .volumes
        .unwrap_or_default()
        .iter()
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    assert!(
        claims.contains(&format!("disk-cold-{victim}-0")),
        "the agent mounts the further disk: {claims:?}"
    );
    let killed_at = std::time::Instant::now();
    pods.delete(&format!("{victim}-0"), &DeleteParams::default())
        .await
        .unwrap();
    let b = wait_backup_done(&client, &ns, "killed").await;
    let s = b.status.unwrap();
    let message = s.message.clone().unwrap_or_default();
    println!(
        "backup killed: {:?} {:?} after the kill: {message}",
        s.state,
        killed_at.elapsed()
    );
    assert_eq!(s.state, BackupState::Failed, "{message}");
    assert!(message.contains(victim.as_str()), "{message}");
    assert!(message.contains("during the backup"), "{message}");
    assert!(s.manifest.is_none());
    assert!(
        bucket(&format!("{ns}/c1"))
            .get(&manifest::manifest_key("killed"), u64::MAX)
            .await
            .unwrap()
            .is_none(),
        "no manifest of the failed backup"
    );
    wait_for(
        Duration::from_secs(60),
        "the failed backup's agent gone",
        || {
            let (pods, lp) = (pods.clone(), lp.clone());
            async move { pods.list(&lp).await.ok()?.items.is_empty().then_some(()) }
        },
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let started = std::time::Instant::now();
    start_backup(&client, &ns, "after", json!({"clusterName": "c1"})).await;
    let after = wait_backup_done(&client, &ns, "after")
        .await
        .status
        .unwrap();
    println!(
        "backup after: {:?} in {:?}, {} bytes in {} parts",
        after.state,
        started.elapsed(),
        after.bytes_uploaded,
        after.shards.iter().map(|s| s.parts_uploaded).sum::<u64>()
    );
    assert_eq!(after.state, BackupState::Succeeded, "{:?}", after.message);
    assert_eq!(after.shards[0].replica, victim);
    // every row is in it: the table dropped, restored from it, whole on both replicas
    let ch = sql_client(&client, &ns, "c1", &format!("{victim}-0")).await;
    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    start_restore(
        &client,
        &ns,
        "back",
        json!({"clusterName": "c1", "backupName": "after"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "back")
        .await
        .status
        .unwrap();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    let replicas: Vec<String> = map.keys().map(|k| k.to_string()).collect();
    wait_for(
        Duration::from_secs(120),
        "every row on both replicas",
        || {
            let (client, ns, replicas, rows) =
                (client.clone(), ns.clone(), replicas.clone(), rows.clone());
            async move {
                for replica in &replicas {
                    let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
                    let n = c
                        .query(
                            "SELECT toString(count()) AS v FROM default.events",
                            &QueryOptions::new(),
                        )
                        .await
                        .ok()?;
                    let v = n.iter().next()?.str("v").ok()?.to_string();
                    if v != rows {
                        println!("{replica}: {v} rows of {rows}");
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// Drives `object` (a ClickHouseBackup or ClickHouseRestore, read by `state`) to its end with
/// operators that each die right after one step of a pass they have not died after before (a
/// bucket check, a manifest read or write, an agent Job created), before anything records it,
/// or right after each status write (every one: each records progress, `write status <state>
/// #<n>`); a new operator takes over each time. Returns the points they died at and, for each
/// agent Job, every UID it had (a Job created twice has two).
///
/// Also asserts that no finished step runs again: a step is finished once it completed and a
/// status write followed it in the same operator (what the step did is then recorded); no
/// operator may start it after that.
async fn drive_with_kills<F, Fut>(
    client: &Client,
    ns: &str,
    label: &str,
    state: F,
) -> (
    Vec<String>,
    BTreeMap<String, std::collections::BTreeSet<String>>,
)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use clickhouse_operator::controller::{AfterJobStep, Faults, StepPoint};
    use k8s_openapi::api::batch::v1::Job;

    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}={label}"));
    let mut uids: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut kills: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    // every status write seen, by what it wrote; every hook call: (operator, point, step)
    let writes: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let calls: Arc<Mutex<Vec<(usize, StepPoint, String)>>> = Arc::default();
    let mut run = 0usize;
    loop {
        run += 1;
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{label} did not end: died after {kills:?}"
        );
        let fired = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(String::new()));
        let seen: Arc<std::collections::BTreeSet<String>> =
            Arc::new(kills.iter().cloned().collect());
        let hook: AfterJobStep = {
            let (fired, last) = (fired.clone(), last.clone());
            let (writes, calls) = (writes.clone(), calls.clone());
            Arc::new(move |point, what: &str| {
                if fired.load(Ordering::SeqCst) {
                    return true;
                }
                calls.lock().unwrap().push((run, point, what.to_string()));
                if point != StepPoint::After {
                    return false;
                }
                // a status write is made when the hook runs: each is a point of its own
                let key = if what.starts_with("write status ") {
                    let mut w = writes.lock().unwrap();
                    let n = w.entry(what.to_string()).or_default();
                    *n += 1;
                    format!("{what} #{n}")
                } else {
                    what.to_string()
                };
                if seen.contains(&key) {
                    return false;
                }
                fired.store(true, Ordering::SeqCst);
                *last.lock().unwrap() = key;
                true
            })
        };
        let op = start_operator_with(
            client,
            ns,
            Faults {
                after_job_step: Some(hook),
                ..Default::default()
            },
        )
        .await;
        // Until it dies, or the resource has ended and the operator stayed alive 3 s more
        // (its agents removed).
        let mut ended_since: Option<std::time::Instant> = None;
        let died = loop {
            for j in jobs.list(&lp).await.map(|l| l.items).unwrap_or_default() {
                uids.entry(j.name_any())
                    .or_default()
                    .insert(j.uid().unwrap_or_default());
            }
            if fired.load(Ordering::SeqCst) {
                break true;
            }
            let ended = matches!(state().await.as_deref(), Some("Succeeded") | Some("Failed"));
            match (ended, ended_since) {
                (true, None) => ended_since = Some(std::time::Instant::now()),
                (true, Some(t)) if t.elapsed() > Duration::from_secs(3) => break false,
                (false, _) => ended_since = None,
                _ => {}
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "{label} did not end: died after {kills:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        drop(op);
        if !died {
            assert_no_finished_step_ran_again(&calls.lock().unwrap());
            return (kills, uids);
        }
        kills.push(last.lock().unwrap().clone());
        // the dead operator's pass is aborted with it; give the task a moment to stop
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// No step was started again once finished: completed, then a status written by the same
/// operator (see [`drive_with_kills`]).
fn assert_no_finished_step_ran_again(
    calls: &[(usize, clickhouse_operator::controller::StepPoint, String)],
) {
    use clickhouse_operator::controller::StepPoint;
    let mut finished: BTreeMap<String, usize> = BTreeMap::new();
    let mut again = Vec::new();
    for (i, (run, point, what)) in calls.iter().enumerate() {
        if what.starts_with("write status ") {
            continue;
        }
        if *point == StepPoint::Before
            && let Some(at) = finished.get(what)
        {
            again.push(format!(
                "{what} (finished at call {at}, started again at {i} by operator {run})"
            ));
        }
        if *point == StepPoint::After
            && calls[i + 1..]
                .iter()
                .take_while(|(r, _, _)| r == run)
                .any(|(_, p, w)| *p == StepPoint::After && w.starts_with("write status "))
        {
            finished.entry(what.clone()).or_insert(i);
        }
    }
    assert!(
        again.is_empty(),
        "finished steps ran again: {again:#?}\nevery call: {calls:#?}"
    );
}

/// An operator died right after each of `steps`, and each of the 2 shards' agent Jobs had one
/// UID: no agent was created twice.
fn assert_each_step_survived(
    kills: &[String],
    jobs: &BTreeMap<String, std::collections::BTreeSet<String>>,
    steps: &[&str],
) {
    for want in steps {
        assert!(
            kills
                .iter()
                .any(|k| k == want || k.starts_with(&format!("{want} #"))),
            "no kill after {want:?}: {kills:?}"
        );
    }
    assert_eq!(jobs.len(), 2, "one agent Job per shard: {jobs:?}");
    assert!(
        jobs.values().all(|u| u.len() == 1),
        "an agent Job was created again: {jobs:?}"
    );
}

/// Decisions 24 and 26 (S0-19, invariants 1 and 6 for backups): a backup of a 2-shard × 2-replica
/// cluster under write load, then a restore of it, each driven by operators that die right after
/// every step (the bucket checked, each shard's agent Job created, the manifest read or written:
/// each once, before anything records it; and every status write). Each ends `Succeeded`; no
/// step is started again once finished and recorded, and no agent Job is ever created twice
/// (one UID per Job); every acknowledged row of the writer is on every
/// replica; the restored table holds exactly the rows it had, on every replica; no Secret value
/// leaked.
#[tokio::test]
async fn a_backup_and_its_restore_survive_the_operator_killed_after_every_step() {
    let (server, client, ns, op) = setup("bkdie", &[]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let replicas: Vec<String> = ready
        .status
        .unwrap()
        .replica_state_map
        .into_keys()
        .map(String::from)
        .collect();
    let ch = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[0])).await;
    // the log trail: each write of the operator is a line naming the namespace, the cluster,
    // the step and why
    let created = trail(&format!("namespace={ns}"));
    assert!(
        created.iter().any(|l| l.contains("cluster=c1")
            && l.contains("step=apply StatefulSet")
            && l.contains("why=")),
        "no log line for the StatefulSets written: {created:?}"
    );
    exec(&ch, "CREATE TABLE default.kept ON CLUSTER c1 (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/kept', '{replica}') ORDER BY id").await;
    let writer = crate::workload::Workload::start(&client, &ns, "c1").await;
    // each shard gets its own rows, written on one replica and replicated to the other
    let mut kept: BTreeMap<String, u64> = BTreeMap::new();
    for (i, replica) in replicas.iter().enumerate() {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(&c, &format!("INSERT INTO default.kept SELECT {i} * 1000000 + number FROM system.numbers LIMIT {}", 1000 + i)).await;
    }
    drop(op);

    let backups: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    start_backup(&client, &ns, "b1", json!({"clusterName": "c1"})).await;
    let (kills, jobs) = drive_with_kills(&client, &ns, "b1", || {
        let backups = backups.clone();
        async move {
            let s = backups.get("b1").await.ok()?.status?;
            Some(format!("{:?}", s.state))
        }
    })
    .await;
    println!(
        "backup: the operator died after {} steps: {kills:?}",
        kills.len()
    );
    let agents = trail(&format!("namespace={ns}"));
    assert!(
        agents.iter().any(|l| l.contains("kind=ClickHouseBackup")
            && l.contains("name=b1")
            && l.contains("cluster=c1")
            && l.contains("agent job created")),
        "no log line for the agents created: {agents:?}"
    );
    let b = backups.get("b1").await.unwrap().status.unwrap();
    assert_eq!(b.state, BackupState::Succeeded, "{:?}", b.message);
    assert_each_step_survived(
        &kills,
        &jobs,
        &[
            "check the bucket",
            "create the agent of shard 0",
            "create the agent of shard 1",
            "write the manifest of b1",
            "write status Succeeded",
        ],
    );

    // the writer's rows: every acknowledged one on every replica
    let op = start_operator_env(&client, &ns, &[]).await;
    let acked = writer.stop_and_check(&client, &ns).await;
    println!("writer: {acked} batches acknowledged during the backup, each on every replica");
    for replica in &replicas {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(&c, "SYSTEM SYNC REPLICA default.kept").await;
        let n: u64 = query(&c, "SELECT count() AS v FROM default.kept").await[0]
            .parse()
            .unwrap();
        kept.insert(replica.clone(), n);
    }
    exec(&ch, "DROP TABLE default.kept ON CLUSTER c1").await;
    exec(&ch, "DROP TABLE default.events_all ON CLUSTER c1").await;
    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    drop(op);

    let restores: Api<ClickHouseRestore> = Api::namespaced(client.clone(), &ns);
    start_restore(
        &client,
        &ns,
        "r1",
        json!({"clusterName": "c1", "backupName": "b1"}),
    )
    .await;
    let (kills, jobs) = drive_with_kills(&client, &ns, "r1", || {
        let restores = restores.clone();
        async move {
            let s = restores.get("r1").await.ok()?.status?;
            Some(format!("{:?}", s.state))
        }
    })
    .await;
    println!(
        "restore: the operator died after {} steps: {kills:?}",
        kills.len()
    );
    let r = restores.get("r1").await.unwrap().status.unwrap();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    assert_each_step_survived(
        &kills,
        &jobs,
        &[
            "read the manifest of b1",
            "create the agent of shard 0",
            "create the agent of shard 1",
            "write status Succeeded",
        ],
    );
    let op = start_operator_env(&client, &ns, &[]).await;
    wait_for(
        Duration::from_secs(120),
        "the restored rows, exactly, on every replica",
        || {
            let (client, ns, kept) = (client.clone(), ns.clone(), kept.clone());
            async move {
                for (replica, want) in &kept {
                    let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
                    let n = c
                        .query(
                            "SELECT toString(count()) AS v FROM default.kept",
                            &QueryOptions::new(),
                        )
                        .await
                        .ok()?;
                    let v: u64 = n.iter().next()?.str("v").ok()?.parse().ok()?;
                    if v != *want {
                        println!("{replica}: {v} rows of {want}");
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}
