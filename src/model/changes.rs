//! PURE: what a spec change needs, per component — the table of S2-14…S2-23 carried over to
//! ClickHouse (S2-14 … S2-23). The planner does not read these needs: it compares each built
//! object with the one observed, and rolls exactly the StatefulSets whose pod template changed
//! ([`pod_template_changed`], the one test of a restart). [`classify`] names, for the `plan`
//! preview, the fields of a change and what each needs, and takes its restarts from that same
//! test. The table of docs/changes.md is this module's: each row is a test here.
//!
//! | change | server | keeper |
//! |---|---|---|
//! | `shards`, `replicas` | [`Need::Scale`] + [`Need::ConfigReload`] (remote_servers) | — |
//! | `shardWeights` | [`Need::ConfigReload`] (remote_servers) | — |
//! | `keeper.replicas` | [`Need::ConfigReload`] (Keeper node list) | [`Need::Scale`] + [`Need::ConfigReload`] (raft members) |
//! | image, resources, env, envSecret, affinity, antiAffinity, tolerations, nodeSelector, sidecars, pod labels/annotations, topologySpreadKey, `pod.template` | [`Need::RollingRestart`] | the same for `keeper.*` |
//! | settings ClickHouse reloads ([`crate::model::config::settings::RELOADABLE`]) | [`Need::ConfigReload`] | — |
//! | other settings, `configuration.files` | [`Need::RollingRestart`] | — |
//! | `configuration.secretSettings`, `secretFiles`, or the contents of the keys they name (`users.d` files: reloaded) | [`Need::RollingRestart`] | — |
//! | `configuration.files` `users.d/…` contents / added or removed | [`Need::ConfigReload`] / [`Need::RollingRestart`] | — |
//! | profiles, quotas, `users` | [`Need::ConfigReload`] | — |
//! | TLS / env Secret contents (the pod templates' hash annotations, [`crate::model::hash`]) | [`Need::RollingRestart`] | env Secret: [`Need::RollingRestart`] |
//! | storage size larger (data volume, a disk, the log volume), volume scaling on | [`Need::PvcResize`] | the same for `keeper.storage` |
//! | storage smaller, class changed, or larger without volume scaling | [`Need::Refused`] | the same |
//! | `storage.disks` or `storage.logs` added / removed | [`Need::RollingRestart`] (StatefulSets recreated, pods kept until restarted) / [`Need::Refused`] | — |
//! | `storage.policies` | [`Need::RollingRestart`] | — |
//! | `storage.labels`, `storage.annotations` | [`Need::ObjectUpdate`] (StatefulSets recreated with their pods kept, existing PVCs patched) | the same for `keeper.storage` |
//! | `clusterDomain`, `keeper.tls` | [`Need::Refused`] | [`Need::Refused`] |
//! | `keeper.external` nodes or cluster | [`Need::ConfigReload`] (zookeeper nodes) | — |
//! | `keeper.external.root` | [`Need::Refused`] | — |
//! | `keeper.settings` | — | [`Need::RollingRestart`] |
//! | `configuration.shardFiles` | [`Need::RollingRestart`] of that shard's replicas | — |
//! | `configuration.replicaFiles` | [`Need::RollingRestart`] of that replica | — |
//! | `pause` false → true / true → false | [`Need::StopAll`] / [`Need::StartAll`] | the same |
//! | `tls.enabled` toggled | [`Need::FullStopStart`] | — |
//! | `tls.required`, certificate Secret names, `serverMetrics` | [`Need::RollingRestart`] | — |
//! | `protocols` | [`Need::RollingRestart`] (ports of the pods; Services and NetworkPolicy updated) | — |
//! | `logging.level` / `logging.format`, `size`, `count`, `files` | [`Need::ConfigReload`] / [`Need::RollingRestart`] | — |
//! | `systemLogs` set or changed / unset with a new operator version (the default TTLs) | [`Need::RollingRestart`] / nothing (at the next restart) | — |
//! | `updateStrategy`, `podDisruptionBudget`, `clientService`, `networkPolicy` | [`Need::ObjectUpdate`] | — |
//! | `backup.destination.webIdentity` set, changed or removed | [`Need::RollingRestart`] | — |
//! | `schemaPolicy`, `backup`, `crVersion`, `storage.reclaimPolicy`, `catchUpSeconds`, `upgradeOptions` | nothing | nothing |

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::api::{
    ClickHouseCluster, ClickHouseClusterSpec, PodSettings, ServerStorageSpec, StorageSpec,
};
use crate::model::config::settings::needs_restart;
use crate::model::diff::covers;
use crate::model::labels;
use crate::model::{Cluster, Desired, Inputs, Password, ReplicaSpec, desired};
use crate::util::quantity;

/// What a change needs from one component. Ordered from least to most disruptive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Need {
    /// Objects change outside the pod template (Services, budgets, update strategy): no restart.
    ObjectUpdate,
    /// Replica count changes: replicas are added or removed in parallel, no restart (S2-14).
    Scale,
    /// Files ClickHouse reloads at runtime change: no restart.
    ConfigReload,
    /// Larger storage: PVCs are patched and the StatefulSet recreated with orphaned pods, no
    /// restart (S2-18).
    PvcResize,
    /// The pod template changes: pods restart one at a time (S2-15, S2-16).
    RollingRestart,
    /// `pause` set: every StatefulSet to 0, data kept (S2-21).
    StopAll,
    /// `pause` cleared: every StatefulSet back to its size (S2-22).
    StartAll,
    /// `tls.enabled` toggled: stop everything, switch, start again (S2-23).
    FullStopStart,
    /// The change cannot be applied (the reason says why); the rest still is.
    Refused,
}

/// One need and the spec field that causes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reason {
    pub need: Need,
    /// The field, e.g. `spec.image`, or a description for Secret contents and refusals.
    pub field: String,
}

/// The needs of one component, with their reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComponentChanges {
    reasons: BTreeSet<Reason>,
}

impl ComponentChanges {
    fn add(&mut self, need: Need, field: impl Into<String>) {
        self.reasons.insert(Reason {
            need,
            field: field.into(),
        });
    }

    /// Whether any change needs `need`.
    pub fn needs(&self, need: Need) -> bool {
        self.reasons.iter().any(|r| r.need == need)
    }

    /// Every distinct need.
    pub fn all(&self) -> BTreeSet<Need> {
        self.reasons.iter().map(|r| r.need).collect()
    }

    /// Every need with its field.
    pub fn reasons(&self) -> impl Iterator<Item = &Reason> {
        self.reasons.iter()
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.reasons.is_empty()
    }

