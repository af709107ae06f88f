//! PURE: what a pass observed, read once. The controller lists the cluster's objects into an
//! [`Observed`]; [`Facts::read`] turns the pods, StatefulSets and PVCs into typed facts (per
//! server replica, for the Keeper ensemble, and the cluster's [`Mode`]). Every phase of a pass
//! reads these facts; no phase looks at a pod or a StatefulSet itself.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::api::ClickHouseCluster;
use crate::model::{Inputs, labels, names};

/// How long a pod may stay unschedulable before a rollout reports a failure (S2-31).
pub const UNSCHEDULABLE_GRACE: SignedDuration = SignedDuration::from_secs(120);

/// Declares [`Kind`] from the names of its variants, each the Kubernetes kind it stands for.
macro_rules! kinds {
    ($($kind:ident),* $(,)?) => {
        /// Kinds of a cluster's objects the operator reads and writes: those it builds (applied
        /// and deleted by the plan's steps) and the pods and PVCs it acts on. The controller's
        /// table of them (`controller::kinds`) gives each its type, its caches and its watch.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Kind {
            $($kind,)*
        }

        impl Kind {
            /// Every kind.
            pub const ALL: &[Kind] = &[$(Kind::$kind,)*];

            /// The Kubernetes kind.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Kind::$kind => stringify!($kind),)*
                }
            }
        }
    };
}

kinds!(
    ConfigMap,
    Secret,
    Service,
    StatefulSet,
    PodDisruptionBudget,
    NetworkPolicy,
    Pod,
    PersistentVolumeClaim,
);

/// What the controller read for a pass, beyond the cluster itself.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The operator-level default storage classes now (decision 59).
    pub default_storage_classes: crate::api::StorageClasses,
    /// Server and Keeper StatefulSets of the cluster, by name.
    pub statefulsets: BTreeMap<String, StatefulSet>,
    /// Pods of the cluster, by name.
    pub pods: BTreeMap<String, Pod>,
    /// The other objects the cluster owns (ConfigMaps, Secrets, Services, PDBs, NetworkPolicies)
    /// as JSON, by kind and name.
    pub objects: BTreeMap<(Kind, String), Value>,
    /// PVCs of the cluster, by name.
    pub pvcs: BTreeMap<String, PersistentVolumeClaim>,
    /// A ClickHouseBackup of the cluster that is Starting or Running.
    pub backup_in_flight: Option<String>,
    /// The replicas the ClickHouseBackups of the cluster that are Starting or Running read
    /// from (each shard's recorded replica), with `backup <name>`: none of them is condemned
    /// until the backup ends (decision 77).
    pub backup_reads: BTreeMap<String, String>,
    /// Replication caught up, per replica, where it was checked.
    pub caught_up: BTreeMap<String, bool>,
    /// Per Ready replica: how many hosts its server lists in the cluster's `remote_servers`
    /// (`system.clusters`), `None` when it could not say. The cluster is ready only once every
    /// server has loaded the current list.
    pub cluster_hosts: BTreeMap<String, Option<u64>>,
    /// Per Ready replica that answered: the version its server reports (`SELECT version()`).
    /// What the configuration may rely on is decided from these, never from the image tag
    /// alone (see [`crate::plan::fleet`]).
    pub server_versions: BTreeMap<String, String>,
    /// Per replica whose pod was taken out of traffic for a restart: how many parts the other
    /// Ready replicas of its shard still have to fetch from it (`None`: could not tell).
    pub pending_fetches: BTreeMap<String, Option<u64>>,
    /// Per Keeper pod asked this pass: the ensemble as it lists it.
    pub keeper_views: BTreeMap<String, MemberView>,
    /// Per Keeper pod asked this pass (with its view): its part in the ensemble.
    pub keeper_roles: BTreeMap<String, KeeperRole>,
    /// Per Ready replica, while the cluster is not `ready`: why it is not usable, a query
    /// through it not reaching every shard or a replicated table of it read-only (`None`: it
    /// is usable). `ready` means usable (invariant 10).
    pub distributed: BTreeMap<String, Option<String>>,
    /// Per Ready replica, while the cluster is not `ready`: its replicated tables (database,
    /// table) that are read-only only because the Keeper session they had expired, while
    /// Keeper answers their server (decision 45).
    pub stalled_tables: BTreeMap<String, Vec<(String, String)>>,
    /// Per pod whose container keeps crashing: the last error line of its previous run's log
    /// (read only for such pods), as [`last_error`] finds it.
    pub crash_logs: BTreeMap<String, String>,
    /// While a condemned replica is still to be synced and emptied, and the client Service
    /// exists: the server pods its EndpointSlices list (under any condition), or why they could
    /// not be read. `None` when not read. A replica's tables are dropped only once no slice
    /// lists its pod (S0-22, decision 75).
    pub client_routes: Option<Result<std::collections::BTreeSet<String>, String>>,
    /// What the builders need (secrets, passwords); `replicas` is filled by the pass.
    pub inputs: Inputs,
    /// The operator's Secret exists (its password is in `inputs`).
    pub operator_secret_present: bool,
    /// It exists and the cluster is not among its owners: kept, with the retained volumes, from
    /// a deleted cluster of the same name.
    pub operator_secret_orphaned: bool,
    /// Referenced Secrets that do not exist: field → Secret name.
    pub missing_secrets: Vec<(String, String)>,
    /// The Keeper identity the servers were given, as written in the users Secret (escaped);
    /// `None` while they have none.
    pub keeper_identity_in_use: Option<String>,
    /// For `keeper.external.clusterRef` to another namespace: what the referenced cluster says
    /// to this one; `None` without such a reference.
    pub keeper_owner: Option<KeeperOwner>,
    /// For `keeper.external.nodes`: the ClickHouseCluster of another namespace (namespace,
    /// name) whose Keeper a listed member is (its Keeper Service or one of its Keeper pods, by
    /// name or address), which [`Observed::keeper_owner`] then answers for as for a
    /// `clusterRef` (decision 71, review M-4); `None` when no member is one.
    pub keeper_nodes_of: Option<(String, String)>,
    /// Whether the exporter's credentials as published for it (`EXPORTER_CREDENTIALS_SECRET`)
    /// are the current ones; `None` where none are published.
    pub exporter_credentials_published: Option<bool>,
}

