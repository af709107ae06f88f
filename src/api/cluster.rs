//! The `ClickHouseCluster` resource: what a user declares and what the operator reports.

use std::collections::BTreeMap;

use super::replica::{ReplicaName, ShardIndex};
use k8s_openapi::api::core::v1::{Affinity, Container, EnvVar, ResourceRequirements, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Image used for ClickHouse servers when the spec names none.
pub const DEFAULT_SERVER_IMAGE: &str = "clickhouse/clickhouse-server:24.8";
/// Image used for ClickHouse Keeper when the spec names none.
pub const DEFAULT_KEEPER_IMAGE: &str = "clickhouse/clickhouse-keeper:24.8";

/// The base of a Keeper member's startup budget (`spec.keeper.pod.startupSeconds` unset): the
/// process starting and waiting for its quorum up to the operator's `startup_timeout` (half of
/// it); [`KeeperSpec::startup_seconds`] adds the time to load its state.
pub const DEFAULT_KEEPER_STARTUP_SECONDS: i32 = 60;

/// Seconds of a Keeper member's default startup budget per GiB of its volume (decision 67):
/// Keeper reads its latest snapshot and its logs before it waits for a quorum and before it
/// opens any port, so a member's start grows with its state, which its volume bounds. 60 s a
/// GiB is about 17 MiB/s, well below what a Keeper reads and applies on a small node.
pub const KEEPER_LOAD_SECONDS_PER_GIB: i32 = 60;

/// The period of the startup probe with the default budget (seconds): a budget of minutes needs
/// no check every 2 s, and the period tells the default budget from one `startupSeconds` sets.
pub const KEEPER_DEFAULT_STARTUP_PERIOD: i32 = 5;

/// Environment variables of the server container that the operator sets or that the server
/// image's entrypoint acts on: it writes `users.d/default-user.xml` for the user variables
/// (into the read-only projection of the operator's users, on images that do not honour
/// `CLICKHOUSE_SKIP_USER_SETUP`, and exits), starts a temporary server for `CLICKHOUSE_DB`, or
/// reads another main file. Refused in `spec.pod.env` and as keys of `spec.pod.envSecret`.
pub const SERVER_RESERVED_ENV: &[&str] = &[
    "CLICKHOUSE_SKIP_USER_SETUP",
    "CLICKHOUSE_USER",
    "CLICKHOUSE_PASSWORD",
    "CLICKHOUSE_PASSWORD_FILE",
    "CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT",
    "CLICKHOUSE_DB",
    "CLICKHOUSE_CONFIG",
];

/// Environment variables of the Keeper container that the operator sets (the raft id, the
/// data directory) or that would make the image's entrypoint read another configuration.
/// Refused in `spec.keeper.pod.env` and as keys of `spec.keeper.pod.envSecret`.
pub const KEEPER_RESERVED_ENV: &[&str] =
    &["KEEPER_SERVER_ID", "CLICKHOUSE_DATA_DIR", "KEEPER_CONFIG"];

/// A ClickHouse cluster: server replicas arranged in shards, and the Keeper ensemble they use.
/// The operator assumes exactly one ClickHouseCluster per namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "clickhouse.com",
    version = "v1alpha1",
    kind = "ClickHouseCluster",
    namespaced,
    shortname = "chc",
    status = "ClickHouseClusterStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Shards","type":"integer","jsonPath":".spec.shards"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.clickhouse.readyText"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.host"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseClusterSpec {
    /// Number of shards. Each shard holds its own part of the data. 0 makes a Keeper-only
    /// cluster: its Keeper ensemble (`keeper.replicas` at least 1) and no server, for other
    /// clusters to use through `keeper.external.clusterRef`.
    #[serde(default = "default_shards")]
    pub shards: i32,
    /// Number of replicas in every shard. Each replica is one StatefulSet with one pod.
    #[serde(default = "default_replicas")]
    pub replicas: i32,
    /// Weights of shards in `remote_servers`: shard index (`"0"`, `"1"`, …, below `shards`) →
    /// weight (1 to 1000; a shard not named weighs 1). An insert into a Distributed table
    /// sends each shard its weight's share of the rows. A change is reloaded by the servers:
    /// no restart.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shard_weights: BTreeMap<String, u32>,
    /// ClickHouse server image.
    #[serde(default = "default_server_image")]
    pub image: String,
    /// The Keeper ensemble that coordinates replication.
    #[serde(default)]
    pub keeper: KeeperSpec,
    /// Settings of the server pods.
    #[serde(default)]
    pub pod: PodSettings,
    /// Storage of every server replica: the data volume, further disks with storage policies
    /// over them, a log volume.
    #[serde(default)]
    pub storage: ServerStorageSpec,
    /// How storage size changes are applied.
    #[serde(default)]
    pub storage_scaling: StorageScaling,
    /// ClickHouse server configuration.
    #[serde(default)]
    pub configuration: Configuration,
    /// Users of the cluster, with passwords from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<UsersSpec>,
    /// TLS for client and interserver connections.
    #[serde(default)]
    pub tls: TlsSpec,
    /// The servers' own Prometheus endpoint (ClickHouse 20.1 and later): `/metrics` with the
    /// server's metrics, events and asynchronous metrics on `port`, declared on the pods so that
    /// a PodMonitor can scrape them directly. Turning it on or off restarts the servers.
    #[serde(default)]
    pub server_metrics: ServerMetricsSpec,
    /// Client protocols besides HTTP and native that BI tools use: MySQL (9004), PostgreSQL
    /// (9005) and gRPC (9100), each served, declared on the pods, published by the client
    /// Services and allowed by the NetworkPolicy like the other client ports. Off by default
    /// (the images' MySQL and PostgreSQL ports are closed). A change restarts the servers.
    #[serde(default, skip_serializing_if = "ProtocolsSpec::is_default")]
    pub protocols: ProtocolsSpec,
    /// How long the servers keep the rows of their system log tables (`query_log`,
    /// `part_log`, `metric_log`, …), which otherwise grow until the disk is full: a TTL each
    /// table is created with (ClickHouse 21.1 and later; decision 49). Unset: 30 days on the
    /// default tables, written for clusters created by or restarted under this operator
    /// version (it restarts no running pod). Set or changed: the servers restart, since the
    /// tables are created at startup; a table whose TTL changes is renamed (`query_log_0`) and
    /// created anew, as ClickHouse does for a changed system log table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_logs: Option<SystemLogsSpec>,
    /// The servers' own log (`logger`): level, format, file size and count, and whether it is
    /// written to files besides the console (the container log, which `kubectl logs` shows).
    /// The level is reloaded; the rest restarts the servers. Unset fields keep the defaults:
    /// `information`, text, files of 100M, 3 of them, files on.
    #[serde(default, skip_serializing_if = "LoggingSpec::is_default")]
    pub logging: LoggingSpec,
    /// What schema the operator copies onto new replicas and shards.
    #[serde(default)]
    pub schema_policy: SchemaPolicySpec,
    /// How pods are restarted when a change needs it.
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
    /// Seconds a Smart Update waits for a restarted replica to catch up with replication before
    /// it stops the rollout, naming the replica (default 7200: 2 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up_seconds: Option<i64>,
    /// Disruption budget of the server pods of each shard.
    #[serde(default)]
    pub pod_disruption_budget: PodDisruptionBudgetSpec,
    /// Stop every pod (data is kept) while true.
    #[serde(default)]
    pub pause: bool,
    /// Hands off while true: the operator changes nothing of this cluster (no object written,
    /// no pod restarted or deleted, no statement sent, no scheduled backup), its pods keep
    /// running as they are, and the status says `suspended`; a change of the spec waits until
    /// it is false again. Unlike `pause`, nothing stops. Deleting the cluster still runs its
    /// reclaim policy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// For a server that cannot start: while true, the servers run under a shell that keeps
    /// the container up when `clickhouse-server` stops, with its exit status in the log, and
    /// without liveness and startup probes, so that `kubectl exec` can look inside and the
    /// pod is not restarted over and over; readiness still says whether the server serves.
    /// The status says so. A change restarts the servers as any template change does (a
    /// server that cannot start gets it at once). Not with a `-distroless` image (no shell).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub troubleshoot: bool,
    /// Scheduled backups.
    #[serde(default)]
    pub backup: BackupScheduleSpec,
    /// Automatic version upgrades: at a scheduled time, a newer allowed version from a version
    /// source is written into `spec.image` (never into a StatefulSet); Smart Update rolls it out.
    #[serde(default)]
    pub upgrade_options: UpgradeOptions,
    /// The client Service of the cluster.
    #[serde(default)]
    pub client_service: ClientServiceSpec,
    /// NetworkPolicies for the cluster's pods (on by default): Keeper reachable only from the
    /// cluster's servers and the operator, the interserver ports only from the servers, the
    /// client ports from `clients`. Changing this restarts nothing.
    #[serde(default)]
    pub network_policy: NetworkPolicies,
    /// The Kubernetes cluster's DNS domain (default `cluster.local`): the servers, Keeper and
    /// the operator reach the pods as `<pod>.<service>.<namespace>.svc.<clusterDomain>`. Cannot
    /// change once the cluster exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_domain: Option<String>,
    /// Version of the resource format; the operator refuses versions newer than itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cr_version: Option<String>,
    /// Who the server and Keeper processes run as, and which privileges the servers keep.
    #[serde(default, skip_serializing_if = "PodSecurity::is_default")]
    pub pod_security: PodSecurity,
}

/// `spec.podSecurity`: the user the server and Keeper pods run as, and the capabilities the
/// servers keep. Either way the pods run as a non-root user with no privilege escalation, a
/// read-only root filesystem and seccomp `RuntimeDefault`. A change restarts the pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSecurity {
    /// `Fixed` (the default): uid, gid and fsGroup 101, the images' `clickhouse` user.
    /// `Platform`: left unset for the platform to assign, as OpenShift's `restricted-v2`
    /// security context constraint does (it refuses a fixed uid outside the namespace's
    /// range); the images run under any uid (see docs/running-on-real-clusters.md). The
    /// images declare no user, so where no admission assigns a uid (EKS, GKE, AKS, kind, k3s)
    /// the kubelet refuses the pods and the status says `error` until the pod templates set
    /// `runAsUser`, `runAsGroup` and `fsGroup`; server tags 24.x before 24.3.14, 24.8.7 and
    /// 24.11 are refused (their `clickhouse su` fails on OpenShift's group 0).
    #[serde(default)]
    pub ids: PodIds,
    /// Keep the three capabilities ClickHouse uses in the server container: `IPC_LOCK`
    /// (locking its binary in memory), `SYS_NICE` (`os_thread_priority`) and `NET_ADMIN`
    /// (per-thread accounting by taskstats). Off by default: the pods then meet Pod Security
    /// `restricted`, and ClickHouse logs that the three are off and runs on. On, the namespace
    /// must allow `privileged` pods, and a non-root process gets them only where the runtime
    /// grants ambient capabilities or the binary carries file capabilities (the official
    /// images do not).
    #[serde(default)]
    pub clickhouse_capabilities: bool,
}

