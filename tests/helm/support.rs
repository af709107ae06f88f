//! What the tests of this binary share: the charts, helm (`hack/helm.sh`) and what it renders,
//! and, for the tests on the real local Kubernetes, the local cluster, the releases installed on it
//! and the API server's audit log.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_yaml::Value;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn operator_chart() -> PathBuf {
    repo().join("charts/clickhouse-operator")
}

pub fn cluster_chart() -> PathBuf {
    repo().join("charts/onprem-clickhouse-cluster")
}

/// The helm binary from `hack/helm.sh`, or why there is none.
pub fn helm() -> Result<&'static Path, &'static str> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("hack/helm.sh"))
            .output()
            .map_err(|e| format!("cannot run hack/helm.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "hack/helm.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let path = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        let path = PathBuf::from(path);
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "hack/helm.sh printed no binary ({})",
                path.display()
            ))
        }
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(String::as_str)
}

macro_rules! helm_or_skip {
    () => {
        match $crate::support::helm() {
            Ok(h) => h,
            Err(why) => {
                $crate::support::skipped(&format!(
                    "helm cannot be built here, so the charts are not checked: {why}"
                ));
                return;
            }
        }
    };
}
pub(crate) use helm_or_skip;

/// Runs helm with its state folders under target/ (nothing in the user's home).
pub fn helm_cmd(helm: &Path) -> Command {
    let home = repo().join("target/helm-home");
    let mut c = Command::new(helm);
    c.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    c
}

fn run(mut cmd: Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The pod network the tests give the operator chart (its required `operatorNetworks`, decision
/// 71) unless they set it themselves.
pub const TEST_POD_NETWORK: &str = "operatorNetworks={10.244.0.0/16}";

/// `sets` with [`TEST_POD_NETWORK`] first for the operator chart when they do not name
/// `operatorNetworks`.
pub fn with_required<'a>(chart: &Path, sets: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    if chart.ends_with("clickhouse-operator")
        && !sets.iter().any(|s| s.starts_with("operatorNetworks"))
    {
        out.push(TEST_POD_NETWORK);
    }
    out.extend_from_slice(sets);
    out
}

pub fn lint(helm: &Path, chart: &Path, sets: &[&str]) {
    let mut c = helm_cmd(helm);
    c.arg("lint").arg("--strict").arg(chart);
    for s in with_required(chart, sets) {
        c.arg("--set").arg(s);
    }
    run(c);
}

/// `helm template` as it prints (stdout), or its failure (stderr), with exactly `sets`.
pub fn template_text(helm: &Path, chart: &Path, sets: &[&str]) -> Result<String, String> {
    let mut c = helm_cmd(helm);
    c.arg("template")
        .arg("rel")
        .arg(chart)
        .arg("--namespace")
        .arg("ops");
    for s in sets {
        c.arg("--set").arg(s);
    }
    let out = c.output().expect("helm template");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The install notes (NOTES.txt) `helm install --dry-run=client` prints, with exactly `sets`:
/// rendered without a cluster.
pub fn notes(helm: &Path, chart: &Path, sets: &[&str]) -> String {
    let mut c = helm_cmd(helm);
    c.args(["install", "rel"])
        .arg(chart)
        .args(["--namespace", "ops", "--dry-run=client"]);
    for s in sets {
        c.arg("--set").arg(s);
    }
    let out = run(c);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_once("NOTES:")
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| panic!("no NOTES in {text}"))
}

/// `helm template` → the rendered documents (CRDs included with `crds`).
pub fn template(
    helm: &Path,
    chart: &Path,
    namespace: &str,
    sets: &[&str],
    crds: bool,
) -> Vec<Value> {
    let mut c = helm_cmd(helm);
    c.arg("template")
        .arg("rel")
        .arg(chart)
        .arg("--namespace")
        .arg(namespace);
    if crds {
        c.arg("--include-crds");
    }
    for s in with_required(chart, sets) {
        c.arg("--set").arg(s);
    }
    let out = run(c);
    docs(&String::from_utf8_lossy(&out.stdout))
}

pub fn docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("helm printed valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

pub fn s<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(v, |v, k| match k.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(k),
        })
}

pub fn text(v: &Value, path: &str) -> String {
    match s(v, path) {
        Some(Value::String(x)) => x.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| text(d, "kind") == kind).collect()
}

pub fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| text(d, "kind") == kind && text(d, "metadata.name") == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

pub fn env_of(container: &Value) -> BTreeMap<String, String> {
    s(container, "env")
        .and_then(Value::as_sequence)
        .map(|env| {
            env.iter()
                .filter(|e| s(e, "value").is_some())
                .map(|e| (text(e, "name"), text(e, "value")))
                .collect()
        })
        .unwrap_or_default()
}

