//! The Keeper ensemble (S2-09, decision 14: Keeper first). Its membership changes one member at
//! a time (decision 25), and only while every member that stays is Ready, so a change of size
//! never puts quorum at risk:
//!
//! - growing `n → n+1`: the member list (ConfigMap) and the pods go to `n+1` together (the new
//!   member must find itself in its configuration); the next member is added only once every
//!   member is Ready and lists exactly the `n+1` members as committed;
//! - shrinking `n → n-1`: first the member list goes to `n-1` while the `n` pods keep running;
//!   the last pod goes only once every remaining member lists exactly the `n-1` members.
//!
//! The member count chosen for this pass ([`size`]) decides the whole desired state (servers
//! list the Keeper members of this step), which the Build phase makes from it; then the Keeper
//! objects are applied ([`plan`]).

use super::{Early, Pass, json_of};
use crate::model::names;
use crate::plan::FailureReason;
use crate::plan::facts::{KeeperMember, KeeperRole, Kind, MemberView, claims};
use crate::plan::step::Step;
use crate::version::{Capability, image_version};

/// Why a `clusterRef` to another cluster's Keeper is refused (decision 38): that cluster
/// must exist and list this namespace in its `spec.keeper.allowedNamespaces`, and a new root
/// must lie in this namespace's folder of that Keeper (`/clickhouse-operator/<namespace>/…`),
/// below which no other namespace's cluster can have its root. A root made before this rule
/// stays where it is.
///
/// `spec.keeper.external.nodes` that name such a cluster's Keeper (its Service or pods, by name
/// or address) are held to the same rules (decision 71, review M-4): the operator, which every
/// Keeper NetworkPolicy lets in, would otherwise reach that Keeper for a namespace it never
/// allowed. `field` is the field that names it.
fn refused_reference(
    pass: &Pass,
    field: &str,
    r: &crate::api::KeeperClusterRef,
    root: &str,
) -> Option<String> {
    use crate::plan::facts::KeeperOwner;
    let owner_ns = r
        .namespace
        .clone()
        .unwrap_or_else(|| pass.input.namespace.clone());
    let named = if field.ends_with("nodes") {
        format!(
            "{field}: name the Keeper of ClickHouseCluster {owner_ns}/{}, which",
            r.name
        )
    } else {
        format!("{field}: ClickHouseCluster {owner_ns}/{}", r.name)
    };
    match pass.input.obs.keeper_owner {
        Some(KeeperOwner::Missing) => {
            return Some(format!("{named} does not exist"));
        }
        Some(KeeperOwner::Refuses) => {
            return Some(format!(
                "{named} does not let namespace {} use its Keeper: add {} to its spec.keeper.allowedNamespaces",
                pass.input.namespace, pass.input.namespace
            ));
        }
        _ => {}
    }
    let folder = crate::api::ExternalKeeper::namespace_folder(&pass.input.namespace);
    let made = pass.input.old.keeper_root.as_deref() == Some(root);
    let below = root.strip_prefix(&folder).is_some_and(|rest| {
        !rest.is_empty()
            && !rest
                .split('/')
                .any(|s| s.is_empty() || s == ".." || s == ".")
    });
    (!made && !below).then(|| {
        format!(
            "spec.keeper.external.root {root:?} must lie below {folder} in another cluster's Keeper: the roots of other namespaces' clusters, and that cluster's own data, are outside it"
        )
    })
}

/// Whether the servers this pass may start keep trying a Keeper that does not serve yet
/// ([`Capability::StartsBeforeKeeper`]): the lowest version known to run, else the image
/// tag's. An unknown version waits for Keeper, as 18.16 must.
pub fn servers_retry_keeper(pass: &Pass) -> bool {
    pass.input
        .server_version
        .or_else(|| image_version(&pass.input.spec.image).map(|(_, v)| v))
        .is_some_and(|v| v.supports(Capability::StartsBeforeKeeper))
}

/// The Keeper ensemble's size for one pass.
pub struct Size {
    /// Members listed in the configuration: one step towards `spec.keeper.replicas`.
    pub members: i32,
    /// Pods: one more than `members` while a leaving member's pod runs until the others have
    /// let it go.
    pub pods: i32,
    /// Members and pods are `spec.keeper.replicas` and every member agrees on them (decision
    /// 25).
    pub settled: bool,
}

