//! The ReplicaStateMap (S0-06, S0-12): scale-out adds Pending entries with new names, scale-in
//! condemns the newest replicas but never a shard's backup replica, pause stops and resume
//! restarts every entry, and each shard keeps exactly one backup replica. New and condemned
//! entries are persisted before any later phase acts on them (S0-19, S0-21). No replica a
//! backup in flight reads from is condemned until the backup ends (decision 77).

use super::{ALLOW_DATA_LOSS, Pass, REPLACE_REPLICAS};
use crate::plan::FailureReason;
use crate::plan::replicas::{self, ReplicaFacts, Topology};

pub fn plan(pass: &mut Pass) {
    let allow_loss = pass
        .input
        .cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_DATA_LOSS))
        .is_some_and(|v| v == "true");
    let facts = |replica: &str| {
        let f = pass.input.facts.server(replica);
        ReplicaFacts {
            sts_exists: f.statefulset.is_some(),
            pod_exists: f.pod.exists,
            ready: f.pod.ready,
            ready_and_current: pass.ready_and_current(replica),
        }
    };
    let replace: Vec<String> = pass
        .input
        .cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPLACE_REPLICAS))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    // decision 77: what a backup in flight reads from, and each shard's backup replica while
    // one is in flight (it is the one the backup records), is not condemned until it ends
    let mut held = pass.input.obs.backup_reads.clone();
    if let Some(b) = &pass.input.obs.backup_in_flight {
        for (n, r) in &pass.input.old.replica_state_map {
            if r.is_backup_pod && r.state != crate::api::ReplicaState::Condemned {
                held.entry(n.to_string())
                    .or_insert_with(|| format!("backup {b}"));
            }
        }
    }
    let topology = Topology {
        cluster: &pass.input.name,
        shards: pass.input.spec.shards,
        replicas: pass.input.spec.replicas,
        paused: pass.input.facts.mode.paused(),
        allow_shard_removal: allow_loss,
        replace: &replace,
        held: &held,
    };
    let change = replicas::plan_map(
        &topology,
        &pass.input.old.replica_state_map,
        pass.input.old.next_replica_index,
        facts,
    );
    // S0-13, S0-15, S0-21 at every pass: a shard whose removal is refused keeps its replicas,
    // only the spec's shards are counted
    if let Some(why) = replicas::guarantees_broken(&topology, &change.map) {
        // a bug: the map stays as it was and the pass stops here
        pass.fail_and_halt(
            FailureReason::Internal,
            format!(
                "internal error: the planned replica map breaks a guarantee: {why}; the replica map was kept as it was and the pass stopped; please report this"
            ),
        );
        return;
    }
    pass.map = change.map;
    pass.next_index = change.next_index;
    if !change.refused_shards.is_empty() {
        let message = format!(
            "spec.shards is {} but shard(s) {:?} still hold replicas: removing a shard loses its data; to allow it, annotate the ClickHouseCluster {ALLOW_DATA_LOSS}=true",
            pass.input.spec.shards, change.refused_shards
        );
        pass.fail(FailureReason::ShardRemovalRefused, message);
    }
    pass.gates.held_by_backup = !change.held_back.is_empty();
    for (what, replica, by) in &change.held_back {
        pass.waits.push(format!(
            "{what} waits for {by} to end: it reads from {replica}"
        ));
    }
    for n in &change.added {
        pass.event("ReplicaAdded", "ScaleOut", format!("replica {n} added"));
    }
    for n in &change.condemned {
        pass.event(
            "ReplicaCondemned",
            "ScaleIn",
            format!("replica {n} will be removed"),
        );
    }
    for n in &change.replaced {
        let pod = &pass.input.facts.server(n).pod;
        let state = if pod.ready { "Ready" } else { "not Ready" };
        pass.event(
            "ReplicaReplaced",
            "Replace",
            format!(
                "replica {n} ({state}) is given up as {REPLACE_REPLICAS} asks: a new replica of its shard takes its place, copies the schema and fetches the data; its volumes are released"
            ),
        );
    }
    if !change.refused_replacements.is_empty() {
        let said: Vec<String> = change
            .refused_replacements
            .iter()
            .map(|(n, why)| format!("{n}: {why}"))
            .collect();
        pass.fail(
            FailureReason::ReplacementRefused,
            format!("{REPLACE_REPLICAS} refused: {}", said.join("; ")),
        );
    }
    pass.gates.map_first =
        !change.added.is_empty() || !change.condemned.is_empty() || !change.replaced.is_empty();
}
