//! Metrics of every ClickHouse server and Keeper member (docs/monitoring.md, "The exporter: servers
//! and Keeper"): `clickhouse-operator exporter` discovers the clusters from the API at each scrape,
//! asks every server pod (`system.metrics`, `system.events`, `system.asynchronous_metrics`,
//! `system.replicas`, `system.parts`, `system.disks`) and every Keeper member (`mntr`),
//! concurrently with a limit and a timeout per host, and answers in the Prometheus text format with
//! the labels `namespace`, `clickhouse_cluster`, `shard`, `replica`, `pod`, the servers' figures
//! under the names of ClickHouse's own endpoint (`ClickHouseMetrics_*`, … : [`Naming`]). A host
//! that does not answer gets `clickhouse_up 0` (or `keeper_up 0`) and the others report as usual.
//! It reads only, needs no leader, and restarts no pod (nothing is added to the server pods).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::{ClickHouseCluster, MEMBERS_VERSION, Members};
use crate::clickhouse::{ClientConfig, Credentials, QueryOptions};
use crate::model::{labels, names};
use crate::runtime::metrics::ClusterLabel;
use crate::runtime::settings::WatchNamespaces;
use kube::api::{ApiResource, DynamicObject};

/// Hosts asked at once.
pub const CONCURRENCY: usize = 16;
/// How long one host may take to answer all its queries.
pub const HOST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole scrape may take: a host not done by then is reported down, so that the
/// answer comes within a scraper's usual 20 s timeout even when many hosts hang.
pub const SCRAPE_DEADLINE: Duration = Duration::from_secs(15);
/// How long a scrape's answer is served again by default (`EXPORTER_CACHE_SECONDS`): requests
/// within it cost nothing, and requests during a scrape wait for it instead of starting
/// another (decision 36).
pub const CACHE_FOR: Duration = Duration::from_secs(10);

/// The most bytes of one answer of a server read (review M-1, decision 69): a server is code a
/// cluster's editor chooses; a larger answer reports the host down.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;
/// The bytes all servers' answers may take at once in the exporter's process (see
/// [`crate::clickhouse::client::ANSWER_BUDGET_BYTES`]).
pub const ANSWER_BUDGET_BYTES: usize = 32 << 20;
/// The most series one server may give: beyond, the host is reported down.
pub const MAX_SERIES_PER_HOST: usize = 20_000;
/// The most series of one scrape: hosts whose series would pass it are reported down.
pub const MAX_SERIES_PER_SCRAPE: usize = 250_000;

/// The labels of one host.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Host {
    pub namespace: String,
    pub cluster: String,
    pub shard: String,
    pub replica: String,
    pub pod: String,
}

impl Host {
    /// The labels of its series, the cluster under `cluster_label`, then `extra`.
    fn labels(&self, cluster_label: ClusterLabel, extra: &[(&str, &str)]) -> String {
        let mut parts = vec![
            ("namespace", self.namespace.as_str()),
            (cluster_label.name(), self.cluster.as_str()),
        ];
        if !self.shard.is_empty() {
            parts.push(("shard", self.shard.as_str()));
        }
        if !self.replica.is_empty() {
            parts.push(("replica", self.replica.as_str()));
        }
        parts.push(("pod", self.pod.as_str()));
        parts.extend_from_slice(extra);
        let inner: Vec<String> = parts
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        format!("{{{}}}", inner.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A metric name from a ClickHouse or Keeper name: `[a-zA-Z0-9_]`, not starting with a digit.
pub fn metric_name(prefix: &str, name: &str) -> String {
    let mut out = String::from(prefix);
    for c in name.chars() {
        out.push(if c.is_ascii_alphanumeric() { c } else { '_' });
    }
    out
}

/// Samples of one scrape, grouped by metric name (one `# TYPE` line each).
#[derive(Default)]
pub struct Samples {
    by_name: BTreeMap<String, (&'static str, Vec<String>)>,
    count: usize,
}

impl Samples {
    pub fn add(&mut self, name: String, kind: &'static str, labels: String, value: f64) {
        if !value.is_finite() {
            return;
        }
        self.count += 1;
        self.by_name
            .entry(name)
            .or_insert((kind, Vec::new()))
            .1
            .push(format!("{labels} {value}"));
    }

    /// How many samples were added.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, (kind, lines)) in &self.by_name {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for l in lines {
                let _ = writeln!(out, "{name}{l}");
            }
        }
        out
    }
}

/// The statements the exporter sends each server ([`crate::clickhouse::metrics`]).
pub use crate::clickhouse::metrics as queries;

/// One server's answers, as samples.
async fn scrape_server(
    client: &crate::clickhouse::Client,
    host: &Host,
    naming: Naming,
    out: &mut Samples,
) -> Result<(), String> {
    let q = |sql: &'static str| async move {
        client
            .query(sql, &QueryOptions::new())
            .await
            .map_err(|e| e.to_string())
    };
    let label = naming.cluster_label;
    let l = host.labels(label, &[]);
    let too_many = |out: &Samples| {
        if out.len() > MAX_SERIES_PER_HOST {
            Err(format!(
                "more than {MAX_SERIES_PER_HOST} series, the most the exporter takes from one server"
            ))
        } else {
            Ok(())
        }
    };
    for (source, sql, key) in [
        (Figures::Metrics, queries::METRICS, "metric"),
        (Figures::Events, queries::EVENTS, "event"),
        (
            Figures::AsynchronousMetrics,
            queries::ASYNCHRONOUS_METRICS,
            "metric",
        ),
    ] {
        for r in q(sql).await?.iter() {
            let name = naming.figure(source, r.str(key)?);
            out.add(name, source.kind(), l.clone(), r.f64("v")?);
        }
        too_many(out)?;
    }
    for r in q(queries::REPLICAS).await?.iter() {
        too_many(out)?;
        let t = host.labels(
            label,
            &[("database", r.str("database")?), ("table", r.str("table")?)],
        );
        out.add(
            series::REPLICA_IS_READONLY.into(),
            "gauge",
            t.clone(),
            r.f64("ro")?,
        );
        out.add(
            series::REPLICA_IS_SESSION_EXPIRED.into(),
            "gauge",
            t.clone(),
            r.f64("expired")?,
        );
        out.add(
            series::REPLICA_QUEUE_SIZE.into(),
            "gauge",
            t.clone(),
            r.f64("queue")?,
        );
        out.add(
            series::REPLICA_ABSOLUTE_DELAY_SECONDS.into(),
            "gauge",
            t,
            r.f64("delay")?,
        );
    }
    for r in q(queries::PARTS).await?.iter() {
        too_many(out)?;
        let t = host.labels(
            label,
            &[("database", r.str("database")?), ("table", r.str("table")?)],
        );
        out.add(
            series::TABLE_ACTIVE_PARTS.into(),
            "gauge",
            t.clone(),
            r.f64("parts")?,
        );
        out.add(
            series::TABLE_MAX_PARTS_PER_PARTITION.into(),
            "gauge",
            t,
            r.f64("most")?,
        );
    }
    // `system.disks` exists from 19.15 on; older servers (18.16) have no disk figures
    let disks = client.query(queries::DISKS, &QueryOptions::new()).await;
    match disks {
        Ok(rows) => {
            for r in rows.iter() {
                let d = host.labels(label, &[("disk", r.str("name")?)]);
                out.add(
                    series::DISK_FREE_BYTES.into(),
                    "gauge",
                    d.clone(),
                    r.f64("free")?,
                );
                out.add(series::DISK_TOTAL_BYTES.into(), "gauge", d, r.f64("total")?);
                too_many(out)?;
            }
        }
        Err(e) if e.code() == Some(crate::clickhouse::ErrorCode::UNKNOWN_TABLE) => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(())
}

/// Keeper's `mntr` answer as `(key, value)` pairs with a numeric value.
pub fn parse_mntr(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('\t')?;
            let v: f64 = match v.trim() {
                "leader" => 1.0,
                "follower" | "observer" | "standalone" => 0.0,
                other => other.parse().ok()?,
            };
            Some((k.trim().to_string(), v))
        })
        .collect()
}