impl PodSecurity {
    fn is_default(&self) -> bool {
        *self == PodSecurity::default()
    }
}

/// Whether the pods' uid, gid and fsGroup are fixed or the platform's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PodIds {
    #[default]
    Fixed,
    Platform,
}

/// The capabilities `spec.podSecurity.clickhouseCapabilities` keeps in the server container.
pub const CLICKHOUSE_CAPABILITIES: &[&str] = &["IPC_LOCK", "SYS_NICE", "NET_ADMIN"];

fn default_shards() -> i32 {
    1
}
fn default_replicas() -> i32 {
    2
}
fn default_server_image() -> String {
    DEFAULT_SERVER_IMAGE.to_string()
}
fn default_keeper_image() -> String {
    DEFAULT_KEEPER_IMAGE.to_string()
}
fn default_keeper_replicas() -> i32 {
    3
}
fn default_max_unavailable() -> i32 {
    1
}
fn default_true() -> bool {
    true
}
fn default_storage_size() -> String {
    "10Gi".to_string()
}
fn default_keeper_storage() -> StorageSpec {
    StorageSpec {
        size: "1Gi".to_string(),
        ..StorageSpec::default()
    }
}

/// The Keeper ensemble.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeeperSpec {
    /// Members of the ensemble: 0 (no Keeper), or an odd number up to 7.
    #[serde(default = "default_keeper_replicas")]
    pub replicas: i32,
    /// ClickHouse Keeper image.
    #[serde(default = "default_keeper_image")]
    pub image: String,
    /// Data volume of every Keeper member.
    #[serde(default = "default_keeper_storage")]
    pub storage: StorageSpec,
    /// Settings of the Keeper pods.
    #[serde(default)]
    pub pod: PodSettings,
    /// Keeper's coordination settings (`keeper_server/coordination_settings`), e.g.
    /// `session_timeout_ms: "60000"`, over the operator's defaults (`operation_timeout_ms`
    /// 10000, `session_timeout_ms` 30000, `raft_logs_level` warning). A change restarts the
    /// members one at a time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// An existing ZooKeeper or Keeper ensemble instead of one of the cluster's own (`replicas`
    /// must then be 0): by its members' addresses or by another ClickHouseCluster's Keeper.
    /// The servers keep everything under `root`, which the operator creates before they start
    /// and removes when the cluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalKeeper>,
    /// Client and raft traffic of the cluster's own Keeper over TLS, with the cluster's
    /// certificate and CA (`spec.tls.serverCertSecret`, `spec.tls.caSecret`; the certificate
    /// must also name the members, `*.<cluster>-keeper-headless.<namespace>.svc.<domain>`): the
    /// members verify each other, the servers connect to the secure client port and verify the
    /// member. Needs `spec.tls.enabled` and Keeper and ClickHouse 22.3 or later; cannot change
    /// once the cluster exists (the members cannot switch raft to TLS one at a time).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// Namespaces whose ClickHouseCluster may use this cluster's Keeper through
    /// `keeper.external.clusterRef`: the Keeper NetworkPolicy lets their servers in, and a
    /// reference from any other namespace is refused. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_namespaces: Vec<String>,
}

