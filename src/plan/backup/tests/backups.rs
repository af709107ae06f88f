//! Backups pass by pass: success only after every shard and the manifest, every failure with
//! its reason, refusals and waits before the start, incremental chains in their place, deletion.

use super::*;

/// S0-04, decision 26: New → Starting (the bucket checked, each shard's backup replica
/// recorded) → Running (one agent per shard, beside its backup replica) → Succeeded only once
/// every shard's agent succeeded, in the pass that writes the backup's manifest, last.
#[test]
fn a_backup_succeeds_only_after_every_shard_and_then_its_manifest() {
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Starting);
    assert_eq!(p.events[0].reason, "BackupStarted");
    let recorded: Vec<(i32, String)> = b
        .status
        .as_ref()
        .unwrap()
        .shards
        .iter()
        .map(|s| (s.shard, s.replica.clone()))
        .collect();
    assert_eq!(recorded, [(0, backup_replica(0)), (1, backup_replica(1))]);
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Running);
    assert_eq!(
        sim.created.values().sum::<usize>(),
        2,
        "one agent per shard"
    );
    sim.jobs.insert(0, SimJob::Succeeded);
    for _ in 0..3 {
        let p = sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Running, "shard 1 still runs");
        assert!(p.steps.is_empty(), "nothing created again: {:?}", p.steps);
        assert!(!sim.manifest_written);
    }
    assert!(b.status.as_ref().unwrap().shards[0].done);
    sim.jobs.insert(1, SimJob::Succeeded);
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Succeeded);
    assert!(
        sim.manifest_written,
        "the manifest is written in the pass that succeeds"
    );
    let s = b.status.clone().unwrap();
    assert_eq!(s.bytes_uploaded, 600);
    assert_eq!(
        s.manifest.as_deref(),
        Some("s3://backups/ns/c1/backups/b1/manifest.json")
    );
    assert_eq!(p.events[0].reason, "BackupSucceeded");
    // over: nothing more happens, whatever is observed
    sim.finish_jobs(SimJob::Failed);
    let again = sim.backup_pass(&mut b, usize::MAX);
    assert!(again.steps.is_empty() && again.events.is_empty());
    assert_eq!(b.status.clone().unwrap(), s);
}

/// A manifest write that fails leaves the backup Running (the pass is retried), never
/// Succeeded without its manifest.
#[test]
fn a_backup_whose_manifest_cannot_be_written_is_not_succeeded() {
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    sim.backup_pass(&mut b, usize::MAX);
    sim.backup_pass(&mut b, usize::MAX);
    sim.finish_jobs(SimJob::Succeeded);
    sim.bucket_up = false;
    for _ in 0..3 {
        sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Running);
        assert!(b.status.as_ref().unwrap().manifest.is_none());
    }
    sim.bucket_up = true;
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Succeeded);
}

/// S0-04: a backup replica removed (condemned by a scale-in, or gone from the map)
/// during the backup always fails it, whatever its agent says; no manifest is written.
#[test]
fn a_removed_backup_replica_always_fails_the_backup() {
    for agent in [SimJob::Running, SimJob::Succeeded, SimJob::Failed] {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        sim.backup_pass(&mut b, usize::MAX);
        sim.backup_pass(&mut b, usize::MAX);
        sim.jobs.insert(1, agent.clone());
        sim.condemn(&backup_replica(1));
        sim.jobs.insert(0, SimJob::Succeeded);
        let p = sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Failed, "{agent:?}");
        assert_eq!(reason(&b).as_deref(), Some("ReplicaRemoved"));
        assert!(
            b.status
                .as_ref()
                .unwrap()
                .message
                .as_ref()
                .unwrap()
                .contains("c1-1-0")
        );
        assert_eq!(p.events[0].reason, "BackupFailed");
        assert!(!sim.manifest_written);
    }
}

