//! local-kubelet: a node agent for tests and demos. It registers a Node, keeps its Lease fresh,
//! provisions PersistentVolumes for the default StorageClass `local`, runs the Pods bound to its
//! Node as local processes (each pod in its own network namespace on the bridge `chbr0`, each
//! container in its own mount and UTS namespace) and proxies Service ClusterIPs to ready endpoints.
//!
//! Images are mapped to programs installed on this machine (see `images.rs`); any other image is
//! reported as not runnable (`ErrImagePull`, then `ImagePullBackOff`, as a kubelet reports a
//! failed pull), never as a fake Running container.

mod entrypoint;
mod gate;
mod hollow;
mod hosts;
mod images;
mod keeper;
mod kubelet_api;
mod net;
mod node;
mod oci;
mod pods;
mod policy;
mod probes;
mod services;
mod storage;
mod util;
mod volumes;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

pub const PROVISIONER: &str = "local-kubelet.local/hostpath";
pub const STORAGE_CLASS: &str = "local";

pub struct Ctx {
    pub client: Client,
    pub node: String,
    pub data_dir: PathBuf,
    pub ca_file: PathBuf,
    /// host:port of the API server as the agent reaches it (from the kubeconfig)
    pub api_upstream: String,
    pub operator_bin: PathBuf,
    /// an OCI image layout folder: pods of its images run from them (oci.rs)
    pub image_store: Option<PathBuf>,
    /// this program, for `chroot-exec`
    pub self_exe: PathBuf,
    /// container logs: <log dir>/<ns>_<pod>_<uid8>/<container>.log
    pub log_dir: PathBuf,
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub configmaps: Store<ConfigMap>,
    pub secrets: Store<Secret>,
    pub pvcs: Store<PersistentVolumeClaim>,
    pub pvs: Store<PersistentVolume>,
    pub namespaces: Store<Namespace>,
    pub policies: Store<NetworkPolicy>,
    /// this node's pods whose network namespaces hold NetworkPolicy rules (policy.rs)
    pub policy_pods: Mutex<std::collections::HashMap<String, policy::PodNet>>,
    /// the machine's addresses and the ClusterIP range, as policies treat them
    pub fabric: policy::Fabric,
    /// whether NetworkPolicies are enforced (`--network-policies enforce`, the default)
    pub enforce_policies: bool,
    pub ipam: Mutex<net::Ipam>,
    pub shutting_down: std::sync::atomic::AtomicBool,
    /// The node's pod network, published as the Node's `spec.podCIDR` (as the node controller
    /// of a cluster that allocates node CIDRs sets it).
    pub pod_cidr: String,
    /// the Node's `topology.kubernetes.io/zone` label, if any
    pub zone: Option<String>,
    /// how often the node's Lease is renewed
    pub lease_renew: std::time::Duration,
}

pub type SharedCtx = Arc<Ctx>;

