//! PURE: the desired state of a cluster. From a normalised `ClickHouseCluster`, the replicas of
//! `status.replicaStateMap` and what the controller read (Secret contents, passwords), these
//! functions build every Kubernetes object and every configuration file the cluster needs, and
//! classify what a spec change requires ([`changes::classify`]). Nothing here does I/O.
//!
//! What changes a pod template, and so restarts pods, is decided in one place: the hash
//! annotations of [`hash`]. Everything ClickHouse reloads at runtime (users, profiles, quotas,
//! `remote_servers`, macros, the Keeper node list, the settings of
//! [`config::settings::RELOADABLE`]) lives in files that no pod template hashes.

pub mod changes;
pub mod config;
pub mod diff;
pub mod hash;
pub mod job;
pub mod keeper;
pub mod labels;
pub mod manifest;
pub mod names;
pub mod network_policy;
pub mod pdb;
pub mod pod_template;
pub mod secret;
pub mod service;
pub mod statefulset;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::{ClickHouseCluster, ClickHouseClusterSpec, ReplicaName, ShardIndex};

/// One server replica, as `status.replicaStateMap` records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaSpec {
    /// The StatefulSet name, `<cluster>-<shard>-<index>` (see [`names::replica_name`]).
    pub name: ReplicaName,
    /// The shard, from 0.
    pub shard: ShardIndex,
    /// Global creation index: orders replicas by age, never reused.
    pub index: i64,
}

impl ReplicaSpec {
    /// The replica with creation index `index` in `shard` of `cluster`, named by
    /// [`names::replica_name`].
    pub fn new(cluster: &str, shard: ShardIndex, index: i64) -> Self {
        ReplicaSpec {
            name: names::replica_name(cluster, shard, index),
            shard,
            index,
        }
    }

    /// The replica `name` as its entry of the ReplicaStateMap has it.
    pub fn of(name: &ReplicaName, entry: &crate::api::ReplicaStatus) -> Self {
        ReplicaSpec {
            name: name.clone(),
            shard: entry.shard,
            index: entry.index,
        }
    }
}

/// A plain password. It reaches no built object except the operator's own Secret; its `Debug`
/// never shows it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Password(pub String);

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// The data of one Secret, as the controller read it.
pub type SecretData = BTreeMap<String, Vec<u8>>;

/// What the controller read for the builders.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// The server replicas (all entries of `status.replicaStateMap`).
    pub replicas: Vec<ReplicaSpec>,
    /// Condemned replicas whose StatefulSet still exists: out of `remote_servers`, but a client
    /// connected to one before it left can still insert through its Distributed tables, which
    /// forward to the others as the cluster's account; the accounts of the cluster's servers
    /// accept them until they are deleted (S0-22).
    pub leaving: Vec<ReplicaSpec>,
    /// The replicas listed in `remote_servers`, when not all of `replicas`: the planner lists a
    /// new replica only once its pod has an address, because ClickHouse 18.16 refuses a whole
    /// configuration reload while a host in it does not resolve.
    pub listed: Option<Vec<ReplicaSpec>>,
    /// Data of the referenced TLS, CA and environment Secrets, by Secret name. A Secret missing
    /// here hashes as absent: when it appears, the pods roll.
    pub secrets: BTreeMap<String, SecretData>,
    /// Users and their plain passwords, from the Secret `spec.users.secretName`.
    pub user_passwords: BTreeMap<String, Password>,
    /// The operator's own password, from the Secret `<cluster>-operator`.
    pub operator_password: Password,
    /// The password of replication between the servers, from the same Secret (none for a
    /// cluster created before it existed, until it is added there).
    pub interserver_password: Option<Password>,
    /// Where the operator, its backup agents and the exporter connect from
    /// (`OPERATOR_NETWORKS`): the networks of the operator's account and, by default, of the
    /// users of `spec.users`.
    pub operator_networks: Vec<String>,
    /// Where the operator's pods are (`OPERATOR_POD_SELECTOR` in its namespace), for the
    /// NetworkPolicies; `None`: they allow the operator's networks instead.
    pub operator_pods: Option<network_policy::OperatorPods>,
    /// The password of the account the servers reach each other with ([`names::CLUSTER_USER`]),
    /// from the same Secret (none for a cluster created before it existed).
    pub cluster_password: Option<Password>,
    /// The password of ClickHouse's Keeper identity, from the same Secret (none for a cluster
    /// created before it existed, until it is added there).
    pub keeper_password: Option<Password>,
    /// The cluster's `<secret>`, from the same Secret (none for a cluster created before it
    /// existed, until it is added there); written only where `server_version` has it.
    pub cluster_secret: Option<Password>,
    /// The lowest version the cluster's servers run, as far as the operator knows (see
    /// [`crate::plan::fleet`]); `None`: unknown, and nothing version-dependent is written.
    pub server_version: Option<crate::version::Version>,
    /// The password of the metrics exporter's read-only account, from `<cluster>-operator`.
    pub exporter_password: Option<Password>,
    /// The S3 credentials of the cluster's backup destinations (`spec.backup.destination` and
    /// `allowedDestinations`, each from a Secret that opts in), as named collections the
    /// servers' `BACKUP`/`RESTORE` statements name instead of carrying the keys; written only
    /// where `server_version` has [`crate::version::Capability::BackupNamedCollection`].
    pub backup_collections: Vec<S3Collection>,
}

