//! The benchmarks of docs/internals.md, "Benchmarks" (not tests: they print figures and assert
//! nothing about speed): the operator installed by its chart as a pod of the local Kubernetes,
//! under its own ServiceAccount, in front of N real single-replica clusters (ClickHouse 18.16, no
//! Keeper). Run them with `hack/bench.sh scale` (`BENCH_CLUSTERS="1 20 50"` to choose N).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use crate::support::*;

mod lifecycle;
mod scale;

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
