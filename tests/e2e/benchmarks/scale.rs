//! The scale benchmark (`hack/bench.sh scale`): the operator in front of N single-replica
//! clusters, its idle cost and the status lag.

use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

use super::{audit, install_operator};
use crate::support::*;

/// The pod annotation of the local kubelet's light mode (`local-kubelet/src/hollow.rs`).
const HOLLOW: &str = "local-kubelet.clickhouse.com/hollow";

/// (resident MiB, of them anonymous MiB, CPU seconds) of a process. The rest of its resident
/// memory is file pages: the binary's code and data as far as they ran, shared and clean.
fn usage(pid: i32) -> (f64, f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let (rss_kib, anon_kib) = (kib("VmRSS:"), kib("RssAnon:"));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // the fields after the command, which is in parentheses
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (rss_kib / 1024.0, anon_kib / 1024.0, ticks / hz)
}

/// The operator's `/metrics` at `addr`.
async fn metrics(addr: &str) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// How many idle checks stopped at a glance (decision 60), from the operator's `/metrics`.
fn glances(metrics: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("clickhouse_operator_cluster_observations_total{")
                && l.contains("source=\"glance\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The cumulative buckets of the pass duration histogram of clusters, from the operator's
/// `/metrics`: (upper bound, count).
fn pass_buckets(metrics: &str) -> Vec<(f64, f64)> {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("clickhouse_operator_reconcile_duration_seconds_bucket{")
                && l.contains("kind=\"ClickHouseCluster\"")
        })
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The bucket bound under which `q` of the passes between two snapshots finished.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> String {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - b)
        })
        .collect();
    let total = counts.last().map_or(0.0, |(_, n)| *n);
    if total == 0.0 {
        return "no passes".into();
    }
    let le = counts
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map_or(f64::INFINITY, |(le, _)| *le);
    format!("≤ {le} s")
}

/// How many passes finished between two snapshots of the histogram.
fn passes(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let total = |b: &[(f64, f64)]| b.last().map_or(0.0, |(_, n)| *n);
    total(after) - total(before)
}