struct Args {
    cmd: String,
    kubeconfig: Option<PathBuf>,
    node_name: String,
    data_dir: PathBuf,
    ca_file: Option<PathBuf>,
    operator_bin: PathBuf,
    image_store: Option<PathBuf>,
    log_dir: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    bridge: String,
    pod_cidr: String,
    node_cidr: Option<String>,
    node_ip: Option<String>,
    service_cidr: Option<String>,
    zone: Option<String>,
    /// `own`: this agent creates and removes the bridge and proxies ClusterIPs; `external`: a
    /// `local-kubelet network` process does (clusters of several nodes)
    network: String,
    lease_renew_seconds: u64,
    network_policies: String,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        cmd: "run".into(),
        kubeconfig: std::env::var_os("KUBECONFIG").map(PathBuf::from),
        node_name: "node-1".into(),
        data_dir: PathBuf::from("/var/lib/local-kubelet"),
        ca_file: None,
        operator_bin: std::env::var_os("CLICKHOUSE_OPERATOR_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("target/debug/clickhouse-operator")),
        image_store: std::env::var_os(oci::STORE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        log_dir: None,
        tls_cert: None,
        tls_key: None,
        bridge: "chbr0".into(),
        pod_cidr: "198.18.0.0/19".into(),
        node_cidr: None,
        node_ip: None,
        service_cidr: None,
        zone: None,
        network: "own".into(),
        lease_renew_seconds: 10,
        network_policies: "enforce".into(),
    };
    let mut first = true;
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "run" | "cleanup" | "network" if first => a.cmd = arg.clone(),
            "--kubeconfig" => a.kubeconfig = Some(val("--kubeconfig")?.into()),
            "--node-name" => a.node_name = val("--node-name")?,
            "--data-dir" => a.data_dir = val("--data-dir")?.into(),
            "--ca-file" => a.ca_file = Some(val("--ca-file")?.into()),
            "--operator-binary" => a.operator_bin = val("--operator-binary")?.into(),
            "--image-store" => a.image_store = Some(val("--image-store")?.into()),
            "--log-dir" => a.log_dir = Some(val("--log-dir")?.into()),
            "--bridge" => a.bridge = val("--bridge")?,
            "--pod-cidr" => a.pod_cidr = val("--pod-cidr")?,
            "--node-cidr" => a.node_cidr = Some(val("--node-cidr")?),
            "--node-ip" => a.node_ip = Some(val("--node-ip")?),
            "--service-cidr" => a.service_cidr = Some(val("--service-cidr")?),
            "--zone" => a.zone = Some(val("--zone")?),
            "--network" => {
                a.network = val("--network")?;
                if a.network != "own" && a.network != "external" {
                    bail!("--network must be own or external");
                }
            }
            "--network-policies" => {
                a.network_policies = val("--network-policies")?;
                if a.network_policies != "enforce" && a.network_policies != "ignore" {
                    bail!("--network-policies must be enforce or ignore");
                }
            }
            "--lease-renew-seconds" => {
                a.lease_renew_seconds = val("--lease-renew-seconds")?
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .context("--lease-renew-seconds must be a positive number")?
            }
            "--tls-cert-file" => a.tls_cert = Some(val("--tls-cert-file")?.into()),
            "--tls-private-key-file" => a.tls_key = Some(val("--tls-private-key-file")?.into()),
            "-h" | "--help" => {
                println!(
                    "usage: local-kubelet [run|cleanup|network] --kubeconfig FILE --node-name NAME \
                     --data-dir DIR --ca-file CA.crt --operator-binary PATH [--image-store OCI-LAYOUT-DIR] [--log-dir DIR] [--bridge chbr0 --pod-cidr 198.18.0.0/19] \
                     [--node-cidr SUBRANGE --node-ip IP --network own|external] [--service-cidr 198.19.0.0/19] [--zone ZONE] \
                     [--lease-renew-seconds 10] [--network-policies enforce|ignore] [--tls-cert-file F --tls-private-key-file F]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
        first = false;
    }
    Ok(a)
}

fn start_reflector<K>(api: Api<K>, cfg: watcher::Config) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, cfg)).default_backoff();
    tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::debug!("watch error: {e}");
            }
        }
    });
    reader
}

/// A watched store, or (`watch` false) one that stays empty and is ready at once.
fn maybe_reflector<K>(watch: bool, api: Api<K>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    if watch {
        return start_reflector(api, watcher::Config::default());
    }
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("chroot-exec") {
        // a container of a stored image, entering its root filesystem (oci.rs)
        oci::chroot_exec(&argv[2..]);
    }
    if argv.get(1).map(String::as_str) == Some("hollow-server") {
        // a light process of its own: no runtime, no threads but one per connection
        let arg = |name: &str| {
            argv.iter()
                .position(|a| a == name)
                .and_then(|i| argv.get(i + 1))
                .cloned()
        };
        hollow::run(
            arg("--version").unwrap_or_else(|| "24.8.1.1".into()),
            arg("--config-dir")
                .unwrap_or_else(|| "/etc/clickhouse-server/config.d".into())
                .into(),
            arg("--port").and_then(|p| p.parse().ok()).unwrap_or(8123),
        );
    }
    if argv.get(1).map(String::as_str) == Some("keeper-gate") {
        // Keeper's client port, opened once the member serves (see gate.rs)
        let arg = |name: &str| {
            argv.iter()
                .position(|a| a == name)
                .and_then(|i| argv.get(i + 1))
                .cloned()
        };
        let port = arg("--port").and_then(|p| p.parse().ok()).unwrap_or(9181);
        let upstream = arg("--upstream")
            .and_then(|u| u.parse().ok())
            .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 2181)));
        let timeout = arg("--startup-timeout-ms")
            .and_then(|t| t.parse().ok())
            .unwrap_or(keeper::DEFAULT_STARTUP_TIMEOUT_MS);
        gate::run(port, upstream, std::time::Duration::from_millis(timeout));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(agent())
}

