//! Owned objects that are no longer wanted: the client Service switched off, the PDB of a
//! removed shard, Keeper switched off. The objects of a condemned replica wait for its
//! scale-in, and the operator's credentials Secret always stays.

use super::Pass;
use crate::api::ReplicaState;
use crate::model::names;
use crate::plan::action::Action;
use crate::plan::facts::Kind;

pub fn plan(pass: &mut Pass) {
    let protected = |n: &str| {
        n == names::operator_secret(&pass.name)
            || pass
                .map
                .get(n)
                .is_some_and(|r| r.state == ReplicaState::Condemned)
    };
    let mut unwanted: Vec<(Kind, String)> = pass
        .obs
        .objects
        .keys()
        .filter(|(kind, n)| !pass.is_wanted(*kind, n) && !protected(n))
        .cloned()
        .collect();
    unwanted.extend(
        pass.obs
            .statefulsets
            .keys()
            .filter(|n| {
                !pass.is_wanted(Kind::StatefulSet, n)
                    && !protected(n)
                    && !pass.old.replica_state_map.contains_key(*n)
            })
            .map(|n| (Kind::StatefulSet, n.clone())),
    );
    for (kind, name) in unwanted {
        pass.emit(Action::Delete { kind, name });
    }
}