/// What the cluster whose Keeper another one references says to it (decision 38).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeeperOwner {
    /// It lists the referencing namespace in `spec.keeper.allowedNamespaces`.
    Allows,
    /// It does not.
    Refuses,
    /// There is no such ClickHouseCluster (or the operator cannot read it).
    Missing,
}

/// What the cluster as a whole is doing, from the spec and the pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Serving, or starting to.
    Running,
    /// `spec.pause` is set and pods still run.
    Pausing,
    /// `spec.pause` is set and no pod is left.
    Paused,
    /// `spec.tls.enabled` changed: every server stops before all start again (S2-23).
    SwitchingTls,
}

impl Mode {
    /// The spec asks for the cluster to be stopped.
    pub fn paused(self) -> bool {
        matches!(self, Mode::Pausing | Mode::Paused)
    }
}

/// One pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    pub exists: bool,
    /// Its uid: a restart deletes this pod only, never its replacement.
    pub uid: Option<String>,
    /// Ready (and not being deleted).
    pub ready: bool,
    /// Being deleted: a restart asked for is under way.
    pub terminating: bool,
    /// In the client Service's traffic (label `clickhouse.com/serving`).
    pub serving: bool,
    /// When it last became Ready.
    pub ready_since: Option<Timestamp>,
    /// When the node started it (`status.startTime`): when its volumes were last mounted.
    pub started: Option<Timestamp>,
    /// On its StatefulSet's update revision, and the StatefulSet's status is up to date.
    pub current: bool,
    /// On an older revision than its StatefulSet's update revision, and the StatefulSet's
    /// status is up to date (neither `current` nor `outdated` while that status lags).
    pub outdated: bool,
    /// Why it cannot run, when it cannot (S2-31, S2-39).
    pub failing: Option<String>,
    /// The scheduler's reason while it is not scheduled (S2-39).
    pub unschedulable: Option<String>,
    /// Its node stopped reporting: said for the status, nothing else follows from it (see
    /// [`node_lost`]).
    pub node_lost: Option<String>,
    /// Its IP address, once it has one.
    pub address: Option<String>,
}

/// A PVC.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PvcFacts {
    pub name: String,
    /// The requested size.
    pub size: Option<String>,
    /// Its labels and annotations.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The volume is being expanded (condition `Resizing`).
    pub resizing: bool,
    /// The file system waits for the pod to (re)start to grow (`FileSystemResizePending`).
    pub file_system_resize_pending: bool,
    /// Since when (the condition's `lastTransitionTime`).
    pub file_system_resize_pending_since: Option<Timestamp>,
    /// Bound to a volume (it may hold data); a claim never bound never held any.
    pub bound: bool,
}

/// One server replica: its StatefulSet, pod and data PVC.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerFacts {
    /// The StatefulSet as observed, as JSON.
    pub statefulset: Option<Value>,
    /// Its `spec.replicas`.
    pub scale: Option<i32>,
    /// It is being deleted.
    pub deleting: bool,
    /// Its pod template serves HTTPS (it was written with `spec.tls.enabled`).
    pub serves_tls: bool,
    /// Its claim templates by name (`data`, `disk-<name>`, `logs`).
    pub claims: BTreeMap<String, Claim>,
    pub pod: PodFacts,
    /// The PVCs of its pod, by the name of the claim template they come from.
    pub pvcs: BTreeMap<String, PvcFacts>,
}

