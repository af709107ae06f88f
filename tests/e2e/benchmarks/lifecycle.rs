//! The lifecycle benchmark (`hack/bench.sh lifecycle`): a 2×2 cluster created, grown, rolled and
//! scaled in, timed step by step with the operator's requests and writes.

use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

use super::{audit, describe_tally, install_operator, tally_writes};
use crate::support::*;

/// Seconds from `start` until `probe` holds (polled every 100 ms), or a panic after `timeout`.
async fn seconds_until<F, Fut>(start: Instant, timeout: Duration, what: &str, mut probe: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if probe().await {
            return start.elapsed().as_secs_f64();
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When each part of a creation happened, in seconds from the create: the first Keeper and
/// server pods exist, all Keeper and all server pods are Ready, the status is `ready`.
struct CreationMarks {
    keeper_pod: f64,
    server_pod: f64,
    keeper: f64,
    servers: f64,
    ready: f64,
}

impl CreationMarks {
    /// The creation's time during which no pod of the cluster was starting (from its object's
    /// creation to Ready): the operator's own share, plus the API server's and the
    /// scheduler's.
    fn own(&self) -> f64 {
        let mut spans = [
            (self.keeper_pod, self.keeper),
            (self.server_pod, self.servers),
        ];
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (first, second) = (spans[0], spans[1]);
        let starting = if second.0 <= first.1 {
            first.1.max(second.1) - first.0
        } else {
            (first.1 - first.0) + (second.1 - second.0)
        };
        self.ready - starting
    }
}

/// Polls the cluster `c1` of `ns` every 100 ms from its creation at `t` until every mark of a
/// creation of `servers` server pods and `members` Keeper members is seen.
async fn creation_marks(
    client: &kube::Client,
    ns: &str,
    t: Instant,
    servers: usize,
    members: usize,
    limit: Duration,
) -> CreationMarks {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let mut m: [Option<f64>; 5] = [None; 5];
    while m.iter().any(Option::is_none) {
        assert!(
            t.elapsed() < limit,
            "timed out waiting for the creation: {m:?}"
        );
        let now = t.elapsed().as_secs_f64();
        let l = pods
            .list(&ListParams::default().labels("clickhouse.com/cluster=c1"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let of = |c: &str| {
            l.iter()
                .filter(|p| {
                    kube::ResourceExt::labels(*p)
                        .get("app.kubernetes.io/component")
                        .map(String::as_str)
                        == Some(c)
                })
                .collect::<Vec<_>>()
        };
        let (k, sv) = (of("keeper"), of("server"));
        let ready = |v: &[&Pod], n: usize| {
            v.len() == n
                && v.iter()
                    .all(|p| clickhouse_operator::plan::facts::pod_ready(p))
        };
        let status = clusters
            .get("c1")
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|s| s.state == ClusterState::Ready && s.observed_generation == Some(1));
        for (i, seen) in [
            !k.is_empty(),
            !sv.is_empty(),
            ready(&k, members),
            ready(&sv, servers),
            status,
        ]
        .into_iter()
        .enumerate()
        {
            if seen && m[i].is_none() {
                m[i] = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let [keeper_pod, server_pod, keeper, servers, ready] = m.map(Option::unwrap_or_default);
    CreationMarks {
        keeper_pod,
        server_pod,
        keeper,
        servers,
        ready,
    }
}

/// Benchmark (docs/internals.md, "Benchmarks"): the lifecycle of a 2×2 cluster with 3 Keeper
/// members under the operator from its chart, on real 18.16 servers: create (every pod Ready, then
/// status `ready`), add a shard, a rolling restart of every server (an environment variable added;
/// each pod restarted once), scale-in of a replica per shard. Printed: seconds from the change
/// to the pods and to the status, and the operator's requests per step from the audit log: its
/// writes by resource and verb, and those that changed nothing or were refused (with
/// `LOCAL_CLUSTER_AUDIT=writes`, which `hack/bench.sh lifecycle` sets). Run with
/// `hack/bench.sh lifecycle` (`BENCH_ROUNDS`, default 1).
#[tokio::test]
#[ignore = "a benchmark: hack/bench.sh lifecycle"]
async fn benchmark_lifecycle_of_a_two_by_two_cluster() {
    let client = client().await;
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let op_ns = namespace(&client, "lifeop").await;
    // BENCH_DEBUG_LOG=1: the operator's debug log, to see where a step's time goes
    install_operator(&client, &op_ns, std::env::var("BENCH_DEBUG_LOG").is_ok()).await;
    let user = format!("system:serviceaccount:{op_ns}:op-clickhouse-operator");
    let mut rows = Vec::new();
    let mut request_rows = Vec::new();
    let mut write_rows = Vec::new();
    let mut creation_rows = Vec::new();
    // BENCH_SERVER_IMAGE: the image the cluster names, 18.16.1 by default as the local kubelet
    // runs (a tag of 21.3 or later starts the servers beside Keeper, decision 58; this
    // benchmark runs no `ON CLUSTER` statement, which 18.16 would then not run)
    let image = std::env::var("BENCH_SERVER_IMAGE").unwrap_or_else(|_| SERVER_IMAGE.into());
    // reads and writes of the operator from `since` until now (leases and Events apart)
    let requests = |since: &str| {
        let until = k8s_openapi::jiff::Timestamp::now().to_string();
        let all = audit(&user, since, &until);
        let count = |f: &dyn Fn(&str, &str) -> bool| -> usize {
            all.iter()
                .filter(|((v, r), _)| f(v, r))
                .map(|(_, c)| c)
                .sum()
        };
        let read = |v: &str| ["get", "list"].contains(&v);
        let other = |r: &str| r != "leases" && r != "events";
        (
            count(&|v, r| read(v) && other(r)),
            count(&|v, r| !read(v) && v != "watch" && other(r)),
            count(&|v, r| v != "watch" && r == "events"),
            count(&|v, r| !read(v) && v != "watch" && r == "clickhouseclusters/status"),
            count(&|v, r| v != "watch" && r == "leases"),
            tally_writes(&user, since, &until),
        )
    };
    for round in 0..rounds {
        let ns = namespace(&client, &format!("life{round}")).await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
        let ready_pods = |component: &'static str, want: usize| {
            let pods = pods.clone();
            async move {
                let l = pods
                    .list(&ListParams::default().labels(&format!(
                        "clickhouse.com/cluster=c1,app.kubernetes.io/component={component}"
                    )))
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                l.len() == want && l.iter().all(clickhouse_operator::plan::facts::pod_ready)
            }
        };
        let status_ready = |generation: i64| {
            let clusters = clusters.clone();
            async move {
                clusters
                    .get("c1")
                    .await
                    .ok()
                    .and_then(|c| c.status)
                    .is_some_and(|s| {
                        s.state == ClusterState::Ready && s.observed_generation == Some(generation)
                    })
            }
        };
        let limit = Duration::from_secs(600);
        let mut steps = Vec::new();
        // create
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let t = Instant::now();
        create_cluster(
            &client,
            &ns,
            "c1",
            json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"},
                   "image": image}),
        )
        .await;
        let marks = creation_marks(&client, &ns, t, 4, 3, limit).await;
        let (keeper, servers, created) = (marks.keeper, marks.servers, marks.ready);
        creation_rows.push(format!(
            "{round:>5} {:>9.1} {keeper:>8.1} {:>9.1} {servers:>9.1} {created:>8.1} {:>6.2}",
            marks.keeper_pod,
            marks.server_pod,
            marks.own()
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
        steps.push(("create", requests(&since)));
        // add a shard
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let t = Instant::now();
        patch_spec(&client, &ns, "c1", json!({"shards": 3})).await;
        let shard_pods =
            seconds_until(t, limit, "new shard Ready", || ready_pods("server", 6)).await;
        let shard_ready = seconds_until(t, limit, "ready", || status_ready(2)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        steps.push(("add shard", requests(&since)));
        // one server pod's restart on its own (deleted, then Ready again): the unit of the
        // roll's target, 1.2 × replicas per shard × this
        let selector = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";
        let mut names: Vec<String> = pods
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        let victim = names.pop().expect("server pods");
        let victim = victim.as_str();
        let old_uid = pods.get(victim).await.unwrap().metadata.uid;
        let t = Instant::now();
        pods.delete(victim, &DeleteParams::default()).await.unwrap();
        let one_pod = seconds_until(t, limit, "the deleted pod Ready again", || {
            let (pods, old_uid) = (pods.clone(), old_uid.clone());
            async move {
                pods.get_opt(victim).await.ok().flatten().is_some_and(|p| {
                    p.metadata.uid != old_uid && clickhouse_operator::plan::facts::pod_ready(&p)
                })
            }
        })
        .await;
        let _ = seconds_until(Instant::now(), limit, "ready again", || status_ready(2)).await;
        // rolling restart of every server
        let before = pod_ids(&client, &ns, selector).await;
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let t = Instant::now();
        patch_spec(
            &client,
            &ns,
            "c1",
            json!({"pod": {"env": [{"name": "BENCH_ROLL", "value": "1"}]}}),
        )
        .await;
        let rolled = seconds_until(t, limit, "ready", || status_ready(3)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        steps.push(("roll", requests(&since)));
        let after = pod_ids(&client, &ns, selector).await;
        let restarted = before
            .iter()
            .filter(|(n, (uid, _))| after.get(*n).is_some_and(|(u, _)| u != uid))
            .count();
        // scale-in: one replica per shard leaves
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let t = Instant::now();
        patch_spec(&client, &ns, "c1", json!({"replicas": 1})).await;
        let scaled = seconds_until(t, limit, "ready", || status_ready(4)).await;
        let scaled_pods = seconds_until(t, limit, "3 servers", || ready_pods("server", 3)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        steps.push(("scale-in", requests(&since)));
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        tokio::time::sleep(Duration::from_secs(60)).await;
        steps.push(("idle minute", requests(&since)));
        for (step, (reads, writes, events, status, leases, tally)) in steps {
            let total = |f: fn(&(usize, usize, usize)) -> usize| -> usize {
                tally
                    .iter()
                    .filter(|((r, _), _)| r != "leases")
                    .map(|(_, t)| f(t))
                    .sum()
            };
            request_rows.push(format!(
                "{round:>5} {step:>12} {reads:>6} {writes:>7} {status:>7} {events:>7} {leases:>7} {:>7} {:>8} {:>7}",
                total(|t| t.0),
                total(|t| t.1),
                total(|t| t.2),
            ));
            write_rows.push(format!("{round:>5} {step:>12}: {}", describe_tally(&tally)));
        }
        // the roll's target: 1.2 × R (2 replicas per shard) × one pod's restart
        let roll_ratio = rolled / (2.0 * one_pod);
        let row = format!(
            "{round:>5} {keeper:>8.1} {servers:>9.1} {created:>8.1} {shard_pods:>9.1} {shard_ready:>9.1} {one_pod:>7.1} {rolled:>9.1} {roll_ratio:>7.2} {restarted:>4}/6 {scaled_pods:>9.1} {scaled:>9.1}"
        );
        println!("{row}");
        rows.push(row);
        let _ = clusters.delete("c1", &DeleteParams::default()).await;
        let _ = seconds_until(Instant::now(), limit, "pods gone", || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default())
                    .await
                    .is_ok_and(|l| l.items.is_empty())
            }
        })
        .await;
    }
    println!();
    println!(
        "operator from its chart ({} build), a 2×2 cluster with 3 Keeper members, real 18.16; \
         pod s: one server pod deleted until Ready again; roll/2p: roll rdy ÷ (2 replicas × pod s)",
        if std::env::var("BENCH_RELEASE").is_ok_and(|v| v == "1") {
            "release"
        } else {
            "debug"
        }
    );
    println!(
        "{:>5} {:>8} {:>9} {:>8} {:>9} {:>9} {:>7} {:>9} {:>7} {:>6} {:>9} {:>9}",
        "round",
        "keeper s",
        "servers s",
        "ready s",
        "shard pod",
        "shard rdy",
        "pod s",
        "roll rdy",
        "roll/2p",
        "once",
        "in pods",
        "in ready"
    );
    for r in rows {
        println!("{r}");
    }
    println!();
    println!(
        "creation of {image}: seconds from the create to the first Keeper pod, all Keeper pods \
         Ready, the first server pod, all server pods Ready, status ready; own: the time no pod \
         was starting (the operator's share, with the API server's and the scheduler's)"
    );
    println!(
        "{:>5} {:>9} {:>8} {:>9} {:>9} {:>8} {:>6}",
        "round", "keeper pod", "keeper s", "server pod", "servers s", "ready s", "own s"
    );
    for r in creation_rows {
        println!("{r}");
    }
    println!();
    println!(
        "the operator's requests per step (audit log; the step's change until 3 s after its \
         last figure; the idle minute after scale-in): reads (get, list), writes (Events and \
         Lease renewals apart), of them status writes, Events written, Lease requests; all \
         writes but the Lease's (Events included), of them those that changed nothing (answered \
         with the resourceVersion an earlier write of the object had) and those refused"
    );
    println!(
        "{:>5} {:>12} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>7}",
        "round",
        "step",
        "reads",
        "writes",
        "status",
        "events",
        "leases",
        "all w",
        "nothing",
        "refused"
    );
    for r in request_rows {
        println!("{r}");
    }
    println!();
    println!("the operator's writes per step by resource and verb (Lease renewals apart)");
    for r in write_rows {
        println!("{r}");
    }
    helm_run(&["uninstall", "op", "-n", &op_ns, "--wait"]);
}