async fn agent() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        .init();
    let args = parse_args()?;
    std::fs::create_dir_all(&args.data_dir)?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let network_role = args.cmd == "network";
    net::configure(&net::Options {
        bridge: args.bridge.clone(),
        pod_cidr: args.pod_cidr.clone(),
        node_cidr: args.node_cidr.clone(),
        node_ip: args.node_ip.clone(),
        own_bridge: network_role || args.network == "own",
    })?;
    if args.cmd == "cleanup" {
        net::cleanup_leftovers(&data_dir).await;
        return Ok(());
    }
    if unsafe { libc::geteuid() } != 0 {
        bail!("local-kubelet must run as root");
    }
    let (client, api_upstream, ca_file) = connect(&args, &data_dir).await?;
    let fabric = fabric(&args)?;

    if !network_role {
        // leftovers of an earlier run that did not stop cleanly
        net::cleanup_leftovers(&data_dir).await;
    }
    net::note_netns_dir();
    if net::owns_bridge() {
        net::setup_bridge().await?;
    } else {
        net::join_bridge().await?;
    }

    let ctx = Arc::new(context(
        &args,
        client,
        data_dir,
        ca_file,
        api_upstream,
        fabric,
        network_role,
    )?);
    wait_for_watches(&ctx, network_role).await?;

    let mut stop = Stop::new()?;
    if network_role {
        services::start(ctx.clone());
        tracing::info!("network of bridge {} ready", net::bridge());
        stop.wait().await;
        services::shutdown().await;
        net::remove_bridge().await;
        tracing::info!("stopped");
        return Ok(());
    }
    remember_addresses(&ctx);
    run_node(&ctx, &args, stop).await
}

/// The client of the API server the kubeconfig names, where the agent reaches that server
/// (`host:port`), and the CA file for the pods' service-account folders (the kubeconfig's CA,
/// written into `data_dir`, unless `--ca-file` names one).
async fn connect(args: &Args, data_dir: &Path) -> Result<(Client, String, PathBuf)> {
    let kubeconfig_path = args
        .kubeconfig
        .clone()
        .context("--kubeconfig is required")?;
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig_path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    let api_upstream = {
        let host = config.cluster_url.host().unwrap_or("127.0.0.1").to_string();
        let port = config.cluster_url.port_u16().unwrap_or(443);
        format!("{host}:{port}")
    };
    let ca_file = match args.ca_file.clone() {
        Some(p) => p,
        None => {
            // write the kubeconfig's CA for the pods' service-account folders
            let p = data_dir.join("ca.crt");
            if let Some(certs) = &config.root_cert {
                let mut pem = String::new();
                for c in certs {
                    pem.push_str(&util::der_to_pem(c));
                }
                std::fs::write(&p, pem)?;
            }
            p
        }
    };
    Ok((Client::try_from(config)?, api_upstream, ca_file))
}

/// The machine's addresses and the ClusterIP range, as NetworkPolicies treat them.
fn fabric(args: &Args) -> Result<policy::Fabric> {
    Ok(policy::Fabric {
        host: policy::Cidr {
            addr: net::network() & (u32::MAX << 8),
            len: 24,
        },
        services: match &args.service_cidr {
            Some(c) => policy::Cidr::parse(c).context("--service-cidr must be a.b.c.d/len")?,
            // 198.18.x.0/19 -> 198.19.x.0/19, as hack/local-cluster.sh assigns them
            None => policy::Cidr {
                addr: net::network() + (1 << 16),
                len: net::prefix(),
            },
        },
    })
}

/// The agent's context, its watches started (the network process's only those it needs).
fn context(
    args: &Args,
    client: Client,
    data_dir: PathBuf,
    ca_file: PathBuf,
    api_upstream: String,
    fabric: policy::Fabric,
    network_role: bool,
) -> Result<Ctx> {
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| data_dir.join("logs"));
    let all = watcher::Config::default();
    // the network process proxies ClusterIPs only: it watches what the proxy and the policy
    // decision need
    let node_store = |watch: bool| watch && !network_role;
    Ok(Ctx {
        pods: start_reflector(Api::<Pod>::all(client.clone()), all.clone()),
        services: start_reflector(Api::<Service>::all(client.clone()), all.clone()),
        slices: start_reflector(Api::<EndpointSlice>::all(client.clone()), all.clone()),
        configmaps: maybe_reflector(node_store(true), Api::<ConfigMap>::all(client.clone())),
        secrets: maybe_reflector(node_store(true), Api::<Secret>::all(client.clone())),
        pvcs: maybe_reflector(
            node_store(true),
            Api::<PersistentVolumeClaim>::all(client.clone()),
        ),
        pvs: maybe_reflector(
            node_store(true),
            Api::<PersistentVolume>::all(client.clone()),
        ),
        namespaces: start_reflector(Api::<Namespace>::all(client.clone()), all.clone()),
        policies: start_reflector(Api::<NetworkPolicy>::all(client.clone()), all.clone()),
        policy_pods: Default::default(),
        fabric,
        enforce_policies: args.network_policies == "enforce",
        client,
        node: args.node_name.clone(),
        data_dir,
        ca_file,
        api_upstream,
        operator_bin: args.operator_bin.clone(),
        image_store: args.image_store.clone(),
        self_exe: std::env::current_exe()?,
        log_dir,
        ipam: Mutex::new(net::Ipam::default()),
        shutting_down: Default::default(),
        pod_cidr: args.node_cidr.clone().unwrap_or(args.pod_cidr.clone()),
        zone: args.zone.clone(),
        lease_renew: std::time::Duration::from_secs(args.lease_renew_seconds),
    })
}

