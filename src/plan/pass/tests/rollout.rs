//! Rolling the servers: one replica at a time, a canary first, catch-up, what restarts and
//! what does not, a bad image reverted, and pods whose StatefulSet status lags.

use super::*;

/// S0-17 / S2-28: an image change restarts one replica at a time, newest first, backup last.
#[test]
fn image_change_rolls_one_replica_at_a_time() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
    sim.converge(20);
    let backup = sim
        .map()
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    sim.log.clear();
    sim.converge(40);
    let restarts: Vec<&String> = sim
        .log
        .iter()
        .filter(|l| l.starts_with("restart pod"))
        .collect();
    assert_eq!(restarts.len(), 3, "{:?}", sim.log);
    assert_eq!(restarts[2], &format!("restart pod {backup}-0"));
    assert_eq!(restarts[0], "restart pod c1-0-2-0");
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// A config change that ClickHouse reloads (a profile setting) restarts nothing.
#[test]
fn profile_change_restarts_nothing() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.configuration.profiles.insert(
        "default".into(),
        BTreeMap::from([("max_threads".to_string(), "4".to_string())]),
    );
    sim.log.clear();
    sim.converge(20);
    assert!(
        sim.log
            .iter()
            .any(|l| l == "apply ConfigMap c1-common" || l == "apply Secret c1-users"),
        "{:?}",
        sim.log
    );
    assert!(
        !sim.log
            .iter()
            .any(|l| l.starts_with("restart") || l.starts_with("apply StatefulSet")),
        "{:?}",
        sim.log
    );
}

/// S2-23: turning TLS on stops every server, then starts them all on the new template.
#[test]
fn tls_toggle_is_a_full_stop_and_start() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.tls.enabled = true;
    sim.cluster.spec.tls.server_cert_secret = Some("tls".into());
    let p = sim.plan();
    assert_eq!(
        p.status.state,
        ClusterState::Stopping,
        "{:?}",
        p.status.message
    );
    let stops: Vec<&Value> = p
        .steps
        .iter()
        .filter_map(|a| match a {
            Step::Apply {
                kind: Kind::StatefulSet,
                object,
                ..
            } if !object["metadata"]["name"]
                .as_str()
                .unwrap()
                .ends_with("keeper") =>
            {
                Some(object)
            }
            _ => None,
        })
        .collect();
    assert_eq!(stops.len(), 2);
    assert!(
        stops
            .iter()
            .all(|o| o["spec"]["replicas"] == 0 && !serves_tls(&o["spec"]["template"]))
    );
    sim.act(&p);
    assert!(
        !sim.obs.pods.keys().any(|p| p.starts_with("c1-0-")),
        "every server stopped"
    );
    sim.converge(20);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(
        sim.obs
            .statefulsets
            .iter()
            .filter(|(n, _)| !n.ends_with("keeper"))
            .all(|(_, s)| serves_tls(&json_of(&s.spec)["template"]))
    );
}

/// A server pod that is still starting while its StatefulSet's status has not caught up (just
/// created or just written: no `observedGeneration` yet) is not known to be on an old revision,
/// and is not restarted on that guess (it was: a cluster whose pods wait longer for their
/// volumes had a server restarted during its creation).
#[test]
fn a_starting_pod_is_not_restarted_while_its_statefulsets_status_lags() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let replica = sim.map().keys().next().unwrap().clone();
    let pod = format!("{replica}-0");
    sim.obs
        .statefulsets
        .get_mut(replica.as_str())
        .unwrap()
        .status = Some(StatefulSetStatus::default());
    sim.obs.pods.get_mut(&pod).unwrap().status = Some(PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let p = sim.plan_caught_up();
    assert!(
        !p.steps
            .iter()
            .any(|a| matches!(a, Step::RestartPod { pod: p, .. } if *p == pod)),
        "{:?}",
        p.steps
    );
}

/// Decision 5: a change first rolls one replica of the whole cluster (the canary); once it is
/// Ready on the new template the shards roll in parallel; every server restarts exactly once.
#[test]
fn a_canary_replica_rolls_before_the_shards_go_in_parallel() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let p = sim.plan_caught_up();
    let written: Vec<&String> = statefulsets_applied(&p);
    assert_eq!(written.len(), 1, "one canary: {:?}", p.steps);
    sim.log.clear();
    sim.converge(40);
    let restarts = server_restarts(&sim.log);
    let unique: BTreeSet<&&String> = restarts.iter().collect();
    assert_eq!(restarts.len(), 4, "{:?}", sim.log);
    assert_eq!(unique.len(), 4, "each server restarts once: {:?}", sim.log);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 5, invariant 4: an image that cannot be pulled stops the rollout at its first
