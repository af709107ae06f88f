//! PURE: the status a pass reports, computed last: what the cluster is doing from the facts
//! and what the phases decided (S2-14…S2-19: `initializing`, `ready`, `paused`, `stopping`,
//! `error`, with the reason in the message). What the executor did is added by
//! [`crate::plan::report::report`].

use super::{Input, Pass};
use crate::api::{
    ClickHouseClusterStatus, ClientServiceType, ClusterState, ComponentStatus, ReplicaName,
    ReplicaState,
};
use crate::model::names;
use crate::plan::Failure;
use crate::plan::facts::Mode;
use crate::plan::status::{self, set_condition};

/// The status after a planned pass, before anything was executed.
pub fn pass_status(pass: &Pass) -> ClickHouseClusterStatus {
    let generation = pass.input.cluster.metadata.generation;
    if pass.gates.halted {
        return halted_status(pass.input, pass.failure());
    }
    let mut status = pass.input.old.clone();
    status.replica_state_map = pass.map.clone();
    status.next_replica_index = pass.next_index;
    status.observed_generation = generation;
    let spec = pass.input.spec;
    let wanted: Vec<&ReplicaName> = pass.live_replicas().map(|(n, _)| n).collect();
    let serving = wanted
        .iter()
        .filter(|n| pass.input.facts.server(n).pod.ready)
        .count() as i32;
    let ready_servers = wanted.iter().filter(|n| pass.ready_and_current(n)).count() as i32;
    status.clickhouse = ComponentStatus::new(spec.shards * spec.replicas, serving, ready_servers);
    let keeper_size = spec.keeper.replicas;
    let (keeper_serving, keeper_ready) = if pass.built.desired.keeper.is_some() {
        let k = &pass.input.facts.keeper;
        // every Keeper pod, also one joining or leaving the ensemble during a resize
        let serving = k.members.values().filter(|m| m.ready).count() as i32;
        let ready = k.members.values().filter(|m| m.ready && m.current).count() as i32;
        (serving, ready)
    } else {
        (0, 0)
    };
    status.keeper = ComponentStatus::new(keeper_size, keeper_serving, keeper_ready);
    status.host = client_host(pass);
    status.version = pass.input.recorded_version.map(|v| v.to_string());
    let (state, mut message) = state(pass, &status, ready_servers, keeper_ready);
    let (crash_reason, crash) = full_crash(pass, &status, serving, keeper_serving);
    if let (Some(crash), ClusterState::Initializing) = (&crash, state) {
        message = Some(match message {
            Some(m) => format!("{crash}; {m}"),
            None => crash.clone(),
        });
    }
    status.state = state;
    status.message = message;
    // Whether the pass succeeded is known once the executor ran it: see [`report`].
    if let Some(f) = pass.failure() {
        status = status::failed(&status, generation, f, pass.input.now);
    }
    set_condition(
        &mut status.conditions,
        status::FULL_CRASH,
        crash.is_some(),
        crash_reason,
        crash.as_deref().unwrap_or(""),
        generation,
        pass.input.now,
    );
    let ready = state == ClusterState::Ready;
    set_condition(
        &mut status.conditions,
        "Ready",
        ready,
        if ready { "Ready" } else { "NotReady" },
        status.message.as_deref().unwrap_or(""),
        generation,
        pass.input.now,
    );
    status
}

/// The status after a halted pass: the one it started from, with the failure if there is one.
pub fn halted_status(input: &Input, failure: Option<&Failure>) -> ClickHouseClusterStatus {
    let generation = input.cluster.metadata.generation;
    match failure {
        Some(f) => status::failed(&input.old, generation, f, input.now),
        None => input.old.clone(),
    }
}

