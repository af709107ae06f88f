//! What the servers are asked between passes: to resolve the hosts again, to open a new Keeper
//! session, to copy the schema once every replica serves.

use super::*;

/// Decision 17: for a while after a server pod became Ready (say, restarted with a new
/// address), every Ready server drops its DNS cache, even once the cluster is ready again; that
/// is SQL only, no Kubernetes write.
#[test]
fn a_pod_that_just_became_ready_makes_every_server_resolve_again() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    assert!(sim.plan().steps.is_empty());
    let pod = sim
        .obs
        .pods
        .keys()
        .find(|p| !p.contains("keeper"))
        .unwrap()
        .clone();
    let conditions = sim
        .obs
        .pods
        .get_mut(&pod)
        .unwrap()
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap();
    conditions[0].last_transition_time = Some(Time(now()));
    let p = sim.plan();
    let drops: Vec<&Step> = p
        .steps
        .iter()
        .filter(|a| matches!(a, Step::DropDnsCache { .. }))
        .collect();
    assert_eq!(drops.len(), 2, "{:?}", p.steps);
    assert_eq!(drops.len(), p.steps.len());
    assert!(p.steps.iter().all(|a| !a.writes_kubernetes()));
    assert_eq!(p.status.state, ClusterState::Ready);
}

/// Decision 45: a Ready server whose replicated tables are read-only only because their Keeper
/// session expired (Keeper answers it again) is made to reopen it for those tables, SQL only;
/// a server with no such table is left alone, and a pausing cluster is left alone.
#[test]
fn tables_waiting_only_for_a_new_keeper_session_are_made_to_open_it() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let tables = vec![("db1".to_string(), "events".to_string())];
    sim.obs
        .stalled_tables
        .insert(replica.to_string(), tables.clone());
    let p = sim.plan();
    let restarts: Vec<&Step> = p
        .steps
        .iter()
        .filter(|a| matches!(a, Step::RestartReplicatedTables { .. }))
        .collect();
    assert_eq!(
        restarts,
        vec![&Step::RestartReplicatedTables {
            replica: replica.clone(),
            tables
        }],
        "{:?}",
        p.steps
    );
    assert!(restarts.iter().all(|a| !a.writes_kubernetes()));
    sim.cluster.spec.pause = true;
    let p = sim.plan();
    assert!(
        p.steps
            .iter()
            .all(|a| !matches!(a, Step::RestartReplicatedTables { .. })),
        "{:?}",
        p.steps
    );
}

/// S0-20: a new replica's schema is copied only once every Ready replica serves (they are its
/// sources); meanwhile the status says what it waits for.
#[test]
fn schema_copy_waits_until_every_ready_replica_serves() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    let first = sim.map().keys().next().unwrap().clone();
    sim.cluster.spec.replicas = 2;
    for _ in 0..2 {
        let p = sim.plan();
        sim.act(&p);
    }
    // The first replica's pod is gone (restarting) when the new one is ready for its schema.
    sim.broken.insert(format!("{first}-0"));
    sim.obs.pods.remove(&format!("{first}-0"));
    sim.settle();
    let p = sim.plan();
    assert!(
        !p.steps
            .iter()
            .any(|a| matches!(a, Step::MigrateSchema { .. })),
        "{:?}",
        p.steps
    );
    assert!(
        p.status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("copying the schema waits for"),
        "{:?}",
        p.status.message
    );
    sim.broken.clear();
    sim.obs.pods.remove(&format!("{first}-0"));
    sim.settle();
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// A server that has not loaded the current remote_servers yet, or a Distributed query that
/// does not reach every shard, is something no Kubernetes event announces: the plan asks to be
/// passed again soon (not at the 5 s re-check), and not once every server has loaded it.
#[test]
fn a_server_loading_the_new_hosts_is_checked_again_soon() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
    let p = sim.plan();
    assert!(!p.recheck_soon, "settled: {:?}", p.status.message);
    // c1-0-0 still lists the hosts of before a scale-in
    sim.obs.cluster_hosts.insert("c1-0-0".into(), Some(6));
    let p = sim.plan();
    assert!(p.recheck_soon);
    assert_ne!(p.status.state, ClusterState::Ready);
    assert!(
        p.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("c1-0-0 to load")),
        "{:?}",
        p.status.message
    );
    sim.obs.cluster_hosts.insert("c1-0-0".into(), Some(4));
    let p = sim.plan();
    assert!(!p.recheck_soon, "{:?}", p.status.message);
    assert_eq!(p.status.state, ClusterState::Ready);
    // a shard not reached through a Distributed query yet
    sim.obs
        .distributed
        .insert("c1-1-2".into(), Some("shard 0 not reached".into()));
    assert!(sim.plan().recheck_soon);
}
