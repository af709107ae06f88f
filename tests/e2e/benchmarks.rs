//! The benchmarks of docs/internals.md, "Benchmarks" (not tests: they print figures and assert
//! nothing about speed): the operator installed by its chart as a pod of the local Kubernetes,
//! under its own ServiceAccount, in front of N real single-replica clusters (ClickHouse 18.16, no
//! Keeper). Run them with `hack/bench.sh scale` (`BENCH_CLUSTERS="1 20 50"` to choose N).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

use crate::support::*;

/// The pod annotation of the local kubelet's light mode (`local-kubelet/src/hollow.rs`).
const HOLLOW: &str = "local-kubelet.clickhouse.com/hollow";

/// (resident MiB, CPU seconds) of a process.
fn usage(pid: i32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
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
    (rss_kib / 1024.0, ticks / hz)
}

/// Requests of `user` received since `since` (RFC 3339), as (verb, resource) → count, from the
/// API server's audit log (the current file and the one rotated away, `audit-<time>.log`: a
/// thousand clusters' creation fills a file).
fn audit(user: &str, since: &str, until: &str) -> BTreeMap<(String, String), usize> {
    let mut seen = std::collections::HashSet::new();
    let mut out = BTreeMap::new();
    for line in audit_lines() {
        if !line.contains(user) {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let at = ev["requestReceivedTimestamp"].as_str().unwrap_or_default();
        if ev["user"]["username"] != user || at < since || at >= until {
            continue;
        }
        if !seen.insert(ev["auditID"].as_str().unwrap_or_default().to_string()) {
            continue;
        }
        let verb = ev["verb"].as_str().unwrap_or_default().to_string();
        let o = &ev["objectRef"];
        let mut resource = o["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        *out.entry((verb, resource)).or_default() += 1;
    }
    out
}

/// The lines of the API server's audit log files (the current one and the one rotated away).
fn audit_lines() -> impl Iterator<Item = String> {
    let dir = kubeconfig().parent().unwrap().to_path_buf();
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            n.starts_with("audit") && n.ends_with(".log")
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|path| std::io::BufReader::new(std::fs::File::open(path).unwrap()).lines())
        .map_while(Result::ok)
}

/// One write (create, update, patch, delete) as the audit log records it when the local
/// Kubernetes runs with `LOCAL_CLUSTER_AUDIT=writes` (the request and its answer).
#[derive(Clone, Debug)]
struct Write {
    user: String,
    at: String,
    verb: String,
    /// `resource` or `resource/subresource`.
    resource: String,
    /// The HTTP status of the answer.
    code: u64,
    /// The object written (its uid; a name where the answer has none) and the resourceVersion
    /// the answer gave it.
    object: String,
    version: Option<String>,
}

/// Every completed write of the audit log, of every user, with its answer; empty when the log
/// does not record answers (`LOCAL_CLUSTER_AUDIT` unset).
fn audit_writes() -> Vec<Write> {
    let mut out = Vec::new();
    for line in audit_lines() {
        if !line.contains("\"level\":\"RequestResponse\"") {
            continue;
        }
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if ev["stage"] != "ResponseComplete" {
            continue;
        }
        let o = &ev["objectRef"];
        let mut resource = o["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let answer = &ev["responseObject"]["metadata"];
        let object = answer["uid"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| {
                format!(
                    "{}/{}/{}",
                    o["resource"].as_str().unwrap_or_default(),
                    o["namespace"].as_str().unwrap_or_default(),
                    o["name"].as_str().unwrap_or_default()
                )
            });
        out.push(Write {
            user: ev["user"]["username"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            at: ev["requestReceivedTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            verb: ev["verb"].as_str().unwrap_or_default().to_string(),
            resource,
            code: ev["responseStatus"]["code"].as_u64().unwrap_or(0),
            object,
            version: answer["resourceVersion"].as_str().map(str::to_string),
        });
    }
    out.sort_by(|a, b| a.at.cmp(&b.at));
    out
}

/// What a write did: it changed its object, it changed nothing (it was answered with a
/// resourceVersion an earlier write of the same object had already been answered with: the
/// object was as the write wanted it), or it was refused (a conflict, a missing object, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    Changed,
    Nothing,
    Refused,
}

/// The effect of each of `writes` (ordered by arrival).
fn effects(writes: &[Write]) -> Vec<Effect> {
    let mut seen = std::collections::HashSet::new();
    writes
        .iter()
        .map(|w| {
            if w.code >= 300 {
                return Effect::Refused;
            }
            // a deletion answers with the object as it was (or a Status): always a change
            if w.verb.starts_with("delete") {
                return Effect::Changed;
            }
            match &w.version {
                Some(v) if !seen.insert((w.object.clone(), v.clone())) => Effect::Nothing,
                _ => Effect::Changed,
            }
        })
        .collect()
}

/// The writes of `user` received in [since, until), by (resource, verb): (writes, of them
/// changing nothing, refused).
type WriteTally = BTreeMap<(String, String), (usize, usize, usize)>;

fn tally_writes(user: &str, since: &str, until: &str) -> WriteTally {
    let writes = audit_writes();
    let effects = effects(&writes);
    let mut out = WriteTally::new();
    for (w, e) in writes.iter().zip(effects) {
        if w.user != user || w.at.as_str() < since || w.at.as_str() >= until {
            continue;
        }
        let t = out.entry((w.resource.clone(), w.verb.clone())).or_default();
        t.0 += 1;
        t.1 += usize::from(e == Effect::Nothing);
        t.2 += usize::from(e == Effect::Refused);
    }
    out
}

/// `tally` as one line: `resource verb N (n changed nothing, m refused)`, leases apart.
fn describe_tally(tally: &WriteTally) -> String {
    tally
        .iter()
        .filter(|((r, _), _)| r != "leases")
        .map(|((r, v), (n, nothing, refused))| {
            let mut notes = Vec::new();
            if *nothing > 0 {
                notes.push(format!("{nothing} changed nothing"));
            }
            if *refused > 0 {
                notes.push(format!("{refused} refused"));
            }
            if notes.is_empty() {
                format!("{r} {v} {n}")
            } else {
                format!("{r} {v} {n} ({})", notes.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How many idle checks stopped at a glance (decision 60), from the operator's `/metrics`.
async fn glances(addr: &str) -> f64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| {
            l.starts_with("clickhouse_operator_cluster_observations_total{")
                && l.contains("source=\"glance\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The cumulative buckets of the pass duration histogram of clusters, from the operator's
/// `/metrics`: (upper bound, count).
async fn pass_buckets(addr: &str) -> Vec<(f64, f64)> {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
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

/// Installs the operator from its chart into `ns` (one replica, watching every namespace, the
/// locally built image) and waits for its pod: (pod name, pod address).
async fn install_operator(client: &kube::Client, ns: &str, debug_log: bool) -> (String, String) {
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/clickhouse-operator");
    helm_run(&[
        "install",
        "op",
        &chart.to_string_lossy(),
        "-n",
        ns,
        "--skip-crds",
        "--set",
        "pvcCleaner.enabled=false",
        "--set",
        "image.repository=localhost/clickhouse-operator",
        "--set",
        "image.tag=dev",
        // one replica: the one measured is the leader
        "--set",
        "replicaCount=1",
        // BENCH_CONCURRENCY: passes run at once (the chart's maxConcurrentReconciles, default 1)
        "--set",
        &format!(
            "maxConcurrentReconciles={}",
            std::env::var("BENCH_CONCURRENCY").unwrap_or_else(|_| "1".into())
        ),
        "--set",
        if debug_log {
            "log.level=info\\,clickhouse_operator=debug"
        } else {
            "log.level=info"
        },
    ]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(Duration::from_secs(120), "the operator pod", || {
        let pods = pods.clone();
        async move {
            let p = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
                .await
                .ok()?
                .items
                .pop()?;
            let ready = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            ready.then(|| (p.metadata.name.clone().unwrap(), ip))
        }
    })
    .await
}

/// Benchmark (docs/internals.md, "Benchmarks"): for each N in `BENCH_CLUSTERS` (default "1 20"),
/// the operator from its chart (one replica, watching every namespace) creates N single-replica
/// clusters, each in a namespace of its own; printed: the time until all are `ready`, then over
/// one idle minute the operator's API requests (beyond its leader Lease) per minute and per
/// cluster, its CPU seconds and resident memory, the idle passes (health checks) per cluster and
/// minute and the operator's CPU per pass, the p50/p99 of the idle passes, and the status lag
/// when one server pod becomes unready and Ready again.
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
        let before = pass_buckets(&metrics_addr).await;
        let glances_before = glances(&metrics_addr).await;
        let (_, cpu0) = usage(pid);
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        tokio::time::sleep(idle).await;
        let until = k8s_openapi::jiff::Timestamp::now().to_string();
        let (rss, cpu1) = usage(pid);
        let after = pass_buckets(&metrics_addr).await;
        let glanced = glances(&metrics_addr).await - glances_before;
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
            "{n:>5} {real:>6} {:>9.1} {:>9.2} {:>9.2} {:>7} {:>8.2} {:>9.1} {:>8} {:>8.1} {:>8.1} {:>9} {:>9} {:>10} {:>10}",
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
            rss,
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
        "{:>5} {:>6} {:>9} {:>9} {:>9} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10}",
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
        "RSS MiB",
        "pass p50",
        "pass p99",
        "lag unready",
        "lag ready"
    );
    for r in rows {
        println!("{r}");
    }
}

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
