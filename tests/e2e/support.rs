//! The test harness: one real local Kubernetes (hack/local-cluster.sh) per test binary, started
//! on first use and stopped when the process exits (also after failed or panicking tests); the
//! CRDs installed; a fresh namespace per test; the operator run in-process per test, watching only
//! that namespace.
//!
//! `CHOP_KUBECONFIG=path` makes the tests use an already running cluster instead;
//! `CHOP_E2E_NODES=N` gives that cluster N nodes (`hack/test.sh` asks for 3; its
//! NetworkPolicies are not enforced).
//!
//! Tests about nodes (drain, a node that stops, zones, NetworkPolicies across nodes) ask for
//! [`multi_node_client`]: a second local Kubernetes of [`MULTI_NODES`] nodes (node-1..node-3 in
//! zone-a..zone-c), started on first use beside the one-node cluster and stopped with it
//! (`CHOP_MULTI_NODE_DIR=DIR` uses one already started with
//! `LOCAL_CLUSTER_NODES=3 hack/local-cluster.sh up DIR`). On it: [`node_stop`] and
//! [`node_start`] stop and start a node's agent (its pods stop; the Node goes NotReady within
//! about 10 s, tainted unreachable, its pods not ready; started again, the pods run again),
//! [`multi_node_kubectl`] runs kubectl 1.37 (`drain`, `cordon`, `uncordon`: drain evicts
//! through the eviction API, honouring PodDisruptionBudgets), and NetworkPolicies are enforced
//! by the node agents (pod to pod and through ClusterIPs; traffic from the machine, where the
//! in-process operator runs, always reaches the pods, as a node reaches its own pods).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use clickhouse_operator::api::{ClickHouseCluster, ClusterState, crd};
use clickhouse_operator::runtime::metrics::{Health, Metrics};
use clickhouse_operator::runtime::settings::Settings;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

struct LocalCluster {
    kubeconfig: PathBuf,
}

static CLUSTER: OnceLock<LocalCluster> = OnceLock::new();
static MULTI_NODE_CLUSTER: OnceLock<LocalCluster> = OnceLock::new();
/// the clusters this process started, stopped at its exit
static STARTED_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// The number of nodes of [`multi_node_client`]'s cluster.
pub const MULTI_NODES: u32 = 3;

/// Held by each test that stops, drains or fills a node of the multi-node cluster (or that
/// needs all three): such tests run one at a time.
pub static NODE_DISRUPTION: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

extern "C" fn stop_cluster_at_exit() {
    let dirs = std::mem::take(&mut *STARTED_DIRS.lock().unwrap_or_else(|e| e.into_inner()));
    for dir in dirs {
        let _ = Command::new("bash")
            .arg(repo().join("hack/local-cluster.sh"))
            .arg("down")
            .arg(dir)
            .status();
    }
}

fn cluster() -> &'static LocalCluster {
    CLUSTER.get_or_init(|| {
        if let Ok(path) = std::env::var("CHOP_KUBECONFIG") {
            return LocalCluster {
                kubeconfig: PathBuf::from(path),
            };
        }
        // CHOP_E2E_NODES: the nodes of this cluster (1 by default); its NetworkPolicies are
        // not enforced, as the tests of it were written (the multi-node cluster's are)
        let nodes = std::env::var("CHOP_E2E_NODES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        start_local_cluster(
            repo()
                .join("target")
                .join(format!("e2e-cluster-{}", std::process::id())),
            nodes,
            "ignore",
        )
    })
}

fn multi_node_cluster() -> &'static LocalCluster {
    MULTI_NODE_CLUSTER.get_or_init(|| {
        if let Ok(dir) = std::env::var("CHOP_MULTI_NODE_DIR") {
            return LocalCluster {
                kubeconfig: PathBuf::from(dir).join("kubeconfig"),
            };
        }
        start_local_cluster(
            repo()
                .join("target")
                .join(format!("e2e-nodes-{}", std::process::id())),
            MULTI_NODES,
            "enforce",
        )
    })
}

