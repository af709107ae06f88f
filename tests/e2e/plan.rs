//! `clickhouse-operator plan` against the running cluster (docs/operations.md, "The commands"): the
//! binary, given the test cluster's kubeconfig, reads the live resource, its objects, pods and
//! servers, and says what a changed file would do, with the exit code a pipeline gates on. The
//! operator is stopped while `plan` runs, and the API server's audit log shows that `plan` wrote
//! nothing.

use std::io::BufRead;
use std::path::Path;
use std::process::Command;

use clickhouse_operator::api::ClickHouseCluster;
use kube::Api;
use serde_json::{Value, json};

use crate::support::*;

/// Runs `plan -o json` (or text) on a file holding `cluster` with `spec`.
fn plan(
    dir: &Path,
    cluster: &ClickHouseCluster,
    spec: Value,
    extra: Value,
    json: bool,
) -> (i32, String) {
    let mut doc = json!({
        "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
        "metadata": {"name": cluster.metadata.name, "namespace": cluster.metadata.namespace},
        "spec": spec,
    });
    if let Some(m) = extra.as_object() {
        for (k, v) in m {
            doc["metadata"][k] = v.clone();
        }
    }
    let file = dir.join("cluster.yaml");
    std::fs::write(&file, serde_yaml::to_string(&doc).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
        .args(["plan", "-f"])
        .arg(&file)
        .args(["-o", if json { "json" } else { "text" }])
        .env("KUBECONFIG", kubeconfig())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), stdout)
}

fn merged(base: &Value, patch: Value) -> Value {
    let mut v = base.clone();
    json_patch_merge(&mut v, &patch);
    v
}

fn json_patch_merge(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                json_patch_merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

/// Writes recorded by the audit log after line `from`, to the namespace's objects a pass could
/// write (the kubelet's pod status updates are not among them).
fn writes_since(audit: &Path, from: usize, ns: &str) -> Vec<String> {
    let f = std::fs::File::open(audit).unwrap();
    std::io::BufReader::new(f)
        .lines()
        .skip(from)
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && matches!(
                    e["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete" | "deletecollection")
                )
                && e["objectRef"]["namespace"] == ns
                && !(e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["subresource"] == "status")
                && e["objectRef"]["resource"] != "events"
                // what Kubernetes' own controllers write (endpoint slices following a pod's
                // readiness) is not plan's: plan runs as the kubeconfig's user, `admin`
                && !e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("system:"))
        })
        .map(|e| {
            format!(
                "{} {} {}",
                e["verb"], e["objectRef"]["resource"], e["objectRef"]["name"]
            )
        })
        .collect()
}

/// docs/operations.md, "The commands": with a kubeconfig, `plan` shows what a change would do to
/// the running cluster: a no-op exits 0; an image change exits 2, shows the changed field of the
/// object it writes first (old and new image) and lists every server pod once, in rollout order
/// (the canary alone, then the shards in parallel, each shard's backup replica after its
/// other replicas); a profile
/// change is a reload without restarts; a scale-in names the condemned replicas (never a
/// backup replica); a shard removal without the data-loss annotation is refused (exit 1).
/// Nothing is written while it runs.
#[tokio::test]
async fn plan_shows_what_a_change_to_the_running_cluster_would_do_and_writes_nothing() {
    let (Scenario { client, ns, op }, ready) = Scenario::ready(
        "plan",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    drop(op); // nothing acts while plan runs
    let live: ClickHouseCluster = Api::namespaced(client.clone(), &ns)
        .get("c1")
        .await
        .unwrap();
    let map = ready.status.unwrap().replica_state_map;
    let backups: Vec<String> = map
        .iter()
        .filter(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| format!("{n}-0"))
        .collect();
    let spec = serde_json::to_value(&live.spec).unwrap();
    let dir = std::env::temp_dir().join(format!("plan-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let audit = kubeconfig().parent().unwrap().join("audit.log");
    let from = std::io::BufReader::new(std::fs::File::open(&audit).unwrap())
        .lines()
        .count();
    let none = json!({});

    let (code, out) = plan(&dir, &live, spec.clone(), none.clone(), true);
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, 0, "no-op: {p}");
    assert!(p["restarts"].as_array().unwrap().is_empty());

    let image = merged(&spec, json!({"image": "clickhouse/clickhouse-server:25.3"}));
    let (code, out) = plan(&dir, &live, image.clone(), none.clone(), true);
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, 2);
    let waves: Vec<Vec<String>> = serde_json::from_value(p["restarts"].clone()).unwrap();
    let all: Vec<&String> = waves.iter().flatten().collect();
    assert_eq!(all.len(), 4, "every server pod once: {waves:?}");
    assert_eq!(waves[0].len(), 1, "the canary alone: {waves:?}");
    let wave_of = |pod: &str| {
        waves
            .iter()
            .position(|w| w.iter().any(|p| p == pod))
            .unwrap()
    };
    for (replica, r) in &map {
        let shard_backup = map
            .iter()
            .find(|(_, o)| o.shard == r.shard && o.is_backup_pod)
            .unwrap()
            .0;
        if !r.is_backup_pod {
            assert!(
                wave_of(&format!("{replica}-0")) < wave_of(&format!("{shard_backup}-0")),
                "{shard_backup} goes after {replica}: {waves:?}"
            );
        }
    }
    assert!(
        waves.iter().any(|w| w.len() == 2),
        "shards roll in parallel after the canary: {waves:?}"
    );
    assert!(
        p["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "servers: spec.image → rolling restart"),
        "{p}"
    );
    assert!(
        p["objects"].as_array().unwrap().iter().any(|o| {
            let o = o.as_str().unwrap();
            o.contains(".image: ") && o.ends_with("\"clickhouse/clickhouse-server:25.3\"")
        }),
        "the canary's template change, field by field: {p}"
    );
    let (code, text) = plan(&dir, &live, image, none.clone(), false);
    assert_eq!(code, 2);
    assert!(
        text.contains("Server pods restarted, in this order"),
        "{text}"
    );

    let profile = merged(
        &spec,
        json!({"configuration": {"profiles": {"default": {"max_memory_usage": "5000000000"}}}}),
    );
    let (code, out) = plan(&dir, &live, profile, none.clone(), true);
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, 2);
    assert!(
        p["restarts"].as_array().unwrap().is_empty(),
        "a reload: {p}"
    );
    assert!(
        p["changes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.as_str().unwrap().contains("no restart")),
        "{p}"
    );

    let (code, out) = plan(
        &dir,
        &live,
        merged(&spec, json!({"replicas": 1})),
        none.clone(),
        true,
    );
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, 2);
    let condemned: Vec<String> = serde_json::from_value(p["condemned"].clone()).unwrap();
    assert_eq!(condemned.len(), 2, "one replica of each shard: {p}");
    for c in &condemned {
        assert!(
            !backups.contains(&format!("{c}-0")),
            "{c} is a backup replica"
        );
        assert!(map.contains_key(c.as_str()));
    }
    assert!(p["restarts"].as_array().unwrap().is_empty());

    let (code, out) = plan(&dir, &live, merged(&spec, json!({"shards": 1})), none, true);
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        code, 1,
        "a shard removal without the annotation is refused: {p}"
    );
    assert!(!p["refused"].as_array().unwrap().is_empty());

    let _ = std::fs::remove_dir_all(&dir);
    let writes = writes_since(&audit, from, &ns);
    assert!(writes.is_empty(), "plan wrote: {writes:?}");
    let op = start_operator(&client, &ns, false).await;
    finish(&client, &ns, op).await;
}