/// Polls, every 20 ms, until `pod_ready(pod)` becomes `want` and then until the cluster's status
/// says so (`clickhouse.ready` 1 or 0): the status lag.
async fn status_lag(
    pods: &Api<Pod>,
    clusters: &Api<ClickHouseCluster>,
    pod: &str,
    cluster: &str,
    want: bool,
) -> (Duration, Duration) {
    let started = Instant::now();
    let mut pod_at = None;
    let mut status_at = None;
    while pod_at.is_none() || status_at.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{pod} ready={want} and its status"
        );
        if pod_at.is_none() {
            let ready = pods.get_opt(pod).await.ok().flatten().is_some_and(|p| {
                p.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready == want {
                pod_at = Some(started.elapsed());
            }
        }
        if status_at.is_none() {
            let c = clusters.get(cluster).await.unwrap();
            let ready = c.status.map_or(0, |s| s.clickhouse.ready);
            if (ready == 1) == want {
                status_at = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (pod_at.unwrap(), status_at.unwrap())
}

/// Benchmark (docs/internals.md, "Benchmarks"): for each N in `BENCH_CLUSTERS` (default "1 20"),
/// the operator from its chart (one replica, watching every namespace) creates N single-replica
/// clusters, each in a namespace of its own; printed: the operator's resident memory before any
/// cluster (`RSS 0`, and of it the anonymous memory, `anon 0`), the time until all are `ready`, then over one idle minute the operator's
/// API requests (beyond its leader Lease) per minute and per cluster, its CPU seconds and
/// resident memory, the idle passes (health checks) per cluster and minute, the share of them
/// that ended at a glance (decision 60) and the operator's CPU per pass, the p50/p99 of the
/// idle passes, and the status lag when one server pod becomes unready and Ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: hack/bench.sh scale"]
async fn benchmark_idle_cost_and_status_lag_of_n_clusters() {
    let counts: Vec<usize> = std::env::var("BENCH_CLUSTERS")
        .unwrap_or_else(|_| "1 20".into())
        .split_whitespace()
        .map(|n| n.parse().expect("BENCH_CLUSTERS: numbers"))
        .collect();
    let idle = Duration::from_secs(
        std::env::var("BENCH_IDLE_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let client = client().await;
    // BENCH_OPERATOR_LOG=1: the operator logs at debug level and the end of its log is printed
    // after the status lag is measured
    let show_log = std::env::var("BENCH_OPERATOR_LOG").is_ok();
    // BENCH_REAL: how many of the clusters run real ClickHouse servers (the first ones); the
    // others are hollow servers of the local kubelet's light mode
    let real_max: usize = std::env::var("BENCH_REAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let mut rows = Vec::new();
    for n in counts {
        let real = n.min(real_max);
        // the operator in a namespace of its own, watching every namespace (a ClusterRole); one
        // cluster per namespace (decision 18)
        let ns = namespace(&client, "scale").await;
        let mut cluster_namespaces = Vec::new();
        for _ in 0..n {
            cluster_namespaces.push(namespace(&client, &format!("scale-n{n}")).await);
        }
        let (op_pod, op_ip) = install_operator(&client, &ns, show_log).await;
        let pid = pid_of("clickhouse-operator", &op_pod, None);
        let user = format!("system:serviceaccount:{ns}:op-clickhouse-operator");
        // the operator's resident memory before it has any cluster (its watches started)
        tokio::time::sleep(Duration::from_secs(15)).await;
        let (rss_empty, anon_empty, _) = usage(pid);
        let started = Instant::now();
        for (i, cns) in cluster_namespaces.iter().enumerate() {
            let mut spec = json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 0},
                "storage": {"size": "1Gi"}});
            if i >= real {
                // a hollow server of version 24.8 (local-kubelet/src/hollow.rs)
                spec["image"] = json!("clickhouse/clickhouse-server:24.8");
                spec["pod"] = json!({"annotations": {HOLLOW: "true"}});
            }
            create_cluster(&client, cns, &format!("c{i}"), spec).await;
        }
        let all_clusters: Api<ClickHouseCluster> = Api::all(client.clone());
        let ours = |c: &ClickHouseCluster| {
            cluster_namespaces.contains(c.metadata.namespace.as_ref().unwrap())
        };
        // every cluster ready, with the progress every 15 s (and, at the end, what the others
        // wait for)
        let deadline = Duration::from_secs(120 + 10 * n as u64);
        let mut shown = Duration::ZERO;
        loop {
            let l: Vec<ClickHouseCluster> = all_clusters
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(ours)
                .collect();
            let ready = l
                .iter()
                .filter(|c| {
                    c.status
                        .as_ref()
                        .is_some_and(|s| s.state == ClusterState::Ready)
                })
                .count();
            if ready == n {
                break;
            }
            let waiting = || {
                l.iter()
                    .filter(|c| {
                        c.status
                            .as_ref()
                            .is_none_or(|s| s.state != ClusterState::Ready)
                    })
                    .map(|c| {
                        format!(
                            "{}: {:?}",
                            c.metadata.name.as_deref().unwrap_or_default(),
                            c.status.as_ref().map(|s| (s.state, s.message.clone()))
                        )
                    })
                    .collect::<Vec<_>>()
            };
            if started.elapsed() > deadline {
                panic!(
                    "{ready} of {n} clusters ready after {deadline:?}: {:#?}",
                    waiting()
                );
            }
            if started.elapsed() >= shown + Duration::from_secs(15) {
                shown = started.elapsed();
                println!(
                    "{:>5.0} s: {ready} of {n} clusters ready",
                    shown.as_secs_f64()
                );
            }
            // listing every cluster is itself load on the API server: less often for many
            tokio::time::sleep(Duration::from_millis(if n > 100 { 2000 } else { 200 })).await;
        }
        let ready_after = started.elapsed();
        // let the passes that follow creation finish
        tokio::time::sleep(Duration::from_secs(15)).await;
        let metrics_addr = format!("{op_ip}:8080");
        let m = metrics(&metrics_addr).await;
        let (before, glances_before) = (pass_buckets(&m), glances(&m));
        let (_, _, cpu0) = usage(pid);
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        tokio::time::sleep(idle).await;
        let until = k8s_openapi::jiff::Timestamp::now().to_string();
        let (rss, anon, cpu1) = usage(pid);
        let m = metrics(&metrics_addr).await;
        let (after, glanced) = (pass_buckets(&m), glances(&m) - glances_before);
        let requests = audit(&user, &since, &until);
        let minutes = idle.as_secs_f64() / 60.0;
        let is_lease = |r: &str| r == "leases";
        let writes: usize = requests
            .iter()
            .filter(|((v, r), _)| !is_lease(r) && !["get", "list", "watch"].contains(&v.as_str()))
            .map(|(_, c)| c)
            .sum();
        let reads: usize = requests
            .iter()
            .filter(|((v, r), _)| !is_lease(r) && ["get", "list", "watch"].contains(&v.as_str()))
            .map(|(_, c)| c)
            .sum();
        let lease: usize = requests
            .iter()
            .filter(|((_, r), _)| is_lease(r))
            .map(|(_, c)| c)
            .sum();
        println!("{n} clusters, idle requests by kind: {requests:?}");
        // status lag: one server pod restarted (unready, then Ready again)
        let victim = "c0-0-0-0";
        let pods: Api<Pod> = Api::namespaced(client.clone(), &cluster_namespaces[0]);
        let clusters: Api<ClickHouseCluster> =
            Api::namespaced(client.clone(), &cluster_namespaces[0]);
        pods.delete(victim, &DeleteParams::default()).await.unwrap();
        let (p_down, s_down) = status_lag(&pods, &clusters, victim, "c0", false).await;
        let (p_up, s_up) = status_lag(&pods, &clusters, victim, "c0", true).await;
        if show_log {
            let log = Api::<Pod>::namespaced(client.clone(), &ns)
                .logs(&op_pod, &Default::default())
                .await
                .unwrap_or_else(|e| format!("no log: {e}"));
            let tail: Vec<&str> = log.lines().rev().take(150).collect();
            for l in tail.into_iter().rev() {
                println!("operator: {l}");
            }
            println!("lag: pod down {p_down:?} status {s_down:?}; pod up {p_up:?} status {s_up:?}");
        }
        // the idle health checks: how often a cluster was passed, and the CPU of one pass
        let idle_passes = passes(&before, &after);
        let row = format!(
            "{n:>5} {real:>6} {:>9.1} {:>9.2} {:>9.2} {:>7} {:>8.2} {:>9.1} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>9} {:>10} {:>10}",
            ready_after.as_secs_f64(),
            reads as f64 / minutes / n as f64,
            writes as f64 / minutes / n as f64,
            lease,
            cpu1 - cpu0,
            idle_passes / minutes / n as f64,
            if idle_passes > 0.0 {
                format!("{:.0} %", glanced * 100.0 / idle_passes)
            } else {
                "-".into()
            },
            if idle_passes > 0.0 {
                (cpu1 - cpu0) * 1000.0 / idle_passes
            } else {
                0.0
            },
            rss_empty,
            rss,
            anon_empty,
            anon,
            quantile(&before, &after, 0.5),
            quantile(&before, &after, 0.99),
            format!("{:.2} s", s_down.as_secs_f64() - p_down.as_secs_f64()),
            format!("{:.2} s", s_up.as_secs_f64() - p_up.as_secs_f64()),
            real = n - real,
        );
        println!("{row}");
        rows.push(row);
        for cns in &cluster_namespaces {
            Api::<ClickHouseCluster>::namespaced(client.clone(), cns)
                .delete_collection(&DeleteParams::default(), &Default::default())
                .await
                .unwrap();
        }
        wait_for(Duration::from_secs(300), "the clusters gone", || {
            let (all_clusters, ours) = (all_clusters.clone(), &ours);
            async move {
                (!all_clusters
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .any(ours))
                .then_some(())
            }
        })
        .await;
        helm_run(&["uninstall", "op", "-n", &ns, "--wait"]);
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
        for n in std::iter::once(&ns).chain(&cluster_namespaces) {
            let _ = namespaces.delete(n, &DeleteParams::default()).await;
        }
    }
    println!();
    println!(
        "operator from its chart (maxConcurrentReconciles {}), single-replica clusters: the \
         first {real_max} real 18.16 servers, the rest hollow (local kubelet light mode); idle \
         {idle:?}",
        std::env::var("BENCH_CONCURRENCY").unwrap_or_else(|_| "1".into())
    );
    println!(
        "{:>5} {:>6} {:>9} {:>9} {:>9} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10}",
        "N",
        "hollow",
        "ready s",
        "reads/m/c",
        "writes/m/c",
        "lease",
        "cpu s",
        "passes/m/c",
        "glance",
        "ms/pass",
        "RSS 0",
        "RSS MiB",
        "anon 0",
        "anon MiB",
        "pass p50",
        "pass p99",
        "lag unready",
        "lag ready"
    );
    for r in rows {
        println!("{r}");
    }
}