impl ServerFacts {
    /// Decision 44: a volume of its pod was grown and its driver grows the file system only
    /// when the volume is mounted again (`FileSystemResizePending`), and the pod has not been
    /// started since: only a restart completes the resize. A pod started after the condition
    /// appeared has had its chance, so a condition that stays asks for no further restart.
    pub fn file_system_waits_for_restart(&self) -> bool {
        self.pod.exists
            && self.pvcs.values().any(|v| {
                v.file_system_resize_pending
                    && matches!(
                        (self.pod.started, v.file_system_resize_pending_since),
                        (Some(started), Some(since)) if started < since
                    )
            })
    }
}

/// What a claim template asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claim {
    pub size: Option<String>,
    pub class: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// One pod of the Keeper ensemble.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeeperMember {
    pub pod: String,
    pub uid: Option<String>,
    pub ready: bool,
    /// Since when it is Ready.
    pub ready_since: Option<Timestamp>,
    /// Being deleted: a restart asked for is under way.
    pub terminating: bool,
    /// On the StatefulSet's current revision.
    pub current: bool,
    /// On a revision older than the StatefulSet's current one (its status is up to date).
    pub old_revision: bool,
    /// The ensemble as this member's committed configuration lists it.
    pub view: MemberView,
    /// Its part in the ensemble, as its `mntr` says (asked with the view).
    pub role: KeeperRole,
    /// Why it cannot run, when it cannot (as [`PodFacts::failing`]), or that its node stopped
    /// reporting ([`node_lost`]).
    pub failing: Option<String>,
    /// Its node stopped reporting ([`node_lost`]): down, and nothing is done to it.
    pub node_lost: bool,
    /// Not Ready and its container keeps exiting or being killed: waiting in
    /// `CrashLoopBackOff`, or restarted [`CRASH_LOOP_RESTARTS`] times or more.
    pub crash_looping: bool,
}

/// Restarts of a container that is not Ready that count as a crash loop.
pub const CRASH_LOOP_RESTARTS: i32 = 2;

/// Is pod `p` not Ready with a container that keeps exiting ([`KeeperMember::crash_looping`])?
pub fn crash_looping(p: &Pod) -> bool {
    if pod_ready(p) || p.metadata.deletion_timestamp.is_some() {
        return false;
    }
    p.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|c| {
            c.restart_count >= CRASH_LOOP_RESTARTS
                || c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
        })
}

/// What one Keeper member says the ensemble is (decision 25).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MemberView {
    /// Not asked (not running, or not needed this pass) or did not answer.
    #[default]
    Unknown,
    /// A Keeper too old to publish its configuration: only Readiness can be trusted.
    Unpublished,
    /// The raft ids of the voting members it lists.
    Voters(Vec<u32>),
}

/// A Keeper member's part in the ensemble, as its `mntr` four-letter word reports it
/// (`zk_server_state`; the leader also counts `zk_synced_followers`: the followers that
/// have caught up with its log and follow it). ClickHouse Keeper and ZooKeeper answer alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeeperRole {
    /// Not asked, did not answer, or not serving (no quorum, or still syncing).
    #[default]
    Unknown,
    Follower,
    Leader {
        synced_followers: u32,
    },
    /// An ensemble of one.
    Standalone,
}

impl KeeperRole {
    /// Reads an `mntr` answer (`key<TAB>value` lines). A member that is not serving answers
    /// with a line of prose instead: [`KeeperRole::Unknown`].
    pub fn from_mntr(text: &str) -> KeeperRole {
        let value = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once('\t')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        match value("zk_server_state").as_deref() {
            Some("leader") => KeeperRole::Leader {
                synced_followers: value("zk_synced_followers")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            },
            Some("follower") => KeeperRole::Follower,
            Some("standalone") => KeeperRole::Standalone,
            _ => KeeperRole::Unknown,
        }
    }

    pub fn describe(&self) -> &'static str {
        match self {
            KeeperRole::Unknown => "not serving",
            KeeperRole::Follower => "follower",
            KeeperRole::Leader { .. } => "leader",
            KeeperRole::Standalone => "standalone",
        }
    }
}

/// The Keeper ensemble.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeeperFacts {
    pub exists: bool,
    /// The StatefulSet as observed, as JSON.
    pub statefulset: Option<Value>,
    /// It is being deleted.
    pub deleting: bool,
    /// Its claim templates by name (`data`, `logs`).
    pub claims: BTreeMap<String, Claim>,
    /// The PVCs of its pods `0..size`, with the claim template each comes from.
    pub pvcs: Vec<(String, PvcFacts)>,
    /// Members its StatefulSet runs now (`spec.replicas`).
    pub size: i32,
    /// Its pods, by ordinal.
    pub members: BTreeMap<i32, KeeperMember>,
    /// The members were asked for their view this pass (they are not on a settled cluster).
    pub views_read: bool,
}

impl KeeperFacts {
    /// Every member of the current size is Ready.
    pub fn all_ready(&self) -> bool {
        (0..self.size).all(|i| self.members.get(&i).is_some_and(|m| m.ready))
    }

