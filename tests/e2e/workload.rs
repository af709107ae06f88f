//! What runs beside a fault test, independent of the operator: a writer that sends a batch of
//! rows every second through the cluster's client Service into a Distributed table over a
//! replicated table, remembering which batches were acknowledged; and an observer that samples
//! the cluster's status, its pods (every pod uid ever seen, from a watch) and, while the status
//! says `ready`, a query through every server's Distributed table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use clickhouse_operator::clickhouse::QueryOptions;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::support::*;

/// Rows per batch.
const ROWS: u64 = 10;
/// The writer stops by itself after this many batches.
const MAX_BATCHES: u64 = 1800;
/// How long the status may lag behind the pods before a sample counts against it (one
/// re-check after a pod event, with margin).
pub const STATUS_LAG: Duration = Duration::from_secs(7);

/// Each batch the writer sent: when, and why it failed if it did.
pub type Attempts = Vec<(Instant, Result<(), String>)>;

/// Rows per batch on one replica.
type RowsPerBatch = BTreeMap<u64, u64>;

/// The writer.
pub struct Workload {
    stop: Arc<AtomicBool>,
    /// The batches acknowledged, and each attempt: when, and why it failed if it did.
    task: tokio::task::JoinHandle<(Vec<u64>, Attempts)>,
    cluster: String,
}