impl KeeperSpec {
    /// The budget of a member's startup probe: `spec.keeper.pod.startupSeconds`, else
    /// [`DEFAULT_KEEPER_STARTUP_SECONDS`] plus [`KEEPER_LOAD_SECONDS_PER_GIB`] for each GiB
    /// (rounded up) of `spec.keeper.storage.size` (1Gi: 120 s, 10Gi: 660 s).
    pub fn startup_seconds(&self) -> i32 {
        if let Some(s) = self.pod.startup_seconds {
            return s;
        }
        const GIB: u128 = 1 << 30;
        let gib = crate::util::quantity::parse_bytes(&self.storage.size)
            .map_or(1, |b| b.div_ceil(GIB).max(1))
            .min(1000) as i32;
        DEFAULT_KEEPER_STARTUP_SECONDS + KEEPER_LOAD_SECONDS_PER_GIB * gib
    }
}

/// An existing Keeper ensemble (`spec.keeper.external`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalKeeper {
    /// The ensemble's members (or one Service in front of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<KeeperNode>,
    /// Or the Keeper ensemble of another ClickHouseCluster, reached through its Keeper client
    /// Service `<name>-keeper`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_ref: Option<KeeperClusterRef>,
    /// The path under which this cluster's servers keep everything (default
    /// `/clickhouse-operator/<namespace>/<name>`): several clusters share one ensemble safely,
    /// each under its own root. Cannot change once the cluster exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

/// One member of an existing Keeper ensemble.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeeperNode {
    /// Host name or address of the member.
    pub host: String,
    /// Default 2181.
    #[serde(default = "default_zookeeper_port")]
    pub port: i32,
}

fn default_zookeeper_port() -> i32 {
    2181
}

/// Another ClickHouseCluster whose Keeper ensemble this cluster uses.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeeperClusterRef {
    /// The other ClickHouseCluster's name.
    pub name: String,
    /// Default: this cluster's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl ExternalKeeper {
    /// Where the roots of a namespace's clusters live in another ClickHouseCluster's Keeper:
    /// `/clickhouse-operator/<namespace>/`.
    pub fn namespace_folder(namespace: &str) -> String {
        format!("/clickhouse-operator/{namespace}/")
    }

    /// `root`, or `/clickhouse-operator/<namespace>/<name>`.
    pub fn root_of(&self, namespace: &str, name: &str) -> String {
        self.root
            .clone()
            .unwrap_or_else(|| format!("/clickhouse-operator/{namespace}/{name}"))
    }
}

/// The prefix of `spec.configuration.files` names that go to `users.d`.
pub const USERS_D_PREFIX: &str = "users.d/";

impl Configuration {
    /// The files for `config.d` (name → content).
    pub fn config_d_files(&self) -> impl Iterator<Item = (&String, &String)> {
        self.files
            .iter()
            .filter(|(n, _)| !n.starts_with(USERS_D_PREFIX))
    }

    /// The `secretFiles` for `config.d` (file name → Secret key).
    pub fn secret_config_d_files(&self) -> impl Iterator<Item = (&String, &SecretKeyRef)> {
        self.secret_files
            .iter()
            .filter(|(n, _)| !n.starts_with(USERS_D_PREFIX))
    }

    /// The `secretFiles` for `users.d` (file name without the prefix → Secret key).
    pub fn secret_users_d_files(&self) -> impl Iterator<Item = (&str, &SecretKeyRef)> {
        self.secret_files
            .iter()
            .filter_map(|(n, k)| Some((n.strip_prefix(USERS_D_PREFIX)?, k)))
    }

    /// Every Secret key `secretSettings` and `secretFiles` name, with the field naming it.
    pub fn secret_keys(&self) -> impl Iterator<Item = (&'static str, &SecretKeyRef)> {
        self.secret_settings
            .values()
            .map(|k| ("spec.configuration.secretSettings", k))
            .chain(
                self.secret_files
                    .values()
                    .map(|k| ("spec.configuration.secretFiles", k)),
            )
    }

    /// The files for `users.d` (file name without the prefix → content).
    pub fn users_d_files(&self) -> impl Iterator<Item = (&str, &String)> {
        self.files
            .iter()
            .filter_map(|(n, c)| Some((n.strip_prefix(USERS_D_PREFIX)?, c)))
    }
}

impl ClickHouseClusterSpec {
    /// `clusterDomain`, or `cluster.local`.
    pub fn cluster_domain(&self) -> &str {
        self.cluster_domain
            .as_deref()
            .unwrap_or(crate::conventions::DEFAULT_CLUSTER_DOMAIN)
    }

    /// Every Secret the spec names: (the field naming it, the Secret's name, whether the
    /// cluster reads it now — the TLS Secrets only while TLS is enabled).
    pub fn secret_references(&self) -> [(&'static str, Option<&String>, bool); 5] {
        let tls = self.tls.enabled;
        [
            (
                "spec.users.secretName",
                self.users.as_ref().map(|u| &u.secret_name),
                true,
            ),
            (
                "spec.tls.serverCertSecret",
                self.tls.server_cert_secret.as_ref(),
                tls,
            ),
            ("spec.tls.caSecret", self.tls.ca_secret.as_ref(), tls),
            ("spec.pod.envSecret", self.pod.env_secret.as_ref(), true),
            (
                "spec.keeper.pod.envSecret",
                self.keeper.pod.env_secret.as_ref(),
                true,
            ),
        ]
    }

    /// The Secrets of the backup destinations (`spec.backup.destination`,
    /// `allowedDestinations`) that name one (not those with `webIdentity`), each once: their
    /// keys become the servers' named collections where the Secret opts in.
    pub fn backup_secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for d in self
            .backup
            .destination
            .iter()
            .chain(&self.backup.allowed_destinations)
        {
            if !d.secret_name.is_empty() && !out.contains(&d.secret_name) {
                out.push(d.secret_name.clone());
            }
        }
        out
    }

    /// The Secrets the cluster reads: (field naming it, Secret name), each Secret once.
    pub fn referenced_secrets(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = self
            .secret_references()
            .into_iter()
            .filter_map(|(field, name, read)| Some((field, name.filter(|_| read)?.clone())))
            .collect();
        for (field, key) in self.configuration.secret_keys() {
            if !out.iter().any(|(_, n)| *n == key.name) {
                out.push((field, key.name.clone()));
            }
        }
        out
    }
}

impl Default for KeeperSpec {
    fn default() -> Self {
        KeeperSpec {
            replicas: default_keeper_replicas(),
            image: default_keeper_image(),
            storage: default_keeper_storage(),
            pod: PodSettings::default(),
            settings: BTreeMap::new(),
            external: None,
            tls: false,
            allowed_namespaces: Vec::new(),
        }
    }
}

