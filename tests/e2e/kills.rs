//! The operator killed at every step (S0-19, S0-30, invariants 1, 6, 8): each operator run here
//! executes one step of a plan that writes to Kubernetes or changes the replica map, and dies
//! right after it, before it can record anything; a new one takes over. A shard scale-out, a rolling restart, a scale-in and a pause/resume are
//! driven that way, with rows written every second, until the cluster converges. Afterwards
//! every acknowledged row is on every replica, Keeper lists only live replicas, no replica
//! name was ever used twice, and every version of the replica map (from a watch) changed only
//! along the state machine's transitions (S0-06).
//!
//! Every flow runs in CI (about 130 s, 43 kill points on its last run). Also here: passes
//! planned from a cache that lags behind the operator's own writes.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use clickhouse_operator::controller::{AfterStep, StepPoint};
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

/// Drives the cluster to `want` at `generation` with operators that each die after one step. Returns the
/// steps they died after.
async fn drive(
    client: &Client,
    ns: &str,
    generation: i64,
    want: ClusterState,
    names: &mut Vec<BTreeSet<String>>,
) -> Vec<String> {
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let mut kills = Vec::new();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "no convergence: {kills:?}"
        );
        let fired = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(String::new()));
        let seen: Arc<BTreeSet<String>> = Arc::new(kills.iter().cloned().collect());
        let hook: AfterStep = {
            let (fired, last) = (fired.clone(), last.clone());
            Arc::new(move |point, step| match point {
                StepPoint::Before => fired.load(Ordering::SeqCst),
                // A kill point: right after a step that the plan records (a Kubernetes write, or
                // a change of the replica map), before anything records it; each step once, so
                // that the next operator redoes it and goes on.
                StepPoint::After
                    if (step.writes_kubernetes() || step.records_progress())
                        && !seen.contains(&step.describe()) =>
                {
                    if !fired.swap(true, Ordering::SeqCst) {
                        *last.lock().unwrap() = step.describe();
                    }
                    true
                }
                StepPoint::After => fired.load(Ordering::SeqCst),
            })
        };
        let op = start_operator_with(
            client,
            ns,
            clickhouse_operator::controller::Faults {
                after_step: Some(hook),
                ..Default::default()
            },
        )
        .await;
        // Until it dies, or the cluster is `want` at `generation` and it stayed alive 3 s more.
        let mut ready_since: Option<Instant> = None;
        let died = loop {
            if fired.load(Ordering::SeqCst) {
                break true;
            }
            let c = clusters.get("c1").await.unwrap();
            let s = c.status.clone().unwrap_or_default();
            names.push(s.replica_state_map.keys().map(|k| k.to_string()).collect());
            let ready = s.state == want && s.observed_generation == Some(generation);
            match (ready, ready_since) {
                (true, None) => ready_since = Some(Instant::now()),
                (true, Some(t)) if t.elapsed() > Duration::from_secs(3) => break false,
                (false, _) => ready_since = None,
                _ => {}
            }
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "no convergence: {kills:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        drop(op);
        if !died {
            return kills;
        }
        let step = last.lock().unwrap().clone();
        kills.push(step);
        // The dead operator's pass is aborted with it; give the task a moment to stop.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every version of the cluster's replica map, from a watch.
type MapVersions = Arc<
    Mutex<
        Vec<
            std::collections::BTreeMap<
                clickhouse_operator::api::ReplicaName,
                clickhouse_operator::api::ReplicaStatus,
            >,
        >,
    >,
>;

/// Records every version of the cluster's replica map the API server holds until the task is
/// aborted.
fn watch_map(client: &Client, ns: &str) -> (MapVersions, tokio::task::JoinHandle<()>) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let versions: MapVersions = Arc::default();
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let task = {
        let versions = versions.clone();
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=c1");
            let mut events = watcher(clusters, config).boxed();
            while let Some(event) = events.next().await {
                let (Ok(watcher::Event::Apply(c)) | Ok(watcher::Event::InitApply(c))) = event
                else {
                    continue;
                };
                let map = c.status.map(|s| s.replica_state_map).unwrap_or_default();
                let mut v = versions.lock().unwrap();
                if v.last() != Some(&map) {
                    v.push(map);
                }
            }
        })
    };
    (versions, task)
}

/// S0-06 end to end: every change between two versions of the map the API server held is
/// one the replica state machine allows.
fn assert_transitions_allowed(versions: &MapVersions) {
    let versions = versions.lock().unwrap();
    for pair in versions.windows(2) {
        if let Some(why) =
            clickhouse_operator::plan::replicas::map_change_refused(&pair[0], &pair[1])
        {
            panic!("{why}: {:?} → {:?}", pair[0], pair[1]);
        }
    }
    println!(
        "{} versions of the replica map, every change allowed",
        versions.len()
    );
}

/// Every name that left the map never comes back.
fn assert_no_name_reused(names: &[BTreeSet<String>]) {
    let mut gone = BTreeSet::new();
    for pair in names.windows(2) {
        for n in pair[0].difference(&pair[1]) {
            gone.insert(n.clone());
        }
        for n in &pair[1] {
            assert!(!gone.contains(n), "replica name {n} was used again");
        }
    }
}

