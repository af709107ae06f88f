//! Every object of the cluster as this pass wants it, built once, after Keeper's size for the
//! pass is known and before any phase that writes or compares objects.

use std::collections::BTreeMap;

use super::{Built, Early, json_of};
use crate::api::ReplicaState;
use crate::model::{self, Cluster, ReplicaSpec};
use crate::plan::FailureReason;

/// Keeper's size for this pass ([`super::keeper::size`]), then every object of the cluster for
/// it: Keeper at that size (its StatefulSet with the pods the pass keeps, one more than its
/// members while a leaving member's pod still runs), servers for the non-condemned replicas of
/// the persisted map (a condemned replica is left alone until it is removed), `remote_servers`
/// listing a new replica once its pod has an address ([`model::Inputs::listed`]). A spec that
/// cannot be built halts the pass, and nothing is built.
pub fn build(pass: &mut Early) -> Option<Built> {
    let keeper = super::keeper::size(pass);
    let input = pass.input;
    let live: Vec<ReplicaSpec> = input
        .old
        .replica_state_map
        .iter()
        .filter(|(_, r)| r.state != ReplicaState::Condemned)
        .map(|(n, r)| ReplicaSpec::of(n, r))
        .collect();
    let listed: Vec<ReplicaSpec> = live
        .iter()
        .filter(|r| {
            input.old.replica_state_map[&r.name].state != ReplicaState::Pending
                || input.facts.server(&r.name).pod.address.is_some()
        })
        .cloned()
        .collect();
    let listed_count = listed.len() as u64;
    let mut inputs = input.obs.inputs.clone();
    inputs.listed = Some(listed);
    inputs.replicas = live;
    inputs.leaving = input
        .old
        .replica_state_map
        .iter()
        .filter(|(_, r)| {
            r.state == ReplicaState::Condemned
                && r.scale_in_step
                    .is_none_or(|s| s < crate::api::ScaleInStep::Deleted)
        })
        .map(|(n, r)| ReplicaSpec::of(n, r))
        .collect();
    inputs.server_version = input.server_version;
    let built = Cluster::new(input.cluster).and_then(|c| {
        let c = c
            .with_keeper_members(keeper.members)
            .with_keeper_pods(keeper.pods);
        model::desired(&c, &inputs)
    });
    let desired = match built {
        Ok(d) => d,
        Err(e) => {
            pass.fail_and_halt(FailureReason::InvalidSpec, e.to_string());
            return None;
        }
    };
    let template_current: BTreeMap<String, bool> = desired
        .server_statefulsets
        .iter()
        .map(|s| {
            let n = s.metadata.name.clone().unwrap_or_default();
            let current = input
                .facts
                .server(&n)
                .statefulset
                .as_ref()
                .is_some_and(|o| super::template_covers(o, &json_of(s)));
            (n, current)
        })
        .collect();
    Some(Built {
        keeper_size: keeper.members,
        keeper_settled: keeper.settled,
        desired,
        inputs,
        listed: listed_count,
        template_current,
    })
}
