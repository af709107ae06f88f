//! The replica map's guarantees, asserted at every pass of every end-to-end test that ends with
//! [`super::finish`]: from its creation, each test namespace's
//! ClickHouseClusters are watched and every version of their status the API server holds is
//! checked, whichever operator wrote it (the kill suite's killed ones too), so a map that broke
//! a guarantee for one pass and was mended by the next still fails the test.
//!
//! - S0-13 / S0-15: every shard with a replica that is not `Condemned` has exactly one backup
//!   replica, never a condemned one (checked here on the map itself, not on the operator's
//!   word);
//! - S0-21 (exactly the excess condemned): the operator checks the map each pass plans against
//!   the spec it planned for ([`clickhouse_operator::plan::replicas::guarantees_broken`]) and
//!   stops the pass with an internal error instead of writing it; such an error, or a map change
//!   the state machine refused (S0-06), in any status version fails the test;
//! - decision 77 (nothing a backup in flight reads from is condemned until it ends): every
//!   version of each ClickHouseBackup of the namespace is watched too, and one that failed
//!   because a replica it read from was removed (`ReplicaRemoved`) fails the test: a
//!   condemnation while a backup reads from the replica is the only way to that failure.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};

use clickhouse_operator::api::{ClickHouseBackup, ClickHouseCluster};
use clickhouse_operator::plan::replicas::{Topology, guarantees_broken};
use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

/// What the watch found: the status versions it checked, and those that broke a guarantee, in
/// the order seen.
pub type Broken = Arc<Mutex<(usize, Vec<String>)>>;

type Watches = BTreeMap<String, (Broken, Vec<tokio::task::JoinHandle<()>>)>;

/// The watch of each test namespace, from its creation ([`super::namespace`]) to its test's
/// [`super::finish`]: every operator started for it in between (a killed one and the one after
/// it alike) is checked.
static WATCHES: LazyLock<Mutex<Watches>> = LazyLock::new(Mutex::default);

/// Watches the clusters of namespace `ns` until [`assert_kept`], recording every status version
/// that breaks a guarantee.
pub fn watch(client: &Client, ns: &str) {
    let broken: Broken = Arc::default();
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let task = {
        let (broken, ns) = (broken.clone(), ns.to_string());
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let (Ok(watcher::Event::Apply(c)) | Ok(watcher::Event::InitApply(c))) = event
                else {
                    continue;
                };
                broken.lock().unwrap().0 += 1;
                if let Some(why) = check(&c) {
                    let line = format!(
                        "{ns}/{} at {}: {why}",
                        c.name_any(),
                        c.resource_version().unwrap_or_default()
                    );
                    let b = &mut broken.lock().unwrap().1;
                    if !b.contains(&line) {
                        b.push(line);
                    }
                }
            }
        })
    };
    let backups = {
        let api: Api<ClickHouseBackup> = Api::namespaced(client.clone(), ns);
        let (broken, ns) = (broken.clone(), ns.to_string());
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let (Ok(watcher::Event::Apply(b)) | Ok(watcher::Event::InitApply(b))) = event
                else {
                    continue;
                };
                broken.lock().unwrap().0 += 1;
                if let Some(why) = backup_broke(&b) {
                    let line = format!("{ns}/backup {}: {why}", b.name_any());
                    let b = &mut broken.lock().unwrap().1;
                    if !b.contains(&line) {
                        b.push(line);
                    }
                }
            }
        })
    };
    WATCHES
        .lock()
        .unwrap()
        .insert(ns.to_string(), (broken, vec![task, backups]));
}

/// Stops the watch of `ns` and fails the test if a status version broke one of the replica
/// map's guarantees.
pub fn assert_kept(ns: &str) {
    let Some((broken, tasks)) = WATCHES.lock().unwrap().remove(ns) else {
        return;
    };
    tasks.iter().for_each(|t| t.abort());
    let (checked, broken) = broken.lock().unwrap().clone();
    assert!(
        broken.is_empty(),
        "the replica map broke its guarantees (S0-13, S0-15, S0-21, S0-06, decision 77): {broken:#?}"
    );
    println!("{ns}: the replica map's guarantees held in {checked} status versions");
}

