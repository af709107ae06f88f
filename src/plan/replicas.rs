//! PURE: the ReplicaStateMap (S0-06, S0-12; internal: other components read `status.members`,
//! [`crate::plan::status::members`], `exporter::tests`, e2e
//! `exporter::the_exporter_reads_the_public_versioned_members_of_any_operators_status`). Which replicas exist, in which state, which one of each
//! shard is the backup replica, which are added on scale-out and which are condemned on
//! scale-in. Replica names are `<cluster>-<shard>-<index>`, with a creation index that is never
//! reused, so a replica that comes back later never meets stale Keeper metadata of an old one.

use std::collections::BTreeMap;

use crate::api::{ReplicaName, ReplicaState, ReplicaStatus, ShardIndex};
use crate::model::names::replica_name;

/// Is `from → to` a transition the state machine allows (S0-06)? `Stopped → Pending` is the
/// start after a pause (S0-03); a Condemned replica only leaves by being removed.
pub fn transition_allowed(from: ReplicaState, to: ReplicaState) -> bool {
    use ReplicaState::*;
    from == to
        || matches!(
            (from, to),
            (Pending, Ready)
                | (Ready, Stopped)
                | (Stopped, Ready)
                | (Stopped, Pending)
                | (Pending, Condemned)
                | (Ready, Condemned)
                | (Stopped, Condemned)
        )
}

/// Why a change of the persisted map from `old` to `new` breaks the state machine (S0-06), if
/// it does: an entry that changes state along a transition the table does not allow, one that
/// appears in another state than `Pending` (scale-out and taking replicas back both add
/// `Pending` entries) or `Ready` (added and found serving with its schema in the same pass,
/// `Pending → Ready` in one write), or one that disappears without having been `Condemned`.
/// Every status write is checked against the status it replaces; a refused one is a bug,
/// reported instead.
pub fn map_change_refused(
    old: &BTreeMap<ReplicaName, ReplicaStatus>,
    new: &BTreeMap<ReplicaName, ReplicaStatus>,
) -> Option<String> {
    for (name, after) in new {
        match old.get(name) {
            Some(before) if !transition_allowed(before.state, after.state) => {
                return Some(format!(
                    "replica {name} would go from {:?} to {:?}",
                    before.state, after.state
                ));
            }
            None if !matches!(after.state, ReplicaState::Pending | ReplicaState::Ready) => {
                return Some(format!(
                    "replica {name} would appear as {:?}, not Pending",
                    after.state
                ));
            }
            _ => {}
        }
    }
    old.iter()
        .find(|(name, before)| !new.contains_key(*name) && before.state != ReplicaState::Condemned)
        .map(|(name, before)| {
            format!(
                "replica {name} would be removed while {:?}, not Condemned",
                before.state
            )
        })
}

/// The map's guarantees a planned map must keep (checked by every pass on the map it planned,
/// [`crate::plan::pass`]'s ReplicaMap phase, so that the end-to-end suites assert them at every
/// pass, not only at rest): every shard with a replica that is not `Condemned` has exactly one
/// backup replica, and that one is not `Condemned` (S0-13, S0-15); not paused, every shard of
/// the spec has exactly `replicas` replicas that are not `Condemned`, so exactly the excess is
/// condemned (S0-21), more only where the backup replica and replicas a backup in flight reads
/// from ([`Topology::held`], decision 77) are more than `replicas`. A broken one is a bug,
/// reported instead of written.
pub fn guarantees_broken(
    t: &Topology,
    map: &BTreeMap<ReplicaName, ReplicaStatus>,
) -> Option<String> {
    let mut shards: Vec<ShardIndex> = map.values().map(|r| r.shard).collect();
    shards.sort();
    shards.dedup();
    for shard in shards {
        let members: Vec<(&ReplicaName, &ReplicaStatus)> =
            map.iter().filter(|(_, r)| r.shard == shard).collect();
        if let Some((n, _)) = members
            .iter()
            .find(|(_, r)| r.is_backup_pod && r.state == ReplicaState::Condemned)
        {
            return Some(format!(
                "shard {shard}: the condemned replica {n} is its backup replica (S0-15)"
            ));
        }
        let live = members
            .iter()
            .filter(|(_, r)| r.state != ReplicaState::Condemned)
            .count();
        let backups: Vec<&str> = members
            .iter()
            .filter(|(_, r)| r.is_backup_pod)
            .map(|(n, _)| n.as_str())
            .collect();
        if live > 0 && backups.len() != 1 {
            return Some(format!(
                "shard {shard} has {} backup replicas ({}), not one (S0-13)",
                backups.len(),
                backups.join(", ")
            ));
        }
    }
    if t.paused {
        return None;
    }
    for shard in ShardIndex::all(t.shards) {
        let live: Vec<(&ReplicaName, &ReplicaStatus)> = map
            .iter()
            .filter(|(_, r)| r.shard == shard && r.state != ReplicaState::Condemned)
            .collect();
        // decision 77: the backup replica and those a backup in flight reads from may stay
        // beyond the spec's count until the backup ends
        let kept = live
            .iter()
            .filter(|(n, r)| r.is_backup_pod || t.held.contains_key(n.as_str()))
            .count() as i32;
        let want = t.replicas.max(kept);
        if live.len() as i32 != want {
            let held = if want > t.replicas {
                format!(" and {} held by a backup", want - t.replicas)
            } else {
                String::new()
            };
            return Some(format!(
                "shard {shard} has {} replicas that stay, not the {} of the spec{held}: the excess, and only it, is condemned (S0-21)",
                live.len(),
                t.replicas
            ));
        }
    }
    None
}