/// Pod-level settings shared by server and Keeper pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// Resources of the main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra environment variables of the main container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Secret whose keys become environment variables; a change of its contents rolls the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_secret: Option<String>,
    /// Affinity of the pods, besides the anti-affinity of `antiAffinity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations of the pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node labels a node must carry to run the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Keeps the replicas of one shard (for Keeper: the members) on different nodes:
    /// `Preferred` (the default: the scheduler avoids a node that already runs one),
    /// `Required` (a pod waits rather than share a node) or `None`. The default reaches pods
    /// created before it existed at their next restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<AntiAffinity>,
    /// Topology key (e.g. `topology.kubernetes.io/zone`) over which pods are spread softly
    /// (maxSkew 1, ScheduleAnyway): the replicas of each shard, so that no shard sits in one
    /// zone; the Keeper members. Condemned replicas stop counting in the spread while they
    /// are removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_key: Option<String>,
    /// Extra containers that run beside the main one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sidecars: Vec<Container>,
    /// Extra annotations of the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Extra labels of the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Seconds the main container may take to start (a server loading its tables, a Keeper
    /// member loading its snapshot and logs) before it is restarted; after that, 60 s without an
    /// answer restart it. Default 120 for servers; for Keeper 60 plus 60 for each GiB of
    /// `spec.keeper.storage.size` (1Gi: 120), and Keeper's `startup_timeout` is then 30 s
    /// (half of `startupSeconds` when it is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_seconds: Option<i32>,
    /// A pod template (`metadata.labels`/`annotations`, `spec`) merged over the generated one:
    /// any pod field (imagePullSecrets, serviceAccountName, priorityClassName, initContainers,
    /// volumes, the main container's volumeMounts, env, securityContext, probes and lifecycle,
    /// hostAliases, runtimeClassName, terminationGracePeriodSeconds, …). Lists of named items
    /// merge by name (volume mounts by mountPath), other lists are appended to; the main
    /// container's image, command, args and ports, the operator's environment variables,
    /// volumes, mount paths, labels and annotations, and the pod's restartPolicy, hostname,
    /// subdomain and nodeName are refused with their path. A change restarts the pods one at a
    /// time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_template_schema")]
    pub template: Option<serde_json::Value>,
}

/// `spec.pod.template`: a pod template, checked by the operator (the builders' pod template checks),
/// which names the path of whatever it refuses; the API server only keeps the shape.
fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let map = schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "string"}
    });
    let mut labels = map.clone();
    labels.insert(
        "description".into(),
        "Extra labels of the pods (the operator's own are refused).".into(),
    );
    let mut annotations = map;
    annotations.insert(
        "description".into(),
        "Extra annotations of the pods (the operator's own are refused).".into(),
    );
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "A pod template merged over the generated one.",
        "properties": {
            "metadata": {
                "type": "object",
                "description": "Labels and annotations of the pods (nothing else).",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"labels": labels, "annotations": annotations}
            },
            "spec": {
                "type": "object",
                "description": "A PodSpec (see `kubectl explain pod.spec`) merged over the \
                    generated one; the main container is `clickhouse` for servers, `keeper` for \
                    Keeper.",
                "x-kubernetes-preserve-unknown-fields": true
            }
        }
    })
}

/// How strictly pods that must not share a node are kept apart.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AntiAffinity {
    #[default]
    Preferred,
    Required,
    None,
}

impl PodSettings {
    /// A startup probe of `startupSeconds` (or `default` seconds), checked every 2 s.
    pub fn startup_failure_threshold(&self, default: i32) -> i32 {
        (self.startup_seconds.unwrap_or(default).max(2) + 1) / 2
    }
}

/// The servers' own Prometheus endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerMetricsSpec {
    /// Serve the endpoint (default false).
    #[serde(default)]
    pub enabled: bool,
    /// Default 9363.
    #[serde(default = "default_server_metrics_port")]
    pub port: i32,
}

impl Default for ServerMetricsSpec {
    fn default() -> Self {
        ServerMetricsSpec {
            enabled: false,
            port: default_server_metrics_port(),
        }
    }
}

fn default_server_metrics_port() -> i32 {
    9363
}

/// `spec.protocols`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolsSpec {
    /// The MySQL wire protocol on 9004 (ClickHouse 20.1 and later). With `spec.tls` the
    /// server offers TLS there (clients choose); refused with `spec.tls.required`, since a
    /// client may still connect in clear.
    #[serde(default)]
    pub mysql: bool,
    /// The PostgreSQL wire protocol on 9005 (ClickHouse 21.1 and later). TLS as for MySQL.
    #[serde(default)]
    pub postgresql: bool,
    /// gRPC on 9100 (ClickHouse 21.1 and later, in builds with gRPC, as the official images
    /// are). With `spec.tls` the port takes TLS only, with the server certificate.
    #[serde(default)]
    pub grpc: bool,
}

impl ProtocolsSpec {
    /// Whether nothing is on.
    pub fn is_default(&self) -> bool {
        *self == ProtocolsSpec::default()
    }
}

/// `spec.logging`: the server log (ClickHouse's `logger`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoggingSpec {
    /// `fatal`, `critical`, `error`, `warning`, `notice`, `information` (the default),
    /// `debug`, `trace` or `test`. Reloaded: no restart. Replaces the setting `logger/level`
    /// of `spec.configuration.settings`, which is refused beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// `Text` (the default) or `Json`: one JSON object per line (`logger/formatting/type`,
    /// ClickHouse 22.x and later; older servers ignore it and write text), on the console and
    /// in the files. Replaces the setting `logger/formatting/type`, refused beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<LogFormat>,
    /// Size at which a log file is rotated, as ClickHouse reads it (`100M`, the default;
    /// digits and an optional `K`, `M` or `G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Rotated files kept (1 to 1000; default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// Write the log and the error log to files (default true: in the log volume of
    /// `spec.storage.logs`, or scratch space of the pod) besides the console; false: the
    /// console only, as the official images do without a log folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<bool>,
}

impl LoggingSpec {
    /// Whether nothing is set.
    pub fn is_default(&self) -> bool {
        *self == LoggingSpec::default()
    }
}

/// `spec.logging.format`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LogFormat {
    Text,
    Json,
}

/// The levels `spec.logging.level` takes, as ClickHouse names them.
pub const LOG_LEVELS: &[&str] = &[
    "fatal",
    "critical",
    "error",
    "warning",
    "notice",
    "information",
    "debug",
    "trace",
    "test",
];

/// `spec.systemLogs`: the TTLs of the system log tables (decision 49).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemLogsSpec {
    /// Days a row of each default system log table is kept (`event_date + INTERVAL n DAY
    /// DELETE`; default 30, at most 36500). 0 is the off switch: no TTL is written and the
    /// tables keep every row, as the image configures them.
    #[serde(default = "default_system_log_ttl_days")]
    pub ttl_days: u32,
    /// Days per table, over `ttlDays`: a default table (`query_log`, `query_thread_log`,
    /// `part_log`, `trace_log`, `metric_log`, `asynchronous_metric_log`) with 0 keeps every
    /// row; another known table (`text_log`, `query_views_log`, `processors_profile_log`,
    /// `session_log`, `zookeeper_log`, `asynchronous_insert_log`, `backup_log`,
    /// `blob_storage_log`, `error_log`, `query_metric_log`, `crash_log`) gets its TTL only
    /// here, and naming it turns that log on where the image's configuration has it off.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tables: BTreeMap<String, u32>,
}

impl Default for SystemLogsSpec {
    fn default() -> Self {
        SystemLogsSpec {
            ttl_days: default_system_log_ttl_days(),
            tables: BTreeMap::new(),
        }
    }
}

impl ClickHouseClusterSpec {
    /// Whether the cluster has its client Service: asked for, and servers to serve (a
    /// Keeper-only cluster has none, decision 55).
    pub fn serves_clients(&self) -> bool {
        self.client_service.enabled && self.shards > 0
    }
}