async fn mntr(ip: &str, timeout: Duration) -> Result<String, String> {
    let ip: std::net::IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
    let addr = std::net::SocketAddr::new(ip, names::KEEPER_CLIENT_PORT as u16);
    crate::clickhouse::keeper::four_letter_word(addr, "mntr", timeout)
        .await
        .map_err(|e| e.to_string())
}

/// A target of one scrape.
#[derive(Clone)]
pub enum Target {
    Server {
        host: Host,
        config: Option<ClientConfig>,
    },
    Keeper {
        host: Host,
        ip: Option<String>,
    },
    /// How the cluster's `status.members` was read.
    Status {
        namespace: String,
        cluster: String,
        read: MembersRead,
    },
}

/// The Secret the operator publishes each cluster's exporter credentials in
/// (`EXPORTER_CREDENTIALS_SECRET`, see [`crate::controller::exporter_credentials`]).
#[derive(Clone, Debug)]
pub struct CredentialsSecret {
    pub namespace: String,
    pub name: String,
}

/// The server and Keeper pods of the clusters in `namespaces`, with what is needed to ask them:
/// the credentials from `credentials` (one read), or without it from each cluster's own Secrets.
pub async fn targets(
    client: &Client,
    namespaces: &WatchNamespaces,
    credentials: Option<&CredentialsSecret>,
) -> Result<Vec<Target>, kube::Error> {
    let published = match credentials {
        Some(c) => Some(
            Api::<Secret>::namespaced(client.clone(), &c.namespace)
                .get_opt(&c.name)
                .await?
                .and_then(|s| s.data)
                .unwrap_or_default(),
        ),
        None => None,
    };
    // every cluster as plain JSON, each read apart: what one holds cannot hide the others
    let resource = ApiResource::erase::<ClickHouseCluster>(&());
    let listed: Vec<DynamicObject> = match namespaces {
        WatchNamespaces::All => {
            Api::all_with(client.clone(), &resource)
                .list(&ListParams::default())
                .await?
                .items
        }
        WatchNamespaces::Only(list) => {
            let mut all = Vec::new();
            for ns in list {
                all.extend(
                    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
                        .list(&ListParams::default())
                        .await?
                        .items,
                );
            }
            all
        }
    };
    let mut out = Vec::new();
    for object in listed {
        let c = match WatchedCluster::read(object) {
            Ok(c) => c,
            Err((ns, name, e)) => {
                tracing::warn!(namespace = %ns, cluster = %name, error = %e, "exporter: cannot read the cluster; its pods are scraped without it");
                WatchedCluster::named(ns, name)
            }
        };
        let ns = c.namespace.clone();
        let name = c.name.clone();
        // its own read-only account, never the operator's (decision 36)
        let (password, ca) = match &published {
            Some(data) => crate::model::secret::read_exporter_credentials(data, &ns, &name),
            None => {
                let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
                let password = secrets
                    .get_opt(&names::operator_secret(&name))
                    .await?
                    .and_then(|s| s.data?.get(names::EXPORTER_PASSWORD_KEY).cloned())
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned());
                let ca = match (c.tls_enabled, &c.ca_secret) {
                    (true, Some(ca)) => secrets
                        .get_opt(ca)
                        .await?
                        .and_then(|s| s.data?.get("ca.crt").cloned())
                        .map(|b| b.0),
                    _ => None,
                };
                (password, ca)
            }
        };
        let pods = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{}={name}", labels::CLUSTER)))
            .await?
            .items;
        // a member the cluster should have but whose pod is gone (deleted, not yet recreated)
        // is down, not absent: it gets `…_up 0` like one that does not answer
        let present: std::collections::BTreeSet<String> =
            pods.iter().map(ResourceExt::name_any).collect();
        let (read, expected) = c.expected_hosts();
        if let MembersRead::Unknown(v) = read {
            tracing::warn!(namespace = %ns, cluster = %name, version = v, known = MEMBERS_VERSION, "exporter: status.members of a version this exporter does not know; only the pods present are scraped");
        }
        out.push(Target::Status {
            namespace: ns.clone(),
            cluster: name.clone(),
            read,
        });
        for (keeper, host) in expected {
            if !present.contains(&host.pod) {
                out.push(if keeper {
                    Target::Keeper { host, ip: None }
                } else {
                    Target::Server { host, config: None }
                });
            }
        }
        for p in pods {
            let l = p.labels();
            let host = Host {
                namespace: ns.clone(),
                cluster: name.clone(),
                shard: l.get(labels::SHARD).cloned().unwrap_or_default(),
                replica: l.get(labels::REPLICA).cloned().unwrap_or_default(),
                pod: p.name_any(),
            };
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            match l.get(labels::COMPONENT).map(String::as_str) {
                Some("keeper") => out.push(Target::Keeper { host, ip }),
                Some("server") => {
                    let config = ip.zip(password.clone()).map(|(ip, password)| {
                        let credentials = Credentials {
                            user: names::EXPORTER_USER.to_string(),
                            password,
                        };
                        host_config(ClientConfig::for_replica_of(
                            &crate::clickhouse::ReplicaAddress {
                                cluster: &name,
                                namespace: &ns,
                                domain: c.domain(),
                                tls: c.tls_enabled,
                                replica: &host.replica,
                            },
                            ip,
                            credentials,
                            ca.clone(),
                        ))
                    });
                    out.push(Target::Server { host, config });
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// How the exporter asks one server, from how it reaches it: within [`HOST_TIMEOUT`], once,
/// reading at most [`MAX_ANSWER_BYTES`] of an answer.
pub fn host_config(mut config: ClientConfig) -> ClientConfig {
    config.timeout = HOST_TIMEOUT;
    config.max_answer_bytes = MAX_ANSWER_BYTES;
    // one attempt per scrape: `clickhouse_up` says how the server answered now; retried, a
    // server killed and restarted at once within the host's timeout was reported up
    config.retry = crate::clickhouse::RetryPolicy {
        attempts: 1,
        ..crate::clickhouse::RetryPolicy::default()
    };
    config
}

/// What the exporter reads of a ClickHouseCluster, and nothing else: its name, the spec fields
/// that say how to reach its servers (`tls.enabled`, `tls.caSecret`, `clusterDomain`), and the
/// public part of its status, `status.members` (S0-12: never `replicaStateMap`). Read from the
/// object as JSON with every other field ignored, so that a status or spec of another operator
/// version, older or newer, cannot keep the exporter from the cluster's pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WatchedCluster {
    pub namespace: String,
    pub name: String,
    pub tls_enabled: bool,
    pub ca_secret: Option<String>,
    pub cluster_domain: Option<String>,
    /// `status.members` as it is, unread until [`WatchedCluster::expected_hosts`].
    pub members: Option<serde_json::Value>,
}

/// How the exporter could use a cluster's `status.members`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembersRead {
    /// Of the version it knows: its members are expected, a missing pod is reported down.
    Used(u32),
    /// No `status.members` (an operator from before it, or no status yet): only the pods
    /// present are scraped.
    Absent,
    /// Of a version it does not know (a newer operator), or not readable as any version: only
    /// the pods present are scraped.
    Unknown(u32),
}

impl MembersRead {
    /// The version read (0 without one).
    pub fn version(self) -> u32 {
        match self {
            MembersRead::Used(v) | MembersRead::Unknown(v) => v,
            MembersRead::Absent => 0,
        }
    }
}

impl WatchedCluster {
    /// Reads `object` (a ClickHouseCluster as the API server lists it); the error names it.
    pub fn read(object: DynamicObject) -> Result<WatchedCluster, (String, String, String)> {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let field = |path: &[&str]| {
            path.iter()
                .try_fold(&object.data, |v, k| v.get(k))
                .filter(|v| !v.is_null())
        };
        let text = |path: &[&str]| -> Result<Option<String>, String> {
            match field(path) {
                None => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(format!("{} is not a string: {other}", path.join("."))),
            }
        };
        let read = || -> Result<WatchedCluster, String> {
            Ok(WatchedCluster {
                namespace: namespace.clone(),
                name: name.clone(),
                tls_enabled: match field(&["spec", "tls", "enabled"]) {
                    None => false,
                    Some(v) => v
                        .as_bool()
                        .ok_or_else(|| format!("spec.tls.enabled is not a boolean: {v}"))?,
                },
                ca_secret: text(&["spec", "tls", "caSecret"])?,
                cluster_domain: text(&["spec", "clusterDomain"])?,
                members: field(&["status", "members"]).cloned(),
            })
        };
        read().map_err(|e| (namespace.clone(), name.clone(), e))
    }

    /// A cluster known by its name only: its pods are scraped, nothing is expected.
    pub fn named(namespace: String, name: String) -> WatchedCluster {
        WatchedCluster {
            namespace,
            name,
            ..WatchedCluster::default()
        }
    }

    /// The cluster's DNS domain.
    pub fn domain(&self) -> &str {
        self.cluster_domain
            .as_deref()
            .unwrap_or(crate::conventions::DEFAULT_CLUSTER_DOMAIN)
    }

    /// The members the cluster should be running now, as (is Keeper, labels), from
    /// `status.members` of the version this exporter knows ([`MEMBERS_VERSION`]): a pod of one
    /// of them that is missing is reported down. With no `status.members`, or one of another
    /// version, none: the pods present are still scraped, and [`MembersRead`] says why.
    pub fn expected_hosts(&self) -> (MembersRead, Vec<(bool, Host)>) {
        let Some(members) = &self.members else {
            return (MembersRead::Absent, Vec::new());
        };
        let version = members
            .get("version")
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0);
        if version != MEMBERS_VERSION {
            return (MembersRead::Unknown(version), Vec::new());
        }
        let Ok(m) = serde_json::from_value::<Members>(members.clone()) else {
            return (MembersRead::Unknown(version), Vec::new());
        };
        let host = |shard: String, replica: String, pod: String| Host {
            namespace: self.namespace.clone(),
            cluster: self.name.clone(),
            shard,
            replica,
            pod,
        };
        let servers = m
            .servers
            .into_iter()
            .map(|s| (false, host(s.shard.to_string(), s.replica, s.pod)));
        let keeper = m
            .keeper
            .into_iter()
            .map(|k| (true, host(String::new(), String::new(), k.pod)));
        (MembersRead::Used(version), servers.chain(keeper).collect())
    }
}

/// One scrape of every host of the clusters in `namespaces`.
pub async fn scrape(
    client: &Client,
    namespaces: &WatchNamespaces,
    credentials: Option<&CredentialsSecret>,
    naming: Naming,
) -> String {
    match targets(client, namespaces, credentials).await {
        Ok(t) => scrape_targets(t, naming).await,
        Err(e) => {
            tracing::warn!(error = %e, "exporter: cannot list the clusters");
            let mut total = Samples::default();
            total.add(series::DISCOVERY_UP.into(), "gauge", String::new(), 0.0);
            total.render()
        }
    }
}

/// One scrape of `targets`, [`CONCURRENCY`] at a time, ending by [`SCRAPE_DEADLINE`], named
/// by `naming`.
pub async fn scrape_targets(targets: Vec<Target>, naming: Naming) -> String {
    scrape_targets_by(
        targets,
        naming,
        tokio::time::Instant::now() + SCRAPE_DEADLINE,
    )
    .await
}

/// [`scrape_targets`] ending by `deadline`: a host still waiting for its turn or its answer
/// then is reported down.
pub async fn scrape_targets_by(
    targets: Vec<Target>,
    naming: Naming,
    deadline: tokio::time::Instant,
) -> String {
    let mut total = Samples::default();
    let started = std::time::Instant::now();
    let label = naming.cluster_label;
    total.add(series::DISCOVERY_UP.into(), "gauge", String::new(), 1.0);
    // the servers' clients of this scrape share their HTTP clients
    let connections = &crate::clickhouse::Connections::default();
    // series kept so far by the hosts of this scrape
    let kept = &std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Samples> = futures::stream::iter(targets)
        .map(|t| async move {
            let mut out = Samples::default();
            match t {
                Target::Server { host, config } => {
                    let until = deadline.min(tokio::time::Instant::now() + HOST_TIMEOUT);
                    let ok = match config.map(|c| connections.client(c)) {
                        Some(Ok(c)) => {
                            tokio::time::timeout_at(
                                until,
                                scrape_server(&c, &host, naming, &mut out),
                            )
                                .await
                                .map_err(|_| "timed out".to_string())
                                .and_then(|r| r)
                                .and_then(|()| keep_series(kept, out.len()))
                        }
                        Some(Err(e)) => Err(e.to_string()),
                        None => Err("no address or no exporter password yet".into()),
                    };
                    if let Err(e) = &ok {
                        tracing::debug!(pod = %host.pod, error = %e, "exporter: server did not answer");
                        if e.contains("the most") || e.contains("read at once") {
                            tracing::warn!(namespace = %host.namespace, cluster = %host.cluster, pod = %host.pod, error = %e, "exporter: server reported down");
                        }
                        out = Samples::default();
                    }
                    out.add(
                        series::UP.into(),
                        "gauge",
                        host.labels(label, &[]),
                        f64::from(u8::from(ok.is_ok())),
                    );
                }
                Target::Keeper { host, ip } => {
                    let until = deadline.min(tokio::time::Instant::now() + HOST_TIMEOUT);
                    let left = until.saturating_duration_since(tokio::time::Instant::now());
                    let answer = match ip {
                        Some(ip) => mntr(&ip, left).await,
                        None => Err("no address".into()),
                    };
                    let l = host.labels(label, &[]);
                    let mut up = answer.as_ref().is_ok_and(|a| !a.trim().is_empty());
                    if let Ok(text) = &answer {
                        for (k, v) in parse_mntr(text) {
                            let name = metric_name(KEEPER_PREFIX, k.trim_start_matches("zk_"));
                            out.add(name, "gauge", l.clone(), v);
                        }
                    }
                    if up && keep_series(kept, out.len()).is_err() {
                        up = false;
                        out = Samples::default();
                    }
                    out.add(series::KEEPER_UP.into(), "gauge", l, f64::from(u8::from(up)));
                }
                Target::Status {
                    namespace,
                    cluster,
                    read,
                } => {
                    let l = format!(
                        "{{namespace=\"{}\",{}=\"{}\"}}",
                        escape(&namespace),
                        label.name(),
                        escape(&cluster)
                    );
                    out.add(
                        series::STATUS_MEMBERS_VERSION.into(),
                        "gauge",
                        l.clone(),
                        f64::from(read.version()),
                    );
                    let used = matches!(read, MembersRead::Used(_));
                    out.add(
                        series::STATUS_MEMBERS_USED.into(),
                        "gauge",
                        l,
                        f64::from(u8::from(used)),
                    );
                }
            }
            out
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for r in results {
        for (name, (kind, lines)) in r.by_name {
            total
                .by_name
                .entry(name)
                .or_insert((kind, Vec::new()))
                .1
                .extend(lines);
        }
    }
    total.add(
        series::SCRAPE_DURATION_SECONDS.into(),
        "gauge",
        String::new(),
        started.elapsed().as_secs_f64(),
    );
    total.render()
}

/// Takes `n` series of the scrape's [`MAX_SERIES_PER_SCRAPE`], or says why not.
fn keep_series(kept: &std::sync::atomic::AtomicUsize, n: usize) -> Result<(), String> {
    use std::sync::atomic::Ordering;
    let mut now = kept.load(Ordering::Relaxed);
    loop {
        if now + n > MAX_SERIES_PER_SCRAPE {
            return Err(format!(
                "the scrape has {MAX_SERIES_PER_SCRAPE} series already, the most the exporter answers"
            ));
        }
        match kept.compare_exchange(now, now + n, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(seen) => now = seen,
        }
    }
}

/// The last scrape's answer and when it was made; the lock is held while a scrape runs, so
/// that concurrent requests share it.
pub struct Cache {
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, String)>>,
    keep: Duration,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::keeping(CACHE_FOR)
    }
}

impl Cache {
    /// A cache whose answers are served again for `keep`.
    pub fn keeping(keep: Duration) -> Cache {
        Cache {
            last: Default::default(),
            keep,
        }
    }

    /// The answer of a scrape made at most `keep` ago, or of a new one (`scrape`), which
    /// requests arriving meanwhile wait for and share.
    pub async fn get<F, Fut>(&self, scrape: F) -> String
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = String>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, text)) = last.as_ref()
            && at.elapsed() < self.keep
        {
            return text.clone();
        }
        let text = scrape().await;
        *last = Some((tokio::time::Instant::now(), text.clone()));
        text
    }
}