/// What the pass observed of one replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaFacts {
    pub sts_exists: bool,
    pub pod_exists: bool,
    /// The pod is Ready.
    pub ready: bool,
    /// Ready, and running its StatefulSet's current revision with the current template.
    pub ready_and_current: bool,
}

/// The outcome of planning the map.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MapChange {
    pub map: BTreeMap<ReplicaName, ReplicaStatus>,
    pub next_index: i64,
    /// Names added as Pending in this pass (their StatefulSets are created in a later pass,
    /// after the map is persisted: S0-19).
    pub added: Vec<ReplicaName>,
    /// Names condemned in this pass.
    pub condemned: Vec<ReplicaName>,
    /// Shards beyond `spec.shards` that still have replicas while removal is not allowed.
    pub refused_shards: Vec<ShardIndex>,
    /// Replicas condemned in this pass because the user asked to replace them (decision 54;
    /// not in `condemned`); their replacements are in `added`.
    pub replaced: Vec<ReplicaName>,
    /// Replicas the user asked to replace that are not replaced, with why.
    pub refused_replacements: Vec<(String, String)>,
    /// Condemnations held back (decision 77): what waits (`removing shard 1`, `replacing
    /// c1-0-0`, `scaling in shard 0`), the replica held and what holds it.
    pub held_back: Vec<(String, String, String)>,
}

/// No replica held: [`Topology::held`] where no backup is in flight.
pub static NOTHING_HELD: BTreeMap<String, String> = BTreeMap::new();

/// The topology the spec asks for.
#[derive(Clone, Copy, Debug)]
pub struct Topology<'a> {
    pub cluster: &'a str,
    pub shards: i32,
    pub replicas: i32,
    pub paused: bool,
    /// Lets replicas of removed shards be condemned (their data is lost).
    pub allow_shard_removal: bool,
    /// Replicas to replace by new ones (the cluster's `clickhouse.com/replace-replicas`).
    pub replace: &'a [String],
    /// Replicas that must not be condemned now, with what holds them (`backup b1`): those a
    /// backup in flight reads from (decision 77). Their shard's removal, their replacement and
    /// their scale-in wait until it ends.
    pub held: &'a BTreeMap<String, String>,
}

/// Plans the map for the topology. `facts` answers for each replica name.
pub fn plan_map(
    t: &Topology,
    old: &BTreeMap<ReplicaName, ReplicaStatus>,
    next_index: i64,
    facts: impl Fn(&str) -> ReplicaFacts,
) -> MapChange {
    let Topology {
        cluster,
        shards,
        replicas,
        paused,
        allow_shard_removal,
        replace,
        held,
    } = *t;
    let mut map = old.clone();
    let mut next_index = next_index.max(old.values().map(|r| r.index + 1).max().unwrap_or(0));
    let mut added = Vec::new();
    let mut condemned = Vec::new();
    let mut refused_shards = Vec::new();
    let mut held_back = Vec::new();

    // Lifecycle transitions from what was observed.
    for (name, r) in map.iter_mut() {
        let f = facts(name);
        r.state = match r.state {
            ReplicaState::Ready if paused && !f.pod_exists => ReplicaState::Stopped,
            ReplicaState::Stopped if !paused => ReplicaState::Pending,
            s => s,
        };
    }

    // Scale-in of shards that no longer exist.
    let mut shard_ids: Vec<ShardIndex> = map.values().map(|r| r.shard).collect();
    shard_ids.sort();
    shard_ids.dedup();
    for shard in shard_ids.iter().copied().filter(|s| s.get() >= shards) {
        let active: Vec<ReplicaName> = map
            .iter()
            .filter(|(_, r)| r.shard == shard && r.state != ReplicaState::Condemned)
            .map(|(n, _)| n.clone())
            .collect();
        if active.is_empty() {
            continue;
        }
        if !allow_shard_removal {
            refused_shards.push(shard);
            continue;
        }
        // decision 77: the whole shard waits while a backup reads from one of its replicas
        if let Some(n) = active.iter().find(|n| held.contains_key(n.as_str())) {
            held_back.push((
                format!("removing shard {shard}"),
                n.to_string(),
                held[n.as_str()].clone(),
            ));
            continue;
        }
        for n in active {
            let r = map.get_mut(&n).expect("listed above");
            r.state = ReplicaState::Condemned;
            r.is_backup_pod = false;
            r.scale_in_step = None;
            condemned.push(n);
        }
    }

    let (replaced, refused_replacements) = if paused {
        (Vec::new(), Vec::new())
    } else {
        release(
            cluster,
            &mut map,
            next_index,
            replace,
            held,
            &mut held_back,
            &facts,
        )
    };

    if !paused {
        for shard in ShardIndex::all(shards) {
            let mut active: Vec<(ReplicaName, ReplicaStatus)> = map
                .iter()
                .filter(|(_, r)| r.shard == shard && r.state != ReplicaState::Condemned)
                .map(|(n, r)| (n.clone(), r.clone()))
                .collect();
            let count = active.len() as i32;
            if count < replicas {
                // Scale-out: new names, never reused.
                for _ in count..replicas {
                    let name = replica_name(cluster, shard, next_index);
                    map.insert(
                        name.clone(),
                        ReplicaStatus {
                            shard,
                            state: ReplicaState::Pending,
                            is_backup_pod: false,
                            index: next_index,
                            scale_in_step: None,
                            released: false,
                        },
                    );
                    added.push(name);
                    next_index += 1;
                }
            } else if count > replicas {
                // Scale-in: newest first, never the backup replica (S0-14, S0-21), nor one a
                // backup in flight reads from (decision 77).
                active.sort_by_key(|(_, r)| std::cmp::Reverse(r.index));
                let excess = (count - replicas) as usize;
                let victims: Vec<ReplicaName> = active
                    .iter()
                    .filter(|(n, r)| !r.is_backup_pod && !held.contains_key(n.as_str()))
                    .take(excess)
                    .map(|(n, _)| n.clone())
                    .collect();
                let waiting = active
                    .iter()
                    .find(|(n, r)| !r.is_backup_pod && held.contains_key(n.as_str()));
                if let (true, Some((n, _))) = (victims.len() < excess, waiting) {
                    held_back.push((
                        format!("scaling in shard {shard}"),
                        n.to_string(),
                        held[n.as_str()].clone(),
                    ));
                }
                for n in victims {
                    let r = map.get_mut(&n).expect("listed above");
                    r.state = ReplicaState::Condemned;
                    r.scale_in_step = None;
                    condemned.push(n);
                }
            }
        }
    }

    assign_backup_replicas(&mut map, &facts);
    MapChange {
        map,
        next_index,
        added,
        condemned,
        refused_shards,
        replaced,
        refused_replacements,
        held_back,
    }
}