impl SystemLogsSpec {
    /// The days of each table that gets a TTL under `spec` (`None`: the default), in name
    /// order.
    pub fn ttls(spec: Option<&SystemLogsSpec>) -> Vec<(String, u32)> {
        use crate::conventions::{DEFAULT_TABLES, is_known};
        let default = SystemLogsSpec::default();
        let s = spec.unwrap_or(&default);
        let mut out: Vec<(String, u32)> = DEFAULT_TABLES
            .iter()
            .map(|t| {
                (
                    t.to_string(),
                    s.tables.get(*t).copied().unwrap_or(s.ttl_days),
                )
            })
            .chain(
                s.tables
                    .iter()
                    .filter(|(t, _)| !DEFAULT_TABLES.contains(&t.as_str()))
                    .map(|(t, d)| (t.clone(), *d)),
            )
            .filter(|(t, d)| *d > 0 && is_known(t))
            .collect();
        out.sort();
        out
    }
}

/// The default `spec.systemLogs.ttlDays`.
pub const DEFAULT_SYSTEM_LOG_TTL_DAYS: u32 = 30;

fn default_system_log_ttl_days() -> u32 {
    DEFAULT_SYSTEM_LOG_TTL_DAYS
}

/// Automatic version upgrades (S2-24, decision 15).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeOptions {
    /// `Disabled` (default), `Recommended`, `Latest`, or an exact version (`24.8.4.13`, which
    /// may also be older than the current one: the only way to a downgrade).
    #[serde(default = "default_upgrade_apply")]
    pub apply: String,
    /// When the source is read, as a cron expression in UTC (default `0 4 * * *`).
    #[serde(default = "default_upgrade_schedule")]
    pub schedule: String,
    /// Where the versions come from (needed unless `apply` is `Disabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_source: Option<VersionSource>,
    /// Image repositories an offered version may come from besides `spec.image`'s own (the
    /// default: only that one, so that a version source can pick a version, not what runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_repositories: Vec<String>,
}

impl Default for UpgradeOptions {
    fn default() -> Self {
        UpgradeOptions {
            apply: default_upgrade_apply(),
            schedule: default_upgrade_schedule(),
            version_source: None,
            allowed_repositories: Vec::new(),
        }
    }
}

fn default_upgrade_apply() -> String {
    "Disabled".into()
}
fn default_upgrade_schedule() -> String {
    "0 4 * * *".into()
}

/// A document listing versions: `{"recommended": "25.3", "versions": [{"version": "25.3",
/// "image": "…"}, …]}` (`image` defaults to the current image's repository with the version as
/// its tag). Exactly one of `url` and `configMap`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionSource {
    /// An `https://` URL answering with the document (at most 64 KiB, within 10 s; redirects
    /// only to the same host; proxy variables are not used), or `http://` with `insecure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Allow an `http://` URL: whoever is on the path then chooses the version (default: only
    /// `https://`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// A ConfigMap in the cluster's namespace holding the document (for air-gapped clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
}

/// A key of a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKey {
    /// The ConfigMap's name.
    pub name: String,
    /// Default `versions.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// What the last automatic upgrade check found.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The schedule slot last checked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
    /// What that check found or did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last image written into `spec.image` by a check, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_upgrade: Option<String>,
    /// When that image was written (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_upgrade_time: Option<String>,
}

/// A data volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Requested size, a Kubernetes quantity such as `10Gi`. It never shrinks.
    #[serde(default = "default_storage_size")]
    pub size: String,
    /// Storage class; the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// What happens to the PVCs when the cluster is deleted, and with them to the credentials
    /// their data depends on (the Secret `<cluster>-operator`) and to the root in an external
    /// Keeper: `Retain` keeps them all, for a cluster created again with the same name to take
    /// back (the Secret is deleted with the last retained PVC); `Delete` deletes them.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
    /// Labels of the PVCs (besides the operator's own, which win): set on new PVCs and added
    /// to existing ones (a key removed here stays on existing PVCs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the PVCs, for example for a CSI driver or a backup tool: set on new PVCs
    /// and added to existing ones (a key removed here stays on existing PVCs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        StorageSpec {
            size: default_storage_size(),
            storage_class_name: None,
            reclaim_policy: ReclaimPolicy::default(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }
}

/// The storage of a server replica. The data volume (`size`, `storageClassName`, …) is
/// ClickHouse's `default` disk at `/var/lib/clickhouse`; every entry of `disks` is one more
/// volume, mounted at `/var/lib/clickhouse-disks/<name>/` and declared as the disk `<name>` in
/// `storage_configuration`; `policies` group the disks into storage policies (ClickHouse 19.15
/// and later; older servers ignore `storage_configuration`, and a table cannot name a policy
/// there). Adding a disk recreates the StatefulSets (their pods kept) and restarts the servers
/// one at a time; a disk cannot be removed (its parts would be lost).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerStorageSpec {
    #[serde(flatten)]
    pub data: StorageSpec,
    /// Further disks, a PVC each per replica (the PVC `disk-<name>-<pod>`), in the data
    /// volume's reclaim policy, labels and annotations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskSpec>,
    /// Storage policies: policy name → its volumes in order (new parts go to the first, parts
    /// move on when a volume fills past `moveFactor` or by a table's `TTL … TO VOLUME`). A
    /// policy named `default` replaces ClickHouse's default policy for tables that name none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, StoragePolicySpec>,
    /// A volume for the server's logs (`/var/log/clickhouse-server`, the PVC `logs-<pod>`)
    /// instead of scratch space that is lost with the pod. Adding it restarts the servers one at
    /// a time; it cannot be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<VolumeSpec>,
}

/// One more disk of every server replica.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    /// The disk's name in ClickHouse (`system.disks`) and in its PVC's name: lower-case
    /// letters, digits and `-`, at most 20 characters, not `default`.
    pub name: String,
    /// Requested size, a Kubernetes quantity. It never shrinks; it grows in place as the data
    /// volume does (`spec.storageScaling.enableVolumeScaling`).
    pub size: String,
    /// Storage class; the cluster's default class when unset. Fixed once the PVCs exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// A volume of fixed purpose (the log volume).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// Requested size, a Kubernetes quantity. It never shrinks.
    pub size: String,
    /// Storage class; the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// A storage policy (`storage_configuration/policies/<name>`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoragePolicySpec {
    /// The policy's volumes, in order: new parts are written to the first.
    pub volumes: Vec<PolicyVolumeSpec>,
    /// When the free space of a volume falls below this share (0 to 1), parts move to the next
    /// volume (`move_factor`; ClickHouse's default 0.1 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_factor: Option<f64>,
}

/// A volume of a storage policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyVolumeSpec {
    /// The volume's name, as `TTL … TO VOLUME '<name>'` names it.
    pub name: String,
    /// Its disks: `default` (the data volume) or names from `spec.storage.disks`; parts are
    /// spread over them round-robin (JBOD).
    pub disks: Vec<String>,
    /// Parts larger than this (a quantity such as `1Gi`) are not written to this volume but to
    /// the next (`max_data_part_size_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_data_part_size: Option<String>,
}

/// `Retain` keeps the PVCs of a deleted cluster; `Delete` labels them for the PVC cleaner.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReclaimPolicy {
    #[default]
    Retain,
    Delete,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageScaling {
    /// Apply a larger storage size by resizing the PVCs in place (no pod restart).
    #[serde(default)]
    pub enable_volume_scaling: bool,
}

