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

/// What one leader change costs the writes on ClickHouse 18.16 (see the rapid-change test).
const ELECTION_PRICE: Duration = Duration::from_secs(15);

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

impl Writes {
    /// Prints what the writer saw and asserts every acknowledged write is in Keeper.
    async fn assert_kept(&self, client: &Client, ns: &str) {
        println!(
            "keeper writes: {} attempts, {} acknowledged, outages {:?}",
            self.attempts,
            self.acked.len(),
            self.outages
        );
        let (_, addr) = keeper_members(client, ns).await[0];
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
        let lost: Vec<&u64> = self.acked.iter().filter(|n| !stored.contains(n)).collect();
        assert!(lost.is_empty(), "acknowledged Keeper writes lost: {lost:?}");
    }
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
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "kresize",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
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
    writes.assert_kept(&client, &ns).await;
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

/// One look at the ensemble: which members answer `mntr` as leader or follower.
struct RoleSample {
    at: Instant,
    serving: usize,
    leader: Option<String>,
}

/// Asks every Keeper pod's `mntr` every 250 ms (each within 1 s, all at once).
struct RoleSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<RoleSample>>,
}

impl RoleSampler {
    fn start(client: &Client, ns: &str) -> RoleSampler {
        use clickhouse_operator::clickhouse::keeper::four_letter_word;
        use clickhouse_operator::plan::facts::KeeperRole;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                let started = Instant::now();
                let list = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/component=keeper"))
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                let asks = list.iter().filter_map(|p| {
                    let ip: std::net::IpAddr = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
                    let name = p.name_any();
                    Some(async move {
                        let text = four_letter_word(
                            SocketAddr::new(ip, 9181),
                            "mntr",
                            Duration::from_secs(1),
                        )
                        .await
                        .unwrap_or_default();
                        (name, KeeperRole::from_mntr(&text))
                    })
                });
                let roles = futures::future::join_all(asks).await;
                samples.push(RoleSample {
                    at: started,
                    serving: roles
                        .iter()
                        .filter(|(_, r)| {
                            matches!(r, KeeperRole::Follower | KeeperRole::Leader { .. })
                        })
                        .count(),
                    leader: roles
                        .iter()
                        .find(|(_, r)| matches!(r, KeeperRole::Leader { .. }))
                        .map(|(n, _)| n.clone()),
                });
                tokio::time::sleep(Duration::from_millis(250).saturating_sub(started.elapsed()))
                    .await;
            }
            samples
        });
        RoleSampler { stop, task }
    }

    async fn stop(self) -> Vec<RoleSample> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Decision 31: five pod-template changes 10 s apart to the servers and to Keeper, twice,
