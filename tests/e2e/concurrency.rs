//! S2-08, `MAX_CONCURRENT_RECONCILES` (default 1) on the real local Kubernetes: each kind's
//! passes take a slot of their own kind, so that with one slot a cluster's pass waits for
//! another cluster's pass and then converges, while a backup's pass held by its bucket keeps
//! neither a restore nor a cluster waiting (but another backup).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseBackup, ClickHouseCluster, ClickHouseRestore};
use clickhouse_operator::controller::{Faults, StepPoint};
use clickhouse_operator::plan::step::Step;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

/// When `probe` first holds, polling every 100 ms for at most `timeout`.
async fn first_seen<F, Fut>(timeout: Duration, what: &str, mut probe: F) -> Instant
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if probe().await {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// S2-08, with the default of one slot: two clusters in two namespaces that
/// one operator watches, rows written to the first. The first scales out from one replica to
/// two, and its pass is held right where the schema copy onto the new replica starts: the
/// copy's server process is stopped (SIGSTOP from the step hook; a real server that accepts
/// and never answers), so the pass waits its 20 s budget. The second cluster's spec changes at
/// that moment (replicas 1 → 2): its pass does not start before the first's ended (its
/// `observedGeneration` moves only after the first's status says the copy was given up, at
/// least 10 s after the change), and then both converge: the first once its server goes on,
/// with every acknowledged row on both replicas, the second `ready` at its new generation.
/// Its last run: held 20.1 s, the second's change observed 20.2 s after it was made and 0.17 s
/// after the first's pass gave up, 80 s in all. With two cluster slots the second's change was
/// observed 0.17 s after it was made, and this test failed.
#[tokio::test]
async fn with_one_slot_a_second_clusters_pass_waits_for_the_first_and_then_converges() {
    let client = client().await;
    let slow_ns = namespace(&client, "slot-a").await;
    let other_ns = namespace(&client, "slot-b").await;
    // their own names keep their pod names apart from other tests' (the hook finds the
    // process by its pod's host name alone)
    let (slow, other) = ("slotslow", "slotother");
    let armed = Arc::new(AtomicBool::new(false));
    let stopped: Arc<Mutex<Option<(i32, Instant)>>> = Arc::default();
    let hook: clickhouse_operator::controller::AfterStep = {
        let (armed, stopped) = (armed.clone(), stopped.clone());
        Arc::new(move |point, step| {
            if let (StepPoint::Before, Step::MigrateSchema { replica, .. }) = (point, step)
                && replica.as_str().starts_with(slow)
                && armed.swap(false, Ordering::SeqCst)
            {
                let pid = pid_of("clickhouse-server", &format!("{replica}-0"), None);
                // SAFETY: a signal to a process of this machine
                assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
                *stopped.lock().unwrap() = Some((pid, Instant::now()));
            }
            false
        })
    };
    let watched = format!("{slow_ns},{other_ns}");
    let op = start_operator_with_env(
        &client,
        &slow_ns,
        Faults {
            after_step: Some(hook),
            ..Default::default()
        },
        &[("WATCH_NAMESPACE", &watched)],
    )
    .await;
    let spec =
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}});
    create_cluster(&client, &slow_ns, slow, spec.clone()).await;
    create_cluster(&client, &other_ns, other, spec).await;
    wait_ready(&client, &slow_ns, slow, 1).await;
    wait_ready(&client, &other_ns, other, 1).await;
    let workload = Workload::start(&client, &slow_ns, slow).await;
    armed.store(true, Ordering::SeqCst);
    patch_spec(&client, &slow_ns, slow, json!({"replicas": 2})).await;
    let held_at = first_seen(Duration::from_secs(240), "the schema copy held", || {
        let stopped = stopped.clone();
        async move { stopped.lock().unwrap().is_some() }
    })
    .await;
    patch_spec(&client, &other_ns, other, json!({"replicas": 2})).await;
    let changed = Instant::now();
    let slow_api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &slow_ns);
    let other_api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &other_ns);
    let (gave_up, observed) = tokio::join!(
        first_seen(Duration::from_secs(90), "the first's copy given up", || {
            let api = slow_api.clone();
            async move {
                api.get(slow)
                    .await
                    .ok()
                    .and_then(|c| c.status)
                    .is_some_and(|s| {
                        s.message
                            .as_deref()
                            .is_some_and(|m| m.contains("did not finish within 20 s"))
                    })
            }
        }),
        first_seen(
            Duration::from_secs(90),
            "the second's change observed",
            || {
                let api = other_api.clone();
                async move {
                    api.get(other)
                        .await
                        .ok()
                        .and_then(|c| c.status)
                        .is_some_and(|s| s.observed_generation == Some(2))
                }
            }
        ),
    );
    let (pid, _) = stopped.lock().unwrap().expect("the copy's server stopped");
    // SAFETY: as above
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let waited = observed - changed;
    println!(
        "the first pass held {:?}; the second cluster's change observed {waited:?} after it was made, {:?} after the first pass gave up",
        gave_up - held_at,
        observed.saturating_duration_since(gave_up)
    );
    assert!(
        waited >= Duration::from_secs(10),
        "the second cluster's pass ran {waited:?} after its change, while the first's held the only slot"
    );
    assert!(
        observed + Duration::from_millis(500) >= gave_up,
        "the second cluster's status was written before the first's pass ended"
    );
    wait_ready(&client, &other_ns, other, 2).await;
    wait_ready(&client, &slow_ns, slow, 2).await;
    let batches = workload.stop_and_check(&client, &slow_ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    finish_all(&client, &[&slow_ns, &other_ns], op).await;
}

