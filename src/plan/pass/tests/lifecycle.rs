//! A cluster's life in passes: it converges and then nothing happens, scales out and in,
//! pauses and resumes, and each pass emits its steps in the order of the phases.

use super::*;

/// A new cluster converges to ready; a pass over the settled cluster does nothing at all.
#[test]
fn new_cluster_converges_and_then_nothing_happens() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    assert_eq!(sim.map().len(), 4);
    assert!(sim.map().values().all(|r| r.state == ReplicaState::Ready));
    let p = sim.plan();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    assert_eq!(p.status, sim.cluster.status.clone().unwrap());
}

/// S0-19 / S0-16: new entries are persisted before their StatefulSets exist, then every new
/// StatefulSet is created in the same pass.
#[test]
fn scale_out_persists_the_map_then_creates_every_statefulset_in_one_pass() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    sim.cluster.spec.replicas = 4;
    let p = sim.plan();
    assert!(p.again);
    assert!(
        !p.steps.iter().any(|a| matches!(
            a,
            Step::Apply {
                kind: Kind::StatefulSet,
                ..
            }
        )),
        "{:?}",
        p.steps
    );
    assert_eq!(
        p.status
            .replica_state_map
            .values()
            .filter(|r| r.state == ReplicaState::Pending)
            .count(),
        3
    );
    sim.act(&p);
    let p = sim.plan();
    let created: Vec<&String> = statefulsets_applied(&p);
    assert_eq!(created.len(), 3, "{:?}", p.steps);
    sim.act(&p);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(sim.map().len(), 4);
}

/// S0-21…S0-30: scale-in condemns, then runs the steps in order, and the map ends clean.
#[test]
fn scale_in_runs_the_steps_in_order() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    sim.cluster.spec.replicas = 1;
    sim.log.clear();
    sim.converge(20);
    assert_eq!(sim.map().len(), 1);
    assert!(
        sim.map().contains_key(&backup),
        "the backup replica survives (S0-14)"
    );
    let order: Vec<&str> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("scale-in"))
        .map(|l| l.split(['{', ' ']).nth(1).unwrap_or(""))
        .collect();
    let pos = |k: &str| order.iter().position(|s| s.starts_with(k)).unwrap();
    assert!(pos("LeaveTraffic") < pos("SyncShard"));
    assert!(pos("SyncShard") < pos("DropObjects"));
    assert!(pos("DropObjects") < pos("DeleteStatefulSet"));
    assert!(pos("DeleteStatefulSet") < pos("DropKeeperMetadata"));
    assert!(pos("DropKeeperMetadata") < pos("LabelPvcsAndForget"));
    assert_eq!(sim.state(), ClusterState::Ready);
    assert_eq!(
        sim.obs
            .statefulsets
            .keys()
            .filter(|k| !k.ends_with("keeper"))
            .count(),
        1
    );
}

