//! Keeper membership on running processes (decision 25): the ensemble resized 1 → 3 → 5 → 3 → 1
//! while a client writes to Keeper every 200 ms and rows are written through the cluster.
//!
//! The Keeper members are the local stand-in (ZooKeeper 3.8 with dynamic reconfiguration,
//! playing ClickHouse Keeper's reaction to a changed `raft_configuration`: the leader adds or
//! removes one member at a time; see `local-kubelet/src/keeper.rs`). The operator reads each
//! member's committed configuration with its own client, as it would from ClickHouse Keeper.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clickhouse_operator::clickhouse::keeper::{AclEntry, NODE_EXISTS, Session, perms};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

/// Where the Keeper writer creates its nodes.
const WRITES: &str = "/e2e-keeper-writes";

/// The Ready Keeper members' client addresses, by pod name.
async fn keeper_members(client: &Client, ns: &str) -> Vec<(String, SocketAddr)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/component=keeper"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
            Some((p.name_any(), SocketAddr::new(ip, 9181)))
        })
        .collect()
}

/// What the Keeper writer saw: the writes acknowledged and every failed attempt's time.
#[derive(Default)]
struct Writes {
    acked: Vec<u64>,
    /// (when the failing run started, how long until the next success).
    outages: Vec<(Duration, Duration)>,
    attempts: u64,
}

/// Creates `WRITES/<n>` every 200 ms on a Ready member (round robin, a fresh session each
/// time, so that members leaving and joining are all used).
struct KeeperWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Writes>,
}

impl KeeperWriter {
    async fn start(client: &Client, ns: &str) -> KeeperWriter {
        let (_, addr) = keeper_members(client, ns).await[0];
        let mut s = Session::connect(addr, Duration::from_secs(3))
            .await
            .unwrap();
        match s.create(WRITES, b"", &[AclEntry::world(perms::ALL)]).await {
            Ok(_) => {}
            Err(e) if e.code() == Some(NODE_EXISTS) => {}
            Err(e) => panic!("create {WRITES}: {e}"),
        }
        s.close().await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (client, ns) = (client.clone(), ns.to_string());
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let mut w = Writes::default();
            let mut failing_since: Option<Duration> = None;
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                let started = Instant::now();
                n += 1;
                let members = keeper_members(&client, &ns).await;
                let ok = match members.get(n as usize % members.len().max(1)) {
                    None => false,
                    Some((_, addr)) => {
                        let r = async {
                            let mut s = Session::connect(*addr, Duration::from_secs(2)).await?;
                            let r = s
                                .create(
                                    &format!("{WRITES}/{n}"),
                                    b"x",
                                    &[AclEntry::world(perms::ALL)],
                                )
                                .await;
                            s.close().await;
                            r
                        }
                        .await;
                        r.is_ok()
                    }
                };
                w.attempts += 1;
                let at = t0.elapsed();
                if ok {
                    w.acked.push(n);
                    if let Some(since) = failing_since.take() {
                        w.outages.push((since, at - since));
                    }
                } else if failing_since.is_none() {
                    failing_since = Some(at);
                }
                tokio::time::sleep(Duration::from_millis(200).saturating_sub(started.elapsed()))
                    .await;
            }
            if let Some(since) = failing_since {
                w.outages.push((since, t0.elapsed() - since));
            }
            w
        });
        KeeperWriter { stop, task }
    }

    async fn stop(self) -> Writes {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Every Ready member lists exactly the raft ids `1..=n` (the pods `keeper-0..n-1`).
async fn assert_members_agree(client: &Client, ns: &str, n: u32) {
    let members = keeper_members(client, ns).await;
    assert_eq!(members.len(), n as usize, "{members:?}");
    let want: Vec<u32> = (1..=n).collect();
    for (pod, addr) in members {
        let mut s = Session::connect(addr, Duration::from_secs(3))
            .await
            .unwrap();
        let view = s
            .members()
            .await
            .unwrap()
            .expect("a published configuration");
        s.close().await;
        assert_eq!(view.voters(), want, "{pod} lists {view:?}");
    }
}

/// Decision 25: Keeper resized 1 → 3 → 5 → 3 → 1 on running members while a client writes to
/// Keeper every 200 ms and rows go through the cluster every second. No write fails for longer
/// than one leader election, no acknowledged write is lost, after each step every member lists
/// the same members, and every acknowledged row is on every replica.
#[tokio::test]
async fn keeper_resizes_one_member_at_a_time_without_losing_a_write() {
    let client = client().await;
    let ns = namespace(&client, "kresize").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    assert_members_agree(&client, &ns, 1).await;
    let observer = Observer::start(&client, &ns, "c1").await;
    let workload = Workload::start(&client, &ns, "c1").await;
    let writer = KeeperWriter::start(&client, &ns).await;
    let mut generation = 1;
    for n in [3, 5, 3, 1] {
        let started = Instant::now();
        patch_spec(&client, &ns, "c1", json!({"keeper": {"replicas": n}})).await;
        generation += 1;
        wait_ready(&client, &ns, "c1", generation).await;
        println!("keeper resized to {n} in {:?}", started.elapsed());
        assert_members_agree(&client, &ns, n as u32).await;
    }
    let writes = writer.stop().await;
    println!(
        "keeper writes: {} attempts, {} acknowledged, outages {:?}",
        writes.attempts,
        writes.acked.len(),
        writes.outages
    );
    let (_, addr) = keeper_members(&client, &ns).await[0];
    let mut s = Session::connect(addr, Duration::from_secs(3))
        .await
        .unwrap();
    let stored: BTreeSet<u64> = s
        .children(WRITES)
        .await
        .unwrap()
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    s.close().await;
    let lost: Vec<u64> = writes
        .acked
        .iter()
        .copied()
        .filter(|n| !stored.contains(n))
        .collect();
    assert!(lost.is_empty(), "acknowledged Keeper writes lost: {lost:?}");
    // A leader election here takes a few seconds (ZooKeeper: tickTime 500 ms, the leader
    // leaving the ensemble hands over at once); a member that goes away never stops writes
    // for longer than one.
    let longest = writes
        .outages
        .iter()
        .map(|(_, d)| *d)
        .max()
        .unwrap_or_default();
    assert!(
        longest < Duration::from_secs(10),
        "writes to Keeper failed for {longest:?} in a row: {:?}",
        writes.outages
    );
    let rows = workload.stop_and_check(&client, &ns).await;
    println!("{rows} acknowledged batches on every replica");
    assert_status_truthful(&observer.stop().await);
    finish(&client, &ns, op).await;
}
