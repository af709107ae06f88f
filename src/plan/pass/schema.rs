//! The schema copied onto new replicas (S0-20, S1-01): a Pending replica whose pod is Ready on
//! the current revision gets the cluster's tables; the executor reports it done and the
//! replica becomes Ready. Never in a pass that changes the map's entries (they are persisted
//! first).

use super::Pass;
use crate::api::ReplicaState;
use crate::plan::action::Action;

pub fn plan(pass: &mut Pass) {
    if pass.gates.map_first {
        return;
    }
    let pending: Vec<(String, i32)> = pass
        .map
        .iter()
        .filter(|(n, r)| r.state == ReplicaState::Pending && pass.ready_and_current(n))
        .map(|(n, r)| (n.clone(), r.shard))
        .collect();
    for (replica, shard) in pending {
        pass.emit(Action::MigrateSchema { replica, shard });
    }
}