    /// Makes the restart verdict the built pod templates' (`restarts`): a field change that
    /// leaves the template as it is (say, an empty affinity) restarts nothing, and a template
    /// change no field explains still rolls.
    fn restarts_as_built(&mut self, restarts: bool) {
        let claimed = self.needs(Need::RollingRestart) || self.needs(Need::FullStopStart);
        if restarts && !claimed {
            self.add(Need::RollingRestart, "the pod template");
        } else if !restarts && claimed {
            let rolled: Vec<Reason> = self
                .reasons
                .iter()
                .filter(|r| matches!(r.need, Need::RollingRestart | Need::FullStopStart))
                .cloned()
                .collect();
            for r in rolled {
                self.reasons.remove(&r);
            }
        }
    }
}

/// The needs of a change, per component.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub server: ComponentChanges,
    pub keeper: ComponentChanges,
}

impl Changes {
    /// The union of two classifications (e.g. spec and Secret contents).
    pub fn merge(mut self, other: Changes) -> Changes {
        self.server.reasons.extend(other.server.reasons);
        self.keeper.reasons.extend(other.keeper.reasons);
        self
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.server.is_empty() && self.keeper.is_empty()
    }
}

/// Pod-template fields of a component: any difference restarts its pods.
fn pod_settings(out: &mut ComponentChanges, prefix: &str, old: &PodSettings, new: &PodSettings) {
    let mut diff = |field: &str, changed: bool| {
        if changed {
            out.add(Need::RollingRestart, format!("{prefix}.{field}"));
        }
    };
    diff("resources", old.resources != new.resources);
    diff("env", old.env != new.env);
    diff("envSecret", old.env_secret != new.env_secret);
    diff("affinity", old.affinity != new.affinity);
    diff("antiAffinity", old.anti_affinity != new.anti_affinity);
    diff("tolerations", old.tolerations != new.tolerations);
    diff("nodeSelector", old.node_selector != new.node_selector);
    diff(
        "topologySpreadKey",
        old.topology_spread_key != new.topology_spread_key,
    );
    diff("sidecars", old.sidecars != new.sidecars);
    diff("annotations", old.annotations != new.annotations);
    diff("labels", old.labels != new.labels);
    diff("startupSeconds", old.startup_seconds != new.startup_seconds);
    diff("template", old.template != new.template);
}

fn storage(
    out: &mut ComponentChanges,
    field: &str,
    old: &StorageSpec,
    new: &StorageSpec,
    volume_scaling: bool,
) {
    volume(
        out,
        field,
        (&old.size, old.storage_class_name.as_ref()),
        (&new.size, new.storage_class_name.as_ref()),
        volume_scaling,
    );
    if old.labels != new.labels || old.annotations != new.annotations {
        out.add(
            Need::ObjectUpdate,
            format!("{field}.labels/annotations (StatefulSets recreated with their pods kept; existing PVCs patched)"),
        );
    }
}

/// One volume's size and class, from `old` to `new`.
fn volume(
    out: &mut ComponentChanges,
    field: &str,
    old: (&String, Option<&String>),
    new: (&String, Option<&String>),
    volume_scaling: bool,
) {
    if old.1 != new.1 {
        out.add(
            Need::Refused,
            format!("{field}.storageClassName cannot change: the PVCs keep their class"),
        );
    }
    let (Some(a), Some(b)) = (quantity::parse_bytes(old.0), quantity::parse_bytes(new.0)) else {
        if old.0 != new.0 {
            out.add(Need::Refused, format!("{field}.size is not a quantity"));
        }
        return;
    };
    if b < a {
        out.add(
            Need::Refused,
            format!("{field}.size cannot shrink ({} → {})", old.0, new.0),
        );
    } else if b > a {
        if volume_scaling {
            out.add(Need::PvcResize, format!("{field}.size"));
        } else {
            out.add(
                Need::Refused,
                format!(
                    "{field}.size grows only with spec.storageScaling.enableVolumeScaling: true"
                ),
            );
        }
    }
}

/// The server storage: the data volume, the disks, the log volume, the policies.
fn server_storage(
    out: &mut ComponentChanges,
    old: &ServerStorageSpec,
    new: &ServerStorageSpec,
    volume_scaling: bool,
) {
    storage(out, "spec.storage", &old.data, &new.data, volume_scaling);
    for d in &old.disks {
        let field = format!("spec.storage.disks[{}]", d.name);
        match new.disks.iter().find(|n| n.name == d.name) {
            None => out.add(
                Need::Refused,
                format!("{field} cannot be removed: the parts on it would be lost"),
            ),
            Some(n) => volume(
                out,
                &field,
                (&d.size, d.storage_class_name.as_ref()),
                (&n.size, n.storage_class_name.as_ref()),
                volume_scaling,
            ),
        }
    }
    for d in new
        .disks
        .iter()
        .filter(|n| !old.disks.iter().any(|d| d.name == n.name))
    {
        out.add(
            Need::RollingRestart,
            format!("spec.storage.disks[{}] (added: StatefulSets recreated, pods restarted to mount it)", d.name),
        );
    }
    match (&old.logs, &new.logs) {
        (None, None) => {}
        (None, Some(_)) => out.add(
            Need::RollingRestart,
            "spec.storage.logs (added: StatefulSets recreated, pods restarted to mount it)",
        ),
        (Some(_), None) => out.add(
            Need::Refused,
            "spec.storage.logs cannot be removed: its PVCs would be left behind",
        ),
        (Some(o), Some(n)) => volume(
            out,
            "spec.storage.logs",
            (&o.size, o.storage_class_name.as_ref()),
            (&n.size, n.storage_class_name.as_ref()),
            volume_scaling,
        ),
    }
    if old.policies != new.policies {
        out.add(Need::RollingRestart, "spec.storage.policies");
    }
}