/// One backup destination's bucket and keys as a named collection of the servers'
/// configuration (`<named_collections>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Collection {
    /// [`S3Collection::name_of`] the destination.
    pub name: String,
    /// [`S3Collection::url_of`] the destination.
    pub url: String,
    pub auth: S3Auth,
}

/// How a server signs the requests of a named collection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum S3Auth {
    /// A Secret's keys, in the collection.
    Keys {
        access_key_id: String,
        secret_access_key: String,
    },
    /// The server's own environment: the role of the cluster's `spec.backup.destination`
    /// `webIdentity`, whose token and variables the server pods carry (decision 43).
    Environment,
}

impl S3Collection {
    /// The collection that holds destination `d`'s bucket and keys (`chop_s3_<hash>`, a plain
    /// identifier in statements and grants): the same for every prefix in the bucket, another
    /// for another endpoint, bucket, Secret or key name.
    pub fn name_of(d: &crate::api::S3Destination) -> String {
        let mut identity = serde_json::json!([
            d.endpoint.trim_end_matches('/'),
            d.bucket,
            d.secret_name,
            d.access_key_id_key(),
            d.secret_access_key_key(),
        ]);
        // a destination with web identity is another collection for each role and account
        if let (Some(w), Some(list)) = (&d.web_identity, identity.as_array_mut()) {
            list.push(serde_json::json!([
                w.role_arn,
                w.service_account_name,
                w.audience()
            ]));
        }
        format!("chop_s3_{}", hash::json_hash(&identity))
    }

    /// The URL of destination `d`'s bucket, ending in `/` (a statement names a folder in it).
    pub fn url_of(d: &crate::api::S3Destination) -> String {
        format!("{}/{}/", d.endpoint.trim_end_matches('/'), d.bucket)
    }
}

/// Why the desired state cannot be built; each names the field the user can fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The resource lacks a name, namespace or uid (it was not read from the API server).
    #[error("the ClickHouseCluster has no {0}: it must come from the API server")]
    MissingMetadata(&'static str),
    /// A user-given name cannot be an element of a ClickHouse configuration file.
    #[error(
        "{field}: {name:?} is not a valid name (a letter or '_' first, then letters, digits, '_', '-', '.')"
    )]
    InvalidName { field: String, name: String },
    /// A user file would replace a file the operator generates.
    #[error("spec.configuration.files: {0:?} is reserved for the operator's own files (prefix {prefix})", prefix = config::server::OPERATOR_FILE_PREFIX)]
    ReservedFile(String),
    /// The user's pod template sets what the operator owns, or is not a pod template.
    #[error("{field}: {detail}")]
    PodTemplate { field: String, detail: String },
    /// An environment Secret holds a variable the operator or the image's entrypoint owns.
    #[error("{field}: {detail}")]
    ReservedEnv { field: String, detail: String },
    /// A key or value of the users Secret the users file cannot take (the message names the
    /// key, never the value).
    #[error("{field}: {detail}")]
    UsersSecret { field: String, detail: String },
    /// A field the servers' version does not have.
    #[error("{field}: {detail}")]
    Unsupported { field: String, detail: String },
    /// A Kubernetes quantity that does not parse.
    #[error("{field}: {value:?} is not a quantity such as 10Gi")]
    InvalidQuantity { field: &'static str, value: String },
}