/// replica (the cluster says error, one replica down), and reverting the spec heals it with
/// maxUnavailable 1: the broken replica gets the good template and a new pod at once.
#[test]
fn reverting_a_bad_image_heals_the_broken_replica() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    let good = sim.cluster.spec.image.clone();
    sim.bad_image = Some("registry.invalid/clickhouse:bad".into());
    sim.cluster.spec.image = "registry.invalid/clickhouse:bad".into();
    let mut failed = false;
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        let down = sim
            .obs
            .pods
            .iter()
            .filter(|(n, pod)| !n.contains("keeper") && !crate::plan::facts::pod_ready(pod))
            .count();
        assert!(down <= 1, "at most the canary is down: {down}");
        failed |= p.status.state == ClusterState::Error;
        sim.act(&p);
        sim.obs.caught_up.clear();
    }
    assert!(failed, "the rollout stops with an error");
    let servers_on_bad = sim
        .obs
        .statefulsets
        .iter()
        .filter(|(n, _)| !n.ends_with("keeper"))
        .filter(|(n, _)| sim.pulls_bad_image(n))
        .count();
    assert_eq!(servers_on_bad, 1, "only the canary got the bad image");
    sim.cluster.spec.image = good;
    sim.converge(40);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(!sim.obs.statefulsets.keys().any(|n| sim.pulls_bad_image(n)));
}

/// S2-33: RollingUpdate restarts one replica of a shard at a time without waiting for the
/// restarted one to catch up with replication; Smart Update waits.
#[test]
fn rolling_update_does_not_wait_for_catch_up_but_smart_update_does() {
    for (strategy, finishes) in [("RollingUpdate", true), ("SmartUpdate", false)] {
        let mut sim =
            Sim::new(serde_json::json!({"shards": 1, "replicas": 3, "updateStrategy": strategy}));
        sim.converge(20);
        sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
        sim.log.clear();
        for _ in 0..30 {
            // Every replica reports replication lag, always.
            for n in sim.map().keys().cloned().collect::<Vec<_>>() {
                sim.obs.caught_up.insert(n.into(), false);
            }
            let p = sim.plan();
            sim.act(&p);
        }
        let rolled: BTreeSet<&String> = sim
            .log
            .iter()
            .filter(|l| {
                l.starts_with("restart pod c1-") || l.starts_with("controller replaces pod c1-")
            })
            .collect();
        assert_eq!(rolled.len() == 3, finishes, "{strategy}: {:?}", sim.log);
    }
}

/// S2-32: a Smart Update waits for a restarted replica to catch up for `catchUpSeconds`
/// (default 2 hours); past it the rollout stops with a message naming the replica. Here a
/// restarted replica never catches up, and its pod has been Ready for 60 s.
#[test]
fn a_replica_that_does_not_catch_up_stops_the_rollout_after_catch_up_seconds() {
    for (catch_up, fails) in [(None, false), (Some(120), false), (Some(30), true)] {
        let mut spec = serde_json::json!({"shards": 1, "replicas": 3});
        if let Some(s) = catch_up {
            spec["catchUpSeconds"] = s.into();
        }
        let mut sim = Sim::new(spec);
        sim.converge(20);
        sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
        let mut message = String::new();
        let mut reason = None;
        sim.log.clear();
        for _ in 0..10 {
            // a restarted replica lags, always; the others are synced
            for n in sim.map().keys().cloned().collect::<Vec<_>>() {
                let restarted = sim.log.iter().any(|l| {
                    (l.starts_with("restart pod ") || l.starts_with("controller replaces pod "))
                        && l.contains(&format!("{n}-0"))
                });
                sim.obs.caught_up.insert(n.into(), !restarted);
            }
            let p = sim.plan();
            message = p.status.message.clone().unwrap_or_default();
            reason = p.failure.as_ref().map(|f| f.reason);
            sim.act(&p);
        }
        let stopped = sim.state() == ClusterState::Error;
        if fails {
            // re-checked like a healthy cluster, not backed off: it heals without an event
            assert_eq!(reason, Some(crate::plan::FailureReason::CatchUpTimeout));
        }
        assert_eq!(stopped, fails, "{catch_up:?}: {message}");
        if fails {
            assert!(
                message.contains("did not catch up with replication within 30 s"),
                "{message}"
            );
            assert!(message.contains("replica c1-0-"), "{message}");
            let restarts = sim
                .log
                .iter()
                .filter(|l| {
                    l.starts_with("restart pod ") || l.starts_with("controller replaces pod ")
                })
                .count();
            assert_eq!(restarts, 1, "the rollout stopped at its first replica");
        } else {
            assert!(!message.contains("did not catch up"), "{message}");
        }
    }
    assert_eq!(
        crate::plan::pass::rollout::catch_up_deadline(None).as_secs(),
        7200,
        "2 hours by default"
    );
}