/// S0-03 / S2-21 / S2-22: pause stops every StatefulSet at once and says stopping, then
/// paused; resume brings the cluster back to ready.
#[test]
fn pause_and_resume() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.pause = true;
    let p = sim.plan();
    let stopped = p
        .steps
        .iter()
        .filter(|a| {
            matches!(
                a,
                Step::Apply {
                    kind: Kind::StatefulSet,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        stopped, 3,
        "both servers and Keeper in one pass: {:?}",
        p.steps
    );
    assert_eq!(p.status.state, ClusterState::Stopping);
    sim.act(&p);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Paused);
    assert!(sim.map().values().all(|r| r.state == ReplicaState::Stopped));
    sim.cluster.spec.pause = false;
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// S0-24: a broken survivor defers the scale-in; nothing is deleted and the status says why.
#[test]
fn scale_in_waits_for_every_statefulset() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    let pod = format!("{backup}-0");
    sim.broken.insert(pod.clone());
    sim.obs.pods.remove(&pod);
    sim.settle();
    sim.cluster.spec.replicas = 2;
    for _ in 0..5 {
        let p = sim.plan();
        assert!(
            !p.steps
                .iter()
                .any(|a| matches!(a, Step::ScaleIn(ScaleInAction::DeleteStatefulSet { .. })))
        );
        sim.act(&p);
    }
    let msg = sim.message();
    assert!(msg.contains(backup.as_str()), "{msg}");
    sim.broken.clear();
    sim.obs.pods.remove(&pod);
    sim.settle();
    sim.converge(20);
    assert_eq!(sim.map().len(), 2);
}

/// S2-09: every pass emits its steps in the order of the phases: a new cluster's first pass
/// applies Keeper, then the server configuration, then the Services; the pass that creates the
/// server StatefulSets writes their ConfigMaps first.
#[test]
fn a_pass_emits_its_steps_in_the_order_of_the_phases() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    let mut passes: Vec<Vec<(Phase, Kind, String)>> = Vec::new();
    for _ in 0..20 {
        let p = sim.plan();
        let mut sorted = p.phases.clone();
        sorted.sort();
        assert_eq!(p.phases, sorted, "{:?}", p.steps);
        assert_eq!(p.phases.len(), p.steps.len());
        passes.push(
            p.phases
                .iter()
                .zip(&p.steps)
                .filter_map(|(phase, a)| match a {
                    Step::Apply { kind, name, .. } => Some((*phase, *kind, name.clone())),
                    _ => None,
                })
                .collect(),
        );
        if p.steps.is_empty() && !p.again {
            sim.cluster.status = Some(p.status);
            break;
        }
        sim.act(&p);
    }
    let at = |pass: &[(Phase, Kind, String)], kind: Kind, name: &str| {
        pass.iter()
            .position(|(_, k, n)| *k == kind && n == name)
            .unwrap_or_else(|| panic!("{kind:?} {name} in {pass:?}"))
    };
    let first = &passes[0];
    assert!(at(first, Kind::StatefulSet, "c1-keeper") < at(first, Kind::ConfigMap, "c1-common"));
    assert!(at(first, Kind::Secret, "c1-users") < at(first, Kind::Service, "c1-headless"));
    let creating = passes
        .iter()
        .find(|p| {
            p.iter()
                .any(|(_, k, n)| *k == Kind::StatefulSet && n == "c1-0-0")
        })
        .expect("a pass creates the server StatefulSets");
    assert!(at(creating, Kind::ConfigMap, "c1-0-0") < at(creating, Kind::StatefulSet, "c1-0-0"));
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Invariant 1, against stale observations: a pass planned from a status older than the
/// StatefulSet of a just-added replica (the map in it lacks the replica) deletes nothing of it.
#[test]
fn a_stale_map_never_deletes_a_server_statefulset() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let stale = sim.cluster.status.clone();
    sim.cluster.spec.replicas = 2;
    sim.converge(20);
    assert_eq!(sim.map().len(), 2);
    let added: Vec<String> = sim
        .map()
        .keys()
        .filter(|n| !stale.as_ref().unwrap().replica_state_map.contains_key(*n))
        .map(|n| n.to_string())
        .collect();
    sim.cluster.status = stale;
    let p = sim.plan();
    for a in &p.steps {
        if let Step::Delete { name, .. } = a {
            assert!(
                !added.contains(name),
                "deletes {name} of the new replica: {:?}",
                p.steps
            );
        }
    }
}

/// A pass whose step keeps failing reports the same status every time (no condition flips, so
/// no status write re-triggers the pass at once: it waits for its backoff).
#[test]
fn a_step_failing_the_same_way_reports_the_same_status() {
    use crate::plan::{Failure, FailureReason};
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    sim.cluster.spec.replicas = 2;
    let mut last = None;
    for i in 0..4 {
        let p = sim.plan();
        let outcome = Outcome {
            failure: Some(Failure {
                reason: FailureReason::ClickHouse,
                message: "a step failed: Session expired".into(),
            }),
            ..Outcome::default()
        };
        let later = now() + k8s_openapi::jiff::SignedDuration::from_secs(i);
        let (status, _) = report(&p, &outcome, sim.cluster.metadata.generation, later);
        if i >= 2 {
            assert_eq!(Some(&status), last.as_ref(), "pass {i}");
        }
        last = Some(status.clone());
        sim.cluster.status = Some(status);
    }
}