/// Classifies a change of the normalised spec from `old` to `new`. Secret contents are not in
/// the spec: a Secret whose contents change changes the hash annotations of the pod templates
/// that use it ([`crate::model::hash`]), and so restarts their pods.
///
/// One row a field, in the order of the spec: the one function kept longer than about 150
/// lines, since the table reads best whole.
pub fn classify(old: &ClickHouseClusterSpec, new: &ClickHouseClusterSpec) -> Changes {
    let mut ch = Changes::default();
    let s = &mut ch.server;
    if old.shards != new.shards {
        s.add(Need::Scale, "spec.shards");
        s.add(Need::ConfigReload, "spec.shards (remote_servers)");
    }
    if old.shard_weights != new.shard_weights {
        s.add(Need::ConfigReload, "spec.shardWeights (remote_servers)");
    }
    if old.replicas != new.replicas {
        s.add(Need::Scale, "spec.replicas");
        s.add(Need::ConfigReload, "spec.replicas (remote_servers)");
    }
    if old.keeper.replicas != new.keeper.replicas {
        s.add(Need::ConfigReload, "spec.keeper.replicas (zookeeper nodes)");
        ch.keeper.add(Need::Scale, "spec.keeper.replicas");
        ch.keeper.add(
            Need::ConfigReload,
            "spec.keeper.replicas (raft_configuration)",
        );
    }
    if old.image != new.image {
        s.add(Need::RollingRestart, "spec.image");
    }
    let (ox, nx) = (&old.keeper.external, &new.keeper.external);
    if ox.as_ref().map(|x| &x.root) != nx.as_ref().map(|x| &x.root) && ox.is_some() && nx.is_some()
    {
        s.add(
            Need::Refused,
            "spec.keeper.external.root cannot change: the replication metadata stays where it is",
        );
    } else if ox != nx {
        s.add(Need::ConfigReload, "spec.keeper.external (zookeeper nodes)");
    }
    let shards: BTreeSet<&String> = old
        .configuration
        .shard_files
        .keys()
        .chain(new.configuration.shard_files.keys())
        .collect();
    for shard in shards {
        if old.configuration.shard_files.get(shard) != new.configuration.shard_files.get(shard) {
            s.add(
                Need::RollingRestart,
                format!("spec.configuration.shardFiles[{shard}] (that shard's replicas)"),
            );
        }
    }
    let replicas: BTreeSet<&String> = old
        .configuration
        .replica_files
        .keys()
        .chain(new.configuration.replica_files.keys())
        .collect();
    for replica in replicas {
        if old.configuration.replica_files.get(replica)
            != new.configuration.replica_files.get(replica)
        {
            s.add(
                Need::RollingRestart,
                format!("spec.configuration.replicaFiles[{replica}] (that replica)"),
            );
        }
    }
    if old.keeper.settings != new.keeper.settings {
        ch.keeper.add(
            Need::RollingRestart,
            "spec.keeper.settings (coordination_settings)",
        );
    }
    if old.keeper.tls != new.keeper.tls {
        // also refused by the CRD's transition rule
        let message =
            "spec.keeper.tls cannot change: the members cannot switch raft to TLS one at a time";
        s.add(Need::Refused, message);
        ch.keeper.add(Need::Refused, message);
    }
    if old.cluster_domain() != new.cluster_domain() {
        let message = "spec.clusterDomain cannot change: every host name the servers and Keeper know each other by would change";
        s.add(Need::Refused, message);
        ch.keeper.add(Need::Refused, message);
    }
    pod_settings(s, "spec.pod", &old.pod, &new.pod);
    let web_identity =
        |spec: &ClickHouseClusterSpec| spec.backup.destination.as_ref()?.web_identity.clone();
    if web_identity(old) != web_identity(new) {
        // decision 43: the servers' ServiceAccount, token and variables
        s.add(Need::RollingRestart, "spec.backup.destination.webIdentity");
    }
    if old.pod_security.ids != new.pod_security.ids {
        s.add(Need::RollingRestart, "spec.podSecurity.ids");
        ch.keeper.add(Need::RollingRestart, "spec.podSecurity.ids");
    }
    if old.pod_security.clickhouse_capabilities != new.pod_security.clickhouse_capabilities {
        s.add(
            Need::RollingRestart,
            "spec.podSecurity.clickhouseCapabilities",
        );
    }
    let (oc, nc) = (&old.configuration, &new.configuration);
    let keys: BTreeSet<&String> = oc.settings.keys().chain(nc.settings.keys()).collect();
    for k in keys {
        if oc.settings.get(k) != nc.settings.get(k) {
            let need = if needs_restart(k) {
                Need::RollingRestart
            } else {
                Need::ConfigReload
            };
            s.add(need, format!("spec.configuration.settings.{k}"));
        }
    }
    let config_d = |c: &crate::api::Configuration| {
        c.config_d_files()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let users_d = |c: &crate::api::Configuration| {
        c.users_d_files()
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let (ou, nu) = (users_d(oc), users_d(nc));
    if ou.keys().ne(nu.keys()) {
        // a file added or removed changes what the pods mount
        s.add(
            Need::RollingRestart,
            "spec.configuration.files (users.d files added or removed)",
        );
    } else if ou != nu {
        s.add(Need::ConfigReload, "spec.configuration.files (users.d)");
    }
    if config_d(oc) != config_d(nc) {
        s.add(Need::RollingRestart, "spec.configuration.files");
    }
    if oc.secret_settings != nc.secret_settings {
        s.add(Need::RollingRestart, "spec.configuration.secretSettings");
    }
    if oc.secret_files != nc.secret_files {
        // which keys are projected is in the pod template
        s.add(Need::RollingRestart, "spec.configuration.secretFiles");
    }
    if oc.profiles != nc.profiles {
        s.add(Need::ConfigReload, "spec.configuration.profiles");
    }
    if oc.quotas != nc.quotas {
        s.add(Need::ConfigReload, "spec.configuration.quotas");
    }
    let replicated =
        |s: &ClickHouseClusterSpec| s.users.as_ref().is_some_and(|u| u.replicated_access);
    if replicated(old) != replicated(new) {
        s.add(
            Need::RollingRestart,
            "spec.users.replicatedAccess (user_directories)",
        );
    }
    if old.users != new.users {
        s.add(Need::ConfigReload, "spec.users");
    }
    let (ot, nt) = (&old.tls, &new.tls);
    if ot.enabled != nt.enabled {
        s.add(Need::FullStopStart, "spec.tls.enabled");
    } else if nt.enabled {
        if ot.required != nt.required {
            s.add(Need::RollingRestart, "spec.tls.required");
        }
        if ot.server_cert_secret != nt.server_cert_secret {
            s.add(Need::RollingRestart, "spec.tls.serverCertSecret");
        }
        if ot.ca_secret != nt.ca_secret {
            s.add(Need::RollingRestart, "spec.tls.caSecret");
        }
    }
    server_storage(
        s,
        &old.storage,
        &new.storage,
        new.storage_scaling.enable_volume_scaling,
    );
    if old.protocols != new.protocols {
        s.add(
            Need::RollingRestart,
            "spec.protocols (the servers' ports; Services and NetworkPolicy updated)",
        );
    }
    if old.server_metrics != new.server_metrics {
        s.add(Need::RollingRestart, "spec.serverMetrics");
    }
    let (ol, nl) = (&old.logging, &new.logging);
    if ol.level != nl.level {
        s.add(Need::ConfigReload, "spec.logging.level (logger/level)");
    }
    if (&ol.format, &ol.size, &ol.count, &ol.files) != (&nl.format, &nl.size, &nl.count, &nl.files)
    {
        s.add(
            Need::RollingRestart,
            "spec.logging (format, size, count, files)",
        );
    }
    if old.system_logs != new.system_logs {
        // decision 49: the tables are created at startup
        s.add(
            Need::RollingRestart,
            "spec.systemLogs (system log tables' TTLs)",
        );
    }
    if old.update_strategy != new.update_strategy {
        s.add(Need::ObjectUpdate, "spec.updateStrategy");
    }
    if old.pod_disruption_budget != new.pod_disruption_budget {
        s.add(Need::ObjectUpdate, "spec.podDisruptionBudget");
    }
    if old.client_service != new.client_service {
        s.add(Need::ObjectUpdate, "spec.clientService");
    }
    if old.network_policy != new.network_policy {
        s.add(Need::ObjectUpdate, "spec.networkPolicy");
    }

    let k = &mut ch.keeper;
    if old.keeper.image != new.keeper.image {
        k.add(Need::RollingRestart, "spec.keeper.image");
    }
    pod_settings(k, "spec.keeper.pod", &old.keeper.pod, &new.keeper.pod);
    storage(
        k,
        "spec.keeper.storage",
        &old.keeper.storage,
        &new.keeper.storage,
        new.storage_scaling.enable_volume_scaling,
    );

    if old.troubleshoot != new.troubleshoot {
        // decision 56: the server container's command and probes
        ch.server.add(Need::RollingRestart, "spec.troubleshoot");
    }
    if old.pause != new.pause {
        let need = if new.pause {
            Need::StopAll
        } else {
            Need::StartAll
        };
        ch.server.add(need, "spec.pause");
        ch.keeper.add(need, "spec.pause");
    }
    if let (Some(o), Some(n)) = (built(old), built(new)) {
        let server = o.server_statefulsets.iter().any(|os| {
            n.server_statefulsets
                .iter()
                .find(|ns| ns.metadata.name == os.metadata.name)
                .is_some_and(|ns| pod_template_changed(&json(os), &json(ns)))
        });
        let keeper = match (&o.keeper, &n.keeper) {
            (Some(ok), Some(nk)) => {
                pod_template_changed(&json(&ok.statefulset), &json(&nk.statefulset))
            }
            _ => false,
        };
        ch.server.restarts_as_built(server);
        ch.keeper.restarts_as_built(keeper);
    }
    ch
}

/// Does a StatefulSet's pod template change from `observed` to `desired`, so that its pods
/// restart? A field of the desired template differs, or the template hash the StatefulSet was
/// written with differs (a field was removed). The one test of a restart: the planner rolls exactly the StatefulSets for which
/// this holds, and [`classify`] derives its restarts from it.
pub fn pod_template_changed(observed: &Value, desired: &Value) -> bool {
    fn hash(v: &Value) -> Option<&str> {
        v["metadata"]["annotations"][labels::TEMPLATE_HASH].as_str()
    }
    let removed = matches!((hash(observed), hash(desired)), (Some(a), Some(b)) if a != b);
    // the default anti-affinity does not restart pods written without it (invariant 9)
    let wanted = crate::model::with_deferred(
        crate::model::without_default_apart(
            &desired["spec"]["template"],
            Some(&observed["spec"]["template"]),
        ),
        Some(&observed["spec"]["template"]),
    );
    removed || !covers(&observed["spec"]["template"], &wanted)
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("Kubernetes objects serialise")
}

/// Every object of a cluster with `spec`, built as a pass builds it (fixed names, no Secret
/// contents), so that two specs compare the way the planner compares observed and desired
/// objects. `None` when the spec cannot be built.
fn built(spec: &ClickHouseClusterSpec) -> Option<Desired> {
    let mut c = ClickHouseCluster::new("c", spec.clone());
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some("uid".into());
    // Stable names across a change of `replicas`: the index says shard and position.
    let replicas = (0..spec.shards)
        .flat_map(|s| {
            (0..spec.replicas)
                .map(move |i| ReplicaSpec::new("c", s.into(), i64::from(s) * 1000 + i64::from(i)))
        })
        .collect();
    let inputs = Inputs {
        replicas,
        listed: None,
        leaving: Vec::new(),
        secrets: BTreeMap::new(),
        user_passwords: BTreeMap::new(),
        operator_password: Password("-".into()),
        interserver_password: Some(Password("-".into())),
        keeper_password: Some(Password("-".into())),
        operator_networks: Vec::new(),
        operator_pods: None,
        cluster_password: Some(Password("c1uster-pw".into())),
        cluster_secret: Some(Password("c1uster-secret".into())),
        server_version: None,
        exporter_password: None,
        backup_collections: Vec::new(),
    };
    desired(&Cluster::new(&c).ok()?, &inputs).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::hash::{PodHashes, keeper_hashes, server_hashes};
    use crate::model::{Cluster, SecretData};
    use crate::testing::spec;
    use serde_json::json;

    fn needs(c: &ComponentChanges) -> BTreeSet<Need> {
        c.all()
    }

    fn set(n: &[Need]) -> BTreeSet<Need> {
        n.iter().copied().collect()
    }

    /// Whether some pod of the component restarts or stops.
    fn disrupts(c: &ComponentChanges) -> bool {
        c.all().iter().any(|n| {
            matches!(
                n,
                Need::RollingRestart | Need::StopAll | Need::FullStopStart
            )
        })
    }

    /// What a change of Secret contents needs: a rolling restart of the component whose pod
    /// template hash annotations it changes (its template changes with them:
    /// [`pod_template_changed`]).
    fn secret_change(
        old_server: &PodHashes,
        new_server: &PodHashes,
        old_keeper: &PodHashes,
        new_keeper: &PodHashes,
    ) -> Changes {
        let mut ch = Changes::default();
        if old_server != new_server {
            ch.server
                .add(Need::RollingRestart, "server Secret contents");
        }
        if old_keeper != new_keeper {
            ch.keeper
                .add(Need::RollingRestart, "Keeper Secret contents");
        }
        ch
    }

    /// One row of the table: from `old` to `new`, the server and Keeper needs.
    fn row(old: serde_json::Value, new: serde_json::Value, server: &[Need], keeper: &[Need]) {
        let ch = classify(&spec(old.clone()), &spec(new.clone()));
        assert_eq!(needs(&ch.server), set(server), "server: {old} → {new}");
        assert_eq!(needs(&ch.keeper), set(keeper), "keeper: {old} → {new}");
    }

    /// A replica's own files (`configuration.replicaFiles`) restart that replica.
    #[test]
    fn replica_files_restart_that_replica() {
        let ch = classify(
            &spec(json!({})),
            &spec(
                json!({"configuration": {"replicaFiles": {"c-0-1": {"a.xml": "<clickhouse/>"}}}}),
            ),
        );
        assert_eq!(needs(&ch.server), set(&[Need::RollingRestart]));
        assert!(
            ch.server
                .reasons()
                .any(|r| r.field.contains("replicaFiles[c-0-1]")),
            "{:?}",
            ch.server
        );
    }

    /// Disks, the log volume, policies and PVC labels, classified (docs/configuration.md,
    /// "Storage").
    #[test]
    fn disks_logs_policies_and_pvc_labels_are_classified() {
        let disk = json!({"storage": {"disks": [{"name": "cold", "size": "10Gi"}]}});
        row(json!({}), disk.clone(), &[Need::RollingRestart], &[]);
        row(
            disk.clone(),
            json!({}),
            &[Need::Refused, Need::RollingRestart],
            &[],
        );
        row(
            disk.clone(),
            json!({"storage": {"disks": [{"name": "cold", "size": "5Gi"}]}}),
            &[Need::Refused],
            &[],
        );
        row(
            json!({"storageScaling": {"enableVolumeScaling": true},
                   "storage": {"disks": [{"name": "cold", "size": "10Gi"}]}}),
            json!({"storageScaling": {"enableVolumeScaling": true},
                   "storage": {"disks": [{"name": "cold", "size": "20Gi"}]}}),
            &[Need::PvcResize],
            &[],
        );
        row(
            json!({}),
            json!({"storage": {"logs": {"size": "1Gi"}}}),
            &[Need::RollingRestart],
            &[],
        );
        row(
            json!({"storage": {"logs": {"size": "1Gi"}}}),
            json!({}),
            &[Need::Refused, Need::RollingRestart],
            &[],
        );
        row(
            json!({}),
            json!({"storage": {"policies": {"p": {"volumes": [{"name": "v", "disks": ["default"]}]}}}}),
            &[Need::RollingRestart],
            &[],
        );
        row(
            json!({}),
            json!({"storage": {"labels": {"team": "a"}}, "keeper": {"storage": {"size": "1Gi", "annotations": {"x": "y"}}}}),
            &[Need::ObjectUpdate],
            &[Need::ObjectUpdate],
        );
    }

    #[test]
    fn an_unchanged_spec_needs_nothing() {
        let s = spec(json!({"shards": 2, "configuration": {"settings": {"a": "1"}}}));
        assert!(classify(&s, &s).is_empty());
    }

    /// Shard weights are in `remote_servers`, which the servers reload: no restart, no
    /// scaling.
    #[test]
    fn shard_weights_reload_without_restart() {
        row(
            json!({"shards": 2}),
            json!({"shards": 2, "shardWeights": {"1": 3}}),
            &[Need::ConfigReload],
            &[],
        );
        row(
            json!({"shards": 2, "shardWeights": {"1": 3}}),
            json!({"shards": 2, "shardWeights": {"0": 2, "1": 3}}),
            &[Need::ConfigReload],
            &[],
        );
    }

    /// S2-14 / S0-05: replica and shard counts scale without a restart.
    #[test]
    fn replica_and_shard_counts_scale_without_restart() {
        row(
            json!({"replicas": 2}),
            json!({"replicas": 3}),
            &[Need::Scale, Need::ConfigReload],
            &[],
        );
        row(
            json!({"shards": 1}),
            json!({"shards": 2}),
            &[Need::Scale, Need::ConfigReload],
            &[],
        );
        let ch = classify(&spec(json!({"replicas": 3})), &spec(json!({"replicas": 2})));
        assert!(!disrupts(&ch.server));
    }

    /// S2-14: Keeper members scale; the servers only reload their node list.
    #[test]
    fn keeper_members_scale_and_servers_reload() {
        row(
            json!({"keeper": {"replicas": 1}}),
            json!({"keeper": {"replicas": 3}}),
            &[Need::ConfigReload],
            &[Need::Scale, Need::ConfigReload],
        );
    }

    /// S2-15: image, resources, env, affinity, sidecars (and the other pod fields) roll.
    #[test]
    fn pod_template_fields_need_a_rolling_restart() {
        let rr = &[Need::RollingRestart];
        row(
            json!({}),
            json!({"image": "clickhouse/clickhouse-server:25.3"}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"pod": {"resources": {"limits": {"cpu": "2"}}}}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"pod": {"env": [{"name": "TZ", "value": "UTC"}]}}),
            rr,
            &[],
        );
        row(json!({}), json!({"pod": {"envSecret": "env"}}), rr, &[]);
        row(
            json!({}),
            json!({"pod": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}}}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"pod": {"sidecars": [{"name": "exporter", "image": "e"}]}}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"pod": {"tolerations": [{"key": "k", "operator": "Exists"}]}}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"pod": {"nodeSelector": {"disk": "ssd"}}}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"keeper": {"image": "clickhouse/clickhouse-keeper:25.3"}}),
            &[],
            rr,
        );
        row(
            json!({}),
            json!({"keeper": {"pod": {"env": [{"name": "A", "value": "1"}]}}}),
            &[],
            rr,
        );
        // the pod template, for servers and for Keeper (decision 28)
        row(
            json!({}),
            json!({"pod": {"template": {"spec": {"imagePullSecrets": [{"name": "r"}]}}}}),
            rr,
            &[],
        );
        row(
            json!({"pod": {"template": {"spec": {"initContainers": [
                {"name": "i", "image": "busybox", "command": ["true"]}]}}}}),
            json!({"pod": {"template": {"spec": {"initContainers": [
                {"name": "i", "image": "busybox", "command": ["false"]}]}}}}),
            rr,
            &[],
        );
        row(
            json!({}),
            json!({"keeper": {"pod": {"template": {"spec": {"priorityClassName": "high"}}}}}),
            &[],
            rr,
        );
    }

    /// S2-16: settings ClickHouse reloads reload; the others, and raw files, roll.
    #[test]
    fn settings_reload_or_restart_by_the_allow_list() {
        row(
            json!({}),
            json!({"configuration": {"settings": {"max_concurrent_queries": "200"}}}),
            &[Need::ConfigReload],
            &[],
        );
        row(
            json!({}),
            json!({"configuration": {"settings": {"mark_cache_size": "1"}}}),
            &[Need::RollingRestart],
            &[],
        );
        row(
            json!({"configuration": {"settings": {"logger/level": "debug"}}}),
            json!({}),
            &[Need::ConfigReload],
            &[],
        );
        row(
            json!({}),
            json!({"configuration": {"files": {"x.xml": "<clickhouse/>"}}}),
            &[Need::RollingRestart],
            &[],
        );
    }

    /// Decision 34: settings and files from Secret keys are read at startup: adding,
    /// removing or repointing one rolls the servers, never Keeper.
    #[test]
    fn secret_settings_and_files_roll_the_servers() {
        let key = json!({"name": "s", "key": "k"});
        for field in ["secretSettings", "secretFiles"] {
            let entry = if field == "secretSettings" {
                "timezone"
            } else {
                "a.xml"
            };
            row(
                json!({}),
                json!({"configuration": {field: {entry: key}}}),
                &[Need::RollingRestart],
                &[],
            );
            row(
                json!({"configuration": {field: {entry: key}}}),
                json!({"configuration": {field: {entry: {"name": "s", "key": "other"}}}}),
                &[Need::RollingRestart],
                &[],
            );
        }
    }

    /// Users, profiles and quotas are reloaded at runtime (S2-17: the operator's user restarts
    /// nothing).
    #[test]
    fn users_profiles_and_quotas_reload_without_restart() {
        let r = &[Need::ConfigReload];
        row(
            json!({}),
            json!({"configuration": {"profiles": {"p": {"readonly": "1"}}}}),
            r,
            &[],
        );
        row(
            json!({}),
            json!({"configuration": {"quotas": {"q": {"duration": "60"}}}}),
            r,
            &[],
        );
        row(json!({}), json!({"users": {"secretName": "u"}}), r, &[]);
        row(
            json!({"users": {"secretName": "u"}}),
            json!({"users": {"secretName": "u", "profile": "p"}}),
            r,
            &[],
        );
    }

    /// S2-16: a TLS, CA or env Secret's contents roll the pods that use them.
    #[test]
    fn secret_contents_need_a_rolling_restart() {
        let c = crate::testing::cluster(
            json!({"tls": {"enabled": true, "serverCertSecret": "tls", "caSecret": "ca"},
            "pod": {"envSecret": "env"}, "keeper": {"pod": {"envSecret": "kenv"}}}),
        );
        let s = c.spec.clone();
        let cl = Cluster::new(&c).unwrap();
        let data = |v: &str| -> SecretData { [("k".to_string(), v.as_bytes().to_vec())].into() };
        let mut secrets: std::collections::BTreeMap<String, SecretData> =
            ["tls", "ca", "env", "kenv"]
                .iter()
                .map(|n| (n.to_string(), data("1")))
                .collect();
        let files = crate::model::config::server::common_files(&cl).unwrap();
        let (s0, k0) = (
            server_hashes(&s, &files, &secrets),
            keeper_hashes(&cl, &secrets),
        );
        assert!(secret_change(&s0, &s0, &k0, &k0).is_empty());
        secrets.insert("tls".into(), data("2"));
        let (s1, k1) = (
            server_hashes(&s, &files, &secrets),
            keeper_hashes(&cl, &secrets),
        );
        let ch = secret_change(&s0, &s1, &k0, &k1);
        assert_eq!(needs(&ch.server), set(&[Need::RollingRestart]));
        assert!(ch.keeper.is_empty());
        secrets.insert("kenv".into(), data("2"));
        let k2 = keeper_hashes(&cl, &secrets);
        let ch = secret_change(&s1, &s1, &k1, &k2);
        assert!(ch.server.is_empty());
        assert_eq!(needs(&ch.keeper), set(&[Need::RollingRestart]));
        // the replication password added, then changed: servers roll, Keeper does not
        let mut s2 = s1.clone();
        s2.insert(labels::INTERSERVER_HASH, "a".into());
        let mut s3 = s1.clone();
        s3.insert(labels::INTERSERVER_HASH, "b".into());
        for (before, after) in [(&s1, &s2), (&s2, &s3)] {
            let ch = secret_change(before, after, &k2, &k2);
            assert_eq!(needs(&ch.server), set(&[Need::RollingRestart]));
            assert!(ch.keeper.is_empty());
        }
    }

    /// S2-18: larger storage resizes PVCs without a restart, only with volume scaling on;
    /// shrinking and class changes are refused.
    #[test]
    fn storage_growth_resizes_and_shrinking_is_refused() {
        let on = json!({"enableVolumeScaling": true});
        row(
            json!({"storage": {"size": "1Gi"}, "storageScaling": on}),
            json!({"storage": {"size": "2Gi"}, "storageScaling": on}),
            &[Need::PvcResize],
            &[],
        );
        row(
            json!({"storage": {"size": "1Gi"}}),
            json!({"storage": {"size": "2Gi"}}),
            &[Need::Refused],
            &[],
        );
        row(
            json!({"storage": {"size": "2Gi"}, "storageScaling": on}),
            json!({"storage": {"size": "1Gi"}, "storageScaling": on}),
            &[Need::Refused],
            &[],
        );
        row(
            json!({"storage": {"size": "1Gi"}, "storageScaling": on}),
            json!({"storage": {"size": "1024Mi"}, "storageScaling": on}),
            &[],
            &[],
        );
        row(
            json!({"storage": {"storageClassName": "a"}}),
            json!({"storage": {"storageClassName": "b"}}),
            &[Need::Refused],
            &[],
        );
        row(
            json!({"keeper": {"storage": {"size": "1Gi"}}, "storageScaling": on}),
            json!({"keeper": {"storage": {"size": "5Gi"}}, "storageScaling": on}),
            &[],
            &[Need::PvcResize],
        );
    }

    /// Decision 28: the external Keeper's nodes are reloaded; its root stays.
    #[test]
    fn the_external_keepers_nodes_reload_and_its_root_stays() {
        let ext = |nodes: serde_json::Value, root: serde_json::Value| json!({"keeper": {"replicas": 0, "external": {"nodes": nodes, "root": root}}});
        row(
            ext(json!([{"host": "zk-0"}]), json!("/a")),
            ext(json!([{"host": "zk-0"}, {"host": "zk-1"}]), json!("/a")),
            &[Need::ConfigReload],
            &[],
        );
        row(
            ext(json!([{"host": "zk-0"}]), json!("/a")),
            ext(json!([{"host": "zk-0"}]), json!("/b")),
            &[Need::Refused],
            &[],
        );
    }

    /// docs/changes.md: a `users.d` file's contents reload; adding or removing one restarts (the
    /// pods mount it).
    #[test]
    fn users_d_files_reload_and_a_new_one_restarts() {
        let f = |c: &str| json!({"configuration": {"files": {"users.d/bi.xml": c}}});
        row(
            f("<clickhouse/>"),
            f("<clickhouse><x/></clickhouse>"),
            &[Need::ConfigReload],
            &[],
        );
        row(json!({}), f("<clickhouse/>"), &[Need::RollingRestart], &[]);
    }

    /// A shard's files (`configuration.shardFiles`) restart that shard's servers (as built: none
    /// for a shard the cluster does not have).
    #[test]
    fn shard_files_restart_the_servers() {
        row(
            json!({"shards": 2}),
            json!({"shards": 2, "configuration": {"shardFiles": {"1": {"a.xml": "<clickhouse/>"}}}}),
            &[Need::RollingRestart],
            &[],
        );
        // a shard the cluster does not have: nothing restarts
        row(
            json!({}),
            json!({"configuration": {"shardFiles": {"1": {"a.xml": "<clickhouse/>"}}}}),
            &[],
            &[],
        );
    }

    /// Keeper's coordination settings (`spec.keeper.settings`) restart its members only.
    #[test]
    fn keeper_settings_restart_the_members() {
        row(
            json!({}),
            json!({"keeper": {"settings": {"session_timeout_ms": "60000"}}}),
            &[],
            &[Need::RollingRestart],
        );
    }

    /// Decision 28: the cluster domain is fixed once the cluster exists (the API server refuses the
    /// change too); stating the default is no change.
    #[test]
    fn the_cluster_domain_cannot_change() {
        row(
            json!({}),
            json!({"clusterDomain": "corp.example"}),
            &[Need::Refused],
            &[Need::Refused],
        );
        row(
            json!({}),
            json!({"clusterDomain": "cluster.local"}),
            &[],
            &[],
        );
    }

    /// Keeper over TLS is fixed once the cluster exists (the API server refuses the change too;
    /// docs/security.md, "What a cluster gets").
    #[test]
    fn keeper_tls_cannot_change() {
        let tls = json!({"enabled": true, "serverCertSecret": "t", "caSecret": "ca"});
        row(
            json!({"tls": tls}),
            json!({"tls": tls, "keeper": {"tls": true}}),
            &[Need::Refused],
            // the members' template would change too; the refusal stops the change
            &[Need::Refused, Need::RollingRestart],
        );
    }

    /// Decision 56: troubleshooting on or off rolls the servers, nothing of Keeper.
    #[test]
    fn troubleshoot_rolls_the_servers_only() {
        row(
            json!({}),
            json!({"troubleshoot": true}),
            &[Need::RollingRestart],
            &[],
        );
        row(
            json!({"troubleshoot": true}),
            json!({}),
            &[Need::RollingRestart],
            &[],
        );
    }

    /// S2-21 / S2-22: pause stops everything, unpause starts it.
    #[test]
    fn pause_stops_all_and_unpause_starts_all() {
        row(
            json!({}),
            json!({"pause": true}),
            &[Need::StopAll],
            &[Need::StopAll],
        );
        row(
            json!({"pause": true}),
            json!({}),
            &[Need::StartAll],
            &[Need::StartAll],
        );
    }

    /// S2-23: toggling tls.enabled is a full stop and start; other TLS fields roll.
    #[test]
    fn tls_toggle_is_a_full_stop_and_start() {
        let on = json!({"tls": {"enabled": true, "serverCertSecret": "tls"}});
        row(json!({}), on.clone(), &[Need::FullStopStart], &[]);
        row(on.clone(), json!({}), &[Need::FullStopStart], &[]);
        row(
            on,
            json!({"tls": {"enabled": true, "serverCertSecret": "tls2", "required": true}}),
            &[Need::RollingRestart],
            &[],
        );
    }

    /// S2-19: the client Service, the budgets and the update strategy change without restart.
    #[test]
    fn objects_outside_the_pod_template_update_without_restart() {
        let u = &[Need::ObjectUpdate];
        row(
            json!({}),
            json!({"clientService": {"enabled": false}}),
            u,
            &[],
        );
        row(
            json!({}),
            json!({"clientService": {"type": "LoadBalancer"}}),
            u,
            &[],
        );
        row(
            json!({}),
            json!({"podDisruptionBudget": {"maxUnavailable": 2}}),
            u,
            &[],
        );
        row(
            json!({}),
            json!({"networkPolicy": {"enabled": false}}),
            u,
            &[],
        );
        row(
            json!({}),
            json!({"networkPolicy": {"clients": [{"podSelector": {"matchLabels": {"app": "bi"}}}]}}),
            u,
            &[],
        );
        row(
            json!({}),
            json!({"updateStrategy": "RollingUpdate"}),
            u,
            &[],
        );
    }

    /// Users managed with SQL: `accessManagement` is in the users file (reloaded),
    /// `replicatedAccess` in `user_directories`, read at startup.
    #[test]
    fn access_management_reloads_and_replicated_access_restarts() {
        row(
            json!({"users": {"secretName": "u"}}),
            json!({"users": {"secretName": "u", "accounts": {"a": {"accessManagement": true}}}}),
            &[Need::ConfigReload],
            &[],
        );
        row(
            json!({"users": {"secretName": "u"}}),
            json!({"users": {"secretName": "u", "replicatedAccess": true}}),
            &[Need::ConfigReload, Need::RollingRestart],
            &[],
        );
    }

    /// `spec.protocols`: a protocol turned on or off changes the pods' ports: the servers roll,
    /// never Keeper.
    #[test]
    fn protocols_roll_the_servers() {
        for change in [
            json!({"protocols": {"mysql": true}}),
            json!({"protocols": {"postgresql": true}}),
            json!({"protocols": {"grpc": true}}),
        ] {
            row(json!({}), change, &[Need::RollingRestart], &[]);
        }
    }

    /// `spec.logging`: the level is reloaded (as the setting `logger/level` it replaces); the
    /// format, file size and count and the files switch are read at startup and roll the
    /// servers, never Keeper.
    #[test]
    fn logging_level_reloads_and_the_rest_rolls_the_servers() {
        row(
            json!({}),
            json!({"logging": {"level": "debug"}}),
            &[Need::ConfigReload],
            &[],
        );
        for change in [
            json!({"logging": {"format": "Json"}}),
            json!({"logging": {"size": "10M"}}),
            json!({"logging": {"count": 9}}),
            json!({"logging": {"files": false}}),
        ] {
            row(json!({}), change, &[Need::RollingRestart], &[]);
        }
        row(
            json!({"logging": {"level": "debug", "format": "Json"}}),
            json!({"logging": {"level": "trace", "format": "Json"}}),
            &[Need::ConfigReload],
            &[],
        );
    }

    /// S2-43, decision 51: each value of the annotation `clickhouse.com/restart-at` restarts the
    /// server pods once (their template carries it), never Keeper's; the same value recorded in
    /// the status after the annotation is gone restarts nothing.
    #[test]
    fn each_restart_annotation_value_restarts_the_servers_once() {
        use crate::model::labels::{RESTART_AT, RESTARTED_AT};
        let sts = |annotation: Option<&str>, recorded: Option<&str>| {
            let mut c = crate::testing::cluster(json!({}));
            c.metadata.annotations =
                annotation.map(|a| [(RESTART_AT.to_string(), a.to_string())].into());
            c.status = recorded.map(|r| crate::api::ClickHouseClusterStatus {
                restarted_at: Some(r.into()),
                ..Default::default()
            });
            let inputs = Inputs {
                replicas: crate::testing::replicas(1, 1),
                operator_password: Password("-".into()),
                ..Default::default()
            };
            let d = desired(&Cluster::new(&c).unwrap(), &inputs).unwrap();
            (
                json(&d.server_statefulsets[0]),
                d.keeper.map(|k| json(&k.statefulset)),
            )
        };
        let (none, keeper) = sts(None, None);
        let (t1, keeper1) = sts(Some("2026-12-04T18:00:00Z"), None);
        let (t1_kept, _) = sts(None, Some("2026-12-04T18:00:00Z"));
        let (t2, _) = sts(Some("2026-12-05T08:00:00Z"), Some("2026-12-04T18:00:00Z"));
        assert_eq!(
            t1["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT],
            "2026-12-04T18:00:00Z"
        );
        assert!(pod_template_changed(&none, &t1));
        assert!(!pod_template_changed(&t1, &t1_kept));
        assert!(pod_template_changed(&t1_kept, &t2));
        assert!(!pod_template_changed(&keeper.unwrap(), &keeper1.unwrap()));
    }

    /// Decision 49: the system log TTLs are read at startup: setting or changing
    /// `spec.systemLogs` rolls the servers, never Keeper; a spec that leaves the TTLs as the
    /// default writes the same file, and a cluster that never sets the field keeps its template
    /// (the default reaches its servers at their next restart: invariant 9).
    #[test]
    fn system_log_ttls_roll_the_servers_once_set() {
        let rr = &[Need::RollingRestart];
        row(json!({}), json!({"systemLogs": {"ttlDays": 7}}), rr, &[]);
        row(
            json!({"systemLogs": {"ttlDays": 7}}),
            json!({"systemLogs": {"ttlDays": 7, "tables": {"text_log": 3}}}),
            rr,
            &[],
        );
        row(json!({"systemLogs": {"ttlDays": 7}}), json!({}), rr, &[]);
        row(json!({"shards": 2}), json!({"shards": 2}), &[], &[]);
        let hashes = |v| {
            let d = built(&spec(v)).unwrap();
            let a = json(&d.server_statefulsets[0])["spec"]["template"]["metadata"]["annotations"]
                .clone();
            (
                a[labels::SYSTEM_LOGS_HASH].as_str().map(str::to_string),
                a[labels::CONFIG_HASH].clone(),
            )
        };
        let (none, config) = hashes(json!({}));
        assert_eq!(none, None);
        let (set, same_config) = hashes(json!({"systemLogs": {"ttlDays": 7}}));
        assert!(set.is_some());
        // the file itself is in no hash: it follows the server version as well
        assert_eq!(config, same_config);
    }

    /// Fields that concern neither pods nor configuration need nothing.
    #[test]
    fn schema_policy_backups_and_reclaim_policy_need_nothing() {
        row(
            json!({}),
            json!({"schemaPolicy": {"replica": "None"}}),
            &[],
            &[],
        );
        row(
            json!({}),
            json!({"backup": {"destination": {"endpoint": "http://s3:8333", "bucket": "b1", "secretName": "s3"},
                    "schedules": [{"name": "d", "schedule": "0 3 * * *"}]}}),
            &[],
            &[],
        );
        row(
            json!({}),
            json!({"storage": {"reclaimPolicy": "Delete"}}),
            &[],
            &[],
        );
        row(json!({}), json!({"crVersion": "0.1.0"}), &[], &[]);
    }

    /// Decision 43: a `webIdentity` of `backup.destination` puts its ServiceAccount, token and
    /// variables into the server pods: one rolling restart; another destination's does not.
    #[test]
    fn a_web_identity_backup_destination_restarts_the_servers_once() {
        let web = |sa: &str| {
            json!({"endpoint": "https://s3.example.com", "bucket": "b1",
                   "webIdentity": {"roleArn": "arn:aws:iam::123456789012:role/b", "serviceAccountName": sa}})
        };
        row(
            json!({}),
            json!({"backup": {"destination": web("ch-backups")}}),
            &[Need::RollingRestart],
            &[],
        );
        let ch = classify(
            &spec(json!({})),
            &spec(json!({"backup": {"destination": web("ch-backups")}})),
        );
        let fields: Vec<_> = ch.server.reasons().map(|r| r.field.as_str()).collect();
        assert_eq!(fields, ["spec.backup.destination.webIdentity"]);
        row(
            json!({"backup": {"destination": web("ch-backups")}}),
            json!({"backup": {"destination": web("ch-backups"), "allowedDestinations": [web("other")]}}),
            &[],
            &[],
        );
    }

    /// Reasons name the field, so the plan and events can say why a pod restarts.
    #[test]
    fn reasons_name_the_field() {
        let ch = classify(
            &spec(json!({})),
            &spec(json!({"image": "x", "configuration": {"settings": {"mark_cache_size": "1"}}})),
        );
        let fields: Vec<_> = ch.server.reasons().map(|r| r.field.as_str()).collect();
        assert!(fields.contains(&"spec.image"));
        assert!(fields.contains(&"spec.configuration.settings.mark_cache_size"));
        let merged = ch
            .clone()
            .merge(classify(&spec(json!({})), &spec(json!({"pause": true}))));
        assert!(merged.server.needs(Need::StopAll) && merged.server.needs(Need::RollingRestart));
    }
}