    /// Every member of the current size is Ready on the current revision.
    pub fn all_ready_and_current(&self) -> bool {
        (0..self.size).all(|i| self.members.get(&i).is_some_and(|m| m.ready && m.current))
    }

    /// Members `0..n` are Ready and each lists exactly the raft ids `1..=n` as the voting
    /// members (or cannot tell, being too old to publish it): a membership change to `n`
    /// members has been loaded and committed by all of them.
    pub fn acknowledged(&self, n: i32) -> bool {
        let want: Vec<u32> = (1..=n.max(0) as u32).collect();
        (0..n).all(|i| {
            self.members.get(&i).is_some_and(|m| {
                m.ready
                    && match &m.view {
                        MemberView::Voters(v) => *v == want,
                        MemberView::Unpublished => true,
                        MemberView::Unknown => false,
                    }
            })
        })
    }

    /// The first of members `0..n` that does not list `1..=n`, with what it lists.
    pub fn unacknowledged(&self, n: i32) -> Option<(String, MemberView)> {
        let want: Vec<u32> = (1..=n.max(0) as u32).collect();
        (0..n).find_map(|i| {
            let m = self.members.get(&i)?;
            match &m.view {
                MemberView::Voters(v) if *v == want => None,
                MemberView::Unpublished => None,
                v => Some((m.pod.clone(), v.clone())),
            }
        })
    }

    /// Members among the first `n` that are Ready on the current revision.
    pub fn ready_and_current_of(&self, n: i32) -> i32 {
        (0..n)
            .filter(|i| self.members.get(i).is_some_and(|m| m.ready && m.current))
            .count() as i32
    }
}

/// Everything a pass knows about the world.
#[derive(Clone, Debug)]
pub struct Facts {
    pub mode: Mode,
    /// Per server replica (every StatefulSet observed and every replica of the map).
    pub servers: BTreeMap<String, ServerFacts>,
    pub keeper: KeeperFacts,
    /// Every pod's scheduling problem, in name order.
    pub unschedulable: Vec<String>,
    /// How many pods of the cluster exist.
    pub pods: usize,
}

static NO_SERVER: std::sync::LazyLock<ServerFacts> = std::sync::LazyLock::new(ServerFacts::default);

impl Facts {
    /// Reads what was observed.
    pub fn read(cluster: &ClickHouseCluster, obs: &Observed, now: Timestamp) -> Facts {
        let name = cluster.metadata.name.clone().unwrap_or_default();
        let keeper_name = names::keeper(&name);
        let map = cluster
            .status
            .as_ref()
            .map(|s| &s.replica_state_map)
            .cloned()
            .unwrap_or_default();
        let mut servers = BTreeMap::new();
        for n in obs
            .statefulsets
            .keys()
            .map(String::as_str)
            .filter(|n| *n != keeper_name)
            .chain(map.keys().map(|n| n.as_str()))
        {
            servers.insert(n.to_string(), server(obs, n, now));
        }
        let keeper = match obs.statefulsets.get(&keeper_name) {
            None => KeeperFacts::default(),
            Some(k) => {
                let size = k.spec.replicas.unwrap_or(0);
                // pods beyond both sizes too: a member still leaving
                let prefix = format!("{keeper_name}-");
                let beyond = obs
                    .pods
                    .keys()
                    .filter_map(|p| p.strip_prefix(&prefix)?.parse::<i32>().ok())
                    .map(|o| o + 1)
                    .max()
                    .unwrap_or(0);
                let top = size.max(cluster.spec.keeper.replicas).max(beyond);
                let members = (0..top)
                    .filter_map(|i| {
                        let pod = format!("{keeper_name}-{i}");
                        let p = obs.pods.get(&pod)?;
                        let member = KeeperMember {
                            uid: p.metadata.uid.clone(),
                            ready: pod_ready(p),
                            ready_since: ready_since(p),
                            terminating: p.metadata.deletion_timestamp.is_some(),
                            current: pod_current(k, p),
                            old_revision: old_revision(k, p),
                            view: obs.keeper_views.get(&pod).cloned().unwrap_or_default(),
                            role: obs.keeper_roles.get(&pod).copied().unwrap_or_default(),
                            failing: pod_failing(p, now, obs).or_else(|| node_lost(p)),
                            node_lost: node_lost(p).is_some(),
                            crash_looping: crash_looping(p),
                            pod,
                        };
                        Some((i, member))
                    })
                    .collect();
                let json = serde_json::to_value(k).expect("Kubernetes objects serialise");
                let claims = claims(&json);
                let pvcs = (0..size.max(0))
                    .flat_map(|i| {
                        pod_pvcs(obs, &claims, &format!("{keeper_name}-{i}")).collect::<Vec<_>>()
                    })
                    .collect();
                KeeperFacts {
                    exists: true,
                    statefulset: Some(json),
                    deleting: k.metadata.deletion_timestamp.is_some(),
                    claims,
                    pvcs,
                    size,
                    members,
                    views_read: !obs.keeper_views.is_empty(),
                }
            }
        };
        let spec = &cluster.spec;
        let mode = if spec.pause {
            if obs.pods.is_empty() {
                Mode::Paused
            } else {
                Mode::Pausing
            }
        } else if servers.iter().any(|(n, s)| {
            map.contains_key(n.as_str())
                && s.statefulset.is_some()
                && s.scale != Some(0)
                && s.serves_tls != spec.tls.enabled
        }) {
            Mode::SwitchingTls
        } else {
            Mode::Running
        };
        Facts {
            mode,
            servers,
            keeper,
            unschedulable: obs.pods.values().filter_map(unschedulable).collect(),
            pods: obs.pods.len(),
        }
    }

