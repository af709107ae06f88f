//! PURE: one reconcile pass over a valid cluster, in seed 002's order: users and passwords →
//! storage → Keeper and server ConfigMaps, StatefulSets and PDBs → rollout of outdated pods →
//! Services → schema on new replicas → scale-in → status. The pass reads a [`Observed`] world
//! and returns the actions to run, in order, and the status to report.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::diff::{covers, object_covered};
use super::replicas::{self, ReplicaFacts, Topology};
use super::rollout::{self, Gates, Member};
use super::scale_in::{self, ScaleInAction};
use super::status::{self, set_condition};
use super::{EventType, Failure, PlannedEvent};
use crate::api::{
    ClickHouseCluster, ClickHouseClusterStatus, ClientServiceType, ClusterState, ComponentStatus,
    ReplicaState, ReplicaStatus,
};
use crate::model::{self, Cluster, Inputs, ReplicaSpec, labels, names};
use crate::util::quantity;

/// Annotation on a ClickHouseCluster that allows removing shards, whose data is then lost.
pub const ALLOW_DATA_LOSS: &str = "clickhouse.com/allow-data-loss";
/// How long a pod may stay unschedulable before a rollout reports a failure (S2-31).
pub const UNSCHEDULABLE_GRACE: SignedDuration = SignedDuration::from_secs(120);
/// How long a restarted replica may take to catch up with replication (S2-32).
pub const CATCH_UP_DEADLINE: SignedDuration = SignedDuration::from_secs(7200);

/// Kinds of objects the operator writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    ConfigMap,
    Secret,
    Service,
    StatefulSet,
    PodDisruptionBudget,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::Service => "Service",
            Kind::StatefulSet => "StatefulSet",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }
}

/// What a pass observed, beyond the cluster itself.
#[derive(Clone, Debug)]
pub struct Observed {
    /// Server and Keeper StatefulSets of the cluster, by name.
    pub statefulsets: BTreeMap<String, StatefulSet>,
    /// Pods of the cluster, by name.
    pub pods: BTreeMap<String, Pod>,
    /// Other owned objects (ConfigMaps, Secrets, Services, PDBs) as JSON, by kind and name.
    pub objects: BTreeMap<(Kind, String), Value>,
    /// PVCs of the cluster, by name.
    pub pvcs: BTreeMap<String, PersistentVolumeClaim>,
    /// A ClickHouseBackup of the cluster that is Starting or Running.
    pub backup_in_flight: Option<String>,
    /// Replication caught up, per replica, where it was checked.
    pub caught_up: BTreeMap<String, bool>,
    /// Per Ready replica: how many hosts its server lists in the cluster's `remote_servers`
    /// (`system.clusters`), `None` when it could not say. The cluster is ready only once every
    /// server has loaded the current list.
    pub cluster_hosts: BTreeMap<String, Option<u64>>,
    /// What the builders need (secrets, passwords); `replicas` is filled by the pass.
    pub inputs: Inputs,
    /// The operator's Secret exists (its password is in `inputs`).
    pub operator_secret_present: bool,
    /// Referenced Secrets that do not exist: field → Secret name.
    pub missing_secrets: Vec<(String, String)>,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            statefulsets: BTreeMap::new(),
            pods: BTreeMap::new(),
            objects: BTreeMap::new(),
            pvcs: BTreeMap::new(),
            backup_in_flight: None,
            caught_up: BTreeMap::new(),
            cluster_hosts: BTreeMap::new(),
            inputs: Inputs {
                replicas: Vec::new(),
                listed: None,
                secrets: BTreeMap::new(),
                user_passwords: BTreeMap::new(),
                operator_password: model::Password(String::new()),
            },
            operator_secret_present: false,
            missing_secrets: Vec::new(),
        }
    }
}

/// One action of the executor.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create `<cluster>-operator` with a new random password.
    CreateOperatorSecret,
    /// Server-side apply of a built object; `create` when the object was not observed, so that
    /// an existing object that is not the cluster's is never taken over.
    Apply {
        kind: Kind,
        name: String,
        object: Value,
        create: bool,
    },
    /// Delete a StatefulSet leaving its pod running (orphan), then create it again: the way to
    /// change fields a StatefulSet cannot change, data kept (invariant 1).
    RecreateStatefulSet { name: String, object: Value },
    /// Grow a PVC in place.
    ResizePvc { name: String, size: String },
    /// Take a replica's pod out of traffic and delete it; its StatefulSet recreates it on the
    /// new revision (SmartUpdate).
    RestartPod { replica: String, pod: String },
    /// Copy the schema onto a new replica, then mark it Ready.
    MigrateSchema { replica: String, shard: i32 },
    /// One step of removing a condemned replica.
    ScaleIn(ScaleInAction),
    /// Delete an owned object that is no longer wanted.
    Delete { kind: Kind, name: String },
}

impl Action {
    pub fn describe(&self) -> String {
        match self {
            Action::CreateOperatorSecret => "create the operator's credentials Secret".into(),
            Action::Apply { kind, name, .. } => format!("apply {} {name}", kind.as_str()),
            Action::RecreateStatefulSet { name, .. } => {
                format!("recreate StatefulSet {name} (pods kept)")
            }
            Action::ResizePvc { name, size } => format!("resize PVC {name} to {size}"),
            Action::RestartPod { pod, .. } => format!("restart pod {pod}"),
            Action::MigrateSchema { replica, .. } => format!("copy the schema onto {replica}"),
            Action::ScaleIn(a) => format!("scale-in: {a:?}"),
            Action::Delete { kind, name } => format!("delete {} {name}", kind.as_str()),
        }
    }
}

/// The result of planning one pass.
#[derive(Clone, Debug, Default)]
pub struct PassPlan {
    pub status: ClickHouseClusterStatus,
    pub actions: Vec<Action>,
    pub events: Vec<PlannedEvent>,
    pub failure: Option<Failure>,
    /// Replicas whose replication lag must be read before the rollout can go on.
    pub lag_checks: Vec<String>,
    /// Run another pass right away (the map was persisted and the next steps depend on it).
    pub again: bool,
}

fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("Kubernetes objects serialise")
}

fn pod_name(replica: &str) -> String {
    names::replica_pod(replica)
}