pub fn plan(pass: &mut Pass) {
    let own = pass.built.desired.keeper.is_some();
    let serving = !own || (pass.input.facts.keeper.size > 0 && pass.input.facts.keeper.all_ready());
    pass.gates.servers_may_start = serving || (own && servers_retry_keeper(pass));
    if let Some(x) = &pass.input.spec.keeper.external {
        // an external ensemble: the servers start once their root exists in it
        let root = x.root_of(&pass.input.namespace, &pass.input.name);
        // nodes that are another namespace's cluster's Keeper count as a reference to it
        let by_nodes = pass
            .input
            .obs
            .keeper_nodes_of
            .clone()
            .map(|(namespace, name)| crate::api::KeeperClusterRef {
                name,
                namespace: Some(namespace),
            });
        let reference = match (&x.cluster_ref, &by_nodes) {
            (Some(r), _) => Some(("spec.keeper.external.clusterRef", r)),
            (None, Some(r)) => Some(("spec.keeper.external.nodes", r)),
            (None, None) => None,
        };
        if let Some((field, r)) = reference
            && let Some(why) = refused_reference(pass, field, r, &root)
        {
            pass.fail_and_halt(FailureReason::Keeper, why);
            return;
        }
        if let Some(old) = pass.input.old.keeper_root.clone().filter(|r| *r != root) {
            // the servers' replication metadata and DDL queue are under the old root
            pass.fail_and_halt(
                FailureReason::InvalidSpec,
                format!(
                    "spec.keeper.external.root cannot change: the cluster's Keeper data is under {old}, not {root}; nothing was changed"
                ),
            );
            return;
        }
        let made = pass.input.old.keeper_root.as_deref() == Some(root.as_str());
        if !made {
            pass.emit(Step::EnsureKeeperRoot { root });
        }
        pass.gates.servers_may_start = made;
    }
    let Some(k) = &pass.built.desired.keeper else {
        return;
    };
    // shrinking, the StatefulSet keeps the leaving member's pod (built with the pass's pods)
    let mut statefulset = json_of(&k.statefulset);
    // a template that needs no restart is left as it is: the roll would restart the members
    // for a field a newer operator adds (invariant 9)
    let name = names::keeper(&pass.input.name);
    // a StatefulSet made again (its claim templates changed, or deleted by hand) over running
    // members: the launch fields held back are the members' own (invariant 9)
    if pass.input.facts.keeper.statefulset.is_none()
        && let Some(running) = (0..pass
            .input
            .facts
            .keeper
            .size
            .max(pass.input.spec.keeper.replicas))
            .filter_map(|i| pass.input.obs.pods.get(&format!("{name}-{i}")))
            .find_map(|p| p.spec.as_ref())
    {
        let kept = serde_json::json!({"spec": json_of(running)});
        let template = statefulset["spec"]["template"].take();
        statefulset["spec"]["template"] =
            crate::model::with_deferred_keeper_launch(template, Some(&kept));
    }
    // decision 67: launch fixes held back from a running ensemble (invariant 9) go to one whose
    // member crash-loops on a template without them
    let crash_looping: Vec<String> = pass
        .input
        .facts
        .keeper
        .members
        .values()
        .filter(|m| m.crash_looping && !m.node_lost)
        .map(|m| m.pod.clone())
        .collect();
    let template_current = match &pass.input.facts.keeper.statefulset {
        Some(observed) if super::template_covers(observed, &statefulset) => {
            let held_back = crate::model::keeper_launch_held_back(
                &statefulset["spec"]["template"],
                &observed["spec"]["template"],
            );
            if held_back && !crash_looping.is_empty() {
                pass.event(
                    "UpdateTemplate",
                    "RepairKeeper",
                    format!(
                        "Keeper member {} crash-loops on a pod template without this version's \
                         start fixes (command, data directory, startup budget): the ensemble \
                         gets them, the crash-looping members are replaced and the others \
                         follow one at a time",
                        crash_looping.join(", ")
                    ),
                );
                false
            } else {
                statefulset = super::with_template_of(&statefulset, observed);
                true
            }
        }
        _ => false,
    };
    // claim templates cannot change: the Storage phase recreates the StatefulSet instead
    let claims_differ =
        pass.input.facts.keeper.exists && pass.input.facts.keeper.claims != claims(&statefulset);
    let objects = [
        (Kind::ConfigMap, json_of(&k.config)),
        (Kind::Service, json_of(&k.headless_service)),
        (Kind::StatefulSet, statefulset),
        (Kind::PodDisruptionBudget, json_of(&k.pdb)),
    ];
    for (kind, object) in objects {
        if kind == Kind::StatefulSet && claims_differ {
            pass.want(kind, &name);
            continue;
        }
        pass.apply(kind, object);
    }
    repair(pass);
    if template_current {
        // a template this pass writes is rolled once the StatefulSet has its revision
        roll(pass);
    }
}