/// A pod taken out of traffic for a restart goes back in when the change is reverted before
/// its restart.
#[test]
fn a_pod_out_of_traffic_goes_back_when_its_restart_is_not_needed() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    let good = sim.cluster.spec.image.clone();
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let serving = |sim: &Sim| {
        sim.obs
            .pods
            .iter()
            .filter(|(n, p)| {
                !n.contains("keeper")
                    && p.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key(model::labels::SERVING))
            })
            .count()
    };
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        let excluding = p
            .steps
            .iter()
            .any(|a| matches!(a, Step::SetServing { serving: false, .. }));
        sim.act(&p);
        if excluding {
            break;
        }
    }
    assert_eq!(serving(&sim), 1, "one pod out of traffic for its restart");
    sim.cluster.spec.image = good;
    sim.converge(20);
    assert_eq!(serving(&sim), 2, "{:?}", sim.log);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// A pod a pass deleted for its restart is not deleted again, nor its restart announced
/// again, while it is still stopping (the passes its own deletion triggers came while its
/// server shut down: each deleted it again and published another `RestartPod` event).
#[test]
fn a_pod_deleted_for_its_restart_is_not_deleted_again_while_it_stops() {
    let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let restarts = |p: &Plan| -> Vec<String> {
        p.steps
            .iter()
            .filter_map(|a| match a {
                Step::RestartPod { pod, .. } => Some(pod.clone()),
                _ => None,
            })
            .collect()
    };
    let mut first = None;
    for _ in 0..10 {
        let p = sim.plan_caught_up();
        if let Some(pod) = restarts(&p).into_iter().next() {
            assert!(
                p.events.iter().any(|e| e.reason == "RestartPod"),
                "{:?}",
                p.events
            );
            first = Some(pod);
            break;
        }
        sim.act(&p);
    }
    let pod = first.expect("a server pod is restarted");
    // deleted, still stopping: no longer Ready, its deletion under way
    let p = sim.obs.pods.get_mut(&pod).unwrap();
    p.metadata.deletion_timestamp = Some(Time(now()));
    p.status = Some(PodStatus::default());
    let again = sim.plan_caught_up();
    assert!(restarts(&again).is_empty(), "{:?}", again.steps);
    assert!(
        !again.events.iter().any(|e| e.reason == "RestartPod"),
        "{:?}",
        again.events
    );
    // once it is gone the rollout goes on to the end
    sim.obs.pods.remove(&pod);
    sim.converge(40);
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.log);
}

/// Decision 5: the canary is proven only by a replica restarted on the new template. A pass
/// that comes between the canary's template write and the StatefulSet controller's status for
/// it (the replica still Ready on its old pod, its revision not known yet) writes no other
/// replica's template.
#[test]
fn a_canary_whose_statefulset_status_lags_proves_nothing() {
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
    sim.converge(20);
    sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let p = sim.plan_caught_up();
    let written: Vec<String> = statefulsets_applied(&p).into_iter().cloned().collect();
    assert_eq!(written.len(), 1, "one canary: {:?}", p.steps);
    sim.act(&p);
    // the StatefulSet controller has not seen the new template yet
    let canary = &written[0];
    let sts = sim.obs.statefulsets.get_mut(canary).unwrap();
    let status = sts.status.as_mut().unwrap();
    status.observed_generation = sts.metadata.generation.map(|g| g - 1);
    for _ in 0..3 {
        let p = sim.plan_caught_up();
        let others: Vec<&String> = statefulsets_applied(&p)
            .into_iter()
            .filter(|n| *n != canary)
            .collect();
        assert!(others.is_empty(), "{:?}", p.steps);
        sim.act(&p);
        let sts = sim.obs.statefulsets.get_mut(canary).unwrap();
        let status = sts.status.as_mut().unwrap();
        status.observed_generation = sts.metadata.generation.map(|g| g - 1);
    }
    // the controller catches up: the canary restarts, then the shards roll
    let sts = sim.obs.statefulsets.get_mut(canary).unwrap();
    sts.status.as_mut().unwrap().observed_generation = sts.metadata.generation;
    sim.log.clear();
    sim.converge(40);
    let restarts = server_restarts(&sim.log);
    assert_eq!(
        restarts.first(),
        Some(&&format!("restart pod {canary}-0")),
        "{:?}",
        sim.log
    );
    assert_eq!(
        restarts.len(),
        4,
        "each server restarts once: {:?}",
        sim.log
    );
    assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.log);
}
