//! PodDisruptionBudgets of the server pods, one per shard, honouring
//! `spec.podDisruptionBudget.maxUnavailable` (S0-18). Keeper's is in [`super::keeper`].

use std::collections::BTreeSet;

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::labels::{self, Component};
use super::{Cluster, ReplicaSpec, names};
use crate::api::ShardIndex;

pub(crate) fn budget(
    c: &Cluster<'_>,
    name: String,
    component: Component,
    selector: std::collections::BTreeMap<String, String>,
    max_unavailable: i32,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: c.meta(name, labels::common(c.name, component)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// `<cluster>-shard-<n>` for every shard of the spec and every shard that still has a replica
/// (a shard being removed keeps its budget until its last replica is gone).
pub fn shards(c: &Cluster<'_>, replicas: &[ReplicaSpec]) -> Vec<PodDisruptionBudget> {
    let shards: BTreeSet<ShardIndex> = ShardIndex::all(c.spec.shards)
        .chain(replicas.iter().map(|r| r.shard))
        .collect();
    shards
        .into_iter()
        .map(|s| {
            budget(
                c,
                names::shard_pdb(c.name, s),
                Component::Server,
                labels::shard_selector(c.name, s),
                c.spec.pod_disruption_budget.max_unavailable,
            )
        })
        .collect()
}