/// Invariant 4: a field the spec no longer sets (a node selector removed, say by a revert)
/// leaves the StatefulSets too, servers (rolled) and Keeper alike.
#[test]
fn a_removed_field_leaves_the_statefulsets() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let selector = BTreeMap::from([("example.com/zone".to_string(), "a".to_string())]);
    sim.cluster.spec.pod.node_selector = selector.clone();
    sim.cluster.spec.keeper.pod.node_selector = selector;
    sim.converge(40);
    let has_selector = |sim: &Sim| {
        sim.obs
            .statefulsets
            .values()
            .filter(|s| json_of(&s.spec)["template"]["spec"]["nodeSelector"].is_object())
            .count()
    };
    assert_eq!(has_selector(&sim), 3);
    sim.cluster.spec.pod.node_selector.clear();
    sim.cluster.spec.keeper.pod.node_selector.clear();
    sim.log.clear();
    sim.converge(40);
    assert_eq!(has_selector(&sim), 0, "{:?}", sim.log);
    assert_eq!(server_restarts(&sim.log).len(), 2, "{:?}", sim.log);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 77: a shard removed while a backup reads from it waits for the backup to end: no
/// replica of it is condemned and the status names the backup and the replica; once the
/// backup is over the shard is removed.
#[test]
fn a_shard_removal_waits_for_the_backup_that_reads_from_it() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 1}));
    sim.converge(20);
    let (reader, _) = sim
        .map()
        .iter()
        .find(|(_, r)| r.shard.get() == 1)
        .map(|(n, r)| (n.to_string(), r.clone()))
        .unwrap();
    sim.obs.backup_in_flight = Some("b1".into());
    sim.obs.backup_reads = [(reader.clone(), "backup b1".to_string())].into();
    sim.cluster
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("clickhouse.com/allow-data-loss".into(), "true".into());
    sim.cluster.spec.shards = 1;
    for _ in 0..5 {
        let p = sim.plan();
        sim.act(&p);
        assert!(
            sim.map()
                .values()
                .all(|r| r.state != ReplicaState::Condemned),
            "{:?}",
            sim.map()
        );
    }
    let msg = sim.message();
    assert!(
        msg.contains(&format!(
            "removing shard 1 waits for backup b1 to end: it reads from {reader}"
        )),
        "{msg}"
    );
    assert_ne!(sim.state(), ClusterState::Ready);
    sim.obs.backup_in_flight = None;
    sim.obs.backup_reads.clear();
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(!sim.map().contains_key(reader.as_str()));
}

/// Decision 77: a replacement of the replica a backup reads from waits (it is not refused):
/// the cluster is not ready and says what waits; once the backup is over the replica is
/// replaced.
#[test]
fn a_replacement_of_the_replica_a_backup_reads_from_waits_for_the_backup() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let reader = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| n.to_string())
        .unwrap();
    sim.obs.backup_in_flight = Some("b1".into());
    sim.cluster
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("clickhouse.com/replace-replicas".into(), reader.clone());
    for _ in 0..3 {
        let p = sim.plan();
        sim.act(&p);
        assert_eq!(sim.map()[reader.as_str()].state, ReplicaState::Ready);
        assert_eq!(sim.map().len(), 2, "no replacement added yet");
    }
    let msg = sim.message();
    assert!(
        msg.contains(&format!(
            "replacing {reader} waits for backup b1 to end: it reads from {reader}"
        )),
        "{msg}"
    );
    assert_ne!(sim.state(), ClusterState::Ready);
    let status = sim.cluster.status.as_ref().unwrap();
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.reason != "ReplacementRefused")
    );
    sim.obs.backup_in_flight = None;
    sim.converge(30);
    assert!(!sim.map().contains_key(reader.as_str()));
    assert_eq!(sim.state(), ClusterState::Ready);
}