/// Decision 77: a backup that failed because a replica it read from was removed.
fn backup_broke(b: &ClickHouseBackup) -> Option<String> {
    let status = b.status.as_ref()?;
    (status.reason.as_deref() == Some("ReplicaRemoved")).then(|| {
        format!(
            "failed: {} (a replica it read from was condemned while it ran)",
            status.message.clone().unwrap_or_default()
        )
    })
}

/// What one version of a cluster breaks, if anything.
fn check(c: &ClickHouseCluster) -> Option<String> {
    let status = c.status.as_ref()?;
    // counts are the operator's check (it knows the spec it planned for): paused here
    let shape = Topology {
        cluster: "",
        shards: 0,
        replicas: 0,
        paused: true,
        allow_shard_removal: false,
        replace: &[],
        held: &clickhouse_operator::plan::replicas::NOTHING_HELD,
    };
    if let Some(why) = guarantees_broken(&shape, &status.replica_state_map) {
        return Some(format!("{why}: {:?}", status.replica_state_map));
    }
    let said = status
        .message
        .iter()
        .chain(status.conditions.iter().map(|c| &c.message))
        .find(|m| {
            m.contains("breaks a guarantee") || m.contains("replica state machine does not allow")
        })?;
    Some(said.clone())
}

#[cfg(test)]
mod tests {
    use super::check;
    use clickhouse_operator::api::ClickHouseCluster;
    use serde_json::json;

    fn cluster(map: serde_json::Value, message: &str) -> ClickHouseCluster {
        serde_json::from_value(json!({
            "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
            "metadata": {"name": "c1", "namespace": "ns"},
            "spec": {},
            "status": {"replicaStateMap": map, "message": message},
        }))
        .unwrap()
    }

    fn entry(shard: i32, state: &str, backup: bool) -> serde_json::Value {
        json!({"shard": shard, "state": state, "isBackupPod": backup, "index": 0})
    }

    /// The watch's check: a status with two backup replicas in a shard, or a condemned backup
    /// replica, or the operator's own internal error about the map, is named; a map that keeps
    /// the guarantees (a removed shard with every replica condemned too) is not. Needs no
    /// cluster.
    #[test]
    fn the_watch_names_a_status_that_breaks_the_maps_guarantees() {
        let ok = json!({"c1-0-0": entry(0, "Ready", true), "c1-0-1": entry(0, "Condemned", false),
                        "c1-1-2": entry(1, "Condemned", false)});
        assert_eq!(check(&cluster(ok, "")), None);
        let two = json!({"c1-0-0": entry(0, "Ready", true), "c1-0-1": entry(0, "Ready", true)});
        assert!(
            check(&cluster(two, ""))
                .unwrap()
                .contains("2 backup replicas")
        );
        let condemned =
            json!({"c1-0-0": entry(0, "Condemned", true), "c1-0-1": entry(0, "Ready", false)});
        assert!(check(&cluster(condemned, "")).unwrap().contains("S0-15"));
        let said = "internal error: the planned replica map breaks a guarantee: shard 0 has 1";
        let fine = json!({"c1-0-0": entry(0, "Ready", true)});
        assert_eq!(check(&cluster(fine, said)).as_deref(), Some(said));
    }

    /// Decision 77: the backup watch names a backup that failed because a replica it read
    /// from was removed, and no other failure. Needs no cluster.
    #[test]
    fn the_watch_names_a_backup_that_lost_a_replica_it_read_from() {
        let backup = |reason: &str| -> clickhouse_operator::api::ClickHouseBackup {
            serde_json::from_value(json!({
                "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseBackup",
                "metadata": {"name": "b1", "namespace": "ns"},
                "spec": {"clusterName": "c1"},
                "status": {"state": "Failed", "reason": reason, "message": "backup replica c1-1-1 of shard 1 was removed during the backup"},
            }))
            .unwrap()
        };
        assert!(
            super::backup_broke(&backup("ReplicaRemoved"))
                .unwrap()
                .contains("c1-1-1")
        );
        assert_eq!(super::backup_broke(&backup("AgentFailed")), None);
    }
}
