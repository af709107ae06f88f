//! Bad days on the real local Kubernetes, with rows written every second through the client
//! Service and checked on every replica afterwards, and the status sampled every second: bad
//! changes applied and reverted (servers and Keeper), a rolling restart, a killed server pod, a
//! restarted replica that cannot catch up.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clickhouse_operator::api::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

/// How long a bad change is left in place once its first pod cannot start: long enough for an
/// operator that would go on to take a second replica down.
const BAD_FOR: Duration = Duration::from_secs(20);

async fn pods(client: &Client, ns: &str, component: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await
        .unwrap()
        .items
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A bad change, how to revert it, and what the status must say while it is in place.
pub struct BadChange {
    pub what: &'static str,
    pub bad: serde_json::Value,
    pub revert: serde_json::Value,
    /// S2-31: the state `error` with a message naming the stuck pod, one of these reasons and
    /// `cause`; empty for a change that is not an error yet within [`BAD_FOR`] (a pod that
    /// cannot be scheduled gets two minutes).
    pub reasons: &'static [&'static str],
    pub cause: &'static str,
}

/// Applies `bad`, waits until a pod of `component` made after it has not become Ready for
/// 15 s, waits for the error the change must be reported as (if any), leaves it [`BAD_FOR`],
/// then applies `revert` and waits for `ready`.
async fn bad_then_revert(
    client: &Client,
    ns: &str,
    generation: &mut i64,
    component: &str,
    change: BadChange,
) {
    let BadChange {
        what,
        bad,
        revert,
        reasons,
        cause,
    } = change;
    let before: BTreeSet<String> = pods(client, ns, component)
        .await
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    patch_spec(client, ns, "c1", bad).await;
    *generation += 1;
    let stuck = wait_for(
        Duration::from_secs(240),
        &format!("a {component} pod that cannot start ({what})"),
        || {
            let before = &before;
            async move {
                pods(client, ns, component).await.into_iter().find(|p| {
                    let new = p.uid().is_some_and(|u| !before.contains(&u));
                    let age = p
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0));
                    new && !pod_ready(p) && age.is_some_and(|a| a.as_secs() >= 15)
                })
            }
        },
    )
    .await;
    let pod = stuck.name_any();
    println!("{what}: {pod} cannot start");
    if !reasons.is_empty() {
        let said = |m: &str| {
            m.contains(&format!("pod {pod}: "))
                && reasons.iter().any(|r| m.contains(&format!(": {r}: ")))
                && m.contains(cause)
        };
        let error = wait_status(
            client,
            ns,
            "c1",
            Duration::from_secs(120),
            &format!("state error naming {pod} and {reasons:?} ({what})"),
            |s| {
                s.state == ClusterState::Error
                    && s.observed_generation == Some(*generation)
                    && s.message.as_deref().is_some_and(said)
            },
        )
        .await
        .status
        .unwrap();
        println!("{what}: {:?}", error.message);
        let failed = error
            .conditions
            .iter()
            .find(|c| c.r#type == "ReconcileSucceeded")
            .expect("the ReconcileSucceeded condition");
        assert!(
            failed.status == "False"
                && failed.reason == "ErrorReconcile"
                && failed.message.starts_with("RolloutFailed: ")
                && said(&failed.message),
            "{failed:?}"
        );
    }
    tokio::time::sleep(BAD_FOR).await;
    patch_spec(client, ns, "c1", revert).await;
    *generation += 1;
    let started = Instant::now();
    let healed = wait_ready(client, ns, "c1", *generation)
        .await
        .status
        .unwrap();
    println!("{what}: ready {:?} after the revert", started.elapsed());
    assert!(
        healed
            .conditions
            .iter()
            .any(|c| c.r#type == "ReconcileSucceeded" && c.status == "True"),
        "{:?}",
        healed.conditions
    );
}

/// The most Keeper pods (`keeper`) or server pods that were not Ready in one sample.
fn most_down(samples: &[Sample], keeper: bool) -> usize {
    samples
        .iter()
        .map(|s| {
            s.not_ready
                .iter()
                .filter(|n| n.contains("keeper") == keeper)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Creates `c1` with `spec`, starts the writer and the observer, applies and reverts each
/// `(what, bad, revert)` on `component`'s pods, then checks every acknowledged batch, that one
/// pod of `component` at most was down in any sample, and that the status told the truth.
async fn revert_each(
    prefix: &str,
    spec: serde_json::Value,
    component: &str,
    cases: Vec<BadChange>,
) {
    let client = client().await;
    let ns = namespace(&client, prefix).await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(&client, &ns, "c1", spec).await;
    wait_ready(&client, &ns, "c1", 1).await;
    let observer = Observer::start(&client, &ns, "c1").await;
    let workload = Workload::start(&client, &ns, "c1").await;
    let mut generation = 1;
    for change in cases {
        bad_then_revert(&client, &ns, &mut generation, component, change).await;
    }
    let batches = workload.stop_and_check(&client, &ns).await;
    let samples = observer.stop().await;
    println!("{batches} batches acknowledged and found on every replica");
    assert_eq!(
        most_down(&samples, component == "keeper"),
        1,
        "exactly one {component} pod was down at a time"
    );
    assert_status_truthful(&samples);
    finish(&client, &ns, op).await;
}

/// Invariant 4, decision 5: an image that cannot be pulled, a node selector no node matches and
/// a setting that stops ClickHouse each take one server down (the canary) and no other, with
/// `maxUnavailable: 1`; reverting each brings the cluster back to `ready` with every
/// acknowledged row on every replica of its shard. S2-31: the image that cannot be
/// pulled and the setting that crashes the server each put the cluster in `error` at the bad
/// change's generation, the message and the `ReconcileSucceeded` condition (`ErrorReconcile`,
/// `RolloutFailed: …`) naming the canary's pod, the node's reason (`ErrImagePull` or
/// `ImagePullBackOff`, `CrashLoopBackOff`) and the cause (the image; the error line of the
/// server's log, `Syntax error: Not a valid unsigned integer: not-a-number`);
/// after the revert the condition is `True` again. The node agent reports a failed pull and a
/// crash loop as a kubelet does (local-kubelet's `crash_loop_and_unknown_image`). With those
/// three reasons taken out of `plan::facts::pod_failing` the status stayed `initializing`
/// ("waiting for c1-0-1 to be Ready on its new revision") and this test failed after 120 s.
#[tokio::test]
async fn reverting_bad_server_changes_heals_under_write_load() {
    revert_each(
        "revert",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi"}, "podDisruptionBudget": {"maxUnavailable": 1}}),
        "server",
        vec![
            BadChange {
                what: "an image that cannot be pulled",
                bad: json!({"image": "registry.invalid/no-such-image:1"}),
                revert: json!({"image": SERVER_IMAGE}),
                reasons: &["ErrImagePull", "ImagePullBackOff"],
                cause: "registry.invalid/no-such-image:1",
            },
            BadChange {
                what: "a node selector no node matches",
                bad: json!({"pod": {"nodeSelector": {"example.com/no-such-node": "x"}}}),
                revert: json!({"pod": {"nodeSelector": null}}),
                reasons: &[],
                cause: "",
            },
            BadChange {
                what: "a setting that stops the server",
                bad: json!({"configuration": {"settings": {"uncompressed_cache_size": "not-a-number"}}}),
                revert: json!({"configuration": {"settings": {"uncompressed_cache_size": null}}}),
                reasons: &["CrashLoopBackOff"],
                cause: "Syntax error: Not a valid unsigned integer: not-a-number",
            },
        ],
    )
    .await;
}

/// Decision 5 for Keeper: a bad image or node selector stops the Keeper rolling update at its
/// first member (quorum kept, writes go on); reverting replaces the stuck member.
#[tokio::test]
async fn reverting_bad_keeper_changes_heals_under_write_load() {
    revert_each(
        "krevert",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"}}),
        "keeper",
        vec![
            BadChange {
                what: "a Keeper image that cannot be pulled",
                bad: json!({"keeper": {"image": "registry.invalid/no-such-image:1"}}),
                revert: json!({"keeper": {"image": null}}),
                reasons: &[],
                cause: "",
            },
            BadChange {
                what: "a Keeper node selector no node matches",
                bad: json!({"keeper": {"pod": {"nodeSelector": {"example.com/no-such-node": "x"}}}}),
                revert: json!({"keeper": {"pod": {"nodeSelector": null}}}),
                reasons: &[],
                cause: "",
            },
        ],
    )
    .await;
}

/// Invariant 5: a rolling restart restarts every server pod exactly once (every pod uid seen
/// by a watch), the status's counts follow the pods, and a killed server pod turns the state
/// `initializing` within a re-check and `ready` within one once every pod is Ready again.
#[tokio::test]
async fn rolling_restart_restarts_each_pod_once_and_the_status_follows_a_killed_pod() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "restart",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let observer = Observer::start(&client, &ns, "c1").await;
    let workload = Workload::start(&client, &ns, "c1").await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"configuration": {"settings": {"mark_cache_size": "5368709121"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 2).await;
    let uids = observer.uids();
    let servers: Vec<_> = uids
        .iter()
        .filter(|(n, _)| n.starts_with("c1-") && !n.contains("keeper"))
        .collect();
    assert_eq!(servers.len(), 4, "{uids:?}");
    for (pod, seen) in &servers {
        assert_eq!(seen.len(), 2, "{pod} restarted exactly once: {seen:?}");
    }
    assert_eq!(uids["c1-keeper-0"].len(), 1, "Keeper was not restarted");

    let victim = servers[0].0.clone();
    let killed = Instant::now();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(Duration::from_secs(30), "the state to leave ready", || {
        let samples = observer.samples();
        async move {
            samples
                .iter()
                .find(|s| s.at > killed && s.state != ClusterState::Ready)
                .cloned()
        }
    })
    .await;
    let all_ready = wait_for(Duration::from_secs(180), "every pod Ready again", || {
        let samples = observer.samples();
        async move {
            samples
                .iter()
                .find(|s| s.at > killed && s.not_ready.is_empty() && s.pods_ready.0 == 4)
                .map(|s| s.at)
        }
    })
    .await;
    let back = wait_for(
        Duration::from_secs(60),
        "the state to be ready again",
        || {
            let samples = observer.samples();
            async move {
                samples
                    .iter()
                    .find(|s| s.at >= all_ready && s.state == ClusterState::Ready)
                    .map(|s| s.at)
            }
        },
    )
    .await;
    let left = observer
        .samples()
        .iter()
        .find(|s| s.at > killed && s.state != ClusterState::Ready)
        .map(|s| s.at - killed)
        .unwrap();
    println!(
        "killed {victim}: not ready after {left:?}; all pods Ready after {:?}; ready {:?} later",
        all_ready - killed,
        back - all_ready
    );
    assert!(left <= STATUS_LAG, "the state left ready after {left:?}");
    assert!(
        back - all_ready <= STATUS_LAG,
        "ready {:?} after every pod was Ready",
        back - all_ready
    );
    let batches = workload.stop_and_check(&client, &ns).await;
    let samples = observer.stop().await;
    println!("{batches} batches acknowledged and found on every replica");
    assert_status_truthful(&samples);
    finish(&client, &ns, op).await;
}

/// S2-32: a Smart Update waits `catchUpSeconds` for a restarted replica to catch up with
/// replication; past it the rollout stops with state `error` and a message naming the replica,
/// and no other pod restarts. Once the replica catches up, the rollout goes on by itself.
/// The backup replica (rolled last) stops sending the parts of a table (`SYSTEM STOP REPLICATED
/// SENDS`), and a row is written to it once the canary's pod is being replaced: the restarted
/// canary cannot fetch that part until the backup replica sends again.
#[tokio::test]
async fn a_replica_that_cannot_catch_up_stops_the_rollout_until_it_does() {
    let (Scenario { client, ns, op }, ready) = Scenario::ready(
        "catchup",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "catchUpSeconds": 20}),
    )
    .await;
    let map = ready.status.unwrap().replica_state_map;
    let canary = map
        .iter()
        .find(|(_, r)| !r.is_backup_pod)
        .unwrap()
        .0
        .clone();
    let backup = map.iter().find(|(_, r)| r.is_backup_pod).unwrap().0.clone();
    let (canary_pod, backup_pod) = (format!("{canary}-0"), format!("{backup}-0"));
    let b = sql_client(&client, &ns, "c1", &backup_pod).await;
    exec(&b, "CREATE TABLE default.t ON CLUSTER c1 (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/t', '{replica}') ORDER BY x").await;
    exec(&b, "SYSTEM STOP REPLICATED SENDS default.t").await;
    let before = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"env": [{"name": "ROLLED", "value": "1"}]}}),
    )
    .await;
    let started = Instant::now();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for(
        Duration::from_secs(120),
        "the canary's pod replaced",
        || {
            let (pods_api, old) = (pods_api.clone(), before[&canary_pod].0.clone());
            let canary_pod = canary_pod.clone();
            async move {
                match pods_api.get_opt(&canary_pod).await.ok()? {
                    None => Some(()),
                    Some(p) => (p.metadata.deletion_timestamp.is_some()
                        || p.uid().unwrap_or_default() != old)
                        .then_some(()),
                }
            }
        },
    )
    .await;
    exec(&b, "INSERT INTO default.t VALUES (1)").await;
    let stopped = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(180),
        "the rollout to stop at the canary",
        |s| s.state == ClusterState::Error,
    )
    .await;
    let message = stopped.status.unwrap().message.unwrap_or_default();
    println!("stopped after {:?}: {message}", started.elapsed());
    assert!(
        message.contains(&format!(
            "replica {canary} did not catch up with replication within 20 s"
        )),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let now = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    assert_eq!(
        now[&backup_pod], before[&backup_pod],
        "the backup replica did not restart"
    );
    assert_ne!(now[&canary_pod].0, before[&canary_pod].0);

    // the backup replica sends again: the canary catches up and the rollout goes on by itself
    // (`SYSTEM START REPLICATED SENDS` does not undo the stop on 18.16; a new table object does)
    exec(&b, "DETACH TABLE default.t").await;
    exec(&b, "ATTACH TABLE default.t").await;
    let healed = Instant::now();
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(300),
        "the rollout to finish",
        |s| {
            s.state == ClusterState::Ready
                && s.observed_generation == Some(2)
                && s.message.is_none()
        },
    )
    .await;
    println!(
        "finished {:?} after the canary could catch up",
        healed.elapsed()
    );
    let after = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    assert_ne!(
        after[&backup_pod].0, before[&backup_pod].0,
        "the backup replica rolled last"
    );
    let a = sql_client(&client, &ns, "c1", &canary_pod).await;
    assert_eq!(query(&a, "SELECT count() AS v FROM default.t").await, ["1"]);
    finish(&client, &ns, op).await;
}