    /// The facts of one server replica (all false when nothing of it was observed).
    pub fn server(&self, replica: &str) -> &ServerFacts {
        self.servers.get(replica).unwrap_or(&NO_SERVER)
    }
}

fn server(obs: &Observed, replica: &str, now: Timestamp) -> ServerFacts {
    let sts = obs.statefulsets.get(replica);
    let pod = obs.pods.get(&names::replica_pod(replica));
    let json = sts.map(|s| serde_json::to_value(s).expect("Kubernetes objects serialise"));
    let claims = json.as_ref().map(claims).unwrap_or_default();
    let pvcs = pod_pvcs(obs, &claims, &names::replica_pod(replica)).collect();
    ServerFacts {
        scale: sts.and_then(|s| s.spec.replicas),
        deleting: sts.is_some_and(|s| s.metadata.deletion_timestamp.is_some()),
        serves_tls: json
            .as_ref()
            .is_some_and(|j| serves_tls(&j["spec"]["template"])),
        claims,
        statefulset: json,
        pod: match pod {
            None => PodFacts::default(),
            Some(p) => PodFacts {
                exists: true,
                uid: p.metadata.uid.clone(),
                ready: pod_ready(p),
                terminating: p.metadata.deletion_timestamp.is_some(),
                serving: p
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(labels::SERVING)),
                ready_since: ready_since(p),
                started: p
                    .status
                    .as_ref()
                    .and_then(|s| s.start_time.as_ref())
                    .map(|t| t.0),
                current: sts.is_some_and(|s| pod_current(s, p)),
                outdated: sts.is_some_and(|s| old_revision(s, p)),
                failing: pod_failing(p, now, obs),
                unschedulable: unschedulable(p),
                node_lost: node_lost(p),
                address: p.status.as_ref().and_then(|s| s.pod_ip.clone()),
            },
        },
        pvcs,
    }
}

/// The PVCs of pod `pod` that exist, by the claim template (of `claims`) each comes from.
fn pod_pvcs<'a>(
    obs: &'a Observed,
    claims: &'a BTreeMap<String, Claim>,
    pod: &'a str,
) -> impl Iterator<Item = (String, PvcFacts)> + 'a {
    claims.keys().filter_map(move |template| {
        let name = format!("{template}-{pod}");
        Some((template.clone(), pvc_facts(&name, obs.pvcs.get(&name)?)))
    })
}

/// The facts of the PVC `name`.
pub fn pvc_facts(name: &str, p: &PersistentVolumeClaim) -> PvcFacts {
    PvcFacts {
        name: name.to_string(),
        size: p
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
            .map(|q| q.0.clone()),
        labels: p.metadata.labels.clone().unwrap_or_default(),
        annotations: p.metadata.annotations.clone().unwrap_or_default(),
        // in progress: said by the resizer's condition, or not said yet (the claim grown,
        // the volume not reported at its size), unless only a mount can finish it
        resizing: pvc_condition(p, "Resizing")
            || (!pvc_condition(p, "FileSystemResizePending") && smaller_than_requested(p)),
        file_system_resize_pending: pvc_condition(p, "FileSystemResizePending"),
        bound: p.spec.as_ref().is_some_and(|s| s.volume_name.is_some())
            || p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
        file_system_resize_pending_since: p
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .find(|c| c.type_ == "FileSystemResizePending" && c.status == "True")
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0),
    }
}

/// The claim's reported capacity is below its request (a bound claim being grown).
fn smaller_than_requested(p: &PersistentVolumeClaim) -> bool {
    use crate::util::quantity::parse_bytes;
    let requested = p
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .and_then(|q| parse_bytes(&q.0));
    let capacity = p
        .status
        .as_ref()
        .filter(|s| s.phase.as_deref() == Some("Bound"))
        .and_then(|s| s.capacity.as_ref()?.get("storage"))
        .and_then(|q| parse_bytes(&q.0));
    matches!((capacity, requested), (Some(c), Some(r)) if c < r)
}

fn pvc_condition(p: &PersistentVolumeClaim, type_: &str) -> bool {
    p.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Is the pod Ready (and not being deleted)?
pub fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ready_since(p: &Pod) -> Option<Timestamp> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// The StatefulSet's status is up to date, its update revision, and the pod's revision.
fn revisions<'a>(sts: &'a StatefulSet, p: &'a Pod) -> (bool, Option<&'a str>, Option<&'a str>) {
    let status = sts.status.as_ref();
    let settled = status.and_then(|s| s.observed_generation) == sts.metadata.generation;
    let update = status.and_then(|s| s.update_revision.as_deref());
    let pod_rev = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("controller-revision-hash"))
        .map(String::as_str);
    (settled, update, pod_rev)
}