/// An S3 endpoint that accepts connections and never answers: how many it accepted, and when
/// the first came.
struct SilentBucket {
    endpoint: String,
    first: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SilentBucket {
    async fn start() -> SilentBucket {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let first: Arc<Mutex<Option<Instant>>> = Arc::default();
        let seen = first.clone();
        let task = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                seen.lock().unwrap().get_or_insert_with(Instant::now);
                // held open, never read from nor written to
                open.push(stream);
            }
        });
        SilentBucket {
            endpoint,
            first,
            task,
        }
    }
}

impl Drop for SilentBucket {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// S2-08 (restores once shared the backups' slot): with the
/// default of one slot per kind, a backup's pass held by a bucket that accepts the connection
/// and never answers (5 s per request, then a retry) keeps the one backup slot, and only it. A
/// restore and a cluster's change made at that moment are passed at once (each status written
/// within 3 s, before the bucket's first request timed out), while a second backup waits for
/// the slot (its status written 4.5 s or more after the first request reached the bucket).
/// (The second backup and the restore are of a cluster that does not exist: their passes say so
/// and need no bucket; no real S3 server is needed.) Its last run: the restore passed 0.18 s
/// after the held backup reached its bucket, the cluster 0.30 s, the second backup 10.2 s; 45 s
/// in all. With restores on the backups' slots the restore passed 10.4 s after, and this test
/// failed.
#[tokio::test]
async fn backups_restores_and_clusters_each_pass_in_slots_of_their_own() {
    let Scenario { client, ns, op } = Scenario::start("slots").await;
    let bucket = SilentBucket::start().await;
    let creds: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3-creds", "labels": {"clickhouse.com/s3-credentials": "true"}},
        "stringData": {"accessKeyId": "a", "secretAccessKey": "b"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": {"endpoint": bucket.endpoint, "insecure": true,
                                          "bucket": "slot-bucket", "secretName": "s3-creds"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let backups: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    let restores: Api<ClickHouseRestore> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let create = |kind: &str, name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "clickhouse.com/v1alpha1", "kind": kind,
               "metadata": {"name": name}, "spec": spec})
    };
    let held: ClickHouseBackup = serde_json::from_value(create(
        "ClickHouseBackup",
        "held",
        json!({"clusterName": "c1"}),
    ))
    .unwrap();
    backups.create(&PostParams::default(), &held).await.unwrap();
    let reached = first_seen(Duration::from_secs(60), "the bucket reached", || {
        let first = bucket.first.clone();
        async move { first.lock().unwrap().is_some() }
    })
    .await;
    let second: ClickHouseBackup = serde_json::from_value(create(
        "ClickHouseBackup",
        "second",
        json!({"clusterName": "elsewhere"}),
    ))
    .unwrap();
    backups
        .create(&PostParams::default(), &second)
        .await
        .unwrap();
    let restore: ClickHouseRestore = serde_json::from_value(create(
        "ClickHouseRestore",
        "restore",
        json!({"clusterName": "elsewhere", "backupName": "held"}),
    ))
    .unwrap();
    restores
        .create(&PostParams::default(), &restore)
        .await
        .unwrap();
    patch_spec(&client, &ns, "c1", json!({"catchUpSeconds": 3600})).await;
    let said =
        |m: Option<&str>| m.is_some_and(|m| m.contains("ClickHouseCluster elsewhere not found"));
    let (restored, cluster_passed, second_passed) = tokio::join!(
        first_seen(Duration::from_secs(60), "the restore's pass", || {
            let restores = restores.clone();
            async move {
                restores
                    .get("restore")
                    .await
                    .ok()
                    .and_then(|r| r.status)
                    .is_some_and(|s| said(s.message.as_deref()))
            }
        }),
        first_seen(Duration::from_secs(60), "the cluster's pass", || {
            let clusters = clusters.clone();
            async move {
                clusters
                    .get("c1")
                    .await
                    .ok()
                    .and_then(|c| c.status)
                    .is_some_and(|s| s.observed_generation == Some(2))
            }
        }),
        first_seen(Duration::from_secs(90), "the second backup's pass", || {
            let backups = backups.clone();
            async move {
                backups
                    .get("second")
                    .await
                    .ok()
                    .and_then(|b| b.status)
                    .is_some_and(|s| said(s.message.as_deref()))
            }
        }),
    );
    let after = |t: Instant| t.saturating_duration_since(reached);
    println!(
        "after the held backup reached its bucket: the restore passed in {:?}, the cluster in {:?}, the second backup in {:?}",
        after(restored),
        after(cluster_passed),
        after(second_passed)
    );
    assert!(
        after(restored) < Duration::from_secs(3),
        "the restore waited for the backup's slot"
    );
    assert!(
        after(cluster_passed) < Duration::from_secs(3),
        "the cluster waited for the backup's slot"
    );
    assert!(
        after(second_passed) >= Duration::from_millis(4500),
        "the second backup did not wait for the only backup slot"
    );
    for name in ["held", "second"] {
        let _ = backups.delete(name, &DeleteParams::default()).await;
    }
    let _ = restores.delete("restore", &DeleteParams::default()).await;
    wait_for(
        Duration::from_secs(60),
        "the backups and the restore gone",
        || {
            let (backups, restores) = (backups.clone(), restores.clone());
            async move {
                let b = backups.list(&Default::default()).await.ok()?;
                let r = restores.list(&Default::default()).await.ok()?;
                (b.items.is_empty() && r.items.is_empty()).then_some(())
            }
        },
    )
    .await;
    drop(bucket);
    finish(&client, &ns, op).await;
}