/// Decision 54: condemns each replica of `replace` as given up (`released`), so that the
/// scale-out that follows adds a new replica with a new name in its shard, unless that would
/// leave its shard without a Ready replica (its data would be lost with it). A name that was a
/// replica of the cluster and is gone (or is being removed) is done: nothing to do, nothing to
/// say. A replica a backup in flight reads from waits (decision 77, in `held_back`). Returns
/// the replicas condemned, and the names refused with why.
fn release(
    cluster: &str,
    map: &mut BTreeMap<ReplicaName, ReplicaStatus>,
    next_index: i64,
    replace: &[String],
    held: &BTreeMap<String, String>,
    held_back: &mut Vec<(String, String, String)>,
    facts: &impl Fn(&str) -> ReplicaFacts,
) -> (Vec<ReplicaName>, Vec<(String, String)>) {
    let mut replaced = Vec::new();
    let mut refused = Vec::new();
    for name in replace {
        let Some(r) = map.get(name.as_str()) else {
            let was_one = name
                .strip_prefix(&format!("{cluster}-"))
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(s, i)| Some((s.parse::<i32>().ok()?, i.parse::<i64>().ok()?)))
                .is_some_and(|(s, i)| {
                    replica_name(cluster, ShardIndex(s), i) == *name && i < next_index
                });
            if !was_one {
                refused.push((name.clone(), "not a replica of this cluster".to_string()));
            }
            continue;
        };
        if r.state == ReplicaState::Condemned {
            continue;
        }
        let shard = r.shard;
        let others_ready = map.iter().any(|(n, o)| {
            n != name && o.shard == shard && o.state != ReplicaState::Condemned && facts(n).ready
        });
        if !others_ready {
            refused.push((
                name.clone(),
                format!(
                    "no other replica of shard {shard} is Ready: the shard's data would go with it"
                ),
            ));
            continue;
        }
        if let Some(by) = held.get(name.as_str()) {
            held_back.push((format!("replacing {name}"), name.clone(), by.clone()));
            continue;
        }
        let r = map.get_mut(name.as_str()).expect("found above");
        r.state = ReplicaState::Condemned;
        r.is_backup_pod = false;
        r.scale_in_step = None;
        r.released = true;
        replaced.push(name.into());
    }
    (replaced, refused)
}

/// The replica map as the observed server StatefulSets of `cluster` show it, for a cluster
/// whose persisted map is empty while its servers exist (its status was lost or wiped): each
/// StatefulSet named like a replica (`<cluster>-<shard>-<index>`, its shard label agreeing) and
/// not being deleted is taken back as `Pending`, so that nothing is built from an empty map (a
/// `remote_servers` without the cluster's hosts). An empty map with no such StatefulSet is a
/// new cluster.
pub fn adopt_observed(
    cluster: &str,
    statefulsets: &BTreeMap<String, k8s_openapi::api::apps::v1::StatefulSet>,
) -> BTreeMap<ReplicaName, ReplicaStatus> {
    statefulsets
        .iter()
        .filter(|(_, s)| s.metadata.deletion_timestamp.is_none())
        .filter_map(|(name, s)| adopted(cluster, name, s.metadata.labels.as_ref()?))
        .collect()
}