/// The cluster being built: identity, owner and spec.
#[derive(Clone, Debug)]
pub struct Cluster<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub spec: &'a ClickHouseClusterSpec,
    /// Controller owner reference to the ClickHouseCluster, put on every object.
    pub owner: OwnerReference,
    /// The one-shot rolling restart the server pods carry ([`labels::RESTARTED_AT`]): the
    /// annotation [`labels::RESTART_AT`] when it is a timestamp, else the last one recorded
    /// (`status.restartedAt`), so that removing the annotation restarts nothing (decision 51).
    pub restart_at: Option<String>,
    /// Keeper members to build for: `spec.keeper.replicas`, or the size a pass steps the
    /// ensemble through on its way there ([`Cluster::with_keeper_members`]).
    pub keeper_members: i32,
    /// Keeper pods to run: `keeper_members`, or one more while a leaving member's pod runs
    /// until the others have let it go ([`Cluster::with_keeper_pods`]).
    pub keeper_pods: i32,
}

impl<'a> Cluster<'a> {
    /// This cluster built for `members` Keeper members (a membership change goes one member
    /// at a time).
    pub fn with_keeper_members(self, members: i32) -> Self {
        Cluster {
            keeper_members: members,
            keeper_pods: members,
            ..self
        }
    }

    /// This cluster with `pods` Keeper pods for its members: one more than the members while
    /// a leaving member's pod still runs.
    pub fn with_keeper_pods(self, pods: i32) -> Self {
        Cluster {
            keeper_pods: pods,
            ..self
        }
    }

    /// Takes name, namespace and uid (for the owner reference) from the resource.
    pub fn new(c: &'a ClickHouseCluster) -> Result<Self, BuildError> {
        let name = c
            .metadata
            .name
            .as_deref()
            .ok_or(BuildError::MissingMetadata("name"))?;
        let namespace = c
            .metadata
            .namespace
            .as_deref()
            .ok_or(BuildError::MissingMetadata("namespace"))?;
        let owner = c
            .controller_owner_ref(&())
            .ok_or(BuildError::MissingMetadata("uid"))?;
        let restart_at = labels::restart_at(c)
            .and_then(Result::ok)
            .or_else(|| c.status.as_ref()?.restarted_at.clone());
        Ok(Cluster {
            name,
            namespace,
            spec: &c.spec,
            owner,
            restart_at,
            keeper_members: c.spec.keeper.replicas,
            keeper_pods: c.spec.keeper.replicas,
        })
    }

    /// Metadata of an owned object: name, namespace, labels and the owner reference.
    pub fn meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.to_string()),
            labels: Some(labels),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// Every object of the Keeper ensemble.
#[derive(Clone, Debug)]
pub struct KeeperObjects {
    pub config: ConfigMap,
    pub statefulset: StatefulSet,
    pub headless_service: Service,
    pub client_service: Service,
    pub pdb: PodDisruptionBudget,
}

/// Every object a cluster needs, except the operator's own Secret
/// ([`secret::operator_secret`]), which is created once and never rebuilt.
#[derive(Clone, Debug)]
pub struct Desired {
    /// `<cluster>-common`: configuration shared by every replica.
    pub common_config: ConfigMap,
    /// `<sts>` per replica: macros and interserver host.
    pub replica_configs: Vec<ConfigMap>,
    /// `<cluster>-users`: the users file with password hashes.
    pub users_secret: Secret,
    /// One StatefulSet per replica, in the order of [`Inputs::replicas`].
    pub server_statefulsets: Vec<StatefulSet>,
    /// `<cluster>-headless`.
    pub headless_service: Service,
    /// `<cluster>`, unless `spec.clientService.enabled` is false.
    pub client_service: Option<Service>,
    /// `<replica>-client` per replica, with `spec.clientService.perReplica`.
    pub replica_services: Vec<Service>,
    /// `<cluster>-shard-<n>` per shard.
    pub shard_pdbs: Vec<PodDisruptionBudget>,
    /// The Keeper ensemble, unless `spec.keeper.replicas` is 0.
    pub keeper: Option<KeeperObjects>,
    /// `<cluster>-server` and `<cluster>-keeper`, unless `spec.networkPolicy.enabled` is false.
    pub network_policies: Vec<k8s_openapi::api::networking::v1::NetworkPolicy>,
}