/// Every rule of every Role and ClusterRole: no wildcard, and only the listed verbs.
pub fn assert_no_wildcards(docs: &[Value]) {
    for d in docs
        .iter()
        .filter(|d| matches!(text(d, "kind").as_str(), "Role" | "ClusterRole"))
    {
        for rule in s(d, "rules").and_then(Value::as_sequence).unwrap() {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                for item in s(rule, field)
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    assert_ne!(
                        item.as_str(),
                        Some("*"),
                        "wildcard in {} {}: {rule:?}",
                        text(d, "kind"),
                        text(d, "metadata.name")
                    );
                }
            }
        }
    }
}

/// A ClusterRole the chart aggregates into the built-in `view`, `edit` or `admin` role.
pub fn aggregated(role: &Value) -> bool {
    s(role, "metadata.labels")
        .and_then(Value::as_mapping)
        .is_some_and(|l| {
            l.keys().any(|k| {
                k.as_str()
                    .is_some_and(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"))
            })
        })
}

/// (apiGroup, resource, verb) of every rule of a Role or ClusterRole.
pub fn rule_triples(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in s(role, "rules")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let list = |f: &str| -> Vec<String> {
            s(rule, f)
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

/// The pod network of the local cluster the in-cluster tests use (its `network` file beside the
/// kubeconfig), for the chart's required `operatorNetworks`; every local cluster's pods are in
/// 198.18.0.0/15 where the file is missing.
pub fn pod_network() -> String {
    kubeconfig()
        .parent()
        .and_then(|d| std::fs::read_to_string(d.join("network")).ok())
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("POD_CIDR="))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "198.18.0.0/15".into())
}

/// A test whose tool is missing is skipped here and said so; in CI (`CI=true`, set by
/// `.ci/run`), where everything is installed, a missing tool fails it instead.
pub fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

// ------------------------------------------------------------------------------------------------
// On the real local Kubernetes
// ------------------------------------------------------------------------------------------------

const READY: Duration = Duration::from_secs(360);
/// The operator's Lease duration (src/runtime/leader.rs) and its standby's retry period.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The local cluster: `CHOP_KUBECONFIG`, or one started here (stopped at exit).
pub fn kubeconfig() -> &'static Path {
    static KC: OnceLock<PathBuf> = OnceLock::new();
    static STARTED: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn down_at_exit() {
        if let Some(dir) = STARTED.get() {
            let _ = Command::new("bash")
                .arg(repo().join("hack/local-cluster.sh"))
                .arg("down")
                .arg(dir)
                .status();
        }
    }
    KC.get_or_init(|| {
        if let Ok(p) = std::env::var("CHOP_KUBECONFIG") {
            return PathBuf::from(p);
        }
        let dir = repo()
            .join("target")
            .join(format!("helm-cluster-{}", std::process::id()));
        STARTED.set(dir.clone()).unwrap();
        // SAFETY: registering a plain extern "C" function with atexit has no preconditions.
        unsafe {
            libc::atexit(down_at_exit);
        }
        let ok = Command::new("bash")
            .arg(repo().join("hack/local-cluster.sh"))
            .arg("up")
            .arg(&dir)
            // the operator's image as `hack/image.sh` wrote it: pods of that image run from it
            .env("LOCAL_KUBELET_IMAGE_STORE", repo().join("target/image/oci"))
            .status()
            .expect("run hack/local-cluster.sh")
            .success();
        assert!(ok, "hack/local-cluster.sh up {} failed (another local cluster running? set CHOP_KUBECONFIG=<its dir>/kubeconfig)", dir.display());
        dir.join("kubeconfig")
    })
}

pub fn kubectl() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("hack/build-control-plane.sh"))
        .output()
        .expect("hack/build-control-plane.sh");
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    PathBuf::from(dir).join("kubectl")
}