/// Whether a request may read `/metrics`: always without a token; with one, only with
/// `Authorization: Bearer <token>` (compared in constant time).
pub fn authorized(token: Option<&str>, header: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return false;
    };
    let (a, b) = (token.as_bytes(), given.trim().as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The names of the series the exporter makes itself (whatever [`Naming`] says); the servers'
/// figures ([`Figures`]) and Keeper's (`keeper_<name>`) are named from what they answer.
pub mod series {
    pub const UP: &str = "clickhouse_up";
    pub const REPLICA_IS_READONLY: &str = "clickhouse_replica_is_readonly";
    pub const REPLICA_IS_SESSION_EXPIRED: &str = "clickhouse_replica_is_session_expired";
    pub const REPLICA_QUEUE_SIZE: &str = "clickhouse_replica_queue_size";
    pub const REPLICA_ABSOLUTE_DELAY_SECONDS: &str = "clickhouse_replica_absolute_delay_seconds";
    pub const TABLE_ACTIVE_PARTS: &str = "clickhouse_table_active_parts";
    pub const TABLE_MAX_PARTS_PER_PARTITION: &str = "clickhouse_table_max_parts_per_partition";
    pub const DISK_FREE_BYTES: &str = "clickhouse_disk_free_bytes";
    pub const DISK_TOTAL_BYTES: &str = "clickhouse_disk_total_bytes";
    pub const KEEPER_UP: &str = "keeper_up";
    pub const DISCOVERY_UP: &str = "clickhouse_exporter_discovery_up";
    pub const SCRAPE_DURATION_SECONDS: &str = "clickhouse_exporter_scrape_duration_seconds";
    /// The version of each cluster's `status.members` (0 without one).
    pub const STATUS_MEMBERS_VERSION: &str = "clickhouse_exporter_status_members_version";
    /// 1 when the exporter used each cluster's `status.members`, 0 when it could not.
    pub const STATUS_MEMBERS_USED: &str = "clickhouse_exporter_status_members_used";
    /// Every one of them.
    pub const ALL: [&str; 14] = [
        UP,
        REPLICA_IS_READONLY,
        REPLICA_IS_SESSION_EXPIRED,
        REPLICA_QUEUE_SIZE,
        REPLICA_ABSOLUTE_DELAY_SECONDS,
        TABLE_ACTIVE_PARTS,
        TABLE_MAX_PARTS_PER_PARTITION,
        DISK_FREE_BYTES,
        DISK_TOTAL_BYTES,
        KEEPER_UP,
        DISCOVERY_UP,
        SCRAPE_DURATION_SECONDS,
        STATUS_MEMBERS_VERSION,
        STATUS_MEMBERS_USED,
    ];
}

/// The prefix of Keeper's `mntr` figures (`keeper_avg_latency`, …).
pub const KEEPER_PREFIX: &str = "keeper_";

/// The labels a host's series carry, besides the one naming its cluster
/// ([`Naming::cluster_label`]): `namespace`, `shard`, `replica`, `pod`, and `database` and
/// `table` (replication and parts) or `disk` (disks).
pub const LABELS: [&str; 7] = [
    "namespace",
    "shard",
    "replica",
    "pod",
    "database",
    "table",
    "disk",
];

/// The system tables of a server whose rows become series, one each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figures {
    /// `system.metrics`: gauges.
    Metrics,
    /// `system.events`: counters.
    Events,
    /// `system.asynchronous_metrics`: gauges.
    AsynchronousMetrics,
}

