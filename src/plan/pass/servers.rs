//! Server StatefulSets that do not exist yet, all created in the same pass (S0-16), and the
//! shards' PodDisruptionBudgets. Servers start only once Keeper serves where their version
//! needs it: some (18.16) give up their distributed DDL queue for good when Keeper cannot be
//! reached at start. Versions that keep trying start beside their own Keeper ensemble
//! (decision 58), so creation does not wait for Keeper's start first.
//! Existing StatefulSets are brought to the desired state by the Rollout phase.

use super::{Pass, json_of};
use crate::plan::facts::Kind;

pub fn plan(pass: &mut Pass) {
    let all: Vec<String> = pass
        .built
        .desired
        .server_statefulsets
        .iter()
        .map(|d| d.metadata.name.clone().unwrap_or_default())
        .collect();
    for n in &all {
        pass.want(Kind::StatefulSet, n);
    }
    let missing: Vec<serde_json::Value> = pass
        .built
        .desired
        .server_statefulsets
        .iter()
        .filter(|d| {
            let n = d.metadata.name.as_deref().unwrap_or_default();
            pass.input.facts.server(n).statefulset.is_none()
        })
        .map(json_of)
        .collect();
    let mut keeper_wait = false;
    for sts in missing {
        if pass.gates.servers_may_start {
            pass.apply(Kind::StatefulSet, sts);
        } else {
            keeper_wait = true;
        }
    }
    if keeper_wait {
        pass.waits
            .push("waiting for Keeper to be Ready before starting new server replicas".into());
    }
    let pdbs: Vec<serde_json::Value> = pass.built.desired.shard_pdbs.iter().map(json_of).collect();
    for pdb in pdbs {
        pass.apply(Kind::PodDisruptionBudget, pdb);
    }
}