/// ClickHouse server configuration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    /// Server settings (`config.xml` top-level elements), e.g. `max_concurrent_queries: "200"`.
    /// Nested elements use `/` in the key: `logger/level: debug`. The operator's own are
    /// refused: the ports, `listen_host`, `listen_try`, `interserver_http_port`,
    /// `interserver_https_port`, `interserver_http_host`, `interserver_http_credentials`, `macros`,
    /// `remote_servers`, `distributed_ddl`, `openSSL`, `path`, `users_config`,
    /// `user_directories`, `logger/log`, `logger/errorlog`, and of `zookeeper` the members
    /// (`node`), `root`, `identity` and `implementation`; the Keeper client's other settings
    /// (`zookeeper/session_timeout_ms`, `zookeeper/operation_timeout_ms`, …) are the user's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// Settings profiles: profile name → setting → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, BTreeMap<String, String>>,
    /// Quotas: quota name → interval setting → value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quotas: BTreeMap<String, BTreeMap<String, String>>,
    /// Extra configuration files: file name → XML content, placed in `config.d`; a name
    /// `users.d/<file>` places it in `users.d` (users, profiles, quotas: reloaded, and kept in
    /// a Secret as it may hold passwords).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Extra configuration files of one shard's servers only: shard index (`"0"`, `"1"`, …) →
    /// file name → XML content, placed in `config.d` beside the common ones. A change restarts
    /// that shard's replicas, one at a time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shard_files: BTreeMap<String, BTreeMap<String, String>>,
    /// Extra configuration files of one replica's server only: replica name (its StatefulSet,
    /// `<cluster>-<shard>-<index>` as `status.replicaStateMap` lists it) → file name → XML
    /// content, placed in `config.d` beside the common and the shard's files. A change restarts
    /// that replica only; a name that is no current replica is not used.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replica_files: BTreeMap<String, BTreeMap<String, String>>,
    /// Server settings whose values are kept in Secrets: element path (as in `settings`) → a
    /// key of a Secret in the cluster's namespace. The value reaches the servers as an
    /// environment variable (`from_env`), never through the cluster resource or a ConfigMap,
    /// and servers of 23.8 and later leave it out of `preprocessed_configs/`. A change of the
    /// paths, the references or a value restarts the servers one at a time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_settings: BTreeMap<String, SecretKeyRef>,
    /// Extra configuration files kept in Secrets: file name (as in `files`; `users.d/<file>`
    /// for `users.d`) → a key of a Secret in the cluster's namespace, projected into the pods
    /// as it is (credentials of disks, named collections, dictionaries' sources). A change of a
    /// `config.d` file restarts the servers one at a time; `users.d` files are reloaded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_files: BTreeMap<String, SecretKeyRef>,
}

/// A key of a Secret in the cluster's namespace.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in its data.
    pub key: String,
}

/// Users whose passwords live in a Secret: each key of the Secret is a user name, its value the
/// password. Passwords reach ClickHouse only as SHA-256 hashes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsersSpec {
    /// The Secret (same namespace) whose keys are user names and values their passwords; a key
    /// `<user>.sha256_hex` holds the SHA-256 of the user's password instead (hex), and
    /// `<user>.double_sha1_hex` its double SHA-1 (ClickHouse 20.1 and later): the hash is used
    /// as it is, and the password is nowhere.
    pub secret_name: String,
    /// Settings profile given to these users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Addresses or networks (CIDR) these users may connect from; `::/0` for anywhere.
    /// Default: the networks the operator connects from (`OPERATOR_NETWORKS`, the chart's
    /// `operatorNetworks`: the pod network), plus the server pod itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Per user of the Secret: networks, profile, quota and databases that replace the defaults
    /// above for that user.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub accounts: BTreeMap<String, AccountSpec>,
    /// Keep the users, roles, quotas and grants created with SQL in Keeper, shared by every
    /// server (`user_directories/replicated`, ClickHouse 21.9 and later), instead of on each
    /// server's own disk, where a new replica has none of them. Needs Keeper. A change
    /// restarts the servers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicated_access: bool,
}

/// What one user of the users Secret may do, over the defaults of `spec.users`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountSpec {
    /// Addresses or networks (CIDR) this user may connect from, instead of `users.networks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Settings profile, instead of `users.profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Quota (`default` or one of `configuration.quotas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// The only databases this user may use (`allow_databases`); empty: every database.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub databases: Vec<String>,
    /// Let this user manage users, roles, quotas and grants with SQL (`CREATE USER`, `GRANT`,
    /// …: ClickHouse's `access_management`, 20.4 and later; written once the servers report
    /// such a version). Reloaded: no restart. What such a user creates is kept by each server
    /// for itself, unless `spec.users.replicatedAccess` keeps it in Keeper for all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub access_management: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Serve the secure ports with the certificate of `serverCertSecret` (default false).
    /// Turning it on or off stops every server and starts them again.
    #[serde(default)]
    pub enabled: bool,
    /// Secret of type kubernetes.io/tls with the server certificate and key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cert_secret: Option<String>,
    /// Secret holding `ca.crt`, the CA that signed the server certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,
    /// Serve only the secure ports when true.
    #[serde(default)]
    pub required: bool,
}

/// What schema is copied onto new replicas and shards. Values are matched case-insensitively;
/// an unknown value falls back to the default `All` (with a Warning event), so the schema does
/// not restrict them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaPolicySpec {
    /// `None` or `All` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// `None`, `All` (default) or `DistributedTablesOnly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategy {
    /// The operator restarts outdated pods itself, one replica of a shard at a time, the backup
    /// replica last, waiting for each to be Ready and caught up.
    #[default]
    SmartUpdate,
    /// One StatefulSet at a time, waiting only for readiness.
    RollingUpdate,
    /// Specs are updated; nothing restarts until a pod is deleted by hand.
    OnDelete,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetSpec {
    /// Replicas of a shard that may be down at once, by us or by voluntary disruptions.
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: i32,
}

impl Default for PodDisruptionBudgetSpec {
    fn default() -> Self {
        PodDisruptionBudgetSpec {
            max_unavailable: default_max_unavailable(),
        }
    }
}