/// Pod on its StatefulSet's current revision (and the StatefulSet's status is up to date).
fn pod_current(sts: &StatefulSet, p: &Pod) -> bool {
    let (settled, update, pod_rev) = revisions(sts, p);
    settled && update.is_some() && update == pod_rev
}

/// Pod on a revision older than its StatefulSet's current one, as far as the StatefulSet's
/// up-to-date status tells.
fn old_revision(sts: &StatefulSet, p: &Pod) -> bool {
    let (settled, update, pod_rev) = revisions(sts, p);
    settled && update.is_some() && pod_rev != update
}

/// Why a pod cannot run, if it cannot (S2-31, S2-39). A container that keeps crashing is
/// reported with the last error its log shows (read from its previous run's log, else from its
/// termination message, which is its log's tail, `FallbackToLogsOnError`), with every
/// credential the cluster uses masked (decision 30). End to end, under writes:
/// `faults::reverting_bad_server_changes_heals_under_write_load` (`ErrImagePull` /
/// `ImagePullBackOff` and `CrashLoopBackOff` put the cluster in `error` naming the pod, a revert
/// heals it), `recovery::an_unschedulable_pod_is_named_…` (the two-minute rule).
/// A pod not Ready whose containers are all, as last reported, running and ready: only the
/// node controller marks such a pod not Ready, when the pod's node stops reporting (lost,
/// stopped, cut off). The replica is down for its clients; the operator says so and does
/// nothing to the pod, its StatefulSet or its volumes (decision 47).
pub fn node_lost(p: &Pod) -> Option<String> {
    let st = p.status.as_ref()?;
    let not_ready = st
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "False");
    let containers = st.container_statuses.as_deref().unwrap_or_default();
    let last_seen_up = !containers.is_empty()
        && containers
            .iter()
            .all(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()));
    (not_ready && last_seen_up && p.metadata.deletion_timestamp.is_none()).then(|| {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("its node");
        format!(
            "pod {}: node {node} stopped reporting (the pod was last seen running)",
            p.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

fn pod_failing(p: &Pod, now: Timestamp, obs: &Observed) -> Option<String> {
    let inputs = &obs.inputs;
    let name = p.metadata.name.clone().unwrap_or_default();
    let st = p.status.as_ref()?;
    for cs in st.container_statuses.iter().flatten() {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or("");
            if !matches!(
                reason,
                "CrashLoopBackOff"
                    | "ErrImagePull"
                    | "ImagePullBackOff"
                    | "InvalidImageName"
                    | "CreateContainerConfigError"
            ) {
                continue;
            }
            let ended = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            let detail = match ended {
                Some(t) if reason == "CrashLoopBackOff" => {
                    let mut d = format!("container {} exited with code {}", cs.name, t.exit_code);
                    let logged = obs.crash_logs.get(&name).cloned();
                    if let Some(line) = logged.or_else(|| t.message.as_deref().and_then(last_error))
                    {
                        d.push_str(": ");
                        d.push_str(&line);
                    }
                    d
                }
                _ => w.message.clone().unwrap_or_default(),
            };
            return Some(redact(format!("pod {name}: {reason}: {detail}"), inputs));
        }
    }
    let sched = st.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    })?;
    let since = sched.last_transition_time.as_ref()?.0;
    (now.duration_since(since) > UNSCHEDULABLE_GRACE).then(|| {
        format!(
            "pod {name} has been unschedulable for more than 2 minutes: {}",
            sched.message.as_deref().unwrap_or("")
        )
    })
}

/// The longest excerpt of a log line a status carries.
const LOG_LINE_MAX: usize = 300;