pub async fn client() -> Client {
    let kc = Kubeconfig::read_from(kubeconfig()).expect("read the kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a valid kubeconfig");
    Client::try_from(config).expect("a client")
}

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
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Uninstalls the releases and deletes the namespaces when the test ends, passed or failed; on
/// failure, prints the end of the operator's logs.
pub struct Cleanup {
    pub op_ns: String,
    pub ch_ns: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let kc = kubeconfig();
        if std::thread::panicking() {
            let dir = kc.parent().unwrap().join("logs/pods");
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().to_string();
                    if name.starts_with(&format!("{}_", self.op_ns)) {
                        for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                            let tail: Vec<&str> = text.lines().rev().take(40).collect();
                            eprintln!(
                                "---- {name}/{} (last 40 lines) ----",
                                f.file_name().to_string_lossy()
                            );
                            for l in tail.iter().rev() {
                                eprintln!("{l}");
                            }
                        }
                    }
                }
            }
        }
        if let Ok(h) = helm() {
            for (rel, ns) in [("c1", &self.ch_ns), ("op", &self.op_ns)] {
                let _ = helm_cmd(h)
                    .args(["--kubeconfig"])
                    .arg(kc)
                    .args(["uninstall", rel, "-n", ns, "--ignore-not-found"])
                    .output();
            }
        }
        let k = kubectl();
        // the operator is gone: nothing would remove the finalizers
        let _ = Command::new(&k)
            .arg("--kubeconfig")
            .arg(kc)
            .args([
                "-n",
                &self.ch_ns,
                "patch",
                "chc",
                "c1",
                "c2",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ])
            .output();
        let _ = Command::new(&k)
            .arg("--kubeconfig")
            .arg(kc)
            .args([
                "delete",
                "namespace",
                &self.ch_ns,
                &self.op_ns,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

pub fn helm_in_cluster(args: &[&str]) -> String {
    let h = helm().expect("helm");
    // The API server refuses a ClickHouseCluster while the namespace's new ResourceQuota has no
    // status yet ("status unknown for quota"); the chart creates both at once, so an install
    // may meet that for a few seconds. A user re-runs the install; so does the test.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let mut c = helm_cmd(h);
        c.arg("--kubeconfig").arg(kubeconfig()).args(args);
        let out = c.output().expect("run helm");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            && stderr.contains("status unknown for quota")
            && std::time::Instant::now() < deadline
        {
            eprintln!("helm {args:?}: the quota has no status yet, retrying");
            let mut undo = helm_cmd(h);
            undo.arg("--kubeconfig").arg(kubeconfig());
            if let Some(i) = args.iter().position(|a| *a == "install") {
                undo.args(["uninstall", args[i + 1]]);
                if let Some(n) = args.iter().position(|a| *a == "-n") {
                    undo.args(["-n", args[n + 1]]);
                }
                let _ = undo.output();
            }
            std::thread::sleep(std::time::Duration::from_secs(3));
            continue;
        }
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        return String::from_utf8_lossy(&out.stdout).into_owned();
    }
}

pub async fn create_namespace(client: &Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("create a namespace");
}

pub async fn wait_state(
    api: &Api<ClickHouseCluster>,
    name: &str,
    what: &str,
    pred: impl Fn(&ClickHouseCluster) -> bool,
) -> ClickHouseCluster {
    wait_for(READY, what, || async {
        let c = api.get(name).await.ok()?;
        pred(&c).then_some(c)
    })
    .await
}

/// Applies `sets` to release c1 and waits until the cluster is `state` at the new generation.
pub async fn upgrade_and_wait(
    api: &Api<ClickHouseCluster>,
    ch_ns: &str,
    sets: &[&str],
    state: ClusterState,
    extra: impl Fn(&ClickHouseCluster) -> bool,
) -> ClickHouseCluster {
    let chart = repo()
        .join("charts/onprem-clickhouse-cluster")
        .to_string_lossy()
        .into_owned();
    let mut args = vec!["upgrade", "c1", &chart, "-n", ch_ns, "--reuse-values"];
    for s in sets {
        // annotation values are strings ("true"), spec values keep their YAML type
        args.push(if s.starts_with("annotations.") {
            "--set-string"
        } else {
            "--set"
        });
        args.push(s);
    }
    helm_in_cluster(&args);
    let generation = api.get("c1").await.unwrap().metadata.generation.unwrap();
    wait_state(
        api,
        "c1",
        &format!("c1 {state} at generation {generation} after {sets:?}"),
        |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.state == state && s.observed_generation == Some(generation))
                && extra(c)
        },
    )
    .await
}

/// (uid, restarts) of every ClickHouse and Keeper pod of c1.
pub async fn cluster_pods(client: &Client, ns: &str) -> BTreeMap<String, (String, i32)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("clickhouse.com/cluster=c1"))
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

/// One request of a ServiceAccount in the audit log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub code: i64,
}

pub fn audit_requests(audit: &Path, users: &BTreeSet<String>, since: &str) -> Vec<Request> {
    let mut out = BTreeMap::new();
    let f = std::fs::File::open(audit).unwrap_or_else(|e| panic!("{}: {e}", audit.display()));
    for line in std::io::BufReader::new(f).lines() {
        let Ok(line) = line else { continue };
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let user = ev["user"]["username"].as_str().unwrap_or_default();
        if !users.contains(user) || ev["stage"] == "RequestReceived" {
            continue;
        }
        if ev["requestReceivedTimestamp"].as_str().unwrap_or_default() < since {
            continue;
        }
        let o = &ev["objectRef"];
        let mut resource = o["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let req = Request {
            user: user.to_string(),
            verb: ev["verb"].as_str().unwrap_or_default().to_string(),
            group: o["apiGroup"].as_str().unwrap_or_default().to_string(),
            resource,
            namespace: o["namespace"].as_str().unwrap_or_default().to_string(),
            name: o["name"].as_str().unwrap_or_default().to_string(),
            code: ev["responseStatus"]["code"].as_i64().unwrap_or(0),
        };
        out.insert(ev["auditID"].as_str().unwrap_or_default().to_string(), req);
    }
    out.into_values().collect()
}
