//! The Keeper ensemble: grown and shrunk one member at a time, rolled followers first while it
//! is whole, a bad image reverted, started before the servers.

use super::*;

/// Keeper membership changes one member at a time (1 → 3 goes through 2), each step only
/// once every member is Ready.
#[test]
fn keeper_grows_one_member_at_a_time() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}}));
    sim.converge(20);
    sim.cluster.spec.keeper.replicas = 3;
    let mut sizes = Vec::new();
    for _ in 0..10 {
        let p = sim.plan();
        for a in &p.steps {
            if let Step::Apply {
                kind: Kind::StatefulSet,
                name,
                object,
                ..
            } = a
                && name == "c1-keeper"
            {
                sizes.push(object["spec"]["replicas"].as_i64().unwrap());
            }
        }
        if p.steps.is_empty() {
            break;
        }
        sim.act(&p);
    }
    assert_eq!(sizes, [2, 3]);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// The Keeper StatefulSet's replicas and the members its ConfigMap lists, after each pass
/// that wrote either, until nothing is left to do.
fn keeper_steps(sim: &mut Sim, passes: usize) -> Vec<(u32, i64)> {
    let now = |sim: &Sim| {
        let replicas = sim.obs.statefulsets["c1-keeper"].spec.replicas.unwrap_or(0);
        (sim.keeper_listed().unwrap(), replicas as i64)
    };
    let mut last = now(sim);
    let mut steps = Vec::new();
    for _ in 0..passes {
        let p = sim.plan();
        if p.steps.is_empty() {
            break;
        }
        sim.act(&p);
        if now(sim) != last {
            last = now(sim);
            steps.push(last);
        }
    }
    steps
}

/// Decision 25: shrinking Keeper removes a member from the list first and its pod only once
/// every remaining member lists the smaller ensemble; one member at a time (5 → 3).
#[test]
fn keeper_shrinks_the_member_list_before_the_pod_one_member_at_a_time() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 5}}));
    sim.converge(20);
    assert_eq!(sim.ensemble, [1, 2, 3, 4, 5]);
    sim.cluster.spec.keeper.replicas = 3;
    assert_eq!(keeper_steps(&mut sim, 20), [(4, 5), (4, 4), (3, 4), (3, 3)]);
    assert_eq!(sim.ensemble, [1, 2, 3]);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 25: while the remaining members do not list the smaller ensemble (the leader has
/// not applied the change), the leaving member's pod keeps running and the cluster is not
/// `ready`; the status names the member that lags. Once it is applied, the pod goes.
#[test]
fn a_keeper_member_is_not_removed_before_the_others_have_let_it_go() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 3}}));
    sim.converge(20);
    sim.ensemble_frozen = true;
    sim.cluster.spec.keeper.replicas = 1;
    for _ in 0..5 {
        let p = sim.plan();
        sim.act(&p);
    }
    assert_eq!(sim.keeper_listed(), Some(2));
    assert_eq!(sim.obs.statefulsets["c1-keeper"].spec.replicas, Some(3));
    assert!(sim.obs.pods.contains_key("c1-keeper-2"));
    let status = sim.cluster.status.clone().unwrap();
    assert_ne!(status.state, ClusterState::Ready);
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("c1-keeper-0 lists members 1,2,3"),
        "{message}"
    );
    sim.ensemble_frozen = false;
    assert_eq!(keeper_steps(&mut sim, 20), [(2, 2), (1, 2), (1, 1)]);
    sim.converge(10);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 25: growing adds the next member only once every member lists the one added
