//! The schema copied onto new replicas (S0-20, S1-01): a Pending replica whose pod is Ready on
//! the current revision gets the cluster's tables once every Ready replica serves (they are
//! the sources); the executor reports it done and the replica becomes Ready. Never in a pass
//! that changes the map's entries (they are persisted first).

use super::Pass;
use crate::api::{ReplicaName, ReplicaState, ShardIndex};
use crate::plan::step::Step;

pub fn plan(pass: &mut Pass) {
    if pass.gates.map_first {
        return;
    }
    // The schema comes from the Ready replicas: every one must be reachable, or the new
    // replica could miss tables that only an unreachable peer would have shown.
    let unreachable: Vec<ReplicaName> = pass
        .map
        .iter()
        .filter(|(_, r)| r.state == ReplicaState::Ready)
        .filter(|(n, _)| {
            let pod = &pass.input.facts.server(n).pod;
            !pod.ready || pod.address.is_none()
        })
        .map(|(n, _)| n.clone())
        .collect();
    let pending: Vec<(ReplicaName, ShardIndex)> = pass
        .map
        .iter()
        .filter(|(n, r)| r.state == ReplicaState::Pending && pass.ready_and_current(n))
        .map(|(n, r)| (n.clone(), r.shard))
        .collect();
    if !pending.is_empty() && !unreachable.is_empty() {
        pass.waits.push(format!(
            "copying the schema waits for {} to serve",
            unreachable
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        return;
    }
    for (replica, shard) in pending {
        pass.emit(Step::MigrateSchema { replica, shard });
    }
}
