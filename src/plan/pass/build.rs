//! Every object of the cluster as this pass wants it, built once, after Keeper's size for the
//! pass is known and before any phase that writes or compares objects.

use super::{Pass, json_of};
use crate::api::ReplicaState;
use crate::model::{self, Cluster, ReplicaSpec};
use crate::plan::FailureReason;

/// Keeper's size for this pass ([`super::keeper::size`]), then every desired object.
pub fn plan(pass: &mut Pass) {
    super::keeper::size(pass);
    build_desired(pass);
}

/// Builds every object of the cluster for this pass: Keeper at `keeper_size`, servers for the
/// non-condemned replicas of the persisted map (a condemned replica is left alone until it is
/// removed), `remote_servers` listing a new replica once its pod has an address
/// ([`model::Inputs::listed`]). A spec that cannot be built halts the pass.
fn build_desired(pass: &mut Pass) {
    let live: Vec<ReplicaSpec> = pass
        .old
        .replica_state_map
        .iter()
        .filter(|(_, r)| r.state != ReplicaState::Condemned)
        .map(|(n, r)| ReplicaSpec {
            name: n.clone(),
            shard: r.shard,
            index: r.index,
        })
        .collect();
    let listed: Vec<ReplicaSpec> = live
        .iter()
        .filter(|r| {
            pass.old.replica_state_map[&r.name].state != ReplicaState::Pending
                || pass.facts.server(&r.name).pod.address.is_some()
        })
        .cloned()
        .collect();
    pass.listed = listed.len() as u64;
    let mut inputs = pass.obs.inputs.clone();
    inputs.listed = Some(listed);
    inputs.replicas = live;
    inputs.server_version = pass.server_version;
    let built = Cluster::new(pass.cluster)
        .and_then(|c| model::desired(&c.with_keeper_members(pass.keeper_size), &inputs));
    pass.inputs = Some(inputs);
    match built {
        Ok(d) => {
            for s in &d.server_statefulsets {
                let n = s.metadata.name.clone().unwrap_or_default();
                let current = pass
                    .facts
                    .server(&n)
                    .statefulset
                    .as_ref()
                    .is_some_and(|o| super::template_covers(o, &json_of(s)));
                pass.template_current.insert(n, current);
            }
            pass.desired = Some(d);
        }
        Err(e) => pass.fail_and_halt(FailureReason::InvalidSpec, e.to_string()),
    }
}
