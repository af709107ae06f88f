//! Restores pass by pass: one agent per shard once the backup is complete, every failure with
//! its reason, an agent that cannot start.

use super::*;

fn restore_state(r: &ClickHouseRestore) -> RestoreState {
    r.status.as_ref().map(|s| s.state).unwrap_or_default()
}

fn succeeded_backup() -> Option<NamedBackup> {
    Some(NamedBackup {
        state: BackupState::Succeeded,
        cluster: "c1".into(),
        destination: None,
    })
}

/// Decision 13: a restore waits for its backup to finish, reads and checks the backup's manifest
/// once every shard has a Ready backup replica, runs one agent per shard on it (the schema also
/// goes to the shard's other replica), and succeeds once every agent has.
#[test]
fn a_restore_runs_one_agent_per_shard_once_its_backup_is_complete() {
    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    let running = Some(NamedBackup {
        state: BackupState::Running,
        ..succeeded_backup().unwrap()
    });
    sim.restore_pass(&mut r, running, 2);
    assert_eq!(restore_state(&r), RestoreState::New);
    assert!(
        r.status
            .as_ref()
            .unwrap()
            .message
            .as_ref()
            .unwrap()
            .contains("waiting for backup b0")
    );
    let p = sim.restore_pass(&mut r, succeeded_backup(), 2);
    assert_eq!(restore_state(&r), RestoreState::Running);
    assert_eq!(sim.steps_seen, ["ReadManifest"]);
    assert!(
        p.events[0]
            .message
            .starts_with("restoring s3://backups/ns/c1/backups/b0 into c1")
    );
    let p = sim.restore_pass(&mut r, succeeded_backup(), 2);
    let peers: Vec<Vec<String>> = p
        .steps
        .iter()
        .map(|s| match s {
            Step::CreateAgent(j) => j.peers.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        peers,
        [vec!["c1-0-1".to_string()], vec!["c1-1-1".to_string()]]
    );
    sim.finish_jobs(SimJob::Succeeded);
    let p = sim.restore_pass(&mut r, succeeded_backup(), 2);
    assert_eq!(restore_state(&r), RestoreState::Succeeded);
    assert_eq!(p.events[0].reason, "RestoreSucceeded");
    assert_eq!(r.status.unwrap().bytes_downloaded, 600);
}

/// Every way a restore fails has its reason: a failed backup, a backup of another number of
/// shards, a bucket that does not answer, a place the cluster does not name, a replica that
/// leaves, an agent that fails.
#[test]
fn every_failure_of_a_restore_has_its_reason() {
    let failed = Some(NamedBackup {
        state: BackupState::Failed,
        ..succeeded_backup().unwrap()
    });
    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    sim.restore_pass(&mut r, failed, 2);
    assert_eq!(
        r.status.as_ref().unwrap().reason.as_deref(),
        Some("BackupNotUsable")
    );

    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    sim.restore_pass(&mut r, succeeded_backup(), 3);
    assert_eq!(
        r.status.as_ref().unwrap().reason.as_deref(),
        Some("ShardCount")
    );
    assert!(sim.created.is_empty());

    let mut sim = Sim::new();
    sim.bucket_up = false;
    let mut r = new_restore(sim.now);
    sim.restore_pass(&mut r, succeeded_backup(), 2);
    assert_eq!(r.status.as_ref().unwrap().reason.as_deref(), Some("Bucket"));

    let mut sim = Sim::new();
    let mut r = new_restore(sim.now);
    r.spec.destination = Some(S3Destination {
        endpoint: "https://attacker.example".into(),
        bucket: "crafted".into(),
        secret_name: "s3-creds".into(),
        ..S3Destination::default()
    });
    sim.restore_pass(&mut r, None, 2);
    assert_eq!(
        r.status.as_ref().unwrap().reason.as_deref(),
        Some("Destination")
    );

    for (expected, change) in [
        (
            "ReplicaRemoved",
            Box::new(|s: &mut Sim| s.condemn(&backup_replica(0))) as Box<dyn Fn(&mut Sim)>,
        ),
        (
            "AgentFailed",
            Box::new(|s: &mut Sim| {
                s.jobs.insert(0, SimJob::Failed);
            }),
        ),
        (
            "ServerChanged",
            Box::new(|s: &mut Sim| {
                s.server_changed.insert(1);
            }),
        ),
    ] {
        let mut sim = Sim::new();
        let mut r = new_restore(sim.now);
        sim.restore_pass(&mut r, succeeded_backup(), 2);
        sim.restore_pass(&mut r, succeeded_backup(), 2);
        change(&mut sim);
        sim.restore_pass(&mut r, succeeded_backup(), 2);
        assert_eq!(restore_state(&r), RestoreState::Failed, "{expected}");
        assert_eq!(r.status.as_ref().unwrap().reason.as_deref(), Some(expected));
    }
}

/// Every failure reason has its own label, and the label is what the status says.
#[test]
fn failure_reasons_have_distinct_labels() {
    let labels: BTreeSet<&str> = FailureReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels.len(), FailureReason::ALL.len());
}

/// An agent's pod that cannot pull its image fails its backup once the grace is over, not
/// before; a pod that runs is never called stuck; the report says what failed.
#[test]
fn an_agent_that_cannot_start_is_reported_after_the_grace() {
    let created = Timestamp::now();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "b-backup-0-x", "creationTimestamp": created.to_string()},
        "status": {"containerStatuses": [{"name": "agent", "image": "x", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}]}
    }))
    .unwrap();
    assert_eq!(stuck(&pod, created), None, "within the grace");
    let later = created + SignedDuration::from_secs(AGENT_START_GRACE);
    assert_eq!(
        stuck(&pod, later).as_deref(),
        Some("ErrImagePull: no such image")
    );
    let mut running = pod.clone();
    running
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state = Some(Default::default());
    assert_eq!(stuck(&running, later), None);

    let ok = serde_json::to_string(&Report {
        ok: true,
        bytes_uploaded: 5,
        ..Report::default()
    })
    .unwrap();
    assert_eq!(outcome(Some(&ok)).unwrap().bytes_uploaded, 5);
    let bad = serde_json::to_string(&Report {
        ok: false,
        error: Some("freezing db.t: Code: 60".into()),
        ..Report::default()
    })
    .unwrap();
    assert_eq!(outcome(Some(&bad)).unwrap_err(), "freezing db.t: Code: 60");
    assert!(outcome(None).is_err());
    assert_eq!(
        outcome(Some("line one\nthread main panicked")).unwrap_err(),
        "thread main panicked"
    );
}