/// before; a member the leader has not added yet holds the growth (and `ready`) back.
#[test]
fn keeper_growth_waits_until_every_member_lists_the_member_added() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}}));
    sim.converge(20);
    sim.ensemble_frozen = true;
    sim.cluster.spec.keeper.replicas = 3;
    for _ in 0..5 {
        let p = sim.plan();
        sim.act(&p);
    }
    assert_eq!(sim.obs.statefulsets["c1-keeper"].spec.replicas, Some(2));
    assert_eq!(sim.keeper_listed(), Some(2));
    let message = sim
        .cluster
        .status
        .clone()
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(message.contains("lists members 1"), "{message}");
    sim.ensemble_frozen = false;
    assert_eq!(keeper_steps(&mut sim, 20), [(3, 3)]);
    sim.converge(10);
    assert_eq!(sim.ensemble, [1, 2, 3]);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 5 for Keeper: a member stuck on a bad revision (the StatefulSet's own rolling
/// update never replaces a pod that is not Ready) is replaced once the spec is reverted, and
/// deleted once, not again while it stops.
#[test]
fn reverting_a_bad_keeper_image_replaces_the_stuck_member() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    assert_eq!(sim.keeper_leader.as_deref(), Some("c1-keeper-2"));
    let good = sim.cluster.spec.keeper.image.clone();
    sim.bad_image = Some("registry.invalid/keeper:bad".into());
    sim.cluster.spec.keeper.image = "registry.invalid/keeper:bad".into();
    // the roll restarts a follower first (the highest ordinal that follows); it never becomes
    // Ready, and the roll goes no further
    for _ in 0..4 {
        let p = sim.plan();
        sim.act(&p);
    }
    assert!(!crate::plan::facts::pod_ready(&sim.obs.pods["c1-keeper-1"]));
    assert_eq!(keeper_restarts(&sim.log), ["c1-keeper-1"]);
    assert!(
        sim.cluster
            .status
            .as_ref()
            .unwrap()
            .message
            .as_deref()
            .unwrap_or("")
            .contains("waiting for c1-keeper-1 to serve"),
        "{:?}",
        sim.cluster.status
    );
    sim.cluster.spec.keeper.image = good;
    let p = sim.plan();
    sim.act(&p);
    let p = sim.plan();
    assert!(
        p.steps
            .iter()
            .any(|a| matches!(a, Step::RestartPod { pod, .. } if pod == "c1-keeper-1")),
        "{:?}",
        p.steps
    );
    // while the deleted member still stops, it is not deleted again
    let mut stopping = sim.obs.pods["c1-keeper-1"].clone();
    stopping.metadata.deletion_timestamp = Some(Time(now()));
    sim.obs.pods.insert("c1-keeper-1".into(), stopping);
    let again = sim.plan();
    assert!(
        !again
            .steps
            .iter()
            .any(|a| matches!(a, Step::RestartPod { pod, .. } if pod == "c1-keeper-1")),
        "{:?}",
        again.steps
    );
    sim.act(&p);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    // the leader was never restarted
    assert_eq!(keeper_restarts(&sim.log), ["c1-keeper-1", "c1-keeper-1"]);
}

fn keeper_restarts(log: &[String]) -> Vec<&str> {
    log.iter()
        .filter_map(|l| l.strip_prefix("restart pod "))
        .filter(|p| p.contains("keeper"))
        .collect()
}