impl Workload {
    /// Creates `default.events` (ReplicatedMergeTree) and `default.events_all` (Distributed,
    /// sharded by batch) on every server, then writes a batch every second.
    pub async fn start(client: &Client, ns: &str, cluster: &str) -> Workload {
        let ip = service_ip(client, ns, cluster).await;
        let ch = sql_client_at(client, ns, cluster, &ip, Duration::from_secs(30)).await;
        exec(&ch, &format!("CREATE TABLE IF NOT EXISTS default.events ON CLUSTER {cluster} (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/default/events', '{{replica}}') ORDER BY (batch, id)")).await;
        exec(&ch, &format!("CREATE TABLE IF NOT EXISTS default.events_all ON CLUSTER {cluster} AS default.events ENGINE = Distributed({cluster}, default, events, batch)")).await;
        let mut writer = sql_client_at(client, ns, cluster, &ip, Duration::from_secs(5)).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (k8s, namespace, name) = (client.clone(), ns.to_string(), cluster.to_string());
        let mut address = ip;
        let task = tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut attempts = Attempts::new();
            let options = QueryOptions::new().setting("insert_distributed_sync", 1);
            for batch in 1..=MAX_BATCHES {
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                let started = Instant::now();
                let sql = format!(
                    "INSERT INTO default.events_all SELECT {batch} AS batch, number AS id FROM system.numbers LIMIT {ROWS}"
                );
                let result = writer.exec(&sql, &options).await;
                attempts.push((
                    started,
                    result
                        .as_ref()
                        .map(|_| ())
                        .map_err(|e| e.to_string().chars().take(160).collect()),
                ));
                if result.is_ok() {
                    acked.push(batch);
                } else if let Ok(Some(ip)) = Api::<Service>::namespaced(k8s.clone(), &namespace)
                    .get_opt(&name)
                    .await
                    .map(|s| s.and_then(|s| s.spec?.cluster_ip))
                    && ip != address
                {
                    // the cluster was created again: its new client Service
                    writer =
                        sql_client_at(&k8s, &namespace, &name, &ip, Duration::from_secs(5)).await;
                    address = ip;
                }
                tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
            }
            (acked, attempts)
        });
        Workload {
            stop,
            task,
            cluster: cluster.to_string(),
        }
    }

    /// Stops writing and checks, once the cluster is ready, that every acknowledged batch is on
    /// every replica of its shard with all its rows. Returns how many batches were acknowledged.
    pub async fn stop_and_check(self, client: &Client, ns: &str) -> usize {
        self.stop_and_check_attempts(client, ns)
            .await
            .iter()
            .filter(|(_, r)| r.is_ok())
            .count()
    }

    /// [`Workload::stop_and_check`], returning every attempt instead.
    pub async fn stop_and_check_attempts(self, client: &Client, ns: &str) -> Attempts {
        self.check(client, ns, false).await
    }

    /// [`Workload::stop_and_check`] where Keeper itself went down while rows were written: the
    /// replicas of a shard must agree on every acknowledged batch, and may differ on a batch
    /// whose insert failed. ClickHouse keeps a part whose commit to Keeper ended with an unknown
    /// status (the session lost mid-commit; the client got an error) on the replica that wrote
    /// it, and removes it only once it is five minutes old and still not in Keeper
    /// (`MAX_AGE_OF_LOCAL_PART_THAT_WASNT_ADDED_TO_ZOOKEEPER`), so for a while that replica
    /// alone holds it.
    pub async fn stop_and_check_after_keeper_loss(self, client: &Client, ns: &str) -> usize {
        self.check(client, ns, true)
            .await
            .iter()
            .filter(|(_, r)| r.is_ok())
            .count()
    }

    async fn check(self, client: &Client, ns: &str, keeper_lost: bool) -> Attempts {
        self.stop.store(true, Ordering::SeqCst);
        let (acked, attempts) = self.task.await.expect("the writer");
        assert!(!acked.is_empty(), "the writer had no batch acknowledged");
        let c: ClickHouseCluster = Api::namespaced(client.clone(), ns)
            .get(&self.cluster)
            .await
            .unwrap();
        let map = c.status.unwrap().replica_state_map;
        let mut shards: BTreeMap<i32, Vec<(String, RowsPerBatch)>> = BTreeMap::new();
        for (replica, entry) in &map {
            // Replication may need minutes to get past a peer that died mid-fetch (its old
            // address stops answering): the rows must arrive, not arrive at once.
            let pod: Pod = Api::namespaced(client.clone(), ns)
                .get(&format!("{replica}-0"))
                .await
                .unwrap();
            let ip = pod.status.and_then(|s| s.pod_ip).expect("an address");
            let ch = sql_client_at(client, ns, &self.cluster, &ip, Duration::from_secs(330)).await;
            ch.exec(
                "SYSTEM SYNC REPLICA default.events",
                &QueryOptions::new().setting("receive_timeout", 320),
            )
            .await
            .unwrap_or_else(|e| panic!("{replica}: SYSTEM SYNC REPLICA: {e}"));
            let counts: RowsPerBatch = query(
                &ch,
                "SELECT concat(toString(batch), ':', toString(count())) AS v FROM default.events GROUP BY batch",
            )
            .await
            .iter()
            .map(|v| {
                let (b, n) = v.split_once(':').unwrap();
                (b.parse().unwrap(), n.parse().unwrap())
            })
            .collect();
            shards
                .entry(entry.shard.get())
                .or_default()
                .push((replica.to_string(), counts));
        }
        let mut stored = BTreeSet::new();
        let acknowledged: BTreeSet<u64> = acked.iter().copied().collect();
        for (shard, replicas) in shards.iter_mut() {
            if keeper_lost {
                for (replica, counts) in replicas.iter_mut() {
                    let failed: Vec<u64> = counts
                        .keys()
                        .filter(|b| !acknowledged.contains(b))
                        .copied()
                        .collect();
                    if !failed.is_empty() {
                        println!(
                            "shard {shard}: {replica} holds batches whose insert failed: {failed:?}"
                        );
                    }
                    counts.retain(|b, _| acknowledged.contains(b));
                }
            }
            let (first, reference) = &replicas[0];
            for (replica, counts) in &replicas[1..] {
                assert_eq!(
                    counts, reference,
                    "shard {shard}: {replica} and {first} hold different rows"
                );
            }
            for (batch, n) in reference {
                assert_eq!(*n, ROWS, "shard {shard}: batch {batch} has {n} rows");
                stored.insert(*batch);
            }
        }
        let lost: Vec<&u64> = acked.iter().filter(|b| !stored.contains(b)).collect();
        assert!(
            lost.is_empty(),
            "acknowledged batches lost: {lost:?} (of {})",
            acked.len()
        );
        attempts
    }
}

/// One sample of the observer.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Instant,
    pub state: ClusterState,
    /// `status.clickhouse.ready` / `status.keeper.ready`.
    pub status_ready: (i32, i32),
    /// Server and Keeper pods that are Ready.
    pub pods_ready: (i32, i32),
    /// Pods that exist, and of those the ones not Ready, by name.
    pub not_ready: Vec<String>,
    /// While `ready`: servers through which a Distributed query failed.
    pub query_failed: Vec<String>,
}