/// What a cluster's backup and restore agent pods get besides what the operator gives them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentPodSettings {
    /// Secrets to pull the agent's image (the operator's) with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<k8s_openapi::api::core::v1::LocalObjectReference>,
    /// Tolerations, so that an agent runs on (and stays on) the backup replica's node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Resources of the agent's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// PriorityClass of the agent pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Extra environment variables, such as `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` (a proxy
    /// for the bucket; the servers are always reached directly). The variables the agent is
    /// configured with are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra labels of the agent pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations of the agent pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl AgentPodSettings {
    /// The environment variables the operator configures an agent with (and the prefixes of
    /// the ones it may add): `env` cannot set them.
    pub const OWN_ENV: &'static [&'static str] = &[
        "AGENT_MODE",
        "BACKUP_NAME",
        "SHARD",
        "REPLICA",
        "DATA_DIR",
        "DISK_PATHS",
        "BASE_BACKUP",
        "TABLES",
        "INTO_NON_EMPTY",
        "ALLOW_EXTERNAL_SOURCES",
        "TERMINATION_LOG",
        "CH_",
        "S3_",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_SESSION_NAME",
        "AWS_STS_REGIONAL_ENDPOINTS",
        "AWS_ENDPOINT_URL_STS",
    ];

    /// Whether `name` is one of [`Self::OWN_ENV`] (or starts with one of its prefixes).
    pub fn owns_env(name: &str) -> bool {
        Self::OWN_ENV
            .iter()
            .any(|o| name == *o || (o.ends_with('_') && name.starts_with(o)))
    }

    pub fn is_empty(&self) -> bool {
        *self == AgentPodSettings::default()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleSpec {
    /// Where backups of this cluster go unless a backup names another destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<S3Destination>,
    /// Further destinations a ClickHouseBackup or ClickHouseRestore of this cluster may name in
    /// its own `destination` (each field the same); no other is used. Whoever may create backups
    /// of the cluster can copy its data to these and read their Secrets' keys through them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_destinations: Vec<S3Destination>,
    /// The pods of backup and restore agents: pull secrets, tolerations, resources, a priority
    /// class, labels, annotations and environment (proxies).
    #[serde(default, skip_serializing_if = "AgentPodSettings::is_empty")]
    pub agent: AgentPodSettings,
    /// Backups taken on a schedule, as ClickHouseBackup objects owned by the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<BackupSchedule>,
}

/// An S3-compatible bucket (AWS S3, MinIO, SeaweedFS, …) and how to authenticate to it: static
/// keys read from a Secret (`secretName`), never from the resource, or short-lived credentials
/// that a ServiceAccount's token buys from STS (`webIdentity`); exactly one of the two. The
/// Secret or ServiceAccount must carry the label `clickhouse.com/s3-credentials: "true"` to be
/// used for them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Destination {
    /// `https://s3.eu-west-1.amazonaws.com`, or `http://minio.backups:9000` with `insecure`.
    pub endpoint: String,
    /// The bucket's name.
    pub bucket: String,
    /// Folder in the bucket under which this cluster's backups are kept (default: the
    /// namespace and the cluster's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Region for request signing (default `us-east-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The Secret (same namespace) holding the access key id and secret access key; not with
    /// `webIdentity`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_name: String,
    /// Key of the access key id in the Secret (default `accessKeyId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id_key: Option<String>,
    /// Key of the secret access key in the Secret (default `secretAccessKey`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key_key: Option<String>,
    /// Short-lived credentials instead of a Secret's keys: the agents run under a ServiceAccount
    /// whose token (projected, with this audience) is exchanged with STS
    /// `AssumeRoleWithWebIdentity` for temporary credentials of a role, as EKS (IRSA) and
    /// other clusters whose issuer an IAM OIDC provider trusts do; not with `secretName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_identity: Option<WebIdentity>,
    /// Allow an `http://` endpoint (and `webIdentity.stsEndpoint`): the data and the signed
    /// requests then cross the network in clear (default: only `https://`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

/// A role assumed with a ServiceAccount's token (`AssumeRoleWithWebIdentity`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebIdentity {
    /// The role to assume, `arn:aws:iam::123456789012:role/clickhouse-backups`; its trust
    /// policy names the cluster's OIDC provider and the subject
    /// `system:serviceaccount:<namespace>:<serviceAccountName>`.
    pub role_arn: String,
    /// The ServiceAccount (same namespace) the agents run under and whose token is exchanged; it
    /// must carry the label `clickhouse.com/s3-credentials: "true"`. No Kubernetes API token is
    /// mounted.
    pub service_account_name: String,
    /// The token's audience, which the OIDC provider expects (default `sts.amazonaws.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// The STS endpoint (default `https://sts.<region>.amazonaws.com`); `http://` only with
    /// `insecure`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sts_endpoint: Option<String>,
}

impl WebIdentity {
    /// The audience of AWS STS, the default.
    pub const DEFAULT_AUDIENCE: &'static str = "sts.amazonaws.com";

    /// The token's audience.
    pub fn audience(&self) -> &str {
        self.audience.as_deref().unwrap_or(Self::DEFAULT_AUDIENCE)
    }

    /// The STS endpoint for a bucket in `region`, without a trailing `/`.
    pub fn sts_endpoint(&self, region: &str) -> String {
        match &self.sts_endpoint {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => format!("https://sts.{region}.amazonaws.com"),
        }
    }
}

impl S3Destination {
    /// Default key of the access key id in the credentials Secret.
    pub const ACCESS_KEY_ID: &'static str = "accessKeyId";
    /// Default key of the secret access key in the credentials Secret.
    pub const SECRET_ACCESS_KEY: &'static str = "secretAccessKey";

    /// The key of the access key id in the Secret.
    pub fn access_key_id_key(&self) -> &str {
        self.access_key_id_key
            .as_deref()
            .unwrap_or(Self::ACCESS_KEY_ID)
    }

    /// The key of the secret access key in the Secret.
    pub fn secret_access_key_key(&self) -> &str {
        self.secret_access_key_key
            .as_deref()
            .unwrap_or(Self::SECRET_ACCESS_KEY)
    }