fn pod_ready(p: &Pod) -> bool {
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

/// Pod on its StatefulSet's current revision (and the StatefulSet's status is up to date).
fn pod_current(sts: &StatefulSet, p: &Pod) -> bool {
    let settled =
        sts.status.as_ref().and_then(|s| s.observed_generation) == sts.metadata.generation;
    let update = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref());
    let pod_rev = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("controller-revision-hash"))
        .map(String::as_str);
    settled && update.is_some() && update == pod_rev
}

/// Why a pod cannot run, if it cannot (S2-31, S2-39).
fn pod_failing(p: &Pod, now: Timestamp) -> Option<String> {
    let name = p.metadata.name.clone().unwrap_or_default();
    let st = p.status.as_ref()?;
    for cs in st.container_statuses.iter().flatten() {
        if let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or("");
            if matches!(
                reason,
                "CrashLoopBackOff"
                    | "ErrImagePull"
                    | "ImagePullBackOff"
                    | "InvalidImageName"
                    | "CreateContainerConfigError"
            ) {
                return Some(format!(
                    "pod {name}: {reason}: {}",
                    w.message.as_deref().unwrap_or("")
                ));
            }
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
fn serves_tls(template: &Value) -> bool {
    template["spec"]["containers"][0]["ports"]
        .as_array()
        .is_some_and(|ports| {
            ports
                .iter()
                .any(|p| p["containerPort"] == names::HTTPS_PORT)
        })
}

/// The StatefulSet's data PVC size as requested in its claim template.
fn template_storage(sts: &Value) -> Option<String> {
    sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
        .as_str()
        .map(str::to_string)
}

/// Plans one pass over a cluster whose spec is valid.
pub fn plan_pass(cluster: &ClickHouseCluster, obs: &Observed, now: Timestamp) -> PassPlan {
    let mut out = PassPlan::default();
    let old = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let spec = &cluster.spec;
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let ns = cluster.metadata.namespace.clone().unwrap_or_default();
    let mut waits: Vec<String> = Vec::new();
    let fail = |reason: &'static str, message: String, out: &mut PassPlan| {
        out.failure = Some(Failure { reason, message });
    };

    // Users and passwords.
    if let Some((field, secret)) = obs.missing_secrets.first() {
        fail(
            "MissingSecret",
            format!("Secret {secret} (named by {field}) does not exist in namespace {ns}"),
            &mut out,
        );
        out.status = status::failed(&old, generation, out.failure.as_ref().expect("set"), now);
        return out;
    }
    if !obs.operator_secret_present {
        out.actions.push(Action::CreateOperatorSecret);
        out.again = true;
        out.status = old.clone();
        return out;
    }

    // Keeper membership changes one member at a time, and only while every current member is
    // Ready (quorum is never put at risk by a change of size).
    let keeper_name = names::keeper(&name);
    let keeper_want = spec.keeper.replicas;
    let keeper_step = match obs.statefulsets.get(&keeper_name) {
        Some(k) if !spec.pause => {
            let have = k.spec.replicas.unwrap_or(0);
            let all_ready = (0..have).all(|i| {
                obs.pods
                    .get(&format!("{keeper_name}-{i}"))
                    .is_some_and(|p| pod_ready(p) && pod_current(k, p))
            });
            if have == 0 || have == keeper_want {
                keeper_want
            } else if all_ready {
                have + (keeper_want - have).signum()
            } else {
                waits.push(format!(
                    "Keeper membership {have} → {keeper_want} waits until every member is Ready"
                ));
                have
            }
        }
        _ => keeper_want,
    };
    if keeper_step != keeper_want {
        waits.push(format!(
            "Keeper membership {keeper_want} reached one member at a time (now {keeper_step})"
        ));
    }
    let stepped;
    let build_from = if keeper_step == keeper_want {
        cluster
    } else {
        let mut c = cluster.clone();
        c.spec.keeper.replicas = keeper_step;
        stepped = c;
        &stepped
    };
    let model_cluster = match Cluster::new(build_from) {
        Ok(c) => c,
        Err(e) => {
            fail("InvalidSpec", e.to_string(), &mut out);
            out.status = status::failed(&old, generation, out.failure.as_ref().expect("set"), now);
            return out;
        }
    };

    // The replicas the persisted map knows; desired objects are built for the non-condemned
    // ones (a condemned replica is left alone until it is removed).
    let live: Vec<ReplicaSpec> = old
        .replica_state_map
        .iter()
        .filter(|(_, r)| r.state != ReplicaState::Condemned)
        .map(|(n, r)| ReplicaSpec {
            name: n.clone(),
            shard: r.shard,
            index: r.index,
        })
        .collect();
    let mut inputs = obs.inputs.clone();
    // remote_servers lists a new replica once its pod has an address (see `Inputs::listed`).
    let has_address = |replica: &str| {
        obs.pods
            .get(&pod_name(replica))
            .and_then(|p| p.status.as_ref()?.pod_ip.as_ref())
            .is_some()
    };
    inputs.listed = Some(
        live.iter()
            .filter(|r| {
                old.replica_state_map
                    .get(&r.name)
                    .is_some_and(|e| e.state != ReplicaState::Pending)
                    || has_address(&r.name)
            })
            .cloned()
            .collect(),
    );
    inputs.replicas = live.clone();
    let listed_count = inputs.listed.as_ref().map_or(0, Vec::len) as u64;
    let desired = match model::desired(&model_cluster, &inputs) {
        Ok(d) => d,
        Err(e) => {
            fail("InvalidSpec", e.to_string(), &mut out);
            out.status = status::failed(&old, generation, out.failure.as_ref().expect("set"), now);
            return out;
        }
    };

    // Facts per replica.
    let facts = |replica: &str| -> ReplicaFacts {
        let sts = obs.statefulsets.get(replica);
        let pod = obs.pods.get(&pod_name(replica));
        let desired_sts = desired
            .server_statefulsets
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(replica));
        let template_current = match (sts, desired_sts) {
            (Some(o), Some(d)) => {
                covers(&json_of(&o.spec)["template"], &json_of(&d.spec)["template"])
            }
            _ => false,
        };
        let ready = pod.is_some_and(pod_ready);
        ReplicaFacts {
            sts_exists: sts.is_some(),
            pod_exists: pod.is_some(),
            ready,
            ready_and_current: ready
                && template_current
                && matches!((sts, pod), (Some(s), Some(p)) if pod_current(s, p)),
        }
    };

    // The map: scale-out, scale-in, pause, backup replica.
    let allow_loss = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_DATA_LOSS))
        .is_some_and(|v| v == "true");
    let change = replicas::plan_map(
        &Topology {
            cluster: &name,
            shards: spec.shards,
            replicas: spec.replicas,
            paused: spec.pause,
            allow_shard_removal: allow_loss,
        },
        &old.replica_state_map,
        old.next_replica_index,
        facts,
    );
    let mut status = old.clone();
    status.replica_state_map = change.map.clone();
    status.next_replica_index = change.next_index;
    if !change.refused_shards.is_empty() {
        fail(
            "ShardRemovalRefused",
            format!(
                "spec.shards is {} but shard(s) {:?} still hold replicas: removing a shard loses its data; to allow it, annotate the ClickHouseCluster {ALLOW_DATA_LOSS}=true",
                spec.shards, change.refused_shards
            ),
            &mut out,
        );
    }
    for n in &change.added {
        out.events.push(PlannedEvent {
            kind: EventType::Normal,
            reason: "ReplicaAdded",
            action: "ScaleOut",
            message: format!("replica {n} added"),
        });
    }
    for n in &change.condemned {
        out.events.push(PlannedEvent {
            kind: EventType::Normal,
            reason: "ReplicaCondemned",
            action: "ScaleIn",
            message: format!("replica {n} will be removed"),
        });
    }
    // New or condemned entries are persisted before anything acts on them (S0-19, S0-21).
    let map_changed_structurally = !change.added.is_empty() || !change.condemned.is_empty();

    // Keeper first, then the server configuration, StatefulSets and PDBs.
    let apply = |kind: Kind, obj: Value, out: &mut PassPlan| {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let observed = if kind == Kind::StatefulSet {
            obs.statefulsets.get(&name).map(json_of)
        } else {
            obs.objects.get(&(kind, name.clone())).cloned()
        };
        if !observed.as_ref().is_some_and(|o| object_covered(o, &obj)) {
            out.actions.push(Action::Apply {
                kind,
                name,
                object: obj,
                create: observed.is_none(),
            });
        }
    };
    let mut wanted: BTreeSet<(Kind, String)> = BTreeSet::new();
    let mut want = |kind: Kind, obj: &Value| {
        wanted.insert((
            kind,
            obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ));
    };
    if let Some(k) = &desired.keeper {
        for (kind, obj) in [
            (Kind::ConfigMap, json_of(&k.config)),
            (Kind::Service, json_of(&k.headless_service)),
            (Kind::StatefulSet, json_of(&k.statefulset)),
            (Kind::PodDisruptionBudget, json_of(&k.pdb)),
        ] {
            want(kind, &obj);
            apply(kind, obj, &mut out);
        }
    }
    let config_objects: Vec<(Kind, Value)> =
        std::iter::once((Kind::ConfigMap, json_of(&desired.common_config)))
            .chain(std::iter::once((
                Kind::Secret,
                json_of(&desired.users_secret),
            )))
            .chain(
                desired
                    .replica_configs
                    .iter()
                    .map(|c| (Kind::ConfigMap, json_of(c))),
            )
            .collect();
    for (kind, obj) in config_objects {
        want(kind, &obj);
        apply(kind, obj, &mut out);
    }

    // Is the Keeper ensemble up (every current member Ready)?
    let keeper_serving = desired.keeper.is_none()
        || obs.statefulsets.get(&keeper_name).is_some_and(|k| {
            let have = k.spec.replicas.unwrap_or(0);
            have > 0
                && (0..have).all(|i| {
                    obs.pods
                        .get(&format!("{keeper_name}-{i}"))
                        .is_some_and(pod_ready)
                })
        });
    let mut keeper_wait = false;

    // Server StatefulSets: created in parallel, template changes through the rollout.
    let mut members = Vec::new();
    let mut storage_busy = Vec::new();
    for d in &desired.server_statefulsets {
        let dname = d.metadata.name.clone().unwrap_or_default();
        let mut dj = json_of(d);
        want(Kind::StatefulSet, &dj);
        let Some(o) = obs.statefulsets.get(&dname) else {
            // Servers start once Keeper serves: some versions (18.16) give up their DDL queue
            // for good when Keeper cannot be reached at start.
            if !keeper_serving {
                keeper_wait = true;
                continue;
            }
            out.actions.push(Action::Apply {
                kind: Kind::StatefulSet,
                name: dname,
                object: dj,
                create: true,
            });
            continue;
        };
        let oj = json_of(o);
        // Storage: the claim template cannot change in place.
        let (want_size, have_size) = (template_storage(&dj), template_storage(&oj));
        if want_size != have_size {
            let grow = match (
                want_size.as_deref().and_then(quantity::parse_bytes),
                have_size.as_deref().and_then(quantity::parse_bytes),
            ) {
                (Some(w), Some(h)) => w > h,
                _ => false,
            };
            if !grow {
                fail(
                    "StorageChangeRefused",
                    format!(
                        "spec.storage.size: the storage of {dname} cannot shrink below {}",
                        have_size.clone().unwrap_or_default()
                    ),
                    &mut out,
                );
            } else if !spec.storage_scaling.enable_volume_scaling {
                fail(
                    "StorageChangeRefused",
                    format!(
                        "spec.storage.size: the storage of {dname} grows to {} only with spec.storageScaling.enableVolumeScaling: true; nothing was changed",
                        want_size.clone().unwrap_or_default()
                    ),
                    &mut out,
                );
            } else {
                let pvc = format!("{}-{}", model::statefulset::DATA_VOLUME, pod_name(&dname));
                let pvc_size = obs.pvcs.get(&pvc).and_then(|p| {
                    p.spec
                        .as_ref()?
                        .resources
                        .as_ref()?
                        .requests
                        .as_ref()?
                        .get("storage")
                        .map(|q| q.0.clone())
                });
                if pvc_size.as_deref() != want_size.as_deref() && obs.pvcs.contains_key(&pvc) {
                    out.actions.push(Action::ResizePvc {
                        name: pvc,
                        size: want_size.clone().unwrap_or_default(),
                    });
                }
                out.actions.push(Action::RecreateStatefulSet {
                    name: dname.clone(),
                    object: dj.clone(),
                });
                storage_busy.push(dname.clone());
                continue;
            }
            // Keep the claim template the StatefulSet has.
            dj["spec"]["volumeClaimTemplates"] = oj["spec"]["volumeClaimTemplates"].clone();
        }
        let template_outdated = !covers(&oj["spec"]["template"], &dj["spec"]["template"]);
        let mut rest = dj.clone();
        rest["spec"]["template"] = oj["spec"]["template"].clone();
        if !object_covered(&oj, &rest) {
            // Replica count (pause/resume, parallel) or other fields: written now, with the
            // template it has unless its turn in the rollout comes.
            out.actions.push(Action::Apply {
                kind: Kind::StatefulSet,
                name: dname.clone(),
                create: false,
                object: if template_outdated && (spec.pause || o.spec.replicas == Some(0)) {
                    dj.clone()
                } else {
                    rest
                },
            });
        }
        let entry = status.replica_state_map.get(&dname);
        let pod = obs.pods.get(&pod_name(&dname));
        let ready = pod.is_some_and(pod_ready);
        let caught_up = obs.caught_up.get(&dname).copied();
        let failing = pod.and_then(|p| pod_failing(p, now)).or_else(|| {
            let since = pod.and_then(ready_since)?;
            (caught_up == Some(false) && now.duration_since(since) > CATCH_UP_DEADLINE).then(|| {
                format!("replica {dname} did not catch up with replication within 2 hours")
            })
        });
        members.push(Member {
            name: dname.clone(),
            shard: entry.map_or(0, |e| e.shard),
            index: entry.map_or(0, |e| e.index),
            is_backup: entry.is_some_and(|e| e.is_backup_pod),
            template_outdated,
            pod_outdated: pod.is_some_and(|p| !pod_current(o, p)),
            available: ready && caught_up != Some(false),
            ready,
            failing,
        });
    }
    if keeper_wait {
        waits.push("waiting for Keeper to be Ready before starting new server replicas".into());
    }
    for d in &desired.shard_pdbs {
        let obj = json_of(d);
        want(Kind::PodDisruptionBudget, &obj);
        apply(Kind::PodDisruptionBudget, obj, &mut out);
    }
    if !storage_busy.is_empty() {
        waits.push(format!("resizing storage of {}", storage_busy.join(", ")));
    }

    // Turning TLS on or off is a full stop and start (S2-23): every server goes to 0 with the
    // template it has; once no server pod is left, all start at once on the new template.
    let switching_tls = !spec.pause
        && obs.statefulsets.iter().any(|(n, o)| {
            status.replica_state_map.contains_key(n)
                && serves_tls(&json_of(&o.spec)["template"]) != spec.tls.enabled
                && o.spec.replicas != Some(0)
        });
    if switching_tls {
        for d in &desired.server_statefulsets {
            let n = d.metadata.name.clone().unwrap_or_default();
            let Some(o) = obs
                .statefulsets
                .get(&n)
                .filter(|o| o.spec.replicas != Some(0))
            else {
                continue;
            };
            let oj = json_of(o);
            let mut stop = json_of(d);
            stop["spec"]["template"] = oj["spec"]["template"].clone();
            stop["spec"]["volumeClaimTemplates"] = oj["spec"]["volumeClaimTemplates"].clone();
            stop["spec"]["replicas"] = json!(0);
            out.actions.retain(
                |a| !matches!(a, Action::Apply { kind: Kind::StatefulSet, name, .. } if *name == n),
            );
            out.actions.push(Action::Apply {
                kind: Kind::StatefulSet,
                name: n,
                object: stop,
                create: false,
            });
        }
        waits.push(format!(
            "turning TLS {}: stopping every server before starting them again",
            if spec.tls.enabled { "on" } else { "off" }
        ));
    }

    // Rollout of outdated pods, unless paused, switching TLS, or a storage resize is in
    // progress (S2-13).
    let rollout_active = !switching_tls
        && members
            .iter()
            .any(|m| m.template_outdated || m.pod_outdated);
    if rollout_active && !spec.pause && storage_busy.is_empty() {
        // Catch-up of ready replicas in the shards being rolled must be known first.
        let shards: BTreeSet<i32> = members
            .iter()
            .filter(|m| m.template_outdated || m.pod_outdated)
            .map(|m| m.shard)
            .collect();
        let unknown: Vec<String> = members
            .iter()
            .filter(|m| {
                shards.contains(&m.shard) && m.ready && !obs.caught_up.contains_key(&m.name)
            })
            .map(|m| m.name.clone())
            .collect();
        if !unknown.is_empty() {
            out.lag_checks = unknown;
        }
        let gates = Gates {
            backup_in_flight: obs.backup_in_flight.clone(),
            client_service_ready: !spec.client_service.enabled
                || obs
                    .objects
                    .contains_key(&(Kind::Service, names::client_service(&name))),
        };
        let r = rollout::plan_rollout(
            &members,
            spec.update_strategy,
            spec.pod_disruption_budget.max_unavailable,
            &gates,
        );
        for n in &r.write_templates {
            if let Some(d) = desired
                .server_statefulsets
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(n))
            {
                let mut dj = json_of(d);
                if let Some(o) = obs.statefulsets.get(n) {
                    dj["spec"]["volumeClaimTemplates"] =
                        json_of(o)["spec"]["volumeClaimTemplates"].clone();
                }
                out.actions.retain(|a| !matches!(a, Action::Apply { kind: Kind::StatefulSet, name, .. } if name == n));
                out.actions.push(Action::Apply {
                    kind: Kind::StatefulSet,
                    name: n.clone(),
                    object: dj,
                    create: false,
                });
            }
        }
        for n in &r.restart_pods {
            out.actions.push(Action::RestartPod {
                replica: n.clone(),
                pod: pod_name(n),
            });
            out.events.push(PlannedEvent {
                kind: EventType::Normal,
                reason: "RestartPod",
                action: "Rollout",
                message: format!("restarting {} on the new revision", pod_name(n)),
            });
        }
        waits.extend(r.waiting.iter().cloned());
        if let Some(f) = r.failure {
            fail("RolloutFailed", f, &mut out);
        } else if !r.write_templates.is_empty() || !r.restart_pods.is_empty() {
            waits.push(format!(
                "rolling out: {}",
                r.write_templates
                    .iter()
                    .chain(&r.restart_pods)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }

    // Services.
    for obj in std::iter::once(json_of(&desired.headless_service))
        .chain(desired.client_service.iter().map(json_of))
        .chain(desired.keeper.iter().map(|k| json_of(&k.client_service)))
    {
        want(Kind::Service, &obj);
        apply(Kind::Service, obj, &mut out);
    }

    // Objects of ours that are no longer wanted (client Service switched off, PDB of a removed
    // shard, Keeper switched off). Objects of condemned replicas wait for their scale-in.
    let condemned: BTreeSet<String> = status
        .replica_state_map
        .iter()
        .filter(|(_, r)| r.state == ReplicaState::Condemned)
        .map(|(n, _)| n.clone())
        .collect();
    let protected = |n: &str| condemned.contains(n) || n == names::operator_secret(&name);
    for (kind, n) in obs.objects.keys() {
        if !wanted.contains(&(*kind, n.clone())) && !protected(n) {
            out.actions.push(Action::Delete {
                kind: *kind,
                name: n.clone(),
            });
        }
    }
    for n in obs.statefulsets.keys() {
        if !wanted.contains(&(Kind::StatefulSet, n.clone()))
            && !protected(n)
            && !old.replica_state_map.contains_key(n)
        {
            out.actions.push(Action::Delete {
                kind: Kind::StatefulSet,
                name: n.clone(),
            });
        }
    }

    // Schema on new replicas once their pod is Ready on the current revision (S0-20, S1-01).
    if !map_changed_structurally {
        let entries: Vec<(String, ReplicaStatus)> = status
            .replica_state_map
            .iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        for (n, r) in entries {
            if r.state == ReplicaState::Pending && facts(&n).ready_and_current {
                out.actions.push(Action::MigrateSchema {
                    replica: n,
                    shard: r.shard,
                });
            }
        }
    }

    // Scale-in.
    if !map_changed_structurally && !spec.pause {
        let sts_ready = |n: &str| facts(n).ready;
        let sts_exists = |n: &str| obs.statefulsets.contains_key(n);
        let p = scale_in::plan_scale_in(&status.replica_state_map, sts_ready, sts_exists);
        for chain in p.chains {
            out.actions.extend(chain.into_iter().map(Action::ScaleIn));
        }
        waits.extend(p.waiting);
    }

    // Status.
    status.observed_generation = generation;
    let servers_wanted: Vec<&String> = status
        .replica_state_map
        .iter()
        .filter(|(_, r)| r.state != ReplicaState::Condemned)
        .map(|(n, _)| n)
        .collect();
    let ready_servers = servers_wanted
        .iter()
        .filter(|n| facts(n).ready_and_current)
        .count() as i32;
    status.clickhouse = ComponentStatus::new(spec.shards * spec.replicas, ready_servers);
    let keeper_size = spec.keeper.replicas;
    let keeper_ready = desired
        .keeper
        .as_ref()
        .map(|k| {
            let kname = k.statefulset.metadata.name.clone().unwrap_or_default();
            (0..keeper_size)
                .filter(|i| {
                    let p = obs.pods.get(&format!("{kname}-{i}"));
                    match (obs.statefulsets.get(&kname), p) {
                        (Some(s), Some(p)) => pod_ready(p) && pod_current(s, p),
                        _ => false,
                    }
                })
                .count() as i32
        })
        .unwrap_or(0);
    status.keeper = ComponentStatus::new(keeper_size, keeper_ready);
    status.host = desired.client_service.as_ref().and_then(|svc| {
        let svc_name = svc.metadata.name.clone()?;
        let observed = obs.objects.get(&(Kind::Service, svc_name))?;
        match spec.client_service.r#type {
            ClientServiceType::LoadBalancer => {
                let ing = &observed["status"]["loadBalancer"]["ingress"][0];
                ing["ip"]
                    .as_str()
                    .or(ing["hostname"].as_str())
                    .map(str::to_string)
            }
            _ => Some(names::client_host(&name, &ns)),
        }
    });
    // Every server has loaded the current remote_servers (it is reloaded, not restarted).
    let config_lagging: Vec<&str> = servers_wanted
        .iter()
        .filter(|n| facts(n).ready)
        .filter(|n| {
            obs.cluster_hosts
                .get(n.as_str())
                .is_some_and(|seen| *seen != Some(listed_count))
        })
        .map(|n| n.as_str())
        .collect();
    if !config_lagging.is_empty() {
        waits.push(format!(
            "waiting for {} to load the cluster's {listed_count} hosts",
            config_lagging.join(", ")
        ));
    }
    let all_ready = config_lagging.is_empty()
        && ready_servers == spec.shards * spec.replicas
        && servers_wanted
            .iter()
            .all(|n| status.replica_state_map[*n].state == ReplicaState::Ready)
        && keeper_ready == keeper_size
        && condemned.is_empty()
        && (status.host.is_some() || !spec.client_service.enabled)
        && !members
            .iter()
            .any(|m| m.template_outdated || m.pod_outdated);
    for p in obs.pods.values() {
        if let Some(reason) = unschedulable(p) {
            waits.push(reason);
        }
    }
    let (state, message) = if switching_tls && out.failure.is_none() {
        (ClusterState::Stopping, Some(waits.join("; ")))
    } else if out.failure.is_some() {
        (
            ClusterState::Error,
            out.failure.as_ref().map(|f| f.message.clone()),
        )
    } else if spec.pause {
        if !obs.pods.is_empty() {
            (
                ClusterState::Stopping,
                Some(format!("stopping: {} pod(s) still running", obs.pods.len())),
            )
        } else {
            (ClusterState::Paused, None)
        }
    } else if all_ready {
        (ClusterState::Ready, None)
    } else {
        let mut reasons = waits.clone();
        if reasons.is_empty() {
            let not_ready: Vec<&str> = servers_wanted
                .iter()
                .filter(|n| !facts(n).ready_and_current)
                .map(|n| n.as_str())
                .collect();
            if !not_ready.is_empty() {
                reasons.push(format!(
                    "waiting for server replicas to be Ready and up to date: {}",
                    not_ready.join(", ")
                ));
            }
            let pending: Vec<&str> = servers_wanted
                .iter()
                .filter(|n| {
                    facts(n).ready_and_current
                        && status.replica_state_map[**n].state == ReplicaState::Pending
                })
                .map(|n| n.as_str())
                .collect();
            if !pending.is_empty() {
                reasons.push(format!("copying the schema onto {}", pending.join(", ")));
            }
            if keeper_ready < keeper_size {
                reasons.push(format!(
                    "waiting for Keeper members ({keeper_ready}/{keeper_size} ready)"
                ));
            }
            if !condemned.is_empty() {
                reasons.push(format!(
                    "removing replicas {}",
                    condemned
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if status.host.is_none() && spec.client_service.enabled {
                reasons.push("waiting for the client Service's address".into());
            }
        }
        (
            ClusterState::Initializing,
            Some(reasons.join("; ")).filter(|s| !s.is_empty()),
        )
    };
    status.state = state;
    status.message = message;
    if let Some(f) = &out.failure {
        status = status::failed(&status, generation, f, now);
    } else {
        set_condition(
            &mut status.conditions,
            status::RECONCILE_SUCCEEDED,
            true,
            "ReconcileSucceeded",
            "",
            generation,
            now,
        );
        set_condition(
            &mut status.conditions,
            status::SPEC_VALID,
            true,
            "SpecValid",
            "",
            generation,
            now,
        );
    }
    set_condition(
        &mut status.conditions,
        "Ready",
        state == ClusterState::Ready,
        if state == ClusterState::Ready {
            "Ready"
        } else {
            "NotReady"
        },
        status.message.as_deref().unwrap_or(""),
        generation,
        now,
    );
    out.again = map_changed_structurally && out.failure.is_none();
    if map_changed_structurally {
        // Nothing acts on the new entries before they are persisted.
        out.actions
            .retain(|a| !matches!(a, Action::ScaleIn(_) | Action::MigrateSchema { .. }));
    }
    out.status = status;
    out
}

/// Labels that put a pod in traffic and in the topology spread.
pub const TRAFFIC_LABELS: [&str; 2] = [labels::SERVING, labels::SPREAD];

#[cfg(test)]
mod tests {
    //! The engine against a simulated API server: applied objects are stored, StatefulSets get
    //! a revision per template and one Ready pod, deleted pods come back on the current revision.
    use super::*;
    use crate::api::ClickHouseClusterSpec;
    use crate::plan::{Plan, World, decide};
    use k8s_openapi::api::apps::v1::StatefulSetStatus;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    struct Sim {
        cluster: ClickHouseCluster,
        obs: Observed,
        log: Vec<String>,
        /// Pods that do not come back ready (a broken replica).
        broken: BTreeSet<String>,
    }

    fn revision(template: &Value) -> String {
        let mut h = DefaultHasher::new();
        template.to_string().hash(&mut h);
        format!("r{:x}", h.finish())
    }

    fn now() -> Timestamp {
        "2026-11-30T00:00:00Z".parse().unwrap()
    }

    impl Sim {
        fn new(spec: serde_json::Value) -> Sim {
            let spec: ClickHouseClusterSpec = serde_json::from_value(spec).unwrap();
            let mut cluster = ClickHouseCluster::new("c1", spec);
            cluster.metadata.namespace = Some("t1".into());
            cluster.metadata.uid = Some("uid-1".into());
            cluster.metadata.generation = Some(1);
            cluster.metadata.creation_timestamp = Some(Time(now()));
            let mut obs = Observed {
                operator_secret_present: true,
                ..Observed::default()
            };
            obs.inputs.operator_password = model::Password("pw".into());
            Sim {
                cluster,
                obs,
                log: Vec::new(),
                broken: BTreeSet::new(),
            }
        }

        fn plan(&self) -> Plan {
            let world = World {
                clusters_in_namespace: Vec::new(),
                observed: self.obs.clone(),
            };
            decide(&self.cluster, &world, now())
        }

        fn make_pod(&mut self, sts: &str) {
            let s = &self.obs.statefulsets[sts];
            let rev = s.status.as_ref().unwrap().update_revision.clone().unwrap();
            let name = format!("{sts}-0");
            let ready = !self.broken.contains(&name);
            let pod = Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(
                        "controller-revision-hash".to_string(),
                        rev,
                    )])),
                    ..Default::default()
                },
                status: Some(PodStatus {
                    pod_ip: Some("198.18.1.1".into()),
                    conditions: Some(vec![PodCondition {
                        type_: "Ready".into(),
                        status: if ready { "True" } else { "False" }.into(),
                        last_transition_time: Some(Time(now())),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            };
            self.obs.pods.insert(name, pod);
        }

        /// The StatefulSet controller: pods for StatefulSets that have none; none for those at 0.
        fn settle(&mut self) {
            let names: Vec<String> = self.obs.statefulsets.keys().cloned().collect();
            for n in names {
                let replicas = self.obs.statefulsets[&n].spec.replicas.unwrap_or(1);
                let keeper = n.ends_with("-keeper");
                for i in 0..replicas {
                    let pod = format!("{n}-{i}");
                    if !self.obs.pods.contains_key(&pod) {
                        if keeper {
                            let rev = self.obs.statefulsets[&n]
                                .status
                                .as_ref()
                                .unwrap()
                                .update_revision
                                .clone()
                                .unwrap();
                            let mut p = Pod::default();
                            p.metadata.name = Some(pod.clone());
                            p.metadata.labels = Some(BTreeMap::from([(
                                "controller-revision-hash".to_string(),
                                rev,
                            )]));
                            p.status = Some(PodStatus {
                                conditions: Some(vec![PodCondition {
                                    type_: "Ready".into(),
                                    status: "True".into(),
                                    ..Default::default()
                                }]),
                                ..Default::default()
                            });
                            self.obs.pods.insert(pod, p);
                        } else {
                            self.make_pod(&n);
                        }
                    }
                }
                if replicas == 0 {
                    self.obs
                        .pods
                        .retain(|p, _| !p.starts_with(&format!("{n}-")));
                }
            }
        }

        /// Runs one plan as the executor would, against the simulation.
        fn act(&mut self, plan: &Plan) {
            let mut status = plan.status.clone();
            for a in &plan.actions {
                self.log.push(a.describe());
                match a {
                    Action::Apply {
                        kind: Kind::StatefulSet,
                        name,
                        object,
                        ..
                    } => {
                        let mut sts: StatefulSet = serde_json::from_value(object.clone()).unwrap();
                        let generation = self
                            .obs
                            .statefulsets
                            .get(name)
                            .and_then(|s| s.metadata.generation)
                            .unwrap_or(0)
                            + 1;
                        sts.metadata.generation = Some(generation);
                        sts.status = Some(StatefulSetStatus {
                            observed_generation: Some(generation),
                            update_revision: Some(revision(&object["spec"]["template"])),
                            ..Default::default()
                        });
                        self.obs.statefulsets.insert(name.clone(), sts);
                    }
                    Action::Apply {
                        kind, name, object, ..
                    } => {
                        self.obs
                            .objects
                            .insert((*kind, name.clone()), object.clone());
                    }
                    Action::RestartPod { pod, .. } => {
                        self.obs.pods.remove(pod);
                    }
                    Action::MigrateSchema { replica, .. } => {
                        status.replica_state_map.get_mut(replica).unwrap().state =
                            ReplicaState::Ready;
                    }
                    Action::ScaleIn(s) => {
                        if let ScaleInAction::DeleteStatefulSet { replica } = s {
                            self.obs.statefulsets.remove(replica);
                            self.obs.pods.remove(&format!("{replica}-0"));
                        }
                        scale_in::record(&mut status.replica_state_map, s);
                    }
                    Action::Delete {
                        kind: Kind::StatefulSet,
                        name,
                    } => {
                        self.obs.statefulsets.remove(name);
                    }
                    Action::Delete { kind, name } => {
                        self.obs.objects.remove(&(*kind, name.clone()));
                    }
                    other => panic!("unexpected action {other:?}"),
                }
            }
            self.cluster.status = Some(status);
            self.settle();
        }

        /// Passes until nothing is left to do (or `max` passes). Returns the number of passes.
        fn converge(&mut self, max: usize) -> usize {
            for i in 0..max {
                let mut p = self.plan();
                if !p.lag_checks.is_empty() {
                    for r in &p.lag_checks {
                        self.obs.caught_up.insert(r.clone(), true);
                    }
                    p = self.plan();
                }
                if p.actions.is_empty() && !p.again {
                    self.cluster.status = Some(p.status);
                    return i;
                }
                self.act(&p);
                self.obs.caught_up.clear();
            }
            panic!(
                "no convergence in {max} passes: {:?}",
                self.log.iter().rev().take(10).collect::<Vec<_>>()
            );
        }

        fn state(&self) -> ClusterState {
            self.cluster.status.as_ref().unwrap().state
        }

        fn map(&self) -> &BTreeMap<String, ReplicaStatus> {
            &self.cluster.status.as_ref().unwrap().replica_state_map
        }
    }

    /// A new cluster converges to ready; a pass over the settled cluster does nothing at all.
    #[test]
    fn new_cluster_converges_and_then_nothing_happens() {
        let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2}));
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Ready, "{:?}", sim.cluster.status);
        assert_eq!(sim.map().len(), 4);
        assert!(sim.map().values().all(|r| r.state == ReplicaState::Ready));
        let p = sim.plan();
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.status, sim.cluster.status.clone().unwrap());
    }

    /// S0-19 / S0-16: new entries are persisted before their StatefulSets exist, then every new
    /// StatefulSet is created in the same pass; S2-09: Keeper first, configuration before
    /// StatefulSets, Services after them.
    #[test]
    fn s0_16_scale_out_creates_all_statefulsets_in_one_pass_in_order() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 1}));
        sim.converge(20);
        sim.cluster.spec.replicas = 4;
        let p = sim.plan();
        assert!(p.again);
        assert!(
            !p.actions.iter().any(|a| matches!(
                a,
                Action::Apply {
                    kind: Kind::StatefulSet,
                    ..
                }
            )),
            "{:?}",
            p.actions
        );
        assert_eq!(
            p.status
                .replica_state_map
                .values()
                .filter(|r| r.state == ReplicaState::Pending)
                .count(),
            3
        );
        sim.act(&p);
        let p = sim.plan();
        let created: Vec<&String> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply {
                    kind: Kind::StatefulSet,
                    name,
                    ..
                } => Some(name),
                _ => None,
            })
            .collect();
        assert_eq!(created.len(), 3, "{:?}", p.actions);
        sim.act(&p);
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Ready);
        assert_eq!(sim.map().len(), 4);
    }

    /// S0-21…S0-30: scale-in condemns, then runs the steps in order, and the map ends clean.
    #[test]
    fn scale_in_runs_the_steps_in_order() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
        sim.converge(20);
        let backup = sim
            .map()
            .iter()
            .find(|(_, r)| r.is_backup_pod)
            .unwrap()
            .0
            .clone();
        sim.cluster.spec.replicas = 1;
        sim.log.clear();
        sim.converge(20);
        assert_eq!(sim.map().len(), 1);
        assert!(
            sim.map().contains_key(&backup),
            "the backup replica survives (S0-14)"
        );
        let order: Vec<&str> = sim
            .log
            .iter()
            .filter(|l| l.starts_with("scale-in"))
            .map(|l| l.split(['{', ' ']).nth(1).unwrap_or(""))
            .collect();
        let pos = |k: &str| order.iter().position(|s| s.starts_with(k)).unwrap();
        assert!(pos("LeaveTraffic") < pos("SyncShard"));
        assert!(pos("SyncShard") < pos("DropObjects"));
        assert!(pos("DropObjects") < pos("DeleteStatefulSet"));
        assert!(pos("DeleteStatefulSet") < pos("DropKeeperMetadata"));
        assert!(pos("DropKeeperMetadata") < pos("LabelPvcsAndForget"));
        assert_eq!(sim.state(), ClusterState::Ready);
        assert_eq!(
            sim.obs
                .statefulsets
                .keys()
                .filter(|k| !k.ends_with("keeper"))
                .count(),
            1
        );
    }

    /// S0-17 / S2-28: an image change restarts one replica at a time, newest first, backup last.
    #[test]
    fn image_change_rolls_one_replica_at_a_time() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
        sim.converge(20);
        let backup = sim
            .map()
            .iter()
            .find(|(_, r)| r.is_backup_pod)
            .unwrap()
            .0
            .clone();
        sim.cluster.spec.image = "clickhouse/clickhouse-server:25.3".into();
        sim.log.clear();
        sim.converge(40);
        let restarts: Vec<&String> = sim
            .log
            .iter()
            .filter(|l| l.starts_with("restart pod"))
            .collect();
        assert_eq!(restarts.len(), 3, "{:?}", sim.log);
        assert_eq!(restarts[2], &format!("restart pod {backup}-0"));
        assert_eq!(restarts[0], "restart pod c1-0-2-0");
        assert_eq!(sim.state(), ClusterState::Ready);
    }

    /// A config change that ClickHouse reloads (a profile setting) restarts nothing.
    #[test]
    fn profile_change_restarts_nothing() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
        sim.converge(20);
        sim.cluster.spec.configuration.profiles.insert(
            "default".into(),
            BTreeMap::from([("max_threads".to_string(), "4".to_string())]),
        );
        sim.log.clear();
        sim.converge(20);
        assert!(
            sim.log
                .iter()
                .any(|l| l == "apply ConfigMap c1-common" || l == "apply Secret c1-users"),
            "{:?}",
            sim.log
        );
        assert!(
            !sim.log
                .iter()
                .any(|l| l.starts_with("restart") || l.starts_with("apply StatefulSet")),
            "{:?}",
            sim.log
        );
    }

    /// S0-03 / S2-21 / S2-22: pause stops every StatefulSet at once and says stopping, then
    /// paused; resume brings the cluster back to ready.
    #[test]
    fn pause_and_resume() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
        sim.converge(20);
        sim.cluster.spec.pause = true;
        let p = sim.plan();
        let stopped = p
            .actions
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Apply {
                        kind: Kind::StatefulSet,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(
            stopped, 3,
            "both servers and Keeper in one pass: {:?}",
            p.actions
        );
        assert_eq!(p.status.state, ClusterState::Stopping);
        sim.act(&p);
        sim.converge(10);
        assert_eq!(sim.state(), ClusterState::Paused);
        assert!(sim.map().values().all(|r| r.state == ReplicaState::Stopped));
        sim.cluster.spec.pause = false;
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Ready);
    }

    /// S0-24: a broken survivor defers the scale-in; nothing is deleted and the status says why.
    #[test]
    fn s0_24_scale_in_waits_for_every_statefulset() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 3}));
        sim.converge(20);
        let backup = sim
            .map()
            .iter()
            .find(|(_, r)| r.is_backup_pod)
            .unwrap()
            .0
            .clone();
        let pod = format!("{backup}-0");
        sim.broken.insert(pod.clone());
        sim.obs.pods.remove(&pod);
        sim.settle();
        sim.cluster.spec.replicas = 2;
        for _ in 0..5 {
            let p = sim.plan();
            assert!(
                !p.actions
                    .iter()
                    .any(|a| matches!(a, Action::ScaleIn(ScaleInAction::DeleteStatefulSet { .. })))
            );
            sim.act(&p);
        }
        let msg = sim
            .cluster
            .status
            .as_ref()
            .unwrap()
            .message
            .clone()
            .unwrap();
        assert!(msg.contains(&backup), "{msg}");
        sim.broken.clear();
        sim.obs.pods.remove(&pod);
        sim.settle();
        sim.converge(20);
        assert_eq!(sim.map().len(), 2);
    }

    /// S2-23: turning TLS on stops every server, then starts them all on the new template.
    #[test]
    fn s2_23_tls_toggle_is_a_full_stop_and_start() {
        let mut sim = Sim::new(serde_json::json!({"shards": 1, "replicas": 2}));
        sim.converge(20);
        sim.cluster.spec.tls.enabled = true;
        sim.cluster.spec.tls.server_cert_secret = Some("tls".into());
        let p = sim.plan();
        assert_eq!(
            p.status.state,
            ClusterState::Stopping,
            "{:?}",
            p.status.message
        );
        let stops: Vec<&Value> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply {
                    kind: Kind::StatefulSet,
                    object,
                    ..
                } if !object["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .ends_with("keeper") =>
                {
                    Some(object)
                }
                _ => None,
            })
            .collect();
        assert_eq!(stops.len(), 2);
        assert!(
            stops
                .iter()
                .all(|o| o["spec"]["replicas"] == 0 && !serves_tls(&o["spec"]["template"]))
        );
        sim.act(&p);
        assert!(
            !sim.obs.pods.keys().any(|p| p.starts_with("c1-0-")),
            "every server stopped"
        );
        sim.converge(20);
        assert_eq!(sim.state(), ClusterState::Ready);
        assert!(
            sim.obs
                .statefulsets
                .iter()
                .filter(|(n, _)| !n.ends_with("keeper"))
                .all(|(_, s)| serves_tls(&json_of(&s.spec)["template"]))
        );
    }

    /// Keeper membership changes one member at a time (1 → 3 goes through 2), each step only
    /// once every member is Ready.
    #[test]
    fn keeper_grows_one_member_at_a_time() {
        let mut sim =
            Sim::new(serde_json::json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}}));
        sim.converge(20);
        sim.cluster.spec.keeper.replicas = 3;
        let mut sizes = Vec::new();
        for _ in 0..10 {
            let p = sim.plan();
            for a in &p.actions {
                if let Action::Apply {
                    kind: Kind::StatefulSet,
                    name,
                    object,
                    ..
                } = a
                    && name == "c1-keeper"
                {
                    sizes.push(object["spec"]["replicas"].as_i64().unwrap());
                }
            }
            if p.actions.is_empty() {
                break;
            }
            sim.act(&p);
        }
        assert_eq!(sizes, [2, 3]);
        sim.converge(10);
        assert_eq!(sim.state(), ClusterState::Ready);
    }
}