/// Every way a running shard fails ends the backup Failed with its own reason: its server
/// changed under the agent (even if the agent reports success), its agent cannot start, its
/// agent fails, the pod of its replica is gone before its agent was created, the cluster is
/// deleted.
#[test]
fn every_failure_of_a_running_backup_has_its_reason() {
    let cases: Vec<(&str, Change)> = vec![
        (
            "ServerChanged",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(0, SimJob::Succeeded);
                s.server_changed.insert(0);
            }),
        ),
        (
            "AgentCannotStart",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(0, SimJob::Stuck);
            }),
        ),
        (
            "AgentFailed",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(1, SimJob::Failed);
            }),
        ),
        ("ClusterDeleted", Box::new(|s: &mut Sim| s.cluster = None)),
    ];
    for (expected, change) in cases {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        sim.backup_pass(&mut b, usize::MAX);
        sim.backup_pass(&mut b, usize::MAX);
        change(&mut sim);
        sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Failed, "{expected}");
        assert_eq!(reason(&b).as_deref(), Some(expected));
        assert!(!sim.manifest_written);
    }
    // the replica's pod gone before its agent was created
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    sim.backup_pass(&mut b, usize::MAX);
    sim.pod_gone.insert(backup_replica(1));
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(reason(&b).as_deref(), Some("ServerChanged"));
    assert_eq!(
        sim.created.get(&1),
        None,
        "no agent beside a pod that is gone"
    );
}

/// What refuses a backup before it starts, each with its reason; a missing cluster and
/// missing Ready backup replicas are waited for (the replicas for ten minutes).
#[test]
fn a_backup_is_refused_or_waits_before_it_starts() {
    let refused: Vec<(&str, ChangeBoth)> = vec![
        (
            "Destination",
            Box::new(|_: &mut Sim, b: &mut ClickHouseBackup| {
                b.spec.destination = Some(S3Destination {
                    endpoint: "https://attacker.example".into(),
                    bucket: "loot".into(),
                    secret_name: "c1-operator".into(),
                    access_key_id_key: Some("password".into()),
                    ..S3Destination::default()
                });
            }),
        ),
        (
            "ClusterPaused",
            Box::new(|s: &mut Sim, _: &mut ClickHouseBackup| {
                std::sync::Arc::make_mut(s.cluster.as_mut().unwrap())
                    .spec
                    .pause = true
            }),
        ),
        (
            "Bucket",
            Box::new(|s: &mut Sim, _: &mut ClickHouseBackup| s.bucket_up = false),
        ),
    ];
    for (expected, change) in refused {
        let mut sim = Sim::new();
        let mut b = new_backup(sim.now, false);
        change(&mut sim, &mut b);
        sim.backup_pass(&mut b, usize::MAX);
        assert_eq!(state(&b), BackupState::Failed, "{expected}");
        assert_eq!(reason(&b).as_deref(), Some(expected));
        assert!(sim.created.is_empty());
    }
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    let missing = sim.cluster.take();
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(
        state(&b),
        BackupState::New,
        "a cluster not found yet is waited for"
    );
    assert!(p.requeue.is_some());
    sim.cluster = missing;
    sim.ready.remove(&backup_replica(1));
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::New);
    assert!(p.status.message.unwrap().contains("shard(s) 1"));
    sim.tick(WAIT_FOR_REPLICAS.as_secs() as i64 + 1);
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(reason(&b).as_deref(), Some("NoBackupReplica"));
}

/// An incremental backup builds on the newest earlier successful backup of the same cluster in
/// the same place whose manifest is in the bucket, and says so.
#[test]
fn an_incremental_backup_builds_on_the_newest_complete_one_in_its_place() {
    let mut sim = Sim::new();
    let earlier =
        |name: &str, completed: &str, succeeded, destination: Option<S3Destination>| Earlier {
            name: name.into(),
            cluster: "c1".into(),
            destination,
            succeeded,
            completed: Some(completed.into()),
        };
    let elsewhere = S3Destination {
        prefix: Some("other".into()),
        ..cluster().spec.backup.destination.unwrap()
    };
    sim.others = vec![
        earlier("old", "2026-01-01T00:00:00Z", true, None),
        earlier("newer", "2026-02-01T00:00:00Z", true, None),
        earlier("newest-but-failed", "2026-03-01T00:00:00Z", false, None),
        earlier(
            "newest-elsewhere",
            "2026-03-02T00:00:00Z",
            true,
            Some(elsewhere),
        ),
        earlier("not-in-bucket", "2026-02-15T00:00:00Z", true, None),
    ];
    sim.in_bucket = ["old", "newer", "newest-but-failed", "newest-elsewhere"]
        .into_iter()
        .map(String::from)
        .collect();
    let mut b = new_backup(sim.now, true);
    let p = sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(b.status.as_ref().unwrap().base.as_deref(), Some("newer"));
    assert!(
        p.events[0].message.ends_with(", incremental on newer"),
        "{}",
        p.events[0].message
    );
    let mut full = new_backup(sim.now, false);
    sim.backup_pass(&mut full, usize::MAX);
    assert_eq!(full.status.unwrap().base, None, "a full backup has no base");
}

