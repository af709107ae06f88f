//! Recovery: a wiped status rebuilt from the servers, a cluster created again on retained
//! volumes, every server down, a volume waiting for its pod to start again.

use super::*;

/// docs/operations.md, "What happens on a bad day": a status lost or wiped (`status: {}`) on a
/// running cluster (scaled out and in before, so its next index is past its replicas'): the map is
/// taken back from the server StatefulSets before anything is built, so the pass writes no
/// `remote_servers` without the cluster's hosts, adds no replica, deletes none; the cluster
/// converges back to ready with the same replicas and one backup replica per shard.
#[test]
fn a_wiped_status_is_rebuilt_from_the_servers_before_anything_is_written() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    sim.cluster.spec.replicas = 3;
    sim.converge(40);
    sim.cluster.spec.replicas = 2;
    sim.converge(60);
    assert_eq!(sim.state(), ClusterState::Ready);
    let replicas: Vec<String> = sim.map().keys().map(|k| k.to_string()).collect();
    assert_eq!(replicas.len(), 4, "{replicas:?}");
    let remote = users_secret_file(&sim, crate::model::names::REMOTE_SERVERS_FILE);
    sim.cluster.status = Some(Default::default());
    let p = sim.plan();
    for a in &p.steps {
        match a {
            Step::Apply {
                kind: Kind::Secret, ..
            } => {
                sim.act(&Plan {
                    steps: vec![a.clone()],
                    ..p.clone()
                });
                assert_eq!(
                    users_secret_file(&sim, crate::model::names::REMOTE_SERVERS_FILE),
                    remote,
                    "remote_servers rewritten from a lost map"
                );
            }
            Step::Apply {
                kind: Kind::StatefulSet,
                name,
                ..
            } => {
                assert!(replicas.contains(name), "a new replica {name}")
            }
            Step::Delete { .. } | Step::ScaleIn(_) => panic!("{a:?}"),
            _ => {}
        }
    }
    assert_eq!(
        p.status
            .replica_state_map
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        replicas
    );
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(sim.map().keys().cloned().collect::<Vec<_>>(), replicas);
    for shard in 0..2 {
        assert_eq!(
            sim.map()
                .values()
                .filter(|r| r.shard == crate::api::ShardIndex(shard) && r.is_backup_pod)
                .count(),
            1
        );
    }
    assert_eq!(
        users_secret_file(&sim, crate::model::names::REMOTE_SERVERS_FILE),
        remote
    );
}

/// Decision 30: a cluster deleted with `reclaimPolicy: Retain` and created again with the same name
/// (new UID, no status, no StatefulSet) finds its data PVCs and the credentials Secret handed to
/// them. The first pass takes the Secret over and the replicas back from the volumes (their names,
/// shards and indexes, also where a scale-out numbered them otherwise than a new cluster would),
/// before anything is built: no replica beside the data, none removed, and the cluster converges to
/// ready on the same replicas.
#[test]
fn a_cluster_created_again_on_retained_volumes_takes_back_its_replicas_and_credentials() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    sim.cluster.spec.replicas = 3;
    sim.converge(40);
    let replicas: Vec<String> = sim.map().keys().map(|k| k.to_string()).collect();
    // a scale-out numbers replicas otherwise than a new cluster of 3 replicas would
    assert_eq!(
        replicas,
        ["c1-0-0", "c1-0-1", "c1-0-4", "c1-1-2", "c1-1-3", "c1-1-5"]
    );
    // deleted: everything but the volumes of the remaining replicas (the cleaner took the
    // others) and the Keeper's; the Secret outlives the cluster with them
    sim.obs.statefulsets.clear();
    sim.obs.pods.clear();
    sim.obs.objects.clear();
    sim.obs.pvcs.retain(|name, _| {
        name.contains("keeper") || replicas.iter().any(|r| *name == format!("data-{r}-0"))
    });
    sim.cluster.metadata.uid = Some("uid-2".into());
    sim.cluster.status = None;
    sim.obs.operator_secret_orphaned = true;
    let p = sim.plan();
    assert!(
        p.steps.contains(&Step::AdoptOperatorSecret),
        "{:?}",
        p.steps
    );
    assert!(!p.steps.contains(&Step::CreateOperatorSecret));
    assert_eq!(
        p.status
            .replica_state_map
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        replicas,
        "the replicas of the retained volumes"
    );
    sim.converge(40);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(sim.map().keys().cloned().collect::<Vec<_>>(), replicas);
    assert!(!sim.obs.operator_secret_orphaned);
    let created: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("apply StatefulSet"))
        .collect();
    assert!(!created.is_empty());
}