/// Decision 31: five Keeper template changes in a row, one pass apart (faster than a roll
/// goes): the operator restarts one member per pass, followers first (highest ordinal first)
/// and the leader last, coalescing to the newest template: the leader is restarted once, so
/// the ensemble changes leader once; every member ends on the newest revision, and `ready`.
#[test]
fn rapid_keeper_changes_roll_followers_first_and_the_leader_once_at_the_end() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
    sim.converge(20);
    assert_eq!(sim.keeper_leader.as_deref(), Some("c1-keeper-2"));
    let before = sim.log.len();
    for i in 0..5 {
        sim.cluster.spec.keeper.pod.annotations =
            BTreeMap::from([("example.com/change".to_string(), i.to_string())]);
        let p = sim.plan();
        let restarts = p
            .steps
            .iter()
            .filter(|a| matches!(a, Step::RestartPod { .. }))
            .count();
        assert!(restarts <= 1, "{:?}", p.steps);
        sim.act(&p);
    }
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    let log = &sim.log[before..];
    let restarts = keeper_restarts(log);
    assert_eq!(
        restarts.iter().filter(|p| **p == "c1-keeper-2").count(),
        1,
        "the leader restarts once: {restarts:?}"
    );
    assert_eq!(restarts.last(), Some(&"c1-keeper-2"), "{restarts:?}");
    let elections: Vec<&String> = log
        .iter()
        .filter(|l| l.starts_with("keeper leader"))
        .collect();
    assert_eq!(elections.len(), 1, "{elections:?}");
    // followers: at most once per change they lag behind
    assert!(restarts.len() <= 1 + 2 * 5, "{restarts:?}");
    let sts = &sim.obs.statefulsets["c1-keeper"];
    let rev = sts.status.as_ref().unwrap().update_revision.clone();
    for i in 0..3 {
        let p = &sim.obs.pods[&format!("c1-keeper-{i}")];
        assert_eq!(
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .get("controller-revision-hash"),
            rev.as_ref()
        );
    }
}