/// on a 2×2 cluster with 3 Keeper members, while rows are written every second and Keeper is
/// written every 200 ms. The operator rolls Keeper itself (followers first, the leader last,
/// the next member once the leader reports every follower synced), coalescing to the newest
/// template: per burst of changes the leader is restarted once, so the ensemble changes
/// leader at most once per burst; a majority of the members serves at every sample but
/// during that one election (at most 10 s without, each time); at least 90 % of the row
/// batches are acknowledged over the whole run, which holds only because a table whose Keeper
/// session expired with a member's restart opens a new one as soon as Keeper answers
/// (decision 45; 18.16 alone waits 10 s): the figure outside the 15 s after each election is
/// printed beside it; every acknowledged row and Keeper write is kept.
///
/// Outside CI (4 minutes, and one run in six under a full suite's load did not converge after
/// the first burst, cause not found yet): `cargo test --test e2e -- --ignored
/// keeper::rapid_changes_roll_keeper_leader_last_and_keep_a_serving_quorum`.
#[tokio::test]
#[ignore = "long; run by name with --ignored (see its doc comment)"]
async fn rapid_changes_roll_keeper_leader_last_and_keep_a_serving_quorum() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "krapid",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let observer = Observer::start(&client, &ns, "c1").await;
    let workload = Workload::start(&client, &ns, "c1").await;
    let writer = KeeperWriter::start(&client, &ns).await;
    let sampler = RoleSampler::start(&client, &ns);
    let mut generation = 1;
    let bursts = 2;
    for burst in 0..bursts {
        let started = Instant::now();
        for change in 0..5 {
            let mark = json!({"example.com/change": format!("{burst}-{change}")});
            patch_spec(
                &client,
                &ns,
                "c1",
                json!({"pod": {"annotations": mark}, "keeper": {"pod": {"annotations": mark}}}),
            )
            .await;
            generation += 1;
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        wait_ready(&client, &ns, "c1", generation).await;
        println!(
            "burst {burst}: ready {:?} after its first change",
            started.elapsed()
        );
    }
    let samples = sampler.stop().await;
    let writes = writer.stop().await;
    let restarts: Vec<(String, usize)> = observer
        .uids()
        .into_iter()
        .map(|(pod, uids)| (pod, uids.len() - 1))
        .collect();
    println!("restarts per pod: {restarts:?}");
    // leader changes: each time a leader is seen that differs from the last one seen
    let t0 = samples.first().map(|s| s.at).unwrap_or_else(Instant::now);
    let mut leaders: Vec<(Instant, String)> = Vec::new();
    for s in &samples {
        if let Some(l) = &s.leader
            && leaders.last().is_none_or(|(_, last)| last != l)
        {
            leaders.push((s.at, l.clone()));
        }
    }
    let changes: Vec<Instant> = leaders.iter().skip(1).map(|(at, _)| *at).collect();
    // stretches without a serving majority (2 of 3)
    let mut without: Vec<(Duration, Duration)> = Vec::new();
    let mut since: Option<Instant> = None;
    for s in &samples {
        match (s.serving >= 2, since) {
            (false, None) => since = Some(s.at),
            (true, Some(t)) => {
                without.push((t - t0, s.at - t));
                since = None;
            }
            _ => {}
        }
    }
    if let (Some(t), Some(last)) = (since, samples.last()) {
        without.push((t - t0, last.at - t));
    }
    println!(
        "{} samples; leaders {:?}; without a serving majority {without:?}",
        samples.len(),
        leaders
            .iter()
            .map(|(at, l)| (*at - t0, l))
            .collect::<Vec<_>>()
    );
    let attempts = workload.stop_and_check_attempts(&client, &ns).await;
    for (at, r) in &attempts {
        if let Err(why) = r {
            println!(
                "row batch failed at {:?}: {why}",
                at.saturating_duration_since(t0)
            );
        }
    }
    // ClickHouse 18.16 loses its Keeper session when the member it talks to stops serving
    // (ZooKeeper's followers drop their clients while a new leader is elected) and its tables
    // stay read-only until their next startup attempt, 10 s later: the 15 s after a leader
    // change are that election's price, not the roll's.
    let after_election = |at: &Instant| {
        changes
            .iter()
            .any(|c| *at >= *c - Duration::from_secs(2) && *at < *c + ELECTION_PRICE)
    };
    let ratio = |a: &[&(Instant, Result<(), String>)]| {
        a.iter().filter(|(_, r)| r.is_ok()).count() as f64 / a.len().max(1) as f64
    };
    let all: Vec<_> = attempts.iter().collect();
    let outside: Vec<_> = attempts
        .iter()
        .filter(|(at, _)| !after_election(at))
        .collect();
    println!(
        "row batches: {} sent, {:.1} % acknowledged; outside the {} leader elections' {} s: {} sent, {:.1} % acknowledged",
        all.len(),
        ratio(&all) * 100.0,
        changes.len(),
        ELECTION_PRICE.as_secs(),
        outside.len(),
        ratio(&outside) * 100.0
    );
    assert!(
        changes.len() <= bursts,
        "{} leader changes in {bursts} bursts: {leaders:?}",
        changes.len()
    );
    assert!(
        without.len() <= changes.len()
            && without.iter().all(|(_, d)| *d <= Duration::from_secs(10)),
        "a majority did not serve outside the leader's elections: {without:?} ({} leader changes)",
        changes.len()
    );
    assert!(
        ratio(&all) >= 0.9,
        "only {:.1} % of the row batches were acknowledged ({:.1} % outside the leader elections)",
        ratio(&all) * 100.0,
        ratio(&outside) * 100.0
    );
    let keeper_restarts: usize = restarts
        .iter()
        .filter(|(p, _)| p.contains("keeper"))
        .map(|(_, n)| *n)
        .sum();
    assert!(
        keeper_restarts <= 2 * (2 * 5 + 1),
        "Keeper members restarted {keeper_restarts} times: {restarts:?}"
    );
    writes.assert_kept(&client, &ns).await;
    // four servers and three members restarting over and over: a pass may also wait on a
    // member in election (2 s per call) before it writes the counts
    assert_status_truthful_within(&observer.stop().await, Duration::from_secs(15));
    finish(&client, &ns, op).await;
}

