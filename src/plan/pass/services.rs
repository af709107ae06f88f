//! Services (S2-09): the headless Service of the servers, the client Service unless switched off,
//! and Keeper's client Service; the NetworkPolicies unless switched off (decision 27). While the
//! cluster is not ready, the servers are made to resolve the cluster's host names again: a pod that
//! came back with a new address stays unreachable from servers that cache DNS for good
//! (decision 17).

use k8s_openapi::jiff::SignedDuration;

use super::{Pass, json_of};
use crate::api::{ClusterState, ReplicaName};
use crate::plan::facts::Kind;
use crate::plan::step::Step;

/// How long after a server pod became Ready the others keep refreshing their DNS cache.
const DNS_SETTLE: SignedDuration = SignedDuration::from_secs(30);

pub fn plan(pass: &mut Pass) {
    let d = &pass.built.desired;
    let services: Vec<serde_json::Value> = std::iter::once(json_of(&d.headless_service))
        .chain(d.client_service.iter().map(json_of))
        .chain(d.replica_services.iter().map(json_of))
        .chain(d.keeper.iter().map(|k| json_of(&k.client_service)))
        .collect();
    for s in services {
        pass.apply(Kind::Service, s);
    }
    let policies: Vec<serde_json::Value> = pass
        .built
        .desired
        .network_policies
        .iter()
        .map(json_of)
        .collect();
    for p in policies {
        pass.apply(Kind::NetworkPolicy, p);
    }
    // While the cluster is not ready, and for a while after a server pod became Ready (its
    // peers learn its address a moment later), every Ready server resolves the cluster's hosts
    // again: a server that cached a pod's old address would neither fetch parts from it nor
    // reach it from a Distributed table (decisions 17 and 23).
    let recent = pass.live_replicas().any(|(n, _)| {
        pass.input
            .facts
            .server(n)
            .pod
            .ready_since
            .is_some_and(|t| pass.input.now.duration_since(t) < DNS_SETTLE)
    });
    if pass.input.old.state != ClusterState::Ready || recent {
        let serving: Vec<ReplicaName> = pass
            .live_replicas()
            .map(|(n, _)| n.clone())
            .filter(|n| pass.input.facts.server(n).pod.ready)
            .collect();
        for replica in serving {
            pass.emit(Step::DropDnsCache { replica });
        }
    }
    reopen_keeper_sessions(pass);
}

/// Decision 45: a replicated table whose Keeper session expired (the member its server talked
/// to stopped, or the ensemble elected a new leader) is read-only until its server opens a new
/// session, and ClickHouse 18.16 tries that again only 10 s after a failed attempt, which during
/// an election is every attempt. Once Keeper answers the server again, its tables are made to
/// open their session now (`SYSTEM RESTART REPLICA`). Not while the cluster pauses or a server
/// stops: a table that is read-only for any other reason (Keeper refuses the server, or its
/// nodes are gone) is left as it is, and named in the status.
fn reopen_keeper_sessions(pass: &mut Pass) {
    if pass.input.facts.mode != crate::plan::facts::Mode::Running {
        return;
    }
    let stalled: Vec<(ReplicaName, Vec<(String, String)>)> = pass
        .live_replicas()
        .filter(|(n, _)| pass.input.facts.server(n).pod.ready)
        .filter_map(|(n, _)| {
            let tables = pass.input.obs.stalled_tables.get(n.as_str())?;
            (!tables.is_empty()).then(|| (n.clone(), tables.clone()))
        })
        .collect();
    for (replica, tables) in stalled {
        pass.emit(Step::RestartReplicatedTables { replica, tables });
    }
}