impl Figures {
    pub const ALL: [Figures; 3] = [
        Figures::Metrics,
        Figures::Events,
        Figures::AsynchronousMetrics,
    ];

    /// The series' type.
    pub fn kind(self) -> &'static str {
        match self {
            Figures::Events => "counter",
            Figures::Metrics | Figures::AsynchronousMetrics => "gauge",
        }
    }
}

/// What the exporter serves the servers' figures as (`EXPORTER_METRIC_NAMES`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricNames {
    /// `clickhouse`, the default: the names of ClickHouse's own Prometheus endpoint,
    /// `ClickHouseMetrics_<name>`, `ClickHouseProfileEvents_<name>` (counters without
    /// `_total`), `ClickHouseAsyncMetrics_<name>`.
    #[default]
    ClickHouse,
    /// `operator`, the names of earlier versions: `clickhouse_metric_<name>`,
    /// `clickhouse_event_<name>_total`, `clickhouse_asynchronous_metric_<name>`.
    Operator,
}

impl MetricNames {
    /// The prefix and suffix of the series of `figures`.
    pub fn affixes(self, figures: Figures) -> (&'static str, &'static str) {
        match (self, figures) {
            (MetricNames::ClickHouse, Figures::Metrics) => ("ClickHouseMetrics_", ""),
            (MetricNames::ClickHouse, Figures::Events) => ("ClickHouseProfileEvents_", ""),
            (MetricNames::ClickHouse, Figures::AsynchronousMetrics) => {
                ("ClickHouseAsyncMetrics_", "")
            }
            (MetricNames::Operator, Figures::Metrics) => ("clickhouse_metric_", ""),
            (MetricNames::Operator, Figures::Events) => ("clickhouse_event_", "_total"),
            (MetricNames::Operator, Figures::AsynchronousMetrics) => {
                ("clickhouse_asynchronous_metric_", "")
            }
        }
    }
}