/// Builds every object of the cluster, each stamped with [`labels::OBJECT_HASH`] (and the
/// StatefulSets with [`labels::TEMPLATE_HASH`]).
pub fn desired(c: &Cluster<'_>, inputs: &Inputs) -> Result<Desired, BuildError> {
    check_env_secrets(c, &inputs.secrets)?;
    let mut d = unstamped(c, inputs)?;
    stamp_all(&mut d);
    Ok(d)
}

/// `<cluster>-users` alone, stamped as [`desired`] stamps it.
pub fn users_secret(c: &Cluster<'_>, inputs: &Inputs) -> Result<Secret, BuildError> {
    let listed = inputs.listed.as_ref().unwrap_or(&inputs.replicas);
    let mut secret = secret::users_secret(c, inputs, listed)?;
    stamp(&mut secret);
    Ok(secret)
}

/// The environment Secrets (`spec.pod.envSecret`, `spec.keeper.pod.envSecret`) hold no key the
/// operator or the image's entrypoint owns ([`crate::api::SERVER_RESERVED_ENV`],
/// [`crate::api::KEEPER_RESERVED_ENV`]): validation refuses the same names in `env`, but a
/// Secret's keys are known only once it is read. A Secret not read (yet) is not checked here.
fn check_env_secrets(
    c: &Cluster<'_>,
    secrets: &BTreeMap<String, SecretData>,
) -> Result<(), BuildError> {
    let pods = [
        (
            "spec.pod.envSecret",
            &c.spec.pod,
            crate::api::SERVER_RESERVED_ENV,
        ),
        (
            "spec.keeper.pod.envSecret",
            &c.spec.keeper.pod,
            crate::api::KEEPER_RESERVED_ENV,
        ),
    ];
    for (field, pod, reserved) in pods {
        let Some(name) = &pod.env_secret else {
            continue;
        };
        let Some(data) = secrets.get(name) else {
            continue;
        };
        let found: Vec<&str> = data
            .keys()
            .map(String::as_str)
            .filter(|k| reserved.contains(k))
            .collect();
        if !found.is_empty() {
            return Err(BuildError::ReservedEnv {
                field: field.into(),
                detail: format!(
                    "Secret {name:?} has key(s) {}, which the operator sets or the image's \
                     entrypoint acts on against the operator's configuration (reserved: {})",
                    found.join(", "),
                    reserved.join(", ")
                ),
            });
        }
    }
    Ok(())
}

fn stamp<K: Resource + serde::Serialize>(obj: &mut K) {
    let mut value = serde_json::to_value(&*obj).expect("Kubernetes objects serialise");
    hash::restamp(&mut value);
    let h = value["metadata"]["annotations"][labels::OBJECT_HASH]
        .as_str()
        .unwrap_or_default()
        .to_string();
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::OBJECT_HASH.into(), h);
}

/// Fields of the pod template an operator version added after clusters already ran without
/// them, as paths under `spec.template`: the template hash leaves them out, so a StatefulSet
/// written by an older version is not rolled for them (invariant 9: upgrading the operator
/// restarts no pod); they reach the pods with the next restart the cluster's own spec causes.
/// Each one's absence must be covered by its value (see `diff::covers`: `false` is).
pub const DEFERRED_TEMPLATE_FIELDS: &[&[&str]] = &[&["spec", "automountServiceAccountToken"]];

/// The volumes of credentials the operator generates (server configuration and users files,
/// TLS certificate and CA), mounted readable by the owner and the pod's `fsGroup` only
/// ([`SECRET_FILE_MODE`], decision 34).
pub const SECRET_VOLUMES: &[&str] = &["config-d", "users-d", "tls", "ca"];

/// `defaultMode` of [`SECRET_VOLUMES`]: 0440 (the servers and Keeper run as the `fsGroup`).
pub const SECRET_FILE_MODE: i32 = 0o440;