/// The replicas of a cluster created again with the name of a deleted one whose volumes were
/// retained (`reclaimPolicy: Retain`, decision 30): while the map is empty and no server
/// StatefulSet exists, each data PVC named like a replica's (`data-<cluster>-<shard>-<index>-0`,
/// its labels agreeing) that is neither being deleted nor handed to the PVC cleaner is taken
/// back as `Pending`, so that the cluster comes back on its data instead of beside it.
pub fn adopt_retained(
    cluster: &str,
    pvcs: &BTreeMap<String, k8s_openapi::api::core::v1::PersistentVolumeClaim>,
) -> BTreeMap<ReplicaName, ReplicaStatus> {
    let prefix = format!("{}-", crate::model::statefulset::DATA_VOLUME);
    pvcs.iter()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .filter_map(|(name, p)| {
            let labels = p.metadata.labels.as_ref()?;
            if labels.get(crate::model::labels::DELETE_PVC).is_some() {
                return None;
            }
            let replica = name.strip_prefix(&prefix)?.strip_suffix("-0")?;
            if labels
                .get(crate::model::labels::REPLICA)
                .map(String::as_str)
                != Some(replica)
            {
                return None;
            }
            adopted(cluster, replica, labels)
        })
        .collect()
}

/// `name` as a `Pending` replica of `cluster`, if it is named like one and its labels (of its
/// StatefulSet or PVC) say it is a server of that shard.
fn adopted(
    cluster: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Option<(ReplicaName, ReplicaStatus)> {
    use crate::model::labels as l;
    if labels.get(l::COMPONENT).map(String::as_str) != Some(l::Component::Server.as_str())
        || labels.get(l::CLUSTER).map(String::as_str) != Some(cluster)
    {
        return None;
    }
    let (shard, index) = name
        .strip_prefix(&format!("{cluster}-"))
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(s, i)| Some((ShardIndex(s.parse::<i32>().ok()?), i.parse::<i64>().ok()?)))?;
    if replica_name(cluster, shard, index) != name
        || labels.get(l::SHARD) != Some(&shard.to_string())
    {
        return None;
    }
    Some((
        name.into(),
        ReplicaStatus {
            shard,
            state: ReplicaState::Pending,
            is_backup_pod: false,
            index,
            scale_in_step: None,
            released: false,
        },
    ))
}

/// Exactly one backup replica per shard that has a non-condemned replica (S0-13, decision 1):
/// the current one stays while it is not condemned; otherwise the oldest Ready replica (by
/// creation index) takes over, else the oldest remaining one (S0-15).
pub fn assign_backup_replicas(
    map: &mut BTreeMap<ReplicaName, ReplicaStatus>,
    facts: &impl Fn(&str) -> ReplicaFacts,
) {
    let shards: Vec<ShardIndex> = {
        let mut s: Vec<ShardIndex> = map.values().map(|r| r.shard).collect();
        s.sort();
        s.dedup();
        s
    };
    for shard in shards {
        let mut members: Vec<(ReplicaName, ReplicaStatus)> = map
            .iter()
            .filter(|(_, r)| r.shard == shard)
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        members.sort_by_key(|(_, r)| r.index);
        let eligible = |r: &ReplicaStatus| r.state != ReplicaState::Condemned;
        let keep = members
            .iter()
            .find(|(_, r)| r.is_backup_pod && eligible(r))
            .map(|(n, _)| n.clone());
        let chosen = keep
            .or_else(|| {
                members
                    .iter()
                    .find(|(n, r)| eligible(r) && r.state == ReplicaState::Ready && facts(n).ready)
                    .map(|(n, _)| n.clone())
            })
            .or_else(|| {
                members
                    .iter()
                    .find(|(_, r)| eligible(r) && r.state == ReplicaState::Ready)
                    .map(|(n, _)| n.clone())
            })
            .or_else(|| {
                members
                    .iter()
                    .find(|(_, r)| eligible(r))
                    .map(|(n, _)| n.clone())
            });
        for (n, _) in members {
            if let Some(r) = map.get_mut(&n) {
                r.is_backup_pod = chosen.as_deref() == Some(n.as_str());
            }
        }
    }
}