/// How the exporter names what it serves. By default the servers' figures carry the names of
/// ClickHouse's own Prometheus endpoint (`ClickHouseMetrics_*`, `ClickHouseProfileEvents_*`,
/// `ClickHouseAsyncMetrics_*`), so that the same dashboards and alerts read the exporter and
/// the servers' own endpoint (and those written for the official operator), and every series
/// names its cluster `clickhouse_cluster`, which a Prometheus that labels its own Kubernetes
/// clusters `cluster` leaves alone. `EXPORTER_METRIC_NAMES=operator` and
/// `EXPORTER_CLUSTER_LABEL=cluster` keep the names of earlier versions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    pub names: MetricNames,
    pub cluster_label: ClusterLabel,
}

impl Naming {
    /// From `EXPORTER_METRIC_NAMES` (`clickhouse`, the default, or `operator`) and
    /// `EXPORTER_CLUSTER_LABEL` (`clickhouse_cluster`, the default, or `cluster`).
    pub fn parse(names: Option<&str>, label: Option<&str>) -> Result<Naming, String> {
        let names = match names.map(str::trim) {
            None | Some("") | Some("clickhouse") => MetricNames::ClickHouse,
            Some("operator") => MetricNames::Operator,
            Some(other) => {
                return Err(format!(
                    "EXPORTER_METRIC_NAMES: {other:?} is neither clickhouse nor operator"
                ));
            }
        };
        Ok(Naming {
            names,
            cluster_label: ClusterLabel::parse(label, "EXPORTER_CLUSTER_LABEL")?,
        })
    }

