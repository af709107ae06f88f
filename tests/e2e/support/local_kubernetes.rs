//! The local Kubernetes clusters (the test cluster and the multi-node one), started on first use
//! and stopped at exit, their clients with the CRDs installed, the multi-node cluster's nodes
//! and kubectl, and helm against the test cluster.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use clickhouse_operator::api::crd;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::logs::LogTee;
use super::{repo, wait_for};

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
    // Image volumes as CRI-O makes them (inside the read-only root filesystem): the pods must
    // not depend on a runtime that mounts the images' VOLUMEs writable (decision 42).
    let image_volumes =
        std::env::var("LOCAL_KUBELET_IMAGE_VOLUMES").unwrap_or_else(|_| "crio".into());
    let up = || {
        Command::new("bash")
            .arg(repo().join("hack/local-cluster.sh"))
            .arg("up")
            .arg(&dir)
            .env("LOCAL_KUBELET_IMAGE_VOLUMES", &image_volumes)
            .env("LOCAL_CLUSTER_NODES", nodes.to_string())
            .env("LOCAL_CLUSTER_NETWORK_POLICIES", policies)
            // the operator's image as `hack/image.sh` wrote it: pods of that image run from it
            .env("LOCAL_KUBELET_IMAGE_STORE", repo().join("target/image/oci"))
            .status()
            .expect("run hack/local-cluster.sh")
            .success()
    };
    // A bring-up that fails (it said why and stopped what it started) is tried once more: the
    // local Kubernetes is the tests' machinery, not what they prove. Seen rarely while three
    // clusters come up at once: a node network process gone before it wrote a line.
    let ok = up() || {
        eprintln!(
            "hack/local-cluster.sh up {} failed (above): bringing it up once more",
            dir.display()
        );
        up()
    };
    assert!(ok, "hack/local-cluster.sh up {} failed", dir.display());
    LocalCluster {
        kubeconfig: dir.join("kubeconfig"),
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