/// Keeper's StatefulSet is `OnDelete`: the operator rolls the members onto a new template
/// itself (decision 31), one at a time, followers first and the leader last, and the next member
/// only once the ensemble reports every follower synced again (the leader's
/// `zk_synced_followers`) and every member Ready. A newer change while a roll runs is simply
/// where the next member goes, so rapid changes restart each follower at most once per member
/// step and lead to one leader change per roll. Not under `updateStrategy: OnDelete` (a user
/// deletes the pods, S2-34), not while paused, not while the membership changes.
fn roll(pass: &mut Pass) {
    use crate::api::UpdateStrategy;
    let k = &pass.input.facts.keeper;
    if !k.exists
        || pass.input.facts.mode.paused()
        || pass.input.spec.update_strategy == UpdateStrategy::OnDelete
        || k.size != pass.built.keeper_size
        || k.size != pass.input.spec.keeper.replicas
    {
        return;
    }
    let left = (0..k.size)
        .filter_map(|i| k.members.get(&i))
        .filter(|m| m.old_revision)
        .count();
    if left == 0 {
        return;
    }
    let next = next_to_roll(k, pass.input.now);
    let why = match &next {
        Ok(m) => format!("{} restarts", m.pod),
        Err(why) => why.clone(),
    };
    pass.waits.push(format!(
        "rolling Keeper onto its new template ({left} of {} members left): {why}",
        k.size
    ));
    let Ok(m) = next else {
        return;
    };
    pass.event(
        "RestartPod",
        "RollKeeper",
        format!(
            "restarting Keeper member {} ({}) on the new revision",
            m.pod,
            m.role.describe()
        ),
    );
    pass.emit(Step::RestartPod {
        statefulset: names::keeper(&pass.input.name),
        pod: m.pod,
        uid: m.uid,
        // Keeper pods are in no client Service
        serving: false,
    });
}

/// How long every follower runs the newest template before the leader restarts: changes
/// that come faster than this (a burst of edits, a GitOps sync in several commits) restart the
/// followers again, but the leader, and with it every server's Keeper session, once.
pub const LEADER_SETTLE: std::time::Duration = std::time::Duration::from_secs(15);