/// The last line of `log` that reports an error (ClickHouse's `<Error>` and `<Fatal>` levels,
/// one that names an exception first: a bare system error such as `Application: Invalid
/// argument` that a server may log while it shuts down after the exception says less; else an
/// exception that is not a frame of a stack trace), else its last line, without the timestamp
/// and thread prefix, as [`crate::util::text::excerpt`] cuts it to [`LOG_LINE_MAX`] bytes.
pub fn last_error(log: &str) -> Option<String> {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let frame = |l: &str| {
        l.split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let errors = || {
        lines
            .iter()
            .rev()
            .filter(|l| l.contains("<Error>") || l.contains("<Fatal>"))
    };
    let line = errors()
        .find(|l| l.contains("Exception"))
        .or_else(|| errors().next())
        .or_else(|| {
            lines
                .iter()
                .rev()
                .find(|l| l.contains("Exception") && !frame(l))
        })
        .or(lines.last())?;
    let text = ["<Fatal> ", "<Error> "]
        .iter()
        .find_map(|level| line.split_once(level).map(|(_, rest)| rest))
        .unwrap_or(line);
    Some(crate::util::text::excerpt(text, LOG_LINE_MAX).to_string())
}

/// `text` with every password of `inputs` and every line of the Secrets it read (of 8 bytes or
/// more) hidden ([`crate::util::redact::Redactor`]): what a pod writes may repeat a credential,
/// and none may reach a status or an Event.
pub fn redact(text: String, inputs: &crate::model::Inputs) -> String {
    let mut r = crate::util::redact::Redactor::new();
    let passwords = [
        Some(&inputs.operator_password),
        inputs.interserver_password.as_ref(),
        inputs.cluster_password.as_ref(),
        inputs.keeper_password.as_ref(),
        inputs.cluster_secret.as_ref(),
        inputs.exporter_password.as_ref(),
    ];
    for p in passwords
        .into_iter()
        .flatten()
        .chain(inputs.user_passwords.values())
    {
        r.add(&p.0);
    }
    for value in inputs.secrets.values().flat_map(|d| d.values()) {
        for line in String::from_utf8_lossy(value).lines() {
            if line.trim().len() >= 8 {
                r.add(line);
            }
        }
    }
    r.scrub(&text)
}

/// The scheduler's reason for a pending pod (S2-39).
fn unschedulable(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            format!(
                "pod {} cannot be scheduled: {}",
                p.metadata.name.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            )
        })
}

/// Does a server pod template serve HTTPS (`spec.tls.enabled` when it was written)?
pub fn serves_tls(template: &Value) -> bool {
    template["spec"]["containers"][0]["ports"]
        .as_array()
        .is_some_and(|ports| {
            ports
                .iter()
                .any(|p| p["containerPort"] == names::HTTPS_PORT)
        })
}