/// Keeper lists exactly the live replicas of each shard for the workload's table.
async fn assert_keeper_clean(client: &Client, ns: &str) {
    let c: ClickHouseCluster = Api::namespaced(client.clone(), ns).get("c1").await.unwrap();
    let map = c.status.unwrap().replica_state_map;
    let shards: BTreeSet<i32> = map.values().map(|r| r.shard.get()).collect();
    for shard in shards {
        let live: BTreeSet<String> = map
            .iter()
            .filter(|(_, r)| r.shard.get() == shard)
            .map(|(n, _)| n.to_string())
            .collect();
        let any = live.iter().next().unwrap();
        let ch = sql_client(client, ns, "c1", &format!("{any}-0")).await;
        let listed: BTreeSet<String> = query(
            &ch,
            &format!("SELECT name AS v FROM system.zookeeper WHERE path = '/clickhouse/tables/{shard}/default/events/replicas'"),
        )
        .await
        .into_iter()
        .collect();
        assert_eq!(
            listed, live,
            "shard {shard}: Keeper lists exactly the live replicas"
        );
    }
}

/// Invariants 1, 6 and 8 with the operator killed after every step of a shard scale-out, a
/// rolling restart, a scale-in and a pause/resume.
#[tokio::test]
async fn operator_killed_after_every_step_converges_without_loss() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "kills",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    drop(op);
    let (map_versions, map_watch) = watch_map(&client, &ns);
    let workload = Workload::start(&client, &ns, "c1").await;
    let mut names = Vec::new();
    let mut kills = Vec::new();
    let mut generation = 1;
    let ready = ClusterState::Ready;
    let mut flows: Vec<(&str, serde_json::Value, ClusterState)> =
        vec![("shard scale-out 1 → 2", json!({"shards": 2}), ready)];
    flows.push((
        "rolling restart",
        json!({"configuration": {"settings": {"mark_cache_size": "5368709121"}}}),
        ready,
    ));
    flows.push(("scale-in 2 → 1 per shard", json!({"replicas": 1}), ready));
    flows.push(("pause", json!({"pause": true}), ClusterState::Paused));
    flows.push(("resume", json!({"pause": false}), ready));
    for (what, change, want) in flows {
        patch_spec(&client, &ns, "c1", change).await;
        generation += 1;
        let k = drive(&client, &ns, generation, want, &mut names).await;
        println!("{what}: killed after {} step(s): {k:#?}", k.len());
        kills.extend(k);
    }
    let distinct: BTreeSet<&String> = kills.iter().collect();
    println!(
        "{} kill points, {} distinct steps",
        kills.len(),
        distinct.len()
    );
    assert!(kills.len() >= 40, "too few kill points: {}", kills.len());
    let op = start_operator(&client, &ns, false).await;
    wait_ready(&client, &ns, "c1", generation).await;
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    assert_keeper_clean(&client, &ns).await;
    assert_no_name_reused(&names);
    map_watch.abort();
    assert_transitions_allowed(&map_versions);
    finish(&client, &ns, op).await;
}

/// How far behind the API server the lagging cache is.
const CACHE_LAG: Duration = Duration::from_secs(4);

/// Item 6 (decision 24): every pass is handed the cluster as the watch cache held it
/// [`CACHE_LAG`] earlier, older than the operator's own status writes, while replicas are
/// added, removed and added again under write load. The operator re-reads what it wrote before
/// planning, so nothing is lost: each change converges, every acknowledged batch is on every
/// replica, Keeper lists only the live replicas, no replica name comes back.
#[tokio::test]
async fn a_cache_lagging_behind_the_operators_writes_loses_nothing() {
    type Seen = Vec<(std::time::Instant, Arc<ClickHouseCluster>)>;
    let client = client().await;
    let ns = namespace(&client, "stale").await;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let handed_stale = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stale_cache: clickhouse_operator::controller::StaleCache = {
        let (seen, handed_stale) = (seen.clone(), handed_stale.clone());
        Arc::new(move |cached: Arc<ClickHouseCluster>| {
            let now = std::time::Instant::now();
            let mut seen = seen.lock().unwrap();
            if seen.last().map(|(_, c)| c.resource_version()) != Some(cached.resource_version()) {
                seen.push((now, cached.clone()));
            }
            let old = seen
                .iter()
                .rev()
                .find(|(at, _)| now.duration_since(*at) >= CACHE_LAG)
                .or(seen.first())
                .map(|(_, c)| c.clone())
                .unwrap_or(cached.clone());
            if old.resource_version() != cached.resource_version() {
                handed_stale.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            old
        })
    };
    let op = start_operator_with(
        &client,
        &ns,
        clickhouse_operator::controller::Faults {
            stale_cache: Some(stale_cache),
            ..Default::default()
        },
    )
    .await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let first = wait_ready(&client, &ns, "c1", 1).await;
    let mut names = vec![map_names(&first)];
    let workload = Workload::start(&client, &ns, "c1").await;
    for (generation, replicas) in [(2, 3), (3, 2), (4, 3)] {
        patch_spec(&client, &ns, "c1", json!({"replicas": replicas})).await;
        let c = wait_ready(&client, &ns, "c1", generation).await;
        names.push(map_names(&c));
        println!("{replicas} replicas: {:?}", names.last().unwrap());
    }
    let handed = handed_stale.load(std::sync::atomic::Ordering::SeqCst);
    println!("passes handed a stale copy: {handed}");
    assert!(handed >= 5, "the cache lagged only {handed} times");
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} acknowledged batches on every replica");
    assert_no_name_reused(&names);
    assert_keeper_clean(&client, &ns).await;
    finish(&client, &ns, op).await;
}

fn map_names(c: &ClickHouseCluster) -> BTreeSet<String> {
    c.status
        .as_ref()
        .map(|s| s.replica_state_map.keys().map(|k| k.to_string()).collect())
        .unwrap_or_default()
}