    /// The region requests are signed for.
    pub fn region(&self) -> &str {
        self.region.as_deref().unwrap_or("us-east-1")
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSchedule {
    /// The schedule's name, unique in the cluster: a DNS label of at most 63 characters. Its
    /// backups are named after it.
    pub name: String,
    /// Cron expression with five fields, e.g. `0 3 * * *`.
    pub schedule: String,
    /// How many successful backups of this schedule to keep (the oldest go first, with their
    /// data in the bucket).
    #[serde(default = "default_keep")]
    pub keep: i32,
    /// Each backup uploads only the parts its schedule's previous successful backup does not
    /// hold (default); `false` uploads every part each time.
    #[serde(default = "default_true")]
    pub incremental: bool,
}

fn default_keep() -> i32 {
    7
}

/// `spec.networkPolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicies {
    /// Generate the cluster's NetworkPolicies (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Who may reach the client ports (HTTP, native, their TLS variants, the servers' metrics
    /// port), as NetworkPolicy peers; empty: everyone. The operator, its exporter, the backup
    /// agents and the cluster's own servers always may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
}

impl Default for NetworkPolicies {
    fn default() -> Self {
        NetworkPolicies {
            enabled: true,
            clients: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientServiceSpec {
    /// Create the client Service `<cluster>` (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// `ClusterIP` (default), `NodePort` or `LoadBalancer`.
    #[serde(default)]
    pub r#type: ClientServiceType,
    /// Annotations of the Service, e.g. for a cloud's load balancer.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Extra labels of the Service (the operator's own labels cannot be set).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Client networks a `LoadBalancer` accepts (CIDRs), where the cloud supports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_source_ranges: Vec<String>,
    /// `Cluster` or `Local` (keeps the client's address; `NodePort` and `LoadBalancer` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<ExternalTrafficPolicy>,
    /// One Service more per replica, `<replica>-client` (the replica's StatefulSet name plus
    /// `-client`), of the same type and options, for clients that pin a replica.
    #[serde(default)]
    pub per_replica: bool,
}

impl Default for ClientServiceSpec {
    fn default() -> Self {
        ClientServiceSpec {
            enabled: true,
            r#type: ClientServiceType::default(),
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
            load_balancer_source_ranges: Vec::new(),
            external_traffic_policy: None,
            per_replica: false,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ExternalTrafficPolicy {
    Cluster,
    Local,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ClientServiceType {
    #[default]
    ClusterIP,
    NodePort,
    LoadBalancer,
}

/// What the operator observed and did. `replicaStateMap` is internal to the operator; `members`
/// is the part other components read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClickHouseClusterStatus {
    /// `initializing`, `ready` (every pod Ready on its current revision and every shard
    /// reachable through every server), `paused`, `stopping`, `error` or `suspended`
    /// (`spec.suspend`: the operator changes nothing).
    #[serde(default)]
    pub state: ClusterState,
    /// What happens now, or what is wrong, naming the field or object concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The cluster's conditions, as Kubernetes conventions describe them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Internal state of every replica StatefulSet, keyed by its name. For the operator's own
    /// use only: other components must not read it (they read `members`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replica_state_map: BTreeMap<ReplicaName, ReplicaStatus>,
    /// The public, versioned part of the status: the server and Keeper pods the cluster should
    /// be running now. The metrics exporter and other components read this, never
    /// `replicaStateMap`, so that another operator version cannot break them
    /// (docs/monitoring.md, "The status the exporter reads"). Written by every status write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Members>,
    /// Creation index the next new replica gets; replica names are never reused.
    #[serde(default)]
    pub next_replica_index: i64,
    /// The server pods: asked for, Ready, Ready on the current revision.
    #[serde(default)]
    pub clickhouse: ComponentStatus,
    /// The Keeper pods: asked for, Ready, Ready on the current revision.
    #[serde(default)]
    pub keeper: ComponentStatus,
    /// The cluster endpoint, the client Service's address: `<cluster>.<namespace>.svc.<domain>`,
    /// or for a `LoadBalancer` the IP or hostname of its ingress once it has one. Unset while
    /// the Service does not exist (or has no ingress yet) and when `clientService.enabled` is
    /// false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The schema policy in force after normalisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_policy: Option<EffectiveSchemaPolicy>,
    /// The root path in the external Keeper (`spec.keeper.external`) that the operator created;
    /// the servers start once it exists, and it is removed with the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper_root: Option<String>,
    /// Automatic upgrades (`spec.upgradeOptions`): the last check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
    /// The lowest ClickHouse version the servers report (`SELECT version()`), once every one
    /// has answered; what version-dependent configuration relies on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The last one-shot rolling restart asked for (the annotation
    /// `clickhouse.com/restart-at` of the cluster, a timestamp): the server pods carry it in
    /// their template, so each value restarts them once, in Smart Update order, and removing
    /// the annotation restarts nothing (decision 51).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
    /// The storage classes the operator's defaults (`clusterDefaults` of the chart) gave this
    /// cluster's volumes when they were first made, kept for the cluster's life: a default
    /// changed later reaches new clusters only, since a volume's class cannot change (decision
    /// 59). Absent when the defaults named no class then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_storage_classes: Option<StorageClasses>,
}

/// The version of [`Members`] this operator writes.
pub const MEMBERS_VERSION: u32 = 1;

/// `status.members`: the pods the cluster should be running now, for other components. Within
/// one `version` fields are only added; a field removed or given another meaning comes with a
/// new version, and a reader that does not know it must not use the lists.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Members {
    /// The version of this part's shape: 1.
    pub version: u32,
    /// The servers that should run: one per replica that is neither stopped (paused) nor being
    /// removed, including one still being created; none while the cluster stops.
    #[serde(default)]
    pub servers: Vec<ServerMember>,
    /// The cluster's own Keeper members that should run; none while the cluster stops or with
    /// an external Keeper.
    #[serde(default)]
    pub keeper: Vec<KeeperMember>,
}

/// A server the cluster should be running.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerMember {
    /// The shard's index (the pod's label `clickhouse.com/shard`).
    pub shard: i32,
    /// The replica's name (its StatefulSet; the pod's label `clickhouse.com/replica`).
    pub replica: String,
    /// The server's pod.
    pub pod: String,
}

/// A Keeper member the cluster should be running.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeeperMember {
    /// The member's pod.
    pub pod: String,
}

/// Storage classes for the volumes whose spec names none (decision 59).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageClasses {
    /// For the servers' volumes: the data volume, its disks and the log volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// For the Keeper members' volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keeper: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterState {
    #[default]
    Initializing,
    Ready,
    Paused,
    Stopping,
    Error,
    /// `spec.suspend`: the operator changes nothing.
    Suspended,
}

impl std::fmt::Display for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClusterState::Initializing => "initializing",
            ClusterState::Ready => "ready",
            ClusterState::Paused => "paused",
            ClusterState::Stopping => "stopping",
            ClusterState::Error => "error",
            ClusterState::Suspended => "suspended",
        })
    }
}

/// A status condition, as Kubernetes conventions describe it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, e.g. `Ready`.
    pub r#type: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, as one CamelCase word.
    #[serde(default)]
    pub reason: String,
    /// Why, in words.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` the condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One replica StatefulSet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// The shard's index.
    pub shard: ShardIndex,
    /// `Pending`, `Ready`, `Stopped` or `Condemned` (being removed).
    pub state: ReplicaState,
    /// The shard's backup replica: backups run on it, and a rollout restarts it last.
    #[serde(default)]
    pub is_backup_pod: bool,
    /// Creation index: orders replicas by age (names carry no ordinal).
    pub index: i64,
    /// For a Condemned replica: the last scale-in step completed, so that a restarted operator
    /// resumes where it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_in_step: Option<ScaleInStep>,
    /// For a Condemned replica: replaced at the user's request (the cluster's annotation
    /// `clickhouse.com/replace-replicas`, decision 54). Its pod and volumes are given up, so
    /// its removal neither waits for it nor asks anything of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

/// The steps of removing a replica, in order (S0-21…S0-30, decisions 2 and 3).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum ScaleInStep {
    /// Out of the client Service and of topology-spread calculations.
    OutOfTraffic,
    /// Its shard's replicated tables were synced on the shard's backup replica.
    Synced,
    /// Its replicated tables, views and dictionaries were dropped on it (`DROP … SYNC`).
    TablesDropped,
    /// Its StatefulSet and ConfigMap were deleted.
    Deleted,
    /// Its metadata was dropped from Keeper by a surviving replica.
    KeeperCleaned,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum ReplicaState {
    Pending,
    Ready,
    Stopped,
    Condemned,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// Pods the spec asks for.
    pub size: i32,
    /// Pods that are Ready (serving), whatever their revision.
    pub ready: i32,
    /// Ready pods that also run the current revision and configuration.
    #[serde(default)]
    pub updated: i32,
    /// `ready/size`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_text: Option<String>,
}

impl ComponentStatus {
    pub fn new(size: i32, ready: i32, updated: i32) -> Self {
        ComponentStatus {
            size,
            ready,
            updated,
            ready_text: Some(format!("{ready}/{size}")),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveSchemaPolicy {
    /// What is copied onto a new replica: `None` or `All`.
    pub replica: String,
    /// What is copied onto a new shard: `None`, `All` or `DistributedTablesOnly`.
    pub shard: String,
}