/// A StatefulSet's claim templates (observed or desired, as JSON), by name.
pub fn claims(sts: &Value) -> BTreeMap<String, Claim> {
    let map = |v: &Value| -> BTreeMap<String, String> {
        serde_json::from_value(v.clone()).unwrap_or_default()
    };
    sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let name = t["metadata"]["name"].as_str()?.to_string();
            let spec = &t["spec"];
            Some((
                name,
                Claim {
                    size: spec["resources"]["requests"]["storage"]
                        .as_str()
                        .map(str::to_string),
                    class: spec["storageClassName"].as_str().map(str::to_string),
                    labels: map(&t["metadata"]["labels"]),
                    annotations: map(&t["metadata"]["annotations"]),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Inputs, Password};
    use serde_json::json;

    fn crash_looping(log: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "c1-0-0-0"},
            "status": {"containerStatuses": [{
                "name": "clickhouse", "image": "i", "imageID": "", "ready": false,
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": "back-off 40s restarting failed container"}},
                "lastState": {"terminated": {"exitCode": 70, "message": log}}
            }]}
        }))
        .unwrap()
    }

    fn on_node(ready: &str, container_ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "c1-0-0-0"},
            "spec": {"nodeName": "node-2", "containers": []},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": [{
                    "name": "clickhouse", "image": "i", "imageID": "", "ready": container_ready,
                    "restartCount": 0, "state": {"running": {}}
                }]}
        }))
        .unwrap()
    }

    /// Decision 47: a pod the node controller marked not Ready while its containers were last
    /// seen running and ready is on a node that stopped reporting, and is said to be; a pod
    /// whose own container is not ready (the kubelet said so) is not, nor is a Ready one.
    #[test]
    fn a_pod_whose_node_stopped_reporting_is_named_with_its_node() {
        assert_eq!(
            node_lost(&on_node("False", true)).as_deref(),
            Some("pod c1-0-0-0: node node-2 stopped reporting (the pod was last seen running)")
        );
        assert_eq!(node_lost(&on_node("False", false)), None);
        assert_eq!(node_lost(&on_node("True", true)), None);
    }

    /// Decision 30: a server that keeps crashing is reported with the last error of its
    /// log (its termination message), without the timestamp, and without any credential the
    /// line repeats.
    #[test]
    fn a_crash_loop_is_reported_with_the_last_error_of_the_log_and_no_credential() {
        let log = "2026.12.03 10:00:00.1 [ 1 ] {} <Information> Application: starting\n\
                   2026.12.03 10:00:01.2 [ 1 ] {} <Error> Application: Coordination::Exception: Not authenticated, path: /clickhouse/tables/0/default/events\n\
                   2026.12.03 10:00:01.3 [ 1 ] {} <Error> Application: DB::Exception: digest clickhouse:s3cr3t-keeper refused\n\
                   2026.12.03 10:00:01.4 [ 1 ] {} <Information> Application: shutting down\n";
        let obs = Observed {
            inputs: Inputs {
                keeper_password: Some(Password("s3cr3t-keeper".into())),
                ..Inputs::default()
            },
            ..Observed::default()
        };
        let why = pod_failing(&crash_looping(log), Timestamp::now(), &obs).unwrap();
        assert_eq!(
            why,
            "pod c1-0-0-0: CrashLoopBackOff: container clickhouse exited with code 70: \
             Application: DB::Exception: digest clickhouse:[hidden] refused"
        );
        let only_auth = log.lines().take(2).collect::<Vec<_>>().join("\n");
        let why = pod_failing(&crash_looping(&only_auth), Timestamp::now(), &obs).unwrap();
        assert!(
            why.ends_with("Not authenticated, path: /clickhouse/tables/0/default/events"),
            "{why}"
        );
        // no log at all: the reason and the exit code
        let why = pod_failing(&crash_looping(""), Timestamp::now(), &obs).unwrap();
        assert_eq!(
            why,
            "pod c1-0-0-0: CrashLoopBackOff: container clickhouse exited with code 70"
        );
        // the error line read from the previous run's log wins over the termination message,
        // whose 2 KiB the shutdown lines after the error fill
        let mut read = obs.clone();
        read.crash_logs.insert(
            "c1-0-0-0".into(),
            last_error(log.lines().nth(1).unwrap()).unwrap(),
        );
        let why = pod_failing(
            &crash_looping("<Information> shutting down"),
            Timestamp::now(),
            &read,
        )
        .unwrap();
        assert!(
            why.ends_with("Not authenticated, path: /clickhouse/tables/0/default/events"),
            "{why}"
        );
    }

    /// ClickHouse 18.16 writes the error, then its stack trace, then its shutdown: the error
    /// is found, without the trace.
    #[test]
    fn the_error_is_found_before_its_stack_trace_and_the_shutdown() {
        let log = "2026.12.03 16:24:17.289518 [ 40 ] {} <Error> Application: DB::Exception: Code: 999, e.displayText() = Coordination::Exception: Not authenticated, path: /clickhouse/task_queue, e.what() = Coordination::Exception, Stack trace:\n\
                   1. /usr/sbin/clickhouse-server(Coordination::Exception::Exception(int)+0x180) [0x5609375f6990]\n\
                   2. /usr/sbin/clickhouse-server(DB::DDLWorker::run()+0x31) [0x5609375f5e41]\n\
                   2026.12.03 16:24:17.3 [ 1 ] {} <Information> Application: shutting down\n\
                   2026.12.03 16:24:17.4 [ 2 ] {} <Information> BaseDaemon: Stop SignalListener thread\n";
        assert_eq!(
            last_error(log).unwrap(),
            "Application: DB::Exception: Code: 999, e.displayText() = Coordination::Exception: Not authenticated, path: /clickhouse/task_queue"
        );
        // a bare system error logged on the way out does not hide the exception before it
        let then_errno = format!(
            "{log}2026.12.03 16:24:17.5 [ 1 ] {{}} <Error> Application: Invalid argument\n"
        );
        assert!(
            last_error(&then_errno)
                .unwrap()
                .ends_with("Not authenticated, path: /clickhouse/task_queue")
        );
        let only_errno = "2026.12.03 16:24:17.5 [ 1 ] {} <Error> Application: Invalid argument\n";
        assert_eq!(
            last_error(only_errno).unwrap(),
            "Application: Invalid argument"
        );
        let no_level = "Exception: bad config\n0. frame Exception\nbye\n";
        assert_eq!(last_error(no_level).unwrap(), "Exception: bad config");
    }

    /// S2-13: a claim grown whose volume is not reported at its size yet is being resized, even
    /// before a resizer says so; one whose file system waits for a mount is not (decision 44).
    #[test]
    fn a_claim_below_its_request_is_resizing_unless_its_file_system_waits_for_a_mount() {
        let pvc = |capacity: &str, conditions: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data-c1-0-0-0"},
                "spec": {"resources": {"requests": {"storage": "2Gi"}}},
                "status": {"phase": "Bound", "capacity": {"storage": capacity},
                           "conditions": conditions}
            }))
            .unwrap()
        };
        let f = pvc_facts("data", &pvc("1Gi", serde_json::json!([])));
        assert!(f.resizing && !f.file_system_resize_pending);
        let f = pvc_facts("data", &pvc("2Gi", serde_json::json!([])));
        assert!(!f.resizing);
        let pending = serde_json::json!([{"type": "FileSystemResizePending", "status": "True",
            "lastTransitionTime": "2026-11-29T01:00:00Z"}]);
        let f = pvc_facts("data", &pvc("1Gi", pending));
        assert!(!f.resizing && f.file_system_resize_pending);
        assert_eq!(
            f.file_system_resize_pending_since,
            Some("2026-11-29T01:00:00Z".parse().unwrap())
        );
    }

    #[test]
    fn a_long_log_line_is_cut_at_a_character_boundary() {
        let line = format!("x <Fatal> {}", "é".repeat(400));
        let cut = last_error(&line).unwrap();
        assert!(cut.len() <= LOG_LINE_MAX && cut.starts_with('é'), "{cut}");
    }
}