/// `hack/local-cluster.sh up DIR` with `nodes` nodes and NetworkPolicies `policies`
/// (`enforce` or `ignore`), stopped when the process exits.
fn start_local_cluster(dir: PathBuf, nodes: u32, policies: &str) -> LocalCluster {
    {
        let mut started = STARTED_DIRS.lock().unwrap_or_else(|e| e.into_inner());
        if started.is_empty() {
            // SAFETY: registering a plain extern "C" function with atexit has no preconditions.
            unsafe {
                libc::atexit(stop_cluster_at_exit);
            }
        }
        started.push(dir.clone());
    }
    {
        // Image volumes as CRI-O makes them (inside the read-only root filesystem): the pods
        // must not depend on a runtime that mounts the images' VOLUMEs writable (decision 42).
        let image_volumes =
            std::env::var("LOCAL_KUBELET_IMAGE_VOLUMES").unwrap_or_else(|_| "crio".into());
        let status = Command::new("bash")
            .arg(repo().join("hack/local-cluster.sh"))
            .arg("up")
            .arg(&dir)
            .env("LOCAL_KUBELET_IMAGE_VOLUMES", image_volumes)
            .env("LOCAL_CLUSTER_NODES", nodes.to_string())
            .env("LOCAL_CLUSTER_NETWORK_POLICIES", policies)
            // the operator's image as `hack/image.sh` wrote it: pods of that image run from it
            .env("LOCAL_KUBELET_IMAGE_STORE", repo().join("target/image/oci"))
            .status()
            .expect("run hack/local-cluster.sh");
        assert!(
            status.success(),
            "hack/local-cluster.sh up {} failed",
            dir.display()
        );
        LocalCluster {
            kubeconfig: dir.join("kubeconfig"),
        }
    }
}

/// The test cluster's kubeconfig (the cluster is started on first use).
pub fn kubeconfig() -> PathBuf {
    cluster().kubeconfig.clone()
}

