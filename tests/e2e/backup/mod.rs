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

mod backups;
mod failures;
mod schedule;
mod throughput;
mod web_identity;

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
        out.insert(replica.to_string(), n[0].parse().unwrap());
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

/// A TCP relay to this process's S3 server, reached by the pods at the node's gateway, that
/// holds what the pods send and receive while its gate is closed: a backup's agents wait at
/// their first request (well within their 60 s request time-out) and the backup stays
/// `Running` as long as the test wants, then ends as any other once the gate opens. The
/// operator, on this machine (its connections come from the gateway's address), passes at any
/// time: it checks the bucket before the backup starts.
struct GatedS3 {
    for_pods: String,
    open: tokio::sync::watch::Sender<bool>,
}

async fn gated_s3() -> GatedS3 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let gateway: std::net::IpAddr = gateway().parse().unwrap();
    let (open, gate) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((inbound, peer)) = listener.accept().await else {
                return;
            };
            let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", S3_PORT)).await else {
                continue;
            };
            let held = peer.ip() != gateway;
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            for (mut from, mut to) in [
                (
                    Box::new(in_read) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                    Box::new(out_write) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                ),
                (Box::new(out_read) as _, Box::new(in_write) as _),
            ] {
                let mut gate = gate.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if held && gate.wait_for(|open| *open).await.is_err() {
                            break;
                        }
                        if to.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown().await;
                });
            }
        }
    });
    GatedS3 {
        for_pods: format!("http://{gateway}:{port}"),
        open,
    }
}
