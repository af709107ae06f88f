//! Owned objects that are no longer wanted: the client Service switched off, the PDB of a
//! removed shard, Keeper switched off. The objects of a condemned replica wait for its
//! scale-in, and the operator's credentials Secret always stays. A server StatefulSet that is
//! not in the ReplicaStateMap is never deleted here, nor its ConfigMap: it holds data, and the
//! map it is missing from may be older than the StatefulSet (invariant 1); only a scale-in
//! step removes a server replica.

use super::Pass;
use crate::api::ReplicaState;
use crate::model::names;
use crate::plan::facts::Kind;
use crate::plan::step::Step;

pub fn plan(pass: &mut Pass) {
    let keeper = names::keeper(&pass.input.name);
    let protected = |n: &str| {
        n == names::operator_secret(&pass.input.name)
            || pass
                .map
                .get(n)
                .is_some_and(|r| r.state == ReplicaState::Condemned)
            || (n != keeper && pass.input.facts.server(n).statefulset.is_some())
    };
    let mut unwanted: Vec<(Kind, String)> = pass
        .input
        .obs
        .objects
        .keys()
        .filter(|(kind, n)| !pass.is_wanted(*kind, n) && !protected(n))
        .cloned()
        .collect();
    if pass.input.facts.keeper.exists && !pass.is_wanted(Kind::StatefulSet, &keeper) {
        unwanted.push((Kind::StatefulSet, keeper.clone()));
    }
    let strays: Vec<String> = pass
        .input
        .facts
        .servers
        .iter()
        .filter(|(n, f)| f.statefulset.is_some() && !pass.map.contains_key(n.as_str()))
        .map(|(n, _)| n.clone())
        .collect();
    for n in strays {
        pass.waits.push(format!(
            "StatefulSet {n} carries the cluster's label but is none of its replicas: it is left alone"
        ));
    }
    for (kind, name) in unwanted {
        pass.emit(Step::Delete { kind, name });
    }
}