/// A key of the test cluster's network file (`GATEWAY`, `POD_CIDR`), which a cluster of
/// several nodes has: there this machine's connections reach the pods from the bridge's
/// address (`GATEWAY`), not from a node's, and the pods of every node are in `POD_CIDR`.
/// `None` on one node, where the machine is the node.
pub fn cluster_network(key: &str) -> Option<String> {
    let dir = cluster().kubeconfig.parent()?.to_path_buf();
    let text = std::fs::read_to_string(dir.join("network")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// A client for the test cluster, made in the calling test's runtime. Also sends the
/// operator's logs to the test's output (shown for failed tests).
pub async fn client() -> Client {
    client_of(cluster()).await
}

/// A client for the cluster of [`MULTI_NODES`] nodes (started on first use), the CRDs
/// installed. The operator runs against it as against the other: `start_operator(&client, …)`.
pub async fn multi_node_client() -> Client {
    client_of(multi_node_cluster()).await
}

/// The folder of the multi-node cluster (`kubeconfig`, `logs/`, `nodes`: one line per node,
/// `name zone address pod-CIDR …`).
pub fn multi_node_dir() -> PathBuf {
    multi_node_cluster()
        .kubeconfig
        .parent()
        .expect("the kubeconfig is in the cluster's folder")
        .to_path_buf()
}

fn local_cluster(args: &[&str]) {
    let out = Command::new("bash")
        .arg(repo().join("hack/local-cluster.sh"))
        .args(args)
        .output()
        .expect("run hack/local-cluster.sh");
    assert!(
        out.status.success(),
        "hack/local-cluster.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Stops the agent of `node` (`node-1`..`node-3`) of the multi-node cluster: its pods' processes
/// stop with it, their Pod objects stay as they were until the node controller notices (Ready
/// Unknown about 10 s later, taints `node.kubernetes.io/unreachable`, the pods' Ready False;
/// evicted after their toleration, 300 s by default).
pub fn node_stop(node: &str) {
    local_cluster(&["node-stop", &multi_node_dir().to_string_lossy(), node]);
}

/// Starts the agent of `node` again; returns once the Node is Ready. Its pods start again.
pub fn node_start(node: &str) {
    local_cluster(&["node-start", &multi_node_dir().to_string_lossy(), node]);
}

/// kubectl 1.37 against the multi-node cluster, e.g. `["drain", "node-2", "--ignore-daemonsets",
/// "--delete-emptydir-data", "--timeout=300s"]`; panics on failure, returns the output. A
/// drained pod whose volume is on the drained node waits Pending until `uncordon` (local
/// volumes); each PodDisruptionBudget lets one of its pods go at a time.
pub fn multi_node_kubectl(args: &[&str]) -> String {
    let dir = multi_node_dir();
    let env = std::fs::read_to_string(dir.join("env")).expect("the cluster's env file");
    let bin = env
        .lines()
        .find_map(|l| l.strip_prefix("export PATH="))
        .and_then(|p| p.split(':').next())
        .expect("kubectl's folder in the env file");
    let out = Command::new(PathBuf::from(bin).join("kubectl"))
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn client_of(c: &LocalCluster) -> Client {
    let _ = tracing_subscriber::fmt()
        .with_writer(|| LogTee)
        .with_env_filter(
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "info,kube=warn,clickhouse_operator=debug".into()),
        )
        .try_init();
    let kc = Kubeconfig::read_from(&c.kubeconfig).expect("read the kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a valid kubeconfig");
    let client = Client::try_from(config).expect("a client");
    install_crds(&client).await;
    client
}

/// Secret values no log line of the in-process operators may hold (see [`watch_for_secrets`]),
/// and the lines that held one.
static WATCHED: std::sync::Mutex<(Vec<String>, Vec<String>)> =
    std::sync::Mutex::new((Vec::new(), Vec::new()));

/// The operators' log writer: the test's output (shown for failed tests), each line also
/// checked for the secret values registered with [`watch_for_secrets`].
struct LogTee;

impl std::io::Write for LogTee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        let mut watched = WATCHED.lock().unwrap();
        let (secrets, hits) = &mut *watched;
        if secrets.iter().any(|s| line.contains(s.as_str())) {
            hits.push(line.chars().take(300).collect());
        }
        drop(watched);
        let line = without_ansi(&line);
        if line.contains("pass{") && (line.contains(" INFO ") || line.contains(" WARN ")) {
            TRAIL.lock().unwrap().push(line);
        }
        tracing_subscriber::fmt::TestWriter::new().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The operators' info and warning lines logged within a pass (the log trail), without colours.
static TRAIL: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // an escape sequence: `ESC [ … letter`
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The info and warning lines of the in-process operators' passes so far that contain `needle`.
pub fn trail(needle: &str) -> Vec<String> {
    TRAIL
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

/// From now on, a log line of any in-process operator that holds one of `secrets` is recorded
/// (see [`logged_secrets`]).
pub fn watch_for_secrets(secrets: &[&str]) {
    let mut watched = WATCHED.lock().unwrap();
    for s in secrets {
        if !s.is_empty() && !watched.0.iter().any(|w| w == s) {
            watched.0.push(s.to_string());
        }
    }
}

/// The log lines that held a watched secret (the secret's value included: they are for a
/// failing test's message, on this machine).
pub fn logged_secrets() -> Vec<String> {
    WATCHED.lock().unwrap().1.clone()
}

/// Where the local kubelet keeps container logs: `<dir>/<ns>_<pod>_<uid8>/<container>.log`,
/// kept after the pod is gone.
pub fn pod_log_dir() -> PathBuf {
    kubeconfig().with_file_name("logs").join("pods")
}

async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for c in crd::all() {
        let name = c.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("e2e-tests").force(),
            &Patch::Apply(&c),
        )
        .await
        .expect("install the CRDs");
        wait_for(Duration::from_secs(30), "CRD established", || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let c = api.get(&name).await.ok()?;
                c.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        })
        .await;
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Creates a namespace of its own for a test.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
    )
    .await
    .expect("create a namespace");
    name
}

/// The operator running in-process, watching `namespace` only. Stopped when dropped.
pub struct Operator {
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub metrics: std::sync::Arc<Metrics>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start_operator(client: &Client, namespace: &str, leader_election: bool) -> Operator {
    start(client, namespace, leader_election, Default::default(), &[]).await
}

/// The operator without leader election, with settings of the environment overridden.
pub async fn start_operator_env(
    client: &Client,
    namespace: &str,
    env: &[(&'static str, &str)],
) -> Operator {
    start(client, namespace, false, Default::default(), env).await
}

/// The operator without leader election, with faults injected (decision 24).
pub async fn start_operator_with(
    client: &Client,
    namespace: &str,
    faults: clickhouse_operator::controller::Faults,
) -> Operator {
    start(client, namespace, false, faults, &[]).await
}

async fn start(
    client: &Client,
    namespace: &str,
    leader_election: bool,
    faults: clickhouse_operator::controller::Faults,
    extra: &[(&'static str, &str)],
) -> Operator {
    let mut env = vec![
        ("WATCH_NAMESPACE", namespace.to_string()),
        ("LEADER_ELECTION", leader_election.to_string()),
        ("POD_NAMESPACE", namespace.to_string()),
        ("POD_NAME", format!("operator-{namespace}")),
        ("HTTP_ADDR", "127.0.0.1:0".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let settings = Settings::from_lookup(|k| {
        env.iter()
            .rev()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
    })
    .expect("valid settings");
    let metrics = std::sync::Arc::new(Metrics::default());
    let client = client.clone();
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let lost: futures::future::BoxFuture<'static, ()> = if settings.leader_election {
            let elector = clickhouse_operator::runtime::leader::LeaderElector::new(
                client.clone(),
                &settings.lease_namespace,
                &settings.lease_name,
                &settings.identity,
            );
            let mut rx = elector.acquire().await;
            Box::pin(async move {
                while *rx.borrow() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
        } else {
            Box::pin(futures::future::pending())
        };
        clickhouse_operator::controller::run_with(
            &settings,
            client,
            m,
            std::sync::Arc::new(Health::default()),
            lost,
            faults,
        )
        .await
    });
    Operator { task, metrics }
}

/// Polls `probe` every 250 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The server image the clusters of these tests name unless they name another: the local
/// kubelet runs ClickHouse 18.16 for every `clickhouse-server` image, so the tag says so. The
/// operator trusts a tag in one place, the order of a first start (decision 58): with a tag of
/// 21.3 or later, servers start beside their Keeper, which 18.16 does not survive (its DDL
/// queue gives up for good).
pub const SERVER_IMAGE: &str = "clickhouse/clickhouse-server:18.16.1";

/// Creates a ClickHouseCluster from a JSON spec ([`SERVER_IMAGE`] unless it names an image).
pub async fn create_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    mut spec: serde_json::Value,
) -> ClickHouseCluster {
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    if let Some(o) = spec.as_object_mut() {
        o.entry("image").or_insert_with(|| SERVER_IMAGE.into());
    }
    let obj: ClickHouseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "clickhouse.com/v1alpha1",
        "kind": "ClickHouseCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .expect("a ClickHouseCluster");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create the cluster")
}

/// Waits until the cluster's status satisfies `pred`, and returns it.
pub async fn wait_status(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&clickhouse_operator::api::ClickHouseClusterStatus) -> bool,
) -> ClickHouseCluster {
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let last = std::sync::Mutex::new(None);
    let waited = tokio::time::timeout(
        timeout,
        wait_for(timeout + Duration::from_secs(60), what, || {
            let api = api.clone();
            let (pred, last) = (&pred, &last);
            async move {
                let c = api.get(name).await.ok()?;
                *last.lock().unwrap() = c.status.clone();
                c.status.as_ref().filter(|s| pred(s)).map(|_| c.clone())
            }
        }),
    )
    .await;
    match waited {
        Ok(c) => c,
        Err(_) => {
            let last = last.lock().unwrap().clone();
            panic!(
                "timed out after {timeout:?} waiting for {what}; the last status: {:?}",
                last.map(|s| (s.state, s.message, s.conditions))
            )
        }
    }
}

/// A ClickHouse client for a server pod, as the operator's own user.
pub async fn sql_client(
    client: &Client,
    ns: &str,
    cluster: &str,
    pod: &str,
) -> clickhouse_operator::clickhouse::Client {
    let ip = pod_ip(client, ns, pod).await;
    sql_client_at(client, ns, cluster, &ip, Duration::from_secs(30)).await
}

/// A ClickHouse client for `host` (a pod or Service address), as the operator's own user.
pub async fn sql_client_at(
    client: &Client,
    ns: &str,
    cluster: &str,
    host: &str,
    timeout: Duration,
) -> clickhouse_operator::clickhouse::Client {
    use clickhouse_operator::clickhouse::{ClientConfig, Credentials, Endpoint};
    use k8s_openapi::api::core::v1::Secret;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets
        .get(&format!("{cluster}-operator"))
        .await
        .expect("the operator's Secret");
    let password = String::from_utf8(secret.data.unwrap()["password"].0.clone()).unwrap();
    let mut config = ClientConfig::new(
        Endpoint {
            host: host.to_string(),
            port: 8123,
        },
        Credentials {
            user: "clickhouse_operator".into(),
            password,
        },
    );
    config.timeout = timeout;
    clickhouse_operator::clickhouse::Client::new(config).expect("a ClickHouse client")
}

/// Runs SQL whose result has a column `v` and returns it, as strings, row by row.
pub async fn query(c: &clickhouse_operator::clickhouse::Client, sql: &str) -> Vec<String> {
    use clickhouse_operator::clickhouse::QueryOptions;
    let rows = c
        .query(sql, &QueryOptions::new())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .map(|r| {
            r.str("v")
                .map(str::to_string)
                .or_else(|_| r.u64("v").map(|n| n.to_string()))
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
        .collect()
}

/// Runs a statement.
pub async fn exec(c: &clickhouse_operator::clickhouse::Client, sql: &str) {
    use clickhouse_operator::clickhouse::QueryOptions;
    c.exec(sql, &QueryOptions::new().retry(true))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Ends a test: deletes its ClickHouseClusters while the operator still runs (the finalizer
/// completes, S0-02), waits until they and their pods are gone, then deletes the namespace.
pub async fn finish(client: &Client, ns: &str, operator: Operator) {
    finish_all(client, &[ns], operator).await;
}

/// [`finish`] for the clusters of several namespaces watched by one operator.
pub async fn finish_all(client: &Client, namespaces: &[&str], operator: Operator) {
    for ns in namespaces {
        clean_up(client, ns).await;
    }
    drop(operator);
    let all: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let _ = all.delete(ns, &kube::api::DeleteParams::default()).await;
    }
}

/// Deletes the ClickHouseClusters of `ns` (the operator running) and waits until they and
/// every pod of the namespace are gone.
pub async fn clean_up(client: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::DeleteParams;
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    clusters
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete the clusters");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(120),
        "the clusters and their pods to be gone",
        || {
            let (clusters, pods) = (clusters.clone(), pods.clone());
            async move {
                let c = clusters.list(&Default::default()).await.ok()?;
                let p = pods.list(&Default::default()).await.ok()?;
                (c.items.is_empty() && p.items.is_empty()).then_some(())
            }
        },
    )
    .await;
}

/// How long a cluster may take to become ready in these tests.
pub const READY: Duration = Duration::from_secs(300);

/// Merges `spec` into the cluster's spec.
pub async fn patch_spec(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    Api::<ClickHouseCluster>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch the cluster");
}

/// Waits until the cluster is ready at `generation`.
pub async fn wait_ready(
    client: &Client,
    ns: &str,
    name: &str,
    generation: i64,
) -> ClickHouseCluster {
    wait_status(
        client,
        ns,
        name,
        READY,
        &format!("{name} ready at generation {generation}"),
        |s| s.state == ClusterState::Ready && s.observed_generation == Some(generation),
    )
    .await
}

/// The backup replica of the only shard (or the first one listed) in the cluster's status.
pub fn backup_replica(c: &ClickHouseCluster) -> String {
    c.status
        .as_ref()
        .unwrap()
        .replica_state_map
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| n.clone())
        .expect("a backup replica")
}

/// Watches the server pods of `cluster` (`total` of them, `before` as [`pod_ids`] gave them)
/// until the cluster is ready at `generation`: the pods in the order they were replaced and the
/// most that were down at once. Fails unless every pod was replaced before ready.
pub async fn watch_rollout(
    client: &Client,
    ns: &str,
    cluster: &str,
    before: &std::collections::BTreeMap<String, (String, i32)>,
    total: usize,
    generation: i64,
) -> (Vec<String>, usize) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let selector = format!("clickhouse.com/cluster={cluster},app.kubernetes.io/component=server");
    let mut order: Vec<String> = Vec::new();
    let mut most_down = 0;
    let deadline = tokio::time::Instant::now() + READY;
    loop {
        let list = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items;
        let mut down = total.saturating_sub(list.len());
        for p in &list {
            let name = p.name_any();
            if !clickhouse_operator::plan::facts::pod_ready(p) {
                down += 1;
            }
            if before.get(&name).map(|(uid, _)| uid) != p.uid().as_ref() && !order.contains(&name) {
                order.push(name);
            }
        }
        most_down = most_down.max(down);
        let s = api.get(cluster).await.unwrap().status.unwrap();
        if s.state == ClusterState::Ready && s.observed_generation == Some(generation) {
            assert_eq!(
                order.len(),
                total,
                "every pod restarted once before ready: {order:?}"
            );
            return (order, most_down);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout did not finish: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (uid, restartCount) of the pods of `ns` that match the label `selector` ("" for all), by
/// pod name: equal before and after means no pod restarted.
pub async fn pod_ids(
    client: &Client,
    ns: &str,
    selector: &str,
) -> std::collections::BTreeMap<String, (String, i32)> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

/// The folder of claim `pvc` on this machine .
pub async fn volume_path(client: &Client, ns: &str, pvc: &str) -> PathBuf {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get(pvc)
        .await
        .unwrap();
    let pv = claim.spec.unwrap().volume_name.unwrap();
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await
        .unwrap();
    PathBuf::from(pv.spec.unwrap().host_path.unwrap().path)
}

/// Runs helm (the binary of `hack/helm.sh`, built by `hack/setup.sh`) against the local cluster,
/// with its state folders under target/.
pub fn helm_run(args: &[&str]) {
    let repo = repo();
    let out = Command::new("bash")
        .arg(repo.join("hack/helm.sh"))
        .output()
        .expect("run hack/helm.sh");
    assert!(
        out.status.success(),
        "hack/helm.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let helm = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .trim(),
    );
    let home = repo.join("target/helm-home");
    let out = Command::new(helm)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pid of the process of a pod's container whose command line holds `program` (the node
/// agent runs containers as processes of this machine, with the pod's name as `HOSTNAME`), and,
/// when `ip` is given, whose network namespace holds that address (a pod of the same name in
/// another namespace is another process).
pub fn pid_of(program: &str, pod: &str, ip: Option<&str>) -> i32 {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(program) {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if !environ
            .split(|b| *b == 0)
            .any(|v| v == format!("HOSTNAME={pod}").as_bytes())
        {
            continue;
        }
        let Some(ip) = ip else { return pid };
        let addrs = Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-n",
                "ip",
                "-o",
                "-4",
                "addr",
                "show",
            ])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&addrs.stdout).contains(&format!("inet {ip}/")) {
            return pid;
        }
    }
    panic!("no {program} process of pod {pod}");
}

/// The address of pod `pod`, once it has one.
pub async fn pod_ip(client: &Client, ns: &str, pod: &str) -> String {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(120),
        &format!("an address for {pod}"),
        || {
            let pods = pods.clone();
            async move { pods.get(pod).await.ok()?.status?.pod_ip }
        },
    )
    .await
}

/// The replicas of a cluster's ReplicaStateMap, by name.
pub fn replica_names(cluster: &ClickHouseCluster) -> Vec<String> {
    cluster
        .status
        .as_ref()
        .map(|s| s.replica_state_map.keys().cloned().collect())
        .unwrap_or_default()
}

/// Creates `default.t` (ReplicatedMergeTree, `ON CLUSTER c1`) through the first replica of
/// `replicas` and writes the numbers 0 to 999 into it.
pub async fn write_thousand_rows(client: &Client, ns: &str, replicas: &[String]) {
    let first = sql_client(client, ns, "c1", &format!("{}-0", replicas[0])).await;
    exec(
        &first,
        "CREATE TABLE default.t ON CLUSTER c1 (n UInt64) \
         ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ORDER BY n",
    )
    .await;
    exec(
        &first,
        "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 1000",
    )
    .await;
}

/// Every replica of `replicas` holds exactly the rows of [`write_thousand_rows`] (count and sum),
/// once synced; `when` names the moment in the failure.
pub async fn assert_thousand_rows(client: &Client, ns: &str, replicas: &[String], when: &str) {
    for r in replicas {
        let s = sql_client(client, ns, "c1", &format!("{r}-0")).await;
        exec(&s, "SYSTEM SYNC REPLICA default.t").await;
        assert_eq!(
            query(
                &s,
                "SELECT concat(toString(count()), '/', toString(sum(n))) AS v FROM default.t"
            )
            .await,
            ["1000/499500"],
            "{when}: {r}"
        );
    }
}
