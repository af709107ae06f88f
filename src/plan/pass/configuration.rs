//! Server configuration (S2-09): the common ConfigMap, the users Secret and one ConfigMap per
//! replica. ClickHouse reloads them without a restart; what needs a restart is hashed into the
//! pod templates by the model, so it reaches the pods through the rollout.

use serde_json::Value;

use super::{Pass, json_of};
use crate::api::ReplicaState;
use crate::model::{self, Cluster, ReplicaSpec};
use crate::plan::facts::Kind;

pub fn plan(pass: &mut Pass) {
    let d = &pass.built.desired;
    let objects: Vec<(Kind, Value)> = [
        (Kind::ConfigMap, json_of(&d.common_config)),
        (Kind::Secret, users_secret(pass)),
    ]
    .into_iter()
    .chain(
        d.replica_configs
            .iter()
            .map(|c| (Kind::ConfigMap, json_of(c))),
    )
    .collect();
    for (kind, object) in objects {
        pass.apply(kind, object);
    }
}

/// The users Secret this pass writes: the desired one, built from the map as stored; but while
/// replicas this pass adds wait to be stored first (a new cluster, a scale-out: the next pass
/// creates them), its users' networks already name their hosts, so that the next pass does not
/// write it again for them. `remote_servers` lists a new replica only once its pod has an
/// address either way; a pass that condemns replicas writes the Secret from the stored map
/// (nothing changes for them before they are stored as condemned, S0-21).
fn users_secret(pass: &Pass) -> Value {
    let desired = json_of(&pass.built.desired.users_secret);
    let adds_only = pass.gates.map_first
        && pass
            .map
            .values()
            .all(|r| r.state != ReplicaState::Condemned)
        && pass.map.len() > pass.input.old.replica_state_map.len();
    if !adds_only {
        return desired;
    }
    let mut inputs = pass.built.inputs.clone();
    inputs.replicas = pass
        .live_replicas()
        .map(|(n, r)| ReplicaSpec::of(n, r))
        .collect();
    Cluster::new(pass.input.cluster)
        .and_then(|c| model::users_secret(&c.with_keeper_members(pass.built.keeper_size), &inputs))
        .map_or(desired, |s| json_of(&s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::facts::Observed;
    use k8s_openapi::jiff::Timestamp;

    fn networks_hosts(secret: &Value) -> Vec<String> {
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(secret.clone()).unwrap();
        let data = secret.data.unwrap_or_default();
        let users = String::from_utf8(data[crate::model::names::USERS_FILE].0.clone()).unwrap();
        let mut hosts: Vec<String> = users
            .lines()
            .filter_map(|l| l.trim().strip_prefix("<host>"))
            .filter_map(|l| l.strip_suffix("</host>"))
            .map(str::to_string)
            .collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }

    /// The users Secret a new cluster's first pass applies already names the hosts of the
    /// replicas that pass adds (stored before their StatefulSets are created): the pass that
    /// creates them finds it current and does not write it again.
    #[test]
    fn a_new_clusters_users_secret_is_written_once_with_the_hosts_of_the_replicas_it_adds() {
        let cluster: crate::api::ClickHouseCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
            "metadata": {"name": "c1", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {"shards": 2, "replicas": 2}
        }))
        .unwrap();
        let mut obs = Observed {
            operator_secret_present: true,
            ..Observed::default()
        };
        obs.inputs.exporter_password = Some(model::Password("e".into()));
        let now = Timestamp::now();
        let first = super::super::plan_pass(&cluster, &obs, now);
        let applied = |p: &crate::plan::Plan| {
            p.steps.iter().find_map(|a| match a {
                crate::plan::step::Step::Apply {
                    kind: Kind::Secret,
                    object,
                    ..
                } => Some(object.clone()),
                _ => None,
            })
        };
        let secret = applied(&first).expect("the first pass applies the users Secret");
        assert!(first.again, "the new entries are stored first");
        let hosts = networks_hosts(&secret);
        assert_eq!(hosts.len(), 4, "{hosts:?}");
        // the next pass, from the stored map, with the Secret as written
        let mut stored = cluster.clone();
        stored.status = Some(first.status.clone());
        obs.objects
            .insert((Kind::Secret, "c1-users".into()), secret.clone());
        let second = super::super::plan_pass(&stored, &obs, now);
        assert_eq!(applied(&second), None, "{:?}", second.steps);
    }
}