/// The backup replica of `shard`.
pub fn backup_replica(
    map: &BTreeMap<ReplicaName, ReplicaStatus>,
    shard: ShardIndex,
) -> Option<&ReplicaName> {
    map.iter()
        .find(|(_, r)| r.shard == shard && r.is_backup_pod)
        .map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(shard: i32, state: ReplicaState, index: i64, backup: bool) -> ReplicaStatus {
        ReplicaStatus {
            shard: ShardIndex(shard),
            state,
            is_backup_pod: backup,
            index,
            scale_in_step: None,
            released: false,
        }
    }

    fn topo(shards: i32, replicas: i32, paused: bool, allow: bool) -> Topology<'static> {
        Topology {
            cluster: "c1",
            shards,
            replicas,
            paused,
            allow_shard_removal: allow,
            replace: &[],
            held: &NOTHING_HELD,
        }
    }

    fn ready_facts(_: &str) -> ReplicaFacts {
        ReplicaFacts {
            sts_exists: true,
            pod_exists: true,
            ready: true,
            ready_and_current: true,
        }
    }

    /// S0-06 at runtime: a map change is refused when an entry takes a transition the table
    /// does not allow, appears other than `Pending`, or goes without being `Condemned`.
    #[test]
    fn a_map_change_outside_the_state_machine_is_refused() {
        use ReplicaState::*;
        let map = |entries: &[(&str, ReplicaState)]| -> BTreeMap<ReplicaName, ReplicaStatus> {
            entries
                .iter()
                .map(|(n, s)| {
                    (
                        ReplicaName::from(*n),
                        ReplicaStatus {
                            shard: ShardIndex(0),
                            state: *s,
                            is_backup_pod: false,
                            index: 0,
                            scale_in_step: None,
                            released: false,
                        },
                    )
                })
                .collect()
        };
        let ok = |a: &[(&str, ReplicaState)], b: &[(&str, ReplicaState)]| {
            map_change_refused(&map(a), &map(b))
        };
        // allowed: each transition of the table, a Pending entry added, a Condemned one gone
        assert_eq!(ok(&[("r1", Pending)], &[("r1", Ready)]), None);
        assert_eq!(
            ok(&[("r1", Ready)], &[("r1", Ready), ("r2", Pending)]),
            None
        );
        assert_eq!(
            ok(&[("r1", Ready), ("r2", Condemned)], &[("r1", Ready)]),
            None
        );
        assert_eq!(ok(&[], &[("r1", Pending), ("r2", Pending)]), None);
        assert_eq!(ok(&[("r1", Stopped)], &[("r1", Pending)]), None);
        // refused
        let why = ok(&[("r1", Condemned)], &[("r1", Ready)]).unwrap();
        assert!(why.contains("r1 would go from Condemned to Ready"), "{why}");
        assert!(ok(&[("r1", Ready)], &[("r1", Pending)]).is_some());
        // a replica taken back and found serving in the same pass: Pending → Ready in one write
        assert_eq!(ok(&[], &[("r1", Ready), ("r2", Pending)]), None);
        let why = ok(&[("r1", Ready)], &[("r1", Ready), ("r2", Stopped)]).unwrap();
        assert!(why.contains("r2 would appear as Stopped"), "{why}");
        assert!(ok(&[("r1", Ready)], &[("r1", Ready), ("r2", Condemned)]).is_some());
        let why = ok(&[("r1", Ready), ("r2", Ready)], &[("r1", Ready)]).unwrap();
        assert!(why.contains("r2 would be removed while Ready"), "{why}");
    }

    /// S0-13 / S0-15 / S0-21 at every pass: a planned map with two backup replicas in a shard,
    /// none, a condemned one, or more or fewer replicas staying than the spec asks is named;
    /// the maps the planner makes are not (the property test below checks every one).
    #[test]
    fn a_map_breaking_its_guarantees_is_named() {
        use ReplicaState::*;
        let map =
            |entries: &[(&str, i32, ReplicaState, bool)]| -> BTreeMap<ReplicaName, ReplicaStatus> {
                entries
                    .iter()
                    .enumerate()
                    .map(|(i, (n, shard, state, backup))| {
                        (
                            ReplicaName::from(*n),
                            ReplicaStatus {
                                shard: ShardIndex(*shard),
                                state: *state,
                                is_backup_pod: *backup,
                                index: i as i64,
                                scale_in_step: None,
                                released: false,
                            },
                        )
                    })
                    .collect()
            };
        let t = topo(1, 2, false, false);
        assert_eq!(
            guarantees_broken(&t, &map(&[("a", 0, Ready, true), ("b", 0, Pending, false)])),
            None
        );
        // 3 → 2: the newest condemned, the backup kept
        let three = map(&[
            ("a", 0, Ready, true),
            ("b", 0, Ready, false),
            ("c", 0, Condemned, false),
        ]);
        assert_eq!(guarantees_broken(&t, &three), None);
        let why =
            guarantees_broken(&t, &map(&[("a", 0, Ready, true), ("b", 0, Ready, true)])).unwrap();
        assert!(
            why.contains("shard 0 has 2 backup replicas (a, b)"),
            "{why}"
        );
        let why =
            guarantees_broken(&t, &map(&[("a", 0, Ready, false), ("b", 0, Ready, false)])).unwrap();
        assert!(why.contains("0 backup replicas"), "{why}");
        let why = guarantees_broken(
            &t,
            &map(&[
                ("a", 0, Condemned, true),
                ("b", 0, Ready, false),
                ("c", 0, Ready, false),
            ]),
        )
        .unwrap();
        assert!(why.contains("condemned replica a is its backup"), "{why}");
        // too many condemned (3 → 1 condemned for a spec of 2), or too few
        let why = guarantees_broken(
            &t,
            &map(&[
                ("a", 0, Ready, true),
                ("b", 0, Condemned, false),
                ("c", 0, Condemned, false),
            ]),
        )
        .unwrap();
        assert!(
            why.contains("shard 0 has 1 replicas that stay, not the 2"),
            "{why}"
        );
        assert!(guarantees_broken(&t, &map(&[("a", 0, Ready, true)])).is_some());
        // paused: the counts wait; a removed shard: every replica condemned, none a backup
        assert_eq!(
            guarantees_broken(&topo(1, 2, true, false), &map(&[("a", 0, Stopped, true)])),
            None
        );
        assert_eq!(
            guarantees_broken(
                &topo(1, 1, false, true),
                &map(&[("a", 0, Ready, true), ("x", 1, Condemned, false)])
            ),
            None
        );
    }

    /// S0-06: only the allowed transitions.
    #[test]
    fn only_allowed_state_transitions_are_accepted() {
        use ReplicaState::*;
        let all = [Pending, Ready, Stopped, Condemned];
        let allowed = [
            (Pending, Ready),
            (Ready, Stopped),
            (Stopped, Ready),
            (Stopped, Pending),
            (Pending, Condemned),
            (Ready, Condemned),
            (Stopped, Condemned),
        ];
        for from in all {
            for to in all {
                let want = from == to || allowed.contains(&(from, to));
                assert_eq!(transition_allowed(from, to), want, "{from:?} -> {to:?}");
            }
        }
        assert!(!transition_allowed(Condemned, Ready));
        assert!(!transition_allowed(Ready, Pending));
    }

    /// S0-19 / S0-11: scale-out adds Pending entries with fresh, never reused names.
    #[test]
    fn scale_out_adds_pending_entries_with_never_used_names() {
        let empty = BTreeMap::new();
        let c = plan_map(&topo(2, 2, false, false), &empty, 0, ready_facts);
        assert_eq!(c.added, ["c1-0-0", "c1-0-1", "c1-1-2", "c1-1-3"]);
        assert_eq!(c.next_index, 4);
        assert!(c.map.values().all(|r| r.state == ReplicaState::Pending));
        // A name used before (index 7 was a deleted replica) is never given again.
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, true));
        let c = plan_map(&topo(1, 2, false, false), &m, 8, ready_facts);
        assert_eq!(c.added, ["c1-0-8"]);
        assert_eq!(c.next_index, 9);
    }

    /// Decision 54: a replica the user asks to replace is given up (`released`) and a new
    /// replica with a new name takes its place in its shard, the backup role moving to a
    /// survivor; never the last Ready replica of its shard, never while paused; a name that was
    /// a replica and is gone is done, any other name is refused.
    #[test]
    fn a_replaced_replica_is_given_up_for_a_new_one_but_never_the_shards_last() {
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, true));
        m.insert("c1-0-1".into(), entry(0, ReplicaState::Ready, 1, false));
        m.insert("c1-1-2".into(), entry(1, ReplicaState::Ready, 2, true));
        m.insert("c1-1-3".into(), entry(1, ReplicaState::Ready, 3, false));
        let lost = |n: &str| ReplicaFacts {
            ready: n != "c1-0-0",
            ..ready_facts(n)
        };
        let replace = ["c1-0-0".to_string()];
        let t = Topology {
            replace: &replace,
            ..topo(2, 2, false, false)
        };
        let c = plan_map(&t, &m, 4, lost);
        assert_eq!(c.replaced, ["c1-0-0"]);
        assert!(c.condemned.is_empty() && c.refused_replacements.is_empty());
        assert_eq!(c.added, ["c1-0-4"]);
        let gone = &c.map["c1-0-0"];
        assert!(gone.state == ReplicaState::Condemned && gone.released && !gone.is_backup_pod);
        assert!(c.map["c1-0-1"].is_backup_pod);
        // planned again with the change persisted: nothing more
        let again = plan_map(&t, &c.map, c.next_index, lost);
        assert!(again.replaced.is_empty() && again.added.is_empty());
        assert!(again.refused_replacements.is_empty());

        // the shard's only Ready replica: refused, nothing changes
        let both_down = |n: &str| ReplicaFacts {
            ready: n.starts_with("c1-1"),
            ..ready_facts(n)
        };
        let c = plan_map(&t, &m, 4, both_down);
        assert!(c.replaced.is_empty() && c.added.is_empty());
        assert_eq!(c.refused_replacements[0].0, "c1-0-0");
        assert!(
            c.refused_replacements[0]
                .1
                .contains("no other replica of shard 0 is Ready")
        );
        assert_eq!(c.map["c1-0-0"].state, ReplicaState::Ready);
        // paused: nothing
        let paused = Topology {
            replace: &replace,
            ..topo(2, 2, true, false)
        };
        assert!(plan_map(&paused, &m, 4, lost).replaced.is_empty());
        // a name that is done (removed before) is nothing; one never given is refused
        let names = [
            "c1-0-3".to_string(),
            "c1-0-9".to_string(),
            "other".to_string(),
        ];
        let t = Topology {
            replace: &names,
            ..topo(2, 2, false, false)
        };
        let c = plan_map(&t, &m, 4, lost);
        let refused: Vec<&str> = c
            .refused_replacements
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(refused, ["c1-0-9", "other"]);
        assert!(c.replaced.is_empty() && c.added.is_empty());
    }

    /// S0-21 / S0-14: exactly the excess is condemned, newest first, never the backup replica.
    #[test]
    fn scale_in_condemns_newest_but_never_the_backup() {
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, false));
        m.insert("c1-0-1".into(), entry(0, ReplicaState::Ready, 1, false));
        m.insert("c1-0-2".into(), entry(0, ReplicaState::Ready, 2, true));
        let c = plan_map(&topo(1, 1, false, false), &m, 3, ready_facts);
        assert_eq!(c.condemned.len(), 2);
        assert!(!c.condemned.iter().any(|n| n == "c1-0-2"));
        assert_eq!(c.map["c1-0-2"].state, ReplicaState::Ready);
        assert!(c.map["c1-0-2"].is_backup_pod);
        assert_eq!(c.map["c1-0-1"].state, ReplicaState::Condemned);
        // 4 → 2 without the backup among the newest: the two newest go.
        let mut m = BTreeMap::new();
        for i in 0..4 {
            m.insert(
                replica_name("c1", ShardIndex(0), i),
                entry(0, ReplicaState::Ready, i, i == 0),
            );
        }
        let c = plan_map(&topo(1, 2, false, false), &m, 4, ready_facts);
        assert_eq!(c.condemned, ["c1-0-3", "c1-0-2"]);
    }

    /// S0-15: a condemned backup replica (hand-edited map) hands the flag to a Ready replica.
    #[test]
    fn condemned_backup_replica_hands_the_flag_to_a_ready_one() {
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Condemned, 0, true));
        m.insert("c1-0-1".into(), entry(0, ReplicaState::Pending, 1, false));
        m.insert("c1-0-2".into(), entry(0, ReplicaState::Ready, 2, false));
        let c = plan_map(&topo(1, 2, false, false), &m, 3, ready_facts);
        assert!(!c.map["c1-0-0"].is_backup_pod);
        assert!(
            c.map["c1-0-2"].is_backup_pod,
            "the Ready one, not the older Pending one"
        );
        assert_eq!(
            backup_replica(&c.map, ShardIndex(0)).map(|n| n.as_str()),
            Some("c1-0-2")
        );
    }

    /// Decision 77: no replica a backup in flight reads from is condemned until it ends: a
    /// removed shard keeps all its replicas, a replacement and a scale-in that would take it
    /// wait, each said with what holds it; the map so held keeps its guarantees, and the
    /// same map without the hold would not (the held excess counts only while held).
    #[test]
    fn nothing_a_backup_in_flight_reads_from_is_condemned_until_it_ends() {
        let held: BTreeMap<String, String> = [
            ("c1-1-1".to_string(), "backup b1".to_string()),
            ("c1-0-2".to_string(), "backup b1".to_string()),
        ]
        .into();
        let with = |t: Topology<'static>| Topology { held: &held, ..t };
        // a removed shard
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, true));
        m.insert("c1-1-1".into(), entry(1, ReplicaState::Ready, 1, true));
        m.insert("c1-1-3".into(), entry(1, ReplicaState::Ready, 3, false));
        let t = with(topo(1, 1, false, true));
        let c = plan_map(&t, &m, 4, ready_facts);
        assert!(c.condemned.is_empty(), "{:?}", c.condemned);
        assert_eq!(
            c.held_back,
            [(
                "removing shard 1".to_string(),
                "c1-1-1".to_string(),
                "backup b1".to_string()
            )]
        );
        assert_eq!(guarantees_broken(&t, &c.map), None);
        // the backup over: the whole shard goes
        let c = plan_map(&topo(1, 1, false, true), &m, 4, ready_facts);
        assert_eq!(c.condemned, ["c1-1-1", "c1-1-3"]);
        assert!(c.held_back.is_empty());

        // a replacement and a scale-in within a shard
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, true));
        m.insert("c1-0-1".into(), entry(0, ReplicaState::Ready, 1, false));
        m.insert("c1-0-2".into(), entry(0, ReplicaState::Ready, 2, false));
        let replace = ["c1-0-2".to_string()];
        let t = Topology {
            replace: &replace,
            ..with(topo(1, 3, false, false))
        };
        let c = plan_map(&t, &m, 3, ready_facts);
        assert!(c.replaced.is_empty() && c.added.is_empty());
        assert!(
            c.refused_replacements.is_empty(),
            "it waits, it is not refused"
        );
        assert_eq!(c.held_back[0].0, "replacing c1-0-2");
        // 3 → 1: the newest is held, the next one goes, the held one waits
        let t = with(topo(1, 1, false, false));
        let c = plan_map(&t, &m, 3, ready_facts);
        assert_eq!(c.condemned, ["c1-0-1"]);
        assert_eq!(c.held_back[0].0, "scaling in shard 0");
        assert_eq!(guarantees_broken(&t, &c.map), None);
        let why = guarantees_broken(&topo(1, 1, false, false), &c.map).unwrap();
        assert!(why.contains("has 2 replicas that stay, not the 1"), "{why}");
        // held, yet more stay than the backup and the held ones: still broken
        let mut extra = c.map.clone();
        extra.get_mut("c1-0-1").unwrap().state = ReplicaState::Ready;
        let why = guarantees_broken(&t, &extra).unwrap();
        assert!(
            why.contains("has 3 replicas that stay, not the 1 of the spec and 1 held"),
            "{why}"
        );
        // the backup over: the held one goes too
        let c = plan_map(&topo(1, 1, false, false), &c.map, 3, ready_facts);
        assert_eq!(c.condemned, ["c1-0-2"]);
    }

    /// Removing shards loses data: refused unless allowed; allowed condemns all their replicas.
    #[test]
    fn removed_shards_are_refused_unless_allowed() {
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, true));
        m.insert("c1-1-1".into(), entry(1, ReplicaState::Ready, 1, true));
        let c = plan_map(&topo(1, 1, false, false), &m, 2, ready_facts);
        assert_eq!(c.refused_shards, [ShardIndex(1)]);
        assert!(c.condemned.is_empty());
        let c = plan_map(&topo(1, 1, false, true), &m, 2, ready_facts);
        assert_eq!(c.condemned, ["c1-1-1"]);
        assert!(!c.map["c1-1-1"].is_backup_pod);
        assert!(c.map["c1-0-0"].is_backup_pod);
    }

    /// S0-03: pause stops (Ready → Stopped once the pod is gone); resume goes back via Pending.
    #[test]
    fn pause_stops_replicas_once_pods_are_gone_and_resume_goes_through_pending() {
        let mut m = BTreeMap::new();
        m.insert("c1-0-0".into(), entry(0, ReplicaState::Ready, 0, true));
        let running = |_: &str| ReplicaFacts {
            sts_exists: true,
            pod_exists: true,
            ready: true,
            ready_and_current: true,
        };
        let gone = |_: &str| ReplicaFacts {
            sts_exists: true,
            ..ReplicaFacts::default()
        };
        let c = plan_map(&topo(1, 1, true, false), &m, 1, running);
        assert_eq!(c.map["c1-0-0"].state, ReplicaState::Ready, "still stopping");
        let c = plan_map(&topo(1, 1, true, false), &m, 1, gone);
        assert_eq!(c.map["c1-0-0"].state, ReplicaState::Stopped);
        let c = plan_map(&topo(1, 1, false, false), &c.map, 1, gone);
        assert_eq!(c.map["c1-0-0"].state, ReplicaState::Pending);
        assert!(c.added.is_empty(), "resuming adds no replica");
    }

    /// Unchanged input: the map is a fixed point.
    #[test]
    fn a_settled_map_does_not_change() {
        let empty = BTreeMap::new();
        let mut c = plan_map(&topo(2, 3, false, false), &empty, 0, ready_facts);
        for r in c.map.values_mut() {
            r.state = ReplicaState::Ready;
        }
        let again = plan_map(&topo(2, 3, false, false), &c.map, c.next_index, ready_facts);
        assert_eq!(again.map, c.map);
        assert!(again.added.is_empty() && again.condemned.is_empty());
    }

    proptest! {
        /// S0-06 / S0-13 / S0-14: over random sequences of resizes and pauses, every transition
        /// is an allowed one, every shard with a replica has exactly one backup replica, the backup replica is never condemned, names are never
        /// reused, and each shard ends with the requested number of active replicas.
        #[test]
        fn one_backup_per_shard_through_any_sequence(
            ops in proptest::collection::vec((1i32..4, 1i32..5, any::<bool>(), any::<bool>()), 1..16)
        ) {
            let mut map: BTreeMap<ReplicaName, ReplicaStatus> = BTreeMap::new();
            let mut next = 0;
            let mut seen = std::collections::BTreeSet::new();
            for (shards, replicas, ready, paused) in ops {
                let facts = move |_: &str| ReplicaFacts { sts_exists: true, pod_exists: ready, ready, ready_and_current: ready };
                let c = plan_map(&topo(shards, replicas, paused, true), &map, next, facts);
                for n in &c.added {
                    prop_assert!(seen.insert(n.clone()), "name {} reused", n);
                }
                for n in &c.condemned {
                    prop_assert!(!c.map[n].is_backup_pod);
                }
                // the guarantees every pass checks on the map it planned
                let t = topo(shards, replicas, paused, true);
                prop_assert_eq!(guarantees_broken(&t, &c.map), None);
                // S0-06: every entry moves only along an allowed transition.
                for (n, before) in &map {
                    if let Some(after) = c.map.get(n) {
                        prop_assert!(
                            transition_allowed(before.state, after.state),
                            "{}: {:?} -> {:?}", n, before.state, after.state
                        );
                    }
                }
                // Condemned replicas finish their scale-in and leave the map; running pods
                // of Pending replicas make them Ready (their schema was copied).
                map = c.map.into_iter().filter(|(_, r)| r.state != ReplicaState::Condemned).collect();
                for r in map.values_mut() {
                    if ready && !paused && r.state == ReplicaState::Pending {
                        r.state = ReplicaState::Ready;
                    }
                }
                next = c.next_index;
                for shard in 0..shards {
                    let members: Vec<_> = map.values().filter(|r| r.shard == ShardIndex(shard)).collect();
                    if !paused {
                        prop_assert_eq!(members.len() as i32, replicas);
                    }
                    if !members.is_empty() {
                        prop_assert_eq!(members.iter().filter(|r| r.is_backup_pod).count(), 1);
                    }
                }
            }
        }
    }
}