/// Waits until every watch has its first list: the network process's, then a node's others.
async fn wait_for_watches(ctx: &Ctx, network_role: bool) -> Result<()> {
    for (name, ready) in [
        ("pods", ctx.pods.wait_until_ready().await.is_ok()),
        ("services", ctx.services.wait_until_ready().await.is_ok()),
        (
            "endpointslices",
            ctx.slices.wait_until_ready().await.is_ok(),
        ),
        (
            "namespaces",
            ctx.namespaces.wait_until_ready().await.is_ok(),
        ),
        (
            "networkpolicies",
            ctx.policies.wait_until_ready().await.is_ok(),
        ),
    ] {
        if !ready {
            bail!("watch of {name} failed");
        }
    }
    if !network_role {
        for (name, ready) in [
            (
                "configmaps",
                ctx.configmaps.wait_until_ready().await.is_ok(),
            ),
            ("secrets", ctx.secrets.wait_until_ready().await.is_ok()),
            (
                "persistentvolumeclaims",
                ctx.pvcs.wait_until_ready().await.is_ok(),
            ),
            (
                "persistentvolumes",
                ctx.pvs.wait_until_ready().await.is_ok(),
            ),
        ] {
            if !ready {
                bail!("watch of {name} failed");
            }
        }
    }
    Ok(())
}

/// SIGTERM and SIGINT, either of which stops the agent.
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> Result<Stop> {
        Ok(Stop {
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
            int: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
        })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = self.int.recv() => tracing::info!("SIGINT: stopping"),
        }
    }
}

/// A node that starts again (`node-start`) gives its pods the addresses they had, as the
/// pods' status still says: ClickHouse 18.16 keeps a peer's address in its replication
/// fetches (see `net::Ipam`), so a pod that came back on another pod's former address would
/// be unreachable to its peers, and the other pod reached in its place.
fn remember_addresses(ctx: &Ctx) {
    let mut ipam = ctx.ipam.lock().unwrap();
    for p in ctx.pods.state() {
        if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(ctx.node.as_str()) {
            continue;
        }
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        if let Some(ip) = ip.and_then(|ip| ip.parse::<std::net::Ipv4Addr>().ok()) {
            let key = format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            );
            ipam.remember(&key, ip);
        }
    }
}

/// The node: registered and kept fresh, its volumes provisioned, its policies enforced, its
/// ClusterIPs proxied (when it owns the bridge), its kubelet API served, its pods run, until
/// `stop`; then every pod stops (90 s at most) and the node's network goes.
async fn run_node(ctx: &SharedCtx, args: &Args, mut stop: Stop) -> Result<()> {
    node::register(ctx).await?;
    tokio::spawn(node::heartbeat(ctx.clone()));
    tokio::spawn(storage::run(ctx.clone()));
    if ctx.enforce_policies {
        tokio::spawn(policy::run(ctx.clone()));
    }
    if net::owns_bridge() {
        services::start(ctx.clone());
    }
    if let (Some(cert), Some(key)) = (args.tls_cert.clone(), args.tls_key.clone()) {
        tokio::spawn(kubelet_api::run(
            ctx.clone(),
            kubelet_api::Tls {
                cert,
                key,
                client_ca: ctx.ca_file.clone(),
            },
        ));
    }
    let manager = tokio::spawn(pods::manager(ctx.clone()));
    tracing::info!("node {} ready", ctx.node);

    stop.wait().await;
    ctx.shutting_down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // the manager stops every pod and returns
    let _ = tokio::time::timeout(std::time::Duration::from_secs(90), manager).await;
    services::shutdown().await;
    net::cleanup_leftovers(&ctx.data_dir).await;
    tracing::info!("stopped");
    Ok(())
}