    /// The series of the row `name` of `figures`. ClickHouse's own names are made as its
    /// endpoint makes them: every character but a letter, digit, `_` or `:` made `_`, and
    /// (metrics and events) anything before the name's first letter dropped.
    pub fn figure(&self, figures: Figures, name: &str) -> String {
        let (prefix, suffix) = self.names.affixes(figures);
        match self.names {
            MetricNames::Operator => metric_name(prefix, name) + suffix,
            MetricNames::ClickHouse => {
                let mut out = String::from(prefix);
                let name = match figures {
                    Figures::AsynchronousMetrics => name,
                    Figures::Metrics | Figures::Events => {
                        name.trim_start_matches(|c: char| !c.is_ascii_alphabetic())
                    }
                };
                for c in name.chars() {
                    out.push(if c.is_ascii_alphanumeric() || c == ':' {
                        c
                    } else {
                        '_'
                    });
                }
                out + suffix
            }
        }
    }

    /// Whether a series named `name` may be in a scrape named this way: one of [`series`], a
    /// figure of a server ([`Naming::figure`]) or of a Keeper member (`keeper_<name>`). What
    /// the figures are is up to the servers: only their prefix (and suffix) is known here.
    pub fn may_serve(&self, name: &str) -> bool {
        series::ALL.contains(&name)
            || name
                .strip_prefix(KEEPER_PREFIX)
                .is_some_and(|n| !n.is_empty())
            || Figures::ALL.iter().any(|&f| {
                let (prefix, suffix) = self.names.affixes(f);
                name.strip_prefix(prefix)
                    .and_then(|n| n.strip_suffix(suffix))
                    .is_some_and(|n| !n.is_empty())
            })
    }
}