/// S2-12, the full-crash check: a cluster whose replicas ran (one of its map is `Ready`), not
/// being paused or switching TLS, whose every wanted server pod is down, or whose Keeper has no
/// serving member. A cluster resuming from a pause is not in a crash until a server served
/// again (the condition's reason `Resuming` carries that from pass to pass); a new cluster has
/// no `Ready` replica yet. The rollout restarts every replica of a shard without a Ready one at
/// once, not one by one (`plan::rollout`), Keeper members that do not serve are replaced at
/// once (`keeper::repair`), and servers start once Keeper serves. Proven end to end for both
/// halves by `tests/e2e/recovery.rs` (`every_server_down_at_once_…`,
/// `every_keeper_member_down_…`). Returns the condition's reason and, in a crash, what is down.
fn full_crash(
    pass: &Pass,
    status: &ClickHouseClusterStatus,
    serving: i32,
    keeper_serving: i32,
) -> (&'static str, Option<String>) {
    let before = pass.input.cluster.status.as_ref();
    let resuming = before.is_some_and(|s| {
        matches!(s.state, ClusterState::Paused | ClusterState::Stopping)
            || s.conditions
                .iter()
                .any(|c| c.r#type == status::FULL_CRASH && c.reason == "Resuming")
    });
    let ran = status
        .replica_state_map
        .values()
        .any(|r| r.state == ReplicaState::Ready);
    if !ran || pass.input.facts.mode != Mode::Running {
        return ("Serving", None);
    }
    if resuming && serving == 0 {
        return ("Resuming", None);
    }
    let servers = pass.live_replicas().count();
    let keeper = pass.built.desired.keeper.is_some() && pass.input.spec.keeper.replicas > 0;
    let parts: Vec<String> = [
        (servers > 0 && serving == 0).then(|| format!("every server is down (0/{servers} Ready)")),
        (keeper && keeper_serving == 0).then(|| {
            format!(
                "Keeper has no serving member (0/{})",
                pass.input.spec.keeper.replicas
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        return ("Serving", None);
    }
    (
        "Down",
        Some(format!(
            "full crash: {}, recovering them all at once",
            parts.join(" and ")
        )),
    )
}

/// The address clients use: the LoadBalancer's, or the client Service's DNS name.
fn client_host(pass: &Pass) -> Option<String> {
    let svc = pass.built.desired.client_service.as_ref()?;
    let observed = pass.input.obs.objects.get(&(
        crate::plan::facts::Kind::Service,
        svc.metadata.name.clone()?,
    ))?;
    match pass.input.spec.client_service.r#type {
        ClientServiceType::LoadBalancer => {
            let ing = &observed["status"]["loadBalancer"]["ingress"][0];
            ing["ip"]
                .as_str()
                .or(ing["hostname"].as_str())
                .map(str::to_string)
        }
        _ => Some(names::client_host(
            &pass.input.name,
            &pass.input.namespace,
            pass.input.spec.cluster_domain(),
        )),
    }
}

/// The wanted servers that are Ready but have not loaded the current remote_servers yet (it is
/// reloaded, not restarted).
fn lagging_hosts<'a>(pass: &Pass, wanted: &[&'a ReplicaName]) -> Vec<&'a str> {
    wanted
        .iter()
        .filter(|n| pass.input.facts.server(n).pod.ready)
        .filter(|n| {
            pass.input
                .obs
                .cluster_hosts
                .get(n.as_str())
                .is_some_and(|seen| *seen != Some(pass.built.listed))
        })
        .map(|n| n.as_str())
        .collect()
}

/// The wanted servers through which a Distributed query does not reach every shard yet, with
/// why.
fn unreachable_shards(pass: &Pass, wanted: &[&ReplicaName]) -> Vec<String> {
    wanted
        .iter()
        .filter_map(|n| {
            let e = pass.input.obs.distributed.get(n.as_str())?.as_ref()?;
            Some(format!("{n} ({e})"))
        })
        .collect()
}

/// Whether the pass waits for something in the servers that no Kubernetes event announces: a
/// server loading the new remote_servers (ClickHouse reloads its configuration every few
/// seconds), or Distributed queries reaching every shard. Such a wait is checked again soon,
/// not at the idle re-check.
pub fn waits_on_servers(pass: &Pass) -> bool {
    let wanted: Vec<&ReplicaName> = pass.live_replicas().map(|(n, _)| n).collect();
    !lagging_hosts(pass, &wanted).is_empty() || !unreachable_shards(pass, &wanted).is_empty()
}