/// S0-04: each shard's backup runs on its backup replica, and only once that replica's pod
/// is Ready; another replica is never used instead.
#[test]
fn each_shard_is_backed_up_on_its_backup_replica_only() {
    let c = cluster();
    let all = backup::backup_replicas(&c, &|_| true);
    assert_eq!(all[&0].as_deref(), Some("c1-0-0"));
    assert_eq!(all[&1].as_deref(), Some("c1-1-0"));
    let one_down = backup::backup_replicas(&c, &|r| r != "c1-1-0");
    assert_eq!(one_down[&1], None, "not the other replica of the shard");
}

#[test]
fn backups_build_on_each_other_only_in_the_same_place() {
    let d = |endpoint: &str, prefix: Option<&str>| S3Destination {
        endpoint: endpoint.into(),
        bucket: "b".into(),
        prefix: prefix.map(str::to_string),
        secret_name: "s".into(),
        ..S3Destination::default()
    };
    assert!(backup::same_place(
        &d("http://s3/", None),
        &d("http://s3", Some("ns/c1")),
        "ns/c1"
    ));
    assert!(!backup::same_place(
        &d("http://s3", None),
        &d("http://s3", Some("x")),
        "ns/c1"
    ));
    assert!(!backup::same_place(
        &d("http://a", None),
        &d("http://b", None),
        "ns/c1"
    ));
}

/// Decision 26: a deleted backup with `deletionPolicy: Delete` waits for its agents to stop and
/// for backups in flight that build on it, then removes its data where it recorded it was
/// written; one that never started, or whose policy went back to `Retain`, has nothing removed.
#[test]
fn a_deleted_backup_removes_its_data_only_once_nothing_needs_it() {
    use super::take::{Deleting, Deletion, deletion, wants_finalizer};
    let mut sim = Sim::new();
    let mut b = new_backup(sim.now, false);
    assert!(!wants_finalizer(&b), "Retain by default");
    b.spec.deletion_policy = crate::api::DeletionPolicy::Delete;
    assert!(wants_finalizer(&b));
    let idle = Deleting::default();
    assert_eq!(
        deletion(&b, &idle),
        Deletion::Release(None),
        "never started: nothing to remove"
    );
    sim.backup_pass(&mut b, usize::MAX);
    let recorded = b.status.as_ref().unwrap().destination.clone().unwrap();
    assert_eq!(
        recorded.prefix.as_deref(),
        Some("ns/c1"),
        "the prefix is written out"
    );
    let busy = Deleting {
        agents_left: 2,
        dependents: vec![],
    };
    assert!(matches!(deletion(&b, &busy), Deletion::Wait(w) if w.contains("2 agent pod(s)")));
    let built_on = Deleting {
        agents_left: 0,
        dependents: vec!["b2".into()],
    };
    assert!(matches!(deletion(&b, &built_on), Deletion::Wait(w) if w.contains("b2")));
    assert_eq!(
        deletion(&b, &idle),
        Deletion::RemoveData(Box::new(recorded))
    );
    b.spec.deletion_policy = crate::api::DeletionPolicy::Retain;
    assert_eq!(
        deletion(&b, &idle),
        Deletion::Release(None),
        "switched back: kept"
    );
}

/// Decision 26: a cluster with further disks is backed up: each shard's agent mounts the backup
/// replica's disks where the server has them (a freeze snapshots parts on every disk).
#[test]
fn the_agent_of_a_cluster_with_disks_reads_every_disk() {
    let mut sim = Sim::new();
    std::sync::Arc::make_mut(sim.cluster.as_mut().unwrap())
        .spec
        .storage
        .disks = serde_json::from_value(json!([{"name": "cold", "size": "1Gi"}])).unwrap();
    let mut b = new_backup(sim.now, false);
    sim.backup_pass(&mut b, usize::MAX);
    assert_eq!(state(&b), BackupState::Starting);
    let p = sim.backup_pass(&mut b, usize::MAX);
    let Step::CreateAgent(job) = &p.steps[0] else {
        panic!("{:?}", p.steps)
    };
    assert_eq!(job.disks, ["cold"]);
    let built = job.build();
    let pod = built.spec.unwrap().template.spec.unwrap();
    let claims: Vec<String> = pod
        .volumes
        .unwrap()
        .iter()
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    assert_eq!(claims, ["data-c1-0-0-0", "disk-cold-c1-0-0-0"]);
    let mounts: Vec<String> = pod.containers[0]
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_path)
        .collect();
    assert_eq!(
        mounts[1],
        crate::model::names::disk_path("cold").trim_end_matches('/')
    );
}