/// Serves `/metrics` and `/healthz` on `addr`, named by `naming`: a scrape's answer is shared
/// by the requests of `cache_for`; with `token` (`EXPORTER_TOKEN`), `/metrics` needs it as a
/// bearer token.
pub async fn serve(
    client: Client,
    namespaces: WatchNamespaces,
    credentials: Option<CredentialsSecret>,
    addr: std::net::SocketAddr,
    token: Option<String>,
    cache_for: Duration,
    naming: Naming,
) -> std::io::Result<()> {
    use axum::http::{HeaderMap, StatusCode, header::AUTHORIZATION};
    use axum::response::IntoResponse;
    use axum::routing::get;
    crate::clickhouse::client::set_answer_budget(ANSWER_BUDGET_BYTES);
    struct State {
        client: Client,
        namespaces: WatchNamespaces,
        credentials: Option<CredentialsSecret>,
        cache: Cache,
        token: Option<String>,
    }
    let state = Arc::new(State {
        client,
        namespaces,
        credentials,
        cache: Cache::keeping(cache_for),
        token,
    });
    let metrics = move |axum::extract::State(s): axum::extract::State<Arc<State>>,
                        headers: HeaderMap| async move {
        let header = headers.get(AUTHORIZATION).and_then(|h| h.to_str().ok());
        if !authorized(s.token.as_deref(), header) {
            return (
                StatusCode::UNAUTHORIZED,
                "a bearer token is needed\n".to_string(),
            )
                .into_response();
        }
        s.cache
            .get(|| scrape(&s.client, &s.namespaces, s.credentials.as_ref(), naming))
            .await
            .into_response()
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            namespace: "t1".into(),
            cluster: "c1".into(),
            shard: "0".into(),
            replica: "c1-0-0".into(),
            pod: "c1-0-0-0".into(),
        }
    }

    /// By default (nothing set, or set empty) the servers' figures take the names of
    /// ClickHouse's own Prometheus endpoint, made as it makes them, and every series names its
    /// cluster `clickhouse_cluster`.
    #[test]
    fn by_default_figures_take_clickhouses_own_names_and_the_clickhouse_cluster_label() {
        for (names, label) in [(None, None), (Some(""), Some(" "))] {
            let naming = Naming::parse(names, label).unwrap();
            assert_eq!(naming, Naming::default());
            assert_eq!(
                naming,
                Naming {
                    names: MetricNames::ClickHouse,
                    cluster_label: ClusterLabel::ClickHouseCluster,
                }
            );
        }
        let n = Naming::default();
        assert_eq!(
            n.figure(Figures::Metrics, "Query"),
            "ClickHouseMetrics_Query"
        );
        assert_eq!(
            n.figure(Figures::Events, "SelectQuery"),
            "ClickHouseProfileEvents_SelectQuery"
        );
        assert_eq!(
            n.figure(Figures::AsynchronousMetrics, "jemalloc.allocated"),
            "ClickHouseAsyncMetrics_jemalloc_allocated"
        );
        // as ClickHouse's endpoint: `:` kept, a metric's leading non-letters dropped
        assert_eq!(
            n.figure(Figures::Metrics, "9a:b-c"),
            "ClickHouseMetrics_a:b_c"
        );
        assert_eq!(Figures::Events.kind(), "counter");
        assert_eq!(
            host().labels(n.cluster_label, &[("table", "t")]),
            r#"{namespace="t1",clickhouse_cluster="c1",shard="0",replica="c1-0-0",pod="c1-0-0-0",table="t"}"#
        );
    }

    /// The names of earlier versions stay available: `EXPORTER_METRIC_NAMES=operator` and
    /// `EXPORTER_CLUSTER_LABEL=cluster`, each on its own; other values are refused.
    #[test]
    fn the_names_of_earlier_versions_stay_available_by_their_switches() {
        let old = Naming::parse(Some("operator"), Some("cluster")).unwrap();
        assert_eq!(
            old.figure(Figures::Metrics, "Query"),
            "clickhouse_metric_Query"
        );
        assert_eq!(
            old.figure(Figures::Events, "SelectQuery"),
            "clickhouse_event_SelectQuery_total"
        );
        assert_eq!(
            old.figure(Figures::AsynchronousMetrics, "jemalloc.allocated"),
            "clickhouse_asynchronous_metric_jemalloc_allocated"
        );
        assert_eq!(
            host().labels(old.cluster_label, &[]),
            r#"{namespace="t1",cluster="c1",shard="0",replica="c1-0-0",pod="c1-0-0-0"}"#
        );
        let names_only = Naming::parse(Some("operator"), None).unwrap();
        assert_eq!(names_only.cluster_label, ClusterLabel::ClickHouseCluster);
        let label_only = Naming::parse(None, Some("cluster")).unwrap();
        assert_eq!(label_only.names, MetricNames::ClickHouse);
        assert_eq!(
            Naming::parse(Some("clickhouse"), Some("clickhouse_cluster")).unwrap(),
            Naming::default()
        );
        assert!(
            Naming::parse(Some("prom"), None)
                .unwrap_err()
                .contains("EXPORTER_METRIC_NAMES")
        );
        assert!(
            Naming::parse(None, Some("k8s_cluster"))
                .unwrap_err()
                .contains("EXPORTER_CLUSTER_LABEL")
        );
    }

    /// What a scrape named one way may hold: the exporter's own series, Keeper's figures and
    /// the servers' figures under that naming's prefixes, never the other naming's.
    #[test]
    fn each_naming_serves_its_own_figures_and_not_the_others() {
        let new = Naming::default();
        let old = Naming::parse(Some("operator"), Some("cluster")).unwrap();
        for n in [new, old] {
            for name in series::ALL {
                assert!(n.may_serve(name), "{name}");
            }
            assert!(n.may_serve("keeper_avg_latency"));
            assert!(!n.may_serve("keeper_"));
            assert!(!n.may_serve("clickhouse_replica_lag"));
        }
        for name in [
            "ClickHouseMetrics_Query",
            "ClickHouseProfileEvents_Query",
            "ClickHouseAsyncMetrics_Uptime",
        ] {
            assert!(new.may_serve(name) && !old.may_serve(name), "{name}");
        }
        for name in [
            "clickhouse_metric_Query",
            "clickhouse_event_Query_total",
            "clickhouse_asynchronous_metric_Uptime",
        ] {
            assert!(old.may_serve(name) && !new.may_serve(name), "{name}");
        }
        assert!(
            !old.may_serve("clickhouse_event_Query"),
            "counters end _total"
        );
    }

    /// Decision 36: requests within [`CACHE_FOR`] share one scrape, also those that arrive
    /// while it runs; a later request scrapes again.
    #[tokio::test(start_paused = true)]
    async fn scrapes_are_shared_and_cached_for_their_interval() {
        let cache = std::sync::Arc::new(Cache::default());
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let scrape = |cache: std::sync::Arc<Cache>,
                      runs: std::sync::Arc<std::sync::atomic::AtomicUsize>| async move {
            cache
                .get(|| async {
                    let n = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    format!("scrape {n}")
                })
                .await
        };
        let (a, b) = tokio::join!(
            scrape(cache.clone(), runs.clone()),
            scrape(cache.clone(), runs.clone())
        );
        assert_eq!(
            (a.as_str(), b.as_str()),
            ("scrape 0", "scrape 0"),
            "one scrape for both"
        );
        tokio::time::advance(CACHE_FOR - Duration::from_secs(1)).await;
        assert_eq!(scrape(cache.clone(), runs.clone()).await, "scrape 0");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(scrape(cache.clone(), runs.clone()).await, "scrape 1");
    }

    /// Decision 36: with a token, `/metrics` needs it as a bearer token.
    #[test]
    fn a_token_guards_the_metrics() {
        assert!(authorized(None, None));
        assert!(authorized(Some("s3cret"), Some("Bearer s3cret")));
        assert!(!authorized(Some("s3cret"), None));
        assert!(!authorized(Some("s3cret"), Some("Bearer s3cre")));
        assert!(!authorized(Some("s3cret"), Some("Basic s3cret")));
    }

    /// Decision 36: a scrape ends by its deadline whatever its hosts do: one that does not
    /// answer, and those still waiting for their turn, are reported down.
    #[tokio::test]
    async fn a_scrape_ends_by_its_deadline_with_the_hosts_left_down() {
        // a port that accepts and never answers
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((c, _)) = silent.accept().await {
                held.push(c);
            }
        });
        let targets: Vec<Target> = (0..40)
            .map(|i| Target::Server {
                host: Host {
                    namespace: "t1".into(),
                    cluster: "c1".into(),
                    pod: format!("c1-0-{i}-0"),
                    ..Host::default()
                },
                config: Some(ClientConfig::new(
                    crate::clickhouse::Endpoint {
                        host: addr.ip().to_string(),
                        port: addr.port(),
                    },
                    crate::clickhouse::Credentials {
                        user: "u".into(),
                        password: "p".into(),
                    },
                )),
            })
            .collect();
        let started = std::time::Instant::now();
        let text = scrape_targets_by(
            targets,
            Naming::default(),
            tokio::time::Instant::now() + Duration::from_secs(2),
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        let up: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("clickhouse_up{"))
            .collect();
        assert_eq!(up.len(), 40, "every host is reported");
        assert!(up.iter().all(|l| l.ends_with(" 0")), "{up:?}");
        assert!(
            up.iter()
                .all(|l| l.starts_with(r#"clickhouse_up{namespace="t1",clickhouse_cluster="c1","#)),
            "{up:?}"
        );
    }

    /// A ClickHouseCluster as the API server lists it, with `status`.
    fn listed(status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
            "metadata": {"name": "c1", "namespace": "t1"},
            "spec": {"shards": 1, "replicas": 2, "tls": {"enabled": true, "caSecret": "ca"}},
            "status": status,
        }))
        .unwrap()
    }

    fn pods(hosts: &[(bool, Host)]) -> Vec<(bool, String, String)> {
        hosts
            .iter()
            .map(|(k, h)| (*k, h.shard.clone(), h.pod.clone()))
            .collect()
    }

    /// S0-12, decision 74: the exporter expects the members of `status.members` (a member
    /// whose pod is gone is reported down, not left out) and reads nothing else of the status:
    /// a `replicaStateMap` that says otherwise, or of a shape no operator wrote (another state,
    /// entries that are not objects), changes nothing. A status of the previous shape (no
    /// `members`, as every operator before it wrote) and one of an unknown newer version (2,
    /// with fields this exporter does not know) are read without error, expect nothing, and say
    /// so ([`MembersRead`]); so do members of version 1 that cannot be read as it.
    #[test]
    fn the_exporter_expects_the_public_members_of_the_status_and_reads_nothing_else() {
        let members = serde_json::json!({"version": 1,
            "servers": [{"shard": 0, "replica": "c1-0-0", "pod": "c1-0-0-0"},
                        {"shard": 1, "replica": "c1-1-1", "pod": "c1-1-1-0"}],
            "keeper": [{"pod": "c1-keeper-0"}]});
        let c = WatchedCluster::read(listed(serde_json::json!({
            "state": "some-state-of-a-newer-operator",
            "replicaStateMap": {"c1-0-0": "no longer an object", "c1-0-7": {"state": "Ready"}},
            "members": members,
        })))
        .unwrap();
        assert!(c.tls_enabled);
        assert_eq!(c.ca_secret.as_deref(), Some("ca"));
        assert_eq!(c.domain(), crate::conventions::DEFAULT_CLUSTER_DOMAIN);
        let (read, hosts) = c.expected_hosts();
        assert_eq!(read, MembersRead::Used(1));
        assert_eq!(
            pods(&hosts),
            vec![
                (false, "0".into(), "c1-0-0-0".into()),
                (false, "1".into(), "c1-1-1-0".into()),
                (true, String::new(), "c1-keeper-0".into()),
            ]
        );
        assert_eq!(hosts[0].1.replica, "c1-0-0");
        assert_eq!(hosts[0].1.namespace, "t1");
        assert_eq!(hosts[0].1.cluster, "c1");
        // the previous shape: a map and no members
        let previous = WatchedCluster::read(listed(serde_json::json!({
            "state": "ready",
            "replicaStateMap": {"c1-0-0": {"shard": 0, "state": "Ready", "index": 0}},
        })))
        .unwrap();
        assert_eq!(previous.expected_hosts(), (MembersRead::Absent, Vec::new()));
        let no_status = WatchedCluster::read(listed(serde_json::Value::Null)).unwrap();
        assert_eq!(
            no_status.expected_hosts(),
            (MembersRead::Absent, Vec::new())
        );
        // a newer version, and version 1 that is not of its shape
        for (status, version) in [
            (
                serde_json::json!({"members": {"version": 2,
                    "servers": [{"shard": 0, "replica": "c1-0-0", "pod": "c1-0-0-0", "zone": "a"}],
                    "hosts": {"c1-0-0-0": {"role": "server"}}}}),
                2,
            ),
            (
                serde_json::json!({"members": {"version": 1, "servers": {"c1-0-0": 0}}}),
                1,
            ),
            (serde_json::json!({"members": {"servers": []}}), 0),
        ] {
            let c = WatchedCluster::read(listed(status.clone())).unwrap();
            assert_eq!(
                c.expected_hosts(),
                (MembersRead::Unknown(version), Vec::new()),
                "{status}"
            );
        }
        // a spec field of a shape it does not know: named, and the cluster is still scraped
        let mut odd = listed(serde_json::json!({"members": members}));
        odd.data["spec"]["tls"]["enabled"] = serde_json::json!("yes");
        let (ns, name, e) = WatchedCluster::read(odd).unwrap_err();
        assert_eq!((ns.as_str(), name.as_str()), ("t1", "c1"));
        assert!(e.contains("spec.tls.enabled"), "{e}");
    }

    /// The operator's `status.members` (plan::status::members) is what the exporter reads:
    /// replicas being removed or stopped, and every member of a stopping cluster, are not
    /// expected (docs/monitoring.md, "The exporter: servers and Keeper").
    #[test]
    fn members_the_cluster_should_run_are_expected_even_without_a_pod() {
        use crate::api::{ClickHouseClusterStatus, ClusterState, ReplicaState, ReplicaStatus};
        let replica = |shard, state| ReplicaStatus {
            shard: crate::api::ShardIndex(shard),
            state,
            is_backup_pod: false,
            index: 0,
            scale_in_step: None,
            released: false,
        };
        let mut status = ClickHouseClusterStatus {
            state: ClusterState::Ready,
            keeper: crate::api::ComponentStatus::new(3, 3, 3),
            ..ClickHouseClusterStatus::default()
        };
        for (name, shard, state) in [
            ("c1-0-0", 0, ReplicaState::Ready),
            ("c1-1-1", 1, ReplicaState::Pending),
            ("c1-0-2", 0, ReplicaState::Condemned),
            ("c1-1-3", 1, ReplicaState::Stopped),
        ] {
            status
                .replica_state_map
                .insert(name.into(), replica(shard, state));
        }
        let expected = |status: &ClickHouseClusterStatus| {
            let mut s = status.clone();
            s.members = Some(crate::plan::status::members("c1", &s));
            let c = WatchedCluster::read(listed(serde_json::to_value(&s).unwrap())).unwrap();
            let (read, hosts) = c.expected_hosts();
            assert_eq!(read, MembersRead::Used(MEMBERS_VERSION));
            pods(&hosts)
        };
        assert_eq!(
            expected(&status),
            vec![
                (false, "0".into(), "c1-0-0-0".into()),
                (false, "1".into(), "c1-1-1-0".into()),
                (true, String::new(), "c1-keeper-0".into()),
                (true, String::new(), "c1-keeper-1".into()),
                (true, String::new(), "c1-keeper-2".into()),
            ]
        );
        status.state = ClusterState::Stopping;
        assert!(expected(&status).is_empty());
    }

    #[test]
    fn mntr_answers_become_numbers() {
        let text = "zk_version\t3.8.4-abc\nzk_avg_latency\t0.5\nzk_server_state\tleader\nzk_outstanding_requests\t2\n";
        assert_eq!(
            parse_mntr(text),
            vec![
                ("zk_avg_latency".to_string(), 0.5),
                ("zk_server_state".to_string(), 1.0),
                ("zk_outstanding_requests".to_string(), 2.0),
            ]
        );
    }

    #[test]
    fn samples_render_one_type_line_per_metric_with_escaped_labels() {
        let host = host();
        let n = Naming::default();
        let mut s = Samples::default();
        s.add(
            n.figure(Figures::Metrics, "Query"),
            "gauge",
            host.labels(n.cluster_label, &[]),
            2.0,
        );
        s.add(
            series::TABLE_ACTIVE_PARTS.into(),
            "gauge",
            host.labels(n.cluster_label, &[("table", "we\"ird")]),
            3.0,
        );
        s.add(
            series::UP.into(),
            "gauge",
            host.labels(n.cluster_label, &[]),
            f64::NAN,
        );
        let text = s.render();
        assert!(text.contains("# TYPE ClickHouseMetrics_Query gauge\n"));
        assert!(text.contains(
            r#"ClickHouseMetrics_Query{namespace="t1",clickhouse_cluster="c1",shard="0",replica="c1-0-0",pod="c1-0-0-0"} 2"#
        ));
        assert!(text.contains(r#"table="we\"ird""#), "{text}");
        assert!(
            !text.contains("clickhouse_up"),
            "non-finite values are dropped"
        );
        assert_eq!(
            metric_name("keeper_", "avg.latency-ms"),
            "keeper_avg_latency_ms"
        );
    }
}