/// The observer.
pub struct Observer {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    uids: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn component(p: &Pod) -> &str {
    p.labels()
        .get("app.kubernetes.io/component")
        .map_or("", String::as_str)
}

impl Observer {
    /// Samples every second until stopped (or for at most 30 minutes).
    pub async fn start(client: &Client, ns: &str, cluster: &str) -> Observer {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let uids = Arc::new(Mutex::new(BTreeMap::<String, BTreeSet<String>>::new()));
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let watch = {
            let (pods, uids, stop) = (pods.clone(), uids.clone(), stop.clone());
            tokio::spawn(async move {
                let mut events = watcher(pods, watcher::Config::default()).boxed();
                while !stop.load(Ordering::SeqCst) {
                    let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
                    let Ok(Some(Ok(event))) = next else { continue };
                    let seen: Vec<Pod> = match event {
                        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => vec![p],
                        watcher::Event::Delete(p) => vec![p],
                        _ => Vec::new(),
                    };
                    let mut u = uids.lock().unwrap();
                    for p in seen {
                        u.entry(p.name_any())
                            .or_default()
                            .insert(p.uid().unwrap_or_default());
                    }
                }
            })
        };
        let sampler = {
            let (client, ns, cluster) = (client.clone(), ns.to_string(), cluster.to_string());
            let (samples, stop) = (samples.clone(), stop.clone());
            tokio::spawn(async move {
                let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
                for _ in 0..1800 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let started = Instant::now();
                    if let Some(s) = sample(&client, &clusters, &pods, &ns, &cluster).await {
                        samples.lock().unwrap().push(s);
                    }
                    tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed()))
                        .await;
                }
            })
        };
        Observer {
            stop,
            samples,
            uids,
            tasks: vec![watch, sampler],
        }
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// Every uid seen per pod name so far.
    pub fn uids(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.uids.lock().unwrap().clone()
    }

    /// Stops and returns the samples.
    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        let samples = self.samples.clone();
        for t in self.tasks {
            let _ = t.await;
        }
        samples.lock().unwrap().clone()
    }
}

async fn sample(
    client: &Client,
    clusters: &Api<ClickHouseCluster>,
    pods: &Api<Pod>,
    ns: &str,
    cluster: &str,
) -> Option<Sample> {
    let at = Instant::now();
    let status = clusters.get(cluster).await.ok()?.status?;
    let list = pods.list(&ListParams::default()).await.ok()?.items;
    let count = |which: &str| {
        list.iter()
            .filter(|p| component(p) == which && ready(p))
            .count() as i32
    };
    let mut query_failed = Vec::new();
    if status.state == ClusterState::Ready {
        for p in list.iter().filter(|p| component(p) == "server" && ready(p)) {
            let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                continue;
            };
            let ch = sql_client_at(client, ns, cluster, &ip, Duration::from_secs(3)).await;
            let q = "SELECT count() AS v FROM default.events_all";
            if ch.query(q, &QueryOptions::new()).await.is_err() {
                query_failed.push(p.name_any());
            }
        }
    }
    Some(Sample {
        at,
        state: status.state,
        status_ready: (status.clickhouse.ready, status.keeper.ready),
        pods_ready: (count("server"), count("keeper")),
        not_ready: list
            .iter()
            .filter(|p| !ready(p))
            .map(|p| p.name_any())
            .collect(),
        query_failed,
    })
}

/// The longest stretch of consecutive samples for which `bad` holds, and the first sample of it.
pub fn longest_run(
    samples: &[Sample],
    bad: impl Fn(&Sample) -> bool,
) -> (Duration, Option<Sample>) {
    let mut best = (Duration::ZERO, None);
    let mut start: Option<&Sample> = None;
    for s in samples {
        match (bad(s), start) {
            (true, None) => start = Some(s),
            (true, Some(first)) => {
                let d = s.at - first.at;
                if d > best.0 {
                    best = (d, Some(first.clone()));
                }
            }
            (false, _) => start = None,
        }
    }
    best
}

/// Invariants 5 and 10, checked on every sample: `ready` is never said for longer than
/// [`STATUS_LAG`] while a pod is not Ready or a Distributed query through a server fails, and
/// the status's counts of Ready pods follow the pods within the same lag.
pub fn assert_status_truthful(samples: &[Sample]) {
    assert_status_truthful_within(samples, STATUS_LAG);
}

/// [`assert_status_truthful`] with the counts allowed to lag `counts_lag` (a test whose passes
/// wait on members in election); `ready` is never allowed to lie longer than [`STATUS_LAG`].
pub fn assert_status_truthful_within(samples: &[Sample], counts_lag: Duration) {
    assert!(samples.len() > 5, "too few samples: {}", samples.len());
    let (lie, first) = longest_run(samples, |s| {
        s.state == ClusterState::Ready && (!s.not_ready.is_empty() || !s.query_failed.is_empty())
    });
    assert!(
        lie <= STATUS_LAG,
        "ready for {lie:?} while pods were not Ready or queries failed: {first:?}"
    );
    let (behind, first) = longest_run(samples, |s| s.status_ready != s.pods_ready);
    assert!(
        behind <= counts_lag,
        "the status's ready counts were wrong for {behind:?}: {first:?}"
    );
    let max_lie = longest_run(samples, |s| s.status_ready != s.pods_ready).0;
    println!(
        "status samples: {}, longest count mismatch {max_lie:?}, longest ready-while-not {lie:?}",
        samples.len()
    );
}