/// Decision 31, the gate: a member goes only while every member is Ready and not stopping,
/// the leader reports every follower synced and every role is known; followers before the
/// leader; one member alone goes at once.
#[test]
fn a_keeper_member_is_rolled_only_while_the_ensemble_is_whole_and_synced() {
    use crate::plan::facts::{KeeperFacts, KeeperMember, KeeperRole};
    let member = |i: i32, role: KeeperRole, old: bool| KeeperMember {
        pod: format!("c1-keeper-{i}"),
        ready: true,
        ready_since: Some(now() - k8s_openapi::jiff::SignedDuration::from_secs(60)),
        old_revision: old,
        current: !old,
        role,
        ..KeeperMember::default()
    };
    let leader = |n| KeeperRole::Leader {
        synced_followers: n,
    };
    let facts = |ms: Vec<KeeperMember>| KeeperFacts {
        exists: true,
        size: ms.len() as i32,
        members: ms
            .into_iter()
            .enumerate()
            .map(|(i, m)| (i as i32, m))
            .collect(),
        views_read: true,
        ..KeeperFacts::default()
    };
    let f = KeeperRole::Follower;
    let pick = |k: &KeeperFacts| crate::plan::pass::keeper::next_to_roll(k, now()).map(|m| m.pod);
    // followers first, the highest ordinal first
    let k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, true),
    ]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-2");
    // then the other follower, the leader last
    let k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-0");
    let mut k = facts(vec![
        member(0, f, false),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-1");
    // the leader only once every follower has run the new template for a while (a change
    // coming faster restarts the followers again, the leader once)
    k.members.get_mut(&0).unwrap().ready_since =
        Some(now() - k8s_openapi::jiff::SignedDuration::from_secs(5));
    assert!(
        pick(&k).unwrap_err().contains("c1-keeper-0 has not"),
        "{:?}",
        pick(&k)
    );
    // the restarted follower has not synced yet
    let k = facts(vec![
        member(0, f, true),
        member(1, leader(1), true),
        member(2, f, false),
    ]);
    assert!(
        pick(&k).unwrap_err().contains("synced (1 of 2"),
        "{:?}",
        pick(&k)
    );
    // a member not Ready, or stopping
    let mut k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    k.members.get_mut(&2).unwrap().ready = false;
    assert!(pick(&k).unwrap_err().contains("c1-keeper-2 to serve"));
    k.members.get_mut(&2).unwrap().ready = true;
    k.members.get_mut(&2).unwrap().terminating = true;
    assert!(pick(&k).unwrap_err().contains("c1-keeper-2 to stop"));
    // a pod missing, no leader known, a role not known
    let mut k = facts(vec![
        member(0, f, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    k.members.remove(&2);
    k.size = 3;
    assert!(pick(&k).is_err());
    let k = facts(vec![
        member(0, f, true),
        member(1, f, true),
        member(2, f, false),
    ]);
    assert!(pick(&k).unwrap_err().contains("leader"));
    let k = facts(vec![
        member(0, KeeperRole::Unknown, true),
        member(1, leader(2), true),
        member(2, f, false),
    ]);
    assert!(
        pick(&k)
            .unwrap_err()
            .contains("c1-keeper-0 to report its role")
    );
    // one member: nobody to wait for
    let k = facts(vec![member(0, KeeperRole::Standalone, true)]);
    assert_eq!(pick(&k).unwrap(), "c1-keeper-0");
}

/// `mntr` answers of ClickHouse Keeper and ZooKeeper read as roles; a member that is not
/// serving answers prose.
#[test]
fn keeper_roles_are_read_from_mntr() {
    use crate::plan::facts::KeeperRole;
    let leader =
        "zk_version\tv24.8\nzk_server_state\tleader\nzk_followers\t2\nzk_synced_followers\t1\n";
    assert_eq!(
        KeeperRole::from_mntr(leader),
        KeeperRole::Leader {
            synced_followers: 1
        }
    );
    assert_eq!(
        KeeperRole::from_mntr("zk_server_state\tfollower\n"),
        KeeperRole::Follower
    );
    assert_eq!(
        KeeperRole::from_mntr("zk_server_state\tstandalone\n"),
        KeeperRole::Standalone
    );
    assert_eq!(
        KeeperRole::from_mntr("This ZooKeeper instance is not currently serving requests\n"),
        KeeperRole::Unknown
    );
}

/// The StatefulSets a plan starts (writes with more than zero pods).
fn started(p: &Plan) -> Vec<&String> {
    p.steps
        .iter()
        .filter_map(|a| match a {
            Step::Apply {
                kind: Kind::StatefulSet,
                name,
                object,
                ..
            } if object["spec"]["replicas"].as_i64() != Some(0) => Some(name),
            _ => None,
        })
        .collect()
}

/// Passes with Keeper's pods never Ready: the server StatefulSets that exist afterwards.
/// [`keeper_comes_up`] ends it.
fn servers_without_keeper(sim: &mut Sim) -> Vec<String> {
    for i in 0..3 {
        sim.broken.insert(format!("c1-keeper-{i}"));
    }
    for _ in 0..4 {
        let p = sim.plan();
        sim.act(&p);
    }
    sim.obs
        .statefulsets
        .keys()
        .filter(|n| !n.contains("keeper"))
        .cloned()
        .collect()
}

/// Keeper's pods start again, Ready this time.
fn keeper_comes_up(sim: &mut Sim) {
    sim.broken.clear();
    sim.obs.pods.retain(|p, _| !p.contains("keeper"));
    sim.settle();
}

/// Decision 58: servers of a version that gives its DDL queue up when Keeper cannot be reached
/// at start (18.16, anything before 21.3), or of a version the operator cannot tell
/// (`latest`), start only once Keeper serves, on creation and when resuming after a pause.
#[test]
fn servers_that_give_up_on_a_missing_keeper_start_after_it() {
    for image in [
        "clickhouse/clickhouse-server:18.16.1",
        "clickhouse/clickhouse-server:21.2",
        "clickhouse/clickhouse-server:latest",
    ] {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "image": image}));
        assert_eq!(
            servers_without_keeper(&mut sim),
            Vec::<String>::new(),
            "{image}"
        );
        let message = sim.cluster.status.as_ref().unwrap().message.clone();
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.contains("waiting for Keeper")),
            "{image}: {message:?}"
        );
        keeper_comes_up(&mut sim);
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Ready, "{image}");
        sim.cluster.spec.pause = true;
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Paused);
        sim.cluster.spec.pause = false;
        let p = sim.plan();
        assert_eq!(started(&p), ["c1-keeper"], "{image}: {:?}", p.steps);
        sim.act(&p);
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Ready, "{image}");
    }
}