/// Decision 45: the Keeper leader's pod is deleted while rows are written every second
/// through a 1×2 cluster with 3 members. The election drops every server's Keeper session
/// (the stand-in's followers close their clients while they look for a leader, as ZooKeeper
/// does) and the replicated tables turn read-only; ClickHouse 18.16 would try a new session
/// only 10 s after its failed attempt during the election, so about ten batches in a row
/// failed. The operator makes the tables open a session as soon as Keeper answers their
/// server again: at most 5 s of failed batches in a row, every acknowledged row on both
/// replicas afterwards.
#[tokio::test]
async fn a_lost_keeper_leader_costs_the_writes_seconds_not_a_retry_period() {
    use clickhouse_operator::clickhouse::keeper::four_letter_word;
    use clickhouse_operator::plan::facts::KeeperRole;
    use k8s_openapi::api::core::v1::Event;
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "kleader",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut leader = None;
    for (pod, addr) in keeper_members(&client, &ns).await {
        let text = four_letter_word(addr, "mntr", Duration::from_secs(2))
            .await
            .unwrap_or_default();
        if matches!(KeeperRole::from_mntr(&text), KeeperRole::Leader { .. }) {
            leader = Some(pod);
        }
    }
    let leader = leader.expect("a Keeper leader");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deleted = Instant::now();
    pods.delete(&leader, &Default::default()).await.unwrap();
    println!("deleted the Keeper leader {leader}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    wait_ready(&client, &ns, "c1", 1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let attempts = workload.stop_and_check_attempts(&client, &ns).await;
    // the longest stretch of consecutive failed batches
    let (mut longest, mut first_failed) = (Duration::ZERO, None::<Instant>);
    for (at, r) in &attempts {
        match (r, first_failed) {
            (Err(why), None) => {
                println!(
                    "row batch failed {:?} after the deletion: {why}",
                    at.saturating_duration_since(deleted)
                );
                first_failed = Some(*at);
                longest = longest.max(Duration::from_secs(1));
            }
            (Err(why), Some(t)) => {
                println!(
                    "row batch failed {:?} after the deletion: {why}",
                    at.saturating_duration_since(deleted)
                );
                longest = longest.max(*at - t + Duration::from_secs(1));
            }
            (Ok(()), _) => first_failed = None,
        }
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let reopened: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("KeeperSessionReopened"))
        .filter_map(|e| e.message)
        .collect();
    println!(
        "{} batches, the longest failing stretch {longest:?}; KeeperSessionReopened: {reopened:?}",
        attempts.len()
    );
    assert!(
        longest <= Duration::from_secs(5),
        "batches failed for {longest:?} in a row after the Keeper leader was lost"
    );
    finish(&client, &ns, op).await;
}