/// `template` with the `defaultMode` of each of [`SECRET_VOLUMES`] as `kept` (the observed
/// template) has it; `None` removes it. Like [`DEFERRED_TEMPLATE_FIELDS`], the mode came after
/// clusters already ran without it (the API server wrote 0644 for them) and reaches their pods
/// with their next restart: it is left out of the template hash and a different mode alone
/// restarts nothing (invariant 9).
pub fn with_deferred_modes(
    mut template: serde_json::Value,
    kept: Option<&serde_json::Value>,
) -> serde_json::Value {
    let observed = |name: &str, kind: &str| -> Option<serde_json::Value> {
        kept?["spec"]["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v[kind]["defaultMode"].clone())
    };
    let Some(volumes) = template["spec"]["volumes"].as_array_mut() else {
        return template;
    };
    for v in volumes {
        let Some(name) = v["name"].as_str().map(str::to_string) else {
            continue;
        };
        if !SECRET_VOLUMES.contains(&name.as_str()) {
            continue;
        }
        for kind in ["secret", "projected"] {
            let Some(source) = v.get_mut(kind).and_then(|s| s.as_object_mut()) else {
                continue;
            };
            match (kept, observed(&name, kind)) {
                // a volume the observed template does not have yet takes the new mode
                (Some(_), None) => {}
                (Some(_), Some(serde_json::Value::Null)) | (None, _) => {
                    source.remove("defaultMode");
                }
                (Some(_), Some(mode)) => {
                    source.insert("defaultMode".into(), mode);
                }
            }
        }
    }
    template
}

/// `terminationMessagePolicy` of the server and Keeper containers: a container that fails ends
/// with the tail of its log as termination message, which the status reports (decision 30).
pub const LOG_ON_ERROR: &str = "FallbackToLogsOnError";

/// `template` with the `terminationMessagePolicy` of the server and Keeper containers as
/// `kept` (the observed template) has it; `None` removes it. Like [`with_deferred_modes`], the
/// policy came after clusters already ran without it (the API server wrote `File` for them)
/// and reaches their pods with their next restart: it is left out of the template hash and a
/// different policy alone restarts nothing (invariant 9).
pub fn with_deferred_log_policy(
    mut template: serde_json::Value,
    kept: Option<&serde_json::Value>,
) -> serde_json::Value {
    const KEY: &str = "terminationMessagePolicy";
    let observed = |name: &str| -> Option<serde_json::Value> {
        kept?["spec"]["containers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c[KEY].clone())
    };
    let Some(containers) = template["spec"]["containers"].as_array_mut() else {
        return template;
    };
    for c in containers {
        let Some(name) = c["name"].as_str().map(str::to_string) else {
            continue;
        };
        if name != statefulset::SERVER_CONTAINER && name != keeper::KEEPER_CONTAINER {
            continue;
        }
        let Some(fields) = c.as_object_mut() else {
            continue;
        };
        match (kept, observed(&name)) {
            // a container the observed template does not have yet takes the policy
            (Some(_), None) => {}
            (Some(_), Some(serde_json::Value::Null)) | (None, _) => {
                fields.remove(KEY);
            }
            (Some(_), Some(policy)) => {
                fields.insert(KEY.into(), policy);
            }
        }
    }
    template
}

/// The Keeper container's command as operator versions before the data-directory and
/// host-name fixes wrote it: template hashes count the command as this one, so that a
/// StatefulSet written then keeps its hash.
const EARLIER_KEEPER_COMMAND: &str =
    "export KEEPER_SERVER_ID=$(( ${HOSTNAME##*-} + 1 )); exec /entrypoint.sh";

/// The startup probe's checks (2 s apart) with the default budget of operator versions before
/// the budget grew with the volume.
const EARLIER_KEEPER_STARTUP_CHECKS: i32 = 30;

/// A Keeper startup probe of a default budget: earlier versions' (30 checks 2 s apart) or this
/// version's ([`crate::api::KEEPER_DEFAULT_STARTUP_PERIOD`]).
fn is_default_startup_probe(p: &serde_json::Value) -> bool {
    let period = &p["periodSeconds"];
    *period == serde_json::json!(crate::api::KEEPER_DEFAULT_STARTUP_PERIOD)
        || (*period == serde_json::json!(2)
            && p["failureThreshold"] == serde_json::json!(EARLIER_KEEPER_STARTUP_CHECKS))
}

/// Whether the Keeper container of `desired` (a pod template) has launch fixes that the
/// observed template lacks and [`with_deferred_keeper_launch`] holds back: the command, the
/// data directory, the default startup budget (decision 67: such fixes reach a crash-looping
/// member at once).
pub fn keeper_launch_held_back(desired: &serde_json::Value, observed: &serde_json::Value) -> bool {
    with_deferred_keeper_launch(desired.clone(), Some(observed)) != *desired
}

/// `template` with the Keeper container's command and its [`keeper::DATA_DIR_ENV`] variable
/// as `kept` (the observed template) has them; `None` gives the command earlier versions
/// wrote and no such variable (the form template hashes are taken over). Like
/// [`with_deferred_modes`], both came after ensembles already ran without them (decision 42) and
/// reach their pods with the next change that rolls them: a different command or variable
/// alone restarts nothing (invariant 9).
pub fn with_deferred_keeper_launch(
    mut template: serde_json::Value,
    kept: Option<&serde_json::Value>,
) -> serde_json::Value {
    let observed = kept.map(|k| {
        k["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == keeper::KEEPER_CONTAINER))
            .cloned()
    });
    let Some(containers) = template["spec"]["containers"].as_array_mut() else {
        return template;
    };
    let Some(c) = containers
        .iter_mut()
        .find(|c| c["name"] == keeper::KEEPER_CONTAINER)
        .and_then(|c| c.as_object_mut())
    else {
        return template;
    };
    let (command, data_dir) = match &observed {
        // a container the observed template does not have yet takes both
        Some(None) => return template,
        Some(Some(o)) => {
            let has_data_dir = o["env"]
                .as_array()
                .is_some_and(|e| e.iter().any(|v| v["name"] == keeper::DATA_DIR_ENV));
            (o.get("command").cloned(), has_data_dir)
        }
        None => (
            Some(serde_json::json!([
                "/bin/bash",
                "-c",
                EARLIER_KEEPER_COMMAND
            ])),
            false,
        ),
    };
    match command {
        Some(command) => c.insert("command".into(), command),
        None => c.remove("command"),
    };
    // the default startup budget that grows with the volume (decision 67; its probe checks
    // every KEEPER_DEFAULT_STARTUP_PERIOD s): a member keeps the default probe it was written
    // with, and the hash form is the one of earlier versions, 30 checks 2 s apart
    let desired_probe = c.get("startupProbe").cloned().unwrap_or_default();
    let default_budget = desired_probe["periodSeconds"]
        == serde_json::json!(crate::api::KEEPER_DEFAULT_STARTUP_PERIOD);
    if default_budget {
        let earlier = || {
            let mut p = desired_probe.clone();
            p["periodSeconds"] = serde_json::json!(2);
            p["failureThreshold"] = serde_json::json!(EARLIER_KEEPER_STARTUP_CHECKS);
            p
        };
        let probe = match &observed {
            None => Some(earlier()),
            Some(Some(o)) if is_default_startup_probe(&o["startupProbe"]) => {
                Some(o["startupProbe"].clone())
            }
            _ => None,
        };
        if let Some(p) = probe {
            c.insert("startupProbe".into(), p);
        }
    }
    if !data_dir && let Some(env) = c.get_mut("env").and_then(|e| e.as_array_mut()) {
        env.retain(|v| v["name"] != keeper::DATA_DIR_ENV);
        if env.is_empty() {
            c.remove("env");
        }
    }
    template
}

/// [`with_deferred_modes`], [`with_deferred_log_policy`] and
/// [`with_deferred_keeper_launch`].
pub fn with_deferred(
    template: serde_json::Value,
    kept: Option<&serde_json::Value>,
) -> serde_json::Value {
    with_deferred_keeper_launch(
        with_deferred_log_policy(with_deferred_modes(template, kept), kept),
        kept,
    )
}

/// Is `term` (an item of `preferredDuringSchedulingIgnoredDuringExecution`) the default
/// anti-affinity that keeps a shard's replicas or the Keeper members apart
/// ([`crate::api::AntiAffinity::Preferred`] left unset)? Like [`DEFERRED_TEMPLATE_FIELDS`], it
/// came after clusters already ran without it and reaches their pods at their next restart.
fn is_default_apart(term: &serde_json::Value) -> bool {
    let t = &term["podAffinityTerm"];
    let labels = &t["labelSelector"]["matchLabels"];
    term["weight"] == statefulset::DEFAULT_APART_WEIGHT
        && t["topologyKey"] == statefulset::HOSTNAME_KEY
        && t.as_object().is_some_and(|o| o.len() == 2)
        && labels.get(labels::CLUSTER).is_some()
        && (labels.get(labels::SHARD).is_some()
            || labels[labels::COMPONENT] == labels::Component::Keeper.as_str())
}

/// `template` without the default anti-affinity terms ([`is_default_apart`]) and the shard
/// spread constraints ([`is_shard_spread`]) that `kept` (the observed template) does not have;
/// `None` removes them all. Emptied containers go too, so a template written without them
/// hashes and compares as before they existed.
pub fn without_default_apart(
    template: &serde_json::Value,
    kept: Option<&serde_json::Value>,
) -> serde_json::Value {
    const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";
    let mut t = without_shard_spread(template.clone(), kept);
    let observed_terms: Vec<serde_json::Value> = kept
        .and_then(|k| {
            k["spec"]["affinity"]["podAntiAffinity"][PREFERRED]
                .as_array()
                .cloned()
        })
        .unwrap_or_default();
    let Some(affinity) = t["spec"].get_mut("affinity") else {
        return t;
    };
    if let Some(anti) = affinity.get_mut("podAntiAffinity") {
        if let Some(list) = anti.get_mut(PREFERRED).and_then(|l| l.as_array_mut()) {
            list.retain(|term| !is_default_apart(term) || observed_terms.contains(term));
            if list.is_empty() {
                anti.as_object_mut().map(|o| o.remove(PREFERRED));
            }
        }
        if anti.as_object().is_some_and(|o| o.is_empty()) {
            affinity
                .as_object_mut()
                .map(|o| o.remove("podAntiAffinity"));
        }
    }
    if affinity.as_object().is_some_and(|o| o.is_empty()) {
        t["spec"].as_object_mut().map(|o| o.remove("affinity"));
    }
    t
}

/// Is `c` (an item of `topologySpreadConstraints`) the spread of one shard's replicas that
/// `topologySpreadKey` adds beside the cluster-wide one? Like [`is_default_apart`], it came
/// after clusters already ran without it and reaches their pods at their next restart.
fn is_shard_spread(c: &serde_json::Value) -> bool {
    c["labelSelector"]["matchLabels"]
        .get(labels::SHARD)
        .is_some()
        && c["whenUnsatisfiable"] == "ScheduleAnyway"
}

/// `template` without the shard spread constraints ([`is_shard_spread`]) that `kept` (the
/// observed template) does not have; `None` removes them all.
fn without_shard_spread(
    mut t: serde_json::Value,
    kept: Option<&serde_json::Value>,
) -> serde_json::Value {
    let observed: Vec<serde_json::Value> = kept
        .and_then(|k| k["spec"]["topologySpreadConstraints"].as_array().cloned())
        .unwrap_or_default();
    if let Some(list) = t["spec"]
        .get_mut("topologySpreadConstraints")
        .and_then(|l| l.as_array_mut())
    {
        let before = list.len();
        list.retain(|c| !is_shard_spread(c) || observed.contains(c));
        if list.len() < before {
            // a template written before the shard spread spread the cluster's servers
            // instead, with the same key: it keeps that one until its next restart
            list.extend(observed.iter().filter(|c| is_cluster_spread(c)).cloned());
        }
        if list.is_empty() {
            t["spec"]
                .as_object_mut()
                .map(|o| o.remove("topologySpreadConstraints"));
        }
    }
    t
}

/// Is `c` the spread of all the cluster's servers that `topologySpreadKey` gave before the
/// shard spread ([`is_shard_spread`]) replaced it?
fn is_cluster_spread(c: &serde_json::Value) -> bool {
    let labels = &c["labelSelector"]["matchLabels"];
    labels.get(labels::CLUSTER).is_some()
        && labels.get(labels::SHARD).is_none()
        && labels[labels::COMPONENT] == labels::Component::Server.as_str()
        && c["whenUnsatisfiable"] == "ScheduleAnyway"
}

/// The pod template's hash, without [`DEFERRED_TEMPLATE_FIELDS`] and the default anti-affinity
/// ([`without_default_apart`]).
pub fn template_hash(template: &serde_json::Value) -> String {
    // a shard's spread hashes as the cluster-wide spread over the same key that it replaced,
    // so that neither restarts a pod written with the other (invariant 9)
    let mut spread_as_before = template.clone();
    if let Some(list) = spread_as_before["spec"]
        .get_mut("topologySpreadConstraints")
        .and_then(|l| l.as_array_mut())
    {
        for c in list.iter_mut().filter(|c| is_shard_spread(c)) {
            if let Some(m) = c["labelSelector"]["matchLabels"].as_object_mut() {
                m.remove(labels::SHARD);
            }
        }
    }
    let mut t = with_deferred(without_default_apart(&spread_as_before, None), None);
    for path in DEFERRED_TEMPLATE_FIELDS {
        let (last, parents) = path.split_last().expect("non-empty path");
        let mut at = &mut t;
        for p in parents {
            at = &mut at[*p];
        }
        if let Some(m) = at.as_object_mut() {
            m.remove(*last);
        }
    }
    hash::json_hash(&t)
}

fn stamp_statefulset(sts: &mut StatefulSet) {
    let template = serde_json::to_value(&sts.spec.template).expect("Kubernetes objects serialise");
    sts.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::TEMPLATE_HASH.into(), template_hash(&template));
    stamp(sts);
}

fn stamp_all(d: &mut Desired) {
    stamp(&mut d.common_config);
    d.replica_configs.iter_mut().for_each(stamp);
    stamp(&mut d.users_secret);
    d.server_statefulsets.iter_mut().for_each(stamp_statefulset);
    stamp(&mut d.headless_service);
    d.client_service.iter_mut().for_each(stamp);
    d.replica_services.iter_mut().for_each(stamp);
    d.shard_pdbs.iter_mut().for_each(stamp);
    d.network_policies.iter_mut().for_each(stamp);
    if let Some(k) = &mut d.keeper {
        stamp(&mut k.config);
        stamp_statefulset(&mut k.statefulset);
        stamp(&mut k.headless_service);
        stamp(&mut k.client_service);
        stamp(&mut k.pdb);
    }
}

fn unstamped(c: &Cluster<'_>, inputs: &Inputs) -> Result<Desired, BuildError> {
    config::server::check_protocols(c, inputs.server_version)?;
    let mut common = config::server::common_files(c)?;
    common.push(config::server::ConfigFile {
        name: config::system_logs::SYSTEM_LOGS_FILE.into(),
        content: config::system_logs::file(
            c.spec,
            config::system_logs::version_for(inputs.server_version, &c.spec.image),
        ),
        effect: config::server::Effect::NextStart,
    });
    common.sort_by(|a, b| a.name.cmp(&b.name));
    let listed = inputs.listed.as_ref().unwrap_or(&inputs.replicas);
    let mut hashes = hash::server_hashes(c.spec, &common, &inputs.secrets);
    if let Some(at) = &c.restart_at {
        hashes.insert(labels::RESTARTED_AT, at.clone());
    }
    if let Some(p) = &inputs.interserver_password {
        hashes.insert(
            labels::INTERSERVER_HASH,
            hash::secret_hash(Some(&SecretData::from([(
                names::INTERSERVER_PASSWORD_KEY.to_string(),
                p.0.clone().into_bytes(),
            )]))),
        );
    }
    let server_statefulsets = inputs
        .replicas
        .iter()
        .map(|r| statefulset::server(c, r, &hashes, &secret::config_files(inputs)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Desired {
        common_config: config::server::common_config_map(c, &common),
        replica_configs: inputs
            .replicas
            .iter()
            .map(|r| config::server::replica_config_map(c, r))
            .collect(),
        users_secret: secret::users_secret(c, inputs, listed)?,
        server_statefulsets,
        headless_service: service::headless(c),
        client_service: service::client(c),
        replica_services: service::per_replica(c, &inputs.replicas),
        shard_pdbs: pdb::shards(c, &inputs.replicas),
        keeper: keeper::objects(c, &inputs.secrets)?,
        network_policies: network_policy::policies(c, inputs),
    })
}

#[cfg(test)]
mod tests;