/// Decision 58: servers of a version that keeps trying a Keeper that does not serve yet
/// (21.3 on) start beside their own Keeper ensemble, before it serves, on creation and on
/// resume; the cluster is `ready` only once Keeper is. The lowest version the servers report
/// wins over the tag: servers seen running 18.16 under a 24.8 tag wait for Keeper again.
#[test]
fn servers_that_keep_trying_keeper_start_beside_it() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2,
        "image": "clickhouse/clickhouse-server:24.8"}));
    assert_eq!(
        servers_without_keeper(&mut sim),
        ["c1-0-0", "c1-0-1", "c1-1-2", "c1-1-3"]
    );
    assert_ne!(sim.state(), ClusterState::Ready);
    keeper_comes_up(&mut sim);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    sim.cluster.spec.pause = true;
    sim.converge(20);
    sim.cluster.spec.pause = false;
    let p = sim.plan();
    assert_eq!(started(&p).len(), 5, "{:?}", p.steps);
    sim.act(&p);
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);

    sim.server_version = Some("18.16.1".into());
    sim.converge(20);
    sim.cluster.spec.pause = true;
    sim.converge(20);
    sim.cluster.spec.pause = false;
    let p = sim.plan();
    assert_eq!(started(&p), ["c1-keeper"], "{:?}", p.steps);
}

/// Issue 52 item 6, decision 67: the Keeper launch fixes held back from a running ensemble
/// (invariant 9: its pods keep the command, data directory and startup budget an earlier
/// version wrote) are written as soon as a member crash-loops on that template, so that the
/// member, replaced on the next pass, can start; while every member runs, nothing is written.
#[test]
fn a_crash_looping_keeper_member_gets_the_launch_fixes_held_back_from_a_running_ensemble() {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus};
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}}));
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    // the template an earlier version wrote
    let sts = sim.obs.statefulsets.get_mut("c1-keeper").unwrap();
    let earlier = crate::model::with_deferred_keeper_launch(json_of(&sts.spec.template), None);
    sts.spec.template = serde_json::from_value(earlier).unwrap();
    let keeper_template = |p: &Plan| {
        p.steps.iter().find_map(|a| match a {
            Step::Apply {
                kind: Kind::StatefulSet,
                name,
                object,
                ..
            } if name == "c1-keeper" => Some(object["spec"]["template"].clone()),
            _ => None,
        })
    };
    let running = sim.plan();
    assert!(
        keeper_template(&running).is_none_or(|t| t["spec"]["containers"][0]["command"][2]
            .as_str()
            .is_some_and(|c| c.contains("${HOSTNAME##*-}"))),
        "a running ensemble keeps its template: {:?}",
        running.steps
    );
    // the member crash-loops
    let pod = sim.obs.pods.get_mut("c1-keeper-0").unwrap();
    let st = pod.status.as_mut().unwrap();
    st.conditions.as_mut().unwrap()[0].status = "False".into();
    st.container_statuses = Some(vec![ContainerStatus {
        name: "keeper".into(),
        restart_count: 4,
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                message: Some("back-off 40s restarting failed container".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let p = sim.plan();
    let t = keeper_template(&p).expect("the Keeper StatefulSet is written");
    let c = &t["spec"]["containers"][0];
    assert_eq!(
        c["command"],
        serde_json::json!(crate::model::keeper::keeper_command())
    );
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == crate::model::keeper::DATA_DIR_ENV),
        "{c}"
    );
    assert_eq!(
        c["startupProbe"]["periodSeconds"],
        crate::api::KEEPER_DEFAULT_STARTUP_PERIOD
    );
    assert!(
        p.events.iter().any(|e| e.action == "RepairKeeper"),
        "{:?}",
        p.events
    );
}