/// S2-12, the full-crash check: every server pod of a cluster that was ready going down sets
/// the condition `FullCrash` with what is down and puts it first in the message; it clears
/// once a server serves again. A cluster resuming from a pause, its servers not up yet, is no
/// crash.
#[test]
fn every_server_down_after_ready_is_a_full_crash_until_one_serves() {
    use crate::plan::status::FULL_CRASH;
    let crash = |s: &crate::api::ClickHouseClusterStatus| {
        s.conditions
            .iter()
            .find(|c| c.r#type == FULL_CRASH)
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let mut sim =
        Sim::new(serde_json::json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(
        crash(sim.cluster.status.as_ref().unwrap()).unwrap().0,
        "False"
    );
    let servers: Vec<String> = sim.map().keys().map(|r| format!("{r}-0")).collect();
    for pod in &servers {
        sim.broken.insert(pod.clone());
        sim.obs.pods.remove(pod);
    }
    sim.settle();
    let p = sim.plan();
    let (status, message) = crash(&p.status).unwrap();
    assert_eq!(status, "True");
    assert_eq!(
        message,
        "full crash: every server is down (0/4 Ready), recovering them all at once"
    );
    assert!(
        p.status
            .message
            .as_deref()
            .unwrap()
            .starts_with("full crash"),
        "{:?}",
        p.status.message
    );
    sim.act(&p);
    assert_eq!(
        crash(sim.cluster.status.as_ref().unwrap()).unwrap().0,
        "True",
        "it stays"
    );
    sim.broken.clear();
    for pod in &servers {
        sim.obs.pods.remove(pod);
    }
    sim.settle();
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(
        crash(sim.cluster.status.as_ref().unwrap()).unwrap().0,
        "False"
    );
    // paused and resumed: the servers start after Keeper, and that is no crash
    sim.cluster.spec.pause = true;
    sim.converge(30);
    sim.cluster.spec.pause = false;
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        assert_eq!(
            crash(&p.status).unwrap().0,
            "False",
            "{:?}",
            p.status.message
        );
        if p.steps.is_empty() && !p.again {
            break;
        }
        sim.act(&p);
    }
}

/// The data PVC of `replica` grown to 2Gi, its file system waiting for the next mount since
/// `since` (`FileSystemResizePending`, decision 44).
fn waiting_for_a_mount(replica: &str, since: &str) -> PersistentVolumeClaim {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimCondition, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        VolumeResourceRequirements,
    };
    PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: Some(model::names::data_pvc(replica)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("2Gi".into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            conditions: Some(vec![PersistentVolumeClaimCondition {
                type_: "FileSystemResizePending".into(),
                status: "True".into(),
                last_transition_time: Some(Time(since.parse().unwrap())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// Decision 44 on several nodes: each node grows its volumes when it gets to them, so the backup
/// replica's volume can wait for a restart while the other replica's StatefulSet, deleted with
/// its pod kept to be created again for the new volume size, does not exist yet. The rollout
/// waits for it instead of restarting the backup replica alone: the backup replica restarts
/// last, after the other, each once.
#[test]
fn a_shard_whose_statefulset_is_being_created_again_restarts_its_backup_replica_last() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "storage": {"size": "2Gi"}, "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| n.clone())
        .unwrap();
    let other = sim.map().keys().find(|n| **n != backup).cloned().unwrap();
    let started: Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
    for replica in [&backup, &other] {
        let pod = sim.obs.pods.get_mut(&format!("{replica}-0")).unwrap();
        pod.status.get_or_insert_with(Default::default).start_time = Some(Time(started));
        sim.obs.pvcs.insert(
            model::names::data_pvc(replica),
            waiting_for_a_mount(replica, "2026-11-29T01:00:00Z"),
        );
    }
    // the other replica's StatefulSet is being created again: its pod is kept
    assert!(sim.obs.statefulsets.remove(other.as_str()).is_some());
    let first = sim.plan();
    assert!(
        !first.steps.iter().any(|s| matches!(s,
            Step::RestartPod { statefulset: r, .. } if *r == backup)
            || matches!(s, Step::SetServing { replica, .. } if *replica == backup)),
        "the backup replica is left alone while the shard's other StatefulSet is missing: {:?}",
        first.steps
    );
    sim.log.clear();
    sim.converge(40);
    let restarts: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("restart"))
        .collect();
    assert_eq!(restarts.len(), 2, "{:?}", sim.log);
    assert!(restarts[0].contains(&format!("{other}-0")), "{restarts:?}");
    assert!(restarts[1].contains(&format!("{backup}-0")), "{restarts:?}");
}

/// Decision 44: a grown volume whose driver grows the file system only when it is mounted again
/// (`FileSystemResizePending`) does not hold the rollout back, since only a restart completes
/// it: Smart Update restarts the pod that was started before the condition appeared, once,
/// drained and out of traffic first as for a new template; a pod started after it (it has been
/// mounted since) is not restarted, and a condition that stays asks for no second restart.
#[test]
fn a_volume_waiting_for_its_pod_to_start_again_gets_one_careful_restart() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2,
        "storage": {"size": "2Gi"}, "storageScaling": {"enableVolumeScaling": true}}));
    sim.converge(20);
    let replicas: Vec<String> = sim.map().keys().map(|k| k.to_string()).collect();
    let started: Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
    for (replica, since) in [
        (&replicas[0], "2026-11-29T01:00:00Z"),
        (&replicas[1], "2026-11-28T23:00:00Z"),
    ] {
        let pod = sim.obs.pods.get_mut(&format!("{replica}-0")).unwrap();
        pod.status.get_or_insert_with(Default::default).start_time = Some(Time(started));
        sim.obs.pvcs.insert(
            model::names::data_pvc(replica),
            waiting_for_a_mount(replica, since),
        );
    }
    sim.log.clear();
    sim.converge(30);
    let restarts: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("restart"))
        .collect();
    assert_eq!(restarts.len(), 1, "{:?}", sim.log);
    assert!(
        restarts[0].contains(&format!("{}-0", replicas[0])),
        "{restarts:?}"
    );
    let excluded = sim
        .log
        .iter()
        .position(|l| l.contains("traffic") && l.contains(&replicas[0]));
    let restarted = sim.log.iter().position(|l| l.starts_with("restart"));
    assert!(
        excluded.is_some() && excluded < restarted,
        "out of traffic before its restart: {:?}",
        sim.log
    );
}