/// The member the roll restarts now, or why none may go yet: every member of the ensemble
/// present, Ready and not stopping, the leader known and reporting every follower synced,
/// every follower's role known; then an outdated follower (highest ordinal first), the
/// leader only when no follower is outdated and each has been Ready for [`LEADER_SETTLE`]. An
/// ensemble of one has no one to wait for.
///
/// A member whose node stopped reporting is down for as long as it takes (decision 47): the
/// others are rolled without it as long as a majority of the ensemble still runs while one of
/// them restarts (five members with one lost: yes; three with one lost: no, the roll waits
/// for it), and it is rolled when it is back.
pub(super) fn next_to_roll(
    k: &crate::plan::facts::KeeperFacts,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<KeeperMember, String> {
    let all: Vec<&KeeperMember> = (0..k.size).filter_map(|i| k.members.get(&i)).collect();
    if all.len() as i32 != k.size {
        return Err("waiting for every member's pod".into());
    }
    let (lost, members): (Vec<&KeeperMember>, Vec<&KeeperMember>) =
        all.into_iter().partition(|m| m.node_lost && !m.terminating);
    if let Some(m) = members.iter().find(|m| m.terminating || !m.ready) {
        let what = if m.terminating { "stop" } else { "serve" };
        return Err(format!("waiting for {} to {what}", m.pod));
    }
    let outdated: Vec<&KeeperMember> = members.iter().copied().filter(|m| m.old_revision).collect();
    let lost_names = || {
        lost.iter()
            .map(|m| m.pod.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(first) = outdated.first() else {
        if lost.iter().any(|m| m.old_revision) {
            return Err(format!(
                "waiting for the node of {} to report again to restart it",
                lost_names()
            ));
        }
        return Err("nothing to restart".into());
    };
    if k.size == 1 {
        return Ok((*first).clone());
    }
    if !lost.is_empty() && (members.len() as i32 - 1) < k.size / 2 + 1 {
        return Err(format!(
            "waiting for {}, whose node stopped reporting: restarting another member now would leave the ensemble without a majority",
            lost_names()
        ));
    }
    let Some((leader, synced)) = members.iter().find_map(|m| match m.role {
        KeeperRole::Leader { synced_followers } => Some((m.pod.as_str(), synced_followers)),
        _ => None,
    }) else {
        return Err("waiting for the ensemble to report its leader".into());
    };
    let followers = members.len() as i32 - 1;
    if (synced as i32) < followers {
        return Err(format!(
            "waiting for every follower to be synced ({synced} of {followers} as {leader} reports)"
        ));
    }
    if let Some(m) = members.iter().find(|m| m.role == KeeperRole::Unknown) {
        return Err(format!("waiting for {} to report its role", m.pod));
    }
    if let Some(m) = outdated
        .iter()
        .rev()
        .find(|m| m.role == KeeperRole::Follower)
    {
        return Ok((**m).clone());
    }
    let settle = k8s_openapi::jiff::SignedDuration::try_from(LEADER_SETTLE).unwrap_or_default();
    let unsettled = members
        .iter()
        .find(|m| m.pod != leader && m.ready_since.is_none_or(|t| now.duration_since(t) < settle));
    if let Some(m) = unsettled {
        return Err(format!(
            "the leader {leader} restarts once every follower has run the new template for {} s ({} has not)",
            LEADER_SETTLE.as_secs(),
            m.pod
        ));
    }
    Ok((*first).clone())
}

/// A member that is not Ready on an old revision (a reverted bad change: unschedulable,
/// crash-looping, an image that cannot be pulled) is replaced at once: it serves nothing, and
/// the StatefulSet's own rolling update never replaces a pod that is not Ready (decision 5).
/// Not one whose node stopped reporting: its pod cannot go until the node is back (decision
/// 47).
fn repair(pass: &mut Pass) {
    let keeper = names::keeper(&pass.input.name);
    let broken: Vec<(String, Option<String>)> = pass
        .input
        .facts
        .keeper
        .members
        .values()
        .filter(|m| !m.ready && m.old_revision && !m.terminating && !m.node_lost)
        .map(|m| (m.pod.clone(), m.uid.clone()))
        .collect();
    for (pod, uid) in broken {
        pass.event(
            "RestartPod",
            "Repair",
            format!("replacing Keeper pod {pod}: not Ready on an old revision"),
        );
        pass.emit(Step::RestartPod {
            statefulset: keeper.clone(),
            pod,
            uid,
            serving: false,
        });
    }
}

/// The members (listed in the configuration) and pods of the ensemble for this pass: one
/// member closer to `spec.keeper.replicas` when the members that stay are Ready and agree;
/// why it waits, if it does, among the pass's waits.
pub fn size(pass: &mut Early) -> Size {
    let want = pass.input.spec.keeper.replicas;
    let k = &pass.input.facts.keeper;
    if !k.exists || pass.input.facts.mode.paused() || k.size == 0 {
        return Size {
            members: want,
            pods: want,
            settled: true,
        };
    }
    let have = k.size;
    let (members, pods, waiting) = if have == want {
        let lagging = (k.views_read && k.all_ready())
            .then(|| k.unacknowledged(want))
            .flatten();
        let waiting = lagging.map(|(pod, view)| {
            format!(
                "Keeper member {pod} does not list the {want} members yet ({})",
                describe(&view)
            )
        });
        (want, want, waiting)
    } else if have < want {
        if k.all_ready_and_current() && k.acknowledged(have) {
            (have + 1, have + 1, None)
        } else {
            let why = match k.unacknowledged(have) {
                Some((pod, view)) if k.all_ready() => {
                    format!("{pod} lists {}", describe(&view))
                }
                _ => "every member is Ready".into(),
            };
            (
                have,
                have,
                Some(format!(
                    "Keeper membership {have} → {want} waits until {why} (member {have} added)"
                )),
            )
        }
    } else {
        let step = have - 1;
        let started = k
            .members
            .values()
            .any(|m| m.view == MemberView::Voters((1..=step as u32).collect()));
        if k.acknowledged(step) {
            (step, step, None)
        } else if started || k.ready_and_current_of(step) == step {
            let why = match k.unacknowledged(step) {
                Some((pod, view)) => format!("{pod} lists {}", describe(&view)),
                None => "every remaining member is Ready".into(),
            };
            (
                step,
                have,
                Some(format!(
                    "Keeper member {} leaves the ensemble; its pod stays until {why}",
                    step
                )),
            )
        } else {
            (
                have,
                have,
                Some(format!(
                    "Keeper membership {have} → {want} waits until every member that stays is Ready"
                )),
            )
        }
    };
    let leaving = k.members.range(want..).next().map(|(_, m)| m.pod.clone());
    let settled = waiting.is_none() && members == want && pods == want && leaving.is_none();
    let waiting = waiting.or_else(|| {
        leaving
            .filter(|_| pods == want)
            .map(|pod| format!("Keeper pod {pod} is leaving"))
    });
    if let Some(w) = waiting {
        pass.waits.push(w);
    }
    if members != want {
        pass.waits.push(format!(
            "Keeper membership {want} reached one member at a time (now {members})"
        ));
    }
    Size {
        members,
        pods,
        settled,
    }
}

fn describe(view: &MemberView) -> String {
    match view {
        MemberView::Voters(v) => format!(
            "members {}",
            v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ),
        MemberView::Unpublished => "no configuration".into(),
        MemberView::Unknown => "nothing (not answering)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::next_to_roll;
    use crate::plan::facts::{KeeperFacts, KeeperMember, KeeperRole};
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn ensemble(size: i32, leader: i32, synced: u32) -> KeeperFacts {
        KeeperFacts {
            exists: true,
            size,
            members: (0..size)
                .map(|i| {
                    let role = if i == leader {
                        KeeperRole::Leader {
                            synced_followers: synced,
                        }
                    } else {
                        KeeperRole::Follower
                    };
                    let m = KeeperMember {
                        pod: format!("c1-keeper-{i}"),
                        ready: true,
                        ready_since: Some(now() - SignedDuration::from_secs(60)),
                        old_revision: true,
                        role,
                        ..KeeperMember::default()
                    };
                    (i, m)
                })
                .collect(),
            views_read: true,
            ..KeeperFacts::default()
        }
    }

    /// Lost as the node controller leaves it: not Ready, its role unknown.
    fn lose(k: &mut KeeperFacts, i: i32) {
        let m = k.members.get_mut(&i).unwrap();
        m.ready = false;
        m.node_lost = true;
        m.role = KeeperRole::Unknown;
    }

    /// Issue scenario "a Keeper member on a lost node does not block the rest of the
    /// ensemble's changes" (decision 47): with five members and one on a node that stopped
    /// reporting, the others are rolled, followers first, the leader last, while a majority
    /// runs; the lost member waits for its node. With three members, restarting another would
    /// leave no majority: the roll waits and says why.
    #[test]
    fn a_member_on_a_lost_node_holds_the_roll_only_where_a_majority_needs_it() {
        let pick = |k: &KeeperFacts| next_to_roll(k, now()).map(|m| m.pod);
        let mut five = ensemble(5, 0, 3);
        lose(&mut five, 4);
        assert_eq!(pick(&five).unwrap(), "c1-keeper-3");
        for i in 1..4 {
            five.members.get_mut(&i).unwrap().old_revision = false;
        }
        assert_eq!(pick(&five).unwrap(), "c1-keeper-0");
        five.members.get_mut(&0).unwrap().old_revision = false;
        let why = pick(&five).unwrap_err();
        assert!(why.contains("node of c1-keeper-4 to report again"), "{why}");
        // a follower not yet synced still holds it
        let mut five = ensemble(5, 0, 2);
        lose(&mut five, 4);
        assert!(pick(&five).unwrap_err().contains("synced (2 of 3"));

        let mut three = ensemble(3, 0, 1);
        lose(&mut three, 2);
        let why = pick(&three).unwrap_err();
        assert!(
            why.contains("c1-keeper-2, whose node stopped reporting")
                && why.contains("without a majority"),
            "{why}"
        );
        // a member down for another reason still holds everything
        let mut five = ensemble(5, 0, 3);
        five.members.get_mut(&4).unwrap().ready = false;
        assert!(pick(&five).unwrap_err().contains("c1-keeper-4 to serve"));
    }
}