/// The state and its message.
fn state(
    pass: &Pass,
    status: &ClickHouseClusterStatus,
    ready_servers: i32,
    keeper_ready: i32,
) -> (ClusterState, Option<String>) {
    let spec = pass.input.spec;
    let wanted: Vec<&ReplicaName> = pass.live_replicas().map(|(n, _)| n).collect();
    let condemned: Vec<&str> = pass
        .map
        .iter()
        .filter(|(_, r)| r.state == ReplicaState::Condemned)
        .map(|(n, _)| n.as_str())
        .collect();
    let mut waits = pass.waits.clone();
    let lagging = lagging_hosts(pass, &wanted);
    if !lagging.is_empty() {
        waits.push(format!(
            "waiting for {} to load the cluster's {} hosts",
            lagging.join(", "),
            pass.built.listed
        ));
    }
    let unreachable = unreachable_shards(pass, &wanted);
    if !unreachable.is_empty() {
        waits.push(format!(
            "waiting for servers to serve: {}",
            unreachable.join(", ")
        ));
    }
    let all_ready = lagging.is_empty()
        && unreachable.is_empty()
        && ready_servers == spec.shards * spec.replicas
        && wanted
            .iter()
            .all(|n| status.replica_state_map[*n].state == ReplicaState::Ready)
        && keeper_ready == spec.keeper.replicas
        && pass.built.keeper_settled
        && condemned.is_empty()
        && pass.gates.storage_busy.is_empty()
        && !pass.gates.held_by_backup
        && (status.host.is_some() || !spec.serves_clients())
        && !pass
            .members
            .iter()
            .any(|m| m.template_outdated || m.pod_outdated);
    waits.extend(pass.input.facts.unschedulable.iter().cloned());
    if pass.input.facts.mode == Mode::SwitchingTls && !pass.failed() {
        return (ClusterState::Stopping, Some(waits.join("; ")));
    }
    if let Some(f) = pass.failure() {
        return (ClusterState::Error, Some(f.message.clone()));
    }
    match pass.input.facts.mode {
        Mode::Pausing => {
            return (
                ClusterState::Stopping,
                Some(format!(
                    "stopping: {} pod(s) still running",
                    pass.input.facts.pods
                )),
            );
        }
        Mode::Paused => return (ClusterState::Paused, None),
        _ => {}
    }
    if all_ready {
        return (ClusterState::Ready, None);
    }
    if waits.is_empty() {
        let not_ready: Vec<&str> = wanted
            .iter()
            .filter(|n| !pass.ready_and_current(n))
            .map(|n| n.as_str())
            .collect();
        if !not_ready.is_empty() {
            waits.push(format!(
                "waiting for server replicas to be Ready and up to date: {}",
                not_ready.join(", ")
            ));
        }

        let pending: Vec<&str> = wanted
            .iter()
            .filter(|n| {
                pass.ready_and_current(n)
                    && status.replica_state_map[**n].state == ReplicaState::Pending
            })
            .map(|n| n.as_str())
            .collect();
        if !pending.is_empty() {
            waits.push(format!("copying the schema onto {}", pending.join(", ")));
        }
        if keeper_ready < spec.keeper.replicas {
            waits.push(format!(
                "waiting for Keeper members ({keeper_ready}/{} ready)",
                spec.keeper.replicas
            ));
        }
        if !condemned.is_empty() {
            waits.push(format!("removing replicas {}", condemned.join(", ")));
        }
        if status.host.is_none() && spec.serves_clients() {
            waits.push("waiting for the client Service's address".into());
        }
    }
    // why pods are not Ready, where they say (decision 30: a crash loop names its last error)
    let failing = wanted
        .iter()
        .map(|n| pass.input.facts.server(n))
        .filter(|f| !f.pod.ready)
        .filter_map(|f| f.pod.failing.clone().or_else(|| f.pod.node_lost.clone()))
        .chain(
            pass.input
                .facts
                .keeper
                .members
                .values()
                .filter(|m| !m.ready)
                .filter_map(|m| m.failing.clone()),
        )
        .collect::<Vec<_>>();
    for f in failing {
        if !waits.iter().any(|w| w.contains(&f)) {
            waits.push(f);
        }
    }
    (
        ClusterState::Initializing,
        Some(waits.join("; ")).filter(|s| !s.is_empty()),
    )
}
